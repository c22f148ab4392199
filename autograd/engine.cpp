// The backward engine: dependency counting over the reachable graph, then a ready queue, so every node runs
// exactly once, after all gradients flowing into it have been summed (Kahn's topological order).
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "autograd/anomaly.h"
#include "autograd/node.h"
#include "core/format.h"
#include "core/profiler.h"

namespace asc {

namespace {
thread_local bool g_grad_enabled = true;
}
bool GradMode::is_enabled() { return g_grad_enabled; }
void GradMode::set_enabled(bool enabled) { g_grad_enabled = enabled; }

namespace autograd {

// ---- nodes --------------------------------------------------------------------------------------------------

TensorList FunctionNode::apply(const TensorList& grad_outputs) {
  ASC_CHECK(fn_ != nullptr,
            "backward: trying to run backward through '{}' a second time; its saved tensors were freed after the "
            "first backward (pass retain_graph = true to keep them)",
            name_);
  return fn_(grad_outputs);
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf)
    : Node("AccumulateGrad", {}, {OutputMeta{leaf->shape, leaf->dtype, leaf->storage->device()}}), leaf_(leaf) {}

TensorList AccumulateGrad::apply(const TensorList& grad_outputs) {
  auto leaf = leaf_.lock();
  if (!leaf) return {};
  Tensor g = grad_outputs[0];
  for (auto& h : hooks_) {
    Tensor r = h(g);
    if (r.defined()) g = r;
  }
  if (!leaf->grad) {
    // The incoming gradient becomes .grad itself when nothing else can reach it, as PyTorch's AccumulateGrad steals
    // it: referenced only by the engine's buffer (grad_outputs) and g here, a contiguous tensor that owns its whole
    // storage, the leaf's dtype. Anything else — a gradient another edge or a capture also holds, a view of a larger
    // gradient, the user's seed, a hook's result — is copied.
    const TensorImpl& gi = *g.impl();
    const bool owned = g.impl_ptr().use_count() == 2 && grad_outputs[0].impl() == g.impl() &&
                       gi.storage.use_count() == 1 && gi.offset == 0 && g.is_contiguous() && !gi.grad_fn &&
                       gi.dtype == leaf->dtype &&
                       gi.storage->nbytes() == static_cast<size_t>(g.numel()) * dtype_size(gi.dtype);
    leaf->grad = owned ? g.detach().impl_ptr() : g.detach().clone().impl_ptr();
  } else {
    leaf->grad = (Tensor(leaf->grad) + g).impl_ptr();
  }
  if (!post_hooks_.empty()) {
    const Tensor t(leaf);
    for (auto& h : post_hooks_) h(t);
  }
  return {};
}

SavedTensor::SavedTensor(const Tensor& t, const char* op) : op_(op) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.impl()->storage->version();
}

const Tensor& SavedTensor::get() const {
  if (data_.defined()) {
    uint64_t now = data_.impl()->storage->version();
    ASC_CHECK(now == version_,
              "backward of '{}': a tensor of shape {} saved for the gradient was modified in place after it was "
              "saved (version {} -> {}); use an out-of-place op or clone() before modifying it",
              op_, data_.shape(), version_, now);
  }
  return data_;
}

// ---- recording ----------------------------------------------------------------------------------------------

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  if (!impl->grad_accumulator) impl->grad_accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
  return {impl->grad_accumulator, 0};
}

void set_history(const TensorList& outputs, const std::shared_ptr<Node>& node) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || !is_floating(outputs[i].dtype())) continue;
    outputs[i].impl()->grad_fn = node;
    outputs[i].impl()->output_nr = static_cast<uint32_t>(i);
  }
}

std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return nullptr;
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  std::vector<OutputMeta> metas;
  metas.reserve(outputs.size());
  for (const Tensor& o : outputs) metas.push_back({o.shape(), o.dtype(), o.device()});
  auto node = std::make_shared<FunctionNode>(name, std::move(edges), std::move(metas), std::move(fn));
  if (anomaly_enabled()) [[unlikely]] {
    node->set_creation_context(anomaly_creation_context());
    for (size_t i = 0; i < outputs.size(); ++i)
      ASC_CHECK(all_finite(outputs[i]), "anomaly: the forward of '{}' produced NaN/Inf in output {} (shape {}); {}",
                name, i, outputs[i].shape(), node->creation_context());
  }
  set_history(outputs, node);
  return node;
}

// ---- the engine ---------------------------------------------------------------------------------------------

namespace {

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? slot + g : g; }

}  // namespace

// One backward pass. Per-node state (dependency count, gradient buffer, visited flag) lives in the nodes and is
// reset when the pass ends, also when it ends by an exception.
struct GraphTask {
  using Slot = Node::PassSlot;
  std::vector<std::shared_ptr<Node>> nodes;  // every reachable node; also keeps them alive during the pass
  std::unordered_map<Node*, Slot> nested;    // slots of nodes owned by an enclosing pass
  // autograd::grad(): capture gradients arriving at these (node, output_nr) instead of accumulating into leaves.
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  TensorList captured;
  bool accumulate_leaves = true;

  ~GraphTask() {
    for (auto& n : nodes)
      if (n->pass_owner_ == this) {
        n->pass_owner_ = nullptr;
        n->pass_slot_ = Slot{};
      }
  }

  Slot& slot(Node* n) { return n->pass_owner_ == this ? n->pass_slot_ : nested[n]; }
  bool visited(Node* n) const { return n->pass_owner_ == this || nested.count(n) > 0; }

  void visit(const std::shared_ptr<Node>& n) {
    if (n->pass_owner_ == nullptr) n->pass_owner_ = this;
    slot(n.get()).buffer.resize(n->num_outputs());
    nodes.push_back(n);
  }

  void run(const std::vector<Edge>& roots, const TensorList& grad_roots, bool retain_graph) {
    // 1. Count, for every reachable node, how many edges point at it.
    for (const Edge& e : roots)
      if (e.fn && !visited(e.fn.get())) visit(e.fn);
    for (size_t i = 0; i < nodes.size(); ++i) {  // `nodes` grows while we walk it: a breadth-first traversal
      Node* n = nodes[i].get();
      for (const Edge& e : n->next_edges()) {
        if (!e.fn) continue;
        if (!visited(e.fn.get())) visit(e.fn);
        slot(e.fn.get()).dependencies += 1;
      }
    }
    // 2. Seed the roots' buffers; roots nothing else points at are ready.
    for (size_t i = 0; i < roots.size(); ++i)
      if (roots[i].fn) accumulate(slot(roots[i].fn.get()).buffer[roots[i].input_nr], grad_roots[i]);
    std::vector<Node*> ready;
    for (const Edge& e : roots)
      if (e.fn && slot(e.fn.get()).dependencies == 0 &&
          std::find(ready.begin(), ready.end(), e.fn.get()) == ready.end())
        ready.push_back(e.fn.get());

    // 3. Run nodes whose incoming gradients are complete.
    NoGradGuard no_grad;  // backward formulas build no graph (no double backward)
    while (!ready.empty()) {
      Node* node = ready.back();
      ready.pop_back();
      TensorList grads = std::move(slot(node).buffer);
      slot(node).buffer.clear();

      bool any = false;
      for (auto& g : grads) any |= g.defined();
      for (auto& [nr, hook] : node->pre_hooks())
        if (grads[nr].defined()) {
          Tensor r = hook(grads[nr]);
          if (r.defined()) grads[nr] = r;
        }
      if (!captures.empty())
        if (auto it = captures.find(node); it != captures.end())
          for (auto [nr, slot] : it->second)
            if (grads[nr].defined()) accumulate(captured[slot], grads[nr]);

      TensorList input_grads;
      if (any && !(node->is_accumulate_grad() && !accumulate_leaves)) {
        for (size_t i = 0; i < grads.size(); ++i)
          if (!grads[i].defined()) {
            const OutputMeta& m = node->outputs()[i];
            grads[i] = zeros(m.shape, {.dtype = m.dtype, .device = m.device});
          }
        {
          // the profiler's range for this node: its kernels nest inside, its self time is autograd's glue
          std::optional<profiler::Range> range;
          if (profiler::detail::recording()) [[unlikely]]
            range.emplace(node->name() + " backward");
          input_grads = node->apply(grads);
        }
        if (anomaly_enabled()) [[unlikely]]
          for (size_t i = 0; i < input_grads.size(); ++i)
            ASC_CHECK(
                all_finite(input_grads[i]),
                "anomaly: the backward of '{}' returned NaN/Inf in the gradient of input {} (shape {}); {}",
                node->name(), i, input_grads[i].shape(),
                node->creation_context().empty() ? "created before anomaly mode was on" : node->creation_context());
      }
      if (!retain_graph) node->release();

      const auto& edges = node->next_edges();
      ASC_CHECK(input_grads.empty() || input_grads.size() == edges.size(),
                "backward of '{}': returned {} gradients for {} inputs", node->name(), input_grads.size(),
                edges.size());
      for (size_t i = 0; i < edges.size(); ++i) {
        const Edge& e = edges[i];
        if (!e.fn) continue;
        if (i < input_grads.size() && input_grads[i].defined()) {
          const OutputMeta& m = e.fn->outputs()[e.input_nr];
          ASC_CHECK(input_grads[i].shape() == m.shape,
                    "backward of '{}': gradient for input {} has shape {}, expected {}", node->name(), i,
                    input_grads[i].shape(), m.shape);
          accumulate(slot(e.fn.get()).buffer[e.input_nr], input_grads[i]);
        }
        if (--slot(e.fn.get()).dependencies == 0) ready.push_back(e.fn.get());
      }
    }
  }
};

namespace {

std::vector<Edge> root_edges(const TensorList& roots, const TensorList& grad_roots, TensorList& seeds) {
  ASC_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: got {} gradients for {} outputs",
            grad_roots.size(), roots.size());
  std::vector<Edge> edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    ASC_CHECK(r.defined() && r.requires_grad(),
              "backward: output {} does not require grad and has no grad_fn (was it computed under NoGradGuard, "
              "or from tensors without requires_grad?)",
              i);
    Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!g.defined()) {
      ASC_CHECK(r.numel() == 1,
                "backward: a gradient must be given for a non-scalar output (shape {}); only one-element outputs "
                "get an implicit gradient of 1",
                r.shape());
      g = ones(r.shape(), r.options());
    }
    ASC_CHECK(g.shape() == r.shape(), "backward: gradient shape {} does not match output shape {}", g.shape(),
              r.shape());
    ASC_CHECK(g.device() == r.device() && g.dtype() == r.dtype(),
              "backward: gradient dtype/device ({}, {}) differs from the output's ({}, {})", g.dtype(), g.device(),
              r.dtype(), r.device());
    edges.push_back(gradient_edge(r));
    seeds.push_back(g);
  }
  return edges;
}

}  // namespace

namespace {
// The callbacks queued during the backward() running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;
}  // namespace

void queue_callback(std::function<void()> fn) {
  ASC_CHECK(t_callbacks != nullptr, "queue_callback: only callable during backward() (from a gradient hook)");
  t_callbacks->push_back(std::move(fn));
}

void register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor& leaf)> hook) {
  ASC_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(),
            "register_post_accumulate_grad_hook: expected a leaf tensor that requires grad");
  gradient_edge(leaf);  // creates the AccumulateGrad node
  static_cast<AccumulateGrad*>(leaf.impl()->grad_accumulator.get())->post_hooks().push_back(std::move(hook));
}

void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  TensorList seeds;
  auto edges = root_edges(roots, grad_roots, seeds);
  std::vector<std::function<void()>> callbacks;
  struct Restore {
    std::vector<std::function<void()>>* prev;
    ~Restore() { t_callbacks = prev; }
  } restore{t_callbacks};
  t_callbacks = &callbacks;
  GraphTask task;
  task.run(edges, seeds, retain_graph);
  for (size_t i = 0; i < callbacks.size(); ++i) {  // a callback may queue more (and grow the vector)
    auto fn = std::move(callbacks[i]);
    fn();
  }
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph) {
  TensorList seeds;
  auto edges = root_edges(outputs, grad_outputs, seeds);
  GraphTask task;
  task.accumulate_leaves = false;
  task.captured.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASC_CHECK(inputs[i].requires_grad(), "autograd::grad: input {} does not require grad", i);
    Edge e = gradient_edge(inputs[i]);
    task.captures[e.fn.get()].push_back({e.input_nr, i});
  }
  task.run(edges, seeds, retain_graph);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!task.captured[i].defined()) task.captured[i] = zeros_like(inputs[i]);
  return task.captured;
}

}  // namespace autograd

// ---- Tensor's autograd methods ------------------------------------------------------------------------------

Tensor& Tensor::set_requires_grad(bool r) {
  ASC_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating-point tensors can require grad (got {})",
            dtype());
  ASC_CHECK(is_leaf(), "set_requires_grad: can only be changed on a leaf tensor; use detach() first");
  impl_->requires_grad = r;
  return *this;
}

void Tensor::retain_grad() {
  ASC_CHECK(requires_grad(), "retain_grad: tensor does not require grad");
  if (is_leaf() || impl_->retains_grad) return;
  impl_->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  impl_->grad_fn->add_pre_hook(impl_->output_nr, [weak](const Tensor& g) {
    if (auto p = weak.lock()) p->grad = p->grad ? (Tensor(p->grad) + g).impl_ptr() : g.clone().impl_ptr();
    return Tensor();
  });
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) {
  ASC_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not require grad");
  if (is_leaf()) {
    autograd::gradient_edge(*this);  // creates the AccumulateGrad node
    static_cast<autograd::AccumulateGrad*>(impl_->grad_accumulator.get())->hooks().push_back(std::move(hook));
  } else {
    impl_->grad_fn->add_pre_hook(impl_->output_nr, std::move(hook));
  }
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, grad.defined() ? TensorList{grad} : TensorList{}, retain_graph);
}

Tensor Tensor::detach() const {
  checked("detach");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

}  // namespace asc
