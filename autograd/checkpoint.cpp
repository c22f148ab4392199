#include "autograd/checkpoint.h"

#include "core/error.h"
#include "core/format.h"
#include "core/generator.h"

namespace asc::autograd {

namespace {
// Puts the default generator back to `state` when the scope ends, also when the recomputation throws.
struct RestoreGenerator {
  Generator::State state;
  ~RestoreGenerator() { default_generator().set_state(state); }
};
}  // namespace

TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs) {
  ASC_CHECK(fn != nullptr, "checkpoint: empty segment function");
  Generator::State rng = default_generator().state();
  TensorList outputs;
  {
    NoGradGuard ng;
    outputs = fn(inputs);
  }
  std::vector<Shape> shapes;
  for (const Tensor& o : outputs) shapes.push_back(o.defined() ? o.shape() : Shape{});
  if (!needs_grad(inputs)) return outputs;
  // Only floating outputs take part in the graph; parameters used inside fn are reached through the recomputed
  // graph (their gradients accumulate when the recomputed segment is backpropagated).
  record("checkpoint", inputs, outputs, [fn, inputs, rng, shapes](const TensorList& g) -> TensorList {
    TensorList detached;
    for (const Tensor& t : inputs) {
      Tensor d = t.detach();
      if (t.requires_grad()) d.set_requires_grad(true);
      detached.push_back(d);
    }
    TensorList outs;
    {
      RestoreGenerator restore{default_generator().state()};
      default_generator().set_state(rng);
      EnableGradGuard eg;
      outs = fn(detached);
    }
    // The recomputation must reproduce the forward's outputs (a segment that depends on state other than its
    // inputs and the default generator may not): the gradients are indexed by output.
    ASC_CHECK(outs.size() == shapes.size() && g.size() == shapes.size(),
              "checkpoint: the recomputed segment returned {} outputs, the forward returned {}", outs.size(),
              shapes.size());
    for (size_t i = 0; i < outs.size(); ++i)
      ASC_CHECK((outs[i].defined() ? outs[i].shape() : Shape{}) == shapes[i],
                "checkpoint: output {} of the recomputed segment has shape {}, the forward's had {}", i,
                outs[i].defined() ? outs[i].shape() : Shape{}, shapes[i]);
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
