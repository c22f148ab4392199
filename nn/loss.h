#pragma once
// Loss modules: CrossEntropyLoss (ignore_index, label smoothing), MSELoss and BCEWithLogitsLoss (numerically
// stable, optional pos_weight), each with a reduction (mean / sum / none). Called as loss(input, target); the
// forward hooks see `input`.
//
//   asc::nn::CrossEntropyLoss ce(asc::nn::CrossEntropyLossOptions().ignore_index(0).label_smoothing(0.1));
//   asc::Tensor l = ce(logits, targets);                 // logits (N, C) or (N, C, d...), targets int64 (N) / (N,
//   d...) asc::nn::BCEWithLogitsLoss bce(asc::nn::BCEWithLogitsLossOptions().pos_weight(asc::full({C}, 3.0)));
//   asc::Tensor b = bce(logits, labels);                 // logits, labels (..., C) floating
#include "nn/module.h"
#include "ops/nn_functional.h"

namespace asc::nn {

struct CrossEntropyLossOptions {
  ASC_ARG(int64_t, ignore_index) = -100;
  ASC_ARG(double, label_smoothing) = 0.0;  // in [0, 1]
  ASC_ARG(Reduction, reduction) = Reduction::Mean;
};

// asc::cross_entropy as a module: mean over the non-ignored targets (0 when all are ignored).
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(const CrossEntropyLossOptions& options = {});
  Tensor forward(const Tensor& logits, const Tensor& target);
  Tensor operator()(const Tensor& logits, const Tensor& target) { return forward(logits, target); }
  std::string extra_repr() const override;
  CrossEntropyLossOptions options;
};

struct NLLLossOptions {
  ASC_ARG(Tensor, weight);  // (C) per-class weights; undefined: every class 1
  ASC_ARG(int64_t, ignore_index) = -100;
  ASC_ARG(Reduction, reduction) = Reduction::Mean;
};

// asc::nll_loss as a module, on log-probabilities (a LogSoftmax's output). The class weights are a buffer.
class NLLLoss : public Module {
 public:
  explicit NLLLoss(const NLLLossOptions& options = {});
  Tensor forward(const Tensor& log_probs, const Tensor& target);
  Tensor operator()(const Tensor& log_probs, const Tensor& target) { return forward(log_probs, target); }
  std::string extra_repr() const override;
  NLLLossOptions options;
  Tensor weight;  // a buffer when given
};

// (input - target)^2, reduced.
class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean);
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;
};

// Binary cross-entropy on logits x with targets y in [0, 1] (soft labels allowed) and positive-class weight p:
//   l = -(p y log sigma(x) + (1 - y) log(1 - sigma(x))) = (1 - y) x + (1 + (p - 1) y) softplus(-x),
// where softplus(-x) = max(-x, 0) + log1p(exp(-|x|)) never overflows (p = 1: max(x,0) - x y + log1p(exp(-|x|))).
// Differentiable in x (and in y and pos_weight).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& pos_weight = {},
                                        Reduction reduction = Reduction::Mean);

struct BCEWithLogitsLossOptions {
  ASC_ARG(Tensor, pos_weight);  // broadcastable to the input (typically (C) for inputs (..., C)); undefined: 1
  ASC_ARG(Reduction, reduction) = Reduction::Mean;
};

class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(const BCEWithLogitsLossOptions& options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  BCEWithLogitsLossOptions options;
  Tensor pos_weight;  // a buffer when given
};

}  // namespace asc::nn
