#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/ops.h"

namespace asc::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  ASC_CHECK(!std::isnan(max_norm) && max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got {}", max_norm);
  ASC_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be > 0 (or INFINITY), got {}", norm_type);
  NoGradGuard ng;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    ASC_CHECK(params[i].defined(), "clip_grad_norm: parameter {} is an undefined tensor", i);
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    ASC_CHECK(is_floating(g.dtype()), "clip_grad_norm: the gradient of parameter {} has dtype {}", i, g.dtype());
    grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  // One partial per gradient in float64 on its device, read by the host in one copy (not one read per gradient,
  // which on a GPU waits for the device once per parameter). A NaN anywhere makes the total NaN, else an infinity
  // makes it inf.
  const bool inf_norm = std::isinf(norm_type);
  TensorList parts;
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;
    const Tensor a = abs(g.detach().to(kFloat64));
    const Tensor part = inf_norm ? amax(a) : sum(norm_type == 2.0 ? a * a : pow(a, norm_type));
    parts.push_back(part.view({1}).to(grads.front().device()));
  }
  double acc = 0;
  bool nan = false;
  // the partials summed on the host in parameter order, as one read
  for (double x : parts.empty() ? std::vector<double>{} : cat(parts, 0).to_vector<double>()) {
    nan = nan || std::isnan(x);
    acc = inf_norm ? std::max(acc, x) : acc + x;
  }
  if (nan) acc = std::numeric_limits<double>::quiet_NaN();
  const double total = inf_norm ? acc : (norm_type == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / norm_type));
  ASC_CHECK(!error_if_nonfinite || std::isfinite(total),
            "clip_grad_norm: the total norm of order {} of the gradients is non-finite ({}); pass "
            "error_if_nonfinite = false to clip anyway",
            norm_type, total);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 || std::isnan(coef))
    for (auto& g : grads) g.mul_(coef);
  return total;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip) {
  ASC_CHECK(!std::isnan(clip) && clip >= 0, "clip_grad_value: clip must be >= 0, got {}", clip);
  for (size_t i = 0; i < params.size(); ++i)
    ASC_CHECK(params[i].defined(), "clip_grad_value: parameter {} is an undefined tensor", i);
  NoGradGuard ng;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(clamp(g, -clip, clip));
  }
}

}  // namespace asc::optim
