#include <chrono>
#include <cstdio>
#include <vector>
#include "core/tensor.h"
#include "optim/optimizers.h"
using namespace asc;
int main() {
  // the bench_train model's parameters: 2 layers of qkv, out, ffn1, ffn2 (weights + biases) and 2 LayerNorms, + extras
  std::vector<Shape> shapes;
  for (int l = 0; l < 2; ++l)
    for (Shape s : {Shape{384, 128}, Shape{384}, Shape{128, 128}, Shape{128}, Shape{512, 128}, Shape{512},
                    Shape{128, 512}, Shape{128}, Shape{128}, Shape{128}, Shape{128}, Shape{128}})
      shapes.push_back(s);
  for (Shape s : {Shape{256, 128}, Shape{128, 128}, Shape{128}, Shape{128}, Shape{10, 128}, Shape{10}})
    shapes.push_back(s);
  std::vector<Tensor> ps;
  int64_t n = 0;
  for (auto& s : shapes) {
    Tensor p = randn(s).set_requires_grad(true);
    p.set_grad(randn(s));
    ps.push_back(p);
    n += p.numel();
  }
  optim::AdamW opt(ps, {});
  for (int i = 0; i < 5; ++i) opt.step();
  for (int rep = 0; rep < 5; ++rep) {
    auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) opt.step();
    printf("%zu tensors, %lld elements: AdamW.step %.1f us\n", ps.size(), (long long)n,
           std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 50);
  }
}
