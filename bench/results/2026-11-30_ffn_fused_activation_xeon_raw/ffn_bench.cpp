// The feed-forward hidden layer of bench_train's model, (2048, 512): dropout(gelu(y + b)) composed, and
// bias_activation_dropout, forward + backward (median of 40 after 3 warm-ups), three alternating rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
template <class F>
double med(F f, int reps = 40) {
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    auto b = std::chrono::steady_clock::now();
    if (i >= 3) t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
int main() {
  Tensor y = randn({2048, 512}), b = randn({512});
  y.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor go = randn({2048, 512});
  for (int r = 0; r < 3; ++r) {
    printf("composite fwd+bwd %8.1f us\n", med([&] {
             Tensor o = dropout(gelu(y + b), 0.1);
             o.backward(go);
           }));
    printf("fused     fwd+bwd %8.1f us\n", med([&] {
             Tensor o = bias_activation_dropout(y, b, Activation::Gelu, 0.1);
             o.backward(go);
           }));
  }
}
