// sum over dim 0 of a (2048, 512) float32 tensor (a bias's gradient) and the full sum, 1000 calls, 3 rounds.
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
int main() {
  NoGradGuard ng;
  Tensor y = randn({2048, 512});
  Tensor g;
  for (int r = 0; r < 3; ++r) {
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) g = sum(y, {0});
    auto b = std::chrono::steady_clock::now();
    printf("sum0 %.1f us\n", std::chrono::duration<double, std::micro>(b - a).count() / 1000);
    a = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) g = sum(y);
    b = std::chrono::steady_clock::now();
    printf("sumall %.1f us\n", std::chrono::duration<double, std::micro>(b - a).count() / 1000);
  }
}
