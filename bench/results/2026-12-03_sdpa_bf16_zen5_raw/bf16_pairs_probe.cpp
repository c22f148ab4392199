#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "ops/cpu/scratch.h"
#include "ops/cpu/small_gemm.h"
#include "ops/cpu/vec_region_begin.h"
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#include "ops/cpu/bf16_pairs.h"
using namespace asc::cpu;
namespace {
float bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0)
    u &= 0x80000000u;
  else if ((u & 0x7fffffffu) <= 0x7f800000u)
    u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}
double t_bf16_qk(const float* q, const float* k, int M, int N, int D, float* c, int reps) {
  std::vector<uint32_t> qa(M * ((D + 1) / 2)), kt((D + 1) / 2 * transposed_ld(N)), rows;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    bf16_pairs::pack_a(q, D, M, D, qa.data(), (D + 1) / 2);
    bf16_pairs::pack_bt(k, D, N, D, kt.data(), transposed_ld(N), rows);
    bf16_pairs::gemm_pairs(M, N, D, qa.data(), (D + 1) / 2, 1, kt.data(), transposed_ld(N), c, N);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
}
double t_bf16_pv(const float* p, const float* v, int M, int N, int K, float* c, int reps) {
  std::vector<uint32_t> pa(M * (K + 1) / 2), vb((K + 1) / 2 * N);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    bf16_pairs::pack_a(p, K, M, K, pa.data(), (K + 1) / 2);
    bf16_pairs::pack_b(v, N, K, N, vb.data(), N);
    bf16_pairs::gemm_pairs(M, N, K, pa.data(), (K + 1) / 2, 1, vb.data(), N, c, N);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
}
double t_gemm_only(const float* p, const float* v, int M, int N, int K, float* c, int reps) {
  std::vector<uint32_t> pa(M * (K + 1) / 2), vb((K + 1) / 2 * N);
  bf16_pairs::pack_a(p, K, M, K, pa.data(), (K + 1) / 2);
  bf16_pairs::pack_b(v, N, K, N, vb.data(), N);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) bf16_pairs::gemm_pairs(M, N, K, pa.data(), (K + 1) / 2, 1, vb.data(), N, c, N);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
}
}  // namespace
#pragma GCC pop_options
namespace {
[[gnu::target("arch=x86-64-v4,prefer-vector-width=512")]] double t_fp32(const float* a, const float* b, int M, int N,
                                                                        int K, float* c, int reps, bool bt) {
  std::vector<float> kt(K * transposed_ld(N));
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    if (bt) {
      transpose_rows<float, asc::CpuIsa::x86_64_v4>(b, K, 1, N, K, kt.data(), transposed_ld(N));
      gemm_narrow_blocked<float, asc::CpuIsa::x86_64_v4>(M, N, K, a, K, 1, kt.data(), transposed_ld(N), c, N);
    } else
      gemm_narrow_blocked<float, asc::CpuIsa::x86_64_v4>(M, N, K, a, K, 1, b, N, c, N);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
}
}  // namespace
#include "ops/cpu/vec_region_end.h"
int main() {
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (int odd = 0; odd < 2; ++odd) {
    int M = 64, N = 128 + odd, D = 32 + odd;
    std::vector<float> q(M * D), k(N * D), c(M * N), ref(M * N), p(M * N), v(N * D), o(M * D), oref(M * D);
    for (auto& x : q) x = nd(g);
    for (auto& x : k) x = nd(g);
    for (auto& x : p) x = nd(g);
    for (auto& x : v) x = nd(g);
    t_bf16_qk(q.data(), k.data(), M, N, D, c.data(), 1);
    double err = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += (double)bf(q[i * D + d]) * bf(k[j * D + d]);
        err = std::max(err, std::abs(s - c[i * N + j]));
      }
    t_bf16_pv(p.data(), v.data(), M, D, N, o.data(), 1);
    double err2 = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < D; ++j) {
        double s = 0;
        for (int d = 0; d < N; ++d) s += (double)bf(p[i * N + d]) * bf(v[d * D + j]);
        err2 = std::max(err2, std::abs(s - o[i * D + j]));
      }
    printf("M %d N %d D %d: max err qk %.3g pv %.3g\n", M, N, D, err, err2);
  }
  int M = 64, N = 128, D = 32;
  std::vector<float> q(M * D, 0.5f), k(N * D, 0.25f), c(M * N), p(M * N, 0.1f), v(N * D, 0.3f), o(M * D);
  for (int rep = 0; rep < 3; ++rep) {
    int reps = 20000;
    double a = t_fp32(q.data(), k.data(), M, N, D, c.data(), reps, true),
           b = t_bf16_qk(q.data(), k.data(), M, N, D, c.data(), reps);
    double a2 = t_fp32(p.data(), v.data(), M, D, N, o.data(), reps, false),
           b2 = t_bf16_pv(p.data(), v.data(), M, D, N, o.data(), reps),
           b3 = t_gemm_only(p.data(), v.data(), M, D, N, o.data(), reps);
    double fl = 2.0 * M * N * D;
    printf(
        "QK^T (incl K transpose/pack): fp32 %.2f us (%.0f GF/s)  bf16 %.2f us (%.0f GF/s) | PV: fp32 %.2f (%.0f) "
        "bf16+pack %.2f (%.0f) bf16 gemm only %.2f (%.0f)\n",
        a, fl / a / 1e3, b, fl / b / 1e3, a2, fl / a2 / 1e3, b2, fl / b2 / 1e3, b3, fl / b3 / 1e3);
  }
}
