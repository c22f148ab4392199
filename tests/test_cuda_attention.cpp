// The fused attention paths on CUDA of nn::scaled_dot_product_attention — cuDNN flash attention
// (cuda/cudnn_sdpa.cpp) and our tiled flash kernels (cuda/flash_attention.cu): when each is chosen and why not, and
// their forward and backward against the composed path computed in float64 on the CPU from the same rounded inputs.
// Under the CUDA emulator the cuDNN graphs are interpreted op by op (tests/cuda_emu/cudnn.cpp), which checks the
// graphs' wiring and math; whether a given cuDNN release accepts them is shown only on a GPU (tools/gpu_check.sh). GPU
// cases skip, saying so, where no CUDA device is present.
#include <cmath>

#include "ascender.h"
#include "testing.h"

using namespace asc;
using asc::testing::gpu_or_skip;
using asc::testing::SdpaBackendScope;
using asc::testing::Tf32Scope;

namespace {

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
    SdpaBackendScope fused(nn::SdpaBackend::Fused);
    CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, q, q, {.dropout = 0.5, .training = true}),
                         doctest::Contains("the Fused backend cannot run q [1, 2, 4, 8] float32"), Error);
  }
  {
    SdpaBackendScope math(nn::SdpaBackend::Math);
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
  // What cuDNN does not take runs the flash kernel (float32, head dims cuDNN refuses, masks, a bias, causal T != S,
  // D not innermost) up to its head-dim limit; beyond it, the composed ops. 16-bit inputs with a head dim up to 64
  // run its tensor-core kernels (float32 too when TF32 is allowed).
  const std::string flash = "fused (CUDA flash kernel on tensor cores)";
  CHECK(nn::sdpa_choice(cu({2, 2, 8, 16}, kFloat32), cu({2, 2, 8, 16}, kFloat32), cu({2, 2, 8, 16}, kFloat32)) ==
        "fused (CUDA flash kernel)");
  CHECK(nn::sdpa_choice(cu({1, 1, 8, 96}), cu({1, 1, 8, 96}), cu({1, 1, 8, 96}), {.bias = cu({1, 1, 8, 8})}) ==
        "fused (CUDA flash kernel)");  // a head dim past the tensor-core kernels' 64
  CHECK(nn::sdpa_choice(cu({1, 1, 8, 12}), cu({1, 1, 8, 12}), cu({1, 1, 8, 12})) == flash);
  CHECK(nn::sdpa_choice(cu({1, 1, 8, 136}), cu({1, 1, 8, 136}), cu({1, 1, 8, 136}))
            .starts_with("math: head dim 136 (the flash kernel takes up to 128 in bfloat16); cuDNN: head dim 136"));
  CHECK(nn::sdpa_choice(cu({1, 1, 4, 16}), cu({1, 1, 8, 16}), cu({1, 1, 8, 16}), {.causal = true}) == flash);
  Tensor keep = ones({1, 1, 8, 8}, {.dtype = kBool, .device = Device::cuda()});
  CHECK(nn::sdpa_choice(q, q, q, {.keep_mask = keep}) == flash);
  CHECK(nn::sdpa_choice(q, q, q, {.bias = cu({1, 1, 8, 8})}) == flash);
  CHECK(nn::sdpa_choice(q, q, q, {.dropout = 0.1, .training = true}) == "math: dropout");
  CHECK(nn::sdpa_choice(q, q, q, {.dropout = 0.1, .training = false}) == "fused (cuDNN)");
  Tensor w;
  CHECK(nn::sdpa_choice(q, q, q, {.weights = &w}) == "math: the probabilities were requested");
  Tensor qt = cu({2, 2, 16, 8}).transpose(2, 3);  // D not innermost: cuDNN cannot take it, the flash kernel can
  CHECK(nn::sdpa_choice(qt, qt, qt) == flash);
  Tensor q64 = cu({1, 1, 8, 72}, kFloat64);
  CHECK(nn::sdpa_choice(q64, q64, q64).starts_with("math: head dim 72 (the flash kernel takes up to 64 in float64)"));
  SdpaBackendScope fused(nn::SdpaBackend::Fused);
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q64, q64, q64),
                       doctest::Contains("the Fused backend cannot run q [1, 1, 8, 72] float64"), Error);
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
    SdpaBackendScope math(nn::SdpaBackend::Math);
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

namespace {

// The CUDA flash kernel (cuda/flash_attention.cu) against float64 math on the CPU, forward and the gradients of q,
// k, v: `mask` 0 none, 1 padding (B, 1, 1, S) with the last keys of sample 1 dropped, 2 a full random (B, H, T, S)
// mask with one row fully masked; `bias` (1, H, T, S); heads-last operands.
// tf32: float32 products on TF32 tensor cores (asc::cuda::set_allow_tf32); the tensor-core kernels
// (cuda/flash_mma.cu) take that, bfloat16 and float16 up to a head dim of 64.
void check_flash(DType dt, int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, bool causal, int mask, bool bias,
                 bool heads_last, bool tf32 = false) {
  CAPTURE(tf32);
  const Tf32Scope tf32_scope(tf32);
  const bool tensor_cores = D <= 64 && (dt == kBFloat16 || dt == kFloat16 || (dt == kFloat32 && tf32));
  CAPTURE(dt);
  CAPTURE(T);
  CAPTURE(S);
  CAPTURE(D);
  CAPTURE(causal);
  CAPTURE(mask);
  CAPTURE(bias);
  CAPTURE(heads_last);
  manual_seed(static_cast<uint64_t>(T * 131 + S * 7 + D + causal + 3 * mask + 11 * bias));
  const Device gpu = Device::cuda();
  auto make = [&](int64_t len) {
    Tensor x = randn({B, H, len, D}, {.dtype = kFloat64}).to(gpu).to(dt);  // 16-bit types exist on CUDA only
    if (!heads_last) return x;
    Tensor m = Tensor::empty({B, len, H, D}, {dt, gpu}).permute({0, 2, 1, 3});
    m.copy_(x);
    return m;
  };
  Tensor q = make(T), k = make(S), v = make(S);
  nn::SdpaOptions opts{.causal = causal};
  Tensor keep_cpu, bias_cpu;
  if (mask == 1) {
    std::vector<int64_t> m(B * S, 1);
    for (int64_t s = S - 5; s < S; ++s) m[(B - 1) * S + s] = 0;
    keep_cpu = tensor(m, {B, 1, 1, S}).to(kBool);
  } else if (mask == 2) {
    keep_cpu = gt(rand({B, H, T, S}, {.dtype = kFloat64}), 0.3);
    keep_cpu.select(2, T / 2).fill_(0.0);  // a row with no kept key: a zero output and no gradient
  }
  if (bias) bias_cpu = randn({1, H, T, S}, {.dtype = kFloat64});
  if (keep_cpu.defined()) opts.keep_mask = keep_cpu.to(gpu);
  if (bias) opts.bias = bias_cpu.to(gpu).to(dt);
  q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
  REQUIRE(nn::sdpa_choice(q, k, v, opts) ==
          (tensor_cores ? "fused (CUDA flash kernel on tensor cores)" : "fused (CUDA flash kernel)"));
  Tensor y = nn::scaled_dot_product_attention(q, k, v, opts);
  CHECK(y.dtype() == dt);
  Tensor g = randn({B, H, T, D}, {.dtype = kFloat64}).to(gpu).to(dt);
  y.backward(g);

  auto ref_leaf = [](const Tensor& t) { return t.detach().to(kFloat64).cpu().contiguous().set_requires_grad(true); };
  Tensor qr = ref_leaf(q), kr = ref_leaf(k), vr = ref_leaf(v);
  nn::SdpaOptions ropts{.causal = causal};
  if (keep_cpu.defined()) ropts.keep_mask = keep_cpu;
  if (bias) ropts.bias = opts.bias.to(kFloat64).cpu();
  SdpaBackendScope math(nn::SdpaBackend::Math);
  Tensor yr = nn::scaled_dot_product_attention(qr, kr, vr, ropts);
  yr.backward(g.to(kFloat64).cpu());
  // TF32 and float16 operands keep 10 fraction bits, bfloat16 7; the probabilities enter P V rounded the same way.
  const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? (tf32 ? 4e-3 : 2e-5) : dt == kFloat16 ? 4e-3 : 2e-2;
  CHECK(max_diff(y, yr) <= tol * (1 + max_abs(yr)));
  CHECK(max_diff(q.grad(), qr.grad()) <= tol * (1 + max_abs(qr.grad())));
  CHECK(max_diff(k.grad(), kr.grad()) <= tol * (1 + max_abs(kr.grad())));
  CHECK(max_diff(v.grad(), vr.grad()) <= tol * (1 + max_abs(vr.grad())));
  if (mask == 2) CHECK(max_abs(y.cpu().select(2, T / 2)) == 0.0);
}

}  // namespace

TEST_CASE(
    "CUDA flash kernel: forward and gradients equal float64 math (float64, float32, bf16; masks, bias, causal "
    "with T <, =, > S; partial tiles; heads-last)") {
  if (!gpu_or_skip()) return;
  // Sizes cross the tiles: 16 query rows per forward block, 8 per dq block, 8 keys per dk/dv block, tiles of 32.
  check_flash(kFloat64, 2, 2, 37, 45, 24, false, 0, false, false);
  check_flash(kFloat64, 2, 2, 37, 45, 40, false, 1, true, true);
  check_flash(kFloat64, 1, 3, 33, 33, 64, true, 2, false, false);
  check_flash(kFloat64, 2, 1, 20, 50, 16, true, 1, true, true);    // T < S: query t sits at t + 30
  check_flash(kFloat64, 1, 2, 50, 20, 16, true, 0, false, false);  // T > S: the first 30 rows see no key
  check_flash(kFloat32, 2, 2, 37, 45, 40, true, 2, true, true);
  check_flash(kFloat32, 1, 1, 70, 70, 128, false, 0, false, false);
  check_flash(kBFloat16, 1, 2, 24, 40, 16, false, 1, false, false);  // a mask: cuDNN declines, the flash kernel runs
}

TEST_CASE(
    "CUDA flash kernel on tensor cores: TF32, bfloat16 and float16 forward and gradients against float64 math (masks, "
    "bias, causal with T <, =, > S; partial tiles; head dims padded to the k step; heads-last)") {
  if (!gpu_or_skip()) return;
  // Sizes cross the tiles: 64 query rows (forward, dq) or keys (dk, dv) per block, tiles of 32.
  check_flash(kFloat32, 2, 2, 70, 45, 40, true, 2, true, true, /*tf32=*/true);
  check_flash(kFloat32, 1, 1, 33, 97, 64, false, 0, false, false, true);
  check_flash(kFloat32, 2, 1, 20, 50, 12, true, 1, true, true, true);    // T < S; D padded to 16
  check_flash(kFloat32, 1, 2, 80, 20, 24, true, 0, false, false, true);  // T > S: the first 60 rows see no key
  check_flash(kBFloat16, 2, 2, 70, 45, 40, true, 2, true, true);         // D padded to 48
  check_flash(kFloat16, 1, 2, 65, 66, 64, false, 1, true, false);
  check_flash(kFloat16, 2, 1, 31, 31, 8, true, 1, false, true);  // D padded to 16
  // D 20: rows are not whole 16-byte pieces, staged element by element (cuda/async_copy.cuh); 3 key tiles.
  check_flash(kBFloat16, 1, 2, 40, 70, 20, false, 0, false, true);
}

TEST_CASE("CUDA flash kernel: empty inputs, and MultiHeadAttention in float32 on CUDA agrees with the Math backend") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  for (auto [T, S] : {std::pair<int64_t, int64_t>{0, 5}, {4, 0}}) {
    Tensor q = randn({1, 2, T, 8}).to(gpu).set_requires_grad(true),
           k = randn({1, 2, S, 8}).to(gpu).set_requires_grad(true);
    Tensor v = randn({1, 2, S, 8}).to(gpu).set_requires_grad(true);
    Tensor y = nn::scaled_dot_product_attention(q, k, v, nn::SdpaOptions{});
    CHECK(y.shape() == Shape{1, 2, T, 8});
    if (T > 0) CHECK(max_abs(y) == 0.0);
    y.sum().backward();
    if (S > 0) CHECK(max_abs(k.grad()) == 0.0);
  }
  manual_seed(12);
  auto mha = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(64, 2));
  mha->to(gpu);
  Tensor x = randn({2, 40, 64}).to(gpu);
  REQUIRE(nn::sdpa_choice(x.view({2, 40, 2, 32}).permute({0, 2, 1, 3}), x.view({2, 40, 2, 32}).permute({0, 2, 1, 3}),
                          x.view({2, 40, 2, 32}).permute({0, 2, 1, 3})) == "fused (CUDA flash kernel)");
  Tensor y_fused = mha->attend(x, {.causal = true});
  Tensor y_math;
  {
    SdpaBackendScope math(nn::SdpaBackend::Math);
    y_math = mha->attend(x, {.causal = true});
  }
  CHECK(max_diff(y_fused, y_math) <= 1e-5 * (1 + max_abs(y_math)));
}
