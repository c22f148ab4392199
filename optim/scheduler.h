#pragma once
// Learning-rate schedulers. A scheduler sets the lr of every group of its optimizer to base_lr(g) * factor(step),
// where base_lr(g) is the group's lr when the scheduler was made. As in torch.optim.lr_scheduler, the constructor
// applies step 0, and step() (called after optimizer.step()) advances to the next step, so the k-th optimizer step
// (0-based) runs with lr(k).
//
//   asc::optim::AdamW opt(params, {.lr = 3e-4});
//   asc::optim::WarmupCosine sched(opt, {.warmup_steps = 100, .total_steps = 10000, .min_lr = 1e-5});
//   for (int it = 0; it < 10000; ++it) { ...; opt.step(); sched.step(); }
//
// state_dict(): last_step (int64 scalar) and base_lrs.{g} (float64 scalars).
#include <cstdint>
#include <functional>
#include <vector>

#include "core/state_dict.h"
#include "optim/optimizer.h"

namespace asc::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  // Advances one step and sets every group's lr.
  virtual void step();
  int64_t last_step() const { return last_step_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lr of `group` at `step` (closed form; does not change anything).
  virtual double lr_at(size_t group, int64_t step) const = 0;

  StateDict state_dict() const;
  // Validates (entries, group count, values) before changing anything; then sets the optimizer's lrs for the
  // loaded step.
  void load_state_dict(const StateDict& sd);

 protected:
  LRScheduler(Optimizer& opt, const char* name);
  // Called at the end of the derived constructor (lr_at is virtual): applies step 0.
  void init();
  void apply_lrs();
  const char* name_;
  Optimizer& opt_;

 private:
  std::vector<double> base_lrs_;
  int64_t last_step_ = 0;
};

// Linear warmup from start_factor * base (step 0) to base at warmup_steps, then a half cosine from base to min_lr
// at total_steps, then min_lr:
//   s < W:        base (f0 + (1 - f0) s / W)
//   W <= s <= T:  min_lr + (base - min_lr) (1 + cos(pi (s - W) / (T - W))) / 2      (base at s = W)
//   s > T:        min_lr
struct WarmupCosineOptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr = 0;        // absolute, the same for every group
  double start_factor = 0;  // in [0, 1]
};
class WarmupCosine : public LRScheduler {
 public:
  WarmupCosine(Optimizer& opt, WarmupCosineOptions options);
  double lr_at(size_t group, int64_t step) const override;

 private:
  WarmupCosineOptions o_;
};

// lr = base * gamma^floor(step / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double lr_at(size_t group, int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base * f(step); f must return a finite value >= 0.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& opt, std::function<double(int64_t)> f);
  double lr_at(size_t group, int64_t step) const override;

 private:
  std::function<double(int64_t)> f_;
};

}  // namespace asc::optim
