// scaled_dot_product_attention at bench_train's shape (B 16, H 4, T 128, D 32), q/k/v (B, T, H, D) projections viewed
// (B, H, T, D) as in the step; forward and backward, medians of 40, 3 rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
int main() {
  auto mk = [] { return randn({16, 128, 4, 32}).set_requires_grad(true); };
  Tensor q0 = mk(), k0 = mk(), v0 = mk();
  Tensor g = randn({16, 4, 128, 32});
  for (int r = 0; r < 3; ++r) {
    std::vector<double> tf, tb;
    for (int i = 0; i < 40; ++i) {
      Tensor q = q0.permute({0, 2, 1, 3}), k = k0.permute({0, 2, 1, 3}), v = v0.permute({0, 2, 1, 3});
      auto a = std::chrono::steady_clock::now();
      Tensor o = scaled_dot_product_attention(q, k, v);
      auto b = std::chrono::steady_clock::now();
      o.backward(g);
      auto c = std::chrono::steady_clock::now();
      tf.push_back(std::chrono::duration<double, std::milli>(b - a).count());
      tb.push_back(std::chrono::duration<double, std::milli>(c - b).count());
      q0.zero_grad();
      k0.zero_grad();
      v0.zero_grad();
    }
    std::sort(tf.begin(), tf.end());
    std::sort(tb.begin(), tb.end());
    printf("asc sdpa fwd %.3f ms bwd %.3f ms\n", tf[20], tb[20]);
  }
}
