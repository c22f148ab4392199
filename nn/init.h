#pragma once
// Parameter initialisation, in place and without recording gradients, drawn from a Generator (the default
// generator when none is given, so asc::manual_seed(s) makes model construction reproducible).
// fan_in / fan_out of a weight (out, in, k...) are in*prod(k) and out*prod(k), as in PyTorch.
//
//   asc::nn::init::xavier_uniform_(layer->weight);
//   asc::nn::init::kaiming_normal_(w, {.nonlinearity = "relu"});
//   asc::nn::init::zeros_(layer->bias);
#include <string>
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace asc::nn::init {

// (fan_in, fan_out) of a tensor with at least 2 dims; error otherwise.
std::pair<int64_t, int64_t> fans(const Tensor& w);
// The recommended gain for a nonlinearity: linear/sigmoid 1, tanh 5/3, relu sqrt(2), leaky_relu sqrt(2/(1+a^2)),
// selu 3/4. Error for an unknown name.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

void uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
void normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
void constant_(Tensor& t, double value);
void zeros_(Tensor& t);
void ones_(Tensor& t);
// U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out));  N(0, gain^2 * 2 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
void xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

struct KaimingOptions {
  double a = 0.0;        // negative slope for leaky_relu
  bool fan_out = false;  // use fan_out instead of fan_in
  std::string nonlinearity = "leaky_relu";
};
// U(-b, b), b = gain * sqrt(3 / fan);  N(0, gain^2 / fan);  gain = calculate_gain(nonlinearity, a).
void kaiming_uniform_(Tensor& t, KaimingOptions opts = {}, Generator* gen = nullptr);
void kaiming_normal_(Tensor& t, KaimingOptions opts = {}, Generator* gen = nullptr);

}  // namespace asc::nn::init
