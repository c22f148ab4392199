#pragma once
// SGD, Adam, AdamW and RMSprop with torch.optim's semantics (same defaults, same update order, same state):
// L2 weight decay added to the gradient for SGD / Adam / RMSprop, decoupled p *= 1 - lr wd for AdamW, Nesterov,
// momentum buffer initialised to the first (decayed) gradient, Adam's bias correction with a per-parameter step
// count, AMSGrad, centered RMSprop. Each group keeps its own options.
//
//   asc::optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//   sgd.add_param_group(head_params, {.lr = 0.01});
//   asc::optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//
// State buffers (Optimizer::state(param, name) and state_dict()): SGD momentum_buffer; Adam / AdamW exp_avg,
// exp_avg_sq, max_exp_avg_sq (amsgrad); RMSprop square_avg, momentum_buffer (momentum > 0), grad_avg (centered).
#include <vector>

#include "optim/optimizer.h"

namespace asc::optim {

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  void add_param_group(std::vector<Tensor> params, SGDOptions options);
  SGDOptions options(size_t group) const;

 protected:
  void check_options(const std::vector<double>& o) const override;
  void update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
              const Tensor& row_mask) override;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool amsgrad = false;
};
struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  bool amsgrad = false;
};

namespace detail {
// The shared Adam / AdamW implementation; `decoupled` selects AdamW's weight decay.
class AdamBase : public Optimizer {
 protected:
  AdamBase(const char* name, bool decoupled);
  void check_options(const std::vector<double>& o) const override;
  void update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
              const Tensor& row_mask) override;
  bool decoupled_;
};
}  // namespace detail

class Adam : public detail::AdamBase {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  void add_param_group(std::vector<Tensor> params, AdamOptions options);
  AdamOptions options(size_t group) const;
};

class AdamW : public detail::AdamBase {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  void add_param_group(std::vector<Tensor> params, AdamWOptions options);
  AdamWOptions options(size_t group) const;
};

struct RMSpropOptions {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false;
};

class RMSprop : public Optimizer {
 public:
  explicit RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  void add_param_group(std::vector<Tensor> params, RMSpropOptions options);
  RMSpropOptions options(size_t group) const;

 protected:
  void check_options(const std::vector<double>& o) const override;
  void update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
              const Tensor& row_mask) override;
};

}  // namespace asc::optim
