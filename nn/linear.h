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

// Several Linear layers applied to one input x (..., in): {(*layers[0])(x), (*layers[1])(x), ...}, computed as one
// product when they are plain Linear layers without hooks, with the same in_features, dtype, device and presence of a
// bias, and x has at least kGroupRows rows: the weights concatenated per call ((Σ out, in): 3 · 128² floats, 192 KiB,
// for a width-128 attention's q, k, v), one (rows, Σ out) GEMM, the outputs views of its columns. The backward then
// makes dX with one product over Σ out instead of one per layer and the sums of their results, and dW with one. This
// is what PyTorch's MultiheadAttention gets from its packed in_proj_weight, with the layers, their parameter names and
// checkpoints unchanged. The same values as the layers one by one up to float rounding (a product over Σ out sums in
// another order); otherwise (a hook on any of them, fewer rows) they run one by one.
//   auto qkv = asc::nn::linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);  // three (B, T, D) views
inline constexpr int64_t kGroupRows = 256;
TensorList linear_group(const std::vector<Linear*>& layers, const Tensor& x);

}  // namespace asc::nn
