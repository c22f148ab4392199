#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
template <class F>
double med(F f) {
  for (int i = 0; i < 5; ++i) f();
  std::vector<double> v;
  for (int r = 0; r < 50; ++r) {
    double t = now();
    f();
    v.push_back(now() - t);
  }
  std::sort(v.begin(), v.end());
  return v[25] * 1e6;
}
int main() {
  Tensor x = randn({2048, 128});
  Tensor h = randn({2048, 512});
  Tensor b = randn({512});
  for (int round = 0; round < 3; ++round) {
    std::printf(
        "rand 262144: %.1f us   rand 1M: %.1f us   dropout 262144: %.1f   copy 262144: %.1f  add 262144: %.1f  "
        "bias_gelu_dropout 1M: %.1f  gelu 1M %.1f\n",
        med([&] {
          auto t = rand({2048, 128});
        }),
        med([&] {
          auto t = rand({2048, 512});
        }),
        med([&] { auto t = dropout(x, 0.1, true); }), med([&] { auto t = x.clone(); }),
        med([&] { auto t = add(x, x); }),
        med([&] { auto t = bias_activation_dropout(h, b, Activation::Gelu, 0.1, true); }),
        med([&] { auto t = gelu(h); }));
  }
}
