// The fused attention path (cuDNN flash attention, cuda/cudnn_sdpa.cpp) of nn::scaled_dot_product_attention:
// when it is chosen and why not, and its forward and backward against the composed path computed in float64 on
// the CPU from the same rounded inputs. Under the CUDA emulator the cuDNN graphs are interpreted op by op
// (tests/cuda_emu/cudnn.cpp), which checks the graphs' wiring and math; whether a given cuDNN release accepts them is
// shown only on a GPU (tools/gpu_check.sh). GPU cases skip, saying so, where no CUDA device is present.
#include <cmath>

#include "ascender.h"
#include "testing.h"

using namespace asc;
using asc::testing::gpu_or_skip;

namespace {

// Restores the process-wide backend after a test changes it.
struct BackendScope {
  nn::SdpaBackend prev = nn::sdpa_backend();
  explicit BackendScope(nn::SdpaBackend b) { nn::set_sdpa_backend(b); }
  ~BackendScope() { nn::set_sdpa_backend(prev); }
};

double max_abs(const Tensor& a) { return amax(abs(a.to(kFloat64).cpu())).item<double>(); }
double max_diff(const Tensor& a, const Tensor& b) { return max_abs(a.to(kFloat64).cpu() - b.to(kFloat64).cpu()); }

bool fused_available() {
  Tensor q = zeros({1, 1, 8, 16}, {.dtype = kBFloat16, .device = Device::cuda()});
  return nn::sdpa_choice(q, q, q) == "fused (cuDNN)";
}

// Forward and gradients of the fused path against float64 math on the CPU, from the same 16-bit inputs and
// cotangent. `layout_bthd`: q/k/v as (B, T, H, D) memory viewed (B, H, T, D), as MultiHeadAttention makes them.
void check_against_math(DType dt, int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, bool causal,
                        bool layout_bthd) {
  CAPTURE(dt);
  CAPTURE(T);
  CAPTURE(S);
  CAPTURE(D);
  CAPTURE(causal);
  CAPTURE(layout_bthd);
  manual_seed(static_cast<uint64_t>(T * 131 + S * 7 + D + causal));
  auto make = [&](int64_t len) { return randn({B, H, len, D}).to(Device::cuda()).to(dt); };
  Tensor q = make(T), k = make(S), v = make(S);
  if (layout_bthd) {  // the same values in heads-last memory
    auto bthd = [&](const Tensor& t, int64_t len) {
      Tensor m = Tensor::empty({B, len, H, D}, {dt, Device::cuda()}).permute({0, 2, 1, 3});
      m.copy_(t);
      return m;
    };
    q = bthd(q, T), k = bthd(k, S), v = bthd(v, S);
    REQUIRE(q.stride(2) == H * D);
  }
  q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
  const nn::SdpaOptions opts{.causal = causal};
  REQUIRE(nn::sdpa_choice(q, k, v, opts) == "fused (cuDNN)");
  Tensor y = nn::scaled_dot_product_attention(q, k, v, opts);
  CHECK(y.dtype() == dt);
  CHECK(y.shape() == Shape{B, H, T, D});
  Tensor g = randn({B, H, T, D}).to(Device::cuda()).to(dt);
  y.backward(g);

  // Reference: the composed path in float64 on the CPU.
  auto ref_leaf = [](const Tensor& t) {
    Tensor r = t.detach().to(kFloat64).cpu().contiguous();
    r.set_requires_grad(true);
    return r;
  };
  Tensor qr = ref_leaf(q), kr = ref_leaf(k), vr = ref_leaf(v);
  Tensor yr = nn::scaled_dot_product_attention(qr, kr, vr, opts);
  yr.backward(g.to(kFloat64).cpu());

  // 16-bit output and gradients: relative to the reference's magnitude (bf16 has 8 mantissa bits).
  const double tol = dt == kBFloat16 ? 2e-2 : 4e-3;
  CHECK(max_diff(y, yr) <= tol * (1 + max_abs(yr)));
  CHECK(max_diff(q.grad(), qr.grad()) <= tol * (1 + max_abs(qr.grad())));
  CHECK(max_diff(k.grad(), kr.grad()) <= tol * (1 + max_abs(kr.grad())));
  CHECK(max_diff(v.grad(), vr.grad()) <= tol * (1 + max_abs(vr.grad())));
  CHECK(q.grad().dtype() == dt);
}

}  // namespace

TEST_CASE("sdpa_choice: the fused kernel on the CPU, and the Fused backend refuses what it cannot run") {
  Tensor q = randn({1, 2, 4, 8});
  CHECK(nn::sdpa_choice(q, q, q) == "fused (CPU)");
  {
    BackendScope fused(nn::SdpaBackend::Fused);
    CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, q, q, {.dropout = 0.5, .training = true}),
                         doctest::Contains("the Fused backend cannot run q [1, 2, 4, 8] float32"), Error);
  }
  {
    BackendScope math(nn::SdpaBackend::Math);
    CHECK(nn::sdpa_choice(q, q, q) == "math: the Math backend is selected");
  }
  CHECK_THROWS_WITH_AS(nn::sdpa_choice(q, randn({1, 2, 4, 6}), q), doctest::Contains("incompatible q"), Error);
}

TEST_CASE("SdpaOptions: causal as a flag equals the causal keep-mask (CPU, T != S)") {
  manual_seed(5);
  Tensor q = randn({2, 2, 3, 4}, {.dtype = kFloat64}), k = randn({2, 2, 5, 4}, {.dtype = kFloat64});
  Tensor v = randn({2, 2, 5, 4}, {.dtype = kFloat64});
  // Query t sees keys s <= t + (S - T).
  std::vector<int64_t> m;
  for (int t = 0; t < 3; ++t)
    for (int s = 0; s < 5; ++s) m.push_back(s <= t + 2);
  Tensor keep = tensor(m, {1, 1, 3, 5}).to(kBool);
  Tensor a = nn::scaled_dot_product_attention(q, k, v, {.causal = true});
  Tensor b = nn::scaled_dot_product_attention(q, k, v, keep);
  CHECK(max_diff(a, b) < 1e-12);
}

TEST_CASE("fused attention: when the fused kernels are used, and why not") {
  if (!gpu_or_skip()) return;
  if (!fused_available()) {
    Tensor z = zeros({1, 1, 8, 16}, {.dtype = kBFloat16, .device = Device::cuda()});
    MESSAGE("fused attention unavailable here: " << nn::sdpa_choice(z, z, z));
    return;
  }
  auto cu = [](Shape s, DType dt = kBFloat16) { return zeros(s, {.dtype = dt, .device = Device::cuda()}); };
  Tensor q = cu({2, 2, 8, 16});
  CHECK(nn::sdpa_choice(q, q, q) == "fused (cuDNN)");
  CHECK(nn::sdpa_choice(q, q, q, {.causal = true}) == "fused (cuDNN)");
  CHECK(nn::sdpa_choice(cu({2, 2, 8, 16}, kFloat32), cu({2, 2, 8, 16}, kFloat32), cu({2, 2, 8, 16}, kFloat32))
            .starts_with("math: dtype float32"));
  CHECK(nn::sdpa_choice(cu({1, 1, 8, 12}), cu({1, 1, 8, 12}), cu({1, 1, 8, 12})).starts_with("math: head dim 12"));
  CHECK(nn::sdpa_choice(cu({1, 1, 8, 136}), cu({1, 1, 8, 136}), cu({1, 1, 8, 136})).starts_with("math: head dim 136"));
  CHECK(nn::sdpa_choice(cu({1, 1, 4, 16}), cu({1, 1, 8, 16}), cu({1, 1, 8, 16}), {.causal = true}) ==
        "math: causal with T != S");
  Tensor keep = ones({1, 1, 8, 8}, {.dtype = kBool, .device = Device::cuda()});
  CHECK(nn::sdpa_choice(q, q, q, {.keep_mask = keep}) == "math: a keep_mask");
  CHECK(nn::sdpa_choice(q, q, q, {.bias = cu({1, 1, 8, 8})}) == "math: an additive bias");
  CHECK(nn::sdpa_choice(q, q, q, {.dropout = 0.1, .training = true}) == "math: dropout");
  CHECK(nn::sdpa_choice(q, q, q, {.dropout = 0.1, .training = false}) == "fused (cuDNN)");
  Tensor w;
  CHECK(nn::sdpa_choice(q, q, q, {.weights = &w}) == "math: the probabilities were requested");
  // Strides the kernels cannot take: D not innermost.
  Tensor qt = cu({2, 2, 16, 8}).transpose(2, 3);
  CHECK(nn::sdpa_choice(qt, qt, qt).starts_with("math: q/k/v of shape [2, 2, 8, 16] with strides"));
  BackendScope fused(nn::SdpaBackend::Fused);
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, q, q, {.keep_mask = keep}),
                       doctest::Contains("the Fused backend cannot run q [2, 2, 8, 16] bfloat16"), Error);
}

TEST_CASE("fused attention: forward and backward match float64 math (bf16/f16, causal, T != S, heads-last)") {
  if (!gpu_or_skip() || !fused_available()) return;
  for (DType dt : {kBFloat16, kFloat16}) {
    check_against_math(dt, 2, 3, 24, 24, 16, false, false);
    check_against_math(dt, 2, 3, 24, 24, 16, true, false);
    check_against_math(dt, 1, 2, 10, 33, 8, false, false);
    check_against_math(dt, 2, 2, 17, 17, 32, true, true);
  }
  check_against_math(kBFloat16, 1, 1, 40, 40, 64, true, true);
}

TEST_CASE("fused attention: MultiHeadAttention in bf16 on CUDA uses it and agrees with the Math backend") {
  if (!gpu_or_skip() || !fused_available()) return;
  manual_seed(11);
  auto mha = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(64, 4));
  mha->to(Device::cuda());
  mha->to(kBFloat16);
  Tensor x = randn({2, 12, 64}).to(Device::cuda()).to(kBFloat16);
  Tensor y_fused = mha->attend(x, {.causal = true});
  Tensor y_math;
  {
    BackendScope math(nn::SdpaBackend::Math);
    y_math = mha->attend(x, {.causal = true});
  }
  CHECK(max_diff(y_fused, y_math) <= 2e-2 * (1 + max_abs(y_math)));
  // Training step: gradients reach every projection through the fused backward.
  mha->zero_grad();
  mha->attend(x, {.causal = true}).to(kFloat32).pow(2).sum().backward();
  for (const auto& [name, p] : mha->named_parameters()) {
    CAPTURE(name);
    REQUIRE(p.grad().defined());
    CHECK(max_abs(p.grad()) > 0);
  }
}
