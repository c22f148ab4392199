#include "optim/amp.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace asc::optim {

GradScaler::GradScaler(GradScalerOptions o) : o_(o), scale_(o.init_scale) {
  ASC_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "GradScaler: init_scale must be positive, got {}",
            o.init_scale);
  ASC_CHECK(o.growth_factor > 1, "GradScaler: growth_factor must be > 1, got {}", o.growth_factor);
  ASC_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got {}",
            o.backoff_factor);
  ASC_CHECK(o.growth_interval > 0, "GradScaler: growth_interval must be positive, got {}", o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const { return o_.enabled ? loss * scale_ : loss; }

bool GradScaler::unscale_(Optimizer& opt) {
  if (!o_.enabled) return false;
  ASC_CHECK(!unscaled_, "GradScaler.unscale_: already called since the last update()");
  NoGradGuard g;
  bool found = false;
  for (size_t gi = 0; gi < opt.num_groups(); ++gi)
    for (const Tensor& p : opt.params(gi)) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      found |= has_non_finite(grad);
      grad.mul_(1.0 / scale_);
    }
  unscaled_ = true;
  found_inf_ = found;
  return found;
}

bool GradScaler::step(Optimizer& opt) {
  if (!o_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale_(opt);
  stepped_ = !found_inf_;
  if (stepped_) opt.step();
  return stepped_;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  ASC_CHECK(unscaled_, "GradScaler.update: call step() (or unscale_()) first");
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = found_inf_ = stepped_ = false;
}

StateDict GradScaler::state_dict() const {
  StateDict sd;
  sd.set("scale", scalar_tensor(scale_, {.dtype = kFloat64}));
  sd.set("growth_tracker", scalar_tensor(static_cast<double>(growth_tracker_), {.dtype = kInt64}));
  return sd;
}

void GradScaler::load_state_dict(const StateDict& sd) {
  ASC_CHECK(sd.size() == 2 && sd.contains("scale") && sd.contains("growth_tracker"),
            "GradScaler.load_state_dict: expected exactly 'scale' and 'growth_tracker', got {} entries", sd.size());
  const Tensor& s = sd.at("scale");
  const Tensor& t = sd.at("growth_tracker");
  ASC_CHECK(s.numel() == 1 && s.dtype() == kFloat64 && t.numel() == 1 && t.dtype() == kInt64,
            "GradScaler.load_state_dict: 'scale' must be one float64 and 'growth_tracker' one int64");
  double scale = s.item<double>();
  int64_t tracker = t.item<int64_t>();
  ASC_CHECK(scale > 0 && std::isfinite(scale) && tracker >= 0,
            "GradScaler.load_state_dict: invalid scale {} or growth_tracker {}", scale, tracker);
  scale_ = scale;
  growth_tracker_ = tracker;
}

MasterWeights::MasterWeights(const std::vector<Tensor>& params, DType master_dtype) {
  ASC_CHECK(is_floating(master_dtype), "MasterWeights: master dtype must be floating, got {}", master_dtype);
  NoGradGuard g;
  for (const Tensor& p : params) {
    if (!p.requires_grad()) continue;
    model_.push_back(p);
    Tensor m = p.detach().to(master_dtype);
    if (m.is_same(p) || m.shares_storage(p)) m = m.clone();  // never alias the model's storage
    master_.push_back(m.set_requires_grad(true));
  }
  ASC_CHECK(!master_.empty(), "MasterWeights: no trainable parameters were given");
}

void MasterWeights::copy_grads_to_master() {
  for (size_t i = 0; i < model_.size(); ++i) {
    Tensor g = model_[i].grad();
    master_[i].set_grad(g.defined() ? g.to(master_[i].dtype()).contiguous() : Tensor());
  }
}

void MasterWeights::copy_master_to_model() {
  NoGradGuard g;
  for (size_t i = 0; i < model_.size(); ++i) model_[i].copy_(master_[i]);
}

StateDict MasterWeights::state_dict() const {
  StateDict sd;
  for (size_t i = 0; i < master_.size(); ++i) sd.set(std::to_string(i), master_[i]);
  return sd;
}

void MasterWeights::load_state_dict(const StateDict& sd) {
  ASC_CHECK(sd.size() == master_.size(), "MasterWeights::load_state_dict: {} entries for {} master parameters",
            sd.size(), master_.size());
  std::vector<Tensor> values;
  for (size_t i = 0; i < master_.size(); ++i) {
    const Tensor* t = sd.find(std::to_string(i));
    ASC_CHECK(t != nullptr, "MasterWeights::load_state_dict: no entry '{}'", i);
    ASC_CHECK(t->shape() == master_[i].shape() && is_floating(t->dtype()),
              "MasterWeights::load_state_dict: entry '{}' is {} {}, the master parameter is {} {}", i, t->dtype(),
              t->shape(), master_[i].dtype(), master_[i].shape());
    values.push_back(*t);
  }
  NoGradGuard g;
  for (size_t i = 0; i < master_.size(); ++i) master_[i].copy_(values[i]);
  copy_master_to_model();
}

}  // namespace asc::optim
