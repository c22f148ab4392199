#pragma once
// Custom differentiable ops, the way users add their own: a struct with static forward and backward and a
// context for saved tensors (the libtorch autograd::Function<T> shape).
//
//   struct Cube : asc::autograd::Function<Cube> {
//     static asc::Tensor forward(asc::autograd::Context& ctx, const asc::Tensor& x) {
//       ctx.save_for_backward({x});
//       return x * x * x;
//     }
//     static asc::TensorList backward(asc::autograd::Context& ctx, const asc::TensorList& g) {
//       const asc::Tensor& x = ctx.saved()[0];
//       return {g[0] * x * x * 3.0};   // one gradient per Tensor argument of forward
//     }
//   };
//   asc::Tensor y = Cube::apply(x);
//
// forward runs with grad mode off; backward receives one gradient per output and returns one per Tensor
// argument of forward (an undefined Tensor for "no gradient").
#include <any>
#include <map>
#include <string>
#include <type_traits>

#include "autograd/node.h"

namespace asc::autograd {

class Context {
 public:
  void save_for_backward(const TensorList& ts) {
    saved_.clear();
    for (const Tensor& t : ts) saved_.emplace_back(t, "custom Function");
  }
  // The saved tensors (throws if one was modified in place since it was saved).
  TensorList saved() const {
    TensorList out;
    for (const auto& s : saved_) out.push_back(s.get());
    return out;
  }
  bool needs_input_grad(size_t i) const { return i < needs_.size() && needs_[i]; }
  // Non-tensor values for backward: ctx.data["alpha"] = 0.5; std::any_cast<double>(ctx.data["alpha"]).
  std::map<std::string, std::any> data;

 private:
  template <class T>
  friend struct Function;
  std::vector<SavedTensor> saved_;
  std::vector<bool> needs_;
};

template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    auto ctx = std::make_shared<Context>();
    TensorList inputs;
    (collect(inputs, args), ...);
    for (const Tensor& t : inputs) ctx->needs_.push_back(t.requires_grad());
    using Ret = decltype(Derived::forward(*ctx, std::forward<Args>(args)...));
    Ret result;
    {
      NoGradGuard ng;
      result = Derived::forward(*ctx, std::forward<Args>(args)...);
    }
    TensorList outputs;
    if constexpr (std::is_same_v<std::decay_t<Ret>, Tensor>)
      outputs = {result};
    else
      outputs = result;
    if (needs_grad(inputs)) {
      // Outputs that alias an input (returned as is) get a fresh handle so the input's history is kept.
      for (auto& o : outputs)
        for (const Tensor& in : inputs)
          if (o.is_same(in)) o = o.detach();
      const size_t n_in = inputs.size();
      record(typeid(Derived).name(), inputs, outputs, [ctx, n_in](const TensorList& g) -> TensorList {
        TensorList grads = Derived::backward(*ctx, g);
        ASC_CHECK(grads.size() == n_in, "custom Function backward returned {} gradients for {} tensor inputs",
                  grads.size(), n_in);
        return grads;
      });
      if constexpr (std::is_same_v<std::decay_t<Ret>, Tensor>)
        result = outputs[0];
      else
        result = outputs;
    }
    return result;
  }

 private:
  template <class A>
  static void collect(TensorList& inputs, const A& a) {
    if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) inputs.push_back(a);
  }
};

}  // namespace asc::autograd
