#include "nn/linear.h"

#include <cmath>

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

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", options.in_features(), options.out_features(),
                     options.bias());
}

}  // namespace asc::nn
