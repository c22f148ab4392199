#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "ascender.h"
using namespace asc;
int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;  // 0 both, 1 fwd only loop, 2 bwd
  Tensor xq = randn({16, 128, 128}).set_requires_grad(true), xk = randn({16, 128, 128}).set_requires_grad(true),
         xv = randn({16, 128, 128}).set_requires_grad(true);
  Tensor g = randn({16, 4, 128, 32});
  for (int r = 0; r < (mode ? 10 : 3); ++r) {
    std::vector<double> tf, tb;
    for (int i = 0; i < 30; ++i) {
      auto hd = [](const Tensor& t) { return t.view({16, 128, 4, 32}).permute({0, 2, 1, 3}); };
      Tensor q = hd(xq), k = hd(xk), v = hd(xv);
      auto a = std::chrono::steady_clock::now();
      Tensor o = scaled_dot_product_attention(q, k, v);
      auto b = std::chrono::steady_clock::now();
      if (mode != 1) o.backward(g);
      auto c = std::chrono::steady_clock::now();
      tf.push_back(std::chrono::duration<double, std::milli>(b - a).count());
      tb.push_back(std::chrono::duration<double, std::milli>(c - b).count());
    }
    std::sort(tf.begin(), tf.end());
    std::sort(tb.begin(), tb.end());
    if (!mode) printf("asc sdpa fwd %.3f ms bwd %.3f ms\n", tf[15], tb[15]);
  }
}
