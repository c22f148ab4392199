// nn layers, positional encodings and losses: forward vs naive loops on std::vector<double>, closed-form /
// reference values (ALiBi slopes, sinusoidal tables), float64 gradchecks where a layer adds math beyond existing
// ops (RoPE, ALiBi, positional encodings, BCE-with-logits), and the error messages.
#include <cmath>
#include <limits>

#include "nn/nn.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

// Overwrites a parameter with new values (outside autograd).
void set_values(Tensor& p, const Tensor& v) {
  NoGradGuard g;
  p.copy_(v);
}

double naive_act(const std::string& name, double x) {
  if (name == "relu") return x > 0 ? x : 0.0;
  if (name == "gelu") return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  if (name == "gelu_tanh") return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  if (name == "silu") return x / (1.0 + std::exp(-x));
  if (name == "tanh") return std::tanh(x);
  if (name == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  FAIL("unknown activation " << name);
  return 0;
}

// y (rows, out) = x (rows, in) W^T (out, in) + b, plain loops.
std::vector<double> naive_linear(const std::vector<double>& x, int64_t rows, int64_t in, const Tensor& w,
                                 const Tensor& b) {
  std::vector<double> wv = vec(w), bv = b.defined() ? vec(b) : std::vector<double>();
  const int64_t out = w.size(0);
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bv.empty() ? 0.0 : bv[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * wv[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

// Stable log sigmoid, independent of the library: log sigma(x) = -log1p(exp(-x)) (x >= 0), x - log1p(exp(x)).
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

}  // namespace

// ---- Embedding -----------------------------------------------------------------------------------------------------

TEST_CASE("Embedding: lookup vs naive, padding row zero at init and without gradient, errors") {
  manual_seed(3);
  nn::Embedding emb(5, 3, /*padding_idx=*/0);
  CHECK(emb.weight.shape() == Shape({5, 3}));
  std::vector<double> w = vec(emb.weight);
  for (int c = 0; c < 3; ++c) CHECK(w[c] == 0.0);  // padding row
  double others = 0;
  for (size_t i = 3; i < w.size(); ++i) others += std::abs(w[i]);
  CHECK(others > 0.1);  // the other rows are drawn

  Tensor idx = tensor(std::vector<int64_t>{1, 2, 1, 0, 4, 1}, {2, 3});
  Tensor y = emb(idx);
  REQUIRE(y.shape() == Shape({2, 3, 3}));
  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  std::vector<double> expected;
  for (auto r : iv)
    for (int c = 0; c < 3; ++c) expected.push_back(w[r * 3 + c]);
  check_close(y, expected, 0, 0);

  sum(y).backward();
  // rows used: 1 three times, 2 once, 4 once, 0 is padding (no gradient), 3 unused.
  std::vector<double> counts = {0, 3, 1, 0, 1};
  std::vector<double> g;
  for (double c : counts)
    for (int k = 0; k < 3; ++k) g.push_back(c);
  check_close(emb.weight.grad(), g, 0, 0);

  CHECK(emb.extra_repr() == "5, 3, padding_idx=0");
  check_error([&] { emb(tensor({1.0, 2.0})); }, {"Embedding", "int64"});
  check_error([&] { emb(tensor(std::vector<int64_t>{5}, {1})); }, {"5"});
  check_error([] { nn::Embedding(5, 3, 5); }, {"Embedding", "padding_idx", "5"});
  check_error([] { nn::Embedding(5, 3, -2); }, {"Embedding", "padding_idx"});
  check_error([] { nn::Embedding(0, 3); }, {"Embedding", "positive"});
}

// ---- LayerNorm / RMSNorm -------------------------------------------------------------------------------------------

TEST_CASE("LayerNorm: forward vs naive over one and two trailing dims, affine on/off, errors") {
  for (int nd : {1, 2}) {
    CAPTURE(nd);
    Shape ns = nd == 1 ? Shape{12} : Shape{3, 4};
    nn::LayerNorm ln(nn::LayerNormOptions(ns).eps(1e-3));
    ln.to(kFloat64);
    CHECK(vec(ln.weight) == std::vector<double>(12, 1.0));  // init ones / zeros
    CHECK(vec(ln.bias) == std::vector<double>(12, 0.0));
    set_values(ln.weight, randn64(ns, false, 5));
    set_values(ln.bias, randn64(ns, false, 6));
    Shape xs = nd == 1 ? Shape{2, 5, 12} : Shape{2, 5, 3, 4};
    Tensor x = randn64(xs, false, 7) * 2.0 + 1.0;
    Tensor y = ln(x);
    std::vector<double> xv = vec(x), wv = vec(ln.weight), bv = vec(ln.bias), e(xv.size());
    for (int r = 0; r < 10; ++r) {
      double m = 0, v = 0;
      for (int i = 0; i < 12; ++i) m += xv[r * 12 + i] / 12;
      for (int i = 0; i < 12; ++i) v += (xv[r * 12 + i] - m) * (xv[r * 12 + i] - m) / 12;
      for (int i = 0; i < 12; ++i) e[r * 12 + i] = (xv[r * 12 + i] - m) / std::sqrt(v + 1e-3) * wv[i] + bv[i];
    }
    check_close(y, e, 1e-12, 1e-10);
  }
  nn::LayerNorm plain(4, 1e-5, /*elementwise_affine=*/false);
  CHECK(plain.num_parameters() == 0);
  CHECK(!plain.weight.defined());
  nn::LayerNorm nobias(nn::LayerNormOptions(Shape{4}).bias(false));
  CHECK(nobias.named_parameters().size() == 1);
  CHECK(plain.extra_repr() == "[4], eps=1e-05, elementwise_affine=false");
  check_error([&] { plain(randn32({2, 5})); }, {"LayerNorm", "[4]", "[2, 5]"});
  check_error([&] { plain(tensor(std::vector<int64_t>{1, 2, 3, 4}, {4})); }, {"LayerNorm", "floating"});
  check_error([] { nn::LayerNorm(nn::LayerNormOptions(Shape{})); }, {"LayerNorm", "empty"});
}

TEST_CASE("RMSNorm: forward vs naive, errors") {
  nn::RMSNorm rms(nn::RMSNormOptions(6).eps(1e-4));
  rms.to(kFloat64);
  CHECK(vec(rms.weight) == std::vector<double>(6, 1.0));
  set_values(rms.weight, randn64({6}, false, 9));
  Tensor x = randn64({4, 6}, false, 10);
  std::vector<double> xv = vec(x), wv = vec(rms.weight), e(xv.size());
  for (int r = 0; r < 4; ++r) {
    double ms = 0;
    for (int i = 0; i < 6; ++i) ms += xv[r * 6 + i] * xv[r * 6 + i] / 6;
    for (int i = 0; i < 6; ++i) e[r * 6 + i] = xv[r * 6 + i] / std::sqrt(ms + 1e-4) * wv[i];
  }
  check_close(rms(x), e, 1e-12, 1e-10);
  check_error([&] { rms(randn64({4, 5})); }, {"RMSNorm", "(..., 6)", "[4, 5]"});
  check_error([] { nn::RMSNorm(0); }, {"RMSNorm", "positive"});
}

// ---- Dropout -------------------------------------------------------------------------------------------------------

TEST_CASE("Dropout: eval is the identity (same tensor), train statistics, errors") {
  nn::Dropout d(0.3);
  Tensor x = ones({200000});
  d.eval();
  CHECK(d(x).is_same(x));
  d.train();
  manual_seed(11);
  Tensor y = d(x);
  std::vector<double> yv = vec(y);
  int64_t zeros_n = 0;
  bool values_ok = true;
  for (double v : yv) {
    if (v == 0.0)
      ++zeros_n;
    else
      values_ok &= std::abs(v - 1.0 / 0.7) < 1e-6;
  }
  CHECK(values_ok);
  const double frac = static_cast<double>(zeros_n) / 200000.0;
  CHECK(std::abs(frac - 0.3) < 0.005);  // std of the fraction ~0.001
  Tensor y2 = d(x);
  CHECK(vec(y2) != yv);  // a fresh mask per call
  nn::Dropout d0(0.0);
  CHECK(d0(x).is_same(x));
  CHECK(d.extra_repr() == "p=0.3");
  check_error([] { nn::Dropout(1.5); }, {"Dropout", "1.5"});
  check_error([] { nn::Dropout(-0.1); }, {"Dropout", "[0, 1]"});
}

// ---- activations ---------------------------------------------------------------------------------------------------

TEST_CASE("activation modules vs naive formulas; make_activation") {
  Tensor x = randn64({50}, false, 12) * 3.0;
  std::vector<double> xv = vec(x);
  for (std::string name : {"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid"}) {
    CAPTURE(name);
    auto act = nn::make_activation(name);
    std::vector<double> e;
    for (double v : xv) e.push_back(naive_act(name, v));
    check_close((*act)(x), e, 1e-12, 1e-10);
  }
  CHECK(nn::make_activation("relu")->type_name() == "ReLU");
  CHECK(nn::make_activation("gelu_tanh")->extra_repr() == "approximate='tanh'");
  CHECK((*nn::make_activation("identity"))(x).is_same(x));
  nn::GELU g("tanh");
  CHECK(g.tanh_approximation);
  check_error([] { nn::make_activation("swish"); }, {"make_activation", "swish"});
  check_error([] { nn::GELU("fast"); }, {"GELU", "fast"});
}

// ---- containers ----------------------------------------------------------------------------------------------------

TEST_CASE("Sequential: children 0,1,2, output equals the manual chain, hooks of children, errors") {
  manual_seed(4);
  auto l1 = std::make_shared<nn::Linear>(3, 5);
  auto act = std::make_shared<nn::Tanh>();
  auto l2 = std::make_shared<nn::Linear>(5, 2, /*bias=*/false);
  nn::Sequential seq({l1, act, l2});
  CHECK(seq.size() == 3);
  auto kids = seq.named_children();
  REQUIRE(kids.size() == 3);
  CHECK(kids[0].first == "0");
  CHECK(kids[2].first == "2");
  CHECK(seq[1].get() == act.get());
  CHECK(seq.at<nn::Linear>(2).get() == l2.get());
  auto names = seq.named_parameters();
  REQUIRE(names.size() == 3);
  CHECK(names[0].first == "0.weight");
  CHECK(names[1].first == "0.bias");
  CHECK(names[2].first == "2.weight");

  seq.to(kFloat64);
  Tensor x = randn64({4, 3}, false, 13);
  std::vector<double> h = naive_linear(vec(x), 4, 3, l1->weight, l1->bias);
  for (auto& v : h) v = std::tanh(v);
  std::vector<double> e = naive_linear(h, 4, 5, l2->weight, Tensor());
  check_close(seq(x), e, 1e-12, 1e-10);

  // A child's pre hook runs inside the chain.
  int id = act->add_forward_pre_hook([](nn::Module&, const Tensor& in) -> std::optional<Tensor> { return in * 0.0; });
  check_close(seq(x), std::vector<double>(8, 0.0), 1e-15, 0);
  act->remove_hook(id);
  check_close(seq(x), e, 1e-12, 1e-10);

  nn::Sequential empty;
  CHECK(empty(x).is_same(x));
  empty.push_back(std::make_shared<nn::ReLU>());
  CHECK(empty.named_children()[0].first == "0");

  CHECK(seq.to_string() ==
        "Sequential(\n"
        "  (0): Linear(in_features=3, out_features=5, bias=true)\n"
        "  (1): Tanh()\n"
        "  (2): Linear(in_features=5, out_features=2, bias=false)\n"
        ")");
  check_error([&] { seq[3]; }, {"Sequential[3]", "out of range", "size 3"});
  check_error([&] { seq.at<nn::Linear>(1); }, {"Sequential.at(1)", "Tanh"});
  check_error([&] { seq.push_back(nullptr); }, {"Sequential", "null"});
  check_error([&] { seq(randn64({4, 2})); }, {"Linear", "(..., 3)"});
}

TEST_CASE("ModuleList: names, iteration, indexing, no forward") {
  nn::ModuleList list;
  for (int i = 0; i < 3; ++i) list.push_back(std::make_shared<nn::Linear>(2, 2));
  CHECK(list.size() == 3);
  int n = 0;
  for (const auto& m : list) {
    CHECK(m->type_name() == "Linear");
    CHECK(m.get() == list[static_cast<size_t>(n)].get());
    ++n;
  }
  CHECK(n == 3);
  auto names = list.named_parameters();
  REQUIRE(names.size() == 6);
  CHECK(names[4].first == "2.weight");
  CHECK(list.num_parameters() == 18);
  list.eval();
  CHECK(!list[1]->is_training());
  check_error([&] { list(randn32({1, 2})); }, {"ModuleList", "forward"});
  check_error([&] { list[3]; }, {"ModuleList[3]", "out of range"});
  check_error([&] { list.push_back(nullptr); }, {"ModuleList", "null"});
}

TEST_CASE("MLP: structure, output equals the manual chain, dropout only in training, errors") {
  manual_seed(21);
  nn::MLP mlp(nn::MLPOptions({4, 8, 6, 2}).activation("silu").dropout(0.25));
  // Linear, SiLU, Dropout, Linear, SiLU, Dropout, Linear
  REQUIRE(mlp.size() == 7);
  std::vector<std::string> types;
  for (auto& [n, m] : mlp.named_children()) types.push_back(m->type_name());
  CHECK(types == std::vector<std::string>{"Linear", "SiLU", "Dropout", "Linear", "SiLU", "Dropout", "Linear"});
  CHECK(mlp.num_parameters() == 4 * 8 + 8 + 8 * 6 + 6 + 6 * 2 + 2);
  CHECK(mlp.type_name() == "MLP");

  mlp.to(kFloat64);
  mlp.eval();
  Tensor x = randn64({3, 4}, false, 22);
  std::vector<double> h = vec(x);
  int64_t in = 4;
  for (size_t li : {0u, 3u, 6u}) {
    auto lin = mlp.at<nn::Linear>(li);
    h = naive_linear(h, 3, in, lin->weight, lin->bias);
    in = lin->weight.size(0);
    if (li != 6)
      for (auto& v : h) v = naive_act("silu", v);
  }
  check_close(mlp(x), h, 1e-12, 1e-10);
  mlp.train();
  manual_seed(5);
  CHECK(vec(mlp(x)) != h);  // dropout active

  nn::MLP plain(nn::MLPOptions({3, 2}));
  CHECK(plain.size() == 1);
  CHECK(plain.extra_repr() == "sizes=[3, 2], activation=relu, dropout=0");
  check_error([] { nn::MLP(nn::MLPOptions({3})); }, {"MLP", "at least"});
  check_error([] { nn::MLP(nn::MLPOptions({3, 0, 2})); }, {"MLP", "positive", "[3, 0, 2]"});
  check_error([] { nn::MLP(nn::MLPOptions({3, 2}).activation("foo")); }, {"foo"});
  check_error([] { nn::MLP(nn::MLPOptions({3, 2}).dropout(1.0)); }, {"MLP", "dropout"});
}

// ---- RoPE ----------------------------------------------------------------------------------------------------------

namespace {
// Rotate-half RoPE with plain loops: x (B, H, T, Dh) flat.
std::vector<double> naive_rope(const std::vector<double>& x, int64_t bh, int64_t t, int64_t dh, int64_t offset,
                               double base = 10000.0) {
  std::vector<double> y(x.size());
  const int64_t m = dh / 2;
  for (int64_t r = 0; r < bh; ++r)
    for (int64_t p = 0; p < t; ++p) {
      const double* xr = &x[(r * t + p) * dh];
      double* yr = &y[(r * t + p) * dh];
      for (int64_t i = 0; i < m; ++i) {
        const double a = static_cast<double>(offset + p) / std::pow(base, 2.0 * i / dh);
        yr[i] = xr[i] * std::cos(a) - xr[m + i] * std::sin(a);
        yr[m + i] = xr[m + i] * std::cos(a) + xr[i] * std::sin(a);
      }
    }
  return y;
}
double dot(const Tensor& a, const Tensor& b) {
  auto av = vec(a), bv = vec(b);
  double s = 0;
  for (size_t i = 0; i < av.size(); ++i) s += av[i] * bv[i];
  return s;
}
}  // namespace

TEST_CASE("RoPE: apply_rope and RotaryEmbedding vs the naive rotation, with offsets; float32") {
  Tensor x = randn64({2, 3, 5, 8}, false, 31);
  for (int64_t off : {0, 7}) {
    CAPTURE(off);
    auto e = naive_rope(vec(x), 6, 5, 8, off);
    check_close(nn::apply_rope(x, off), e, 1e-12, 1e-10);
    nn::RotaryEmbedding rope(8, 64);
    rope.to(kFloat64);
    check_close(rope.forward(x, off), e, 1e-12, 1e-10);
  }
  // other base, float32 (tables converted to x's dtype)
  Tensor x32 = randn32({1, 2, 4, 6}, 32);
  auto e32 = naive_rope(vec(x32), 2, 4, 6, 3, 500.0);
  Tensor y32 = nn::apply_rope(x32, 3, 500.0);
  CHECK(y32.dtype() == kFloat32);
  check_close(y32, e32, 1e-5, 1e-5);
  nn::RotaryEmbedding rope32(6, 16, 500.0);
  check_close(rope32.forward(x32, 3), e32, 1e-5, 1e-5);
  check_close(rope32(x32), naive_rope(vec(x32), 2, 4, 6, 0, 500.0), 1e-5, 1e-5);
  // a non-contiguous input (transposed (B, T, H, Dh) -> (B, H, T, Dh))
  Tensor xt = randn64({2, 5, 3, 8}, false, 33).transpose(1, 2);
  check_close(nn::apply_rope(xt, 2), naive_rope(vec(xt), 6, 5, 8, 2), 1e-12, 1e-10);
}

TEST_CASE("RoPE: <rope(q, m), rope(k, n)> depends only on m - n") {
  Tensor q = randn64({1, 1, 1, 16}, false, 41), k = randn64({1, 1, 1, 16}, false, 42);
  auto score = [&](int64_t m, int64_t n) { return dot(nn::apply_rope(q, m), nn::apply_rope(k, n)); };
  const double d3 = score(3, 0);
  CHECK(std::abs(score(10, 7) - d3) < 1e-10);
  CHECK(std::abs(score(103, 100) - d3) < 1e-10);
  CHECK(std::abs(score(5, 5) - dot(q, k)) < 1e-10);  // zero distance: the plain dot product
  CHECK(std::abs(score(5, 1) - d3) > 1e-3);          // a different distance gives a different score
  // the same through the module's caches
  nn::RotaryEmbedding rope(16, 128);
  rope.to(kFloat64);
  CHECK(std::abs(dot(rope.forward(q, 50), rope.forward(k, 47)) - d3) < 1e-10);
}

TEST_CASE("RoPE: gradcheck, buffers are non-persistent and move with to(), errors") {
  check_grad([](const TensorList& in) { return TensorList{nn::apply_rope(in[0], 4)}; },
             {randn64({2, 2, 3, 6}, true, 51)});
  nn::RotaryEmbedding rope(4, 10);
  CHECK(rope.state_dict().size() == 0);
  CHECK(rope.named_buffers().size() == 2);
  CHECK(rope.cos_cache.dtype() == kFloat64);
  rope.to(kFloat32);  // buffers follow to(dtype)
  CHECK(rope.cos_cache.dtype() == kFloat32);
  CHECK(rope.forward(randn64({1, 1, 3, 4}), 0).dtype() == kFloat64);  // tables follow the input's dtype
  rope.to(kFloat64);
  check_grad([&](const TensorList& in) { return TensorList{rope.forward(in[0], 2)}; },
             {randn64({1, 2, 3, 4}, true, 52)});
  check_error([&] { rope.forward(randn64({1, 1, 3, 6}), 0); }, {"RotaryEmbedding", "(..., T, 4)", "[1, 1, 3, 6]"});
  check_error([&] { rope.forward(randn64({1, 1, 3, 4}), 8); }, {"RotaryEmbedding", "[8, 11)", "max_len 10"});
  check_error([] { nn::apply_rope(randn64({1, 1, 3, 5})); }, {"apply_rope", "even"});
  check_error([] { nn::apply_rope(randn64({5})); }, {"apply_rope", "(..., T, Dh)"});
  check_error([] { nn::apply_rope(randn64({2, 4}), -1); }, {"apply_rope", "offset"});
  check_error([] { nn::RotaryEmbedding(5); }, {"RotaryEmbedding", "even"});
  check_error([] { nn::apply_rope(randn64({3, 4}), randn64({3, 2}), randn64({3, 4})); }, {"apply_rope", "cos and sin"});
}

// ---- ALiBi ---------------------------------------------------------------------------------------------------------

TEST_CASE("ALiBi: slopes vs the closed form and the reference values for H = 6 and 12") {
  auto s8 = nn::alibi_slopes(8);
  REQUIRE(s8.size() == 8);
  for (int h = 1; h <= 8; ++h) CHECK(s8[h - 1] == doctest::Approx(std::pow(2.0, -h)).epsilon(1e-15));
  auto s4 = nn::alibi_slopes(4);
  CHECK(s4 == std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625});
  // ALiBi paper code: 4-head slopes, then every other 8-head slope.
  auto s6 = nn::alibi_slopes(6);
  CHECK(s6 == std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
  // 12 heads: the 8-head slopes 2^-1..2^-8, then 16-head slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  auto s12 = nn::alibi_slopes(12);
  REQUIRE(s12.size() == 12);
  for (int h = 1; h <= 8; ++h) CHECK(s12[h - 1] == doctest::Approx(std::pow(2.0, -h)).epsilon(1e-15));
  for (int i = 0; i < 4; ++i) CHECK(s12[8 + i] == doctest::Approx(std::pow(2.0, -0.5 - i)).epsilon(1e-15));
  CHECK(nn::alibi_slopes(1) == std::vector<double>{std::pow(2.0, -8.0)});
  check_error([] { nn::alibi_slopes(0); }, {"alibi_slopes", "0"});
}

TEST_CASE("ALiBi: bias (H, Tq, Tk) vs naive, causal, query offsets, forward adds, gradcheck, errors") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::ALiBi alibi(nn::ALiBiOptions(6).causal(causal));
    auto sl = nn::alibi_slopes(6);
    for (auto [tq, tk, off] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{5, 5, 0}, {2, 6, 4}, {3, 4, 0}}) {
      CAPTURE(tq);
      CAPTURE(tk);
      Tensor b = (tq == tk) ? alibi.bias(tq) : (off == tk - tq ? alibi.bias(tq, tk) : alibi.bias(tq, tk, off));
      REQUIRE(b.shape() == Shape({6, tq, tk}));
      std::vector<double> e;
      for (int h = 0; h < 6; ++h)
        for (int64_t i = 0; i < tq; ++i)
          for (int64_t j = 0; j < tk; ++j) {
            const double dist = static_cast<double>(i + off - j);
            e.push_back(causal ? (dist < 0 ? -kInf : -sl[h] * dist) : -sl[h] * std::abs(dist));
          }
      check_close(b, e, 1e-6, 1e-6);  // float32 slopes
    }
  }
  nn::ALiBi alibi(nn::ALiBiOptions(2));
  alibi.to(kFloat64);
  CHECK(alibi.state_dict().size() == 0);
  Tensor s = randn64({3, 2, 4, 4}, false, 61);
  Tensor y = alibi(s);
  std::vector<double> sv = vec(s), yv = vec(y), sl = nn::alibi_slopes(2);
  bool ok = true;
  for (size_t f = 0; f < sv.size(); ++f) {
    auto idx = unravel(static_cast<int64_t>(f), s.shape());
    ok &= std::abs(yv[f] - (sv[f] - sl[idx[1]] * std::abs(static_cast<double>(idx[2] - idx[3])))) < 1e-12;
  }
  CHECK(ok);
  check_grad([&](const TensorList& in) { return TensorList{softmax(alibi(in[0]), -1)}; },
             {randn64({2, 2, 3, 3}, true, 62)});
  check_error([&] { alibi(randn64({2, 3, 4, 4})); }, {"ALiBi", "(..., 2, Tq, Tk)", "[2, 3, 4, 4]"});
  check_error([&] { alibi.bias(0, 3); }, {"ALiBi.bias", "positive"});
  check_error([] { nn::ALiBi(nn::ALiBiOptions(0)); }, {"ALiBi", "heads"});
}

// ---- absolute positional encodings ---------------------------------------------------------------------------------

TEST_CASE("Sinusoidal positional encoding: table vs formula (even and odd dim), module adds with offset") {
  for (int64_t d : {6, 5}) {
    CAPTURE(d);
    Tensor pe = nn::sinusoidal_encoding(7, d, 2, 10000.0, kFloat64);
    REQUIRE(pe.shape() == Shape({7, d}));
    std::vector<double> e;
    for (int pos = 2; pos < 9; ++pos)
      for (int64_t c = 0; c < d; ++c) {
        const int64_t i2 = c - c % 2;  // 2i
        const double a = pos / std::pow(10000.0, static_cast<double>(i2) / d);
        e.push_back(c % 2 == 0 ? std::sin(a) : std::cos(a));
      }
    check_close(pe, e, 1e-12, 0);
  }
  // Spot values: PE[1, 0] = sin(1), PE[1, 1] = cos(1), PE[3, 2] = sin(3 / 10000^(2/4)) for d = 4.
  Tensor pe4 = nn::sinusoidal_encoding(4, 4, 0, 10000.0, kFloat64);
  auto p = vec(pe4);
  CHECK(p[4] == doctest::Approx(std::sin(1.0)).epsilon(1e-14));
  CHECK(p[5] == doctest::Approx(std::cos(1.0)).epsilon(1e-14));
  CHECK(p[14] == doctest::Approx(std::sin(0.03)).epsilon(1e-14));

  nn::SinusoidalPositionalEncoding mod(4, 16);
  CHECK(mod.state_dict().size() == 0);
  mod.to(kFloat64);
  Tensor x = randn64({2, 3, 4}, false, 71);
  Tensor y = mod.forward(x, 5);
  Tensor table = nn::sinusoidal_encoding(3, 4, 5, 10000.0, kFloat64);
  std::vector<double> xv = vec(x), tv = vec(table), e;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 12; ++i) e.push_back(xv[b * 12 + i] + tv[i]);
  check_close(y, e, 1e-12, 0);
  // float32 input with the float64 table: the result stays float32
  CHECK(mod(randn32({3, 4})).dtype() == kFloat32);
  check_grad([&](const TensorList& in) { return TensorList{mod.forward(in[0], 2)}; }, {randn64({2, 3, 4}, true, 72)});
  check_error([&] { mod.forward(randn64({2, 3, 4}), 14); }, {"SinusoidalPositionalEncoding", "[14, 17)", "16"});
  check_error([&] { mod(randn64({2, 3, 5})); }, {"SinusoidalPositionalEncoding", "(..., T, 4)"});
}

TEST_CASE("LearnedPositionalEmbedding: adds rows offset.., gradient reaches only those rows, init std, errors") {
  manual_seed(8);
  nn::LearnedPositionalEmbedding big(1000, 100);
  auto w = vec(big.weight);
  double m = 0, v = 0;
  for (double a : w) m += a / w.size();
  for (double a : w) v += (a - m) * (a - m) / w.size();
  CHECK(std::abs(m) < 1e-3);
  CHECK(std::abs(std::sqrt(v) - 0.02) < 5e-4);

  nn::LearnedPositionalEmbedding pos(6, 3);
  pos.to(kFloat64);
  Tensor x = randn64({2, 2, 3}, false, 81);
  Tensor y = pos.forward(x, 3);
  std::vector<double> xv = vec(x), wv = vec(pos.weight), e;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 2; ++t)
      for (int c = 0; c < 3; ++c) e.push_back(xv[(b * 2 + t) * 3 + c] + wv[(3 + t) * 3 + c]);
  check_close(y, e, 1e-12, 0);
  sum(y).backward();
  std::vector<double> g(18, 0.0);
  for (int r = 3; r < 5; ++r)
    for (int c = 0; c < 3; ++c) g[r * 3 + c] = 2.0;  // two batch entries
  check_close(pos.weight.grad(), g, 0, 0);
  check_error([&] { pos.forward(x, 5); }, {"LearnedPositionalEmbedding", "[5, 7)", "max_len 6"});
}

// ---- losses --------------------------------------------------------------------------------------------------------

TEST_CASE("BCEWithLogitsLoss vs naive incl. |x| = 100, pos_weight, reductions; finite gradients at the extremes") {
  std::vector<double> xs = {-100, -30, -2.5, -0.3, 0.0, 0.7, 4.0, 30, 100, 100, -100, 1.5};
  std::vector<double> ys = {0, 1, 0.2, 1, 0, 1, 0, 0, 1, 0, 1, 0.5};
  std::vector<double> pw = {2.0, 0.5, 3.0};  // per class, inputs (4, 3)
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dt);
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    for (bool use_pw : {false, true}) {
      CAPTURE(use_pw);
      Tensor x = tensor(xs, {4, 3}, {.dtype = dt}), y = tensor(ys, {4, 3}, {.dtype = dt});
      std::vector<double> e;
      for (size_t i = 0; i < xs.size(); ++i) {
        const double p = use_pw ? pw[i % 3] : 1.0;
        e.push_back(-(p * ys[i] * log_sigmoid(xs[i]) + (1 - ys[i]) * log_sigmoid(-xs[i])));
      }
      Tensor pwt = use_pw ? tensor(pw, {3}, {.dtype = dt}) : Tensor();
      nn::BCEWithLogitsLoss none(nn::BCEWithLogitsLossOptions().pos_weight(pwt).reduction(Reduction::None));
      Tensor l = none(x, y);
      CHECK(!has_non_finite(l));
      check_close(l, e, tol, tol);
      double total = 0;
      for (double v : e) total += v;
      nn::BCEWithLogitsLoss mean_loss(nn::BCEWithLogitsLossOptions().pos_weight(pwt));
      nn::BCEWithLogitsLoss sum_loss(nn::BCEWithLogitsLossOptions().pos_weight(pwt).reduction(Reduction::Sum));
      check_close(sum_loss(x, y), {total}, tol * 10, tol);
      Tensor xg = x.clone().detach().set_requires_grad(true);
      Tensor lm = mean_loss(xg, y);
      check_close(lm, {total / 12}, tol, tol);
      lm.backward();
      // d/dx = (p y + 1 - y) sigma(x) - p y, over N
      std::vector<double> ge;
      for (size_t i = 0; i < xs.size(); ++i) {
        const double p = use_pw ? pw[i % 3] : 1.0, s = 1.0 / (1.0 + std::exp(-xs[i]));
        ge.push_back(((p * ys[i] + 1 - ys[i]) * s - p * ys[i]) / 12.0);
      }
      CHECK(!has_non_finite(xg.grad()));
      check_close(xg.grad(), ge, tol, tol);
    }
  }
}

TEST_CASE("binary_cross_entropy_with_logits: gradcheck in x, y and pos_weight; errors") {
  Tensor x = randn64({3, 4}, true, 91), y = (randn64({3, 4}, false, 92).sigmoid()).detach().set_requires_grad(true);
  Tensor pw = (randn64({4}, false, 93).abs() + 0.5).detach().set_requires_grad(true);
  check_grad([](const TensorList& in) { return TensorList{nn::binary_cross_entropy_with_logits(in[0], in[1])}; },
             {x, y});
  check_grad(
      [](const TensorList& in) {
        return TensorList{nn::binary_cross_entropy_with_logits(in[0], in[1], in[2], Reduction::None)};
      },
      {x, y, pw});
  check_error([] { nn::binary_cross_entropy_with_logits(randn64({3}), randn64({4})); },
              {"binary_cross_entropy", "[3]", "[4]"});
  check_error(
      [] {
        nn::binary_cross_entropy_with_logits(randn64({3}), tensor(std::vector<int64_t>{0, 1, 1}, {3}));
      },
      {"binary_cross_entropy", "floating"});
  nn::BCEWithLogitsLoss bad(nn::BCEWithLogitsLossOptions().pos_weight(ones({5})));
  check_error([&] { bad(randn32({2, 4}), randn32({2, 4})); }, {"BCEWithLogitsLoss", "pos_weight", "[5]", "[2, 4]"});
  check_error([] { nn::BCEWithLogitsLoss(nn::BCEWithLogitsLossOptions().pos_weight(ones({2}, {.dtype = kInt64}))); },
              {"BCEWithLogitsLoss", "floating"});
}

TEST_CASE("CrossEntropyLoss module: ignore_index and label smoothing vs naive, reductions, hooks, errors") {
  const int64_t n = 5, c = 4;
  Tensor logits = randn64({n, c}, false, 101) * 2.0;
  std::vector<int64_t> tv = {2, 0, 3, 0, 1};
  Tensor target = tensor(tv, {n});
  std::vector<double> lv = vec(logits);
  for (double s : {0.0, 0.2}) {
    CAPTURE(s);
    // ignore class 0 (two samples)
    std::vector<double> per;
    double total = 0;
    int counted = 0;
    for (int64_t i = 0; i < n; ++i) {
      double mx = -kInf, z = 0;
      for (int64_t k = 0; k < c; ++k) mx = std::max(mx, lv[i * c + k]);
      for (int64_t k = 0; k < c; ++k) z += std::exp(lv[i * c + k] - mx);
      auto logp = [&](int64_t k) { return lv[i * c + k] - mx - std::log(z); };
      double l = 0;
      if (tv[i] != 0) {
        l = -(1 - s) * logp(tv[i]);
        for (int64_t k = 0; k < c; ++k) l -= s / c * logp(k);
        total += l;
        ++counted;
      }
      per.push_back(l);
    }
    nn::CrossEntropyLoss mean_ce(nn::CrossEntropyLossOptions().ignore_index(0).label_smoothing(s));
    check_close(mean_ce(logits, target), {total / counted}, 1e-12, 1e-10);
    nn::CrossEntropyLoss sum_ce(
        nn::CrossEntropyLossOptions().ignore_index(0).label_smoothing(s).reduction(Reduction::Sum));
    check_close(sum_ce(logits, target), {total}, 1e-12, 1e-10);
    nn::CrossEntropyLoss none_ce(
        nn::CrossEntropyLossOptions().ignore_index(0).label_smoothing(s).reduction(Reduction::None));
    check_close(none_ce(logits, target), per, 1e-12, 1e-10);
  }
  nn::CrossEntropyLoss ce;
  // a pre hook sees the logits and may replace them: zero logits give log(C)
  ce.add_forward_pre_hook([](nn::Module&, const Tensor& in) -> std::optional<Tensor> { return zeros_like(in); });
  check_close(ce(logits, target), {std::log(4.0)}, 1e-12, 1e-12);
  CHECK(ce.extra_repr() == "ignore_index=-100, label_smoothing=0, reduction=mean");
  check_error([] { nn::CrossEntropyLoss(nn::CrossEntropyLossOptions().label_smoothing(1.5)); },
              {"CrossEntropyLoss", "label_smoothing", "1.5"});
  nn::CrossEntropyLoss ce2;
  check_error([&] { ce2(logits, tensor(std::vector<int64_t>{1, 2}, {2})); }, {"cross_entropy"});
}

TEST_CASE("MSELoss module vs naive, reductions, errors") {
  Tensor a = randn64({3, 4}, false, 111), b = randn64({3, 4}, false, 112);
  std::vector<double> av = vec(a), bv = vec(b), per;
  double total = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    per.push_back((av[i] - bv[i]) * (av[i] - bv[i]));
    total += per.back();
  }
  check_close(nn::MSELoss()(a, b), {total / 12}, 1e-12, 1e-10);
  check_close(nn::MSELoss(Reduction::Sum)(a, b), {total}, 1e-12, 1e-10);
  check_close(nn::MSELoss(Reduction::None)(a, b), per, 1e-12, 1e-10);
  CHECK(nn::MSELoss(Reduction::Sum).extra_repr() == "reduction=sum");
  check_error([&] { nn::MSELoss()(a, randn64({4, 3})); }, {"MSELoss", "[3, 4]", "[4, 3]"});
}
