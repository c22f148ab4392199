#include "nn/loss.h"

#include "core/error.h"
#include "core/format.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {
const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Sum: return "sum";
    case Reduction::Mean: return "mean";
  }
  return "?";
}

Tensor reduce(const Tensor& l, Reduction r) {
  switch (r) {
    case Reduction::None: return l;
    case Reduction::Sum: return sum(l);
    case Reduction::Mean: return mean(l);
  }
  ASC_THROW("loss: unknown reduction {}", static_cast<int>(r));
}

Shape shape_of(const Tensor& x) { return x.defined() ? x.shape() : Shape{}; }

// True when `s` broadcasts to `target` (aligned at the trailing dims, each size equal or 1).
bool broadcasts_to(const Shape& s, const Shape& target) {
  if (s.size() > target.size()) return false;
  for (int i = 1; i <= s.size(); ++i)
    if (s[s.size() - i] != 1 && s[s.size() - i] != target[target.size() - i]) return false;
  return true;
}
}  // namespace

// ---- CrossEntropyLoss ---------------------------------------------------------------------------------------------

CrossEntropyLoss::CrossEntropyLoss(const CrossEntropyLossOptions& o) : Module("CrossEntropyLoss"), options(o) {
  ASC_CHECK(o.label_smoothing() >= 0.0 && o.label_smoothing() <= 1.0,
            "CrossEntropyLoss: label_smoothing must be in [0, 1], got {}", o.label_smoothing());
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  ASC_CHECK(logits.defined() && target.defined(), "CrossEntropyLoss: undefined logits or target");
  return call_with_hooks(logits, [&](const Tensor& in) {
    return cross_entropy(in, target,
                         {.ignore_index = options.ignore_index(),
                          .label_smoothing = options.label_smoothing(),
                          .reduction = options.reduction()});
  });
}

std::string CrossEntropyLoss::extra_repr() const {
  return fmt::format("ignore_index={}, label_smoothing={}, reduction={}", options.ignore_index(),
                     options.label_smoothing(), reduction_name(options.reduction()));
}

// ---- NLLLoss ------------------------------------------------------------------------------------------------------

NLLLoss::NLLLoss(const NLLLossOptions& o) : Module("NLLLoss"), options(o) {
  if (o.weight().defined()) {
    ASC_CHECK(is_floating(o.weight().dtype()) && o.weight().dim() == 1,
              "NLLLoss: weight must be a floating (C) tensor, got {} {}", o.weight().dtype(), o.weight().shape());
    weight = register_buffer("weight", o.weight());
  }
}

Tensor NLLLoss::forward(const Tensor& log_probs, const Tensor& target) {
  ASC_CHECK(log_probs.defined() && target.defined(), "NLLLoss: undefined input or target");
  return call_with_hooks(log_probs, [&](const Tensor& in) {
    return nll_loss(in, target,
                    {.weight = weight, .ignore_index = options.ignore_index(), .reduction = options.reduction()});
  });
}

std::string NLLLoss::extra_repr() const {
  std::string s =
      fmt::format("ignore_index={}, reduction={}", options.ignore_index(), reduction_name(options.reduction()));
  if (weight.defined()) s += fmt::format(", weight={}", weight.shape());
  return s;
}

// ---- MSELoss ------------------------------------------------------------------------------------------------------

MSELoss::MSELoss(Reduction r) : Module("MSELoss"), reduction(r) {}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  ASC_CHECK(input.defined() && target.defined(), "MSELoss: undefined input or target");
  ASC_CHECK(input.shape() == target.shape(), "MSELoss: input {} and target {} must have the same shape", input.shape(),
            target.shape());
  return call_with_hooks(input, [&](const Tensor& in) { return mse_loss(in, target, reduction); });
}

std::string MSELoss::extra_repr() const { return fmt::format("reduction={}", reduction_name(reduction)); }

// ---- BCE with logits ----------------------------------------------------------------------------------------------

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& pos_weight,
                                        Reduction reduction) {
  ASC_CHECK(input.defined() && target.defined(), "binary_cross_entropy_with_logits: undefined input or target");
  ASC_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()),
            "binary_cross_entropy_with_logits: input and target must be floating, got {} and {}", input.dtype(),
            target.dtype());
  ASC_CHECK(input.shape() == target.shape(),
            "binary_cross_entropy_with_logits: input {} and target {} must have the same shape", input.shape(),
            target.shape());
  ASC_CHECK(
      !pos_weight.defined() || (is_floating(pos_weight.dtype()) && broadcasts_to(pos_weight.shape(), input.shape())),
      "binary_cross_entropy_with_logits: pos_weight {} ({}) must be floating and broadcastable to the input {}",
      shape_of(pos_weight), pos_weight.defined() ? dtype_name(pos_weight.dtype()) : "undefined", input.shape());
  const Tensor& x = input;
  const Tensor y = target.dtype() == x.dtype() ? target : target.to(x.dtype());
  // softplus switches to the identity above `threshold`; its error there is log1p(exp(-threshold)), below the
  // dtype's resolution with these thresholds.
  const double thr = x.dtype() == kFloat64 ? 40.0 : 20.0;
  // l = softplus(x) - x y: no exp of a positive number anywhere, and the gradient sigmoid(x) - y is exact
  // everywhere (unlike the max(x,0) / |x| form, whose pieces have a kink at 0).
  Tensor l = softplus(x, 1.0, thr) - x * y;
  if (pos_weight.defined()) {
    const Tensor pw = pos_weight.dtype() == x.dtype() ? pos_weight : pos_weight.to(x.dtype());
    // + (p - 1) y softplus(-x) = - (p - 1) y log sigma(x)
    l = l + (pw - 1.0) * y * softplus(-x, 1.0, thr);
  }
  return reduce(l, reduction);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(const BCEWithLogitsLossOptions& o) : Module("BCEWithLogitsLoss"), options(o) {
  if (o.pos_weight().defined()) {
    ASC_CHECK(is_floating(o.pos_weight().dtype()), "BCEWithLogitsLoss: pos_weight must be floating, got {}",
              o.pos_weight().dtype());
    pos_weight = register_buffer("pos_weight", o.pos_weight());
  }
}

Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  ASC_CHECK(input.defined() && target.defined(), "BCEWithLogitsLoss: undefined input or target");
  ASC_CHECK(input.shape() == target.shape(), "BCEWithLogitsLoss: input {} and target {} must have the same shape",
            input.shape(), target.shape());
  ASC_CHECK(!pos_weight.defined() || broadcasts_to(pos_weight.shape(), input.shape()),
            "BCEWithLogitsLoss: pos_weight {} does not broadcast to the input {}", shape_of(pos_weight), input.shape());
  return call_with_hooks(input, [&](const Tensor& in) {
    return binary_cross_entropy_with_logits(in, target, pos_weight, options.reduction());
  });
}

std::string BCEWithLogitsLoss::extra_repr() const {
  std::string s = fmt::format("reduction={}", reduction_name(options.reduction()));
  if (pos_weight.defined()) s += fmt::format(", pos_weight={}", pos_weight.shape());
  return s;
}

}  // namespace asc::nn
