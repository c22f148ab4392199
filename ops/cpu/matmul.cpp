// CPU matmul. float32 products run oneDNN's GEMM when the build has it (it picks its kernels by the processor's
// features), else OpenBLAS's; float64 ones OpenBLAS's; either without them a cache-blocked kernel of our own. The
// operands go with their own leading dimensions and a transpose flag, so transposed views cost no copy.
#include <algorithm>
#include <vector>

#include "core/cpu_isa.h"
#include "core/determinism.h"
#include "core/error.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"
#include "ops/layout.h"

#ifdef ASC_HAVE_CBLAS
#include <cblas.h>
#endif
#ifdef ASC_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "ops/cpu/dnnl_guards.h"
#endif

#include "ops/cpu/vec_region_begin.h"  // add_bias_rows' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // inside the region: ASC_CPU_DISPATCH, ASC_SIMD

namespace asc {

#ifdef ASC_HAVE_DNNL
namespace {
const char* dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
  }
}
}  // namespace
#endif

std::string cpu_gemm_kernel_f64() {
#ifdef ASC_HAVE_CBLAS
  return std::string("OpenBLAS ") + openblas_get_corename();
#else
  return "built-in";
#endif
}

std::string cpu_gemm_kernel() {
#ifdef ASC_HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{} {}", v->major, v->minor, dnnl_isa_name(dnnl_get_effective_cpu_isa()));
#else
  return cpu_gemm_kernel_f64();  // float32 runs where float64 does
#endif
}

bool cpu_gemm_kernel_generic() {
  // The processor's own level, not a cap set by ASC_CPU_ISA or set_cpu_isa: the GEMM libraries ignore it.
  if (cpu_isa_supported() == CpuIsa::baseline) return false;  // nothing better to run
#if defined(ASC_HAVE_DNNL)
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx2) != dnnl_cpu_isa_avx2;  // each level's bits include those of the levels below
#elif defined(ASC_HAVE_CBLAS)
  // OpenBLAS's cores without AVX2 kernels: what it falls back to on a processor it does not know
  const std::string core = openblas_get_corename();
  for (const char* old : {"Prescott",  "Core2",      "Penryn",      "Dunnington", "Nehalem", "Sandybridge", "Atom",
                          "Katmai",    "Coppermine", "Northwood",   "Banias",     "Opteron", "Barcelona",   "Bobcat",
                          "Bulldozer", "Piledriver", "Steamroller", "Excavator",  "Unknown", "generic"})
    if (core == old) return true;
  return false;
#else
  return true;  // the built-in loop nest: vectorised for the x86-64 baseline only
#endif
}

}  // namespace asc

namespace asc::cpu {
namespace {

#ifdef ASC_HAVE_CBLAS
// One thread pool: OpenBLAS runs single-threaded inside our OpenMP threads (set once, at start-up). Its own
// pthreads spin-waiting beside OpenMP's oversubscribed the cores (a third of a training step went to sched_yield
// and spinning).
const bool g_blas_single_threaded = [] {
  openblas_set_num_threads(1);
  return true;
}();
#endif

// Reference blocked kernel: C[M,N] (+)= A[M,K] B[K,N], all with arbitrary strides. Blocks of 64 keep the working
// set in L1/L2; the inner j loop is contiguous in C and B when they are row-major, so it vectorises.
template <class T>
void gemm_fallback(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk,
                   int64_t sbn, T* C, int64_t scm, int64_t scn, bool accumulate) {
  if (!accumulate)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * scm + j * scn] = T(0);
  constexpr int64_t kb = 64;
  for (int64_t k0 = 0; k0 < K; k0 += kb)
    for (int64_t i0 = 0; i0 < M; i0 += kb)
      for (int64_t j0 = 0; j0 < N; j0 += kb) {
        int64_t k1 = std::min(K, k0 + kb), i1 = std::min(M, i0 + kb), j1 = std::min(N, j0 + kb);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t k = k0; k < k1; ++k) {
            const T a = A[i * sam + k * sak];
            T* c = C + i * scm;
            const T* b = B + k * sbk;
            if (scn == 1 && sbn == 1)
              for (int64_t j = j0; j < j1; ++j) c[j] += a * b[j];
            else
              for (int64_t j = j0; j < j1; ++j) c[j * scn] += a * b[j * sbn];
          }
      }
}

// c (rows, n) += b (n) on every row: a product's bias (matmul_bias).
template <class T>
ASC_ALWAYS_INLINE void bias_rows(T* __restrict c, const T* __restrict b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    T* cr = c + r * n;
    ASC_SIMD
    for (int64_t j = 0; j < n; ++j) cr[j] += b[j];
  }
}

}  // namespace

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
          T* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
#if defined(ASC_HAVE_CBLAS) || defined(ASC_HAVE_DNNL)
  const GemmOperand ga = gemm_operand(M, K, sam, sak), gb = gemm_operand(K, N, sbk, sbn);
  if (ga.ok && gb.ok) {
    if (K == 0) {
      if (!accumulate)
        for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
      return;
    }
#ifdef ASC_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      OneOmpThread one;
      AsyncSignalsBlocked no_signals;
      const dnnl_status_t st = dnnl_sgemm(ga.trans ? 'T' : 'N', gb.trans ? 'T' : 'N', M, N, K, 1.0f, A, ga.ld, B, gb.ld,
                                          accumulate ? 1.0f : 0.0f, C, ldc);
      ASC_CHECK(st == dnnl_success, "matmul: oneDNN's GEMM failed (status {}) on M {} N {} K {}", int(st), M, N, K);
      return;
    }
#endif
#ifdef ASC_HAVE_CBLAS
    auto ta = ga.trans ? CblasTrans : CblasNoTrans, tb = gb.trans ? CblasTrans : CblasNoTrans;
    const T beta = accumulate ? T(1) : T(0);
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, ga.ld, B, gb.ld, beta, C, ldc);
    else
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, ga.ld, B, gb.ld, beta, C, ldc);
    return;
#endif
  }
#endif
  gemm_fallback<T>(M, N, K, A, sam, sak, B, sbk, sbn, C, ldc, 1, accumulate);
}
template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                          float*, int64_t, bool);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                           double*, int64_t, bool);

RowBlocks gemm_row_blocks(int64_t M) {
  RowBlocks rb;
  rb.fixed = deterministic_algorithms_enabled();
  if (M <= 0) return rb;  // no rows: no blocks
  const int threads = max_threads();
  const int64_t chunks = std::min(M, std::clamp<int64_t>(M / 512, threads, kChunksPerThread * threads));
  rb.per = rb.fixed ? std::max<int64_t>(128, (M + 7) / 8) : (M + chunks - 1) / chunks;
  rb.count = (M + rb.per - 1) / rb.per;
  return rb;
}

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  // a: (M, K) or (Bt, M, K); b: (K, N) or (Bt, K, N) (batch stride may be 0); out: contiguous (.., M, N).
  if (bf16_products()) {  // matmul_bf16, or linear under CpuAutocast (ops/cpu/gemm_bf16.cpp)
    if (a.dim() == 3) return matmul_bf16_products(a, b, out);
    Tensor o3 = out.unsqueeze(0);
    return matmul_bf16_products(a.unsqueeze(0), b.unsqueeze(0), o3);
  }
  ASC_DISPATCH_FLOAT(a.dtype(), "matmul", [&] {
    const bool batched = a.dim() == 3;
    const int64_t Bt = batched ? a.size(0) : 1;
    const int d = batched ? 1 : 0;
    const int64_t M = a.size(d), K = a.size(d + 1), N = b.size(d + 1);
    const int64_t sab = batched ? a.stride(0) : 0, sbb = batched ? b.stride(0) : 0;
    const scalar_t* A = a.data_ptr<scalar_t>();
    const scalar_t* B = b.data_ptr<scalar_t>();
    scalar_t* C = out.data_ptr<scalar_t>();
    const int64_t work = M * N * std::max<int64_t>(K, 1);
    if (Bt >= 4 || M < 2) {  // many products: one (or a few) whole GEMMs per thread
      parallel_for(Bt, work, [&](int64_t b0, int64_t b1) {
        for (int64_t i = b0; i < b1; ++i)
          gemm<scalar_t>(M, N, K, A + i * sab, a.stride(d), a.stride(d + 1), B + i * sbb, b.stride(d), b.stride(d + 1),
                         C + i * M * N, N);
      });
      return;
    }
    // Few large products: each split over its rows (gemm_row_blocks says how, and why).
    for (int64_t i = 0; i < Bt; ++i)
      for_gemm_row_blocks(M, N * std::max<int64_t>(K, 1), [&](int64_t r0, int64_t r1) {
        gemm<scalar_t>(r1 - r0, N, K, A + i * sab + r0 * a.stride(d), a.stride(d), a.stride(d + 1), B + i * sbb,
                       b.stride(d), b.stride(d + 1), C + i * M * N + r0 * N, N);
      });
  });
}

void add_bias_rows(float* c, const float* bias, int64_t rows, int64_t n) {
  ASC_CPU_DISPATCH(bias_rows(c, bias, rows, n));
}

void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
  if (bf16_products()) {  // addmm_bf16: bfloat16 operands, float32 bias and output
    Tensor o3 = out.unsqueeze(0);
    return matmul_bf16_products(a.unsqueeze(0), b.unsqueeze(0), o3, bias);
  }
  // a: (M, K), b: (K, N), bias: (N) contiguous; out: contiguous (M, N). Each row block's product, then the bias
  // added to its rows while they are still in the thread's cache: a separate add read and wrote the whole output
  // again (a sixth of a q/k/v product's time at the training step's shapes). Not the bias first and the GEMM
  // accumulating onto it (beta = 1): into an output fresh from the allocator, cold in the caches, that made the GEMM
  // read it back from memory, and the product took 10-15 % longer.
  ASC_DISPATCH_FLOAT(a.dtype(), "matmul_bias", [&] {
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    const scalar_t *A = a.data_ptr<scalar_t>(), *B = b.data_ptr<scalar_t>(), *bp = bias.data_ptr<scalar_t>();
    scalar_t* C = out.data_ptr<scalar_t>();
    for_gemm_row_blocks(M, N * std::max<int64_t>(K, 1), [&](int64_t r0, int64_t r1) {
      gemm<scalar_t>(r1 - r0, N, K, A + r0 * a.stride(0), a.stride(0), a.stride(1), B, b.stride(0), b.stride(1),
                     C + r0 * N, N);
      scalar_t* c = C + r0 * N;
      ASC_CPU_DISPATCH(bias_rows(c, bp, r1 - r0, N));
    });
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
