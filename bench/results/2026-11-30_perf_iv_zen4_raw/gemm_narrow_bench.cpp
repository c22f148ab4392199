#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include "ops/cpu/small_gemm.h"
#include "ops/cpu/vec_math.h"
#include "ops/cpu/vec_region_begin.h"
#include "ops/cpu/vec_region_end.h"
using namespace asc;
using namespace asc::cpu;
template <CpuIsa I>
[[gnu::target("arch=x86-64-v4,prefer-vector-width=512")]] __attribute__((noinline)) void run(
    int which, int reps, std::vector<float>& q, std::vector<float>& kt, std::vector<float>& tile, std::vector<float>& v,
    std::vector<float>& o) {
  for (int r = 0; r < reps; ++r) {
    if (which == 0) gemm_narrow_blocked<float, I>(64, 128, 32, q.data(), 128, 1, kt.data(), 144, tile.data(), 128);
    if (which == 1) gemm_narrow_blocked<float, I>(64, 32, 128, tile.data(), 128, 1, v.data(), 128, o.data(), 32);
    if (which == 2) gemm_narrow_blocked<float, I>(128, 32, 64, tile.data(), 1, 144, v.data(), 128, o.data(), 32, true);
  }
}
int main() {
  std::vector<float> q(128 * 128, 0.5f), kt(32 * 144, 0.25f), tile(64 * 144, 0.1f), v(128 * 128, 0.3f), o(128 * 32);
  const char* names[] = {"QK^T 64x128x32", "PV 64x32x128", "P^T dO 128x32x64 acc (A transposed)"};
  for (int w = 0; w < 3; ++w) {
    double best = 1e9;
    for (int t = 0; t < 7; ++t) {
      auto a = std::chrono::steady_clock::now();
      run<CpuIsa::x86_64_v4>(w, 2000, q, kt, tile, v, o);
      auto b = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(b - a).count());
    }
    printf("%-40s %.1f GFLOP/s (1 thread)\n", names[w], 2.0 * 64 * 128 * 32 * 2000 / best / 1e9);
  }
}
