// matmul (float32) vs matmul_bf16 at the training step's shapes, through the library, best of 7 rounds
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
template <class F>
double best_ms(F f, int inner) {
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    best = std::min(best,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  return best;
}
int main() {
  struct S {
    long M, K, N;
    bool bt;
    const char* what;
  };
  for (S s : {S{2048, 128, 384, true, "qkv x W^T"}, S{2048, 128, 512, true, "ffn1 x W^T"},
              S{2048, 512, 128, true, "ffn2 x W^T"}, S{2048, 512, 128, false, "dX = dY W"},
              S{512, 2048, 128, false, "dW = dY^T X (A transposed view)"}, S{512, 512, 512, false, "512^3"}}) {
    Tensor a = randn({s.M, s.K}), w = s.bt ? randn({s.N, s.K}) : randn({s.K, s.N});
    Tensor at = s.what[1] == 'W' ? randn({s.K, s.M}).t() : a;  // dW: a transposed view
    Tensor A = s.what[1] == 'W' ? at : a;
    Tensor B = s.bt ? w.t() : w;
    const double flop = 2.0 * s.M * s.K * s.N;
    const int inner = std::max(1, int(2e9 / flop));
    double f = best_ms([&] { matmul(A, B); }, inner), h = best_ms([&] { matmul_bf16(A, B); }, inner);
    std::printf("%-34s %5ld x %4ld x %4ld: f32 %7.1f GFLOP/s  bf16 %7.1f GFLOP/s  bf16/f32 time %.2f\n", s.what, s.M,
                s.K, s.N, flop / f * 1e-6, flop / h * 1e-6, h / f);
  }
}
