#pragma once
// Finite-difference gradient check in float64. For f: inputs -> outputs it draws a random cotangent v for each
// output, and compares the backward result  d<v, f(x)>/dx  with the central difference
// (<v, f(x + eps e_i)> - <v, f(x - eps e_i)>) / (2 eps) for every element i of every input requiring grad.
//
//   auto r = asc::autograd::gradcheck([](const TensorList& in) { return TensorList{asc::tanh(in[0])}; },
//                                     {asc::randn({3, 4}, {.dtype = asc::kFloat64, .requires_grad = true})});
//   CHECK_MESSAGE(r.ok, r.message);
#include <functional>
#include <string>

#include "autograd/node.h"

namespace asc::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-4;
  uint64_t seed = 1234;  // for the random cotangents
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytical and numerical values
  explicit operator bool() const { return ok; }
};

GradcheckResult gradcheck(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts = {});

}  // namespace asc::autograd
