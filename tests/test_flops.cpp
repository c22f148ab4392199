// The FLOP counter (models/flops.h): hand-counted small models, the sparse patterns' pair counts against their dense
// masks, and the relations between modes that must hold whatever the constants.
#include <chrono>

#include "core/autocast.h"
#include "models/decoder_lm.h"
#include "models/firing_net.h"
#include "models/flops.h"
#include "models/transformer_classifier.h"
#include "testing.h"

using namespace asc;

TEST_CASE("flops: a dense Transformer classifier counted by hand") {
  // D 8, H 2, F 16, 1 layer, 3 classes, T 4:
  //   projections 4 · 2·T·D·D = 2048, scores + A·V 4·T²·D = 512, FFN 2 · 2·T·D·F = 2048, head 2·D·C = 48.
  auto m = models::TransformerClassifier(
      models::TransformerClassifierOptions(10, 4, 3).d_model(8).heads(2).ffn(16).layers(1).dropout(0));
  const models::FlopCount c = models::count_flops(m, 4);
  CHECK(c.attention == doctest::Approx(2048 + 512));
  CHECK(c.forward == doctest::Approx(2048 + 512 + 2048 + 48));
  CHECK(c.training() == doctest::Approx(3 * c.forward));
  // Two layers: twice the blocks, one head.
  auto m2 = models::TransformerClassifier(
      models::TransformerClassifierOptions(10, 4, 3).d_model(8).heads(2).ffn(16).layers(2).dropout(0));
  CHECK(models::count_flops(m2, 4).forward == doctest::Approx(2 * (2048 + 512 + 2048) + 48));
}

TEST_CASE("flops: the LM's head runs at every position") {
  auto lm = models::DecoderLM(models::DecoderLMOptions(32).d_model(8).heads(2).ffn(16).layers(1));
  const double T = 6, D = 8, F = 16, V = 32;
  CHECK(models::count_flops(lm, 6).forward ==
        doctest::Approx(8 * T * D * D + 4 * T * T * D + 4 * T * D * F + 2 * T * D * V));
}

TEST_CASE("flops: ASAM's sparse branch counts the pattern's pairs, its dense branch T² unless the gate is fixed at 1") {
  const int64_t T = 37, D = 16, H = 2;
  auto o = nn::AsamAttentionOptions(D, H).patterns({"window", "global"}).window(5).global_tokens(3);
  nn::AsamAttention learned(o), fixed(nn::AsamAttentionOptions(o).fixed_gate(1.0));
  // The pairs by the dense mask: an independent count of the same pattern.
  const double pairs = sum(learned.pattern(T, false).dense_mask().to(kFloat64)).item<double>();
  const double dh = D / H;
  const double diff = models::attention_flops(learned, T).forward - models::attention_flops(fixed, T).forward;
  CHECK(diff == doctest::Approx(H * 4.0 * T * T * dh));  // exactly the dense branch
  const double proj = 4 * 2.0 * T * D * D, gate = T * D + 2.0 * (1 + 2 + 4) * D * H;
  CHECK(models::attention_flops(fixed, T).forward == doctest::Approx(proj + H * 4 * pairs * dh + gate));
  // Causal patterns keep fewer pairs.
  CHECK(models::attention_flops(fixed, T, true).forward < models::attention_flops(fixed, T).forward);
}

TEST_CASE("flops: ASCender's extra cost scales with the attended pairs") {
  const int64_t D = 16, H = 2, T = 20;
  auto full = nn::AscenderAttention(nn::AscenderAttentionOptions(D, H).k({4}));
  auto wide = nn::AscenderAttention(
      nn::AscenderAttentionOptions(D, H).k({4}).mode(nn::AscenderMode::Windowed).window(1000).global_tokens(0));
  auto narrow = nn::AscenderAttention(
      nn::AscenderAttentionOptions(D, H).k({4}).mode(nn::AscenderMode::Windowed).window(3).global_tokens(0));
  auto reuse = nn::AscenderAttention(nn::AscenderAttentionOptions(D, H).k({4}).mode(nn::AscenderMode::Reuse));
  auto mha = nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(D, H));
  const double f_full = models::attention_flops(full, T).forward;
  CHECK(models::attention_flops(wide, T).forward == doctest::Approx(f_full));  // a window past T is the full set
  CHECK(models::attention_flops(narrow, T).forward < f_full);
  // Reuse skips the affinities: 2 P d_a per head less.
  CHECK(f_full - models::attention_flops(reuse, T).forward == doctest::Approx(H * 2.0 * T * T * full.d_a));
  // ASCender is dense attention plus its latent projections and terms: strictly more, by the two projections at
  // least.
  CHECK(f_full - models::attention_flops(mha, T).forward >= 2.0 * T * D * H * (full.d_z + full.d_a));
  // Per-pair growth: doubling T more than doubles the cost (the T² terms).
  CHECK(models::attention_flops(full, 2 * T).forward > 2 * f_full);
}

TEST_CASE("flops: firing classifier and refusals") {
  auto net = models::FiringClassifier(models::FiringClassifierOptions(12, 3).hidden(5).fan_out(2));
  // hidden: 2·12·5 + 5 + 5·2; second (channels, d = 5 inputs per neuron, P = 2, α = 1): 2·5·2 + 2 + 2; readout 2·2·3.
  CHECK(models::count_flops(net, 1).forward == doctest::Approx(120 + 5 + 10 + 20 + 2 + 2 + 12));
  CHECK_THROWS_AS(models::count_flops(net, 0), Error);
  nn::LayerNorm ln(nn::LayerNormOptions({4}));
  CHECK_THROWS_WITH_AS(models::count_flops(ln, 4), doctest::Contains("LayerNorm"), Error);
  CHECK_THROWS_AS(models::measured_gemm_peak(1), Error);
  CHECK(models::measured_gemm_peak(64) > 0);
}

TEST_CASE(
    "flops: an MLP (the firing network's baseline) is the sum of its Linear layers; a Sequential of unknown "
    "modules is refused") {
  nn::MLP mlp(nn::MLPOptions({4, 8, 2}).dropout(0.1));  // Linear(4, 8), ReLU, Dropout, Linear(8, 2)
  CHECK(models::count_flops(mlp, 1).forward == doctest::Approx(2 * 4 * 8 + 2 * 8 * 2));
  CHECK(models::count_flops(mlp, 1).attention == 0);
  nn::Sequential with_norm{std::make_shared<nn::Linear>(4, 4),
                           std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({4}))};
  CHECK_THROWS_WITH_AS(models::count_flops(with_norm, 1), doctest::Contains("LayerNorm"), Error);
}

TEST_CASE("cpu_peak: the processor's fp32 peak is its threads × clock × lanes × FMA units × 2, and bounds what runs") {
  const CpuPeak& p = cpu_peak();
  MESSAGE(p.describe());
  CHECK(&p == &cpu_peak());     // measured once per thread count
  if (p.clock_hz == 0) return;  // not x86-64: nothing measured
  CHECK(p.clock_hz > 0.5e9);
  CHECK(p.clock_hz < 7e9);
  CHECK(p.fma_units >= 1);
  CHECK(p.fma_units <= 4);
  CHECK(p.fp32_flops == doctest::Approx(p.threads * p.clock_hz * p.fp32_lanes * p.fma_units * 2));
  if (cpu_isa_supported() == CpuIsa::x86_64_v4) CHECK(p.fp32_lanes == 16);
  // Upper bound: the FMA loop cannot beat the peak it is part of (an optimiser that merges its chains did: 2x).
  CHECK(p.fma_rate_fp32 <= 1.1 * p.fp32_flops);
  // Lower bound: no GEMM beats the peak either. A 256^3 product through the library, best of 5.
  Tensor a = randn({256, 256}), b = randn({256, 256});
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul(a, b);
    if (r > 0) best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double gemm = 2.0 * 256 * 256 * 256 / best;
  MESSAGE("matmul 256^3: ", gemm * 1e-9, " GFLOP/s");
  CHECK(gemm <= 1.15 * p.fp32_flops);
  CHECK(p.bf16_flops > 0);
  if (!p.bf16) CHECK(p.bf16_flops == p.fp32_flops);
  if (p.amx) {  // Intel's figure is 16 cycles per tile product; the clock falls while AMX works
    CHECK(p.amx_cycles >= 8);
    CHECK(p.amx_cycles <= 64);
    CHECK(p.bf16_flops > p.fp32_flops);
  }
  // No bfloat16 product beats the bfloat16 peak either (where the peak saw the AMX the products use: a build without
  // the measurement, clang or not Linux, states AVX512-BF16's; with AMX the peak is itself a measured rate, so the
  // bound leaves room for a core busy while it was measured).
  if (cpu_bf16_supported() && (p.amx || !cpu_bf16_amx())) {
    Tensor x = randn({512, 512}), y = randn({512, 512});
    double best16 = 1e30;
    for (int r = 0; r < 6; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      matmul_bf16(x, y);
      if (r > 0)
        best16 = std::min(best16, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    MESSAGE("matmul_bf16 512^3: ", 2.0 * 512 * 512 * 512 / best16 * 1e-9, " GFLOP/s");
    CHECK(2.0 * 512 * 512 * 512 / best16 <= (p.amx ? 2.0 : 1.15) * p.bf16_flops);
  }
}
