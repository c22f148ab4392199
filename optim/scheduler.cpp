#include "optim/scheduler.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/format.h"

namespace asc::optim {

LRScheduler::LRScheduler(Optimizer& opt, const char* name) : name_(name), opt_(opt) {
  for (size_t g = 0; g < opt.num_groups(); ++g) base_lrs_.push_back(opt.lr(g));
}

void LRScheduler::init() { apply_lrs(); }

void LRScheduler::apply_lrs() {
  ASC_CHECK(opt_.num_groups() == base_lrs_.size(),
            "{}: the optimizer has {} parameter groups but the scheduler was made for {}", name_, opt_.num_groups(),
            base_lrs_.size());
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    double lr = lr_at(g, last_step_);
    ASC_CHECK(std::isfinite(lr) && lr >= 0, "{}: lr of group {} at step {} is {} (must be finite and >= 0)", name_, g,
              last_step_, lr);
    lrs.push_back(lr);
  }
  for (size_t g = 0; g < lrs.size(); ++g) opt_.set_lr(g, lrs[g]);
}

void LRScheduler::step() {
  ++last_step_;
  try {
    apply_lrs();
  } catch (...) {
    --last_step_;  // nothing changed
    throw;
  }
}

StateDict LRScheduler::state_dict() const {
  StateDict sd;
  sd.set("last_step", tensor(std::vector<int64_t>{last_step_}, Shape{}));
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    sd.set(fmt::format("base_lrs.{}", g), scalar_tensor(base_lrs_[g], {.dtype = kFloat64}));
  return sd;
}

void LRScheduler::load_state_dict(const StateDict& sd) {
  const Tensor* ls = sd.find("last_step");
  ASC_CHECK(ls != nullptr, "{}.load_state_dict: missing entry 'last_step'", name_);
  ASC_CHECK(ls->dtype() == kInt64 && ls->numel() == 1,
            "{}.load_state_dict: 'last_step' must be a one-element int64 tensor, got {} of shape {}", name_,
            ls->dtype(), ls->shape());
  const int64_t step = ls->item<int64_t>();
  ASC_CHECK(step >= 0, "{}.load_state_dict: 'last_step' is negative ({})", name_, step);
  std::vector<double> base(opt_.num_groups());
  size_t found = 0;
  for (const auto& [key, t] : sd) {
    if (key == "last_step") continue;
    const int64_t idx = key.rfind("base_lrs.", 0) == 0 ? parse_state_index(key.substr(9)) : -1;
    ASC_CHECK(idx >= 0, "{}.load_state_dict: unexpected entry '{}'", name_, key);
    const size_t g = static_cast<size_t>(idx);
    ASC_CHECK(g < base.size(), "{}.load_state_dict: entry '{}' names group {} but the optimizer has {} groups", name_,
              key, g, base.size());
    ASC_CHECK(t.dtype() == kFloat64 && t.numel() == 1,
              "{}.load_state_dict: '{}' must be a one-element float64 tensor, got {} of shape {}", name_, key,
              t.dtype(), t.shape());
    base[g] = t.item<double>();
    ASC_CHECK(std::isfinite(base[g]) && base[g] >= 0, "{}.load_state_dict: '{}' is {} (must be finite and >= 0)", name_,
              key, base[g]);
    ++found;
  }
  ASC_CHECK(found == base.size(),
            "{}.load_state_dict: expected base_lrs.0 .. base_lrs.{} ({} groups), found {} entries", name_,
            base.size() - 1, base.size(), found);
  auto old_base = base_lrs_;
  auto old_step = last_step_;
  base_lrs_ = std::move(base);
  last_step_ = step;
  try {
    apply_lrs();
  } catch (...) {
    base_lrs_ = std::move(old_base);
    last_step_ = old_step;
    throw;
  }
}

// ---- WarmupCosine ------------------------------------------------------------------------------------------------

WarmupCosine::WarmupCosine(Optimizer& opt, WarmupCosineOptions o) : LRScheduler(opt, "WarmupCosine"), o_(o) {
  ASC_CHECK(o.warmup_steps >= 0, "WarmupCosine: warmup_steps must be >= 0, got {}", o.warmup_steps);
  ASC_CHECK(
      o.total_steps >= o.warmup_steps && o.total_steps > 0,
      "WarmupCosine: need total_steps > 0 and total_steps >= warmup_steps, got total_steps {} and warmup_steps {}",
      o.total_steps, o.warmup_steps);
  ASC_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0, "WarmupCosine: min_lr must be finite and >= 0, got {}", o.min_lr);
  ASC_CHECK(o.start_factor >= 0 && o.start_factor <= 1, "WarmupCosine: start_factor must be in [0, 1], got {}",
            o.start_factor);
  init();
}

double WarmupCosine::lr_at(size_t group, int64_t s) const {
  const double base = base_lrs()[group];
  if (s < o_.warmup_steps)
    return base * (o_.start_factor + (1.0 - o_.start_factor) * static_cast<double>(s) / o_.warmup_steps);
  if (s == o_.warmup_steps) return base;  // also when total_steps == warmup_steps
  if (s >= o_.total_steps) return o_.min_lr;
  const double progress =
      static_cast<double>(s - o_.warmup_steps) / static_cast<double>(o_.total_steps - o_.warmup_steps);
  return o_.min_lr + (base - o_.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

// ---- StepLR / LambdaLR -------------------------------------------------------------------------------------------

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt, "StepLR"), step_size_(step_size), gamma_(gamma) {
  ASC_CHECK(step_size > 0, "StepLR: step_size must be > 0, got {}", step_size);
  ASC_CHECK(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be finite and >= 0, got {}", gamma);
  init();
}

double StepLR::lr_at(size_t group, int64_t s) const {
  return base_lrs()[group] * std::pow(gamma_, static_cast<double>(s / step_size_));
}

LambdaLR::LambdaLR(Optimizer& opt, std::function<double(int64_t)> f) : LRScheduler(opt, "LambdaLR"), f_(std::move(f)) {
  ASC_CHECK(static_cast<bool>(f_), "LambdaLR: empty function");
  init();
}

double LambdaLR::lr_at(size_t group, int64_t s) const { return base_lrs()[group] * f_(s); }

}  // namespace asc::optim
