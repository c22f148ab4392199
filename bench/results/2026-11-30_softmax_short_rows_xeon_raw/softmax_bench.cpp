// softmax / log_softmax over the last dim of (rows, n) float32, 2^19 entries, n = 2 ... 33; forward alone and
// softmax forward + backward; best of 5 batches of 50 calls; linked against the library build named on the command
// line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "ascender.h"

using namespace asc;
using Clock = std::chrono::steady_clock;

static double best_ms(const std::function<void()>& f) {
  for (int i = 0; i < 5; ++i) f();
  double best = 1e30;
  for (int b = 0; b < 5; ++b) {
    auto t0 = Clock::now();
    for (int i = 0; i < 50; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / 50);
  }
  return best;
}

int main(int argc, char** argv) {
  const std::string label = argc > 1 ? argv[1] : "ascender";
  Generator g(1);
  for (int64_t n : {2, 4, 5, 8, 15, 16, 17, 24, 31, 32, 33}) {
    const int64_t rows = (int64_t{1} << 19) / n;
    Tensor x = randn({rows, n}, {}, &g), gy = randn({rows, n}, {}, &g), y;
    Tensor xr = x.detach();
    xr.set_requires_grad(true);
    const double f = best_ms([&] { y = softmax(x, -1); }), lf = best_ms([&] { y = log_softmax(x, -1); });
    const double fb = best_ms([&] {
      xr.zero_grad();
      y = softmax(xr, -1);
      y.backward(gy);
    });
    std::printf("%s,%lld,%.4f,%.4f,%.4f\n", label.c_str(), static_cast<long long>(n), f, lf, fb);
  }
}
