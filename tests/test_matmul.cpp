// matmul: 1-D/2-D/batched/broadcast shapes and transposed operands vs naive loops, gradients, errors; float32
// products through the GEMM library (oneDNN or OpenBLAS) at every operand layout, NaN and inf propagation, products
// interrupted by signals, and the library's kernels not generic on a processor with AVX2.
#include <signal.h>
#include <sys/time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include "testing.h"

#include "ops/cpu/small_gemm.h"  // gemm_narrow, the ascender kernel's helper (last test case)

using namespace asc;
using namespace asc::testing;

namespace {
// Naive (.., M, K) @ (.., K, N) with batch broadcasting, all in double.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b) {
  Shape ba(std::span<const int64_t>(a.shape().data(), a.dim() - 2));
  Shape bb(std::span<const int64_t>(b.shape().data(), b.dim() - 2));
  Shape batch = broadcast_shapes(ba, bb, "naive");
  int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape fa = batch, fb = batch;
  fa.push_back(M), fa.push_back(K), fb.push_back(K), fb.push_back(N);
  auto av = a.expand(fa).contiguous().to_vector<double>(), bv = b.expand(fb).contiguous().to_vector<double>();
  std::vector<double> out;
  for (int64_t t = 0; t < numel_of(batch); ++t)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[(t * M + i) * K + k] * bv[(t * K + k) * N + j];
        out.push_back(s);
      }
  return out;
}
}  // namespace

TEST_CASE("matmul forward vs naive") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {4, 5}},          {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}},
      {{2, 1, 3, 4}, {3, 4, 2}}, {{1, 1}, {1, 1}},       {{64, 33}, {33, 70}}};
  for (auto& [sa, sb] : cases) {
    CAPTURE(sa);
    Tensor a = randn64(sa, false, 1), b = randn64(sb, false, 2);
    check_close(matmul(a, b), naive_matmul(a, b), 1e-10, 1e-10);
    check_close(matmul(a.to(kFloat32), b.to(kFloat32)), naive_matmul(a, b), 1e-4, 1e-4);
  }
  // transposed and sliced operands (BLAS gets them without copies; results must agree)
  Tensor a = randn64({5, 4}, false, 3), b = randn64({6, 5}, false, 4);
  check_close(matmul(a.t(), b.t()), naive_matmul(a.t().contiguous(), b.t().contiguous()), 1e-10, 1e-10);
  Tensor s = randn64({4, 12}, false, 5).slice(1, 0, 12, 2);  // (4, 6), column stride 2
  check_close(matmul(s, b), naive_matmul(s.contiguous(), b), 1e-10, 1e-10);
  // 1-D operands
  Tensor v = randn64({4}, false, 6), m = randn64({4, 3}, false, 7);
  Tensor vm = matmul(v, m);
  CHECK(vm.shape() == Shape{3});
  check_close(vm, naive_matmul(v.unsqueeze(0), m), 1e-10, 1e-10);
  Tensor mv = matmul(m.t(), v);
  CHECK(mv.shape() == Shape{3});
  Tensor dot = matmul(v, v);
  CHECK(dot.dim() == 0);
  CHECK(dot.item<double>() == doctest::Approx(sum(v * v).item<double>()));
  // K = 0 gives zeros
  check_close(matmul(zeros({2, 0}), zeros({0, 3})), {0, 0, 0, 0, 0, 0});
}

TEST_CASE("matmul float32 through the GEMM library: transposed, sliced, large and many-threaded products vs float64") {
  // The float32 path is the library's (oneDNN's sgemm, else OpenBLAS's): every transpose combination, a column-strided
  // operand (our own loop nest), sizes that leave each kernel's edge tiles, and products split across threads.
  for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 37, 5}, {17, 1, 9}, {5, 300, 1}, {33, 65, 47}, {130, 70, 129}, {700, 96, 260}}) {
    CAPTURE(M);
    CAPTURE(K);
    CAPTURE(N);
    Tensor a = randn64({M, K}, false, 11), b = randn64({K, N}, false, 12);
    const std::vector<double> ref = naive_matmul(a, b);
    const double tol = 2e-6 * std::sqrt(static_cast<double>(K)) + 1e-6;
    Tensor af = a.to(kFloat32), bf = b.to(kFloat32);
    check_close(matmul(af, bf), ref, tol, tol);
    check_close(matmul(af.t().contiguous().t(), bf), ref, tol, tol);                       // A transposed in memory
    check_close(matmul(af, bf.t().contiguous().t()), ref, tol, tol);                       // B transposed
    check_close(matmul(af.t().contiguous().t(), bf.t().contiguous().t()), ref, tol, tol);  // both
    Tensor wide = cat({af, af}, 1).slice(1, 0, 2 * K, 2);  // column stride 2: no BLAS operand
    check_close(matmul(wide, bf), naive_matmul(wide.to(kFloat64), b), tol, tol);
  }
  // batched, many products per thread
  Tensor a = randn64({6, 20, 30}, false, 13), b = randn64({6, 30, 10}, false, 14);
  check_close(matmul(a.to(kFloat32), b.to(kFloat32)), naive_matmul(a, b), 1e-5, 1e-5);
}

TEST_CASE("matmul float32: NaN and inf propagate as in IEEE arithmetic (0 * inf is NaN; no skipped zeros)") {
  Tensor a = randn({40, 24}), b = randn({24, 36});
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  a.data_ptr<float>()[3 * 24 + 5] = nan;  // row 3 of the product: NaN
  b.data_ptr<float>()[7 * 36 + 2] = inf;  // column 2: ±inf, and NaN where the row holds a 0 at k = 7
  a.data_ptr<float>()[10 * 24 + 7] = 0;   // row 10, column 2: 0 * inf
  for (const Tensor& y : {matmul(a, b), matmul(a.t().contiguous().t(), b.t().contiguous().t())}) {
    const float* c = y.data_ptr<float>();
    for (int64_t j = 0; j < 36; ++j) CHECK(std::isnan(c[3 * 36 + j]));
    CHECK(std::isnan(c[10 * 36 + 2]));
    for (int64_t i : {0, 1, 20, 39}) CHECK(std::isinf(c[i * 36 + 2]));
    CHECK(std::isfinite(c[0 * 36 + 0]));
  }
}

namespace {
std::atomic<int> g_signals{0};
extern "C" void count_signal(int) { g_signals.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

TEST_CASE("matmul float32: signals delivered while products run leave the results and the heap intact") {
  // oneDNN 2.6's JIT GEMM kernels point the stack pointer into the heap while they run: a signal handler's frame
  // then overwrote heap memory (a training run's weights turned to NaN after its SIGINT; glibc aborted with
  // "free(): invalid next size"). With a 20 kHz timer signal, many small and large products, each checked, and the
  // heap used between them (glibc checks its chunks on free).
  struct sigaction sa {
  }, old_sa{};
  sa.sa_handler = count_signal;
  REQUIRE(sigaction(SIGALRM, &sa, &old_sa) == 0);
  itimerval fast{{0, 50}, {0, 50}}, off{}, old_timer{};
  REQUIRE(setitimer(ITIMER_REAL, &fast, &old_timer) == 0);
  Tensor a = ones({48, 100}), b = ones({100, 48}), big_a = ones({256, 256}), big_b = ones({256, 256});
  int wrong = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(400); ++i) {
    std::vector<float> churn(1000 + i % 500, 1.0f);  // heap traffic between products
    Tensor y = i % 8 == 0 ? matmul(big_a, big_b) : matmul(a, b);
    const float want = i % 8 == 0 ? 256.0f : 100.0f;
    const float* c = y.data_ptr<float>();
    for (int64_t j = 0; j < y.numel(); ++j) wrong += c[j] != want;
  }
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old_sa, nullptr);
  setitimer(ITIMER_REAL, &old_timer, nullptr);
  MESSAGE(g_signals.load(), " signals delivered during the products");
  CHECK(g_signals.load() > 100);
  CHECK(wrong == 0);
}

TEST_CASE("the float32 GEMM kernels in use are not generic on a processor with AVX2 or AVX-512") {
  // Debian's OpenBLAS picks its kernels by the processor's model number and runs its SSE3 "Prescott" kernels on one
  // it does not know (an Intel Xeon of family 6, model 207: a fifth of the machine's speed, nothing reported). By the
  // library's own report (oneDNN's effective ISA, OpenBLAS's core name), not by timing.
  MESSAGE("GEMM float32: ", cpu_gemm_kernel(), "; float64: ", cpu_gemm_kernel_f64(),
          "; processor: ", std::string(cpu_isa_name(cpu_isa_supported())));
#if defined(ASC_HAVE_DNNL) || defined(ASC_HAVE_CBLAS)
  CHECK_MESSAGE(!cpu_gemm_kernel_generic(),
                "the GEMM library runs kernels without AVX2 on a processor that has it: ", cpu_gemm_kernel());
  if (cpu_isa_supported() >= CpuIsa::x86_64_v3) CHECK(cpu_gemm_kernel().find("Prescott") == std::string::npos);
#else
  MESSAGE(
      "built without a GEMM library (ASC_WITH_DNNL=OFF and ASC_WITH_BLAS=OFF): the built-in loop nest, not checked");
#endif
}

TEST_CASE("matmul gradcheck, including broadcast batch and transposed inputs") {
  check_grad([](const TensorList& in) { return TensorList{matmul(in[0], in[1])}; },
             {randn64({3, 4}, true, 1), randn64({4, 2}, true, 2)});
  check_grad([](const TensorList& in) { return TensorList{matmul(in[0], in[1])}; },
             {randn64({2, 3, 4}, true, 3), randn64({4, 2}, true, 4)});
  check_grad([](const TensorList& in) { return TensorList{matmul(in[0].transpose(-1, -2), in[1])}; },
             {randn64({2, 4, 3}, true, 5), randn64({2, 1, 4, 2}, true, 6)});
  check_grad([](const TensorList& in) { return TensorList{matmul(in[0], in[1])}; },
             {randn64({4}, true, 7), randn64({4, 3}, true, 8)});
}

TEST_CASE("matmul errors") {
  check_error([] { matmul(ones({2, 3}), ones({4, 2})); }, {"matmul", "inner dimensions", "[2, 3]", "[4, 2]"});
  check_error([] { matmul(ones({2, 3}), ones({3, 2}, {.dtype = kFloat64})); }, {"matmul", "float32", "float64"});
  check_error([] { matmul(ones({2, 2, 3}), ones({3, 3, 2})); }, {"matmul", "broadcastable"});
  check_error([] { matmul(scalar_tensor(1.0), ones({2})); }, {"matmul", "at least 1 dimension"});
}

// The ascender kernel's small products (ops/cpu/small_gemm.h) against naive loops: C (M, N) = A (M, K) B (K, N), or
// += with accumulate, from strided operands; B is stored as (K, N) rows, or transposed as (N, K) rows (bt). run(A,
// lda, B, ldb, C, ldc) calls the product. The padding of C past N must stay untouched.
namespace {
template <class T, class Run>
void check_small_product(int64_t M, int64_t N, int64_t K, bool accumulate, bool bt, Run run) {
  const int64_t lda = K + 2, ldb = bt ? K + 5 : N + 3, ldc = N + 1;
  std::vector<T> A(M * lda), B((bt ? N : K) * ldb), C(M * ldc, T(-7));
  for (size_t x = 0; x < A.size(); ++x) A[x] = static_cast<T>(std::sin(0.7 * double(x) + 0.3));
  for (size_t x = 0; x < B.size(); ++x) B[x] = static_cast<T>(std::cos(1.3 * double(x)));
  run(A.data(), lda, B.data(), ldb, C.data(), ldc);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      double want = -7;  // the padding past N stays untouched
      if (j < N) {
        want = accumulate ? -7 : 0;
        for (int64_t c = 0; c < K; ++c) want += double(A[i * lda + c]) * double(bt ? B[j * ldb + c] : B[c * ldb + j]);
      }
      INFO("M " << M << " N " << N << " K " << K << " accumulate " << accumulate << " at (" << i << ", " << j << ")");
      CHECK(double(C[i * ldc + j]) == doctest::Approx(want).epsilon(tol).scale(K));
    }
}

// gemm_narrow: every edge of its 4 x 2-vector blocking (rows past a multiple of 4, columns past a multiple of 16
// floats / 8 doubles).
template <class T, asc::CpuIsa kIsa = asc::CpuIsa::baseline>
void check_narrow(int64_t M, int64_t N, int64_t K, bool accumulate) {
  check_small_product<T>(M, N, K, accumulate, false,
                         [&](const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
                           asc::cpu::gemm_narrow<T, kIsa>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
                         });
}

// gemm_dots (B given transposed): two rows of A and half a vector's lanes of columns at a time, at each level's vector
// width — every edge (an odd last row, N past a multiple of half a vector, K past a multiple of a vector and below
// one).
template <class T, asc::CpuIsa kIsa>
void check_dots(int64_t M, int64_t N, int64_t K, bool accumulate) {
  check_small_product<T>(M, N, K, accumulate, true,
                         [&](const T* A, int64_t lda, const T* Bt, int64_t ldbt, T* C, int64_t ldc) {
                           asc::cpu::gemm_dots<T, kIsa>(M, N, K, A, lda, Bt, ldbt, C, ldc, accumulate);
                         });
}
}  // namespace

TEST_CASE("gemm_narrow (CPU kernel helper) vs naive loops, float and double, every blocking edge") {
  // The last M % 4 rows take vector tiles of 1-3 rows; the x86-64-v4 instantiation adds 512-bit tiles (32 floats /
  // 16 doubles; here in whatever instructions this file is compiled for: its blocking is what is checked); 128-bit
  // tiles take 8 floats / 4 doubles below the 256-bit ones (d_z = 8).
  using asc::CpuIsa;
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 9})
    for (int64_t N : {1, 4, 7, 8, 12, 16, 17, 24, 33, 40, 64})
      for (int64_t K : {1, 3, 16})
        for (bool accumulate : {false, true}) {
          check_narrow<float>(M, N, K, accumulate);
          check_narrow<double>(M, N, K, accumulate);
          check_narrow<float, CpuIsa::x86_64_v4>(M, N, K, accumulate);
          check_narrow<double, CpuIsa::x86_64_v4>(M, N, K, accumulate);
        }
}

TEST_CASE("gemm_dots (CPU kernel helper) vs naive loops, float and double, every blocking edge") {
  for (int64_t M : {1, 2, 3, 5, 8})
    for (int64_t N : {1, 3, 4, 8, 9, 16, 17, 32})
      for (int64_t K : {1, 7, 8, 16, 17, 40, 100})
        for (bool accumulate : {false, true}) {
          // each level's vector width (its blocking; here in whatever instructions this file is compiled for)
          check_dots<float, asc::CpuIsa::baseline>(M, N, K, accumulate);
          check_dots<double, asc::CpuIsa::baseline>(M, N, K, accumulate);
          check_dots<float, asc::CpuIsa::x86_64_v3>(M, N, K, accumulate);
          check_dots<double, asc::CpuIsa::x86_64_v3>(M, N, K, accumulate);
          check_dots<float, asc::CpuIsa::x86_64_v4>(M, N, K, accumulate);
          check_dots<double, asc::CpuIsa::x86_64_v4>(M, N, K, accumulate);
        }
}
