// bfloat16 products on the CPU, for CPU autocast (core/autocast.h) and matmul_bf16 (ops/linalg.h): the matmul
// kernel's float32 operands rounded to bfloat16 once per call, then one oneDNN matmul primitive per row block with
// float32 accumulation into the float32 output (AMX tiles where the processor has them, else AVX512-BF16).
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/autocast.h"
#include "core/cpu_isa.h"
#include "core/determinism.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/cpu/bfloat16.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

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

#ifdef ASC_HAVE_DNNL
namespace {

// A (rows, cols) operand rounded to bfloat16: row-major (ld = cols) or, when its rows are what is contiguous in the
// float32 source, column-major (trans, ld = rows), so both the rounding pass and oneDNN read memory in order.
struct Bf16Operand {
  std::vector<uint16_t> data;
  bool trans = false;
  int64_t ld = 0;
};

// A contiguous run rounded to bfloat16. The processors that run these products have AVX512-BF16, whose vcvtne2ps2bf16
// rounds 32 floats to nearest even in one instruction (4-5x the scalar loop): it treats denormal inputs as zero, as
// the products themselves do (vdpbf16ps and AMX's tdpbf16ps read a bfloat16 denormal as zero), and keeps a NaN a
// quiet NaN of the same sign, as bfloat16_bits does.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_run(const float* s, uint16_t* d, int64_t n) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c));  // (high, low)
    _mm512_storeu_si512(reinterpret_cast<void*>(d + c), reinterpret_cast<__m512i>(v));
  }
  for (; c < n; ++c) d[c] = bfloat16_bits(s[c]);
}
#else
void round_run(const float* s, uint16_t* d, int64_t n) {
  for (int64_t c = 0; c < n; ++c) d[c] = bfloat16_bits(s[c]);
}
#endif

Bf16Operand round_operand(const float* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  Bf16Operand o;
  o.data.resize(static_cast<size_t>(rows * cols));
  o.trans = rs == 1 && cs != 1;
  const int64_t outer = o.trans ? cols : rows, inner = o.trans ? rows : cols;
  const int64_t so = o.trans ? cs : rs, si = o.trans ? rs : cs;
  o.ld = inner;
  uint16_t* dst = o.data.data();
  parallel_for(outer, inner, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* s = src + r * so;
      uint16_t* d = dst + r * inner;
      if (si == 1)
        round_run(s, d, inner);
      else
        for (int64_t c = 0; c < inner; ++c) d[c] = bfloat16_bits(s[c * si]);
    }
  });
  return o;
}

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

}  // namespace
#endif

void matmul_bf16_products(const Tensor& a, const Tensor& b, Tensor& out) {
  // a: (Bt, M, K) with any strides (batch stride may be 0); b: (Bt, K, N) likewise; out: contiguous (Bt, M, N),
  // float32.
  ASC_CHECK(a.dtype() == kFloat32 && b.dtype() == kFloat32,
            "matmul with bfloat16 products: float32 operands only, got {} and {}", a.dtype(), b.dtype());
#ifdef ASC_HAVE_DNNL
  check_bf16_supported("matmul with bfloat16 products");
  const int64_t Bt = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  float* C = out.data_ptr<float>();
  for (int64_t i = 0; i < Bt; ++i) {
    // each operand rounded once for all the row blocks below (a broadcast b once for the batch would save more, but
    // the layers' products are 2-D)
    const Bf16Operand A = round_operand(a.data_ptr<float>() + i * a.stride(0), M, K, a.stride(1), a.stride(2));
    const Bf16Operand B = round_operand(b.data_ptr<float>() + i * b.stride(0), K, N, b.stride(1), b.stride(2));
    // Row blocks as the float32 matmul splits them (ops/cpu/matmul.cpp): fixed by M alone in deterministic mode, so the
    // bits do not depend on the thread count.
    const bool fixed = deterministic_algorithms_enabled();
    const int threads = max_threads();
    const int64_t chunks = std::min(M, std::clamp<int64_t>(M / 512, threads, kChunksPerThread * threads));
    const int64_t per = fixed ? std::max<int64_t>(128, (M + 7) / 8) : (M + chunks - 1) / chunks;
    const int64_t nblocks = (M + per - 1) / per;
    float* Ci = C + i * M * N;
    parallel_for(nblocks, per * N * K, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r0 = blk * per, rows = std::min(per, M - r0);
        const uint16_t* Ar = A.data.data() + (A.trans ? r0 : r0 * A.ld);
        gemm_bf16(rows, N, K, Ar, A.trans, A.ld, B.data.data(), B.trans, B.ld, Ci + r0 * N, N);
      }
    });
  }
#else
  (void)out;
  check_bf16_supported("matmul with bfloat16 products");
#endif
}

}  // namespace asc::cpu
