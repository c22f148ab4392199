// Tensor cores through cuda/mma.cuh (cuda/mma_check.h): products of every operand kind and B layout, and the
// accumulator-to-operand chain of flash attention, against float64 products of the same rounded operands. On the CPU
// emulator (CI) this checks the kernels against the PTX fragment layouts as the emulator implements them; on a GPU
// (tools/gpu_check.sh) it checks the emulator's layouts against the hardware's.
#include "testing.h"

#if defined(ASC_HAVE_CUDA)
#include <cstdint>
#include <cstring>

#include "cuda/mma_check.h"

using namespace asc;
using asc::testing::check_error;
using asc::testing::gpu_or_skip;

namespace {

// Row-major host values of x (any float dtype, on any device) as double.
std::vector<double> host(const Tensor& x) { return x.to(kFloat64).cpu().to_vector<double>(); }

// x as the tensor core's TF32 operand: 10 fraction bits, to nearest with ties away (cvt.rna.tf32.f32).
double tf32(double x) {
  const float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// a (M, K) · B in float64 from the operands as the tensor core reads them, with Σ|a_k B_k| per entry (the scale of
// float32 accumulation error).
struct Ref {
  std::vector<double> c, mag;
};
Ref reference(const Tensor& a, const Tensor& b, bool b_nk) {
  const int64_t M = a.size(0), K = a.size(1), N = b_nk ? b.size(0) : b.size(1);
  std::vector<double> av = host(a), bv = host(b);
  if (a.dtype() == kFloat32)
    for (std::vector<double>* v : {&av, &bv})
      for (double& x : *v) x = tf32(x);
  Ref r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = av[m * K + k] * (b_nk ? bv[n * K + k] : bv[k * N + n]);
        s += p, mag += std::abs(p);
      }
      r.c[m * N + n] = s, r.mag[m * N + n] = mag;
    }
  return r;
}

// Integers in [-3, 3]: exact in every operand kind, and so is every sum of their products; any layout error shows.
Tensor small_ints(const Shape& s, uint64_t seed, DType dt) {
  Generator g(seed);
  std::vector<double> v = rand(s, {.dtype = kFloat64}, &g).to_vector<double>();
  for (double& x : v) x = std::floor(x * 7.0) - 3.0;
  return tensor(v, s).to(dt).to(Device::cuda());
}

const DType kKinds[] = {kFloat32, kBFloat16, kFloat16};

}  // namespace

TEST_CASE("mma_product: small integers come out exact in every operand kind and B layout") {
  if (!gpu_or_skip()) return;
  for (DType dt : kKinds)
    for (bool b_nk : {true, false}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(b_nk);
      const int64_t M = 48, N = 24, K = 48;
      const Tensor a = small_ints({M, K}, 1, dt), b = small_ints(b_nk ? Shape{N, K} : Shape{K, N}, 2, dt);
      const Tensor c = cuda::mma_product(a, b, b_nk);
      CHECK(c.dtype() == kFloat32);
      CHECK(c.device() == a.device());
      CHECK(host(c) == reference(a, b, b_nk).c);
    }
}

TEST_CASE("mma_product: random operands within float32 accumulation of the rounded operands") {
  if (!gpu_or_skip()) return;
  for (DType dt : kKinds) {
    CAPTURE(dtype_name(dt));
    const int64_t M = 32, N = 16, K = 64;
    const Tensor a = testing::randn32({M, K}, 3).to(dt).to(Device::cuda());
    const Tensor b = testing::randn32({N, K}, 4).to(dt).to(Device::cuda());
    const Ref r = reference(a, b, true);
    const std::vector<double> c = host(cuda::mma_product(a, b, true));
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(std::abs(c[i] - r.c[i]) <= 1e-5 * r.mag[i] + 1e-30);
  }
}

TEST_CASE("mma_product: an operand viewed at an odd element offset gives the aligned copy's product") {
  // The fragment loaders read a pair of 16-bit operands in one 4-byte load: the entry point copies a view that does
  // not start on 16 bytes (on a GPU it would be a misaligned address; the emulator would not notice).
  if (!gpu_or_skip()) return;
  for (DType dt : kKinds) {
    CAPTURE(dtype_name(dt));
    const Tensor whole = small_ints({16 * 32 + 1}, 5, dt), b = small_ints({8, 32}, 6, dt);
    const Tensor a = whole.narrow(0, 1, 16 * 32).view({16, 32});  // starts one element in
    CHECK(host(cuda::mma_product(a, b, true)) == reference(a.contiguous(), b, true).c);
  }
}

TEST_CASE("mma_product: NaN in a row of A gives NaN in that row of C only") {
  if (!gpu_or_skip()) return;
  for (DType dt : kKinds) {
    CAPTURE(dtype_name(dt));
    const int64_t M = 16, N = 8, K = 16;
    std::vector<float> av(M * K, 1.0f), bv(N * K, 1.0f);
    av[3 * K + 5] = NAN;
    const Tensor a = tensor(av, {M, K}).to(dt).to(Device::cuda()), b = tensor(bv, {N, K}).to(dt).to(Device::cuda());
    const std::vector<double> c = host(cuda::mma_product(a, b, true));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        CAPTURE(m);
        CHECK(std::isnan(c[m * N + n]) == (m == 3));
        if (m != 3) CHECK(c[m * N + n] == double(K));
      }
  }
}

TEST_CASE("mma_chain: accumulators become the next A operand (flash attention's P v)") {
  if (!gpu_or_skip()) return;
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(dt));
    const int64_t M = 32, N = 32, K = 16, P = 24;
    // Integers: a bᵀ is at most 9·16 = 144 in magnitude, exact in either 16-bit type, so the chain is exact too.
    const Tensor a = small_ints({M, K}, 5, dt), b = small_ints({N, K}, 6, dt), w = small_ints({N, P}, 7, dt);
    const std::vector<double> s = reference(a, b, true).c, wv = host(w), d = host(cuda::mma_chain(a, b, w));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t p = 0; p < P; ++p) {
        double want = 0;
        for (int64_t n = 0; n < N; ++n) want += s[m * N + n] * wv[n * P + p];
        REQUIRE(d[m * P + p] == want);
      }
  }
}

TEST_CASE("mma_product, mma_chain: bad operands are asc::Error") {
  if (!gpu_or_skip()) return;
  const Tensor a = small_ints({16, 16}, 1, kBFloat16), b = small_ints({8, 16}, 2, kBFloat16);
  check_error([&] { cuda::mma_product(a.cpu(), b.cpu(), true); }, {"mma_product", "CUDA tensor"});
  check_error([&] { cuda::mma_product(a.to(kFloat64), b.to(kFloat64), true); }, {"mma_product", "float64"});
  check_error([&] { cuda::mma_product(a, b.to(kFloat16), true); }, {"mma_product", "differ"});
  check_error([&] { cuda::mma_product(a, b, false); }, {"do not chain"});
  check_error([&] { cuda::mma_product(a.narrow(0, 0, 8), b, true); }, {"multiples of 16, 8, 16"});
  check_error([&] { cuda::mma_chain(a.to(kFloat32), a.to(kFloat32), a.to(kFloat32)); }, {"bfloat16 or float16"});
  check_error([&] { cuda::mma_chain(a, b, b); }, {"multiples of 16"});
}

#else
TEST_CASE("mma: no CUDA backend in this build") { MESSAGE("built without CUDA: the tensor-core checks do not apply"); }
#endif
