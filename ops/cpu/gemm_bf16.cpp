// bfloat16 products on the CPU, for CPU autocast (core/autocast.h) and matmul_bf16 (ops/linalg.h): the op rounds its
// float32 operands to bfloat16 (round_to_bfloat16) and keeps the rounded copies for its backward; the matmul kernel
// then runs one oneDNN matmul primitive per row block on them, with float32 accumulation into the float32 output
// (AMX tiles where the processor has them, else AVX512-BF16).
#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/autocast.h"
#include "core/cpu_isa.h"
#include "core/determinism.h"
#include "core/error.h"
#include "core/format.h"
#include "core/profiler.h"
#include "ops/cpu/bfloat16.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/sum_blocks.h"
#include "ops/kernels.h"
#include "ops/layout.h"

#ifdef ASC_HAVE_DNNL
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "ops/cpu/dnnl_guards.h"
#endif

namespace asc {

namespace {
thread_local bool t_autocast = false;
}  // namespace

bool cpu_bf16_supported() {
#ifdef ASC_HAVE_DNNL
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();  // each level's bits include those of the levels below
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#else
  return false;
#endif
}

bool cpu_bf16_amx() {
#ifdef ASC_HAVE_DNNL
  return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
#else
  return false;
#endif
}

namespace {
void check_bf16_supported(const char* who) {
#ifdef ASC_HAVE_DNNL
  ASC_CHECK(cpu_bf16_supported(),
            "{}: this processor has no bfloat16 products (AVX512-BF16 or AMX-BF16; oneDNN runs '{}' kernels here)", who,
            cpu_gemm_kernel());
#else
  ASC_CHECK(false, "{}: bfloat16 products on the CPU need oneDNN, and this build has none (ASC_WITH_DNNL)", who);
#endif
}
}  // namespace

CpuAutocast::CpuAutocast(bool enabled) : prev_(t_autocast) {
  if (enabled) check_bf16_supported("CpuAutocast");
  t_autocast = enabled;
}
CpuAutocast::~CpuAutocast() { t_autocast = prev_; }
bool cpu_autocast_enabled() { return t_autocast; }

}  // namespace asc

namespace asc::cpu {

namespace {
thread_local bool t_bf16_products = false;
}  // namespace

Bf16ProductsScope::Bf16ProductsScope() : prev_(t_bf16_products) { t_bf16_products = true; }
Bf16ProductsScope::~Bf16ProductsScope() { t_bf16_products = prev_; }
bool bf16_products() { return t_bf16_products; }

namespace {

// A contiguous run rounded to bfloat16. The processors that run these products have AVX512-BF16, whose vcvtne2ps2bf16
// rounds 32 floats to nearest even in one instruction (4-5x the scalar loop): it treats denormal inputs as zero, as
// the products themselves do (vdpbf16ps and AMX's tdpbf16ps read a bfloat16 denormal as zero), and keeps a NaN a
// quiet NaN of the same sign, as bfloat16_bits does.
// The same rounding one float at a time (the runs' tails, builds without the instruction): a denormal to a zero of
// its sign, as the instruction does, so that every position of a tensor rounds alike.
uint16_t bfloat16_bits_daz(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x7f800000u) == 0 ? static_cast<uint16_t>((u >> 16) & 0x8000u) : bfloat16_bits(f);
}
#if defined(ASC_HAVE_DNNL) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_run(const float* s, uint16_t* d, int64_t n) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c));  // (high, low)
    _mm512_storeu_si512(reinterpret_cast<void*>(d + c), reinterpret_cast<__m512i>(v));
  }
  for (; c < n; ++c) d[c] = bfloat16_bits_daz(s[c]);
}
#else
void round_run(const float* s, uint16_t* d, int64_t n) {
  for (int64_t c = 0; c < n; ++c) d[c] = bfloat16_bits_daz(s[c]);
}
#endif

// t (rows, m) contiguous, m > 1, rounded row by row, with sums = its float32 values summed over the rows by sum()'s
// blocks (column_sums_by_blocks: each row added into its block's float64 sums as it is rounded), so the sums have
// sum(t, {0})'s bits.
Tensor round_rows_with_sums(const Tensor& t, Tensor& sums) {
  profiler::KernelScope scope("round_to_bfloat16", "round_bf16_sums");
  const int64_t rows = t.size(0), m = t.size(1);
  Tensor out = Tensor::empty(t.shape(), {.dtype = kBFloat16});
  const float* src = t.data_ptr<float>();
  uint16_t* dst = static_cast<uint16_t*>(out.raw_data());
  const std::vector<double> part = column_sums_by_blocks<double>(rows, m, [&](double* acc, int64_t r) {
    round_run(src + r * m, dst + r * m, m);
    for (int64_t c = 0; c < m; ++c) acc[c] += src[r * m + c];
  });
  sums = Tensor::empty({m});
  float* sp = sums.data_ptr<float>();
  for (int64_t c = 0; c < m; ++c) sp[c] = static_cast<float>(part[static_cast<size_t>(c)]);
  return out;
}

}  // namespace

Tensor round_to_bfloat16(const Tensor& t, Tensor* column_sums) {
  ASC_CHECK(t.device().is_cpu() && t.dtype() == kFloat32, "round_to_bfloat16: a float32 CPU tensor, got {} on {}",
            t.dtype(), t.device());
  check_bf16_supported("round_to_bfloat16");
  if (column_sums) {
    *column_sums = Tensor();
    if (t.dim() == 2 && t.is_contiguous() && t.size(1) > 1 && t.size(0) > 0)
      return round_rows_with_sums(t, *column_sums);
  }
  if (!t.is_contiguous()) {
    // a transposed view of a contiguous tensor (W.t() in x Wᵀ, gᵀ in a weight gradient) keeps its layout: the
    // rounding reads memory in order, and the product gets the same strides
    if (t.dim() >= 2 && t.transpose(-1, -2).is_contiguous())
      return round_to_bfloat16(t.transpose(-1, -2)).transpose(-1, -2);
    return round_to_bfloat16(t.contiguous());
  }
  profiler::KernelScope scope("round_to_bfloat16", "round_bf16");  // the profile's share of the bfloat16 overhead
  Tensor out = Tensor::empty(t.shape(), {.dtype = kBFloat16});
  const float* src = t.data_ptr<float>();
  uint16_t* dst = static_cast<uint16_t*>(out.raw_data());
  constexpr int64_t kRun = 4096;  // elements per piece of work
  parallel_for((t.numel() + kRun - 1) / kRun, kRun, [&](int64_t b, int64_t e) {
    const int64_t lo = b * kRun, hi = std::min(t.numel(), e * kRun);
    round_run(src + lo, dst + lo, hi - lo);
  });
  return out;
}

#ifdef ASC_HAVE_DNNL
namespace {

// One matmul primitive per shape and layout, kept by the thread that made it (a primitive runs on one thread at a time
// here, and making one costs far more than running a small one).
struct PrimitiveKey {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  bool operator==(const PrimitiveKey&) const = default;
};
struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& k) const {
    size_t h = 0;
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t(k.ta) * 2 + int64_t(k.tb)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

struct ThreadDnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<PrimitiveKey, dnnl::matmul, PrimitiveKeyHash> primitives;
};

dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, bool trans, int64_t ld, dnnl::memory::data_type dt) {
  return dnnl::memory::desc({rows, cols}, dt, trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

// C (M, N; rows ldc apart) = A (M, K) · B (K, N), both bfloat16, on the calling thread.
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, bool ta, int64_t lda, const uint16_t* B, bool tb,
               int64_t ldb, float* C, int64_t ldc) {
  thread_local ThreadDnnl t;
  using dt = dnnl::memory::data_type;
  const auto a_md = matrix_desc(M, K, ta, lda, dt::bf16), b_md = matrix_desc(K, N, tb, ldb, dt::bf16),
             c_md = matrix_desc(M, N, false, ldc, dt::f32);
  const PrimitiveKey key{M, N, K, lda, ldb, ldc, ta, tb};
  auto it = t.primitives.find(key);
  if (it == t.primitives.end()) {
    if (t.primitives.size() >= 256) t.primitives.clear();  // shapes that keep changing: start over
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(t.engine, a_md, b_md, c_md);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), t.engine);
#endif
    it = t.primitives.emplace(key, dnnl::matmul(pd)).first;
  }
  OneOmpThread one;
  AsyncSignalsBlocked no_signals;
  dnnl::memory a(a_md, t.engine, const_cast<uint16_t*>(A)), b(b_md, t.engine, const_cast<uint16_t*>(B)),
      c(c_md, t.engine, C);
  it->second.execute(t.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  t.stream.wait();
}

// A bfloat16 (rows, cols) matrix as oneDNN reads it: in place when its rows or its columns are contiguous (what
// round_to_bfloat16 makes), else copied row-major.
struct Bf16Matrix {
  std::unique_ptr<uint16_t[]> copy;
  const uint16_t* p = nullptr;
  bool trans = false;
  int64_t ld = 0;
};
Bf16Matrix bf16_matrix(const uint16_t* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const GemmOperand g = gemm_operand(rows, cols, rs, cs);
  if (g.ok) return {nullptr, p, g.trans, g.ld};
  Bf16Matrix m{std::unique_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(rows * cols)]), nullptr, false, cols};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m.copy[static_cast<size_t>(r * cols + c)] = p[r * rs + c * cs];
  m.p = m.copy.get();
  return m;
}

}  // namespace
#endif

void matmul_bf16_products(const Tensor& a, const Tensor& b, Tensor& out, const Tensor& bias) {
  // a: (Bt, M, K), b: (Bt, K, N), bfloat16 (the op rounds them: round_to_bfloat16), any strides, a batch stride may
  // be 0; out: contiguous float32 (Bt, M, N); bias: undefined or contiguous float32 (N).
  ASC_CHECK(a.dtype() == kBFloat16 && b.dtype() == kBFloat16 && out.dtype() == kFloat32,
            "matmul with bfloat16 products: bfloat16 operands and a float32 output, got {}, {} and {}", a.dtype(),
            b.dtype(), out.dtype());
#ifdef ASC_HAVE_DNNL
  check_bf16_supported("matmul with bfloat16 products");
  const int64_t Bt = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const uint16_t* pa = static_cast<const uint16_t*>(a.raw_data());
  const uint16_t* pb = static_cast<const uint16_t*>(b.raw_data());
  float* C = out.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  // Row blocks as the float32 matmul splits them: fixed by M alone in deterministic mode, so the bits do not depend
  // on the thread count.
  for (int64_t i = 0; i < Bt; ++i) {
    const Bf16Matrix A = bf16_matrix(pa + i * a.stride(0), M, K, a.stride(1), a.stride(2));
    const Bf16Matrix B = bf16_matrix(pb + i * b.stride(0), K, N, b.stride(1), b.stride(2));
    float* Ci = C + i * M * N;
    for_gemm_row_blocks(M, N * std::max<int64_t>(K, 1), [&](int64_t r0, int64_t r1) {
      gemm_bf16(r1 - r0, N, K, A.p + (A.trans ? r0 : r0 * A.ld), A.trans, A.ld, B.p, B.trans, B.ld, Ci + r0 * N, N);
      if (bp) add_bias_rows(Ci + r0 * N, bp, r1 - r0, N);  // the product's rows, still in this thread's cache
    });
  }
#else
  (void)out;
  (void)bias;
  check_bf16_supported("matmul with bfloat16 products");
#endif
}

}  // namespace asc::cpu
