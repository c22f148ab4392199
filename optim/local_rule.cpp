#include "optim/local_rule.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/ops.h"

namespace asc::optim {

void LocalRule::set_mask(const Tensor& param, UpdateMask mode) {
  ASC_CHECK(param.defined(), "{}::set_mask: undefined parameter", name());
  ASC_CHECK(param.dim() >= 1, "{}::set_mask: a row mask needs a parameter with at least one dim, got shape {}", name(),
            param.shape());
  ASC_CHECK(mode == UpdateMask::All || mode == UpdateMask::Active || mode == UpdateMask::Inactive,
            "{}::set_mask: unknown UpdateMask {} (All, Active or Inactive)", name(), static_cast<int>(mode));
  for (auto& m : masks_)
    if (m.param.impl() == param.impl()) {
      m.mode = mode;
      return;
    }
  masks_.push_back({param, mode});
}

void LocalRule::set_range(const Tensor& t, double lo, double hi) {
  ASC_CHECK(t.defined(), "{}::set_range: undefined tensor", name());
  ASC_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64,
            "{}::set_range: expected a float32/float64 tensor, got {} (shape {})", name(), t.dtype(), t.shape());
  ASC_CHECK(!std::isnan(lo) && !std::isnan(hi) && lo <= hi, "{}::set_range: need lo <= hi, got [{}, {}] (shape {})",
            name(), lo, hi, t.shape());
  for (auto& r : ranges_)
    if (r.tensor.impl() == t.impl()) {
      r.lo = lo;
      r.hi = hi;
      return;
    }
  ranges_.push_back({t, lo, hi});
}

bool LocalRule::masks(const Tensor& param) const {
  for (const auto& m : masks_)
    if (m.param.impl() == param.impl()) return m.mode != UpdateMask::All;
  return false;
}

Tensor LocalRule::row_mask(const Tensor& param) const {
  const MaskEntry* entry = nullptr;
  for (const auto& m : masks_)
    if (m.param.impl() == param.impl()) entry = &m;
  if (!entry || entry->mode == UpdateMask::All) return {};
  Tensor f = fired(param);
  if (!f.defined()) return {};  // no snapshot: no information, every row moves
  const int64_t rows = param.size(0);
  ASC_CHECK(
      f.dtype() == kBool && f.dim() == 1 && f.size(0) == rows,
      "{}: fired() must return a bool tensor of shape [{}] (rows of the parameter of shape {}), got {} of shape {}",
      name(), rows, param.shape(), f.dtype(), f.shape());
  NoGradGuard g;
  Tensor m = entry->mode == UpdateMask::Active ? f : logical_not(f);
  return m.contiguous();
}

Tensor LocalRule::active_rows(const Tensor& F) {
  ASC_CHECK(F.defined() && F.dim() >= 1, "LocalRule::active_rows: expected a gate tensor (..., P), got {}",
            F.defined() ? fmt::format("shape {}", F.shape()) : std::string("an undefined tensor"));
  NoGradGuard g;
  Tensor f = F.detach().to(kFloat64).reshape({-1, F.size(-1)});
  return gt(sum(f, {0}), 0.0);  // sum > 0 <=> batch mean > 0
}

}  // namespace asc::optim
