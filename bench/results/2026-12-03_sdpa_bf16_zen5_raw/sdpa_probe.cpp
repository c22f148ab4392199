#include <chrono>
#include <cstdio>
#include <optional>
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/ops.h"
using namespace asc;
int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 200;
  manual_seed(0);
  std::optional<CpuAutocast> ac;
  if (argc > 2 && atoi(argv[2])) ac.emplace();
  Tensor x = randn({16, 128, 3, 4, 32}, {.requires_grad = true});
  Tensor g = randn({16, 4, 128, 32});
  double tf = 0, tb = 0;
  for (int r = 0; r < reps; ++r) {
    Tensor q = x.select(2, 0).permute({0, 2, 1, 3}), k = x.select(2, 1).permute({0, 2, 1, 3}),
           v = x.select(2, 2).permute({0, 2, 1, 3});
    auto t0 = std::chrono::steady_clock::now();
    Tensor o = scaled_dot_product_attention(q, k, v);
    auto t1 = std::chrono::steady_clock::now();
    autograd::backward({o}, {g});
    auto t2 = std::chrono::steady_clock::now();
    if (r >= reps / 4) {
      tf += std::chrono::duration<double>(t1 - t0).count();
      tb += std::chrono::duration<double>(t2 - t1).count();
    }
    x.zero_grad();
  }
  int n = reps - reps / 4;
  printf("fwd %.1f us  bwd(total) %.1f us\n", tf / n * 1e6, tb / n * 1e6);
}
