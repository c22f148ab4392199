// bfloat16 products on the CPU: matmul_bf16, addmm_bf16 and linear under CpuAutocast (core/autocast.h). Forward and
// gradients against float64 products of the bfloat16-rounded operands (exact: a product of two bfloat16 values fits in
// a float32, so only the float32 accumulation may differ, by a few ulps of the sum of |products|); the rounding itself
// (to nearest even, NaN kept, overflow to infinity); NaN / inf propagation; bit-identical results at every thread count
// in deterministic mode; the scope's nesting and thread-locality; errors. On a processor without bfloat16 products the
// cases check that everything refuses with asc::Error instead.
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "testing.h"

#include "ops/cpu/bfloat16.h"
#include "ops/cpu/gemm.h"  // round_to_bfloat16

using namespace asc;
using namespace asc::testing;

namespace {

double round_bf16(double v) { return cpu::bfloat16_value(cpu::bfloat16_bits(static_cast<float>(v))); }

// The operand as matmul_bf16 reads it: float32 values rounded to bfloat16, in float64 (contiguous (rows, cols)).
std::vector<double> rounded(const Tensor& t) {
  std::vector<double> v = t.contiguous().to_vector<double>();
  for (double& e : v) e = round_bf16(e);
  return v;
}

// y = A B for A (M, K), B (K, N) given as float32 tensors (any strides): float64 products of the rounded operands, and
// for each entry the bound on float32 accumulation error, 2 K u Σ|a b| (u = 2^-24).
struct Reference {
  std::vector<double> y, bound;
};
Reference reference(const Tensor& A, const Tensor& B) {
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  const std::vector<double> a = rounded(A), b = rounded(B);
  Reference r{std::vector<double>(static_cast<size_t>(M * N)), std::vector<double>(static_cast<size_t>(M * N))};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, abs = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = a[static_cast<size_t>(i * K + k)] * b[static_cast<size_t>(k * N + j)];
        s += p;
        abs += std::fabs(p);
      }
      r.y[static_cast<size_t>(i * N + j)] = s;
      r.bound[static_cast<size_t>(i * N + j)] = 2.0 * static_cast<double>(K) * std::ldexp(abs, -24) + 1e-30;
    }
  return r;
}

void check_against(const Tensor& y, const Reference& r) {
  const std::vector<double> got = y.contiguous().to_vector<double>();
  REQUIRE(got.size() == r.y.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - r.y[i]) <= r.bound[i]) && bad++ < 5)
      FAIL_CHECK("entry " << i << ": " << got[i] << " vs " << r.y[i] << " (bound " << r.bound[i] << ")");
  CHECK(bad == 0);
}

Tensor mat(int64_t r, int64_t c, uint64_t seed) { return randn64({r, c}, false, seed).to(kFloat32); }

}  // namespace

TEST_CASE("bfloat16_bits rounds to nearest even, keeps NaN a NaN, overflows to infinity") {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);                                 // bfloat16 keeps 7 fraction bits
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(one + std::ldexp(1.0f, -8))) == one);  // tie: to the even 1
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(one + 3 * std::ldexp(1.0f, -8))) == one + 2 * ulp);  // tie: to even
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))) == one + ulp);
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(-2.5f)) == -2.5f);
  CHECK(std::isnan(cpu::bfloat16_value(cpu::bfloat16_bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(cpu::bfloat16_value(cpu::bfloat16_bits(-std::numeric_limits<float>::quiet_NaN()))));
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(std::numeric_limits<float>::infinity())) ==
        std::numeric_limits<float>::infinity());
  CHECK(std::isinf(cpu::bfloat16_value(cpu::bfloat16_bits(std::numeric_limits<float>::max()))));
  CHECK(cpu::bfloat16_value(cpu::bfloat16_bits(std::numeric_limits<float>::denorm_min())) == 0.0f);  // rounds down
}

TEST_CASE("matmul_bf16: products of the bfloat16-rounded operands, float32 accumulation, every layout") {
  MESSAGE(fmt::format("bfloat16 products: {}{}; GEMM: {}", cpu_bf16_supported() ? "supported" : "not supported",
                      cpu_bf16_amx() ? " (AMX)" : "", cpu_gemm_kernel()));
  if (!cpu_bf16_supported()) {
    check_error([] { matmul_bf16(mat(3, 4, 1), mat(4, 5, 2)); }, {"matmul_bf16", "bfloat16 products"});
    check_error([] { CpuAutocast on; }, {"CpuAutocast", "bfloat16"});
    return;
  }
  for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 37, 5}, {17, 1, 9}, {5, 300, 1}, {33, 65, 47}, {130, 70, 129}, {700, 96, 260}}) {
    CAPTURE(M);
    CAPTURE(K);
    CAPTURE(N);
    const Tensor a = mat(M, K, 11), b = mat(K, N, 12);
    const Reference ref = reference(a, b);
    check_against(matmul_bf16(a, b), ref);
    check_against(matmul_bf16(a.t().contiguous().t(), b), ref);                       // A's rows contiguous
    check_against(matmul_bf16(a, b.t().contiguous().t()), ref);                       // B's
    check_against(matmul_bf16(a.t().contiguous().t(), b.t().contiguous().t()), ref);  // both
    const Tensor wide = cat({a, a}, 1).slice(1, 0, 2 * K, 2);                         // column stride 2
    check_against(matmul_bf16(wide, b), reference(wide, b));
  }
  // not the float32 product: the rounding is there (a K = 64 product of unrounded operands differs by ~2^-9 relative)
  const Tensor a = mat(8, 64, 3), b = mat(64, 8, 4);
  const std::vector<double> f32 = matmul(a.to(kFloat64), b.to(kFloat64)).to_vector<double>(),
                            bf = matmul_bf16(a, b).to_vector<double>();
  double most = 0;
  for (size_t i = 0; i < f32.size(); ++i) most = std::max(most, std::fabs(f32[i] - bf[i]));
  CHECK(most > 1e-3);
  // batched and broadcast: each product as the 2-D one
  const Tensor x = randn64({3, 6, 20}, false, 5).to(kFloat32), w = mat(20, 7, 6);
  const Tensor y = matmul_bf16(x, w);
  REQUIRE(y.shape() == Shape{3, 6, 7});
  for (int64_t i = 0; i < 3; ++i) check_against(y.select(0, i), reference(x.select(0, i), w));
  // 1-D operands and K = 0, as matmul
  CHECK(matmul_bf16(mat(1, 5, 7).reshape({5}), mat(5, 3, 8)).shape() == Shape{3});
  CHECK(matmul_bf16(zeros({2, 0}), zeros({0, 3})).to_vector<double>() == std::vector<double>(6, 0.0));
}

TEST_CASE("round_to_bfloat16: every element rounded, a transposed view keeping its layout") {
  if (!cpu_bf16_supported()) {
    check_error([] { cpu::round_to_bfloat16(mat(2, 3, 1)); }, {"round_to_bfloat16", "bfloat16"});
    return;
  }
  Tensor w = mat(37, 70, 61);  // 2590 elements: runs of 32 and a tail
  w.data_ptr<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  w.data_ptr<float>()[6] = -std::numeric_limits<float>::infinity();
  // denormals, in a 32-float run and in the tail: zeros of their sign at every position (the products read a
  // bfloat16 denormal as zero anyway)
  w.data_ptr<float>()[7] = std::numeric_limits<float>::denorm_min() * 5;
  w.data_ptr<float>()[2588] = -std::numeric_limits<float>::denorm_min() * 7;
  std::vector<double> want = rounded(w);
  want[7] = 0.0, want[2588] = -0.0;
  const Tensor r = cpu::round_to_bfloat16(w), rt = cpu::round_to_bfloat16(w.t());
  CHECK(r.dtype() == kBFloat16);
  CHECK(rt.shape() == Shape{70, 37});
  CHECK(rt.stride(0) == 1);  // the transposed view's layout, not a copy made contiguous
  const std::vector<double> got = r.to_vector<double>(), got_t = rt.t().contiguous().to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same =
        std::isnan(want[i]) ? std::isnan(got[i]) && std::isnan(got_t[i]) : got[i] == want[i] && got_t[i] == want[i];
    bad += !same;
  }
  CHECK(bad == 0);
  CHECK(!std::signbit(got[7]));
  CHECK(std::signbit(got[2588]));
  const Tensor sliced = cpu::round_to_bfloat16(w.slice(1, 0, 70, 3));  // neither layout: rounded contiguous
  CHECK(sliced.is_contiguous());
  CHECK(sliced.to_vector<double>() == rounded(w.slice(1, 0, 70, 3)));
}

TEST_CASE("matmul_bf16: gradients are the bfloat16 products of the chain rule") {
  if (!cpu_bf16_supported()) return;  // the refusals: the case above
  const Tensor a0 = mat(40, 24, 21), b0 = mat(24, 36, 22), cot = mat(40, 36, 23);
  for (const bool b_transposed : {false, true}) {  // x Wᵀ: B a transposed view (its own backward branch)
    CAPTURE(b_transposed);
    Tensor a = a0.clone().set_requires_grad(true);
    Tensor bleaf = (b_transposed ? b0.t().contiguous() : b0.clone()).set_requires_grad(true);
    const Tensor b = b_transposed ? bleaf.t() : bleaf;
    sum(matmul_bf16(a, b) * cot).backward();
    check_against(a.grad(), reference(cot, b0.t()));                   // dA = dC Bᵀ
    const Tensor db = b_transposed ? bleaf.grad().t() : bleaf.grad();  // dB = Aᵀ dC
    check_against(db.contiguous(), reference(a0.t(), cot));
  }
}

TEST_CASE("matmul_bf16: NaN and infinity propagate as in float32 products") {
  if (!cpu_bf16_supported()) return;
  Tensor a = mat(40, 24, 31), b = mat(24, 36, 32);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  a.data_ptr<float>()[3 * 24 + 5] = nan;  // row 3: NaN
  b.data_ptr<float>()[7 * 36 + 2] = inf;  // column 2: ±inf, and NaN where a row holds 0 at k = 7
  a.data_ptr<float>()[10 * 24 + 7] = 0;
  const Tensor y = matmul_bf16(a, b);
  const float* c = y.data_ptr<float>();
  for (int64_t j = 0; j < 36; ++j) CHECK(std::isnan(c[3 * 36 + j]));
  CHECK(std::isnan(c[10 * 36 + 2]));
  for (int64_t i : {0, 1, 20, 39}) CHECK(std::isinf(c[i * 36 + 2]));
  CHECK(std::isfinite(c[0]));
}

TEST_CASE("matmul_bf16 in deterministic mode: the same bits at every thread count") {
  if (!cpu_bf16_supported()) return;
  const bool was = deterministic_algorithms_enabled();
  use_deterministic_algorithms(true);
  const Tensor a = mat(700, 96, 41), b = mat(96, 130, 42);
  Tensor first;
  for (int threads : {1, 2, 3, 4}) {
    ThreadCount tc(threads);
    const Tensor y = matmul_bf16(a, b);
    if (!first.defined()) first = y;
    CHECK_MESSAGE(same_bits(y, first), threads, " threads");
  }
  use_deterministic_algorithms(was);
}

TEST_CASE("round_to_bfloat16 with column sums: the rounding's bits, and sum(t, {0})'s bits in the same pass") {
  if (!cpu_bf16_supported()) return;
  // one block of rows (small), several (4096 x 384: sum() splits it in 24), NaN and infinity in a column
  for (const auto& [rows, m] : {std::pair<int64_t, int64_t>{1, 2}, {5, 130}, {700, 96}, {4096, 384}, {2048, 128}}) {
    CAPTURE(rows);
    CAPTURE(m);
    Tensor t = mat(rows, m, 81);
    t.data_ptr<float>()[m - 1] = std::numeric_limits<float>::quiet_NaN();
    if (m > 2) t.data_ptr<float>()[1] = std::numeric_limits<float>::infinity();
    for (int threads : {1, 2, 3}) {
      ThreadCount tc(threads);
      Tensor sums;
      const Tensor r = cpu::round_to_bfloat16(t, &sums);
      REQUIRE(sums.defined());
      CHECK(same_bits(sums, sum(t, {0})));
      CHECK(std::memcmp(r.raw_data(), cpu::round_to_bfloat16(t).raw_data(), static_cast<size_t>(rows * m) * 2) == 0);
    }
  }
  // a layout it does not sum in the pass: the sums left undefined, the rounding as without them
  Tensor sums = ones({1});
  const Tensor col = mat(9, 1, 82), tr = mat(6, 40, 83).t();
  cpu::round_to_bfloat16(col, &sums);
  CHECK(!sums.defined());
  sums = ones({1});
  const Tensor rt = cpu::round_to_bfloat16(tr, &sums);
  CHECK(!sums.defined());
  CHECK(rt.stride(0) == 1);  // the transposed view's layout kept
}

TEST_CASE("addmm_bf16: matmul_bf16's products plus the bias, the bits of matmul_bf16 + bias; gradients; edges") {
  if (!cpu_bf16_supported()) {
    check_error([] { addmm_bf16(mat(1, 5, 3).reshape({5}), mat(3, 4, 1), mat(4, 5, 2)); },
                {"addmm_bf16", "bfloat16 products"});
    return;
  }
  // rows across several row blocks and threads; B contiguous and a transposed view (x Wᵀ)
  const Tensor a = mat(700, 96, 61), w = mat(130, 96, 62), bias = mat(1, 130, 63).reshape({130});
  for (const bool b_transposed : {false, true}) {
    CAPTURE(b_transposed);
    const Tensor b = b_transposed ? w.t() : w.t().contiguous();
    CHECK(same_bits(addmm_bf16(bias, a, b), matmul_bf16(a, b) + bias));
    CHECK(same_bits(addmm_bf16(bias, a.t().contiguous().t(), b), matmul_bf16(a, b) + bias));  // A's rows contiguous
  }
  // gradients: the operands' as matmul_bf16's (its products of the rounded operands), the bias's dC summed in float32
  const Tensor cot = mat(700, 130, 64);
  Tensor a1 = a.clone().set_requires_grad(true), w1 = w.clone().set_requires_grad(true),
         b1 = bias.clone().set_requires_grad(true);
  sum(addmm_bf16(b1, a1, w1.t()) * cot).backward();
  Tensor a2 = a.clone().set_requires_grad(true), w2 = w.clone().set_requires_grad(true),
         b2 = bias.clone().set_requires_grad(true);
  sum((matmul_bf16(a2, w2.t()) + b2) * cot).backward();
  CHECK(same_bits(a1.grad(), a2.grad()));
  CHECK(same_bits(w1.grad(), w2.grad()));
  CHECK(same_bits(b1.grad(), sum(cot, {0})));
  // a gradient of several of sum()'s blocks of rows: the bias's gradient still sum()'s bits
  {
    const Tensor x = mat(4096, 64, 65), cot4 = mat(4096, 384, 66), w4 = mat(384, 64, 67);
    Tensor b4 = mat(1, 384, 68).reshape({384}).set_requires_grad(true), w4g = w4.clone().set_requires_grad(true);
    sum(addmm_bf16(b4, x, w4g.t()) * cot4).backward();
    CHECK(same_bits(b4.grad(), sum(cot4, {0})));
  }
  // only the bias trainable: no product in the backward, and its gradient all the same
  Tensor b3 = bias.clone().set_requires_grad(true);
  sum(addmm_bf16(b3, a, w.t()) * cot).backward();
  CHECK(same_bits(b3.grad(), b1.grad()));
  // NaN in an operand: its row NaN; K = 0: the bias alone on every row; no rows: an empty result
  Tensor an = a.clone();
  an.data_ptr<float>()[5 * 96 + 3] = std::numeric_limits<float>::quiet_NaN();
  const Tensor yn = addmm_bf16(bias, an, w.t());
  for (int64_t j = 0; j < 130; ++j) CHECK(std::isnan(yn.data_ptr<float>()[5 * 130 + j]));
  CHECK(std::isfinite(yn.data_ptr<float>()[4 * 130]));
  CHECK(same_bits(addmm_bf16(bias, zeros({3, 0}), zeros({0, 130})), bias.expand({3, 130}).contiguous()));
  CHECK(same_bits(addmm(bias, zeros({3, 0}), zeros({0, 130})), bias.expand({3, 130}).contiguous()));
  CHECK(addmm_bf16(bias, zeros({0, 96}), w.t()).shape() == Shape{0, 130});
  // deterministic mode: the same bits at every thread count
  const bool was = deterministic_algorithms_enabled();
  use_deterministic_algorithms(true);
  Tensor first;
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    const Tensor y = addmm_bf16(bias, a, w.t());
    if (!first.defined()) first = y;
    CHECK_MESSAGE(same_bits(y, first), threads, " threads");
  }
  use_deterministic_algorithms(was);
  // errors: each argument named, as addmm's
  check_error([&] { addmm_bf16(bias, a, mat(95, 130, 1)); }, {"addmm_bf16", "inner", "[700, 96]", "[95, 130]"});
  check_error([&] { addmm_bf16(mat(1, 7, 1).reshape({7}), a, w.t()); }, {"addmm_bf16", "bias", "[7]", "(130)"});
  check_error([&] { addmm_bf16(bias.to(kFloat64), a.to(kFloat64), w.t().to(kFloat64)); }, {"addmm_bf16", "float32"});
  check_error([&] { addmm_bf16(bias, a.unsqueeze(0), w.t()); }, {"addmm_bf16", "2-D"});
}

TEST_CASE("CpuAutocast: linear in bfloat16 products while it lives, on its thread only; float64 untouched") {
  if (!cpu_bf16_supported()) return;
  const Tensor x = mat(30, 20, 51), w = mat(12, 20, 52), bias = mat(1, 12, 53).reshape({12});
  const Tensor f32 = linear(x, w, bias), bf = matmul_bf16(x, w.t()) + bias;
  CHECK(!cpu_autocast_enabled());
  {
    CpuAutocast on;
    CHECK(cpu_autocast_enabled());
    CHECK(same_bits(linear(x, w, bias), bf));
    {
      CpuAutocast off(false);  // nests
      CHECK(same_bits(linear(x, w, bias), f32));
    }
    CHECK(cpu_autocast_enabled());
    bool other = true;
    std::thread([&] { other = cpu_autocast_enabled(); }).join();
    CHECK(!other);  // thread-local, as PyTorch's autocast state
    const Tensor x64 = x.to(kFloat64), w64 = w.to(kFloat64);
    CHECK(same_bits(linear(x64, w64), matmul(x64, w64.t())));             // autocast concerns float32 only
    CHECK(same_bits(matmul(x, w.t()), linear(x, w, Tensor())) == false);  // matmul itself is not autocast
  }
  CHECK(!cpu_autocast_enabled());
  CHECK(same_bits(linear(x, w, bias), f32));
  // a layer's gradients under autocast: its backward products in bfloat16 too, close to float32's
  nn::Linear layer(20, 12);
  Tensor xg = x.clone();
  sum(layer.forward(xg) * mat(30, 12, 54)).backward();
  const Tensor g32 = layer.weight.grad().clone();
  layer.zero_grad();
  {
    CpuAutocast on;
    sum(layer.forward(xg) * mat(30, 12, 54)).backward();
  }
  check_close(layer.weight.grad(), g32, 0.05, 0.02);
  CHECK(!same_bits(layer.weight.grad(), g32));
}

TEST_CASE("matmul_bf16 errors: dtype, device, shapes") {
  if (cpu_bf16_supported()) {
    check_error([] { matmul_bf16(randn64({3, 4}), randn64({4, 5})); }, {"matmul_bf16", "float32"});
    check_error([] { matmul_bf16(mat(3, 4, 1), mat(5, 6, 2)); }, {"matmul_bf16", "inner dimensions"});
    check_error([] { matmul_bf16(mat(3, 4, 1), randn64({4, 5})); }, {"matmul_bf16", "dtype"});
  }
  if (!cuda::is_available()) {
    HostMemoryAsCuda fake;
    const Tensor a = Tensor::empty({3, 4}, {.dtype = kFloat32, .device = Device::cuda()});
    check_error([&] { matmul_bf16(a, a.t()); }, {"matmul_bf16", "CPU"});
  }
}
