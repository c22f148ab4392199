#pragma once
// Two small models built from firing layers (docs/firing.md), each a few dozen lines:
//
//   FiringClassifier: (B, d) -> two firing layers (the first with α outputs per neuron feeding the second, neuron g
//                     reading output g) -> a linear readout -> logits (B, classes).
//   FiringTokenModel: tokens (B, T) -> a FiringEmbedding (the index path) with the low-rank cross-path SSM over time
//                     -> a linear readout per position -> logits (B, T, vocab) (next-token prediction).
//
//   auto net = std::make_shared<asc::models::FiringClassifier>(asc::models::FiringClassifierOptions(784, 10));
//   asc::Tensor logits = net->forward(x);                                    // (B, 10)
//   opt.add_local_rule(asc::optim::rule_b(*net->hidden, {.eta_w = 1e-6, .r_target = 0.1, .w_min = -1}));
#include "nn/nn.h"

namespace asc::models {

struct FiringClassifierOptions {
  FiringClassifierOptions(int64_t in_features, int64_t classes) : in_features_(in_features), classes_(classes) {}
  ASC_ARG(int64_t, in_features);
  ASC_ARG(int64_t, classes);
  ASC_ARG(int64_t, hidden) = 256;                             // P of the first firing layer
  ASC_ARG(int64_t, fan_out) = 4;                              // its α = the second layer's neuron count
  ASC_ARG(GateBackward, backward) = GateBackward::Surrogate;  // the surrogate lets SP learn too
  ASC_ARG(std::string, surrogate) = "sigmoid";
  ASC_ARG(double, surrogate_width) = 4.0;
  ASC_ARG(double, threshold) = 0.0;
  ASC_ARG(nn::FiringInit, init) = nn::FiringInit::Signed;  // NonNegative: the weights rule A's ranges hold
};

class FiringClassifier : public nn::Module {
 public:
  explicit FiringClassifier(const FiringClassifierOptions& options);
  Tensor forward(const Tensor& x) override;  // (B, in_features) -> (B, classes)

  FiringClassifierOptions options;
  std::shared_ptr<nn::FiringLinear> hidden, second;  // hidden: dense, P = hidden, α = fan_out; second: channels
  std::shared_ptr<nn::Linear> readout;
};

struct FiringTokenModelOptions {
  FiringTokenModelOptions(int64_t vocab, int64_t neurons) : vocab_(vocab), neurons_(neurons) {}
  ASC_ARG(int64_t, vocab);
  ASC_ARG(int64_t, neurons);
  ASC_ARG(int64_t, ssm_rank) = 16;
  ASC_ARG(nn::SSMOptions, ssm) = nn::SSMOptions{.rms_norm = true};
  ASC_ARG(GateBackward, backward) = GateBackward::Surrogate;
  ASC_ARG(double, threshold) = 0.0;
};

class FiringTokenModel : public nn::Module {
 public:
  explicit FiringTokenModel(const FiringTokenModelOptions& options);
  Tensor forward(const Tensor& tokens) override;  // (B, T) int64 -> (B, T, vocab)

  FiringTokenModelOptions options;
  std::shared_ptr<nn::FiringEmbedding> embed;  // with the cross-path SSM
  std::shared_ptr<nn::Linear> readout;
};

}  // namespace asc::models
