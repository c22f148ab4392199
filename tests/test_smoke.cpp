#include "testing.h"
using namespace asc;
using namespace asc::testing;

TEST_CASE("smoke: add, matmul, backward") {
  Tensor a = tensor({1, 2, 3, 4}, {2, 2});
  Tensor b = tensor({10, 20}, {2});
  check_close(a + b, {11, 22, 13, 24});
  Tensor w = tensor({1, 0, 0, 1}, {2, 2}, {.requires_grad = true});
  Tensor y = matmul(a, w).relu().sum();
  CHECK(y.item<double>() == 10);
  y.backward();
  check_close(w.grad(), {4, 4, 6, 6});
  check_grad([](const TensorList& in) { return TensorList{tanh(matmul(in[0], in[1])) * in[0].sum()}; },
             {randn64({3, 4}, true, 1), randn64({4, 2}, true, 2)});
  fmt::print("{}\n", a);
}
