// Local-rule hooks: per-row update masks inside the fused optimizer kernels (masked rows and their optimizer
// state bit-identical, unmasked rows equal to an unmasked run), mask modes resolved from a snapshot, Oja's rule
// converging to the top eigenvector of a covariance built here, a homeostatic EMA threshold reaching its target
// firing rate (and not adapting in eval mode), and clamps after the rule's update.
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>

#include "optim/optim.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;
using namespace asc::optim;

namespace {

bool same_row_bits(const Tensor& a, const Tensor& b, int64_t row) {
  return same_bits(a.select(0, row), b.select(0, row));
}

// A rule with a fixed "fired" pattern that is only known after observe() (the snapshot), and nothing of its own
// to apply.
struct FixedFiringRule : LocalRule {
  Tensor pattern;  // bool (rows,)
  bool have = false;
  explicit FixedFiringRule(std::vector<double> fired) {
    pattern = ne(tensor(fired, {static_cast<int64_t>(fired.size())}, {.dtype = kFloat64}), 0.0);
  }
  void observe() { have = true; }
  Tensor fired(const Tensor&) const override { return have ? pattern : Tensor(); }
  void apply() override {}
  void clear() override { have = false; }
};

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<Tensor> ps) {
  if (kind == "sgd") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1});
  if (kind == "adam") return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  if (kind == "adamw") return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  if (kind == "adamw_amsgrad")
    return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
  if (kind == "rmsprop")
    return std::make_unique<RMSprop>(
        ps, RMSpropOptions{.lr = 0.01, .weight_decay = 0.1, .momentum = 0.5, .centered = true});
  FAIL("unknown " << kind);
  return nullptr;
}

std::vector<std::string> state_names(const std::string& kind) {
  if (kind == "sgd") return {"momentum_buffer"};
  if (kind == "rmsprop") return {"square_avg", "momentum_buffer", "grad_avg"};
  if (kind == "adamw_amsgrad") return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

}  // namespace

TEST_CASE("masked rows and their optimizer state stay bit-identical; unmasked rows match an unmasked run") {
  const int64_t rows = 6, cols = 37;  // odd row length: runs of rows do not align with vector widths
  // Rows 0, 2, 3 fired; the rule lets only the rows that did NOT fire move (Inactive), so 0, 2, 3 are frozen.
  const std::vector<double> fired = {1, 0, 1, 1, 0, 0};
  for (const std::string kind : {"sgd", "adam", "adamw", "adamw_amsgrad", "rmsprop"}) {
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(kind);
      CAPTURE(dtype_name(dt));
      Tensor pa = randn64({rows, cols}, false, 5).to(dt).set_requires_grad(true);
      Tensor pb = pa.detach().clone().set_requires_grad(true);
      auto A = make(kind, {pa});
      auto B = make(kind, {pb});
      auto rule = std::make_shared<FixedFiringRule>(fired);
      rule->set_mask(pa, UpdateMask::Inactive);
      A->add_local_rule(rule);
      auto grad = [&](int t) { return randn64({rows, cols}, false, 100 + t).to(dt); };
      // 3 steps without a snapshot: no mask, A == B, state becomes non-zero.
      for (int t = 0; t < 3; ++t) {
        pa.set_grad(grad(t));
        pb.set_grad(grad(t));
        A->step();
        B->step();
      }
      REQUIRE(same_bits(pa, pb));
      Tensor p_before = pa.detach().clone();
      std::vector<Tensor> st_before;
      for (const auto& n : state_names(kind)) {
        Tensor s = A->state(pa, n);
        REQUIRE(s.defined());
        CHECK(has_non_finite(s) == false);
        CHECK(sum(abs(s)).item<double>() > 0);
        st_before.push_back(s.clone());
      }
      // 3 masked steps.
      for (int t = 3; t < 6; ++t) {
        rule->observe();
        pa.set_grad(grad(t));
        pb.set_grad(grad(t));
        A->step();
        B->step();
      }
      CHECK(A->step_count(pa) == 6);  // the per-parameter step count still advances
      for (int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        if (fired[r]) {
          CHECK(same_row_bits(pa, p_before, r));
          for (size_t k = 0; k < st_before.size(); ++k)
            CHECK(same_row_bits(A->state(pa, state_names(kind)[k]), st_before[k], r));
        } else {
          CHECK(same_row_bits(pa, pb, r));
          CHECK_FALSE(same_row_bits(pa, p_before, r));
          for (const auto& n : state_names(kind)) CHECK(same_row_bits(A->state(pa, n), B->state(pb, n), r));
        }
      }
    }
  }
}

TEST_CASE("rows masked from a parameter's first step keep a zero SGD momentum buffer") {
  Tensor p = ones({3, 2}, {.dtype = kFloat64}).set_requires_grad(true);
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  auto rule = std::make_shared<FixedFiringRule>(std::vector<double>{1, 0, 1});
  rule->set_mask(p, UpdateMask::Active);
  opt.add_local_rule(rule);
  rule->observe();
  p.set_grad(full({3, 2}, 2.0, {.dtype = kFloat64}));
  opt.step();
  check_close(p, {0.8, 0.8, 1, 1, 0.8, 0.8}, 0, 0);
  check_close(opt.state(p, "momentum_buffer"), {2, 2, 0, 0, 2, 2}, 0, 0);
  // Next step unmasked (no snapshot): row 1's buffer starts from 0: 0.9 * 0 + 2 = 2, the same as torch's init.
  opt.step();
  check_close(opt.state(p, "momentum_buffer"), {3.8, 3.8, 2, 2, 3.8, 3.8}, 1e-15, 0);
  check_close(p, {0.42, 0.42, 0.8, 0.8, 0.42, 0.42}, 1e-15, 1e-15);
}

namespace {
// Records a gate F (B, P) in training mode; fired = batch-mean F > 0.
struct GateRule : LocalRule {
  Tensor F;
  bool training = true;
  void observe(const Tensor& f) {
    if (training) F = f.detach();
  }
  Tensor fired(const Tensor&) const override { return F.defined() ? active_rows(F) : Tensor(); }
  void apply() override {}
  void clear() override { F = Tensor(); }
};
}  // namespace

TEST_CASE("mask modes All / Active / Inactive resolved from a snapshot") {
  // F (4, 5): neuron 0 fires twice, 1 never, 2 once, 3 never, 4 always.
  const std::vector<double> Fv = {1, 0, 0, 0, 1,  //
                                  0, 0, 1, 0, 1,  //
                                  1, 0, 0, 0, 1,  //
                                  0, 0, 0, 0, 1};
  std::vector<bool> active(5, false);
  for (int b = 0; b < 4; ++b)
    for (int p = 0; p < 5; ++p) active[p] = active[p] || Fv[b * 5 + p] > 0;
  Tensor F = tensor(Fv, {4, 5}, {.dtype = kFloat64});
  Tensor W = zeros({5, 3}, {.dtype = kFloat64}).set_requires_grad(true);
  Tensor f = zeros({5, 2}, {.dtype = kFloat64}).set_requires_grad(true);
  Tensor other = zeros({5}, {.dtype = kFloat64}).set_requires_grad(true);
  GateRule rule;
  CHECK_FALSE(rule.row_mask(W).defined());  // not registered
  rule.set_mask(W, UpdateMask::Active);
  rule.set_mask(f, UpdateMask::Inactive);
  rule.set_mask(other, UpdateMask::All);
  CHECK(rule.masks(W));
  CHECK_FALSE(rule.masks(other));
  CHECK_FALSE(rule.row_mask(W).defined());  // no snapshot: every row moves
  rule.observe(F);
  Tensor mw = rule.row_mask(W), mf = rule.row_mask(f);
  REQUIRE(mw.defined());
  CHECK(mw.dtype() == kBool);
  CHECK(mw.shape() == Shape{5});
  for (int p = 0; p < 5; ++p) {
    CHECK(mw.to_vector<bool>()[p] == active[p]);
    CHECK(mf.to_vector<bool>()[p] == !active[p]);
  }
  CHECK_FALSE(rule.row_mask(other).defined());

  // Through a step: W moves on active rows only, f on inactive rows only, other everywhere.
  auto r = std::make_shared<GateRule>();
  r->set_mask(W, UpdateMask::Active);
  r->set_mask(f, UpdateMask::Inactive);
  SGD opt({W, f, other}, {.lr = 1.0});
  opt.add_local_rule(r);
  r->observe(F);
  W.set_grad(ones({5, 3}, {.dtype = kFloat64}));
  f.set_grad(ones({5, 2}, {.dtype = kFloat64}));
  other.set_grad(ones({5}, {.dtype = kFloat64}));
  opt.step();
  for (int p = 0; p < 5; ++p) {
    CHECK(W.to_vector<double>()[p * 3] == (active[p] ? -1.0 : 0.0));
    CHECK(f.to_vector<double>()[p * 2] == (active[p] ? 0.0 : -1.0));
    CHECK(other.to_vector<double>()[p] == -1.0);
  }
  CHECK_FALSE(r->F.defined());  // the snapshot was consumed

  // Eval mode: nothing recorded, so no mask.
  r->training = false;
  r->observe(F);
  CHECK_FALSE(r->row_mask(W).defined());

  // Two rules on one parameter: masks are AND-ed (Active of one, Inactive of a rule that saw a different gate).
  Tensor V = zeros({5, 1}, {.dtype = kFloat64}).set_requires_grad(true);
  auto r1 = std::make_shared<GateRule>(), r2 = std::make_shared<GateRule>();
  r1->set_mask(V, UpdateMask::Active);    // rows 0, 2, 4
  r2->set_mask(V, UpdateMask::Inactive);  // rows that did not fire in G: G fires on 0, 1
  SGD o2({V}, {.lr = 1.0});
  o2.add_local_rule(r1);
  o2.add_local_rule(r2);
  r1->observe(F);
  r2->observe(tensor({1, 1, 0, 0, 0}, {1, 5}, {.dtype = kFloat64}));
  V.set_grad(ones({5, 1}, {.dtype = kFloat64}));
  o2.step();
  check_close(V, {0, 0, -1, 0, -1}, 0, 0);
}

TEST_CASE("a bad mask from a rule is an error and nothing moves") {
  struct BadRule : LocalRule {
    std::string name() const override { return "BadRule"; }
    Tensor fired(const Tensor&) const override { return ones({4}, {.dtype = kBool}); }
    void apply() override { FAIL("apply must not run"); }
  };
  Tensor a = ones({3, 2}, {.dtype = kFloat64}).set_requires_grad(true);
  Tensor b = ones({5, 2}, {.dtype = kFloat64}).set_requires_grad(true);
  SGD opt({a, b}, {.lr = 1.0});
  auto r = std::make_shared<BadRule>();
  r->set_mask(b, UpdateMask::Active);
  opt.add_local_rule(r);
  a.set_grad(ones({3, 2}, {.dtype = kFloat64}));
  b.set_grad(ones({5, 2}, {.dtype = kFloat64}));
  check_error([&] { opt.step(); }, {"BadRule", "[5]", "[4]"});
  check_close(a, std::vector<double>(6, 1.0), 0, 0);
  check_error([&] { opt.add_local_rule(r); }, {"already attached"});
  check_error([&] { r->set_mask(scalar_tensor(1.0), UpdateMask::Active); }, {"BadRule::set_mask", "at least one dim"});
  check_error([&] { r->set_range(a, 1.0, -1.0); }, {"BadRule::set_range", "lo <= hi"});
  check_error([&] { r->set_range(tensor(std::vector<int64_t>{1}, {1}), 0, 1); }, {"BadRule::set_range", "int64"});
}

namespace {
// Adds +shift to `p` in apply() (after the gradient update); clamps p and a buffer.
struct ShiftRule : LocalRule {
  Tensor p, buf;
  double shift;
  ShiftRule(Tensor p_, Tensor buf_, double s) : p(p_), buf(buf_), shift(s) {
    set_range(p, -0.5, 0.25);
    set_range(buf, 0.0, 1.0);
  }
  void apply() override {
    p.add_(full_like(p, shift));
    buf.add_(full_like(buf, shift));
  }
};
}  // namespace

TEST_CASE("clamps run after the rule's update") {
  const std::vector<double> p0 = {-2, -0.4, 0, 0.1, 0.3, 3}, g = {1, 1, -1, -1, 1, -2};
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor p = tensor(p0, {2, 3}).to(dt).set_requires_grad(true);
    Tensor buf = tensor({-3.0, 0.5, 0.95}, {3}, {.dtype = dt});
    SGD opt({p}, {.lr = 0.1});
    opt.add_local_rule(std::make_shared<ShiftRule>(p, buf, 0.1));
    p.set_grad(tensor(g, {2, 3}).to(dt));
    opt.step();
    std::vector<double> e(6);
    for (int i = 0; i < 6; ++i) e[i] = std::clamp(p0[i] - 0.1 * g[i] + 0.1, -0.5, 0.25);
    check_close(p, e, 1e-7, 0);
    check_close(buf, {0.0, 0.6, 1.0}, 1e-7, 0);
  }
}

// ---- Oja's rule -----------------------------------------------------------------------------------------------

namespace {
// One linear neuron y = w . x; Δw = η mean_b y (x − y w). w is a parameter the optimizer never gets a grad for.
struct OjaRule : LocalRule {
  Tensor w;  // (d,)
  Tensor X;  // snapshot (B, d)
  double eta = 0.01;
  bool training = true;
  explicit OjaRule(Tensor w_) : w(w_) {}
  void observe(const Tensor& x) {
    if (training) X = x.detach();
  }
  void apply() override {
    if (!X.defined()) return;
    Tensor x = X.to(kFloat64), wv = w.detach().to(kFloat64);
    Tensor y = matmul(x, wv.unsqueeze(1)).squeeze(1);  // (B,)
    const double B = static_cast<double>(x.size(0));
    Tensor hebb = matmul(x.t(), y.unsqueeze(1)).squeeze(1) / B;  // mean_b y x, (d,)
    Tensor decay = wv * (sum(y * y) / B);                        // mean_b y^2 w
    w.add_((hebb - decay).to(w.dtype()), eta);
  }
  void clear() override { X = Tensor(); }
};

// Columns of a d x d orthonormal matrix from Gram-Schmidt on a seeded random matrix (plain loops).
std::vector<std::vector<double>> orthonormal_basis(int d, uint64_t seed) {
  std::vector<double> a = randn64({d, d}, false, seed).to_vector<double>();
  std::vector<std::vector<double>> q;
  for (int j = 0; j < d; ++j) {
    std::vector<double> v(d);
    for (int i = 0; i < d; ++i) v[i] = a[i * d + j];
    for (const auto& u : q) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += u[i] * v[i];
      for (int i = 0; i < d; ++i) v[i] -= dot * u[i];
    }
    double n = 0;
    for (double x : v) n += x * x;
    n = std::sqrt(n);
    for (double& x : v) x /= n;
    q.push_back(v);
  }
  return q;
}
}  // namespace

TEST_CASE("Oja's rule alone converges to the top eigenvector of the input covariance") {
  const int d = 8, B = 256;
  auto Q = orthonormal_basis(d, 2024);
  std::vector<double> lambda = {5, 1, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625};
  // X = N diag(sqrt λ) Qᵀ for N ~ N(0, I): covariance Q diag(λ) Qᵀ, top eigenvector Q[0].
  std::vector<double> mix(d * d);  // (d, d): row k = sqrt(λ_k) q_k
  for (int k = 0; k < d; ++k)
    for (int i = 0; i < d; ++i) mix[k * d + i] = std::sqrt(lambda[k]) * Q[k][i];
  Tensor M = tensor(mix, {d, d});
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    Tensor w = (randn64({d}, false, 9) * 0.3).to(dt).set_requires_grad(true);
    SGD opt({w}, {.lr = 0.0});
    auto rule = std::make_shared<OjaRule>(w);
    opt.add_local_rule(rule);
    Generator gen(77);
    for (int it = 0; it < 1500; ++it) {
      rule->eta = it < 1000 ? 0.02 : 0.004;
      Tensor X = matmul(randn({B, d}, {.dtype = kFloat64}, &gen), M).to(dt);
      rule->observe(X);
      opt.step();
    }
    std::vector<double> wv = w.to_vector<double>();
    double n = 0, dot = 0;
    for (int i = 0; i < d; ++i) {
      n += wv[i] * wv[i];
      dot += wv[i] * Q[0][i];
    }
    n = std::sqrt(n);
    const double angle = std::acos(std::min(1.0, std::abs(dot) / n)) * 180.0 / std::numbers::pi;
    MESSAGE(fmt::format("Oja ({}): angle {:.3f} deg, |w| = {:.5f}", dtype_name(dt), angle, n));
    CHECK(angle <= 3.0);
    CHECK(std::abs(n - 1.0) <= 0.01);
    CHECK(opt.step_count(w) == 0);  // never a gradient step

    // Eval mode: no snapshot, w bit-identical.
    rule->training = false;
    Tensor before = w.detach().clone();
    rule->observe(matmul(randn({B, d}, {.dtype = kFloat64}, &gen), M).to(dt));
    opt.step();
    CHECK(same_bits(w, before));
  }
}

// ---- homeostatic threshold --------------------------------------------------------------------------------------

namespace {
// F = 1[z >= SP] recorded by the "layer"; r̄ <- (1 - β) r̄ + β mean_b F; SP <- SP + η (r̄ - r*).
struct ThresholdRule : LocalRule {
  Tensor SP, r_bar;  // (P,) buffers owned by the rule's layer
  Tensor F;          // snapshot (B, P)
  double beta = 0.1, eta = 0.15, target = 0.1;
  bool training = true;
  ThresholdRule(Tensor sp, Tensor rb) : SP(sp), r_bar(rb) {}
  void observe(const Tensor& f) {
    if (training) F = f.detach();
  }
  void apply() override {
    if (!F.defined()) return;
    Tensor rate = mean(F.to(kFloat64), {0});
    r_bar.copy_(r_bar * (1 - beta) + rate * beta);
    SP.add_(r_bar - target, eta);
  }
  void clear() override { F = Tensor(); }
};
}  // namespace

TEST_CASE("a homeostatic EMA threshold drives every neuron to the target firing rate") {
  const int P = 100, d = 16, B = 256;
  Generator gen(5);
  // Neuron p: z = s_p w_p . x + b_p + 0.5 noise, x ~ N(0, I): different scales (0.5..2) and offsets (-1..1).
  Tensor Wdir = randn({P, d}, {.dtype = kFloat64}, &gen);
  Wdir = Wdir / sqrt(sum(Wdir * Wdir, {1}, true));
  Tensor scale = arange(0, P, 1, {.dtype = kFloat64}) * (1.5 / (P - 1)) + 0.5;
  Tensor W = Wdir * scale.unsqueeze(1);                                        // (P, d)
  Tensor bias = arange(0, P, 1, {.dtype = kFloat64}) * (2.0 / (P - 1)) - 1.0;  // (P,)
  auto layer_z = [&](int n) {
    Tensor x = randn({n, d}, {.dtype = kFloat64}, &gen);
    return matmul(x, W.t()) + bias + randn({n, P}, {.dtype = kFloat64}, &gen) * 0.5;  // (n, P)
  };
  Tensor SP = zeros({P}, {.dtype = kFloat64});
  Tensor r_bar = full({P}, 0.1, {.dtype = kFloat64});
  Tensor dummy = zeros({1}, {.dtype = kFloat64}).set_requires_grad(true);
  SGD opt({dummy}, {.lr = 0.0});
  auto rule = std::make_shared<ThresholdRule>(SP, r_bar);
  opt.add_local_rule(rule);
  for (int it = 0; it < 2000; ++it) {
    if (it == 1400) rule->eta = 0.03;  // anneal: smaller steady-state jitter
    Tensor z = layer_z(B);
    rule->observe(ge(z, SP).to(kFloat64));
    opt.step();
  }
  // Fresh data: per-neuron firing rate (plain loops over the values).
  const int N = 100000;
  std::vector<double> zv = layer_z(N).to_vector<double>(), sp = SP.to_vector<double>();
  std::vector<double> rate(P, 0.0);
  for (int n = 0; n < N; ++n)
    for (int p = 0; p < P; ++p) rate[p] += zv[static_cast<size_t>(n) * P + p] >= sp[p] ? 1.0 : 0.0;
  double worst = 0, mean_rate = 0;
  for (int p = 0; p < P; ++p) {
    rate[p] /= N;
    worst = std::max(worst, std::abs(rate[p] - 0.1));
    mean_rate += rate[p] / P;
  }
  MESSAGE(fmt::format("homeostasis: worst |rate - 0.1| = {:.4f}, mean rate = {:.5f}, SP range [{:.3f}, {:.3f}]", worst,
                      mean_rate, *std::min_element(sp.begin(), sp.end()), *std::max_element(sp.begin(), sp.end())));
  CHECK(worst <= 0.01);
  CHECK(std::abs(mean_rate - 0.1) <= 0.002);
  // Thresholds differ by neuron: the larger-variance, larger-offset neurons need a higher SP.
  CHECK(sp[P - 1] > sp[0] + 1.0);

  // Eval mode: the layer records nothing, so step() leaves SP and r̄ bit-identical.
  rule->training = false;
  Tensor sp_before = SP.clone(), rb_before = r_bar.clone();
  for (int it = 0; it < 5; ++it) {
    rule->observe(ge(layer_z(B), SP).to(kFloat64));
    opt.step();
  }
  CHECK(same_bits(SP, sp_before));
  CHECK(same_bits(r_bar, rb_before));
  // Training again but a step without a new forward: the consumed snapshot is not applied twice.
  rule->training = true;
  rule->observe(ge(layer_z(B), SP).to(kFloat64));
  opt.step();
  Tensor sp_after = SP.clone();
  opt.step();
  CHECK(same_bits(SP, sp_after));
}
