// nn::AsamAttention (nn/asam_attention.h): projections, the pattern, the two branches, the gate.
#include "nn/asam_attention.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "core/profiler.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {

constexpr const char* kName = "AsamAttention";
const std::vector<std::string> kPatterns = {"window", "strided", "global", "random", "clustered", "hierarchical"};

// The hierarchical block size for length T: the option, or round(√T); at most T (hierarchical_pattern's own clamp:
// a block of T or more tokens is one block).
int64_t hierarchical_block(const AsamAttentionOptions& o, int64_t T) {
  const int64_t b = o.block() > 0 ? o.block() : std::llround(std::sqrt(static_cast<double>(T)));
  return std::clamp<int64_t>(b, 1, T);
}

// Checks a finite option value (NaN and ±inf refused with the option's name).
void check_finite(const char* option, double v) {
  ASC_CHECK(std::isfinite(v), "{}: {} must be finite, got {}", kName, option, v);
}

}  // namespace

AsamAttention::AsamAttention(const AsamAttentionOptions& o) : Attention(kName), options(o) {
  const int64_t D = o.d_model(), H = o.heads();
  ASC_CHECK(D > 0 && H > 0 && D % H == 0, "{}: d_model {} must be a positive multiple of heads {}", kName, D, H);
  d_head = D / H;
  checked_mul(D, D, kName, "d_model x d_model (a projection's weight)");
  ASC_CHECK(!o.patterns().empty(), "{}: needs at least one pattern (known: {})", kName, fmt::join(kPatterns, ", "));
  for (const std::string& p : o.patterns())
    ASC_CHECK(std::find(kPatterns.begin(), kPatterns.end(), p) != kPatterns.end(),
              "{}: unknown pattern '{}' (known: {})", kName, p, fmt::join(kPatterns, ", "));
  ASC_CHECK(o.window() >= 1, "{}: window w must be >= 1, got {}", kName, o.window());
  ASC_CHECK(o.stride() >= 1, "{}: stride s must be >= 1, got {}", kName, o.stride());
  ASC_CHECK(o.global_tokens() >= 0, "{}: global_tokens must be >= 0, got {}", kName, o.global_tokens());
  ASC_CHECK(o.random_keys() >= 1, "{}: random_keys r must be >= 1, got {}", kName, o.random_keys());
  ASC_CHECK(o.clusters() >= 1, "{}: clusters must be >= 1, got {}", kName, o.clusters());
  checked_mul(checked_mul(H, o.clusters(), kName, "heads x clusters"), d_head, kName, "the centroids' size");
  check_finite("cluster_tau", o.cluster_tau());
  ASC_CHECK(o.cluster_tau() > 0, "{}: cluster_tau must be > 0, got {}", kName, o.cluster_tau());
  check_finite("cluster_theta", o.cluster_theta());
  ASC_CHECK(o.cluster_theta() >= 0 && o.cluster_theta() < 1, "{}: cluster_theta must be in [0, 1), got {}", kName,
            o.cluster_theta());
  check_finite("cluster_loss_weight", o.cluster_loss_weight());
  ASC_CHECK(o.cluster_loss_weight() >= 0, "{}: cluster_loss_weight must be >= 0, got {}", kName,
            o.cluster_loss_weight());
  ASC_CHECK(o.block() >= 0, "{}: block must be >= 0 (0: round(sqrt(T))), got {}", kName, o.block());
  ASC_CHECK(!o.pool_scales().empty(), "{}: pool_scales must not be empty", kName);
  int64_t segments = 0;  // Σ scales: the gate's features are D · segments wide
  for (int64_t s : o.pool_scales()) {
    ASC_CHECK(s >= 1, "{}: pool scales must be >= 1, got {}", kName, s);
    segments = checked_add(segments, s, kName, "the sum of pool_scales");
  }
  checked_mul(checked_mul(D, segments, kName, "d_model x the sum of pool_scales"), H, kName,
              "the gate's weight (d_model x the sum of pool_scales x heads)");
  check_finite("gate_tau", o.gate_tau());
  ASC_CHECK(o.gate_tau() > 0, "{}: gate_tau must be > 0, got {}", kName, o.gate_tau());
  check_finite("threshold_init", o.threshold_init());
  ASC_CHECK(o.fixed_gate() == -1.0 || (o.fixed_gate() >= 0 && o.fixed_gate() <= 1),
            "{}: fixed_gate must be -1 (learned) or in [0, 1], got {}", kName, o.fixed_gate());
  ASC_CHECK(o.skip_dense_above() >= 0 && o.skip_dense_above() <= 0.99,
            "{}: skip_dense_above must be in [0, 0.99] (0: never skip; the gate is clamped to 0.99), got {}", kName,
            o.skip_dense_above());

  auto proj = [&](int64_t in, int64_t out, bool bias) {
    return std::make_shared<Linear>(LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", proj(D, D, o.bias()));
  k_proj = register_module("k_proj", proj(D, D, o.bias()));
  v_proj = register_module("v_proj", proj(D, D, o.bias()));
  out_proj = register_module("out_proj", proj(D, D, o.bias()));
  complexity = register_module("complexity", proj(D * segments, H, true));
  confidence = register_module("confidence", proj(D * segments, H, true));
  threshold = register_parameter("threshold", full({H}, o.threshold_init()));
  if (has("clustered")) centroids = register_parameter("centroids", randn({H, o.clusters(), d_head}));
}

bool AsamAttention::has(const std::string& name) const {
  const auto& p = options.patterns();
  return std::find(p.begin(), p.end(), name) != p.end();
}

SparsePattern AsamAttention::pattern(int64_t T, bool causal) {
  std::lock_guard lock(pattern_mu_);
  if (cached_T_ == T && cached_causal_ == causal && cached_pattern_.defined()) return cached_pattern_;
  device_pattern_ = SparsePattern{};
  const AsamAttentionOptions& o = options;
  std::vector<SparsePattern> parts;
  if (has("window")) parts.push_back(local_window_pattern(T, o.window(), causal));
  if (has("strided")) parts.push_back(strided_pattern(T, o.stride(), causal));
  // The builders clamp what exceeds T (g > T: every token global; r > T: every key), as documented there.
  if (has("global")) parts.push_back(global_tokens_pattern(T, o.global_tokens(), causal));
  if (has("random")) parts.push_back(random_keys_pattern(T, o.random_keys(), o.seed(), causal));
  if (has("hierarchical")) parts.push_back(hierarchical_pattern(T, hierarchical_block(o, T), causal));
  // Only "clustered": an empty shared pattern, which the per-call clustered part joins.
  cached_pattern_ =
      parts.empty() ? SparsePattern::from_rows(1, T, T, std::vector<std::vector<int64_t>>(T)) : pattern_union(parts);
  cached_T_ = T, cached_causal_ = causal;
  return cached_pattern_;
}

Tensor AsamAttention::gate(const Tensor& x, const Tensor& key_padding_mask) const {
  const int64_t B = x.size(0), T = x.size(1), H = options.heads();
  if (options.fixed_gate() >= 0) return full({B, H}, options.fixed_gate(), x.options());
  // φ(x): masked means of x over s equal segments, for each scale s, concatenated. Padding tokens are replaced by 0
  // (where, not only weighted by 0: a padding token's NaN must not reach the real tokens' gate).
  const Tensor w =
      key_padding_mask.defined() ? key_padding_mask.to(x.dtype()).view({B, T, 1}) : ones({B, T, 1}, x.options());
  const Tensor xr = key_padding_mask.defined() ? where(key_padding_mask.view({B, T, 1}), x, 0.0) : x;
  TensorList feats;
  for (int64_t s : options.pool_scales())
    for (int64_t seg = 0; seg < s; ++seg) {
      // at least one token; the products in 128 bits (a scale may exceed T by far)
      const int64_t a = static_cast<int64_t>(static_cast<__int128>(seg) * T / s);
      const int64_t e = std::max(a + 1, static_cast<int64_t>(static_cast<__int128>(seg + 1) * T / s));
      const Tensor ws = w.narrow(1, a, e - a);
      feats.push_back(sum(xr.narrow(1, a, e - a) * ws, {1}) / clamp(sum(ws, {1}), 1.0, std::nullopt));  // (B, D)
    }
  const Tensor phi = cat(feats, 1);                                         // (B, D · Σ s)
  const Tensor fc = (*complexity)(phi), fp = softplus((*confidence)(phi));  // (B, H)
  const Tensor g = sigmoid((threshold.to(x.dtype()) - fc) / options.gate_tau() * fp);
  return clamp(g, 0.01, 0.99);
}

Tensor AsamAttention::aux_loss() const {
  const Tensor l = aux_loss_.get();
  return l.defined() ? l : zeros({}, {.dtype = threshold.dtype(), .device = threshold.device()});
}

Tensor AsamAttention::attend(const Tensor& x, const AttentionArgs& args) {
  const int64_t D = options.d_model(), H = options.heads(), Dh = d_head;
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == D && x.size(1) >= 1, "{}: expected x (B, T, {}), got {}", kName,
            D, x.defined() ? x.shape() : Shape{});
  ASC_CHECK(!args.context.defined(), "{}: self-attention only; got a context of shape {}", kName, args.context.shape());
  ASC_CHECK(!args.bias.defined(), "{}: an additive score bias is not supported by the sparse kernel (got {})", kName,
            args.bias.shape());
  ASC_CHECK(!args.need_weights,
            "{}: need_weights is not available (the sparse branch never forms the (T, T) "
            "probabilities)",
            kName);
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor& valid = args.key_padding_mask;
  if (valid.defined())
    ASC_CHECK(valid.dtype() == kBool && valid.dim() == 2 && valid.size(0) == B && valid.size(1) == T,
              "{}: key_padding_mask must be bool (B, T) = ({}, {}); got {} {}", kName, B, T, valid.dtype(),
              valid.shape());
  // (B, T, D) -> (B, H, T, Dh), contiguous: the sparse kernel reads rows of Dh.
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, Dh}).permute({0, 2, 1, 3}).contiguous(); };
  const TensorList qkv = linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);  // one product
  const Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);

  // The sparse branch: the data-independent pattern (cached, and its copy on x's device), the clustered part, the
  // hierarchical summaries.
  SparsePattern p = pattern(T, args.causal);
  if (!x.device().is_cpu()) {  // keep the device copy, so a step does not copy the lists again
    std::lock_guard lock(pattern_mu_);
    if (cached_T_ != T || cached_causal_ != args.causal) {  // another thread's call replaced the cache meanwhile
      p = p.to(x.device());
    } else {
      if (!device_pattern_.defined() || device_pattern_.device() != x.device()) device_pattern_ = p.to(x.device());
      p = device_pattern_;
    }
  }
  Tensor aux_loss;
  if (has("clustered")) {
    const Tensor C = centroids.to(x.dtype());  // (H, c, Dh)
    const Tensor qd = q.detach();
    const Tensor CT = C.unsqueeze(0).transpose(-2, -1);        // (1, H, Dh, c)
    const Tensor qc = matmul(qd, CT);                          // q_i · C_m (B, H, T, c)
    const Tensor a = softmax(qc / options.cluster_tau(), -1);  // (B, H, T, c)
    // A query whose assignment row is not finite (its q holds a NaN or an infinity) attends itself only: its NaN
    // reaches its own output, as in the composed attention, not the rows of other tokens. On CUDA the union is built
    // by kernels (no copy of a to the host); on the CPU by the bucket walk.
    const profiler::Range building("asam clustered pattern");
    p = clustered_union(p, a, options.cluster_theta(), args.causal);
    if (options.cluster_loss_weight() > 0) {
      // Σ_m a_im |q_i − C_m|², averaged over the real tokens of every (b, h): the soft k-means objective of the
      // centroids. Padding tokens are left out (where, not a product: a padding token's NaN must not leak in), so
      // padding does not pull the centroids; with no real token the loss is 0.
      // The padding tokens' queries are set to 0 first, so that their terms (masked below) are finite and pass a
      // zero gradient, not 0 · NaN, to C.
      const Tensor ql = valid.defined() ? where(valid.view({B, 1, T, 1}), qd, 0.0) : qd;
      const Tensor qcl = valid.defined() ? matmul(ql, CT) : qc;  // (B, H, T, c)
      const Tensor al = valid.defined() ? softmax(qcl / options.cluster_tau(), -1) : a;
      // |q_i − C_m|² = |q_i|² − 2 q_i · C_m + |C_m|², from the products above: the difference tensor
      // (B, H, T, c, Dh) and its square cost ~5 % of experiment 5's training step. Clamped at 0 against rounding.
      const Tensor d2 =
          clamp(sum(ql * ql, {-1}, true) - 2.0 * qcl + sum(C * C, {-1}).view({1, H, 1, options.clusters()}), 0.0,
                std::nullopt);                      // (B, H, T, c)
      const Tensor per_token = sum(al * d2, {-1});  // (B, H, T)
      if (valid.defined()) {
        // the count of real (token, head) pairs stays on the device (no read back), in float32 / float64: exact
        const Tensor real = valid.view({B, 1, T});
        const DType acc = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
        const Tensor n_real = clamp(sum(valid.to(acc)) * static_cast<double>(H), 1.0, std::nullopt);
        aux_loss = (sum(where(real.expand({B, H, T}), per_token, 0.0)).to(acc) / n_real).to(x.dtype()) *
                   options.cluster_loss_weight();
      } else {
        aux_loss = mean(per_token) * options.cluster_loss_weight();
      }
    }
  }
  Tensor ks = k, vs = v, keep_s = valid;
  if (has("hierarchical")) {
    const int64_t b = hierarchical_block(options, T);
    ks = hierarchical_keys(k, b, valid), vs = hierarchical_keys(v, b, valid);  // keys T + m: block m's mean
    keep_s = valid.defined() ? hierarchical_keep(valid, b) : Tensor();
  }
  const Tensor sparse = sparse_attention(q, ks, vs, p, keep_s);  // (B, H, T, Dh)

  // The gate, and the dense branch where it is needed.
  const Tensor g = gate(x, valid);  // (B, H)
  aux_loss_.set(aux_loss);
  last_gate_.set(g.detach());
  Tensor out;
  const double thr = options.skip_dense_above();
  std::vector<int64_t> need;  // flat (b, h) that run the dense branch
  const bool skipping = !is_training() && thr > 0 && options.fixed_gate() != 0;
  if (skipping) {
    const auto gv = g.detach().to_vector<double>();  // read on the host in float64, any dtype
    for (int64_t i = 0; i < B * H; ++i)
      if (gv[i] < thr) need.push_back(i);
    considered_ += B * H, skipped_ += B * H - static_cast<int64_t>(need.size());
  }
  const Tensor keep_d = valid.defined() ? valid.view({B, 1, 1, T}) : Tensor();
  const Tensor g4 = g.view({B, H, 1, 1});
  if (options.fixed_gate() == 1.0 || (skipping && need.empty())) {  // no (sample, head) needs the dense branch
    out = sparse;
  } else if (!skipping || static_cast<int64_t>(need.size()) == B * H) {
    const Tensor dense = scaled_dot_product_attention(q, k, v, {.keep_mask = keep_d, .causal = args.causal});
    out = g4 * sparse + (1.0 - g4) * dense;
  } else {
    // Only the needed (b, h) run dense attention; the others output their sparse branch alone.
    const int64_t n = static_cast<int64_t>(need.size());
    const Tensor idx = tensor(need, {n}).to(x.device());
    auto rows = [&](const Tensor& t) { return index_select(t.reshape({B * H, 1, T, Dh}), 0, idx); };
    Tensor keep_n;
    if (valid.defined()) {
      std::vector<int64_t> bidx(need.size());
      for (size_t i = 0; i < need.size(); ++i) bidx[i] = need[i] / H;
      keep_n = index_select(valid, 0, tensor(bidx, {n}).to(x.device())).view({n, 1, 1, T});
    }
    const Tensor dense_n = scaled_dot_product_attention(rows(q), rows(k), rows(v),
                                                        {.keep_mask = keep_n, .causal = args.causal});  // (n,1,T,Dh)
    // Back to (B·H, ...): a zero row for the skipped (b, h), whose gate is then 1.
    std::vector<int64_t> where(B * H, n);
    for (int64_t i = 0; i < n; ++i) where[need[i]] = i;
    const Tensor dense =
        index_select(cat({dense_n, zeros({1, 1, T, Dh}, q.options())}, 0), 0, tensor(where, {B * H}).to(x.device()))
            .view({B, H, T, Dh});
    std::vector<double> run(B * H, 0.0);
    for (int64_t i : need) run[i] = 1.0;
    const Tensor ran = tensor(run, {B, H, 1, 1}).to(x.dtype()).to(x.device());
    const Tensor geff = g4 * ran + (1.0 - ran);
    out = geff * sparse + (1.0 - geff) * dense;
  }
  return (*out_proj)(out.permute({0, 2, 1, 3}).reshape({B, T, D}));  // (B, T, D)
}

void AsamAttention::check_state(const StateDict& incoming) const {
  for (const char* name : {"threshold", "centroids"}) {
    const Tensor* t = incoming.find(name);
    if (!t) continue;
    const auto v = t->detach().to_vector<double>();
    for (size_t x = 0; x < v.size(); ++x)
      ASC_CHECK(std::isfinite(v[x]), "{}: a loaded {} must be finite (as threshold_init must be), got {} at index {}",
                kName, name, v[x], x);
  }
}

std::string AsamAttention::extra_repr() const {
  return fmt::format("d_model={}, heads={}, patterns={}, window={}, gate={}", options.d_model(), options.heads(),
                     fmt::join(options.patterns(), "+"), options.window(),
                     options.fixed_gate() >= 0 ? fmt::format("fixed {}", options.fixed_gate()) : "learned");
}

AttentionFactory asam_attention_factory(const AsamAttentionOptions& options) {
  return [options](const TransformerBlockOptions& block) -> std::shared_ptr<Attention> {
    AsamAttentionOptions o = options;
    const auto [d_model, heads] =
        attention_shape_for_block("asam_attention", o.d_model(), o.heads(), block);  // 0: the block's
    o.d_model(d_model).heads(heads);
    return std::make_shared<AsamAttention>(o);
  };
}

const std::vector<std::string>& asam_pattern_names() { return kPatterns; }

}  // namespace asc::nn
