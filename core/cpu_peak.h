#pragma once
// The CPU's peak arithmetic rate, for rooflines and MFU: what the processor can do, not what a GEMM library reached.
// Each of the kernels' threads measures, at the same time as the others:
//   - its clock: a chain of dependent integer adds, one cycle each on every x86-64 core;
//   - its FMA units: how many independent vector FMAs it retires per cycle at the widest instruction set it has
//     (AVX-512: 16 float32 lanes, AVX2 + FMA: 8; the baseline has no FMA: SSE's 4 lanes, a multiply and an add);
//   - with AVX512-BF16, the same for vdpbf16ps (2 bfloat16 products per float32 lane), to the nearest half;
//   - with AMX-BF16 (where the kernel lets the process use the tiles), how many tdpbf16ps (a 16 × 16 × 32 tile product,
//     16384 FLOPs) it retires per second: the bfloat16 peak is then that loop's rate, not a clock times a width, since
//     the processor lowers its clock while AMX works (the loop reaches ~19 cycles of the add chain's clock per tile
//     product where Intel's figure is 16).
// The peak is then threads × clock × lanes × units × 2 (an FMA is two FLOPs). Measured once per thread count
// (about 40 ms). A core that another process keeps busy measures low: compare with `fma_rate_fp32`, the rate the
// FMA loop itself reached.
//
//   const asc::CpuPeak& p = asc::cpu_peak();
//   fmt::print("{}\n", p.describe());   // "fp32 peak 369 GFLOP/s = 2 threads × 2.88 GHz × 16 lanes × 2 FMA units × 2"
//   double mfu = flops_per_s / p.fp32_flops;
#include <string>

namespace asc {

struct CpuPeak {
  int threads = 1;           // the kernels' threads (asc's thread count when measured)
  double clock_hz = 0;       // mean over the threads
  const char* isa = "sse2";  // the vector instructions the peak is for: "avx512", "avx2", "sse2"
  int fp32_lanes = 4;        // float32 lanes of one vector FMA (the baseline: of one multiply and one add)
  int fma_units = 1;         // vector FMAs (baseline: multiply-add pairs) a core retires per cycle, rounded
  double fma_per_cycle = 0;  // the same, as measured
  bool bf16 = false;         // AVX512-BF16 present
  double bf16_units = 0;     // vdpbf16ps per cycle, to the nearest half (0 without AVX512-BF16, and with AMX)
  bool amx = false;          // AMX-BF16 present and usable
  double amx_cycles = 0;     // cycles (of `clock_hz`) per tdpbf16ps, as measured on every thread at once (0: no AMX)
  double fp32_flops = 0;     // threads × clock × lanes × units × 2
  // With AMX: the tdpbf16ps loop's rate on all threads at once × 16384. Else with AVX512-BF16: threads × clock × 2 ×
  // lanes × bf16_units × 2 (which may be below fp32's: Emerald Rapids issues one vdpbf16ps every other cycle). Else
  // fp32_flops.
  double bf16_flops = 0;
  double fma_rate_fp32 = 0;  // FLOP/s the FMA loop reached on all threads at once (≤ fp32_flops)
  std::string describe() const;
};

// The peak for the current thread count (OMP_NUM_THREADS, omp_set_num_threads), measured on its first call for that
// count and kept.
const CpuPeak& cpu_peak();

}  // namespace asc
