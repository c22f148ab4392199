// nn::AsamAttention, ASAM's adaptive sparse attention layer (docs/asam.md): against its formula composed from
// reference ops (every pattern, padding, causal), gradcheck through both branches and the gate, the gate's
// clamp, fixed gates and skip-dense inference, its errors, a classifier that trains with it, and the layer on a
// CUDA device against the CPU. The sparse attention op and the patterns it uses: tests/test_sparse_attention.cpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/transformer_classifier.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

std::shared_ptr<nn::AsamAttention> make_layer(nn::AsamAttentionOptions o, uint64_t seed = 31) {
  manual_seed(seed);
  auto m = std::make_shared<nn::AsamAttention>(o);
  m->to(kFloat64);
  // A non-trivial gate: spread the threshold and the confidence so that g differs per (sample, head).
  NoGradGuard no_grad;
  m->threshold.copy_(tensor(std::vector<double>{0.3, -0.2}, {2}).narrow(0, 0, o.heads()));
  return m;
}

Tensor padding_mask(int64_t B, int64_t T, int64_t pad_last) {  // batch 1 loses its last pad_last tokens
  Tensor m = ones({B, T}, {.dtype = kBool});
  for (int64_t j = T - pad_last; j < T; ++j) m.data_ptr<bool>()[T + j] = false;
  return m;
}

// The layer's output composed again from its weights with the reference ops: projections, the sparse reference over
// the pattern (plus block-mean summaries), dense attention by the composed path, the gate by the formula.
// With skip_above > 0, a (sample, head) whose gate is >= skip_above takes the sparse branch alone.
Tensor layer_by_reference(nn::AsamAttention& m, const Tensor& x, const Tensor& valid, bool causal,
                          double skip_above = 0) {
  const int64_t B = x.size(0), T = x.size(1), D = m.options.d_model(), H = m.options.heads(), Dh = D / H;
  auto lin = [](const nn::Linear& l, const Tensor& t) { return matmul(t, l.weight.transpose(0, 1)) + l.bias; };
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, Dh}).permute({0, 2, 1, 3}); };
  Tensor q = heads(lin(*m.q_proj, x)), k = heads(lin(*m.k_proj, x)), v = heads(lin(*m.v_proj, x));
  SparsePattern p = m.pattern(T, causal);
  const auto& names = m.options.patterns();
  auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  if (has("clustered")) {
    Tensor a = softmax(matmul(q, m.centroids.unsqueeze(0).transpose(-2, -1)) / m.options.cluster_tau(), -1);
    p = pattern_union({p, clustered_pattern(a, m.options.cluster_theta(), causal)});
  }
  Tensor ks = k, vs = v, keep = valid;
  if (has("hierarchical")) {  // summaries by loops: mean of the real tokens of each block
    const int64_t b = m.options.block(), nb = (T + b - 1) / b;
    auto kv = k.contiguous().to_vector<double>(), vv = v.contiguous().to_vector<double>();
    auto val = valid.to_vector<bool>();
    std::vector<double> km(B * H * nb * Dh, 0), vm(km.size(), 0);
    std::vector<bool> kept(B * nb, false);
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t blk = 0; blk < nb; ++blk) {
        int64_t n = 0;
        for (int64_t t = blk * b; t < std::min(T, blk * b + b); ++t) n += val[bb * T + t];
        kept[bb * nb + blk] = n > 0;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = blk * b; t < std::min(T, blk * b + b); ++t)
            if (val[bb * T + t])
              for (int64_t c = 0; c < Dh; ++c) {
                km[((bb * H + h) * nb + blk) * Dh + c] += kv[((bb * H + h) * T + t) * Dh + c] / n;
                vm[((bb * H + h) * nb + blk) * Dh + c] += vv[((bb * H + h) * T + t) * Dh + c] / n;
              }
      }
    ks = cat({k, tensor(km, {B, H, nb, Dh})}, 2), vs = cat({v, tensor(vm, {B, H, nb, Dh})}, 2);
    Tensor kt = zeros({B, nb}, {.dtype = kBool});
    for (int64_t x2 = 0; x2 < B * nb; ++x2) kt.data_ptr<bool>()[x2] = kept[x2];
    keep = cat({valid, kt}, 1);
  }
  Tensor sparse = sparse_attention_reference(q, ks, vs, p, keep);
  set_sdpa_backend(SdpaBackend::Math);
  Tensor dense = scaled_dot_product_attention(q, k, v, {.keep_mask = valid.view({B, 1, 1, T}), .causal = causal});
  set_sdpa_backend(SdpaBackend::Auto);
  // The gate by its formula, with φ by loops.
  const auto xv = x.to_vector<double>();
  const auto val = valid.to_vector<bool>();
  std::vector<double> phi;
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t s : m.options.pool_scales())
      for (int64_t seg = 0; seg < s; ++seg) {
        const int64_t a0 = seg * T / s, e0 = std::max(a0 + 1, (seg + 1) * T / s);
        double n = 0;
        std::vector<double> acc(D, 0);
        for (int64_t t = a0; t < e0; ++t)
          if (val[bb * T + t]) {
            n += 1;
            for (int64_t c = 0; c < D; ++c) acc[c] += xv[(bb * T + t) * D + c];
          }
        for (int64_t c = 0; c < D; ++c) phi.push_back(acc[c] / std::max(n, 1.0));
      }
  const int64_t F = static_cast<int64_t>(phi.size()) / B;
  Tensor ph = tensor(phi, {B, F});
  auto wc = lin(*m.complexity, ph).to_vector<double>(), wp = lin(*m.confidence, ph).to_vector<double>();
  auto t = m.threshold.to_vector<double>();
  std::vector<double> g(B * H);
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      const double fp = std::log1p(std::exp(wp[bb * H + h]));
      const double z = (t[h] - wc[bb * H + h]) / m.options.gate_tau() * fp;
      g[bb * H + h] = std::clamp(1 / (1 + std::exp(-z)), 0.01, 0.99);
    }
  check_close(m.last_gate(), g, 1e-12, 1e-12);
  if (skip_above > 0)
    for (double& gi : g) gi = gi >= skip_above ? 1.0 : gi;
  Tensor g4 = tensor(g, {B, H, 1, 1});
  Tensor out = g4 * sparse + (1.0 - g4) * dense;
  return lin(*m.out_proj, out.permute({0, 2, 1, 3}).reshape({B, T, D}));
}

}  // namespace

TEST_CASE("AsamAttention equals its formula composed from reference ops (every pattern, padding, causal)") {
  const int64_t B = 2, T = 17, D = 8, H = 2;
  const std::vector<std::vector<std::string>> sets = {
      {"window"},       {"strided"},   {"global", "random"},
      {"hierarchical"}, {"clustered"}, {"window", "global", "random", "clustered", "hierarchical", "strided"}};
  for (const auto& names : sets)
    for (bool causal : {false, true}) {
      CAPTURE(fmt::format("{}", fmt::join(names, "+")));
      CAPTURE(causal);
      auto m = make_layer(nn::AsamAttentionOptions(D, H)
                              .patterns(names)
                              .window(5)
                              .stride(4)
                              .global_tokens(2)
                              .random_keys(3)
                              .block(4)
                              .clusters(3)
                              .cluster_theta(0.3)
                              .pool_scales({1, 2, 3}));
      Tensor x = randn64({B, T, D}, false, 2), valid = padding_mask(B, T, 5);
      Tensor y = m->attend(x, {.key_padding_mask = valid, .causal = causal});
      check_close(y, layer_by_reference(*m, x, valid, causal), 1e-10, 1e-10);
    }
}

TEST_CASE("AsamAttention gradcheck (float64) through both branches and the gate; the centroid loss reaches C") {
  const int64_t B = 2, T = 9, D = 6, H = 2;
  auto m = make_layer(nn::AsamAttentionOptions(D, H)
                          .patterns({"window", "random", "hierarchical", "clustered"})
                          .window(3)
                          .random_keys(2)
                          .block(3)
                          .clusters(2)
                          .cluster_theta(0.2)
                          .pool_scales({1, 2}));
  Tensor x = randn64({B, T, D}, true, 4), valid = padding_mask(B, T, 2);
  TensorList inputs = {x,
                       m->threshold.detach(),
                       m->complexity->weight.detach(),
                       m->confidence->weight.detach(),
                       m->q_proj->weight.detach(),
                       m->v_proj->weight.detach(),
                       m->centroids.detach()};
  for (size_t i = 1; i < inputs.size(); ++i) inputs[i].set_requires_grad(true);
  m->attend(x, {.key_padding_mask = valid, .causal = true});
  // The gate is inside the clamp for every (sample, head) here (else its gradient is 0 and the check is weaker).
  for (double g : m->last_gate().to_vector<double>()) CHECK((g > 0.01 && g < 0.99));
  check_grad(
      [&](const TensorList& in) {
        nn::AsamAttention& a = *m;
        a.threshold = in[1], a.complexity->weight = in[2], a.confidence->weight = in[3];
        a.q_proj->weight = in[4], a.v_proj->weight = in[5], a.centroids = in[6];
        return TensorList{a.attend(in[0], {.key_padding_mask = valid, .causal = true})};
      },
      inputs);
  // The centroid loss reads the queries detached (it trains C, not q): its gradient, in C alone.
  Tensor C = m->centroids.detach();
  C.set_requires_grad(true);
  const Tensor xd = x.detach();
  check_grad(
      [&](const TensorList& in) {
        m->centroids = in[0];
        m->attend(xd, {.key_padding_mask = valid, .causal = true});
        return TensorList{m->aux_loss()};
      },
      {C});
}

TEST_CASE("AsamAttention gate: clamped to [0.01, 0.99] with no gradient there; fixed gates; skip-dense inference") {
  const int64_t B = 3, T = 12, D = 8, H = 2;
  Tensor x = randn64({B, T, D}, false, 6);
  {  // A threshold far above every complexity: g = 0.99 everywhere, and t gets no gradient.
    auto m = make_layer(nn::AsamAttentionOptions(D, H).window(3).random_keys(2));
    {
      NoGradGuard no_grad;
      m->threshold.fill_(1e3);
    }
    m->attend(x, {}).sum().backward();
    for (double g : m->last_gate().to_vector<double>()) CHECK(g == doctest::Approx(0.99).epsilon(1e-15));
    for (double d : m->threshold.grad().to_vector<double>()) CHECK(d == 0.0);
  }
  // fixed_gate 1: the sparse branch alone; 0: the dense branch alone (through the projections).
  auto sparse_only = make_layer(nn::AsamAttentionOptions(D, H).window(3).random_keys(2).fixed_gate(1));
  auto dense_only = make_layer(nn::AsamAttentionOptions(D, H).window(3).random_keys(2).fixed_gate(0));
  auto mha = make_layer(nn::AsamAttentionOptions(D, H).window(T * 2).random_keys(2).fixed_gate(1));
  auto learned = make_layer(nn::AsamAttentionOptions(D, H).window(3).random_keys(2));
  Tensor ys = sparse_only->attend(x, {}), yd = dense_only->attend(x, {});
  learned->train(true);
  // A window covering the sequence makes the sparse branch dense attention: the dense-only and that layer agree.
  check_close(mha->attend(x, {}), yd, 1e-12, 1e-12);
  // Skip-dense inference: with the threshold between g's values some (sample, head) pairs skip the dense branch
  // and output the sparse branch alone, the others are unchanged; training mode never skips.
  Tensor valid = ones({B, T}, {.dtype = kBool});
  Tensor y_full = learned->attend(x, {.key_padding_mask = valid});
  std::vector<double> sorted = learned->last_gate().to_vector<double>();
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted[2] < sorted[3]);
  const double thr = std::min(0.99, (sorted[2] + sorted[3]) / 2);  // three of six pairs are above it
  learned->options.skip_dense_above(thr);
  check_close(learned->attend(x, {.key_padding_mask = valid}), y_full, 1e-13, 1e-13);
  CHECK(learned->dense_considered() == 0);
  learned->eval();
  Tensor y_skip = learned->attend(x, {.key_padding_mask = valid});
  CHECK(learned->dense_considered() == B * H);
  CHECK(learned->dense_skipped() == 3);
  check_close(y_skip, layer_by_reference(*learned, x, valid, false, thr), 1e-12, 1e-12);
  CHECK(!same_bits(y_skip, y_full));
  learned->options.skip_dense_above(0);  // eval without skipping: the full mix again
  check_close(learned->attend(x, {.key_padding_mask = valid}), y_full, 1e-13, 1e-13);
  // All pairs skip: the sparse branch alone, as the sparse-only layer with the same weights gives.
  learned->options.skip_dense_above(0.01);
  check_close(learned->attend(x, {.key_padding_mask = valid}), ys, 1e-13, 1e-13);
}

TEST_CASE("AsamAttention: bad options and inputs give clear errors") {
  check_error(
      [] {
        nn::AsamAttention(nn::AsamAttentionOptions(8, 2).patterns({"window", "diagonal"}));
      },
      {"AsamAttention", "unknown pattern 'diagonal'", "window, strided"});
  check_error([] { nn::AsamAttention(nn::AsamAttentionOptions(8, 2).window(0)); }, {"AsamAttention", "window", "0"});
  check_error([] { nn::AsamAttention(nn::AsamAttentionOptions(8, 2).skip_dense_above(1.0)); },
              {"AsamAttention", "skip_dense_above"});
  check_error([] { nn::AsamAttention(nn::AsamAttentionOptions(8, 3)); }, {"AsamAttention", "multiple of heads"});
  nn::AsamAttention ok(nn::AsamAttentionOptions(8, 2).random_keys(2));
  check_error(
      [&] {
        ok.attend(randn({2, 10, 8}), {.key_padding_mask = ones({2, 9}, {.dtype = kBool})});
      },
      {"AsamAttention", "key_padding_mask", "[2, 9]"});
  check_error([&] { ok.attend(randn({2, 10, 7}), {}); }, {"AsamAttention", "[2, 10, 7]"});
}

TEST_CASE("TransformerClassifier with attention \"asam\" trains (post-norm blocks)") {
  manual_seed(3);
  auto model = std::make_shared<models::TransformerClassifier>(
      models::TransformerClassifierOptions(8, 32, 2)
          .d_model(16)
          .heads(2)
          .layers(2)
          .ffn(32)
          .dropout(0)
          .norm_first(false)
          .attention("asam")
          .asam(nn::AsamAttentionOptions(16, 2).patterns({"window", "global", "clustered"}).window(5).clusters(2)));
  // Task: is token 1 present anywhere in the sequence?
  Generator gen(9);
  Tensor tokens = randint(2, 8, {32, 24}, {.dtype = kInt64}, &gen);
  std::vector<int64_t> labels(32);
  for (int64_t b = 0; b < 32; ++b)
    if (b % 2 == 0) tokens.data_ptr<int64_t>()[b * 24 + (b * 7) % 24] = 1, labels[b] = 1;
  Tensor y = tensor(labels, {32});
  optim::AdamW opt(model->parameters(), {.lr = 3e-3});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(model->forward(tokens), y);
    Tensor total = loss + model->aux_loss();
    opt.zero_grad();
    total.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  MESSAGE("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("AsamAttention CUDA: the layer on the device equals the layer on the CPU (float64, every pattern)") {
  if (!gpu_or_skip()) return;
  const int64_t B = 2, T = 14, D = 8, H = 2;
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"window", "global", "random", "clustered", "hierarchical"},
        std::vector<std::string>{"window", "strided", "hierarchical"}}) {  // the second: the device copy is cached
    auto opts =
        nn::AsamAttentionOptions(D, H).patterns(names).window(4).random_keys(2).block(4).clusters(2).cluster_theta(0.3);
    auto cpu = make_layer(opts), dev = make_layer(opts);
    dev->to(Device::cuda());
    Tensor x = randn64({B, T, D}, false, 12), valid = padding_mask(B, T, 3);
    for (int call = 0; call < 2; ++call) {
      CAPTURE(call);
      cpu->zero_grad(), dev->zero_grad();
      Tensor xc = x.detach(), xd = x.to(Device::cuda()).detach();
      xc.set_requires_grad(true), xd.set_requires_grad(true);
      Tensor yc = cpu->attend(xc, {.key_padding_mask = valid, .causal = true});
      Tensor yd = dev->attend(xd, {.key_padding_mask = valid.to(Device::cuda()), .causal = true});
      check_close(yd.to(Device::cpu()), yc, 1e-12, 1e-12);
      (yc * yc).sum().backward();
      (yd * yd).sum().backward();
      check_close(xd.grad().to(Device::cpu()), xc.grad(), 1e-11, 1e-11);
      check_close(dev->threshold.grad().to(Device::cpu()), cpu->threshold.grad(), 1e-11, 1e-11);
    }
  }
}

TEST_CASE("AsamAttention CUDA: skip-dense inference in bfloat16 skips the pairs the float64 CPU layer skips") {
  if (!gpu_or_skip()) return;
  // The gate is read back to the host to choose the pairs; a bfloat16 gate must be readable (it threw).
  const int64_t B = 2, T = 16, D = 8, H = 2;
  auto opts = nn::AsamAttentionOptions(D, H).window(3).random_keys(2);
  auto cpu = make_layer(opts), dev = make_layer(opts);
  dev->to(Device::cuda());
  dev->to(kBFloat16);
  Tensor x = randn64({B, T, D}, false, 5);
  for (double thr : {0.01, 0.99}) {  // every pair skips the dense branch; none does
    CAPTURE(thr);
    cpu->options.skip_dense_above(thr), dev->options.skip_dense_above(thr);
    cpu->eval(), dev->eval();
    const int64_t cpu_before = cpu->dense_skipped(), dev_before = dev->dense_skipped();
    Tensor yc = cpu->attend(x, {});
    Tensor yd = dev->attend(x.to(Device::cuda()).to(kBFloat16), {});
    CHECK(yd.dtype() == kBFloat16);
    CHECK(dev->dense_skipped() - dev_before == cpu->dense_skipped() - cpu_before);
    check_close(yd.to(kFloat32).to(Device::cpu()).to(kFloat64), yc, 0.05, 0.05);
  }
}
