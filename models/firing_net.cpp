#include "models/firing_net.h"

namespace asc::models {

FiringClassifier::FiringClassifier(const FiringClassifierOptions& o) : nn::Module("FiringClassifier"), options(o) {
  auto gate = [&](nn::FiringOptions f) {
    return f.backward(o.backward())
        .surrogate(o.surrogate())
        .surrogate_width(o.surrogate_width())
        .threshold(o.threshold())
        .init(o.init());
  };
  hidden = register_module("hidden", std::make_shared<nn::FiringLinear>(
                                         gate(nn::FiringOptions(o.in_features(), o.hidden()).fan_out(o.fan_out()))));
  second = register_module(
      "second", std::make_shared<nn::FiringLinear>(gate(nn::FiringOptions(o.hidden(), o.fan_out()).channels(true))));
  readout = register_module("readout", std::make_shared<nn::Linear>(o.fan_out(), o.classes()));
}

Tensor FiringClassifier::forward(const Tensor& x) {
  Tensor h = (*hidden)(x);                          // (B, hidden, fan_out): neuron p's outputs
  if (options.fan_out() == 1) h = h.unsqueeze(-1);  // with α = 1 the layer drops its last dimension: (B, hidden, 1)
  Tensor g = (*second)(h);                          // (B, fan_out): neuron g read output g of every hidden neuron
  return (*readout)(g);                             // (B, classes)
}

FiringTokenModel::FiringTokenModel(const FiringTokenModelOptions& o) : nn::Module("FiringTokenModel"), options(o) {
  embed = register_module("embed", std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(o.vocab(), o.neurons())
                                                                             .ssm_rank(o.ssm_rank())
                                                                             .ssm(o.ssm())
                                                                             .backward(o.backward())
                                                                             .threshold(o.threshold())));
  readout = register_module("readout", std::make_shared<nn::Linear>(o.neurons(), o.vocab()));
}

Tensor FiringTokenModel::forward(const Tensor& tokens) {
  return (*readout)((*embed)(tokens));  // (B, T, neurons) -> (B, T, vocab)
}

}  // namespace asc::models
