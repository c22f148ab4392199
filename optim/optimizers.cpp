#include "optim/optimizers.h"

#include <cmath>

#include "core/error.h"
#include "core/format.h"
#include "ops/dispatch.h"
#include "ops/kernels.h"

namespace asc::optim {

namespace {

void check_nonneg(const char* opt, const char* what, double v) {
  ASC_CHECK(std::isfinite(v) && v >= 0, "{}: {} must be a finite value >= 0, got {}", opt, what, v);
}
void check_bool(const char* opt, const char* what, double v) {
  ASC_CHECK(v == 0 || v == 1, "{}: {} is a flag (0 or 1), got {}", opt, what, v);
}
void check_beta(const char* opt, const char* what, double v) {
  ASC_CHECK(v >= 0 && v < 1, "{}: {} must be in [0, 1), got {}", opt, what, v);
}
Tensor& ensure(Tensor& buf, const Tensor& like) {
  if (!buf.defined()) buf = zeros_like(like);
  return buf;
}

}  // namespace

// ---- SGD -----------------------------------------------------------------------------------------------------------

namespace {
std::vector<double> pack(const SGDOptions& o) {
  return {o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov ? 1.0 : 0.0};
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer("SGD", {"lr", "momentum", "dampening", "weight_decay", "nesterov"}, {"momentum_buffer"}) {
  add_group(std::move(params), pack(options));
}

void SGD::add_param_group(std::vector<Tensor> params, SGDOptions options) {
  add_group(std::move(params), pack(options));
}

SGDOptions SGD::options(size_t group) const {
  return {option(group, "lr"), option(group, "momentum"), option(group, "dampening"), option(group, "weight_decay"),
          option(group, "nesterov") != 0};
}

void SGD::check_options(const std::vector<double>& o) const {
  check_nonneg("SGD", "lr", o[0]);
  check_nonneg("SGD", "momentum", o[1]);
  ASC_CHECK(std::isfinite(o[2]), "SGD: dampening must be finite, got {}", o[2]);
  check_nonneg("SGD", "weight_decay", o[3]);
  check_bool("SGD", "nesterov", o[4]);
  ASC_CHECK(o[4] == 0 || (o[1] > 0 && o[2] == 0),
            "SGD: nesterov needs momentum > 0 and dampening == 0, got momentum {} and dampening {}", o[1], o[2]);
}

void SGD::update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
                 const Tensor& row_mask) {
  SGDKernelArgs a{.lr = o[0], .momentum = o[1], .dampening = o[2], .weight_decay = o[3], .nesterov = o[4] != 0};
  Tensor& buf = st.bufs[0];
  if (a.momentum != 0) {
    // torch initialises the buffer to the first d = g + wd p. Rows masked on that first step keep a zero buffer
    // (identical to torch's initialisation when dampening == 0, since 0 * momentum + d = d).
    a.init_buf = !buf.defined();
    ensure(buf, param);
  }
  ++st.step;
  ASC_KERNEL(param.device(), "SGD.step", sgd_update, a, param, grad, a.momentum != 0 ? buf : Tensor(), row_mask);
}

// ---- Adam / AdamW ---------------------------------------------------------------------------------------------

namespace {
template <class O>
std::vector<double> pack_adam(const O& o) {
  return {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad ? 1.0 : 0.0};
}
}  // namespace

namespace detail {

AdamBase::AdamBase(const char* name, bool decoupled)
    : Optimizer(name, {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"},
                {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
      decoupled_(decoupled) {}

void AdamBase::check_options(const std::vector<double>& o) const {
  const char* n = name().c_str();
  check_nonneg(n, "lr", o[0]);
  check_beta(n, "beta1", o[1]);
  check_beta(n, "beta2", o[2]);
  check_nonneg(n, "eps", o[3]);
  check_nonneg(n, "weight_decay", o[4]);
  check_bool(n, "amsgrad", o[5]);
}

void AdamBase::update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
                      const Tensor& row_mask) {
  // The step count is per parameter, not per row: it advances even when a local rule masks some (or all) rows,
  // so a row that resumes after being masked gets the bias correction of the parameter's step count.
  ++st.step;
  const double s = static_cast<double>(st.step);
  AdamKernelArgs a{.lr = o[0],
                   .beta1 = o[1],
                   .beta2 = o[2],
                   .eps = o[3],
                   .weight_decay = o[4],
                   .decoupled = decoupled_,
                   .amsgrad = o[5] != 0,
                   .bias_correction1 = 1.0 - std::pow(o[1], s),
                   .bias_correction2 = 1.0 - std::pow(o[2], s)};
  Tensor& m = ensure(st.bufs[0], param);
  Tensor& v = ensure(st.bufs[1], param);
  Tensor vmax = a.amsgrad ? ensure(st.bufs[2], param) : Tensor();
  ASC_KERNEL(param.device(), decoupled_ ? "AdamW.step" : "Adam.step", adam_update, a, param, grad, m, v, vmax,
             row_mask);
}

}  // namespace detail

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : AdamBase("Adam", false) {
  add_group(std::move(params), pack_adam(options));
}
void Adam::add_param_group(std::vector<Tensor> params, AdamOptions options) {
  add_group(std::move(params), pack_adam(options));
}
AdamOptions Adam::options(size_t g) const {
  return {option(g, "lr"),  option(g, "beta1"),        option(g, "beta2"),
          option(g, "eps"), option(g, "weight_decay"), option(g, "amsgrad") != 0};
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : AdamBase("AdamW", true) {
  add_group(std::move(params), pack_adam(options));
}
void AdamW::add_param_group(std::vector<Tensor> params, AdamWOptions options) {
  add_group(std::move(params), pack_adam(options));
}
AdamWOptions AdamW::options(size_t g) const {
  return {option(g, "lr"),  option(g, "beta1"),        option(g, "beta2"),
          option(g, "eps"), option(g, "weight_decay"), option(g, "amsgrad") != 0};
}

// ---- RMSprop -------------------------------------------------------------------------------------------------------

namespace {
std::vector<double> pack(const RMSpropOptions& o) {
  return {o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered ? 1.0 : 0.0};
}
}  // namespace

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options)
    : Optimizer("RMSprop", {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"},
                {"square_avg", "momentum_buffer", "grad_avg"}) {
  add_group(std::move(params), pack(options));
}
void RMSprop::add_param_group(std::vector<Tensor> params, RMSpropOptions options) {
  add_group(std::move(params), pack(options));
}
RMSpropOptions RMSprop::options(size_t g) const {
  return {option(g, "lr"),           option(g, "alpha"),    option(g, "eps"),
          option(g, "weight_decay"), option(g, "momentum"), option(g, "centered") != 0};
}

void RMSprop::check_options(const std::vector<double>& o) const {
  check_nonneg("RMSprop", "lr", o[0]);
  ASC_CHECK(o[1] >= 0 && o[1] <= 1, "RMSprop: alpha must be in [0, 1], got {}", o[1]);
  check_nonneg("RMSprop", "eps", o[2]);
  check_nonneg("RMSprop", "weight_decay", o[3]);
  check_nonneg("RMSprop", "momentum", o[4]);
  check_bool("RMSprop", "centered", o[5]);
}

void RMSprop::update(const std::vector<double>& o, const Tensor& param, const Tensor& grad, ParamState& st,
                     const Tensor& row_mask) {
  RMSpropKernelArgs a{
      .lr = o[0], .alpha = o[1], .eps = o[2], .weight_decay = o[3], .momentum = o[4], .centered = o[5] != 0};
  ++st.step;
  Tensor& sq = ensure(st.bufs[0], param);
  Tensor buf = a.momentum > 0 ? ensure(st.bufs[1], param) : Tensor();
  Tensor ga = a.centered ? ensure(st.bufs[2], param) : Tensor();
  ASC_KERNEL(param.device(), "RMSprop.step", rmsprop_update, a, param, grad, sq, buf, ga, row_mask);
}

}  // namespace asc::optim
