#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
template <class F>
double best_us(F f) {
  double best = 1e30;
  for (int r = 0; r < 20; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
int main() {
  for (int64_t n : {4096L, 16384L}) {
    const int64_t b = std::llround(std::sqrt(double(n)));
    Tensor k = randn({1, 4, n, 64}).set_requires_grad(true);
    Tensor g = randn({1, 4, n + (n + b - 1) / b, 64});
    double comp = best_us([&] { cat({k, hierarchical_summaries(k, b).means}, 2); });
    double fused = best_us([&] { hierarchical_keys(k, b); });
    double compb = best_us([&] {
      auto y = cat({k, hierarchical_summaries(k, b).means}, 2);
      autograd::grad({y}, {k}, {g});
    });
    double fusedb = best_us([&] {
      auto y = hierarchical_keys(k, b);
      autograd::grad({y}, {k}, {g});
    });
    std::printf("n %ld: fwd composed %.0f us fused %.0f us; f+b composed %.0f fused %.0f\n", n, comp, fused, compb,
                fusedb);
  }
}
