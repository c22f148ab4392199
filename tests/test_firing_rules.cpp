// The firing perceptron's learning rules as Optimizer::step() runs them (optim/firing_rules.h, docs/firing.md §4-5):
//   - rule B is ONE simultaneous update: one step against an independent float64 loop implementation of the formula
//     (the Oja terms from the pre-step W and f) under SGD with momentum and weight decay, Adam, and fuse_sgd, to
//     1e-12; the sequential variant against its own formula; rule A's terms from the pre-step W too;
//   - validate-then-commit: a bad snapshot or a bad gradient makes step() throw with nothing changed (a rejected
//     snapshot is dropped, a gradient error keeps it);
//   - fuse_sgd's deferred gradient is W's .grad: the optimizer's and the module's zero_grad() drop it;
//   - defaults that do no harm: a rule whose clip range does not hold the layer is refused when attached, naming both
//     fixes; the layer's non-negative initialisation;
//   - the "Accepted options" table of docs/firing.md (rules and loaded state), each bound, each side.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

using Vec = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

enum class Opt { SGDMomentum, Adam, FusedSGD };

// A dense float64 layer's values: X (N, D), W (P, D) in ±0.7, f (P, A) in [0.2, 0.8], SP (neuron 3 never fires),
// the rule state, and the upstream gradient G (N, P, A) of the loss <G, Y>.
struct Case {
  int64_t N = 12, D = 5, P = 4, A = 3;
  Vec X, W, f, SP, G, r_bar, m_bar;
};

Case make_case(uint64_t seed) {
  Case c;
  Generator g(seed);
  auto uniform = [&](int64_t k, double lo, double hi) {
    Vec v = rand({k}, {.dtype = kFloat64}, &g).to_vector<double>();
    for (double& x : v) x = lo + (hi - lo) * x;
    return v;
  };
  c.X = randn({c.N * c.D}, {.dtype = kFloat64}, &g).to_vector<double>();
  c.W = uniform(c.P * c.D, -0.7, 0.7);
  c.f = uniform(c.P * c.A, 0.2, 0.8);
  c.SP = {-0.1, 0.05, -0.2, 100.0};
  c.G = randn({c.N * c.P * c.A}, {.dtype = kFloat64}, &g).to_vector<double>();
  c.r_bar = {0.1, 0.5, 0.0, 0.2};
  c.m_bar = {0.0, 0.1, 0.2, 0.3};
  return c;
}

struct Out {
  Vec W, f, SP, r_bar, m_bar;
};

bool row_moves(optim::UpdateMask m, bool active) {
  return m == optim::UpdateMask::All || (m == optim::UpdateMask::Active) == active;
}

// One step in plain loops: forward, the gradients of <G, Y>, the optimizer's first step on W and f (rows the masks
// allow), rule B's local terms — from the pre-step W and f (simultaneous) or from the optimizer's result
// (sequential) —, homeostasis, the clips. Written from docs/firing.md §4 and torch.optim's first-step formulas.
Out naive_step(const Case& c, const optim::RuleBOptions& o, Opt kind, double lr, double wd) {
  const int64_t N = c.N, D = c.D, P = c.P, A = c.A;
  Vec Z(N * P), F(N * P), Y(N * P * A);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      double z = 0;
      for (int64_t k = 0; k < D; ++k) z += c.W[p * D + k] * c.X[b * D + k];
      Z[b * P + p] = z;
      F[b * P + p] = z >= c.SP[p] ? 1.0 : 0.0;
      for (int64_t g = 0; g < A; ++g) Y[(b * P + p) * A + g] = F[b * P + p] * c.f[p * A + g] * z;
    }
  Vec dW(P * D, 0.0), df(P * A, 0.0);
  std::vector<bool> active(P, false);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const int64_t bp = b * P + p;
      active[p] = active[p] || F[bp] > 0;
      double S = 0;
      for (int64_t g = 0; g < A; ++g) {
        S += c.G[bp * A + g] * c.f[p * A + g];
        df[p * A + g] += c.G[bp * A + g] * F[bp] * Z[bp];
      }
      for (int64_t k = 0; k < D; ++k) dW[p * D + k] += F[bp] * S * c.X[b * D + k];
    }
  // The optimizer's first step (torch.optim): L2 weight decay in the gradient; SGD's momentum buffer starts at the
  // gradient; Adam's bias-corrected moments are g and g² on the first step.
  auto opt_step = [&](const Vec& w0, const Vec& grad, int64_t cols, optim::UpdateMask mask) {
    Vec w = w0;
    for (int64_t p = 0; p < P; ++p) {
      if (!row_moves(mask, active[p])) continue;
      for (int64_t k = 0; k < cols; ++k) {
        const double g = grad[p * cols + k] + wd * w0[p * cols + k];
        if (kind == Opt::Adam) {
          const double m = (1 - 0.9) * g / (1 - 0.9), v = (1 - 0.999) * g * g / (1 - 0.999);
          w[p * cols + k] -= lr * m / (std::sqrt(v) + 1e-8);
        } else {
          w[p * cols + k] -= lr * g;
        }
      }
    }
    return w;
  };
  const Vec Wo = opt_step(c.W, dW, D, o.mask_w), fo = opt_step(c.f, df, A, o.mask_f);
  const Vec& Wb = o.sequential ? Wo : c.W;  // what the Oja decay reads
  const Vec& fb = o.sequential ? fo : c.f;
  const double zr2 = o.z_ref * o.z_ref + o.eps_z, yr2 = o.y_ref * o.y_ref + o.eps_y;
  Out r{Wo, fo, c.SP, c.r_bar, c.m_bar};
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t k = 0; k < D; ++k) {
      double s = 0;
      for (int64_t b = 0; b < N; ++b) {
        const double z = Z[b * P + p];
        s += F[b * P + p] * (z * c.X[b * D + k] - z * z / zr2 * Wb[p * D + k]);
      }
      r.W[p * D + k] = std::clamp(Wo[p * D + k] + o.eta_w * s / N, o.w_min, o.w_max);
    }
    for (int64_t g = 0; g < A; ++g) {
      double s = 0;
      for (int64_t b = 0; b < N; ++b) {
        const double y = Y[(b * P + p) * A + g], z = Z[b * P + p];
        s += F[b * P + p] * (y * z - y * y / yr2 * fb[p * A + g]);
      }
      r.f[p * A + g] = std::clamp(fo[p * A + g] + o.eta_f * s / N, o.f_min, o.f_max);
    }
    double rate = 0, margin = 0;
    for (int64_t b = 0; b < N; ++b) {
      rate += F[b * P + p] / N;
      margin += F[b * P + p] * std::max(0.0, (Z[b * P + p] - c.SP[p]) / (o.z_ref + o.eps_z)) / N;
    }
    r.r_bar[p] = (1 - o.beta_r) * c.r_bar[p] + o.beta_r * rate;
    r.m_bar[p] = (1 - o.beta_m) * c.m_bar[p] + o.beta_m * margin;
    r.SP[p] = std::clamp(
        c.SP[p] + o.eta_sp * (o.lambda_r * (r.r_bar[p] - o.r_target) + o.lambda_m * (r.m_bar[p] - o.m_target)),
        o.sp_min, o.sp_max);
  }
  return r;
}

std::shared_ptr<nn::FiringLinear> build(const Case& c) {
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(c.D, c.P).fan_out(c.A));
  layer->to(kFloat64);
  NoGradGuard ng;
  layer->W.copy_(tensor(c.W, {c.P, c.D}));
  layer->f.copy_(tensor(c.f, {c.P, c.A}));
  layer->SP.copy_(tensor(c.SP, {c.P}));
  layer->r_bar.copy_(tensor(c.r_bar, {c.P}));
  layer->m_bar.copy_(tensor(c.m_bar, {c.P}));
  return layer;
}

std::unique_ptr<optim::Optimizer> make_opt(Opt kind, const std::vector<Tensor>& params, double lr, double wd) {
  if (kind == Opt::Adam) return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = lr, .weight_decay = wd});
  return std::make_unique<optim::SGD>(
      params, optim::SGDOptions{.lr = lr, .momentum = kind == Opt::SGDMomentum ? 0.9 : 0.0, .weight_decay = wd});
}

// Runs one step of the layer with rule B (options o) and returns W, f, SP, r̄, m̄.
Out run_step(const Case& c, optim::RuleBOptions o, Opt kind, double lr, double wd) {
  auto layer = build(c);
  o.fuse_sgd = kind == Opt::FusedSGD;
  auto opt = make_opt(kind, layer->parameters(), lr, wd);
  opt->add_local_rule(optim::rule_b(*layer, o));
  sum(layer->forward(tensor(c.X, {c.N, c.D})) * tensor(c.G, {c.N, c.P, c.A})).backward();
  opt->step();
  return {layer->W.to_vector<double>(), layer->f.to_vector<double>(), layer->SP.to_vector<double>(),
          layer->r_bar.to_vector<double>(), layer->m_bar.to_vector<double>()};
}

double max_diff(const Vec& a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void check_vec(const Vec& got, const Vec& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE(
    "rule B is one simultaneous update: one step against the formula in float64 loops (SGD with momentum and "
    "weight decay, Adam, fuse_sgd; each mask), and the sequential variant against its own") {
  const Case c = make_case(11);
  for (Opt kind : {Opt::SGDMomentum, Opt::Adam, Opt::FusedSGD})
    for (optim::UpdateMask mask : {optim::UpdateMask::All, optim::UpdateMask::Active, optim::UpdateMask::Inactive})
      for (bool sequential : {false, true}) {
        CAPTURE(static_cast<int>(kind));
        CAPTURE(static_cast<int>(mask));
        CAPTURE(sequential);
        const optim::RuleBOptions o{.eta_w = 0.05,
                                    .eta_f = 0.07,
                                    .eta_sp = 0.3,
                                    .z_ref = 0.8,
                                    .y_ref = 0.6,
                                    .beta_r = 0.3,
                                    .beta_m = 0.4,
                                    .r_target = 0.2,
                                    .m_target = 0.05,
                                    .lambda_r = 1.0,
                                    .lambda_m = 0.5,
                                    .w_min = -0.7,
                                    .w_max = 0.75,
                                    .f_min = -1,
                                    .f_max = 0.9,
                                    .sp_min = -0.15,
                                    .sp_max = 50,
                                    .mask_w = mask,
                                    .mask_f = mask,
                                    .sequential = sequential};
        const double lr = kind == Opt::Adam ? 0.02 : 0.1, wd = 0.05;
        const Out got = run_step(c, o, kind, lr, wd), want = naive_step(c, o, kind, lr, wd);
        check_vec(got.W, want.W, 1e-12);
        check_vec(got.f, want.f, 1e-12);
        check_vec(got.SP, want.SP, 1e-12);
        check_vec(got.r_bar, want.r_bar, 1e-12);
        check_vec(got.m_bar, want.m_bar, 1e-12);
        // The two forms differ at second order (η_bp · η_w) — well above the tolerance, so this test tells them apart.
        optim::RuleBOptions other = o;
        other.sequential = !sequential;
        const Out alt = naive_step(c, other, kind, lr, wd);
        if (mask != optim::UpdateMask::Inactive) {  // Inactive: only the silent neuron moves, and it has no Oja term
          CHECK(max_diff(alt.W, want.W) > 1e-6);
          CHECK(max_diff(alt.f, want.f) > 1e-6);
        }
        CHECK(same_bits(tensor(alt.SP, {c.P}), tensor(want.SP, {c.P})));  // SP's term reads no parameter
      }
}

TEST_CASE(
    "rule B simultaneous: the local terms read the pre-step W even when the optimizer moves W a lot; with lr 0 "
    "both forms agree") {
  const Case c = make_case(12);
  const optim::RuleBOptions o{.eta_w = 0.05, .eta_f = 0.05, .w_min = -10, .w_max = 10, .f_min = -10, .f_max = 10};
  // lr 0: the optimizer moves nothing, so pre-step = post-step and the two forms give the same W.
  optim::RuleBOptions seq = o;
  seq.sequential = true;
  check_vec(run_step(c, o, Opt::SGDMomentum, 0.0, 0.0).W, run_step(c, seq, Opt::SGDMomentum, 0.0, 0.0).W, 1e-15);
  check_vec(run_step(c, o, Opt::FusedSGD, 0.0, 0.0).W, run_step(c, seq, Opt::FusedSGD, 0.0, 0.0).W, 1e-15);
  // A large step: the simultaneous W is W_pre + ΔW(opt) + ΔW(Oja, W_pre) — the Oja term does not see the step.
  const Out a = run_step(c, o, Opt::SGDMomentum, 1.0, 0.0), b = naive_step(c, o, Opt::SGDMomentum, 1.0, 0.0);
  check_vec(a.W, b.W, 1e-12);
}

TEST_CASE("rule A reads the pre-step W and f when an optimizer moves them in the same step") {
  const int64_t N = 10, D = 4, P = 3;
  Generator g(13);
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(D, P).init(nn::FiringInit::NonNegative));
  layer->to(kFloat64);
  const Tensor x = randn({N, D}, {.dtype = kFloat64}, &g), G = randn({N, P}, {.dtype = kFloat64}, &g);
  const Vec W0 = layer->W.to_vector<double>(), f0 = layer->f.to_vector<double>(), X = x.to_vector<double>();
  const optim::RuleAOptions o{.eta_plus = 0.2,
                              .eta_minus = 0.15,
                              .rho_plus = 0.3,
                              .rho_minus = 0.25,
                              .eta_sp = 0.4,
                              .z_max = 1.5,
                              .w_max = 0.9,
                              .f_max = 1.5,
                              .beta = 0.3,
                              .r_target = 0.25};
  const double lr = 0.3;
  optim::SGD opt(layer->parameters(), {.lr = lr});
  opt.add_local_rule(optim::rule_a(*layer, o));
  sum(layer->forward(x) * G).backward();
  const Vec dW = layer->W.grad().to_vector<double>(), df = layer->f.grad().to_vector<double>();
  opt.step();
  Vec Z(N * P), F(N * P);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t k = 0; k < D; ++k) Z[b * P + p] += W0[p * D + k] * X[b * D + k];
      F[b * P + p] = Z[b * P + p] >= 0.0 ? 1.0 : 0.0;
    }
  Vec W(P * D), f(P);
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t k = 0; k < D; ++k) {
      double pot = 0, dep = 0;
      for (int64_t b = 0; b < N; ++b) {
        pot += std::max(0.0, Z[b * P + p]) * X[b * D + k] / N;
        dep += std::max(0.0, -Z[b * P + p]) * X[b * D + k] / N;
      }
      const double w = W0[p * D + k];  // the pre-step W in the soft bounds
      W[p * D + k] =
          std::clamp(w - lr * dW[p * D + k] + o.eta_plus * pot * (1 - w / o.w_max) - o.eta_minus * dep * (w / o.w_max),
                     0.0, o.w_max);
    }
    double grow = 0, silent = 0;
    for (int64_t b = 0; b < N; ++b) grow += F[b * P + p] * Z[b * P + p] / o.z_max / N, silent += (1 - F[b * P + p]) / N;
    f[p] = std::clamp(
        f0[p] - lr * df[p] + o.rho_plus * grow * (1 - f0[p] / o.f_max) - o.rho_minus * silent * (f0[p] / o.f_max), 0.0,
        o.f_max);
  }
  check_close(layer->W, W, 1e-13, 1e-12);
  check_close(layer->f, f, 1e-13, 1e-12);
}

// ---- validate, then commit --------------------------------------------------------------------------------------

namespace {

// Everything a failed step must leave untouched.
struct Frozen {
  std::vector<Tensor> tensors;
  int64_t steps;
  Tensor momentum;
};
Frozen freeze(const nn::FiringLayer& l, const optim::Optimizer& opt) {
  const Tensor m = opt.state(l.W, "momentum_buffer");
  return {{l.W.clone(), l.f.clone(), l.SP.clone(), l.r_bar.clone(), l.m_bar.clone(), l.f_bar.clone()},
          opt.step_count(l.W),
          m.defined() ? m.clone() : Tensor()};
}
void check_frozen(const nn::FiringLayer& l, const optim::Optimizer& opt, const Frozen& s) {
  const std::vector<Tensor> now{l.W, l.f, l.SP, l.r_bar, l.m_bar, l.f_bar};
  for (size_t i = 0; i < now.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(now[i], s.tensors[i]));
  }
  CHECK(opt.step_count(l.W) == s.steps);
  CHECK(same_bits(opt.state(l.W, "momentum_buffer"), s.momentum));
}

}  // namespace

TEST_CASE(
    "a snapshot the rule rejects makes step() throw before anything moves; the snapshot is dropped, so the "
    "next step runs the gradient update alone") {
  using Snap = optim::FiringSnapshot;
  const int64_t N = 6, D = 5, P = 4;
  const Tensor x = randn({N, D}), tok = tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {N});
  // Each bad snapshot, made from a good one.
  const std::vector<std::pair<const char*, std::function<void(Snap&)>>> bad = {
      {"do not match",
       [&](Snap& s) {
         s.Z = randn({N, P + 1});
       }},
      {"do not match",
       [&](Snap& s) {
         s.F = zeros({N + 1, P});
       }},
      {"do not match",
       [&](Snap& s) {
         s.f = ones({P, 2});
       }},
      {"do not match", [&](Snap& s) { s.SP = zeros({P + 1}); }},
      {"snapshot X",
       [&](Snap& s) {
         s.X = randn({N, D + 1});
       }},
      {"snapshot X",
       [&](Snap& s) {
         s.X = randn({N + 1, D});
       }},
      {"snapshot X",
       [&](Snap& s) {
         s.X = randn({N, D, P + 1});
       }},
      {"snapshot X",
       [&](Snap& s) {
         s.X = tensor(std::vector<int64_t>(N * D, 1), {N, D});
       }},
      {"exactly one of X and tok", [&](Snap& s) { s.tok = tok; }},
      {"exactly one of X and tok", [&](Snap& s) { s.X = Tensor(); }},
      {"must be floating",
       [&](Snap& s) {
         s.F = zeros({N, P}, {.dtype = kFloat64});
       }},
      {"needs Z, F, f and SP", [&](Snap& s) { s.Z = Tensor(); }},
      {"deferred gradient",
       [&](Snap& s) {
         s.dZ = std::make_shared<Tensor>(randn({N, P + 2}));
       }},
  };
  for (const auto& [fragment, spoil] : bad) {
    INFO("refusal: " << fragment);  // CAPTURE of a const char* would print the pointer
    manual_seed(20);
    auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(D, P).threshold(-0.2));
    optim::SGD opt(layer->parameters(), {.lr = 0.1, .momentum = 0.9});
    auto rule = optim::rule_b(*layer, {.w_min = -1});
    opt.add_local_rule(rule);
    sum(layer->forward(x)).backward();
    opt.step();  // a good step: the momentum buffer and r̄ exist
    sum(layer->forward(x) * 2.0).backward();
    Snap s{x.detach(), Tensor(), randn({N, P}), ones({N, P}), layer->f.detach().clone(), layer->SP.detach().clone(),
           nullptr};
    spoil(s);
    rule->observe(s);
    const Frozen before = freeze(*layer, opt);
    check_error([&] { opt.step(); }, {"FiringRuleB", fragment});
    check_frozen(*layer, opt, before);
    CHECK(!rule->has_snapshot());  // dropped: it can never become valid
    // The next step: the gradient update alone (no snapshot: the rule adds nothing, r̄ stays).
    opt.step();
    CHECK(!same_bits(layer->W, before.tensors[0]));
    CHECK(same_bits(layer->r_bar, before.tensors[3]));
    CHECK(same_bits(layer->SP, before.tensors[2]));
  }
  // The index path: a token outside [0, V).
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(6, P));
  optim::SGD opt(emb->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto rule = optim::rule_b(*emb, {.w_min = -1});
  opt.add_local_rule(rule);
  sum(emb->forward(tok)).backward();
  rule->observe({Tensor(), tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 6}, {N}), randn({N, P}), ones({N, P}),
                 emb->f.detach().clone(), emb->SP.detach().clone(), nullptr});
  const Frozen before = freeze(*emb, opt);
  check_error([&] { opt.step(); }, {"FiringRuleB", "token 6 out of range [0, 6)"});
  check_frozen(*emb, opt, before);
}

TEST_CASE("a step that fails on a gradient or on another rule leaves every layer, rule state and snapshot as it was") {
  const Tensor x = randn({8, 5});
  manual_seed(21);
  auto a = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).threshold(-0.2));
  auto b = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 3).threshold(-0.2));
  std::vector<Tensor> params = a->parameters();
  for (const Tensor& p : b->parameters()) params.push_back(p);
  optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
  auto ra = optim::rule_b(*a, {.w_min = -1}), rb = optim::rule_b(*b, {.w_min = -1});
  opt.add_local_rule(ra);
  opt.add_local_rule(rb);
  (sum(a->forward(x)) + sum(b->forward(x))).backward();
  // A gradient of the wrong shape on b's f: refused, a's and b's tensors untouched, both snapshots kept.
  const Tensor good = b->f.grad().clone();
  b->f.set_grad(zeros({3, 2}));
  const Frozen fa = freeze(*a, opt), fb = freeze(*b, opt);
  check_error([&] { opt.step(); }, {"SGD.step", "its .grad"});
  check_frozen(*a, opt, fa);
  check_frozen(*b, opt, fb);
  CHECK(ra->has_snapshot());
  CHECK(rb->has_snapshot());
  b->f.set_grad(good);
  // b's snapshot spoilt: the whole step is refused, a's rule included.
  rb->observe(
      {x.detach(), Tensor(), randn({8, 7}), ones({8, 7}), b->f.detach().clone(), b->SP.detach().clone(), nullptr});
  check_error([&] { opt.step(); }, {"FiringRuleB", "do not match"});
  check_frozen(*a, opt, fa);
  check_frozen(*b, opt, fb);
  CHECK(ra->has_snapshot());
  CHECK(!rb->has_snapshot());
  opt.step();  // a adapts, b takes its gradient step only
  CHECK(!same_bits(a->r_bar, fa.tensors[3]));
  CHECK(same_bits(b->r_bar, fb.tensors[3]));
  CHECK(!same_bits(b->W, fb.tensors[0]));
}

// ---- fuse_sgd and zero_grad ------------------------------------------------------------------------------------

TEST_CASE(
    "fuse_sgd: zero_grad() (optimizer, layer, a module holding it) drops W's deferred gradient, exactly as it "
    "drops W.grad without fuse_sgd") {
  const Tensor x = randn64({9, 5}, false, 30), G = randn64({9, 4, 2}, false, 31);
  const optim::RuleBOptions base{.eta_w = 0.05, .eta_f = 0.05, .w_min = -1, .f_min = -2, .f_max = 2};
  auto make = [&](bool fused) {
    manual_seed(32);
    auto stack =
        std::make_shared<nn::FiringStack>(std::vector<int64_t>{5, 4, 2}, nn::FiringOptions(1, 1).threshold(-0.1));
    stack->to(kFloat64);
    auto opt =
        std::make_shared<optim::SGD>(stack->layers[0]->parameters(), optim::SGDOptions{.lr = 0.2, .weight_decay = 0.1});
    optim::RuleBOptions o = base;
    o.fuse_sgd = fused;
    auto rule = optim::rule_b(*stack->layers[0], o);
    opt->add_local_rule(rule);
    return std::make_tuple(stack, opt, rule);
  };
  enum Way { Optimizer, Layer, Parent, None };
  for (Way way : {Optimizer, Layer, Parent, None}) {
    CAPTURE(static_cast<int>(way));
    std::vector<Tensor> W;
    for (bool fused : {false, true}) {
      auto [stack, opt, rule] = make(fused);
      auto& layer = *stack->layers[0];
      sum(layer.forward(x) * G).backward();
      if (fused) CHECK(rule->holds_deferred_gradient());
      if (way == Optimizer) opt->zero_grad();
      if (way == Layer) layer.zero_grad();
      if (way == Parent) stack->zero_grad();
      if (fused) CHECK(rule->holds_deferred_gradient() == (way == None));
      if (way != None) CHECK_NOTHROW(layer.forward(x));  // no pending gradient: not "accumulation"
      if (way != None) layer.forward(x);                 // the snapshot of this forward (no backward after it)
      opt->step();
      W.push_back(layer.W.clone());
    }
    // Fused and unfused agree: after a zero_grad() both take the Oja term alone, without one both the SGD step too.
    check_close(W[1], W[0], 1e-14, 1e-13);
  }
  // And the SGD step really is dropped: W after zero_grad equals the rule with lr 0.
  auto [stack, opt, rule] = make(true);
  auto [stack0, opt0, rule0] = make(true);
  opt0->set_lr(0, 0.0);
  sum(stack->layers[0]->forward(x) * G).backward();
  opt->zero_grad();
  opt->step();
  stack0->layers[0]->forward(x);
  opt0->step();
  CHECK(same_bits(stack->layers[0]->W, stack0->layers[0]->W));
}

// ---- defaults that do no harm ----------------------------------------------------------------------------------

TEST_CASE(
    "attaching a rule whose clip range does not hold the layer is refused, naming both fixes; the layer's "
    "non-negative initialisation") {
  // The default rule B range [0, 1] on the default (signed) layer: refused before anything is attached.
  auto lin = std::make_shared<nn::FiringLinear>(nn::FiringOptions(64, 128).threshold(0.1));
  check_error([&] { optim::rule_b(*lin, {.eta_w = 1e-3, .r_target = 0.1}); },
              {"FiringRuleB", "W lie outside the rule's clip range [0, 1]", "signed range", "w_min = -1",
               "FiringInit::NonNegative"});
  check_error([&] { optim::rule_b(*lin, {.fuse_sgd = true}); }, {"FiringRuleB", "signed range"});
  CHECK_NOTHROW(optim::rule_b(*lin, {.w_min = -1, .fuse_sgd = true}));  // the refused fused rule was not attached
  check_error([&] { optim::rule_a(*lin, {}); }, {"FiringRuleA", "W lie outside", "FiringInit::NonNegative"});
  // Fix 1: a signed range. Fix 2: the non-negative initialisation, U[0, 1/√d).
  CHECK_NOTHROW(optim::rule_b(*lin, {.w_min = -1}));
  auto pos = std::make_shared<nn::FiringLinear>(nn::FiringOptions(64, 128).init(nn::FiringInit::NonNegative));
  const Vec w = pos->W.to_vector<double>();
  CHECK(*std::min_element(w.begin(), w.end()) >= 0.0);
  CHECK(*std::max_element(w.begin(), w.end()) < 1.0 / 8.0);
  CHECK(*std::max_element(w.begin(), w.end()) > 0.9 / 8.0);
  CHECK_NOTHROW(optim::rule_b(*pos, {}));
  CHECK_NOTHROW(optim::rule_a(*pos, {}));
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(10, 3).init(nn::FiringInit::NonNegative));
  CHECK_NOTHROW(optim::rule_b(*emb, {}));
  check_error([&] { nn::FiringLinear(nn::FiringOptions(4, 2).init(static_cast<nn::FiringInit>(5))); },
              {"FiringLinear", "unknown FiringInit 5"});
  // f (starts at 1) must lie in its range too.
  check_error([&] { optim::rule_b(*pos, {.f_max = 0.5}); }, {"FiringRuleB", "output weights f", "[0, 0.5]", "f_min"});
  check_error([&] { optim::rule_a(*pos, {.f_max = 0.5}); }, {"FiringRuleA", "output weights f", "f_max >= 1"});
  // SP is not: a threshold outside [sp_min, sp_max] is moved into it at the first step, by design.
  auto high =
      std::make_shared<nn::FiringLinear>(nn::FiringOptions(4, 2).threshold(5).init(nn::FiringInit::NonNegative));
  CHECK_NOTHROW(optim::rule_b(*high, {.sp_max = 1}));
  CHECK_NOTHROW(optim::rule_a(*high, {.sp_min = 6, .sp_max = 7}));
  // A NaN weight is not "outside": it stays visible (NaN in, NaN out).
  {
    NoGradGuard ng;
    pos->W.narrow(0, 0, 1).narrow(1, 0, 1).fill_(kNaN);
  }
  CHECK_NOTHROW(optim::rule_b(*pos, {}));
}

// ---- the "Accepted options" table of docs/firing.md -------------------------------------------------------------

namespace {

using SetB = std::function<void(optim::RuleBOptions&)>;
using SetA = std::function<void(optim::RuleAOptions&)>;

// A signed layer (W in ±1/√5, f = 1, SP = 0) and the base options that hold it; accepted = attached and one step
// with a finite result.
std::shared_ptr<nn::FiringLinear> table_layer() {
  manual_seed(40);
  return std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).fan_out(2));
}
void accepts_b(const SetB& set) {
  optim::RuleBOptions o{.w_min = -1};
  set(o);
  auto layer = table_layer();
  optim::SGD opt(layer->parameters(), {.lr = 0.01});
  opt.add_local_rule(optim::rule_b(*layer, o));
  sum(layer->forward(randn({6, 5}))).backward();
  opt.step();
  for (const Tensor& t : {layer->W, layer->f, layer->SP, layer->r_bar, layer->m_bar}) CHECK(!has_non_finite(t));
}
void refuses_b(const SetB& set, std::initializer_list<const char*> fragments) {
  optim::RuleBOptions o{.w_min = -1};
  set(o);
  auto layer = table_layer();
  check_error([&] { optim::rule_b(*layer, o); }, fragments);
}
void accepts_a(const SetA& set) {
  optim::RuleAOptions o;
  set(o);
  manual_seed(41);
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).init(nn::FiringInit::NonNegative));
  optim::SGD opt(layer->parameters(), {.lr = 0.0});
  opt.add_local_rule(optim::rule_a(*layer, o));
  layer->forward(rand({6, 5}));
  opt.step();
  for (const Tensor& t : {layer->W, layer->f, layer->SP, layer->f_bar}) CHECK(!has_non_finite(t));
}
void refuses_a(const SetA& set, std::initializer_list<const char*> fragments) {
  optim::RuleAOptions o;
  set(o);
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).init(nn::FiringInit::NonNegative));
  check_error([&] { optim::rule_a(*layer, o); }, fragments);
}

}  // namespace

TEST_CASE("rule B options: each bound of the table, each side; NaN and +-inf refused by name") {
  using O = optim::RuleBOptions;
  // Every option: NaN, +inf and -inf refused, naming the option.
  const std::vector<std::pair<const char*, double O::*>> all = {
      {"eta_w", &O::eta_w},       {"eta_f", &O::eta_f},       {"eta_sp", &O::eta_sp},     {"z_ref", &O::z_ref},
      {"y_ref", &O::y_ref},       {"eps_z", &O::eps_z},       {"eps_y", &O::eps_y},       {"beta_r", &O::beta_r},
      {"beta_m", &O::beta_m},     {"r_target", &O::r_target}, {"m_target", &O::m_target}, {"lambda_r", &O::lambda_r},
      {"lambda_m", &O::lambda_m}, {"w_min", &O::w_min},       {"w_max", &O::w_max},       {"f_min", &O::f_min},
      {"f_max", &O::f_max},       {"sp_min", &O::sp_min},     {"sp_max", &O::sp_max}};
  for (const auto& [name, member] : all)
    for (double v : {kNaN, kInf, -kInf}) {
      INFO("option: " << name);  // CAPTURE of a const char* would print the pointer
      CAPTURE(v);
      const std::string msg = std::string("option ") + name + " must be a finite number";
      refuses_b([&](O& o) { o.*member = v; }, {"FiringRuleB", msg.c_str()});
    }
  // Rates and lambdas: [0, ∞); 0 switches the term off.
  for (auto m : {&O::eta_w, &O::eta_f, &O::eta_sp, &O::lambda_r, &O::lambda_m}) {
    accepts_b([&](O& o) { o.*m = 0; });
    accepts_b([&](O& o) { o.*m = 1e-3; });
    refuses_b([&](O& o) { o.*m = -1e-12; }, {"FiringRuleB", "must be >= 0"});
  }
  // References and epsilons: (0, ∞), and z_ref² + eps_z, y_ref² + eps_y finite.
  for (auto m : {&O::z_ref, &O::y_ref, &O::eps_z, &O::eps_y}) {
    refuses_b([&](O& o) { o.*m = 0; }, {"FiringRuleB", "must be > 0"});
    refuses_b([&](O& o) { o.*m = -1; }, {"FiringRuleB", "must be > 0"});
    accepts_b([&](O& o) { o.*m = 1e-12; });
  }
  refuses_b([](O& o) { o.z_ref = 1e200; }, {"FiringRuleB", "z_ref^2 + eps_z", "finite"});
  refuses_b([](O& o) { o.y_ref = 1e155; }, {"FiringRuleB", "y_ref^2 + eps_y", "finite"});
  accepts_b([](O& o) { o.z_ref = 1e100; });
  // Betas: (0, 1].
  for (auto m : {&O::beta_r, &O::beta_m}) {
    refuses_b([&](O& o) { o.*m = 0; }, {"FiringRuleB", "(0, 1]"});
    refuses_b([&](O& o) { o.*m = -0.5; }, {"FiringRuleB", "(0, 1]"});
    refuses_b([&](O& o) { o.*m = 1 + 1e-12; }, {"FiringRuleB", "(0, 1]"});
    accepts_b([&](O& o) { o.*m = 1; });
    accepts_b([&](O& o) { o.*m = 1e-9; });
  }
  // Targets: [0, 1].
  for (auto m : {&O::r_target, &O::m_target}) {
    accepts_b([&](O& o) { o.*m = 0; });
    accepts_b([&](O& o) { o.*m = 1; });
    refuses_b([&](O& o) { o.*m = -1e-12; }, {"FiringRuleB", "[0, 1]"});
    refuses_b([&](O& o) { o.*m = 1 + 1e-12; }, {"FiringRuleB", "[0, 1]"});
  }
  // Clip ranges: lo <= hi (sp: lo < hi), and the range must hold the layer (W in ±0.45, f = 1, SP = 0).
  refuses_b([](O& o) { o.w_min = 0.5, o.w_max = 0.4; }, {"FiringRuleB", "w_min <= w_max"});
  refuses_b([](O& o) { o.f_min = 2, o.f_max = 1; }, {"FiringRuleB", "f_min <= f_max"});
  refuses_b([](O& o) { o.sp_min = 0, o.sp_max = 0; }, {"FiringRuleB", "sp_min < sp_max"});
  refuses_b([](O& o) { o.w_min = 0; }, {"FiringRuleB", "W lie outside"});
  refuses_b([](O& o) { o.w_max = 0.3; }, {"FiringRuleB", "W lie outside"});
  refuses_b([](O& o) { o.f_max = 0.99; }, {"FiringRuleB", "output weights f"});
  refuses_b([](O& o) { o.f_min = 1.01, o.f_max = 2; }, {"FiringRuleB", "output weights f"});
  accepts_b([](O& o) { o.sp_min = 1e-9; });  // SP (0) moved into the range at the first step
  accepts_b([](O& o) { o.sp_max = -1e-9; });
  accepts_b([](O& o) { o.w_min = -0.5, o.w_max = 0.5, o.f_min = 1, o.f_max = 1, o.sp_min = 0, o.sp_max = 1e300; });
  accepts_b([](O& o) { o.w_min = -1e300, o.w_max = 1e300, o.f_min = -1e300, o.sp_min = -1e300; });
  // Masks: the three modes; any other value refused.
  for (auto m : {optim::UpdateMask::All, optim::UpdateMask::Active, optim::UpdateMask::Inactive})
    accepts_b([&](O& o) { o.mask_w = m, o.mask_f = m; });
  refuses_b([](O& o) { o.mask_w = static_cast<optim::UpdateMask>(3); }, {"set_mask", "unknown UpdateMask 3"});
  refuses_b([](O& o) { o.mask_f = static_cast<optim::UpdateMask>(-1); }, {"set_mask", "unknown UpdateMask -1"});
  // fuse_sgd and sequential: either value, together too.
  for (bool fuse : {false, true})
    for (bool seq : {false, true}) accepts_b([&](O& o) { o.fuse_sgd = fuse, o.sequential = seq; });
}

TEST_CASE("rule A options: each bound of the table, each side; NaN and +-inf refused by name") {
  using O = optim::RuleAOptions;
  const std::vector<std::pair<const char*, double O::*>> all = {
      {"eta_plus", &O::eta_plus},   {"eta_minus", &O::eta_minus}, {"rho_plus", &O::rho_plus},
      {"rho_minus", &O::rho_minus}, {"eta_sp", &O::eta_sp},       {"z_max", &O::z_max},
      {"w_max", &O::w_max},         {"f_max", &O::f_max},         {"beta", &O::beta},
      {"r_target", &O::r_target},   {"sp_min", &O::sp_min},       {"sp_max", &O::sp_max}};
  for (const auto& [name, member] : all)
    for (double v : {kNaN, kInf, -kInf}) {
      CAPTURE(name);
      const std::string msg = std::string("option ") + name + " must be a finite number";
      refuses_a([&](O& o) { o.*member = v; }, {"FiringRuleA", msg.c_str()});
    }
  for (auto m : {&O::eta_plus, &O::eta_minus, &O::rho_plus, &O::rho_minus, &O::eta_sp}) {
    accepts_a([&](O& o) { o.*m = 0; });
    refuses_a([&](O& o) { o.*m = -1e-12; }, {"FiringRuleA", "must be >= 0"});
  }
  for (auto m : {&O::z_max, &O::w_max, &O::f_max}) {
    refuses_a([&](O& o) { o.*m = 0; }, {"FiringRuleA", "must be > 0"});
    refuses_a([&](O& o) { o.*m = -1; }, {"FiringRuleA", "must be > 0"});
  }
  accepts_a([](O& o) { o.z_max = 1e-9; });
  refuses_a([](O& o) { o.w_max = 0.1; }, {"FiringRuleA", "W lie outside"});       // W reaches 1/√5
  refuses_a([](O& o) { o.f_max = 0.999; }, {"FiringRuleA", "output weights f"});  // f starts at 1
  accepts_a([](O& o) { o.w_max = 1e300, o.f_max = 1e300; });
  refuses_a([](O& o) { o.beta = 0; }, {"FiringRuleA", "beta in (0, 1]"});
  refuses_a([](O& o) { o.beta = 1 + 1e-12; }, {"FiringRuleA", "beta in (0, 1]"});
  accepts_a([](O& o) { o.beta = 1; });
  refuses_a([](O& o) { o.r_target = -1e-12; }, {"FiringRuleA", "r_target in [0, 1]"});
  refuses_a([](O& o) { o.r_target = 1 + 1e-12; }, {"FiringRuleA", "r_target in [0, 1]"});
  accepts_a([](O& o) { o.r_target = 0; });
  accepts_a([](O& o) { o.r_target = 1; });
  refuses_a([](O& o) { o.sp_min = 1, o.sp_max = 1; }, {"FiringRuleA", "sp_min < sp_max"});
  accepts_a([](O& o) { o.sp_min = 0.5; });
}

TEST_CASE(
    "loaded rule state passes the checks of the table: r_bar, f_bar in [0, 1], m_bar >= 0, SP finite; a "
    "refused load leaves the layer untouched") {
  manual_seed(50);
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4));
  const StateDict good = [&] {
    StateDict sd;
    for (const auto& [name, t] : layer->state_dict()) sd.set(name, t.detach().clone());
    return sd;
  }();
  auto with = [&](const char* name, Vec v) {
    StateDict sd;
    for (const auto& [n, t] : good) sd.set(n, t.clone());
    sd.set(name, tensor(v, {4}).to(kFloat32));
    return sd;
  };
  const std::vector<std::pair<const char*, Vec>> refused = {{"r_bar", {0, 0.5, 1.0 + 1e-6, 0}},
                                                            {"r_bar", {-1e-6, 0, 0, 0}},
                                                            {"r_bar", {kNaN, 0, 0, 0}},
                                                            {"f_bar", {0, 0, 2, 0}},
                                                            {"f_bar", {0, -kInf, 0, 0}},
                                                            {"m_bar", {0, -1e-6, 0, 0}},
                                                            {"m_bar", {0, kInf, 0, 0}},
                                                            {"m_bar", {kNaN, 0, 0, 0}},
                                                            {"SP", {0, kInf, 0, 0}},
                                                            {"SP", {0, 0, -kInf, 0}},
                                                            {"SP", {kNaN, 0, 0, 0}}};
  for (const auto& [name, v] : refused) {
    CAPTURE(name);
    CAPTURE(v[0]);
    CHECK_THROWS_WITH_AS(layer->load_state_dict(with(name, v)), doctest::Contains(name), asc::Error);
    for (const auto& [n, t] : layer->state_dict()) {
      CAPTURE(n);
      CHECK(same_bits(t, good.at(n)));
    }
  }
  // The bounds themselves load.
  CHECK_NOTHROW(layer->load_state_dict(with("r_bar", {0, 1, 0.5, 0})));
  CHECK_NOTHROW(layer->load_state_dict(with("f_bar", {0, 1, 0.5, 0})));
  CHECK_NOTHROW(layer->load_state_dict(with("m_bar", {0, 1e30, 0.5, 0})));
  CHECK_NOTHROW(layer->load_state_dict(with("SP", {-1e30, 1e30, 0, 0})));
  CHECK(layer->SP.to_vector<double>()[0] == -1e30f);
}

TEST_CASE("docs/firing.md's Accepted options table names every option this file walks") {
  const std::filesystem::path doc = std::filesystem::path(__FILE__).parent_path().parent_path() / "docs/firing.md";
  std::ifstream in(doc);
  if (!in) {
    MESSAGE("docs/firing.md not found next to the test source: skipped");
    return;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t at = text.find("## 7. Accepted options: learning rules");
  REQUIRE(at != std::string::npos);
  const std::string table = text.substr(at);
  for (const char* name :
       {"eta_w",    "eta_f",    "eta_sp",   "z_ref",    "y_ref",      "eps_z",    "eps_y",     "beta_r",   "beta_m",
        "r_target", "m_target", "lambda_r", "lambda_m", "w_min",      "w_max",    "f_min",     "f_max",    "sp_min",
        "sp_max",   "mask_w",   "mask_f",   "fuse_sgd", "sequential", "eta_plus", "eta_minus", "rho_plus", "rho_minus",
        "z_max",    "beta",     "r_bar",    "m_bar",    "f_bar",      "init"}) {
    CAPTURE(name);
    CHECK(table.find(std::string("`") + name + "`") != std::string::npos);
  }
}

TEST_CASE("examples/firing_fmnist builds the layer, the optimizer and the rule exactly as docs/firing.md's snippet") {
  const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string readme = read(root / "docs/firing.md"), example = read(root / "examples/firing_fmnist/main.cpp");
  if (readme.empty() || example.empty()) {
    MESSAGE("docs/firing.md or the example not found next to the test source: skipped");
    return;
  }
  const size_t section = readme.find("## Using it");
  REQUIRE(section != std::string::npos);
  const size_t begin = readme.find("```cpp\n", section), end = readme.find("```\n", begin + 7);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  std::istringstream block(readme.substr(begin + 7, end - begin - 7));
  int found = 0;
  for (std::string line; std::getline(block, line);) {
    if (line.find("auto layer =") == std::string::npos && line.find(" opt(layer->parameters()") == std::string::npos &&
        line.find("add_local_rule(") == std::string::npos)
      continue;
    CAPTURE(line);
    CHECK(example.find(line + "\n") != std::string::npos);
    ++found;
  }
  CHECK(found == 3);
}

// The names of 0.2 kept for one minor version (CHANGELOG.md): the layer's own rule_b / rule_a.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_CASE("deprecated FiringLayer::rule_b / rule_a attach the rules optim::rule_b / rule_a build") {
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(4, 3).init(nn::FiringInit::NonNegative));
  auto b = layer->rule_b({.r_target = 0.2});
  auto a = layer->rule_a({.r_target = 0.3});
  CHECK(layer->rule_b()->options().r_target == optim::RuleBOptions{}.r_target);  // 0.1's defaults too
  CHECK(layer->rule_a()->options().r_target == optim::RuleAOptions{}.r_target);
  CHECK(b->options().r_target == 0.2);
  CHECK(a->options().r_target == 0.3);
  CHECK_FALSE(b->has_snapshot());
  (*layer)(randn({5, 4}));  // a training-mode forward feeds every attached rule
  CHECK(b->has_snapshot());
  CHECK(a->has_snapshot());
  layer->rule_b({.fuse_sgd = true});
  check_error([&] { layer->rule_b({.fuse_sgd = true}); }, {"FiringLinear", "already attached"});
}
#pragma GCC diagnostic pop
