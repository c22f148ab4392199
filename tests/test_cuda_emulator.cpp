// The CUDA emulator's own checks (tests/cuda_emu; built only with ASC_CUDA_EMULATION). The kernels here are written in
// CUDA and compiled against the emulator's cuda_runtime.h, as the backend's .cu files are in this build. Each check
// the emulator promises is shown firing on a kernel that breaks the rule, and passing on one that keeps it.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/launch_kernel.cuh"
#include "cuda/mma.cuh"
#include "emu_testing.h"

using asc::cuda::launch_kernel;

using asc::testing::device_alloc;
using asc::testing::to_host;

namespace {

// ---- kernels ------------------------------------------------------------------------------------------------------

// Block sum: a shared-memory tree down to one warp, then xor shuffles. blockDim.x == 256.
__global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
  __shared__ float buf[256];
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  buf[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int w = 128; w >= 32; w /= 2) {
    if (t < w) buf[t] += buf[t + w];
    __syncthreads();
  }
  if (t < 32) {
    float v = buf[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (t == 0) out[blockIdx.x] = v;
  }
}

__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 16) __syncthreads();  // half the block never arrives
  out[threadIdx.x] = 1;
}

// Half a warp waits at the block barrier, the other half at a shuffle that needs the first half: neither completes.
__global__ void barrier_against_shuffle(int* out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void barrier_after_exit(int* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();  // UB in CUDA: the exited threads never reach it
  out[threadIdx.x] = 1;
}

__global__ void shuffle_full_mask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void shuffle_with_exited_lane(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

// A tensor-core product that half the warp skips (mma.sync is warp-collective: undefined in CUDA).
__global__ void mma_half_warp(float* out) {
  if (threadIdx.x >= 16) return;
  asc::cuda::mma::FragA a{};
  asc::cuda::mma::FragB b{};
  asc::cuda::mma::FragC c{};
  asc::cuda::mma::mma<asc::cuda::mma::Kind::BF16>(c, a, b);
  out[threadIdx.x] = c.x[0];
}

// out[t] = s[t + 1]: needs the barrier between the writes and the reads.
template <bool Barrier>
__global__ void read_neighbour(int* out) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = 1000 + t;
  if (Barrier) __syncthreads();
  out[t] = s[(t + 1) % 64];
}

__global__ void write_at(float* p, int64_t i) { p[i] = 1.0f; }

// ---- helpers ------------------------------------------------------------------------------------------------------

// The launch fails with `code`, and the error's description (what ASC_CUDA_CHECK reports) contains `fragment`.
void check_fails(cudaError_t got, cudaError_t code, const char* fragment) {
  CHECK(got == code);
  CHECK(cudaGetLastError() == code);
  const std::string what = cudaGetErrorString(got);
  CHECK_MESSAGE(what.find(fragment) != std::string::npos, what);
}

// Runs fn in a child process with the default SIGSEGV action; true when the child died of SIGSEGV.
template <class F>
bool dies_of_segv(F fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

uint16_t bits_of(__half h) { return h.__x; }
uint16_t bits_of(__nv_bfloat16 h) { return h.__x; }

}  // namespace

TEST_CASE("emulator: barriers and shuffles have CUDA's semantics") {
  const int n = 1000, blocks = 4;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 17);  // small integers: every order sums exactly
  float* x = device_alloc<float>(n);
  float* out = device_alloc<float>(blocks);
  REQUIRE(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  for (bool reverse : {false, true}) {
    asc::cuda::emu::set_reverse_thread_order(reverse);
    REQUIRE(launch_kernel(block_sum, blocks, 256, nullptr, x, out, n) == cudaSuccess);
    const std::vector<float> got = to_host(out, blocks);
    for (int b = 0; b < blocks; ++b) {
      float want = 0;
      for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) want += h[i];
      CHECK(got[b] == want);
    }
  }
  asc::cuda::emu::set_reverse_thread_order(false);
  cudaFree(x);
  cudaFree(out);
}

TEST_CASE("emulator: a barrier or shuffle that not every thread reaches is an error naming block and thread") {
  int* out = device_alloc<int>(64);
  check_fails(launch_kernel(divergent_barrier, 2, 64, nullptr, out), cudaErrorLaunchFailure,
              "__syncthreads() reached by 16 threads while 48 threads of the block have exited");
  check_fails(launch_kernel(barrier_against_shuffle, 1, 32, nullptr, out), cudaErrorLaunchFailure,
              "deadlock: 16 threads wait at __syncthreads(), 16 at warp operations");
  check_fails(launch_kernel(barrier_after_exit, 1, 64, nullptr, out), cudaErrorLaunchFailure, "have exited");
  check_fails(launch_kernel(shuffle_with_exited_lane, 1, 32, nullptr, out), cudaErrorLaunchFailure,
              "lane 5, which has exited");
  check_fails(launch_kernel(shuffle_full_mask, 1, 16, nullptr, out), cudaErrorLaunchFailure,
              "names lane 16, which does not exist");
  check_fails(launch_kernel(mma_half_warp, 1, 32, nullptr, reinterpret_cast<float*>(out)), cudaErrorLaunchFailure,
              "waits for lane 16, which has exited");
  const std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  CHECK(what.find("block (0,0,0)") != std::string::npos);
  cudaFree(out);
}

TEST_CASE("emulator: a missing barrier gives a wrong result in one of the two thread orders") {
  int* out = device_alloc<int>(64);
  auto run = [&](auto kernel, bool reverse) {
    asc::cuda::emu::set_reverse_thread_order(reverse);
    REQUIRE(launch_kernel(kernel, 1, 64, nullptr, out) == cudaSuccess);
    const std::vector<int> got = to_host(out, 64);
    bool right = true;
    for (int t = 0; t < 64; ++t) right = right && got[t] == 1000 + (t + 1) % 64;
    return right;
  };
  CHECK(run(read_neighbour<true>, false));
  CHECK(run(read_neighbour<true>, true));
  const bool both_right = run(read_neighbour<false>, false) && run(read_neighbour<false>, true);
  CHECK_FALSE(both_right);
  asc::cuda::emu::set_reverse_thread_order(false);
  cudaFree(out);
}

TEST_CASE("emulator: launch configurations and kernel pointer arguments are checked before anything runs") {
  float* d = device_alloc<float>(16);
  check_fails(launch_kernel(write_at, 1, 2048, nullptr, d, int64_t{0}), cudaErrorInvalidConfiguration, "blockDim");
  check_fails(launch_kernel(write_at, dim3(1, 70000, 1), 32, nullptr, d, int64_t{0}), cudaErrorInvalidConfiguration,
              "gridDim");
  float host[16];
  check_fails(launch_kernel(write_at, 1, 1, nullptr, host, int64_t{0}), cudaErrorIllegalAddress,
              "is not device memory");
  float* freed = device_alloc<float>(16);
  cudaFree(freed);
  check_fails(launch_kernel(write_at, 1, 1, nullptr, freed, int64_t{0}), cudaErrorIllegalAddress,
              "is not device memory");
  check_fails(cudaFree(host), cudaErrorInvalidDevicePointer, "not a pointer cudaMalloc returned");
  cudaFree(d);
}

TEST_CASE("emulator: copies and memsets are bounds- and direction-checked") {
  float* d = device_alloc<float>(10);
  float h[20] = {};
  check_fails(cudaMemcpy(d, h, 11 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue,
              "runs outside its device allocation");
  check_fails(cudaMemcpy(h, d + 5, 6 * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue,
              "runs outside its device allocation");
  check_fails(cudaMemcpy(h, d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidMemcpyDirection, "contradicts");
  check_fails(cudaMemset(d + 8, 0, 3 * sizeof(float)), cudaErrorInvalidValue, "runs outside");
  check_fails(cudaMemset(h, 0, 4), cudaErrorInvalidValue, "is not device memory");
  CHECK(cudaMemcpy(d, h, 10 * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  // Fresh device memory reads as NaN (0xFF bytes), so a kernel reading what nobody wrote is likely to show it.
  float* fresh = device_alloc<float>(4);
  CHECK(std::isnan(to_host(fresh, 4)[3]));
  cudaFree(fresh);
  cudaFree(d);
}

TEST_CASE("emulator: device memory is used only from its own device; cudaMemcpyPeer copies between devices") {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  REQUIRE_MESSAGE(n >= 2, "test_cuda_emulator runs with ASC_CUDA_EMU_DEVICES=2 (tests/CMakeLists.txt)");
  float* d0 = device_alloc<float>(4);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  float* d1 = device_alloc<float>(4);
  cudaStream_t s1 = nullptr;
  REQUIRE(cudaStreamCreate(&s1) == cudaSuccess);
  const float h[4] = {1, 2, 3, 4};
  CHECK(cudaMemcpy(d1, h, sizeof h, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);

  // What pointers say: device memory (also inside a block) names its device; host memory is unregistered.
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, d1 + 2) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(a.device == 1);
  REQUIRE(cudaPointerGetAttributes(&a, h) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);

  // With device 0 current, device 1's memory and streams are refused (a GPU would order the work wrongly).
  float back[4] = {};
  check_fails(cudaMemcpy(back, d1, sizeof back, cudaMemcpyDeviceToHost), cudaErrorInvalidValue,
              "is memory of device 1, but device 0 is current");
  check_fails(cudaMemcpy(d0, d1, sizeof back, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue, "cudaMemcpyPeer");
  check_fails(cudaMemset(d1, 0, 4), cudaErrorInvalidValue, "is memory of device 1");
  check_fails(cudaMemcpyAsync(d0, h, sizeof h, cudaMemcpyHostToDevice, s1), cudaErrorInvalidResourceHandle,
              "stream of device 1 while device 0 is current");
  check_fails(launch_kernel(write_at, 1, 1, s1, d0, int64_t{0}), cudaErrorInvalidResourceHandle,
              "launch on a stream of device 1 while device 0 is current");
  check_fails(launch_kernel(write_at, 1, 1, nullptr, d1, int64_t{0}), cudaErrorIllegalAddress,
              "memory of device 1, but the kernel runs on device 0");

  // Peer copies name both devices, and each pointer must belong to the device named for it.
  CHECK(cudaMemcpyPeer(d0, 0, d1, 1, sizeof h) == cudaSuccess);
  CHECK(to_host(d0, 4) == std::vector<float>{1, 2, 3, 4});
  check_fails(cudaMemcpyPeer(d0, 1, d1, 1, sizeof h), cudaErrorInvalidValue, "must lie in an allocation of device 1");
  check_fails(cudaMemcpyPeer(d0, 0, d1 + 1, 1, sizeof h), cudaErrorInvalidValue, "cudaMemcpyPeer");

  // A cuBLAS handle serves the device that was current when it was created.
  cublasHandle_t handle = nullptr;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);  // device 0
  CHECK(cublasSetMathMode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetMathMode(handle, static_cast<cublasMath_t>(7)) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  const float one = 1.0f, zero = 0.0f;
  CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, &one, d1, CUDA_R_32F, 2, d1, CUDA_R_32F, 1, &zero, d1,
                     CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cudaStreamDestroy(s1) == cudaSuccess);
  cudaFree(d1);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cublasDestroy(handle);
  cudaFree(d0);
}

TEST_CASE("emulator: device memory faults when host code touches it and behind its end") {
  float* d = device_alloc<float>(100);  // 400 bytes, placed so that byte 512 is the guard page behind it
  CHECK(dies_of_segv([&] { *static_cast<volatile float*>(d) = 1.0f; }));
  CHECK(dies_of_segv([&] { (void)launch_kernel(write_at, 1, 1, nullptr, d, int64_t{128}); }));
  CHECK(!dies_of_segv([&] { (void)launch_kernel(write_at, 1, 1, nullptr, d, int64_t{99}); }));
  const std::string host = asc::cuda::emu::describe_address(d + 3, false);
  CHECK_MESSAGE(host.find("host code dereferenced a device pointer") != std::string::npos, host);
  const std::string past = asc::cuda::emu::describe_address(d + 128, true);
  CHECK_MESSAGE(past.find("a kernel ran past the allocation") != std::string::npos, past);
  CHECK(asc::cuda::emu::describe_address(&host, false).empty());
  cudaFree(d);
}

TEST_CASE("emulator: float16 and bfloat16 conversions round to nearest even, checked over every value") {
  // For each format: every finite value round-trips, and the midpoint between neighbours rounds to the one with an
  // even last bit; just below / above it rounds down / up. Midpoints are exact in float and double.
  auto check_format = [](auto tag, int mant_bits) {
    using H = decltype(tag);
    int bad = 0;
    for (uint32_t b = 0; b < 0x7fffu; ++b) {  // positive values up to the largest finite one and +inf
      H lo;
      lo.__x = static_cast<uint16_t>(b);
      H hi;
      hi.__x = static_cast<uint16_t>(b + 1);
      const double a = static_cast<float>(lo), c = static_cast<float>(hi);
      if (std::isnan(a) || std::isnan(c)) break;
      if (bits_of(H(static_cast<float>(a))) != b || bits_of(H(-a)) != (b | 0x8000u)) ++bad;
      if (std::isinf(c)) {  // the midpoint to "2^(emax+1)" rounds to infinity (ties to even)
        H below;
        below.__x = static_cast<uint16_t>(b - 1);
        const double m = a + (a - static_cast<float>(below)) / 2;
        if (bits_of(H(m)) != b + 1) ++bad;
        break;
      }
      const double m = (a + c) / 2;
      const uint32_t even = (b & 1u) ? b + 1 : b;
      if (bits_of(H(m)) != even || bits_of(H(static_cast<float>(m))) != even) ++bad;
      if (bits_of(H(std::nextafter(m, 0.0))) != b || bits_of(H(std::nextafter(m, 1e300))) != b + 1) ++bad;
    }
    (void)mant_bits;
    return bad;
  };
  CHECK(check_format(__half{}, 10) == 0);
  CHECK(check_format(__nv_bfloat16{}, 7) == 0);
  CHECK(bits_of(__float2half(65504.0f)) == 0x7bffu);
  CHECK(bits_of(__float2half(1.0f / 3.0f)) == 0x3555u);
  CHECK(bits_of(__float2half(std::ldexp(1.0f, -24))) == 0x0001u);            // smallest subnormal
  CHECK(bits_of(__float2half(std::ldexp(1.0f, -25))) == 0x0000u);            // half of it: ties to even (zero)
  CHECK(bits_of(__float2bfloat16(1.0f + std::ldexp(1.0f, -8))) == 0x3f80u);  // tie: stays at the even 1.0
  CHECK(std::isnan(__half2float(__float2half(NAN))));
  CHECK(std::isnan(__bfloat162float(__double2bfloat16(NAN))));
}

TEST_CASE("emulator: cuBLAS GEMM matches a naive loop and checks leading dimensions and operand bounds") {
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 4, k = 3, batch = 2, lda = 7, ldb = 6, ldc = 8;  // padded leading dimensions
  const long long sa = lda * 5LL, sb = ldb * 5LL, sc = ldc * n;
  std::vector<double> A(static_cast<size_t>(sa * batch)), B(static_cast<size_t>(sb * batch)),
      C(static_cast<size_t>(sc * batch), NAN);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.7 * static_cast<double>(i));
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.3 * static_cast<double>(i));
  double* dA = device_alloc<double>(A.size());
  double* dB = device_alloc<double>(B.size());
  double* dC = device_alloc<double>(C.size());
  REQUIRE(cudaMemcpy(dA, A.data(), A.size() * 8, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(dB, B.data(), B.size() * 8, cudaMemcpyHostToDevice) == cudaSuccess);
  const double one = 1.0, zero = 0.0;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      CAPTURE(ta);
      CAPTURE(tb);
      REQUIRE(cudaMemcpy(dC, C.data(), C.size() * 8, cudaMemcpyHostToDevice) == cudaSuccess);  // NaN: beta = 0
      REQUIRE(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &one, dA, CUDA_R_64F, lda, sa, dB, CUDA_R_64F, ldb, sb,
                                         &zero, dC, CUDA_R_64F, ldc, sc, batch, CUBLAS_COMPUTE_64F,
                                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      const std::vector<double> got = to_host(dC, C.size());
      double worst = 0;
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < m; ++i) {
            double want = 0;
            for (int l = 0; l < k; ++l) {
              const double a = ta == CUBLAS_OP_N ? A[b * sa + l * lda + i] : A[b * sa + i * lda + l];
              const double bb = tb == CUBLAS_OP_N ? B[b * sb + j * ldb + l] : B[b * sb + l * ldb + j];
              want += a * bb;
            }
            worst = std::max(worst, std::abs(got[b * sc + j * ldc + i] - want));
          }
      CHECK(worst < 1e-14);
    }
  }
  // cuBLAS's argument rules, and operands that run past their allocation.
  CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_64F, m - 1, sa, dB,
                                   CUDA_R_64F, ldb, sb, &zero, dC, CUDA_R_64F, ldc, sc, batch, CUBLAS_COMPUTE_64F,
                                   CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_64F, lda, 2 * sa, dB,
                                   CUDA_R_64F, ldb, sb, &zero, dC, CUDA_R_64F, ldc, sc, batch, CUBLAS_COMPUTE_64F,
                                   CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_64F, lda, sa, dB, CUDA_R_64F,
                                   ldb, sb, &zero, dC, CUDA_R_64F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
  cublasDestroy(h);
}
