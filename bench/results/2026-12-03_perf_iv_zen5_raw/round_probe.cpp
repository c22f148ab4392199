#include <chrono>
#include <cstdio>
#include <vector>
#include "core/tensor.h"
#include "ops/cpu/gemm.h"
#include "ops/elementwise.h"
using namespace asc;
int main() {
  for (auto [M, N] : {std::pair{2048, 128}, {2048, 384}, {2048, 512}}) {
    std::vector<Tensor> src;
    for (int i = 0; i < 24; ++i) src.push_back(randn({M, N}));
    Tensor hot = randn({M, N});
    for (int rep = 0; rep < 3; ++rep) {
      auto t = std::chrono::steady_clock::now();
      for (int i = 0; i < 48; ++i) {
        Tensor r = cpu::round_to_bfloat16(src[i % 24]);
      }
      double cold = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 48;
      t = std::chrono::steady_clock::now();
      for (int i = 0; i < 48; ++i) {
        Tensor r = cpu::round_to_bfloat16(hot);
      }
      double h = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 48;
      t = std::chrono::steady_clock::now();
      for (int i = 0; i < 48; ++i) {
        Tensor r = add(src[i % 24], 1.0);
      }
      double ad = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 48;
      printf("%dx%d round cold-src %.1f us, hot %.1f us; add-scalar cold %.1f us\n", M, N, cold, h, ad);
    }
  }
}
