#include "core/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace asc {

namespace {

CpuIsa detect() {
#ifdef ASC_CPU_MULTI_ISA
  // libgcc's probe checks the operating system's support too (XCR0: the AVX-512 registers are saved on a switch)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return CpuIsa::x86_64_v4;
  if (__builtin_cpu_supports("x86-64-v3")) return CpuIsa::x86_64_v3;
#endif
  return CpuIsa::baseline;
}

// The processor's level capped by ASC_CPU_ISA. A name it does not know is reported once on stderr and ignored: the
// kernels run on threads where an exception would end the process, and a cap is a request, not an input.
CpuIsa from_environment() {
  const CpuIsa best = cpu_isa_supported();
  const char* env = std::getenv("ASC_CPU_ISA");
  if (env == nullptr || *env == '\0') return best;
  try {
    const CpuIsa want = parse_cpu_isa(env);
    return want < best ? want : best;
  } catch (const Error& e) {
    std::fprintf(stderr, "ascender: ignoring ASC_CPU_ISA: %s\n", e.what());
    return best;
  }
}

// -1 until the first call resolves it from the processor and the environment
std::atomic<int> g_isa{-1};

}  // namespace

CpuIsa cpu_isa_supported() {
  static const CpuIsa best = detect();
  return best;
}

CpuIsa cpu_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    int unset = -1;
    const int chosen = static_cast<int>(from_environment());
    v = g_isa.compare_exchange_strong(unset, chosen, std::memory_order_relaxed) ? chosen : unset;
  }
  return static_cast<CpuIsa>(v);
}

void set_cpu_isa(CpuIsa isa) {
  const int v = static_cast<int>(isa);
  ASC_CHECK(v >= 0 && v <= static_cast<int>(CpuIsa::x86_64_v4), "set_cpu_isa: no such level ({})", v);
  ASC_CHECK(isa <= cpu_isa_supported(), "set_cpu_isa: this processor does not support {} (its best: {})",
            cpu_isa_name(isa), cpu_isa_name(cpu_isa_supported()));
  g_isa.store(v, std::memory_order_relaxed);
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return "baseline";
    case CpuIsa::x86_64_v3: return "x86-64-v3";
    case CpuIsa::x86_64_v4: return "x86-64-v4";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  if (name == "baseline" || name == "default") return CpuIsa::baseline;
  if (name == "x86-64-v3" || name == "avx2") return CpuIsa::x86_64_v3;
  if (name == "x86-64-v4" || name == "avx512") return CpuIsa::x86_64_v4;
  ASC_THROW("unknown CPU instruction set level '{}' (baseline, x86-64-v3, x86-64-v4; or default, avx2, avx512)", name);
}

}  // namespace asc
