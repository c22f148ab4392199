#include <algorithm>
#include <chrono>
#include <cstdio>
#include "ascender.h"
#include "core/profiler.h"
using namespace asc;
template <class F>
double med(F f, int reps = 30) {
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
int main(int argc, char**) {
  Tensor y = randn({2048, 512}), b = randn({512});
  y.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor go = randn({2048, 512});
  std::unique_ptr<profiler::Profile> p;
  if (argc > 1) p = std::make_unique<profiler::Profile>();
  for (int r = 0; r < 2; ++r) {
    printf("bad gelu p0.1 f+b  %8.1f us\n", med([&] {
             Tensor o = bias_activation_dropout(y, b, Activation::Gelu, 0.1, true);
             o.backward(go);
           }));
    printf("bad gelu p0.1 f    %8.1f us\n",
           med([&] { Tensor o = bias_activation_dropout(y, b, Activation::Gelu, 0.1, true); }));
  }
  if (p) {
    p->stop();
    printf("%s\n", p->table().c_str());
  }
}
