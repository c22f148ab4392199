#include "autograd/checkpoint.h"

#include "core/generator.h"

namespace asc::autograd {

TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs) {
  Generator::State rng = default_generator().state();
  TensorList outputs;
  {
    NoGradGuard ng;
    outputs = fn(inputs);
  }
  if (!needs_grad(inputs)) return outputs;
  // Only floating outputs take part in the graph; parameters used inside fn are reached through the recomputed
  // graph (their gradients accumulate when the recomputed segment is backpropagated).
  record("checkpoint", inputs, outputs, [fn, inputs, rng](const TensorList& g) -> TensorList {
    TensorList detached;
    for (const Tensor& t : inputs) {
      Tensor d = t.detach();
      if (t.requires_grad()) d.set_requires_grad(true);
      detached.push_back(d);
    }
    Generator::State now = default_generator().state();
    default_generator().set_state(rng);
    TensorList outs;
    {
      EnableGradGuard eg;
      outs = fn(detached);
    }
    default_generator().set_state(now);
    TensorList roots, seeds;
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        seeds.push_back(g[i]);
      }
    if (!roots.empty()) backward(roots, seeds);  // accumulates into parameters and the detached inputs
    TensorList grads;
    for (const Tensor& d : detached) grads.push_back(d.requires_grad() ? d.grad() : Tensor());
    return grads;
  });
  return outputs;
}

}  // namespace asc::autograd
