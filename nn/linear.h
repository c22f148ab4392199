#pragma once
// nn::Linear: y = x W^T + b over the last dim. Initialised as in PyTorch: W, b ~ U(-1/sqrt(in), 1/sqrt(in)).
//
//   auto fc = std::make_shared<asc::nn::Linear>(128, 512);                                   // with bias
//   auto proj = std::make_shared<asc::nn::Linear>(asc::nn::LinearOptions(128, 128).bias(false));
//   asc::Tensor y = (*fc)(x);                                                                // (..., 128) -> (...,
//   512)
#include "nn/module.h"

namespace asc::nn {

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  ASC_ARG(int64_t, in_features);
  ASC_ARG(int64_t, out_features);
  ASC_ARG(bool, bias) = true;
};

class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in_features, int64_t out_features, bool bias = true)
      : Linear(LinearOptions(in_features, out_features).bias(bias)) {}
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., out)
  std::string extra_repr() const override;
  void reset_parameters();

  LinearOptions options;
  Tensor weight;  // (out, in)
  Tensor bias;    // (out) or undefined
};

}  // namespace asc::nn
