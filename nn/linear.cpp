#include "nn/linear.h"

#include <cmath>
#include <typeinfo>

#include "autograd/anomaly.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace asc::nn {

Linear::Linear(const LinearOptions& o) : Module("Linear"), options(o) {
  ASC_CHECK(o.in_features() > 0 && o.out_features() > 0, "Linear: features must be positive, got in={} out={}",
            o.in_features(), o.out_features());
  weight = register_parameter("weight", empty({o.out_features(), o.in_features()}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_features()}));
  reset_parameters();
}

void Linear::reset_parameters() {
  double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
  init::uniform_(weight, -bound, bound);
  if (bias.defined()) init::uniform_(bias, -bound, bound);
}

Tensor Linear::forward(const Tensor& x) {
  ASC_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options.in_features(),
            "Linear: expected input (..., {}), got {}", options.in_features(), x.defined() ? x.shape() : Shape{});
  return linear(x, weight, bias);
}

TensorList linear_group(const std::vector<Linear*>& layers, const Tensor& x) {
  ASC_CHECK(!layers.empty(), "linear_group: no layers");
  for (const Linear* l : layers) ASC_CHECK(l != nullptr, "linear_group: a null layer");
  const Linear& first = *layers.front();
  const int64_t in = first.options.in_features();
  // Rows of x: with fewer than kGroupRows (a token at a time in decoding) the copy of the weights would cost about as
  // much memory traffic as the product it replaces.
  const bool enough_rows = x.defined() && x.dim() >= 1 && x.size(-1) == in && x.numel() / in >= kGroupRows;
  bool one_product = layers.size() > 1 && enough_rows;
  for (const Linear* l : layers) {
    const bool bias_like_first =
        l->bias.defined() == first.bias.defined() &&
        (!l->bias.defined() || (l->bias.dim() == 1 && l->bias.size(0) == l->weight.size(0) &&
                                l->bias.dtype() == first.weight.dtype() && l->bias.device() == first.weight.device()));
    one_product = one_product && typeid(*l) == typeid(Linear) && !l->has_forward_hooks() &&
                  l->options.in_features() == in && l->weight.dim() == 2 && l->weight.size(1) == in &&
                  l->weight.dtype() == first.weight.dtype() && l->weight.device() == first.weight.device() &&
                  bias_like_first;
  }
  TensorList out;
  if (!one_product) {
    for (Linear* l : layers) out.push_back((*l)(x));
    return out;
  }
  autograd::AnomalyScope scope("Linear");  // as each layer's own call would name it in anomaly reports
  TensorList weights, biases;
  std::vector<int64_t> sizes;
  for (const Linear* l : layers) {
    weights.push_back(l->weight), sizes.push_back(l->weight.size(0));
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  const Tensor y = linear(x, cat(weights, 0), biases.empty() ? Tensor() : cat(biases, 0));  // (..., Σ out)
  return split_with_sizes(y, sizes, -1);
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", options.in_features(), options.out_features(),
                     options.bias());
}

}  // namespace asc::nn
