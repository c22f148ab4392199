// The README's "first model" example, verbatim in a test so it cannot rot: it must compile and learn.
#include "testing.h"

using namespace asc;

TEST_CASE("README example trains") {
  Generator gen(0);
  Tensor x = randn({64, 2}, {}, &gen);                                    // (N, 2) inputs
  Tensor y = gt(sum(x * x, {1}, true), 1.0).to(kFloat32);                 // (N, 1) labels: outside the circle
  Tensor w1 = (randn({2, 16}, {}, &gen) * 0.7).set_requires_grad(true);   // (2, 16)
  Tensor b1 = zeros({16}, {.requires_grad = true});                       // (16)
  Tensor w2 = (randn({16, 1}, {}, &gen) * 0.25).set_requires_grad(true);  // (16, 1)
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    Tensor logits = matmul(tanh(matmul(x, w1) + b1), w2);  // (N, 1)
    Tensor loss = mean(softplus(logits) - y * logits);     // binary cross-entropy
    w1.zero_grad(), b1.zero_grad(), w2.zero_grad();
    loss.backward();
    NoGradGuard ng;  // plain SGD
    for (Tensor p : {w1, b1, w2}) p.add_(p.grad(), -0.5);
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.5 * first);
}
