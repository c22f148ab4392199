#pragma once
// The dynamic graph. Each differentiable op that sees an input requiring grad records a Node: it keeps edges
// to the nodes that produced its inputs (micrograd's "_prev"), and a backward function mapping the gradients
// of its outputs to the gradients of its inputs (micrograd's "_backward"). Leaves requiring grad end in an
// AccumulateGrad node that adds into `.grad`. The engine (engine.cpp) walks the graph in topological order.
//
// How an op records itself (see ops/elementwise.cpp for many examples):
//
//   Tensor exp(const Tensor& x) {
//     Tensor y = ...forward kernel...;
//     if (autograd::needs_grad({x}))
//       autograd::record("exp", {x}, {y}, [ys = autograd::SavedTensor(y)](const TensorList& g) -> TensorList {
//         return {g[0] * ys.get()};   // one gradient per input; an undefined Tensor means "no gradient"
//       });
//     return y;
//   }
//
// Backward functions run with grad mode off and receive a defined gradient for every output (zeros are
// filled in for outputs that got none). They must return gradients with exactly the inputs' shapes.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/tensor.h"

namespace asc::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: the input needs no gradient
  uint32_t input_nr = 0;     // which output of `fn` the input was
};

// Shape/dtype/device of one output, so the engine can make zeros for outputs that received no gradient.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;
using GradHook = std::function<Tensor(const Tensor&)>;

class Node {
 public:
  Node(std::string name, std::vector<Edge> next_edges, std::vector<OutputMeta> outputs)
      : name_(std::move(name)), next_edges_(std::move(next_edges)), outputs_(std::move(outputs)) {}
  virtual ~Node() = default;

  const std::string& name() const { return name_; }
  // Where the node was created ("op #N, created in Module > Module"); recorded in anomaly mode only.
  const std::string& creation_context() const { return creation_context_; }
  void set_creation_context(std::string c) { creation_context_ = std::move(c); }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  size_t num_outputs() const { return outputs_.size(); }

  // Gradients of the outputs -> gradients of the inputs (one per next edge).
  virtual TensorList apply(const TensorList& grad_outputs) = 0;
  // Frees what backward needed (saved tensors); called by the engine unless retain_graph.
  virtual void release() {}

  // Hooks on the gradient of output `output_nr` (tensor.register_hook / retain_grad on non-leaves).
  void add_pre_hook(uint32_t output_nr, GradHook hook) { pre_hooks_.push_back({output_nr, std::move(hook)}); }
  const std::vector<std::pair<uint32_t, GradHook>>& pre_hooks() const { return pre_hooks_; }

  virtual bool is_accumulate_grad() const { return false; }

 protected:
  std::string name_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks_;
  std::string creation_context_;

 private:
  // Bookkeeping of the backward pass visiting this node, kept here rather than in a hash map because the
  // engine's per-node cost is most of the cost of small ops. A nested pass (checkpointing runs backward inside
  // backward) that meets a node owned by the outer pass keeps its slot in a side table instead.
  friend struct GraphTask;
  struct PassSlot {
    int dependencies = 0;
    TensorList buffer;
  };
  struct GraphTask* pass_owner_ = nullptr;  // the pass using pass_slot_; a nested pass uses a side table
  PassSlot pass_slot_;
};

// The node of a recorded op: its backward is a closure; release() destroys the closure and with it every
// SavedTensor it captured, which is how graph memory is freed after backward.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, std::vector<Edge> next, std::vector<OutputMeta> outs, BackwardFn fn)
      : Node(std::move(name), std::move(next), std::move(outs)), fn_(std::move(fn)) {}
  TensorList apply(const TensorList& grad_outputs) override;
  void release() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
};

// Terminal node of a leaf that requires grad: runs the leaf's hooks and accumulates into `.grad`.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  TensorList apply(const TensorList& grad_outputs) override;
  std::vector<GradHook>& hooks() { return hooks_; }
  // Called with the leaf after its .grad has been updated (register_post_accumulate_grad_hook).
  using PostHook = std::function<void(const Tensor& leaf)>;
  std::vector<PostHook>& post_hooks() { return post_hooks_; }
  bool is_accumulate_grad() const override { return true; }

 private:
  std::weak_ptr<TensorImpl> leaf_;  // weak: the leaf owns this node, not the other way round
  std::vector<GradHook> hooks_;
  std::vector<PostHook> post_hooks_;
};

// A tensor kept for backward. It holds the data without the autograd history (so saving an op's own output
// creates no reference cycle) and the storage version at save time; get() throws if the tensor was modified
// in place since.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t, const char* op = "op");
  const Tensor& get() const;
  bool defined() const { return data_.defined(); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  const char* op_ = "op";
};

// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
inline bool needs_grad(const Tensor& a) { return needs_grad({&a}); }
inline bool needs_grad(const Tensor& a, const Tensor& b) { return needs_grad({&a, &b}); }
inline bool needs_grad(const Tensor& a, const Tensor& b, const Tensor& c) { return needs_grad({&a, &b, &c}); }
bool needs_grad(const TensorList& inputs);

// Records a node for `outputs` (produced from `inputs`) if needs_grad(inputs). Outputs that are not floating
// point (indices, masks) are attached but never receive gradients. Returns the node (or null).
std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn fn);

// The edge through which a gradient for `t` flows (creating the AccumulateGrad node of a leaf on demand).
Edge gradient_edge(const Tensor& t);

// Makes `outputs` the outputs of `node` (sets grad_fn / output_nr).
void set_history(const TensorList& outputs, const std::shared_ptr<Node>& node);

// Runs backward from `roots` with the given seed gradients (see Tensor::backward).
void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph = false);
// Calls hook(leaf) each time backward() has accumulated a gradient into leaf.grad() (leaves that require grad; not
// during autograd::grad, which leaves .grad alone). DistributedDataParallel starts its all-reduces from these.
void register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor& leaf)> hook);
// From inside a backward pass (a hook): runs fn after the whole graph has been processed, before backward() returns.
void queue_callback(std::function<void()> fn);

// Gradients of `outputs` w.r.t. `inputs` without touching any .grad (used by gradcheck and checkpointing).
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph = false);

}  // namespace asc::autograd
