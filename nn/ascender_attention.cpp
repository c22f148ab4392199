// ASCender swarm attention: the layer — projections, learnable scalars, masks, modes, RoPE, schedule and auxiliary
// losses — around the attention core of ops/ascender.h.
#include "nn/ascender_attention.h"

#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/positional.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {

constexpr const char* kName = "AscenderAttention";
constexpr int64_t kMaxRopeLen = int64_t(1) << 24;

// softplus⁻¹(y) = log(exp(y) - 1), stable for large y.
double softplus_inverse(double y) { return y > 20 ? y : std::log(std::expm1(y)); }

// One value per head from a per-head option given as one value or H values.
template <class T>
std::vector<T> per_head(const std::vector<T>& v, int64_t heads, const char* what) {
  ASC_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == heads, "{}: {} needs 1 or {} (heads) values, got {}",
            kName, what, heads, v.size());
  return v.size() == 1 ? std::vector<T>(heads, v[0]) : v;
}

}  // namespace

AscenderAttention::AscenderAttention(const AscenderAttentionOptions& o) : Attention(kName), options(o) {
  // Every option is checked before anything is built (docs/ascender.md, "Accepted options").
  const int64_t D = o.d_model(), H = o.heads();
  ASC_CHECK(D > 0 && H > 0 && D % H == 0, "{}: d_model {} must be a positive multiple of heads {}", kName, D, H);
  d_head = D / H;
  ASC_CHECK(o.d_z() >= 0 && o.d_a() >= 0, "{}: d_z {} and d_a {} must be >= 0 (0: d_head / 2)", kName, o.d_z(),
            o.d_a());
  d_z = o.d_z() > 0 ? o.d_z() : std::max<int64_t>(1, d_head / 2);
  d_a = o.d_a() > 0 ? o.d_a() : std::max<int64_t>(1, d_head / 2);
  // The projections' widths H·d_z, H·d_a and their weights' sizes d_model·H·d_z, d_model·H·d_a fit int64.
  checked_mul(D, D, kName, "d_model·d_model");
  checked_mul(D, checked_mul(H, d_z, kName, "heads·d_z"), kName, "d_model·heads·d_z");
  checked_mul(D, checked_mul(H, d_a, kName, "heads·d_a"), kName, "d_model·heads·d_a");
  k_h_ = per_head(o.k(), H, "k");
  tau_sep_h_ = per_head(o.tau_sep(), H, "tau_sep");
  tau_coh_h_ = per_head(o.tau_coh(), H, "tau_coh");
  alpha_align_h_ = per_head(o.alpha_align(), H, "alpha_align");
  alpha_coh_h_ = per_head(o.alpha_coh(), H, "alpha_coh");
  auto finite = [](double x) { return std::isfinite(x); };
  for (int64_t k : k_h_) ASC_CHECK(k >= 1, "{}: k must be >= 1, got {}", kName, k);
  // The op's bounds (ops/ascender.cpp check_core_inputs), checked here at construction: below 1e-6 the kernels
  // exp(-|z_i - z_j|² / τ) are decided by the rounding of the distances, below 1e-12 norm_eps by that of σ.
  for (double t : tau_sep_h_)
    ASC_CHECK(t >= 1e-6 && finite(t), "{}: tau_sep must be > 0 (at least 1e-6) and finite, got {}", kName, t);
  for (double t : tau_coh_h_)
    ASC_CHECK(t >= 1e-6 && finite(t), "{}: tau_coh must be > 0 (at least 1e-6) and finite, got {}", kName, t);
  // Above 1e6 the gates σ(-α Var) would be decided by the rounding of Var (the op refuses it too).
  for (double a : alpha_align_h_)
    ASC_CHECK(a >= 0 && a <= 1e6, "{}: alpha_align must be >= 0 (at most 1e6), got {}", kName, a);
  for (double a : alpha_coh_h_)
    ASC_CHECK(a >= 0 && a <= 1e6, "{}: alpha_coh must be >= 0 (at most 1e6), got {}", kName, a);
  // The scalars are float32 parameters (λ, κ, τ_score through softplus): their initial values must survive that.
  ASC_CHECK(std::abs(o.omega_init()) <= 1e30 && std::abs(o.delta_init()) <= 1e30,
            "{}: omega_init {} and delta_init {} must be finite, |x| <= 1e30", kName, o.omega_init(), o.delta_init());
  for (auto [name, x] : {std::pair{"lambda_init", o.lambda_init()},
                         {"kappa_init", o.kappa_init()},
                         {"tau_score_init", o.tau_score_init()}})
    ASC_CHECK(x >= 1e-30 && x <= 1e30, "{}: {} must be in [1e-30, 1e30], got {}", kName, name, x);
  ASC_CHECK(o.window() >= 1 && o.global_tokens() >= 0, "{}: window {} must be >= 1 and global_tokens {} >= 0", kName,
            o.window(), o.global_tokens());
  ASC_CHECK(o.norm_eps() >= 1e-12 && finite(o.norm_eps()), "{}: norm_eps must be finite and >= 1e-12, got {}", kName,
            o.norm_eps());
  ASC_CHECK(o.dropout() >= 0 && o.dropout() < 1, "{}: dropout {} not in [0, 1)", kName, o.dropout());
  ASC_CHECK(!o.rope() || d_head % 2 == 0, "{}: RoPE needs an even head dim, got {}", kName, d_head);
  ASC_CHECK(!o.rope() || (o.rope_max_len() >= 1 && o.rope_max_len() <= kMaxRopeLen),
            "{}: rope_max_len must be in [1, {}] (its cos / sin tables are built at construction), got {}", kName,
            kMaxRopeLen, o.rope_max_len());
  ASC_CHECK(o.aux_coh() >= 0 && o.aux_sep() >= 0 && o.aux_align() >= 0 && finite(o.aux_coh()) && finite(o.aux_sep()) &&
                finite(o.aux_align()),
            "{}: auxiliary loss weights must be finite and >= 0, got coh {}, sep {}, align {}", kName, o.aux_coh(),
            o.aux_sep(), o.aux_align());
  ASC_CHECK(o.warmup_steps() >= 0 && o.sep_start_step() >= 0 && o.aux_start_step() >= -1,
            "{}: warmup_steps {} and sep_start_step {} must be >= 0, aux_start_step {} >= -1", kName, o.warmup_steps(),
            o.sep_start_step(), o.aux_start_step());

  auto proj = [&](int64_t out, bool bias) { return std::make_shared<Linear>(LinearOptions(D, out).bias(bias)); };
  q_proj = register_module("q_proj", proj(D, o.bias()));
  k_proj = register_module("k_proj", proj(D, o.bias()));
  v_proj = register_module("v_proj", proj(D, o.bias()));
  out_proj = register_module("out_proj", proj(D, o.bias()));
  z_proj = register_module("z_proj", proj(H * d_z, false));
  e_proj = register_module("e_proj", proj(H * d_a, false));
  if (o.rope()) rope = register_module("rope", std::make_shared<RotaryEmbedding>(d_head, o.rope_max_len()));
  auto scalar = [&](const char* name, double value) { return register_parameter(name, full({H}, value)); };
  omega_align = scalar("omega_align", o.omega_init());
  omega_sep = scalar("omega_sep", o.omega_init());
  omega_coh = scalar("omega_coh", o.omega_init());
  delta = scalar("delta", o.delta_init());
  lambda_align_raw = scalar("lambda_align_raw", softplus_inverse(o.lambda_init()));
  lambda_sep_raw = scalar("lambda_sep_raw", softplus_inverse(o.lambda_init()));
  lambda_coh_raw = scalar("lambda_coh_raw", softplus_inverse(o.lambda_init()));
  kappa_raw = scalar("kappa_raw", softplus_inverse(o.kappa_init()));
  tau_score_raw = scalar("tau_score_raw", softplus_inverse(o.tau_score_init()));
  step_buffer = register_buffer("step", zeros({}, {.dtype = kInt64}));
}

int64_t AscenderAttention::step() const { return step_buffer.to(Device::cpu()).item<int64_t>(); }
void AscenderAttention::set_step(int64_t s) {
  ASC_CHECK(s >= 0, "{}: step must be >= 0, got {}", kName, s);
  NoGradGuard ng;
  // Written as an integer: through fill_(double), steps above 2^53 would round (and 2^63 - 1 would overflow).
  step_buffer.copy_(tensor(std::vector<int64_t>{s}, Shape{}).to(step_buffer.device()));
}
void AscenderAttention::check_state(const StateDict& incoming) const {
  // A loaded step passes the setter's check (a negative one would make the ω warm-up factor negative).
  const Tensor* t = incoming.find("step");
  if (!t) return;
  ASC_CHECK(t->numel() == 1, "{}: the step buffer must hold one value, got shape {}", kName, t->shape());
  const int64_t s = t->to(Device::cpu()).item<int64_t>();
  ASC_CHECK(s >= 0, "{}: a loaded step must be >= 0, got {}", kName, s);
}
double AscenderAttention::omega_scale() const {
  const int64_t w = options.warmup_steps();
  return w <= 0 ? 1.0 : std::min(1.0, static_cast<double>(step()) / static_cast<double>(w));
}
bool AscenderAttention::aux_active() const {
  const int64_t start = options.aux_start_step() >= 0 ? options.aux_start_step() : options.warmup_steps();
  return step() >= start;
}
Tensor AscenderAttention::aux_loss() const {
  const Tensor l = aux_loss_.get();
  return l.defined() ? l : zeros({}, {.dtype = omega_align.dtype(), .device = omega_align.device()});
}

Tensor AscenderAttention::lambda_align() const { return softplus(lambda_align_raw); }
Tensor AscenderAttention::lambda_sep() const { return softplus(lambda_sep_raw); }
Tensor AscenderAttention::lambda_coh() const { return softplus(lambda_coh_raw); }
Tensor AscenderAttention::kappa() const { return softplus(kappa_raw); }
Tensor AscenderAttention::tau_score() const { return softplus(tau_score_raw); }

Tensor AscenderAttention::attend(const Tensor& x, const AttentionArgs& args) {
  const int64_t D = options.d_model(), H = options.heads();
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == D, "{}: expected x (B, T, {}), got {}", kName, D,
            x.defined() ? x.shape() : Shape{});
  ASC_CHECK(!args.context.defined(),
            "{}: self-attention only (its geometry relates a sequence to itself); got a "
            "context of shape {}",
            kName, args.context.shape());
  const int64_t B = x.size(0), T = x.size(1);
  // (B, T, H·c) -> (B, H, T, c)
  auto heads = [&](const Tensor& t, int64_t c) { return t.view({B, T, H, c}).permute({0, 2, 1, 3}); };
  // q, k, v in one product and the bias-free z, e in another (linear_group); heads() views their columns
  const TensorList qkv = linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);
  const TensorList ze = linear_group({z_proj.get(), e_proj.get()}, x);
  Tensor q = heads(qkv[0], d_head), k = heads(qkv[1], d_head), v = heads(qkv[2], d_head);
  Tensor z = heads(ze[0], d_z), e = heads(ze[1], d_a);
  Tensor q_rot = rope ? rope->forward(q, 0) : q, k_rot = rope ? rope->forward(k, 0) : k;

  AscenderCoreArgs a;
  a.k = k_h_, a.tau_sep = tau_sep_h_, a.tau_coh = tau_coh_h_;
  a.alpha_align = alpha_align_h_, a.alpha_coh = alpha_coh_h_;
  auto as_x = [&](const Tensor& t) { return t.to(x.dtype()); };
  a.omega_align = as_x(omega_align), a.omega_sep = as_x(omega_sep), a.omega_coh = as_x(omega_coh);
  a.lambda_align = as_x(lambda_align()), a.lambda_sep = as_x(lambda_sep()), a.lambda_coh = as_x(lambda_coh());
  a.delta = as_x(delta), a.kappa = as_x(kappa()), a.tau_score = as_x(tau_score());
  a.include_self = options.neighbors_include_self();
  a.gate_position = options.gate_position();
  a.use_align = options.use_align(), a.use_coh = options.use_coh();
  a.use_sep = options.use_sep() && separation_active();
  a.omega_scale = omega_scale();
  const bool any_aux = options.aux_coh() > 0 || options.aux_sep() > 0 || options.aux_align() > 0;
  a.want_aux = any_aux && aux_active();
  a.norm_eps = options.norm_eps();
  a.keep_mask = attention_keep_mask(args, B, T, T, x.device(), kName);
  a.select_by_scores = options.mode() == AscenderMode::Reuse;
  if (options.mode() == AscenderMode::Windowed) a.window = options.window(), a.global_tokens = options.global_tokens();
  a.bias = args.bias;
  a.dropout = options.dropout();
  a.training = is_training();

  AscenderDecomposition dec;
  AscenderAux aux;
  Tensor y = ascender_attention(q_rot, k_rot, k, v, z, e, a, need_decomposition || args.need_weights ? &dec : nullptr,
                                a.want_aux ? &aux : nullptr);
  weights_.set(args.need_weights ? dec.A : Tensor());
  decomposition_.set(need_decomposition ? dec : AscenderDecomposition{});
  aux_.set(aux);
  Tensor aux_loss;
  auto add_aux = [&](const Tensor& l, double nu) {
    if (l.defined() && nu > 0) aux_loss = aux_loss.defined() ? aux_loss + l * nu : l * nu;
  };
  add_aux(aux.coh, options.aux_coh());
  add_aux(aux.sep, options.aux_sep());
  add_aux(aux.align, options.aux_align());
  aux_loss_.set(aux_loss);
  if (is_training()) {  // one schedule step per training forward (saturating: the count cannot overflow)
    const int64_t s = step();
    if (s < std::numeric_limits<int64_t>::max()) set_step(s + 1);
  }
  return (*out_proj)(y.permute({0, 2, 1, 3}).reshape({B, T, D}));  // (B, T, D)
}

std::string AscenderAttention::extra_repr() const {
  std::string ks;
  for (int64_t k : options.k()) {
    if (!ks.empty()) ks += ',';
    ks += std::to_string(k);
  }
  return fmt::format(
      "d_model={}, heads={}, d_z={}, d_a={}, k={}, gate_position={}, include_self={}, "
      "terms={}{}{}, rope={}",
      options.d_model(), options.heads(), d_z, d_a, ks,
      options.gate_position() == GatePosition::AfterNorm ? "after_norm" : "before_norm",
      options.neighbors_include_self(), options.use_align() ? "a" : "", options.use_sep() ? "s" : "",
      options.use_coh() ? "c" : "", options.rope());
}

AttentionFactory ascender_attention_factory(const AscenderAttentionOptions& options) {
  return [options](const TransformerBlockOptions& block) -> std::shared_ptr<Attention> {
    AscenderAttentionOptions o = options;
    const auto [d_model, heads] =
        attention_shape_for_block("ascender_attention", o.d_model(), o.heads(), block);  // 0: the block's
    o.d_model(d_model).heads(heads);
    if (o.dropout() == 0) o.dropout(block.attention_dropout());
    return std::make_shared<AscenderAttention>(o);
  };
}

}  // namespace asc::nn
