// scaled_dot_product_attention at bench_train's shape (B 16, H 4, T 128, D 32), forward and backward, median of 30.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
int main() {
  Tensor q = randn({16, 4, 128, 32}).set_requires_grad(true), k = randn({16, 4, 128, 32}).set_requires_grad(true),
         v = randn({16, 4, 128, 32}).set_requires_grad(true);
  Tensor g = randn({16, 4, 128, 32});
  for (int r = 0; r < 3; ++r) {
    std::vector<double> tf, tb;
    for (int i = 0; i < 30; ++i) {
      auto a = std::chrono::steady_clock::now();
      Tensor o = scaled_dot_product_attention(q, k, v);
      auto b = std::chrono::steady_clock::now();
      o.backward(g);
      auto c = std::chrono::steady_clock::now();
      tf.push_back(std::chrono::duration<double, std::milli>(b - a).count());
      tb.push_back(std::chrono::duration<double, std::milli>(c - b).count());
    }
    std::sort(tf.begin(), tf.end());
    std::sort(tb.begin(), tb.end());
    printf("asc sdpa fwd %.2f ms bwd %.2f ms\n", tf[15], tb[15]);
  }
}
