#include "optim/clip.h"

#include <cmath>
#include <limits>

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
  const bool inf_norm = std::isinf(norm_type);
  double acc = 0;
  double nonfinite = 0;  // inf when some gradient holds inf, NaN when some holds NaN (NaN wins)
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;
    Tensor a = abs(g.detach().to(kFloat64));
    if (has_non_finite(a)) {
      const double s = sum(a).item<double>();  // NaN if any NaN, else inf
      if (!std::isnan(nonfinite)) nonfinite = s;
      continue;
    }
    if (inf_norm)
      acc = std::max(acc, amax(a).item<double>());
    else
      acc += sum(norm_type == 2.0 ? a * a : pow(a, norm_type)).item<double>();
  }
  double total = inf_norm ? acc : (norm_type == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / norm_type));
  if (nonfinite != 0) total = nonfinite;
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
