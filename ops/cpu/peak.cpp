// asc::cpu_peak (core/cpu_peak.h): the clock and the vector FMA units, measured on every kernel thread at once.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu_peak.h"
#include "core/format.h"
#include "ops/cpu/loops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ASC_PEAK_X86 1
#endif
#if defined(ASC_PEAK_X86) && defined(__linux__) && !defined(__clang__)
#include <sys/syscall.h>
#include <unistd.h>
#define ASC_PEAK_AMX 1
#endif

namespace asc {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Cycles per second: blocks of 32 dependent register adds (one cycle each; the loop's own counter runs beside them).
// Register, not immediate: newer Intel cores fold `add reg, imm` chains at rename, several a cycle.
double measure_clock() {
#ifdef ASC_PEAK_X86
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    uint64_t x = 0, one = 1;
    constexpr int64_t iters = 1 << 16;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i)
      asm volatile(
          ".rept 32\n\t"
          "add %1, %0\n\t"
          ".endr"
          : "+r"(x)
          : "r"(one));
    best = std::max(best, 32.0 * iters / seconds_since(t0));
  }
  return best;
#else
  return 0;
#endif
}

#ifdef ASC_PEAK_X86
// Vector FMAs (or, without FMA, multiply + add pairs) per second. The loop is assembly, so that no compiler can merge,
// reorder or drop its steps (at -O3 GCC merged the chains of an intrinsics version: a "4 FMA units" peak, twice the
// processor's): independent accumulators, more than the units' latency × count (4-5 cycles × 2 units) needs to keep
// them busy, zeroed first (0 · 0 + 0: no denormal or NaN operand slows a step), `steps` per loop iteration.
template <class Loop>
double vector_rate(int steps, Loop loop) {
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const int64_t iters = 1 << 14;
    const auto t0 = Clock::now();
    loop(iters);
    best = std::max(best, static_cast<double>(steps) * iters / seconds_since(t0));
  }
  return best;
}

#define ASC_CLOBBER_XMM0_15                                                                                           \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
      "xmm14", "xmm15"
// 16 independent chains `insn zmm16, zmm17, zmmN` (N = 0..15), `n` times, with zmm0-17 zeroed first.
#define ASC_ZMM_CHAINS(insn)                                   \
  asm volatile(                                                \
      ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17\n\t" \
      "vpxord %%zmm\\r, %%zmm\\r, %%zmm\\r\n\t"                \
      ".endr\n\t"                                              \
      "1:\n\t"                                                 \
      ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t" insn  \
      " %%zmm16, %%zmm17, %%zmm\\r\n\t"                        \
      ".endr\n\t"                                              \
      "dec %0\n\t"                                             \
      "jnz 1b"                                                 \
      : "+r"(n)                                                \
      :                                                        \
      : ASC_CLOBBER_XMM0_15, "xmm16", "xmm17", "cc")

__attribute__((target("avx512f"))) double rate_avx512() {
  return vector_rate(
      16, [](int64_t n) __attribute__((target("avx512f"))) { ASC_ZMM_CHAINS("vfmadd231ps"); });
}
__attribute__((target("avx512f,avx512bf16"))) double rate_bf16() {  // vdpbf16ps: 32 bfloat16 products per step
  return vector_rate(
      16, [](int64_t n) __attribute__((target("avx512f,avx512bf16"))) { ASC_ZMM_CHAINS("vdpbf16ps"); });
}
#undef ASC_ZMM_CHAINS

#ifdef ASC_PEAK_AMX
// AMX's tile data is state the kernel lets a process use only when asked (Linux 5.16+: arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA; oneDNN asks too): without it a tile instruction faults. Asked once per process.
bool amx_usable() {
  static const bool ok = [] {
    if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("amx-tile")) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
struct alignas(64) TileConfig {  // ldtilecfg's 64-byte layout, palette 1
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// tdpbf16ps per second: 4 independent 16 × 16 float32 accumulators (tmm0-3) from 2 × 2 zeroed bfloat16 operand tiles
// of 16 × 32 (tmm4-7), as a GEMM's 2 × 2 register block; the tiles released after.
__attribute__((target("amx-tile,amx-bf16"))) double rate_amx() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  const double rate = vector_rate(
      4, [](int64_t n) __attribute__((target("amx-tile,amx-bf16"))) {
        asm volatile(
            ".irp r,0,1,2,3,4,5,6,7\n\t"
            "tilezero %%tmm\\r\n\t"
            ".endr\n\t"
            "1:\n\t"
            "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
            "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
            "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
            "tdpbf16ps %%tmm7, %%tmm5, %%tmm3\n\t"
            "dec %0\n\t"
            "jnz 1b"
            : "+r"(n)
            :
            : "cc");
      });
  _tile_release();
  return rate;
}
#endif
__attribute__((target("avx2,fma"))) double rate_avx2() {  // 14 accumulators in ymm0-13, operands in ymm14, 15
  return vector_rate(
      14, [](int64_t n) __attribute__((target("avx2,fma"))) {
        asm volatile(
            "vzeroall\n\t"  // ymm0-15 = 0
            "1:\n\t"
            ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13\n\t"
            "vfmadd231ps %%ymm14, %%ymm15, %%ymm\\r\n\t"
            ".endr\n\t"
            "dec %0\n\t"
            "jnz 1b\n\t"
            "vzeroupper"
            : "+r"(n)
            :
            : ASC_CLOBBER_XMM0_15, "cc");
      });
}
double rate_sse() {  // without FMA: a multiply and an add per step, the pair counted as one 4-lane "FMA"
  return vector_rate(7, [](int64_t n) {
    asm volatile(
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
        "xorps %%xmm\\r, %%xmm\\r\n\t"
        ".endr\n\t"
        "1:\n\t"
        ".irp r,0,1,2,3,4,5,6\n\t"  // 7 multiply chains in xmm0-6
        "mulps %%xmm14, %%xmm\\r\n\t"
        ".endr\n\t"
        ".irp r,7,8,9,10,11,12,13\n\t"  // 7 add chains in xmm7-13
        "addps %%xmm15, %%xmm\\r\n\t"
        ".endr\n\t"
        "dec %0\n\t"
        "jnz 1b"
        : "+r"(n)
        :
        : ASC_CLOBBER_XMM0_15, "cc");
  });
}
#undef ASC_CLOBBER_XMM0_15
#endif

struct ThreadMeasure {
  double clock = 0, fma = 0, bf16 = 0, amx = 0;
};

CpuPeak measure(int threads) {
  CpuPeak p;
  p.threads = threads;
#ifdef ASC_PEAK_X86
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  p.bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  p.isa = avx512 ? "avx512" : avx2 ? "avx2" : "sse2";
  p.fp32_lanes = avx512 ? 16 : avx2 ? 8 : 4;
#ifdef ASC_PEAK_AMX
  p.amx = amx_usable();
#endif
  // Every thread measures at the same time: a core's clock falls when the others work too.
  std::vector<ThreadMeasure> m(static_cast<size_t>(threads));
  std::barrier sync(threads);
  auto run = [&](size_t t) {
    m[t].clock = measure_clock();
    m[t].fma = avx512 ? rate_avx512() : avx2 ? rate_avx2() : rate_sse();
    if (p.bf16) m[t].bf16 = rate_bf16();
#ifdef ASC_PEAK_AMX
    if (p.amx) {
      sync.arrive_and_wait();  // all at once: cores that share an AMX unit (SMT siblings) must not take turns
      m[t].amx = rate_amx();
    }
#endif
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < m.size(); ++t) pool.emplace_back(run, t);
  run(0);
  for (auto& th : pool) th.join();
  double clock = 0, fma = 0, per_cycle = 0, bf16_per_cycle = 0, amx = 0;
  for (const ThreadMeasure& r : m) {
    clock += r.clock / threads;
    fma += r.fma;
    per_cycle += r.fma / r.clock / threads;
    if (p.bf16) bf16_per_cycle += r.bf16 / r.clock / threads;
    amx += r.amx;
  }
  p.clock_hz = clock;
  p.fma_per_cycle = per_cycle;
  // The fewest whole units that the measured rate fits within 10 %: the clock and the FMA rate are measured one after
  // the other, and on a loaded machine the rate can fall between two counts (1.3 per cycle on a 2-unit Xeon whose
  // neighbours were busy): rounding to the nearest would call it 1 unit and a peak the loop itself beats.
  p.fma_units = std::max(1, static_cast<int>(std::ceil(per_cycle / 1.1)));
  p.fp32_flops = threads * clock * p.fp32_lanes * p.fma_units * 2;
  p.fma_rate_fp32 = fma * p.fp32_lanes * 2;
  if (p.amx && amx > 0) {
    p.amx_cycles = threads * clock / amx;
    p.bf16_flops = amx * 16384;  // a 16 × 16 × 32 tile product: 8192 FMAs
  } else if (p.bf16) {
    p.amx = false;
    p.bf16_units = std::max(0.5, std::round(2 * bf16_per_cycle) / 2);
    p.bf16_flops = threads * clock * 2 * p.fp32_lanes * p.bf16_units * 2;
  } else {
    p.bf16_flops = p.fp32_flops;
  }
#endif
  return p;
}

}  // namespace

std::string CpuPeak::describe() const {
  if (clock_hz <= 0) return "fp32 peak unknown (not an x86-64 processor)";
  std::string s = fmt::format("fp32 peak {:.0f} GFLOP/s = {} threads × {:.2f} GHz × {} lanes ({}) × {} FMA units × 2",
                              fp32_flops * 1e-9, threads, clock_hz * 1e-9, fp32_lanes, isa, fma_units);
  if (amx)
    s += fmt::format("; bf16 {:.0f} GFLOP/s (AMX: a 16 × 16 × 32 tile product every {:.1f} cycles on each thread)",
                     bf16_flops * 1e-9, amx_cycles);
  else if (bf16)
    s += fmt::format("; bf16 {:.0f} GFLOP/s (AVX512-BF16: {:g} vdpbf16ps per cycle)", bf16_flops * 1e-9, bf16_units);
  return s + fmt::format("; the FMA loop reached {:.0f}", fma_rate_fp32 * 1e-9);
}

const CpuPeak& cpu_peak() {
  static std::mutex mu;
  static std::map<int, CpuPeak> measured;
  const int threads = std::max(1, cpu::max_threads());
  std::lock_guard<std::mutex> lock(mu);
  auto it = measured.find(threads);
  if (it == measured.end()) it = measured.emplace(threads, measure(threads)).first;
  return it->second;
}

}  // namespace asc
