#pragma once
// Gradient checkpointing: run `fn` without keeping its intermediate activations; during backward, re-run it
// with grad enabled (restoring the default generator's state so dropout masks match) and backpropagate through
// the recomputed segment. Trades compute for memory; gradients equal those without checkpointing.
//
//   TensorList out = asc::autograd::checkpoint([&](const TensorList& in) { return TensorList{block(in[0])}; }, {x});
#include <functional>

#include "autograd/node.h"

namespace asc::autograd {

using SegmentFn = std::function<TensorList(const TensorList&)>;
TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs);

}  // namespace asc::autograd
