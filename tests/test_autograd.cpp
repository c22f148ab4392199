// The autograd engine: graph shapes, accumulation, grad mode, hooks, custom functions, checkpointing,
// retain_graph and the in-place detection.
#include "testing.h"

using namespace asc;
using namespace asc::testing;

TEST_CASE("diamond graph: both paths are summed before the shared node runs") {
  Tensor x = tensor({2.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor a = x * 3.0;       // a = 3x
  Tensor b = a * a;         // b = 9x^2
  Tensor c = exp(a * 0.1);  // c = exp(0.3x)
  Tensor y = b + c;
  y.backward();
  double expected = 18.0 * 2.0 + 0.3 * std::exp(0.6);
  CHECK(x.grad().item<double>() == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("a tensor used several times, and accumulation across backward calls") {
  Tensor x = tensor({1.0, 2.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = (x * x * x).sum();  // 3x^2
  y.backward();
  check_close(x.grad(), {3, 12});
  Tensor z = (x * 2.0).sum();
  z.backward();  // accumulates into .grad
  check_close(x.grad(), {5, 14});
  x.zero_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE(".grad takes the incoming gradient without a copy only when nothing else can reach it") {
  // a fresh gradient that only the engine holds: .grad is that buffer (no copy); the hook sees it without keeping it
  Tensor x = randn({4, 3}, {.dtype = kFloat64, .requires_grad = true});
  const void* seen = nullptr;
  x.register_hook([&](const Tensor& g) {
    seen = g.raw_data();
    return Tensor();
  });
  sum(mul(x, x)).backward();
  CHECK(x.grad().raw_data() == seen);
  check_close(x.grad(), mul(x, 2.0).detach());
  // the user's seed reaches a leaf through a view: .grad is a copy, changing the seed later changes nothing
  Tensor w = randn({6}, {.dtype = kFloat64, .requires_grad = true});
  Tensor seed = ones({2, 3}, {.dtype = kFloat64});
  w.view({2, 3}).backward(seed);
  seed.mul_(5.0);
  check_close(w.grad(), std::vector<double>(6, 1.0), 0);
  // gradients that are slices of one buffer (cat's backward): each .grad its own storage
  Tensor a = randn({3}, {.dtype = kFloat64, .requires_grad = true}),
         b = randn({3}, {.dtype = kFloat64, .requires_grad = true});
  sum(mul(cat({a, b}, 0), tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {.dtype = kFloat64}))).backward();
  a.grad().mul_(0.0);
  check_close(b.grad(), {4, 5, 6}, 0);
  // one gradient sent to two leaves (add's backward passes it through to both): neither aliases the other
  Tensor c = randn({3}, {.dtype = kFloat64, .requires_grad = true}),
         d = randn({3}, {.dtype = kFloat64, .requires_grad = true});
  sum(mul(add(c, d), 3.0)).backward();
  c.grad().mul_(0.0);
  check_close(d.grad(), {3, 3, 3}, 0);
  // a hook that keeps the gradient it sees: .grad is a copy of it
  Tensor e = randn({2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor kept;
  e.register_hook([&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  sum(mul(e, 7.0)).backward();
  kept.mul_(0.0);
  check_close(e.grad(), {7, 7}, 0);
}

TEST_CASE("no-grad mode records nothing; detach cuts the graph") {
  Tensor w = ones({2}, {.requires_grad = true});
  {
    NoGradGuard ng;
    Tensor y = w * 2.0;
    CHECK(!y.requires_grad());
    CHECK(!y.grad_fn());
  }
  Tensor y = w * 2.0;
  CHECK(y.requires_grad());
  CHECK(y.grad_fn()->name() == "mul");
  Tensor d = y.detach();
  CHECK(!d.requires_grad());
  CHECK(d.shares_storage(y));
  Tensor z = (d * w).sum();
  z.backward();
  check_close(w.grad(), {2, 2});  // only the direct path, not through d
  check_error([&] { (ones({2}) * 2.0).sum().backward(); }, {"backward", "does not require grad"});
  check_error([&] { (w * 2.0).backward(); }, {"backward", "non-scalar"});
}

TEST_CASE("views propagate gradients") {
  Tensor x = randn64({3, 4}, true);
  check_grad(
      [](const TensorList& in) {
        const Tensor& t = in[0];
        return TensorList{t.transpose(0, 1).reshape({2, 6}) * 2.0 + t.slice(1, 1, 4, 2).sum() +
                          t.select(0, 1).unsqueeze(0).expand({2, 4}).sum() + t.narrow(0, 1, 2).flatten().sum()};
      },
      {x});
  check_grad(
      [](const TensorList& in) {
        return TensorList{in[0].permute({1, 0}).contiguous().view({12}).squeeze()};
      },
      {x});
  check_grad([](const TensorList& in) { return TensorList{in[0].to(kFloat32).to(kFloat64) * in[0]}; }, {x},
             {.eps = 1e-3, .atol = 1e-3, .rtol = 1e-3});
}

TEST_CASE("tensor hooks see and may replace the gradient; retain_grad keeps non-leaf grads") {
  Tensor x = tensor({1.0, 2.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor seen;
  Tensor h = x * 3.0;
  h.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return g * 10.0;  // replaces the gradient flowing on
  });
  h.retain_grad();
  (h * h).sum().backward();
  check_close(seen, {6, 12});
  check_close(h.grad(), {60, 120});   // retain_grad runs after the replacing hook (registered second)
  check_close(x.grad(), {180, 360});  // 10 * 2h * 3
  Tensor leaf = tensor({1.0}, {.dtype = kFloat64, .requires_grad = true});
  int calls = 0;
  leaf.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  (leaf * 2.0).sum().backward();
  CHECK(calls == 1);
  check_close(leaf.grad(), {2});
}

struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, double scale) {
    ctx.save_for_backward({x});
    ctx.data["scale"] = scale;
    return x * x * x * scale;
  }
  static TensorList backward(autograd::Context& ctx, const TensorList& g) {
    const Tensor x = ctx.saved()[0];
    double s = std::any_cast<double>(ctx.data["scale"]);
    return {g[0] * x * x * (3.0 * s)};
  }
};

// A custom function with two outputs and one input that needs no gradient.
struct SplitScale : autograd::Function<SplitScale> {
  static TensorList forward(autograd::Context& ctx, const Tensor& x, const Tensor& w) {
    ctx.save_for_backward({w});
    return {x * w, x * 2.0};
  }
  static TensorList backward(autograd::Context& ctx, const TensorList& g) {
    Tensor w = ctx.saved()[0];
    CHECK(ctx.needs_input_grad(0));
    CHECK(!ctx.needs_input_grad(1));
    return {g[0] * w + g[1] * 2.0, Tensor()};
  }
};

TEST_CASE("custom Function: forward without graph, user backward, gradcheck") {
  Tensor x = randn64({5}, true);
  Tensor y = Cube::apply(x, 0.5);
  CHECK(y.grad_fn());
  check_grad([](const TensorList& in) { return TensorList{Cube::apply(in[0], 0.5)}; }, {x});
  Tensor w = randn64({5}, false, 3);
  check_grad([&](const TensorList& in) { return SplitScale::apply(in[0], w); }, {x});
  // only one output used: the other gets zeros filled in by the engine
  Tensor x2 = randn64({5}, true, 9);
  SplitScale::apply(x2, w)[1].sum().backward();
  check_close(x2.grad(), {2, 2, 2, 2, 2});
}

TEST_CASE("gradient checkpointing gives the same gradients and replays randomness") {
  Tensor x = randn64({4, 3}, true, 1);
  Tensor w1 = randn64({3, 5}, true, 2), w2 = randn64({5, 2}, true, 3);
  auto block = [&](const TensorList& in) {
    Tensor noise = rand(in[0].shape(), {.dtype = kFloat64});  // from the default generator
    return TensorList{tanh(matmul(in[0] * noise, w1)).matmul(w2)};
  };
  manual_seed(11);
  block({x})[0].pow(2.0).sum().backward();
  Tensor gx = x.grad().clone(), g1 = w1.grad().clone(), g2 = w2.grad().clone();
  x.zero_grad();
  w1.zero_grad();
  w2.zero_grad();
  manual_seed(11);
  TensorList out = autograd::checkpoint(block, {x});
  out[0].pow(2.0).sum().backward();
  check_close(x.grad(), gx, 1e-12, 1e-10);
  check_close(w1.grad(), g1, 1e-12, 1e-10);
  check_close(w2.grad(), g2, 1e-12, 1e-10);
}

TEST_CASE("a saved tensor modified in place is reported at backward") {
  Tensor a = tensor({1.0, 2.0}, {.dtype = kFloat64});  // does not require grad, so in-place is allowed
  Tensor w = tensor({3.0, 4.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = (a * w).sum();  // saves a for dL/dw
  a.mul_(2.0);
  check_error([&] { y.backward(); }, {"mul", "modified in place", "version 0 -> 1"});
}

TEST_CASE("retain_graph: a second backward needs it, and works with it") {
  Tensor x = tensor({1.0, 2.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = (x * x).sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  check_close(x.grad(), {4, 8});
  check_error([&] { y.backward(); }, {"second time", "retain_graph"});
}

TEST_CASE("graph memory is released after backward") {
  Tensor x = randn64({100}, true);
  std::weak_ptr<Storage> inter;
  Tensor y;
  {
    Tensor h = exp(x);  // exp saves its output h; (h * 2) saves h again
    inter = h.impl()->storage;
    y = (h * 2.0).sum();
  }
  CHECK(!inter.expired());  // only the graph's saved tensors keep h's storage alive now
  y.backward();
  CHECK(inter.expired());  // backward released them
}

TEST_CASE("autograd::grad returns gradients without touching .grad") {
  Tensor x = randn64({3}, true);
  Tensor y = (x * x).sum();
  TensorList g = autograd::grad({y}, {x}, {});
  check_close(g[0], (x * 2.0).detach());
  CHECK(!x.grad().defined());
}

TEST_CASE("gradcheck detects a wrong backward") {
  struct Wrong : autograd::Function<Wrong> {
    static Tensor forward(autograd::Context&, const Tensor& x) { return x * x; }
    static TensorList backward(autograd::Context&, const TensorList& g) { return {g[0]}; }  // should be 2x g
  };
  auto r =
      autograd::gradcheck([](const TensorList& in) { return TensorList{Wrong::apply(in[0])}; }, {randn64({3}, true)});
  CHECK(!r.ok);
  CHECK(r.message.find("analytical") != std::string::npos);
}

TEST_CASE("requires_grad rules") {
  check_error([] { zeros({2}, {.dtype = kInt64, .requires_grad = true}); }, {"only floating-point"});
  Tensor w = ones({2}, {.requires_grad = true});
  Tensor y = w * 2.0;
  check_error([&] { y.set_requires_grad(false); }, {"leaf"});
  check_error([&] { ones({2}).register_hook([](const Tensor& g) { return g; }); }, {"register_hook"});
}
