#pragma once
// The instruction set the CPU kernels run, like PyTorch's ATEN_CPU_CAPABILITY or oneDNN's ONEDNN_MAX_CPU_ISA. The hot
// CPU kernels (ASCender and dense / sparse attention, firing, softmax, LayerNorm, cross-entropy, GELU, dropout) are
// compiled three times — for the x86-64 baseline the library targets (SSE2), for x86-64-v3 (AVX2 + FMA, 256-bit
// vectors) and for x86-64-v4 (AVX-512, 512-bit vectors) — and each call runs the best one the processor has, unless
// capped: by ASC_CPU_ISA=baseline | x86-64-v3 | x86-64-v4 in the environment (read once; also "avx2", "avx512"), or
// by set_cpu_isa. Results agree across levels to rounding (FMA contracts a * b + c into one rounding; wider vectors
// sum in another order), and each level is deterministic on its own. Off x86-64 (or with another compiler than GCC)
// there is one level, baseline.
//
//   asc::set_cpu_isa(asc::CpuIsa::x86_64_v3);           // compare the AVX2 kernels with the AVX-512 ones
//   fmt::print("{}\n", asc::cpu_isa_name(asc::cpu_isa()));  // "x86-64-v3"
#include <string>
#include <string_view>

// Several levels are compiled with GCC on x86-64, except in sanitizer builds: there the kernels are compiled once, for
// the baseline (the same source; it keeps their build time down), and cpu_isa_supported() says baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ASC_SANITIZE_BUILD)
#define ASC_CPU_MULTI_ISA 1
#endif

namespace asc {

enum class CpuIsa : int { baseline = 0, x86_64_v3 = 1, x86_64_v4 = 2 };

CpuIsa cpu_isa();            // the level the kernels run now
CpuIsa cpu_isa_supported();  // the best level this processor (and operating system) supports
// Caps the level at `isa`, process-wide (call it between ops, not while one runs). Throws asc::Error when the
// processor lacks it.
void set_cpu_isa(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);  // "baseline", "x86-64-v3", "x86-64-v4"
// The level a name gives ("baseline" or "default", "x86-64-v3" or "avx2", "x86-64-v4" or "avx512"); throws
// asc::Error for any other name.
CpuIsa parse_cpu_isa(std::string_view name);

// Which kernels the CPU's large float32 GEMMs run, for benchmark headers and reports: "oneDNN 2.6 <isa>" (the
// instruction set oneDNN chose from the processor's features: "avx512_core_bf16", "avx2", ...), else "OpenBLAS
// <core>" (the core OpenBLAS picked by the processor's model number, or the one OPENBLAS_CORETYPE names; on a
// processor it does not know, "Prescott": SSE3 kernels), or "built-in" with neither. These kernels are the library's,
// not ours: their level is theirs, not cpu_isa()'s. cpu_gemm_kernel_f64 names float64's (OpenBLAS or built-in).
std::string cpu_gemm_kernel();
std::string cpu_gemm_kernel_f64();
// True when the float32 GEMM kernels in use run without AVX2 on a processor that has it (OpenBLAS's fallback cores,
// or the built-in loops): every product at a fraction of the machine's speed.
bool cpu_gemm_kernel_generic();

}  // namespace asc
