// nn::Module base (registration, dotted names, children/named_modules, shared parameters, train/eval, to(dtype)
// keeping handles, zero_grad, printout, hooks, state dicts and their validation), nn::init (statistics against the
// formulas, reproducibility, gains, fans) and nn::Linear (vs naive loops, gradcheck, errors).
#include <cmath>

#include "nn/nn.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

// Three levels: Top -> Mid -> Leaf (+ a Linear inside Mid).
struct Leaf : nn::Module {
  Tensor w, running, scratch;
  Leaf() : Module("Leaf") {
    w = register_parameter("w", randn({2, 3}));
    running = register_buffer("running", zeros({3}));
    scratch = register_buffer("scratch", zeros({1}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return x.matmul(w.t()); }  // (N, 3) -> (N, 2)
};

struct Mid : nn::Module {
  Tensor scale;
  std::shared_ptr<Leaf> leaf;
  std::shared_ptr<nn::Linear> fc;
  Mid() : Module("Mid") {
    scale = register_parameter("scale", ones({1}));
    leaf = register_module("leaf", std::make_shared<Leaf>());
    fc = register_module("fc", std::make_shared<nn::Linear>(2, 3));
  }
  Tensor forward(const Tensor& x) override { return (*fc)((*leaf)(x)) * scale; }
  std::string extra_repr() const override { return "tag=mid"; }
};

struct Top : nn::Module {
  Tensor bias;
  std::shared_ptr<Mid> mid;
  Top() : Module("Top") {
    bias = register_parameter("bias", zeros({3}));
    mid = register_module("mid", std::make_shared<Mid>());
  }
  Tensor forward(const Tensor& x) override { return (*mid)(x) + bias; }
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (auto& [n, t] : v) out.push_back(n);
  return out;
}

// Every parameter/buffer value of a module, for bit-identity checks.
std::vector<std::vector<double>> snapshot(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (auto& [n, t] : m.state_dict()) out.push_back(vec(t));
  return out;
}

struct Stats {
  double mean, std, min, max;
};
Stats stats(const Tensor& t) {
  auto v = vec(t);
  Stats s{0, 0, v[0], v[0]};
  for (double a : v) {
    s.mean += a / v.size();
    s.min = std::min(s.min, a);
    s.max = std::max(s.max, a);
  }
  for (double a : v) s.std += (a - s.mean) * (a - s.mean) / v.size();
  s.std = std::sqrt(s.std);
  return s;
}

}  // namespace

// ---- registration and introspection -------------------------------------------------------------------------------

TEST_CASE("Module: dotted names three deep, children, named_modules, buffers") {
  Top top;
  CHECK(names_of(top.named_parameters()) ==
        std::vector<std::string>{"bias", "mid.scale", "mid.leaf.w", "mid.fc.weight", "mid.fc.bias"});
  CHECK(names_of(top.named_parameters(/*recurse=*/false)) == std::vector<std::string>{"bias"});
  CHECK(names_of(top.named_buffers()) == std::vector<std::string>{"mid.leaf.running", "mid.leaf.scratch"});
  CHECK(top.parameters().size() == 5);
  CHECK(top.buffers().size() == 2);
  auto kids = top.named_children();
  REQUIRE(kids.size() == 1);
  CHECK(kids[0].first == "mid");
  CHECK(kids[0].second.get() == top.mid.get());
  CHECK(top.mid->children().size() == 2);
  std::vector<std::string> mods;
  std::vector<std::string> types;
  for (auto& [n, m] : top.named_modules()) {
    mods.push_back(n);
    types.push_back(m->type_name());
  }
  CHECK(mods == std::vector<std::string>{"", "mid", "mid.leaf", "mid.fc"});
  CHECK(types == std::vector<std::string>{"Top", "Mid", "Leaf", "Linear"});
  // parameters are leaves requiring grad, and the members are the registered handles
  for (auto& [n, p] : top.named_parameters()) {
    CAPTURE(n);
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  CHECK(top.named_parameters()[2].second.is_same(top.mid->leaf->w));
  CHECK(!top.mid->leaf->running.requires_grad());
  CHECK(top.num_parameters() == 3 + 1 + 6 + 6 + 3);
}

TEST_CASE("Module: invalid and duplicate names, bad registrations -> errors") {
  nn::Module m("Box");
  m.register_parameter("a", zeros({2}));
  m.register_buffer("b", zeros({2}));
  m.register_module("c", std::make_shared<nn::ReLU>());
  check_error([&] { m.register_parameter("a", zeros({2})); }, {"Box.register_parameter", "'a'", "already"});
  check_error([&] { m.register_buffer("a", zeros({2})); }, {"Box.register_buffer", "'a'", "already"});
  check_error([&] { m.register_parameter("c", zeros({2})); }, {"'c'", "already"});
  check_error([&] { m.register_module("b", std::make_shared<nn::ReLU>()); }, {"Box.register_module", "'b'", "already"});
  check_error([&] { m.register_parameter("x.y", zeros({2})); }, {"Box.register_parameter", "invalid name", "x.y"});
  check_error([&] { m.register_parameter("", zeros({2})); }, {"invalid name"});
  check_error([&] { m.register_module("d", std::shared_ptr<nn::Module>()); }, {"Box.register_module", "'d'", "null"});
  check_error([&] { m.register_parameter("e", Tensor()); }, {"'e'", "undefined"});
  check_error([&] { m.register_parameter("f", zeros({2}, {.dtype = kInt64})); }, {"'f'", "floating"});
  Tensor leaf = randn({2}, {.requires_grad = true});
  check_error([&] { m.register_parameter("g", leaf * 2.0); }, {"'g'", "leaf"});
  check_error([&] { m.forward(zeros({1})); }, {"Box", "no single-tensor forward"});
  // nothing half-registered
  CHECK(names_of(m.named_parameters()) == std::vector<std::string>{"a"});
  CHECK(m.named_children().size() == 1);
  // an int64 non-trainable parameter is fine
  m.register_parameter("steps", zeros({1}, {.dtype = kInt64}), /*requires_grad=*/false);
  CHECK(m.num_parameters() == 3);
  CHECK(m.num_parameters(/*trainable_only=*/true) == 2);
}

TEST_CASE("Module: a shared module / tied parameter is listed and counted once") {
  struct Tied : nn::Module {
    std::shared_ptr<nn::Embedding> emb;
    std::shared_ptr<nn::Linear> shared;
    Tied() : Module("Tied") {
      emb = register_module("emb", std::make_shared<nn::Embedding>(10, 4));
      register_parameter("head_weight", emb->weight);  // tied (10, 4)
      shared = std::make_shared<nn::Linear>(4, 4);
      register_module("a", shared);
      register_module("b", shared);
    }
  } t;
  CHECK(t.num_parameters() == 40 + 16 + 4);
  // own parameters come before the children's, so the tie is listed under its first name, "head_weight"
  CHECK(names_of(t.named_parameters()) == std::vector<std::string>{"head_weight", "a.weight", "a.bias"});
  CHECK(t.parameters().size() == 3);
  // the state dict lists every name (a checkpoint can be read by name from any side of the tie)
  std::vector<std::string> sd;
  for (auto& [n, x] : t.state_dict()) sd.push_back(n);
  CHECK(sd == std::vector<std::string>{"head_weight", "emb.weight", "a.weight", "a.bias", "b.weight", "b.bias"});
}

TEST_CASE("Module: train()/eval() recurse") {
  Top top;
  CHECK(top.is_training());
  top.eval();
  for (auto& [n, m] : top.named_modules()) CHECK(!m->is_training());
  top.mid->train();
  CHECK(!top.is_training());
  CHECK(top.mid->leaf->is_training());
  top.train();
  for (auto& [n, m] : top.named_modules()) CHECK(m->is_training());
}

TEST_CASE("Module: to(kFloat64) keeps the same handles, converts values, drops grads; zero_grad") {
  manual_seed(1);
  Top top;
  Tensor w = top.mid->leaf->w;  // a second handle, like an optimizer would hold
  Tensor running = top.mid->leaf->running;
  std::vector<double> before = vec(w);
  sum(top(ones({4, 3}))).backward();
  REQUIRE(w.grad().defined());
  top.to(kFloat64);
  CHECK(w.dtype() == kFloat64);
  CHECK(top.mid->leaf->w.dtype() == kFloat64);
  CHECK(w.is_same(top.mid->leaf->w));
  CHECK(w.requires_grad());
  CHECK(vec(w) == before);  // float32 -> float64 is exact
  CHECK(!w.grad().defined());
  CHECK(running.dtype() == kFloat64);
  for (auto& p : top.parameters()) CHECK(p.dtype() == kFloat64);
  // it still trains: gradients arrive in float64 on the same handles
  sum(top(ones({4, 3}, {.dtype = kFloat64}))).backward();
  CHECK(w.grad().dtype() == kFloat64);
  for (auto& p : top.parameters()) CHECK(p.grad().defined());
  top.zero_grad();
  for (auto& p : top.parameters()) CHECK(!p.grad().defined());
  check_error([&] { top.to(kInt64); }, {"Top.to", "floating"});
}

TEST_CASE("Module: printout of a nested model") {
  Top top;
  CHECK(top.to_string() ==
        "Top(\n"
        "  (mid): Mid(tag=mid,\n"
        "    (leaf): Leaf()\n"
        "    (fc): Linear(in_features=2, out_features=3, bias=true)\n"
        "  )\n"
        ")");
  CHECK(nn::Linear(2, 3).to_string() == "Linear(in_features=2, out_features=3, bias=true)");
}

// ---- hooks --------------------------------------------------------------------------------------------------------

TEST_CASE("Module: forward pre/post hooks replace input/output, run in order, can be removed") {
  nn::Linear lin(2, 2);
  {
    NoGradGuard g;
    lin.weight.copy_(tensor({1.0, 0.0, 0.0, 1.0}, {2, 2}));
    lin.bias.zero_();
  }
  Tensor x = tensor({1.0, 2.0}, {1, 2});
  std::vector<std::string> order;
  int p1 = lin.add_forward_pre_hook([&](nn::Module& m, const Tensor& in) -> std::optional<Tensor> {
    order.push_back("pre1:" + m.type_name());
    return in * 10.0;
  });
  int p2 = lin.add_forward_pre_hook([&](nn::Module&, const Tensor& in) -> std::optional<Tensor> {
    order.push_back("pre2");
    return in + 1.0;  // sees pre1's replacement
  });
  std::vector<double> post_saw;
  int q1 = lin.add_forward_post_hook([&](nn::Module&, const Tensor& in, const Tensor& out) -> std::optional<Tensor> {
    order.push_back("post1");
    post_saw = vec(in);
    return out * -1.0;
  });
  int q2 = lin.add_forward_post_hook([&](nn::Module&, const Tensor&, const Tensor&) -> std::optional<Tensor> {
    order.push_back("post2");
    return std::nullopt;  // observe only
  });
  check_close(lin(x), {-11.0, -21.0}, 1e-6, 0);
  CHECK(order == std::vector<std::string>{"pre1:Linear", "pre2", "post1", "post2"});
  CHECK(post_saw == std::vector<double>{11.0, 21.0});  // post hooks see the replaced input
  lin.remove_hook(p1);
  check_close(lin(x), {-2.0, -3.0}, 1e-6, 0);
  lin.remove_hook(q1);
  lin.remove_hook(p2);
  lin.remove_hook(q2);
  check_close(lin(x), {1.0, 2.0}, 1e-6, 0);
  check_error([&] { lin.remove_hook(p1); }, {"Linear.remove_hook", std::to_string(p1).c_str()});
  check_error([&] { lin.add_forward_pre_hook(nullptr); }, {"add_forward_pre_hook", "empty"});
}

// ---- state dicts --------------------------------------------------------------------------------------------------

TEST_CASE("Module: state_dict names and order, round trip, copies not aliases") {
  manual_seed(2);
  Top a;
  manual_seed(3);
  Top b;
  std::vector<std::string> names;
  for (auto& [n, t] : a.state_dict()) names.push_back(n);
  // parameters first (registration order, depth first), then persistent buffers; non-persistent ones left out
  CHECK(names == std::vector<std::string>{"bias", "mid.scale", "mid.leaf.w", "mid.fc.weight", "mid.fc.bias",
                                          "mid.leaf.running"});
  CHECK(a.state_dict().at("mid.leaf.w").is_same(a.mid->leaf->w));
  {
    NoGradGuard g;
    a.mid->leaf->running.fill_(7.0);
  }
  REQUIRE(snapshot(a) != snapshot(b));
  b.load_state_dict(a.state_dict());
  CHECK(snapshot(a) == snapshot(b));
  CHECK(!b.mid->leaf->w.is_same(a.mid->leaf->w));
  {
    NoGradGuard g;
    a.mid->leaf->w.fill_(0.5);
  }
  CHECK(vec(b.mid->leaf->w) != vec(a.mid->leaf->w));  // b holds its own copy
  // dtype converted on load, device and dtype of the model kept
  StateDict sd64;
  for (auto& [n, t] : a.state_dict()) sd64.set(n, t.to(kFloat64));
  b.load_state_dict(sd64);
  CHECK(b.mid->leaf->w.dtype() == kFloat32);
  CHECK(vec(b.mid->leaf->w) == vec(a.mid->leaf->w));
}

TEST_CASE("Module: load_state_dict errors leave every tensor bit-identical; non-strict load") {
  manual_seed(4);
  Top src;
  manual_seed(5);
  Top dst;
  const auto before = snapshot(dst);
  REQUIRE(before != snapshot(src));
  // Valid entries come first, the bad one last: a loader that copied as it went would have modified dst.
  auto with = [&](const std::string& bad_name, Tensor bad, bool drop) {
    StateDict sd;
    for (auto& [n, t] : src.state_dict())
      if (n != bad_name) sd.set(n, t);
    if (!drop) sd.set(bad_name, bad);
    return sd;
  };
  SUBCASE("missing key") {
    check_error([&] { dst.load_state_dict(with("mid.leaf.running", Tensor(), true)); },
                {"Top.load_state_dict", "missing key", "mid.leaf.running", "[3]"});
  }
  SUBCASE("unexpected key (strict)") {
    StateDict sd = src.state_dict();
    sd.set("mid.extra", zeros({2}));
    check_error([&] { dst.load_state_dict(sd); }, {"unexpected key", "mid.extra"});
  }
  SUBCASE("shape mismatch") {
    check_error([&] { dst.load_state_dict(with("mid.leaf.running", zeros({4}), false)); },
                {"shape mismatch", "mid.leaf.running", "[4]", "[3]"});
  }
  SUBCASE("dtype mismatch") {
    check_error([&] { dst.load_state_dict(with("mid.leaf.running", zeros({3}, {.dtype = kInt64}), false)); },
                {"dtype mismatch", "mid.leaf.running"});
  }
  CHECK(snapshot(dst) == before);

  // float64 values load into float32 parameters, rounded
  {
    StateDict f64;
    for (auto& [n, t] : src.state_dict()) f64.set(n, t.to(kFloat64));
    Top conv;
    conv.load_state_dict(f64);
    CHECK(snapshot(conv) == snapshot(src));
    CHECK(conv.mid->fc->weight.dtype() == kFloat32);
  }
  // bfloat16 values (a checkpoint saved from a GPU run) load into float32 parameters, exactly
  {
    StateDict bf16;
    for (auto& [n, t] : src.state_dict()) bf16.set(n, t.to(kBFloat16));
    Top conv;
    conv.load_state_dict(bf16);
    for (auto& [n, t] : src.state_dict()) {
      CAPTURE(n);
      CHECK(vec(conv.state_dict().at(n)) == vec(t.to(kBFloat16).to(kFloat32)));
    }
  }

  // non-strict: a missing key keeps its value, an unexpected key is ignored, the rest is loaded
  StateDict partial = with("mid.fc.bias", Tensor(), true);
  partial.set("unknown", zeros({1}));
  const auto fc_bias = vec(dst.mid->fc->bias);
  dst.load_state_dict(partial, /*strict=*/false);
  CHECK(vec(dst.mid->fc->bias) == fc_bias);
  CHECK(vec(dst.mid->leaf->w) == vec(src.mid->leaf->w));
  CHECK(vec(dst.bias) == vec(src.bias));
}

TEST_CASE("Module: non-strict load_state_dict returns the missing and unexpected keys (as PyTorch)") {
  manual_seed(6);
  Top src;
  manual_seed(7);
  Top dst;
  const auto before = snapshot(dst);
  SUBCASE("nothing matches (another naming scheme): every key reported, the module untouched") {
    StateDict foreign;  // the same tensors under PyTorch-like names
    for (auto& [n, t] : src.state_dict()) foreign.set("model." + n, t);
    const nn::LoadStateDictResult r = dst.load_state_dict(foreign, /*strict=*/false);
    CHECK(r.missing_keys == std::vector<std::string>{"bias", "mid.scale", "mid.leaf.w", "mid.fc.weight", "mid.fc.bias",
                                                     "mid.leaf.running"});
    CHECK(r.unexpected_keys == std::vector<std::string>{"model.bias", "model.mid.scale", "model.mid.leaf.w",
                                                        "model.mid.fc.weight", "model.mid.fc.bias",
                                                        "model.mid.leaf.running"});
    CHECK(!r.all_matched());
    CHECK(snapshot(dst) == before);
    // Strict: one error naming every missing and unexpected key, and the hint that nothing matched.
    check_error([&] { dst.load_state_dict(foreign); },
                {"Top.load_state_dict", "missing keys 'bias' (shape [3])", "'mid.leaf.running' (shape [3])",
                 "unexpected keys 'model.bias'", "'model.mid.leaf.running'", "no key of the state dict matches",
                 "strict = false"});
    CHECK(snapshot(dst) == before);
  }
  SUBCASE("a partial match loads what matches and reports the rest") {
    StateDict sd;
    for (auto& [n, t] : src.state_dict())
      if (n != "mid.fc.bias") sd.set(n, t);
    sd.set("mid.fc.b", zeros({3}));
    const auto fc_bias = vec(dst.mid->fc->bias);
    const nn::LoadStateDictResult r = dst.load_state_dict(sd, false);
    CHECK(r.missing_keys == std::vector<std::string>{"mid.fc.bias"});
    CHECK(r.unexpected_keys == std::vector<std::string>{"mid.fc.b"});
    CHECK(vec(dst.mid->fc->bias) == fc_bias);
    CHECK(vec(dst.mid->leaf->w) == vec(src.mid->leaf->w));
    CHECK(vec(dst.mid->leaf->running) == vec(src.mid->leaf->running));
  }
  SUBCASE("a full match returns empty lists, strict or not") {
    CHECK(dst.load_state_dict(src.state_dict()).all_matched());
    CHECK(dst.load_state_dict(src.state_dict(), false).all_matched());
    CHECK(snapshot(dst) == snapshot(src));
  }
  SUBCASE("an empty state dict: every key missing; strict names them") {
    const auto r = dst.load_state_dict(StateDict(), false);
    CHECK(r.missing_keys.size() == 6);
    CHECK(r.unexpected_keys.empty());
    check_error([&] { dst.load_state_dict(StateDict()); }, {"missing keys", "'bias'", "'mid.leaf.w' (shape [2, 3])"});
    CHECK(snapshot(dst) == before);
  }
  SUBCASE("non-strict still refuses a shape mismatch among the keys that match, before copying anything") {
    StateDict sd = src.state_dict();
    sd.set("mid.leaf.running", zeros({4}));  // the last entry: a loader copying as it went would have changed dst
    check_error([&] { dst.load_state_dict(sd, false); }, {"shape mismatch", "mid.leaf.running"});
    CHECK(snapshot(dst) == before);
  }
}

namespace {
// A layer whose buffer must stay >= 0, as its setter requires: load_state_dict must refuse what the setter refuses.
struct Counter : nn::Module {
  Tensor count, w;
  mutable std::vector<std::vector<std::string>> seen;  // the names each check_state call got
  Counter() : Module("Counter") {
    w = register_parameter("w", ones({2}));
    count = register_buffer("count", zeros({}, {.dtype = kInt64}));
  }
  void check_state(const StateDict& incoming) const override {
    std::vector<std::string> names;
    for (auto& [n, t] : incoming) names.push_back(n);
    seen.push_back(names);
    if (const Tensor* c = incoming.find("count"))
      ASC_CHECK(c->item<int64_t>() >= 0, "Counter: count must be >= 0, got {}", c->item<int64_t>());
  }
};
struct TwoCounters : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<Counter> a, b;
  TwoCounters() : Module("TwoCounters") {
    fc = register_module("fc", std::make_shared<nn::Linear>(2, 2));
    a = register_module("a", std::make_shared<Counter>());
    b = register_module("b", std::make_shared<Counter>());
  }
};
}  // namespace

TEST_CASE("Module: check_state lets a layer refuse loaded values; the whole load is abandoned untouched") {
  TwoCounters m;
  const auto before = snapshot(m);
  StateDict sd = m.state_dict();
  sd.set("fc.weight", full({2, 2}, 5.0));
  sd.set("a.count", full({}, 3.0, {.dtype = kInt64}));
  sd.set("b.count", full({}, -1.0, {.dtype = kInt64}));  // refused by b, after a and fc were validated
  check_error([&] { m.load_state_dict(sd); }, {"Counter: count must be >= 0, got -1"});
  CHECK(snapshot(m) == before);
  // The hook sees its own entries under local names; entries that are not loaded are not listed.
  CHECK(m.a->seen.back() == std::vector<std::string>{"w", "count"});
  StateDict partial;
  partial.set("a.count", full({}, 4.0, {.dtype = kInt64}));
  m.a->seen.clear();
  m.b->seen.clear();
  auto r = m.load_state_dict(partial, false);
  CHECK(m.a->seen == std::vector<std::vector<std::string>>{{"count"}});
  CHECK(m.b->seen.empty());
  CHECK(m.a->count.item<int64_t>() == 4);
  CHECK(r.missing_keys.size() == 5);
}

TEST_CASE("Module: a state dict whose values alias the module's own tensors loads as if they were copies") {
  // Loading {a: b's tensor, b: a's tensor} in place must swap them, not copy one over the other.
  manual_seed(8);
  Top m;
  const auto w = vec(m.mid->leaf->w), fc = vec(m.mid->fc->weight.t().contiguous());
  const auto bias = vec(m.bias), fc_bias = vec(m.mid->fc->bias);
  StateDict sd = m.state_dict();
  sd.set("bias", m.mid->fc->bias);
  sd.set("mid.fc.bias", m.bias);
  sd.set("mid.leaf.w", m.mid->fc->weight.t());  // (2, 3) view of the (3, 2) fc weight
  sd.set("mid.fc.weight", m.mid->leaf->w.t());
  m.load_state_dict(sd);
  CHECK(vec(m.bias) == fc_bias);
  CHECK(vec(m.mid->fc->bias) == bias);
  CHECK(vec(m.mid->leaf->w) == fc);
  CHECK(vec(m.mid->fc->weight.t().contiguous()) == w);
}

// ---- init ---------------------------------------------------------------------------------------------------------

TEST_CASE("init: fans and calculate_gain") {
  CHECK(nn::init::fans(zeros({8, 4})) == std::pair<int64_t, int64_t>{4, 8});
  CHECK(nn::init::fans(zeros({8, 4, 3, 3})) == std::pair<int64_t, int64_t>{36, 72});
  check_error([] { nn::init::fans(zeros({5})); }, {"init.fans", "2 dims", "[5]"});
  CHECK(nn::init::calculate_gain("linear") == 1.0);
  CHECK(nn::init::calculate_gain("sigmoid") == 1.0);
  CHECK(nn::init::calculate_gain("tanh") == doctest::Approx(5.0 / 3.0).epsilon(1e-15));
  CHECK(nn::init::calculate_gain("relu") == doctest::Approx(std::sqrt(2.0)).epsilon(1e-15));
  CHECK(nn::init::calculate_gain("leaky_relu", 0.2) == doctest::Approx(std::sqrt(2.0 / 1.04)).epsilon(1e-15));
  CHECK(nn::init::calculate_gain("leaky_relu") == doctest::Approx(std::sqrt(2.0 / 1.0001)).epsilon(1e-15));
  CHECK(nn::init::calculate_gain("selu") == 0.75);
  check_error([] { nn::init::calculate_gain("softmax"); }, {"calculate_gain", "softmax"});
}

TEST_CASE("init: distributions match the formulas over a large tensor") {
  // (400, 500): fan_in 500, fan_out 400; 200k samples: the mean is within ~0.002 std, the std within ~0.2 %.
  Tensor w = empty({400, 500});
  Generator gen(17);
  auto check_uniform = [&](double bound) {
    Stats s = stats(w);
    CHECK(s.min >= -bound);
    CHECK(s.max <= bound);
    CHECK(s.min < -0.999 * bound);
    CHECK(s.max > 0.999 * bound);
    CHECK(std::abs(s.mean) < 0.01 * bound);
    CHECK(s.std == doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.01));
  };
  auto check_normal = [&](double mean, double std) {
    Stats s = stats(w);
    CHECK(std::abs(s.mean - mean) < 0.012 * std);
    CHECK(s.std == doctest::Approx(std).epsilon(0.01));
  };
  SUBCASE("xavier_uniform") {
    nn::init::xavier_uniform_(w, 2.0, &gen);
    check_uniform(2.0 * std::sqrt(6.0 / 900.0));
  }
  SUBCASE("xavier_normal") {
    nn::init::xavier_normal_(w, 1.0, &gen);
    check_normal(0.0, std::sqrt(2.0 / 900.0));
  }
  SUBCASE("kaiming_uniform (leaky_relu a=0, fan_in)") {
    nn::init::kaiming_uniform_(w, {}, &gen);
    check_uniform(std::sqrt(2.0) * std::sqrt(3.0 / 500.0));
  }
  SUBCASE("kaiming_normal (relu, fan_out)") {
    nn::init::kaiming_normal_(w, {.fan_out = true, .nonlinearity = "relu"}, &gen);
    check_normal(0.0, std::sqrt(2.0 / 400.0));
  }
  SUBCASE("normal") {
    nn::init::normal_(w, 3.0, 2.0, &gen);
    check_normal(3.0, 2.0);
  }
  SUBCASE("uniform") {
    nn::init::uniform_(w, -1.0, 4.0, &gen);
    Stats s = stats(w);
    CHECK(s.min >= -1.0);
    CHECK(s.max < 4.0);
    CHECK(std::abs(s.mean - 1.5) < 0.01);
    CHECK(s.std == doctest::Approx(5.0 / std::sqrt(12.0)).epsilon(0.01));
  }
  SUBCASE("constant / zeros / ones") {
    nn::init::constant_(w, 2.5);
    CHECK(stats(w).min == 2.5);
    CHECK(stats(w).max == 2.5);
    nn::init::zeros_(w);
    CHECK(stats(w).max == 0.0);
    nn::init::ones_(w);
    CHECK(stats(w).min == 1.0);
  }
}

TEST_CASE("init: reproducible from a Generator and from manual_seed; works on parameters; errors") {
  Tensor a = empty({30, 20}), b = empty({30, 20}), c = empty({30, 20});
  Generator g1(99), g2(99), g3(100);
  nn::init::kaiming_normal_(a, {}, &g1);
  nn::init::kaiming_normal_(b, {}, &g2);
  nn::init::kaiming_normal_(c, {}, &g3);
  CHECK(vec(a) == vec(b));
  CHECK(vec(a) != vec(c));
  manual_seed(42);
  nn::Linear l1(6, 5);
  manual_seed(42);
  nn::Linear l2(6, 5);
  CHECK(vec(l1.weight) == vec(l2.weight));
  CHECK(vec(l1.bias) == vec(l2.bias));
  // parameters (requires_grad) are initialised in place without recording a graph
  nn::init::xavier_uniform_(l1.weight);
  CHECK(l1.weight.is_leaf());
  CHECK(l1.weight.requires_grad());
  Tensor i64 = zeros({3, 3}, {.dtype = kInt64});
  check_error([&] { nn::init::normal_(i64); }, {"init.normal_", "floating"});
  check_error([&] { nn::init::uniform_(a, 2.0, 1.0); }, {"init.uniform_", "low"});
  check_error([&] { nn::init::normal_(a, 0.0, -1.0); }, {"init.normal_", "std"});
  check_error([&] { nn::init::kaiming_uniform_(a, {.nonlinearity = "bogus"}); }, {"bogus"});
}

// ---- Linear -------------------------------------------------------------------------------------------------------

TEST_CASE("Linear: forward vs naive loops (bias on/off, batched input), init bounds, gradcheck, errors") {
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    manual_seed(6);
    nn::Linear lin(4, 5, bias);
    CHECK(lin.bias.defined() == bias);
    CHECK(lin.num_parameters() == 20 + (bias ? 5 : 0));
    Stats s = stats(lin.weight);
    CHECK(s.max <= 0.5);  // U(-1/sqrt(4), 1/sqrt(4))
    CHECK(s.min >= -0.5);
    lin.to(kFloat64);
    Tensor x = randn64({2, 3, 4}, false, 7);
    Tensor y = lin(x);
    REQUIRE(y.shape() == Shape({2, 3, 5}));
    std::vector<double> xv = vec(x), wv = vec(lin.weight), bv = bias ? vec(lin.bias) : std::vector<double>(5, 0.0);
    std::vector<double> e;
    for (int r = 0; r < 6; ++r)
      for (int o = 0; o < 5; ++o) {
        double acc = bv[o];
        for (int i = 0; i < 4; ++i) acc += xv[r * 4 + i] * wv[o * 4 + i];
        e.push_back(acc);
      }
    check_close(y, e, 1e-12, 1e-10);
    // a 1-D input
    check_close(lin(x.select(0, 1).select(0, 2)), std::vector<double>(e.begin() + 25, e.end()), 1e-12, 1e-10);
    check_grad([&](const TensorList& in) { return TensorList{lin(in[0])}; }, {randn64({3, 4}, true, 8)});
    // parameter gradients of sum(y * c) vs the hand-derived dW = c^T x, db = sum_r c
    Tensor xs = randn64({3, 4}, false, 9), cs = randn64({3, 5}, false, 10);
    sum(lin(xs) * cs).backward();
    std::vector<double> xsv = vec(xs), csv = vec(cs), dw(20, 0.0), db(5, 0.0);
    for (int r = 0; r < 3; ++r)
      for (int o = 0; o < 5; ++o) {
        db[o] += csv[r * 5 + o];
        for (int i = 0; i < 4; ++i) dw[o * 4 + i] += csv[r * 5 + o] * xsv[r * 4 + i];
      }
    check_close(lin.weight.grad(), dw, 1e-12, 1e-10);
    if (bias) check_close(lin.bias.grad(), db, 1e-12, 1e-10);
  }
  nn::Linear lin(4, 5);
  check_error([&] { lin(randn32({2, 3})); }, {"Linear", "(..., 4)", "[2, 3]"});
  check_error([&] { lin(Tensor()); }, {"Linear", "(..., 4)"});
  check_error([] { nn::Linear(0, 3); }, {"Linear", "positive"});
  CHECK(nn::Linear(nn::LinearOptions(3, 2).bias(false)).extra_repr() == "in_features=3, out_features=2, bias=false");
}
