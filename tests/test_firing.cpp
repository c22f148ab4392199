// The firing-threshold perceptron (docs/firing.md): the fused output op against float64 loops (forward, and every
// gradient for the exact gate, straight-through and each surrogate), finite differences (the exact path away from
// the threshold; the surrogate paths against the smooth function whose derivative they are), the CUDA kernels
// against the CPU's, the layers and their wiring, one step of learning rules A and B against the formulas term by
// term on the dense, channel and index paths with each mask, and the rules' behaviour: firing rate to its target,
// Oja's norm to its fixed point, frozen silent rows, no adaptation in eval mode, bit-identical resume.
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "models/firing_net.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

using Vec = std::vector<double>;

// The surrogate derivatives of the registry, written again from docs/ops.md.
double surrogate_ref(const std::string& name, double u, double w) {
  if (name == "sigmoid") {
    const double s = 1 / (1 + std::exp(-w * u));
    return w * s * (1 - s);
  }
  if (name == "rectangular") return std::abs(u) < w / 2 ? 1 / w : 0.0;
  if (name == "triangular") return std::max(0.0, 1 - std::abs(u) / w) / w;
  if (name == "atan") return w / (2 * (1 + std::pow(std::numbers::pi / 2 * w * u, 2)));
  if (name == "test_parabola") return std::max(0.0, 1 - (u / w) * (u / w)) * 0.75 / w;
  FAIL("unknown surrogate " << name);
  return 0;
}

void register_test_surrogate() {
  static bool done = false;
  if (done) return;
  register_surrogate(
      {"test_parabola", [](double u, double w) { return std::max(0.0, 1 - (u / w) * (u / w)) * 0.75 / w; }});
  done = true;
}

struct Grads {
  Vec Y, F, dZ, dSP, df;
};

// Forward and backward of firing_output in plain loops: F = 1[Z >= SP], Y = F f Z; S = Σ_g dY f;
// dZ = S (F + Z s'), dSP = -Σ_b S Z s', df = Σ_b dY F Z.
Grads naive(const Vec& Z, const Vec& SP, const Vec& f, const Vec& dY, int64_t N, int64_t P, int64_t A,
            GateBackward mode, const std::string& sur, double width) {
  Grads r;
  r.Y.assign(N * P * A, 0.0), r.F.assign(N * P, 0.0), r.dZ.assign(N * P, 0.0), r.dSP.assign(P, 0.0);
  r.df.assign(P * A, 0.0);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const double z = Z[b * P + p], F = z >= SP[p] ? 1.0 : 0.0;
      r.F[b * P + p] = F;
      double S = 0;
      for (int64_t g = 0; g < A; ++g) {
        r.Y[(b * P + p) * A + g] = F * f[p * A + g] * z;
        S += dY[(b * P + p) * A + g] * f[p * A + g];
        r.df[p * A + g] += dY[(b * P + p) * A + g] * F * z;
      }
      const double d = mode == GateBackward::None              ? 0.0
                       : mode == GateBackward::StraightThrough ? 1.0
                                                               : surrogate_ref(sur, z - SP[p], width);
      r.dZ[b * P + p] = S * (F + z * d);
      r.dSP[p] -= S * z * d;
    }
  return r;
}

struct OpCase {
  int64_t N, P, A;
  Tensor Z, SP, f, dY;  // float64 CPU
};

OpCase op_case(int64_t N, int64_t P, int64_t A, uint64_t seed) {
  OpCase c{N,
           P,
           A,
           randn64({N, P}, false, seed),
           randn64({P}, false, seed + 1) * 0.3,
           randn64({P, A}, false, seed + 2),
           randn64({N, P, A}, false, seed + 3)};
  // Two entries exactly at their threshold: equality fires.
  std::vector<double> z = c.Z.to_vector<double>(), sp = c.SP.to_vector<double>();
  z[0] = sp[0], z[P + 1] = sp[1];
  c.Z = tensor(z, {N, P});
  return c;
}

// y and the gradients of <dY, Y> through firing_output on `dev` (returned on the CPU in float64).
struct OpRun {
  Tensor Y, F, dZ, dSP, df;
};
OpRun run_op(const OpCase& c, const GateOptions& gate, DType dt = kFloat64, Device dev = Device::cpu()) {
  auto leaf = [&](const Tensor& t) { return t.to(dev).to(dt).detach().set_requires_grad(true); };
  Tensor Z = leaf(c.Z), SP = leaf(c.SP), f = leaf(c.f);
  FiringOutput o = firing_output(Z, SP, f, gate);
  sum(o.Y * c.dY.to(dev).to(dt)).backward();
  auto back = [](const Tensor& t) { return t.to(kFloat64).to(Device::cpu()); };
  return {back(o.Y.detach()), back(o.F), back(Z.grad()), back(SP.grad()), back(f.grad())};
}

}  // namespace

TEST_CASE("firing_output forward: F = 1[Z >= SP] (equality fires), Y = F f Z, silent outputs exactly 0") {
  OpCase c = op_case(9, 5, 3, 10);
  FiringOutput o = firing_output(c.Z, c.SP, c.f);
  Grads r = naive(c.Z.to_vector<double>(), c.SP.to_vector<double>(), c.f.to_vector<double>(), c.dY.to_vector<double>(),
                  9, 5, 3, GateBackward::None, "", 1);
  CHECK(o.F.to_vector<double>() == r.F);
  check_close(o.Y, r.Y, 1e-15, 0);
  CHECK(r.F[0] == 1.0);  // Z == SP
  CHECK(r.F[5 + 1] == 1.0);
  std::vector<double> y = o.Y.to_vector<double>();
  for (int64_t bp = 0; bp < 45; ++bp)
    if (r.F[bp] == 0)
      for (int g = 0; g < 3; ++g) CHECK(std::signbit(y[bp * 3 + g]) == false);  // +0, not -0 or f·0 of a negative
  CHECK(!o.F.requires_grad());
}

TEST_CASE("firing_output backward: dZ, dSP, df against float64 loops, exact gate, straight-through, every surrogate") {
  register_test_surrogate();
  OpCase c = op_case(11, 6, 4, 20);
  const Vec Z = c.Z.to_vector<double>(), SP = c.SP.to_vector<double>(), f = c.f.to_vector<double>();
  const Vec dY = c.dY.to_vector<double>();
  struct Mode {
    GateBackward mode;
    std::string sur;
  };
  std::vector<Mode> modes = {{GateBackward::None, ""}, {GateBackward::StraightThrough, ""}};
  for (const std::string s : {"sigmoid", "rectangular", "triangular", "atan", "test_parabola"})
    modes.push_back({GateBackward::Surrogate, s});
  for (const Mode& m : modes)
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(m.sur);
      CAPTURE(static_cast<int>(m.mode));
      CAPTURE(dtype_name(dt));
      const double width = 0.9;
      OpRun o = run_op(c, {.mode = m.mode, .surrogate = m.sur.empty() ? "sigmoid" : m.sur, .width = width}, dt);
      Grads r = naive(Z, SP, f, dY, 11, 6, 4, m.mode, m.sur, width);
      const double tol = dt == kFloat64 ? 1e-13 : 2e-5;
      check_close(o.Y, r.Y, tol, tol);
      check_close(o.dZ, r.dZ, tol, tol);
      check_close(o.dSP, r.dSP, tol, tol);
      check_close(o.df, r.df, tol, tol);
      if (m.mode == GateBackward::None) CHECK(amax(abs(o.dSP)).item<double>() == 0.0);
    }
}

TEST_CASE(
    "firing_output kernels: each fan-out path (alpha 1, 2, 3, 4) and rows that fire rarely or often, against "
    "loops") {
  // The CPU kernels compile α = 1, 2, 4 separately from the general loop, and with the exact gate a row where fewer
  // than a quarter of the neurons fire takes a skipping loop while a busier row takes a branch-free one.
  const int64_t N = 10, P = 40;
  for (int64_t A : {1, 2, 3, 4}) {
    CAPTURE(A);
    OpCase c = op_case(N, P, A, 30 + static_cast<uint64_t>(A));
    std::vector<double> z = c.Z.to_vector<double>();
    for (int64_t b = 2; b < N; b += 2)
      for (int64_t p = 0; p < P; ++p) z[b * P + p] -= 2.5;  // rows 2, 4, ...: a few percent fire
    c.Z = tensor(z, {N, P});
    const Vec Z = c.Z.to_vector<double>(), SP = c.SP.to_vector<double>(), f = c.f.to_vector<double>();
    const Vec dY = c.dY.to_vector<double>();
    for (GateBackward mode : {GateBackward::None, GateBackward::Surrogate}) {
      CAPTURE(static_cast<int>(mode));
      OpRun o = run_op(c, {.mode = mode, .surrogate = "sigmoid", .width = 0.7});
      Grads r = naive(Z, SP, f, dY, N, P, A, mode, "sigmoid", 0.7);
      check_close(o.Y, r.Y, 1e-14, 0);
      check_close(o.dZ, r.dZ, 1e-13, 1e-13);
      check_close(o.dSP, r.dSP, 1e-13, 1e-13);
      check_close(o.df, r.df, 1e-13, 1e-13);
    }
    int64_t quiet = 0, busy = 0;  // both row kinds are present
    for (int64_t b = 0; b < N; ++b) {
      int64_t firing = 0;
      for (int64_t p = 0; p < P; ++p) firing += Z[b * P + p] >= SP[p];
      (4 * firing < P ? quiet : busy) += 1;
    }
    CHECK(quiet >= 3);
    CHECK(busy >= 3);
  }
}

namespace {
// W <- keep W + coefᵀ X in float64 loops.
Vec weight_update_ref(const Vec& W, const Vec& keep, const Vec& coef, const Vec& X, int64_t N, int64_t P, int64_t d) {
  Vec out(W.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < d; ++i) {
      double acc = keep[p] * W[p * d + i];
      for (int64_t b = 0; b < N; ++b) acc += coef[b * P + p] * X[b * d + i];
      out[p * d + i] = acc;
    }
  return out;
}

// coef (N, P) with about `density` of its entries nonzero.
Tensor sparse_coef(int64_t N, int64_t P, double density, uint64_t seed) {
  Vec c = randn64({N, P}, false, seed).to_vector<double>(), u = rand({N, P}).to(kFloat64).to_vector<double>();
  for (size_t i = 0; i < c.size(); ++i)
    if (u[i] >= density) c[i] = 0;
  return tensor(c, {N, P});
}
}  // namespace

TEST_CASE("linear_deferred_weight_grad: Z = X W^T; X's gradient as linear's, W's deferred into dZ, summed; bad input") {
  const int64_t N = 5, P = 4, d = 3;
  const Tensor X0 = randn64({N, d}, false, 70), W0 = randn64({P, d}, false, 71), G = randn64({N, P}, false, 72);
  Tensor Xr = X0.clone().set_requires_grad(true), Wr = W0.clone().set_requires_grad(true);
  const Tensor Zr = linear(Xr, Wr);
  (Zr * G).sum().backward();  // the reference: linear's own gradients, dL/dZ = G

  Tensor X = X0.clone().set_requires_grad(true), W = W0.clone().set_requires_grad(true);
  auto dZ = std::make_shared<Tensor>();
  Tensor Z = linear_deferred_weight_grad(X, W, dZ);
  check_close(Z, Zr, 1e-15, 0);
  (Z * G).sum().backward();
  check_close(X.grad(), Xr.grad(), 1e-15, 0);
  CHECK_FALSE(W.grad().defined());  // W's gradient is deferred, never formed
  REQUIRE(dZ->defined());
  check_close(*dZ, G, 0, 0);
  check_close(matmul(dZ->t(), X0), Wr.grad(), 1e-14, 0);  // what the rule forms from it: dZ^T X = W's gradient

  // float64 gradcheck of X's gradient against central differences (W's is deferred: W is held constant here).
  auto sink = std::make_shared<Tensor>();
  const auto gc = autograd::gradcheck(
      [&](const TensorList& in) { return TensorList{linear_deferred_weight_grad(in[0], W0, sink)}; },
      {X0.clone().set_requires_grad(true)});
  CHECK_MESSAGE(gc.ok, gc.message);

  // A second backward pass (another forward) adds into the same deferred gradient.
  (linear_deferred_weight_grad(X, W, dZ) * G).sum().backward();
  check_close(*dZ, G * 2.0, 0, 0);

  // Nothing requires grad: no graph, nothing deferred.
  auto untouched = std::make_shared<Tensor>();
  const Tensor Zn = linear_deferred_weight_grad(X0, W0, untouched);
  CHECK_FALSE(Zn.requires_grad());

  auto throws = [&](auto fn, const char* what) { CHECK_THROWS_WITH_AS(fn(), doctest::Contains(what), asc::Error); };
  throws([&] { linear_deferred_weight_grad(X, W, nullptr); }, "null pointer");
  throws([&] { linear_deferred_weight_grad(X, W0.narrow(1, 0, 2), dZ); }, "expects X (N, d) and W (P, d)");
  throws([&] { linear_deferred_weight_grad(X.view({N, d, 1}), W, dZ); }, "expects X (N, d) and W (P, d)");
  throws([&] { linear_deferred_weight_grad(Tensor(), W, dZ); }, "X");
}

TEST_CASE("firing_weight_update_: W <- keep W + coef^T X against loops, on the sparse and the dense path; bad input") {
  // 37 rows (not a multiple of the 4 inputs added at a time), 21 neurons (one block of 16 and a tail), d 13.
  const int64_t N = 37, P = 21, d = 13;
  manual_seed(3);
  const Tensor W0 = randn64({P, d}, false, 60), keep = rand({P}).to(kFloat64) + 0.5, X = randn64({N, d}, false, 61);
  for (double density : {0.0, 0.1, 0.3, 0.6, 1.0})  // below 1/3 the CPU takes the sparse path
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(density);
      CAPTURE(dtype_name(dt));
      const Tensor coef = sparse_coef(N, P, density, 62);
      const Vec ref = weight_update_ref(W0.to_vector<double>(), keep.to_vector<double>(), coef.to_vector<double>(),
                                        X.to_vector<double>(), N, P, d);
      Tensor W = W0.to(dt).clone();
      firing_weight_update_(W, keep.to(dt), coef.to(dt), X.to(dt));
      const double tol = dt == kFloat64 ? 1e-13 : 2e-5;
      check_close(W, ref, tol, tol);
    }
  Tensor W = W0.clone();
  auto throws = [&](auto fn, const char* what) { CHECK_THROWS_WITH_AS(fn(), doctest::Contains(what), asc::Error); };
  throws([&] { firing_weight_update_(W, ones({P + 1}, {kFloat64}), zeros({N, P}, {kFloat64}), X); }, "keep (P)");
  throws([&] { firing_weight_update_(W, keep, zeros({N, P + 1}, {kFloat64}), X); }, "coef [37, 22]");
  throws([&] { firing_weight_update_(W, keep, zeros({N, P}, {kFloat64}), X.narrow(0, 0, 5)); }, "X [5, 13]");
  throws([&] { firing_weight_update_(W, keep.to(kFloat32), zeros({N, P}, {kFloat64}), X); }, "share a dtype");
  Tensor Wt = W0.t();
  throws(
      [&] {
        firing_weight_update_(Wt, ones({d}, {kFloat64}), zeros({N, d}, {kFloat64}), randn64({N, P}));
      },
      "contiguous");
  Tensor Wg = W0.clone().set_requires_grad(true);
  throws([&] { firing_weight_update_(Wg, keep, zeros({N, P}, {kFloat64}), X); }, "NoGradGuard");
  Tensor cg = zeros({N, P}, {kFloat64}).set_requires_grad(true);  // no graph would reach coef
  throws([&] { firing_weight_update_(W, keep, cg, X); }, "not differentiable");
  CHECK(W.to_vector<double>() == W0.to_vector<double>());  // nothing was written by a refused call
}

TEST_CASE(
    "firing_output backward, many rows, every gate: the exact gate's float32 partial sums of df are flushed "
    "every 64 rows; a silent neuron adds nothing even where dY is NaN") {
  // The CPU kernel sums df in the layer's dtype over blocks of 64 rows, then in float64: 150 rows cross two flushes
  // and end in a partial block; every third row is quiet (the skipping loop), the rest busy. The straight-through and
  // surrogate paths run the same rows through their own loops.
  register_test_surrogate();
  const int64_t N = 150, P = 40, A = 4;
  OpCase c = op_case(N, P, A, 90);
  std::vector<double> z = c.Z.to_vector<double>();
  for (int64_t b = 3; b < N; b += 3)
    for (int64_t p = 0; p < P; ++p) z[b * P + p] -= 2.5;
  c.Z = tensor(z, {N, P});
  const Vec Z = c.Z.to_vector<double>(), SP = c.SP.to_vector<double>(), f = c.f.to_vector<double>();
  const std::vector<std::pair<GateBackward, std::string>> modes = {
      {GateBackward::None, "sigmoid"},           {GateBackward::StraightThrough, "sigmoid"},
      {GateBackward::Surrogate, "sigmoid"},      {GateBackward::Surrogate, "rectangular"},
      {GateBackward::Surrogate, "triangular"},   {GateBackward::Surrogate, "atan"},
      {GateBackward::Surrogate, "test_parabola"}};
  for (const auto& [mode, sur] : modes) {
    CAPTURE(static_cast<int>(mode));
    CAPTURE(sur);
    const Grads r = naive(Z, SP, f, c.dY.to_vector<double>(), N, P, A, mode, sur, 0.8);
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(dtype_name(dt));
      const OpRun o = run_op(c, {.mode = mode, .surrogate = sur, .width = 0.8}, dt);
      const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
      check_close(o.dZ, r.dZ, tol, tol);
      check_close(o.dSP, r.dSP, tol, tol);
      check_close(o.df, r.df, tol, tol);
    }
  }
  // NaN upstream gradients at silent neurons (one in a busy row, one in a quiet row): the exact gate gives them no
  // path, so dZ there is 0 and df stays finite.
  std::vector<double> dy = c.dY.to_vector<double>();
  int64_t planted = 0;
  for (int64_t b : {1, 3})
    for (int64_t p = 0; p < P && planted < (b == 1 ? 1 : 2); ++p)
      if (Z[b * P + p] < SP[p]) {
        for (int64_t g = 0; g < A; ++g) dy[(b * P + p) * A + g] = std::numeric_limits<double>::quiet_NaN();
        ++planted;
      }
  REQUIRE(planted == 2);
  c.dY = tensor(dy, {N, P, A});
  auto finite = [](const Tensor& t) {
    for (double v : t.to_vector<double>())
      if (!std::isfinite(v)) return false;
    return true;
  };
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    const OpRun o = run_op(c, {}, dt);
    CHECK(finite(o.df));
    CHECK(finite(o.dZ));
  }
}

namespace {
// Rule B's sums in float64 loops: Σ_b F Z², Σ_b F, Σ_b F max(0, Z − SP).
std::array<Vec, 3> batch_sums_ref(const Vec& Z, const Vec& F, const Vec& SP, int64_t N, int64_t P) {
  std::array<Vec, 3> r = {Vec(P, 0.0), Vec(P, 0.0), Vec(P, 0.0)};
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const double z = Z[b * P + p], fires = F[b * P + p];
      if (fires == 0) continue;
      r[0][p] += z * z;
      r[1][p] += 1;
      r[2][p] += std::max(0.0, z - SP[p]);
    }
  return r;
}

// Z, F = 1[Z >= SP] (a few entries silent with an infinite Z: they must add nothing), SP for rule B's ops.
struct SumCase {
  Tensor Z, F, SP, dZ, c;  // float64 CPU
};
SumCase sum_case(int64_t N, int64_t P, uint64_t seed) {
  SumCase k{randn64({N, P}, false, seed), Tensor(), randn64({P}, false, seed + 1) * 0.3,
            randn64({N, P}, false, seed + 2), randn64({P}, false, seed + 3)};
  Vec F = ge(k.Z, k.SP.view({1, P})).to(kFloat64).to_vector<double>(), z = k.Z.to_vector<double>();
  F[1] = 0, z[1] = std::numeric_limits<double>::infinity();  // silent although its Z is infinite
  k.Z = tensor(z, {N, P}), k.F = tensor(F, {N, P});
  return k;
}
}  // namespace

TEST_CASE("firing_batch_sums and firing_rule_b_coef (rule B's fused passes) against loops; bad input") {
  // P 150: two blocks of 64 neurons and a tail on the CPU.
  const int64_t N = 37, P = 150;
  const SumCase k = sum_case(N, P, 80);
  const Vec Z = k.Z.to_vector<double>(), F = k.F.to_vector<double>(), SP = k.SP.to_vector<double>();
  const Vec dZ = k.dZ.to_vector<double>(), cv = k.c.to_vector<double>();
  const std::array<Vec, 3> ref = batch_sums_ref(Z, F, SP, N, P);
  Vec coef_ref(N * P), coef_plain(N * P);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const double fz = F[b * P + p] != 0 ? 0.3 * Z[b * P + p] : 0.0;
      coef_plain[b * P + p] = fz;
      coef_ref[b * P + p] = fz - cv[p] * dZ[b * P + p];
    }
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
    const FiringBatchSums s = firing_batch_sums(k.Z.to(dt), k.F.to(dt), k.SP.to(dt));
    check_close(s.fz2, ref[0], tol, tol);
    CHECK(s.fired.to_vector<double>() == ref[1]);
    check_close(s.margin, ref[2], tol, tol);
    check_close(firing_rule_b_coef(k.Z.to(dt), k.F.to(dt), 0.3), coef_plain, tol, tol);
    check_close(firing_rule_b_coef(k.Z.to(dt), k.F.to(dt), 0.3, k.dZ.to(dt), k.c.to(dt)), coef_ref, tol, tol);
  }
  auto throws = [&](auto fn, const char* what) { CHECK_THROWS_WITH_AS(fn(), doctest::Contains(what), asc::Error); };
  throws([&] { firing_batch_sums(k.Z, k.F.narrow(0, 0, 5), k.SP); }, "F [5, 150]");
  throws([&] { firing_batch_sums(k.Z, k.F, k.SP.narrow(0, 0, 5)); }, "SP [5]");
  throws([&] { firing_batch_sums(k.Z, k.F.to(kFloat32), k.SP); }, "share a dtype");
  throws([&] { firing_batch_sums(k.Z.to(kInt64), k.F.to(kInt64), k.SP.to(kInt64)); }, "float32 or float64");
  throws([&] { firing_batch_sums(k.Z.clone().set_requires_grad(true), k.F, k.SP); }, "NoGradGuard");
  throws([&] { firing_rule_b_coef(k.Z, k.F, 1.0, k.dZ); }, "both given, or neither");
  throws([&] { firing_rule_b_coef(k.Z, k.F, 1.0, k.dZ, k.c.narrow(0, 0, 3)); }, "c [3]");
  throws([&] { firing_rule_b_coef(k.Z, k.F, 1.0, k.dZ.t(), k.c); }, "dZ [150, 37]");
  throws([&] { firing_rule_b_coef(k.Z, k.F, 1.0, k.dZ.to(kFloat32), k.c); }, "share a dtype");
}

TEST_CASE(
    "firing_output gradcheck: the exact gate away from the threshold; the surrogate paths are the derivative "
    "of F0 + G(Z - SP) - G(Z0 - SP0) with G the surrogate's integral") {
  // Exact gate: piecewise f Z, so finite differences hold where no entry sits within eps of its threshold.
  {
    Tensor SP = tensor(Vec{0.1, -0.2, 0.3}, {3}, {.dtype = kFloat64}).set_requires_grad(true);
    Vec z = randn64({5, 3}, false, 30).to_vector<double>();
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t p = 0; p < 3; ++p) {
        double& v = z[b * 3 + p];
        const double sp = SP.to_vector<double>()[p];
        if (std::abs(v - sp) < 0.05) v = sp + 0.2;  // keep away from the step
      }
    Tensor Z = tensor(z, {5, 3}, {.dtype = kFloat64}).set_requires_grad(true);
    Tensor f = randn64({3, 2}, true, 31);
    check_grad([](const TensorList& in) { return TensorList{firing_output(in[0], in[1], in[2]).Y}; }, {Z, SP, f});
  }
  // Surrogate gate: the backward is the exact derivative, at the evaluation point, of the smooth
  //   h(Z, SP, f) = Σ dY f Z (F0 + G(Z - SP) - G(Z0 - SP0)),  G' = s',
  // which equals Σ dY Y at the point. G for sigmoid: σ(w u); for atan: atan(π/2 w u) / π + 1/2.
  for (const std::string sur : {"sigmoid", "atan"}) {
    CAPTURE(sur);
    const double w = 1.3;
    auto G = [&](double u) {
      return sur == "sigmoid" ? 1 / (1 + std::exp(-w * u))
                              : std::atan(std::numbers::pi / 2 * w * u) / std::numbers::pi + 0.5;
    };
    const int64_t N = 6, P = 3, A = 2;
    OpCase c = op_case(N, P, A, 40);
    OpRun o = run_op(c, {.mode = GateBackward::Surrogate, .surrogate = sur, .width = w});
    Vec Z0 = c.Z.to_vector<double>(), SP0 = c.SP.to_vector<double>(), f0 = c.f.to_vector<double>();
    const Vec dY = c.dY.to_vector<double>();
    auto h = [&](const Vec& Z, const Vec& SP, const Vec& f) {
      double s = 0;
      for (int64_t b = 0; b < N; ++b)
        for (int64_t p = 0; p < P; ++p) {
          const double F0 = Z0[b * P + p] >= SP0[p] ? 1.0 : 0.0;
          const double gate = F0 + G(Z[b * P + p] - SP[p]) - G(Z0[b * P + p] - SP0[p]);
          for (int64_t g = 0; g < A; ++g) s += dY[(b * P + p) * A + g] * f[p * A + g] * Z[b * P + p] * gate;
        }
      return s;
    };
    const double eps = 1e-6;
    auto numeric = [&](int which) {
      Vec Z = Z0, SP = SP0, f = f0;
      Vec& x = which == 0 ? Z : which == 1 ? SP : f;
      Vec d(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + eps;
        const double hp = h(Z, SP, f);
        x[i] = keep - eps;
        const double hm = h(Z, SP, f);
        x[i] = keep;
        d[i] = (hp - hm) / (2 * eps);
      }
      return d;
    };
    check_close(o.dZ, numeric(0), 1e-7, 1e-6);
    check_close(o.dSP, numeric(1), 1e-7, 1e-6);
    check_close(o.df, numeric(2), 1e-7, 1e-6);
  }
}

// Every gated op checks its GateOptions through gate_spec: the same errors from hard_gate as from firing_output, for
// every bad width, an unknown mode and an unknown surrogate, and nothing is recorded for a refused call.
TEST_CASE("gate options: hard_gate and firing_output refuse the same bad options the same way") {
  Tensor Z = randn64({4, 3}, true), SP = randn64({3}, true), f = randn64({3, 2});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const double w : {0.0, -1.0, inf, -inf, nan}) {
    CAPTURE(w);
    const GateOptions bad{.mode = GateBackward::Surrogate, .surrogate = "sigmoid", .width = w};
    check_error([&] { (void)hard_gate(Z, SP, bad); }, {"hard_gate", "width must be positive and finite"});
    check_error([&] { (void)firing_output(Z, SP, f, bad); }, {"firing_output", "width must be positive and finite"});
  }
  const GateOptions odd_mode{.mode = static_cast<GateBackward>(5)};
  check_error([&] { (void)hard_gate(Z, SP, odd_mode); }, {"hard_gate", "unknown gate backward mode 5"});
  check_error([&] { (void)firing_output(Z, SP, f, odd_mode); }, {"firing_output", "unknown gate backward mode 5"});
  const GateOptions unknown{.mode = GateBackward::Surrogate, .surrogate = "nope"};
  check_error([&] { (void)hard_gate(Z, SP, unknown); }, {"hard_gate", "unknown surrogate 'nope'", "atan"});
  check_error([&] { (void)firing_output(Z, SP, f, unknown); }, {"firing_output", "unknown surrogate 'nope'", "atan"});
  // The resolved spec: the registry's entry, copied.
  const GateSpec spec =
      gate_spec("test", {.mode = GateBackward::Surrogate, .surrogate = "atan", .width = 2}, Device::cpu());
  CHECK(spec.mode == GateBackward::Surrogate);
  CHECK(spec.width == 2);
  CHECK(spec.surrogate.name == "atan");
  REQUIRE(spec.surrogate.builtin.has_value());
  CHECK(*spec.surrogate.builtin == math::SurrogateKind::Atan);
  // A mode without a surrogate ignores the name (as before), but still wants a valid width.
  CHECK(gate_spec("test", {.mode = GateBackward::StraightThrough, .surrogate = "nope"}, Device::cpu()).mode ==
        GateBackward::StraightThrough);
}

TEST_CASE("firing_output: bad input gives a clear error") {
  Tensor Z = randn64({4, 3}), SP = randn64({3}), f = randn64({3, 2});
  check_error([&] { firing_output(Z, randn64({2}), f); }, {"firing_output", "SP [2]"});
  check_error([&] { firing_output(Z, SP, randn64({4, 2})); }, {"firing_output", "f [4, 2]"});
  check_error([&] { firing_output(Z.view({12}), SP, f); }, {"firing_output", "Z (N, P)"});
  check_error([&] { firing_output(Z, SP.to(kFloat32), f); }, {"firing_output", "share a dtype"});
  check_error([&] { firing_output(Z, SP, randn64({3, 0})); }, {"firing_output", "alpha >= 1"});
  check_error([&] { firing_output(Z.to(kInt64), SP.to(kInt64), f.to(kInt64)); }, {"firing_output"});
  check_error([&] { firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .surrogate = "nope"}); },
              {"firing_output", "unknown surrogate 'nope'", "sigmoid"});
  check_error([&] { firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .width = 0}); },
              {"firing_output", "width must be positive"});
  // No rows: an empty output, and gradients of the right (empty / zero) shapes.
  Tensor Ze = randn64({0, 3}, true), SPe = randn64({3}, true), fe = randn64({3, 2}, true);
  FiringOutput o = firing_output(Ze, SPe, fe, {.mode = GateBackward::StraightThrough});
  CHECK(o.Y.shape() == Shape{0, 3, 2});
  sum(o.Y).backward();
  CHECK(SPe.grad().shape() == Shape{3});
  CHECK(amax(abs(SPe.grad())).item<double>() == 0.0);
  CHECK(amax(abs(fe.grad())).item<double>() == 0.0);
}

TEST_CASE("firing_output CUDA kernels equal the CPU kernel (float64, float32, bfloat16; every gate)") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  OpCase c = op_case(37, 9, 5, 50);  // 37 rows: several strides of a block
  for (GateBackward mode : {GateBackward::None, GateBackward::StraightThrough, GateBackward::Surrogate})
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(dtype_name(dt));
      const GateOptions gate{.mode = mode, .surrogate = "triangular", .width = 1.1};
      OpRun a = run_op(c, gate, dt), b = run_op(c, gate, dt, gpu);
      const double tol = dt == kFloat64 ? 1e-13 : 1e-5;
      for (auto [x, y] : {std::pair{a.Y, b.Y}, {a.F, b.F}, {a.dZ, b.dZ}, {a.dSP, b.dSP}, {a.df, b.df}})
        check_close(y, x, tol, tol);
    }
  // 600 rows: the sums over b run as three row blocks whose partials are added at the end.
  OpCase big = op_case(600, 7, 3, 56);
  for (GateBackward mode : {GateBackward::None, GateBackward::Surrogate}) {
    const GateOptions gate{.mode = mode, .surrogate = "atan", .width = 0.8};
    OpRun x = run_op(big, gate), y = run_op(big, gate, kFloat64, gpu);
    for (auto [p, q] : {std::pair{x.dZ, y.dZ}, {x.dSP, y.dSP}, {x.df, y.df}}) check_close(q, p, 1e-12, 1e-12);
  }
  // bfloat16 on the device against float32 on the CPU on the same rounded values (the CPU holds no bfloat16).
  auto rounded = [&](const Tensor& t) { return t.to(gpu).to(kBFloat16).to(kFloat32).to(Device::cpu()); };
  OpCase r = c;
  for (Tensor* t : {&r.Z, &r.SP, &r.f, &r.dY}) *t = rounded(*t).to(kFloat64);
  const GateOptions gate{.mode = GateBackward::Surrogate, .surrogate = "sigmoid", .width = 2};
  OpRun a = run_op(r, gate, kFloat32), b = run_op(r, gate, kBFloat16, gpu);
  for (auto [x, y] : {std::pair{a.Y, b.Y}, {a.dZ, b.dZ}, {a.dSP, b.dSP}, {a.df, b.df}}) check_close(y, x, 5e-2, 1e-2);
  // A user-registered surrogate has no device code: a clear error at the forward.
  register_test_surrogate();
  check_error([&] { run_op(c, {.mode = GateBackward::Surrogate, .surrogate = "test_parabola"}, kFloat32, gpu); },
              {"firing_output", "test_parabola", "no CUDA kernel"});
}

// ---- the layers ---------------------------------------------------------------------------------------------------
namespace {

enum class Path { Dense, Channels, Index };

// A firing layer in plain loops. reads(b, p, c): what neuron p read at input position c in row b — X[b, c] (dense),
// X[b, c, p] (channels), or the one-hot column tok_b of W (index; c over the vocabulary).
struct NaiveLayer {
  Path path;
  int64_t N, P, A, D;
  Vec X;
  std::vector<int64_t> tok;
  Vec W, SP, f;
  double reads(int64_t b, int64_t p, int64_t c) const {
    if (path == Path::Dense) return X[b * D + c];
    if (path == Path::Channels) return X[(b * D + c) * P + p];
    return tok[b] == c ? 1.0 : 0.0;
  }
  void forward(Vec& Z, Vec& F, Vec& Y) const {
    Z.assign(N * P, 0.0), F.assign(N * P, 0.0), Y.assign(N * P * A, 0.0);
    for (int64_t b = 0; b < N; ++b)
      for (int64_t p = 0; p < P; ++p) {
        double z = 0;
        for (int64_t c = 0; c < D; ++c) z += W[p * D + c] * reads(b, p, c);
        Z[b * P + p] = z;
        F[b * P + p] = z >= SP[p] ? 1.0 : 0.0;
        for (int64_t g = 0; g < A; ++g) Y[(b * P + p) * A + g] = F[b * P + p] * f[p * A + g] * z;
      }
  }
};

// A float64 layer of the given path with the naive layer's values, and its input.
struct Built {
  std::shared_ptr<nn::FiringLayer> layer;
  Tensor input;
};
Built build(const NaiveLayer& n) {
  Built r;
  if (n.path == Path::Index) {
    r.layer = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(n.D, n.P).fan_out(n.A));
    r.input = tensor(n.tok, {n.N});
  } else {
    const bool ch = n.path == Path::Channels;
    r.layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(n.D, n.P).fan_out(n.A).channels(ch));
    r.input = ch ? tensor(n.X, {n.N, n.D, n.P}) : tensor(n.X, {n.N, n.D});
  }
  r.layer->to(kFloat64);
  NoGradGuard ng;
  r.layer->W.copy_(tensor(n.W, {n.P, n.D}));
  r.layer->SP.copy_(tensor(n.SP, {n.P}));
  r.layer->f.copy_(tensor(n.f, {n.P, n.A}));
  return r;
}

NaiveLayer naive_layer(Path path, uint64_t seed, bool nonnegative = false) {
  NaiveLayer n{path, 10, 4, 2, path == Path::Index ? 6 : 5};
  Generator g(seed);
  auto draw = [&](int64_t k) { return rand({k}, {.dtype = kFloat64}, &g).to_vector<double>(); };
  n.X = randn({path == Path::Channels ? n.N * n.D * n.P : n.N * n.D}, {.dtype = kFloat64}, &g).to_vector<double>();
  for (int64_t b = 0; b < n.N; ++b) n.tok.push_back((b * 7 + 3) % n.D);
  n.W = draw(n.P * n.D);
  for (double& w : n.W) w = nonnegative ? 0.8 * w : 0.7 * (2 * w - 1);  // inside the rules' ranges below
  n.SP = {-0.1, 0.05, -0.2, 100.0};                                     // neuron 3 never fires
  if (path == Path::Index) n.SP = {0.3, 0.2, 0.1, 100.0};
  n.f = draw(n.P * n.A);
  for (double& v : n.f) v = 0.2 + 0.6 * v;
  return n;
}

}  // namespace

TEST_CASE("FiringLinear / FiringEmbedding forward against loops; shapes; FiringStack wires neuron g to output g") {
  for (Path path : {Path::Dense, Path::Channels, Path::Index}) {
    CAPTURE(static_cast<int>(path));
    NaiveLayer n = naive_layer(path, 60);
    Built b = build(n);
    Vec Z, F, Y;
    n.forward(Z, F, Y);
    Tensor y = b.layer->forward(b.input);
    CHECK(y.shape() == Shape{n.N, n.P, n.A});
    check_close(y, Y, 1e-14, 0);
    CHECK(b.layer->last_gate().to_vector<double>() == F);
  }
  // Leading axes are kept; α = 1 gives (..., P).
  auto lin = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 3));
  CHECK(lin->forward(randn({2, 7, 5})).shape() == Shape{2, 7, 3});
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(9, 4).fan_out(2));
  CHECK(emb->forward(tensor(std::vector<int64_t>{1, 2, 8, 0, 3, 3}, {2, 3})).shape() == Shape{2, 3, 4, 2});
  // A stack {5, 4, 3}: layer 0 has 4 neurons with 3 outputs; neuron g of layer 1 reads (Y[b, 1, g], ..., Y[b, 4, g]).
  auto stack =
      std::make_shared<nn::FiringStack>(std::vector<int64_t>{5, 4, 3}, nn::FiringOptions(1, 1).threshold(-0.3));
  stack->to(kFloat64);
  {
    NoGradGuard ng;
    stack->layers[0]->f.copy_(randn64({4, 3}, false, 61));
    stack->layers[1]->f.copy_(randn64({3, 1}, false, 62));
  }
  Tensor x = randn64({6, 5}, false, 63);
  Tensor y = stack->forward(x);
  CHECK(y.shape() == Shape{6, 3});
  const Vec X = x.to_vector<double>(), W0 = stack->layers[0]->W.to_vector<double>(),
            W1 = stack->layers[1]->W.to_vector<double>(), f0 = stack->layers[0]->f.to_vector<double>(),
            f1 = stack->layers[1]->f.to_vector<double>();
  Vec expect(6 * 3);
  for (int64_t b = 0; b < 6; ++b) {
    Vec Y0(4 * 3);
    for (int64_t p = 0; p < 4; ++p) {
      double z = 0;
      for (int64_t c = 0; c < 5; ++c) z += W0[p * 5 + c] * X[b * 5 + c];
      for (int64_t g = 0; g < 3; ++g) Y0[p * 3 + g] = z >= -0.3 ? f0[p * 3 + g] * z : 0.0;
    }
    for (int64_t g = 0; g < 3; ++g) {
      double z = 0;
      for (int64_t p = 0; p < 4; ++p) z += W1[g * 4 + p] * Y0[p * 3 + g];
      expect[b * 3 + g] = z >= -0.3 ? f1[g] * z : 0.0;
    }
  }
  check_close(y, expect, 1e-14, 0);
  CHECK(stack->layers[1]->options.channels());
}

TEST_CASE("FiringEmbedding: only the looked-up columns of W get a gradient") {
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(8, 3).threshold(-10));  // every neuron fires
  Tensor tok = tensor(std::vector<int64_t>{1, 5, 5, 2}, {4});
  sum(emb->forward(tok)).backward();
  const Vec g = emb->W.grad().to_vector<double>();
  for (int64_t p = 0; p < 3; ++p)
    for (int64_t v = 0; v < 8; ++v) {
      const double expect = v == 1 || v == 2 ? 1.0 : v == 5 ? 2.0 : 0.0;  // Σ_b F S with f = 1, dY = 1
      CHECK(g[p * 8 + v] == expect);
    }
}

TEST_CASE("firing layers: bad input and options give clear errors") {
  auto lin = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 3));
  check_error([&] { lin->forward(randn({2, 4})); }, {"FiringLinear", "(..., 5)", "[2, 4]"});
  auto ch = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 3).channels(true));
  check_error([&] { ch->forward(randn({2, 5, 4})); }, {"FiringLinear", "(..., 5, 3)", "[2, 5, 4]"});
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(6, 3));
  check_error([&] { emb->forward(randn({2, 3})); }, {"FiringEmbedding", "int64"});
  check_error([&] { emb->forward(tensor(std::vector<int64_t>{0, 6}, {2})); }, {"FiringEmbedding", "6", "[0, 6)"});
  check_error([&] { nn::FiringLinear(nn::FiringOptions(5, 0)); }, {"FiringLinear", "neurons 0"});
  check_error([&] { nn::FiringLinear(nn::FiringOptions(5, 3).backward(GateBackward::Surrogate).surrogate("x")); },
              {"unknown surrogate 'x'"});
  check_error([&] { nn::FiringStack({5}); }, {"FiringStack", "{d, P1}"});
  check_error([&] { optim::rule_b(*lin, {.beta_r = 0}); }, {"FiringRuleB", "beta_r 0"});
  check_error([&] { optim::rule_b(*lin, {.w_min = 2, .w_max = 1}); }, {"FiringRuleB", "w_min <= w_max"});
  check_error([&] { optim::rule_a(*lin, {.w_max = 0}); }, {"FiringRuleA", "w_max 0"});
  check_error([&] { nn::FiringLinear(nn::FiringOptions(5, 3).fan_out(0)); }, {"FiringLinear", "fan_out 0"});
  check_error([&] { optim::rule_b(*lin, {.f_min = 1, .f_max = 0}); }, {"FiringRuleB", "f_min <= f_max (1, 0)"});
  check_error([&] { optim::rule_b(*lin, {.sp_min = 1, .sp_max = 1}); }, {"FiringRuleB", "sp_min < sp_max (1, 1)"});
  check_error([&] { optim::rule_a(*lin, {.sp_min = 2, .sp_max = -2}); }, {"FiringRuleA", "sp_min < sp_max (2, -2)"});
}

// ---- learning rules -------------------------------------------------------------------------------------------------
namespace {

bool row_allowed(optim::UpdateMask m, bool active) {
  return m == optim::UpdateMask::All || (m == optim::UpdateMask::Active) == active;
}

struct RuleState {
  Vec W, f, SP, r_bar, m_bar, f_bar;
};

// One optimizer step (SGD, lr, exact gate, loss <G, Y>) with rule B, every term of docs/firing.md §4 in loops: one
// simultaneous update, the Oja terms from the pre-step W and f (n.W, n.f).
RuleState naive_rule_b_step(NaiveLayer n, const Vec& G, double lr, const optim::RuleBOptions& o, Vec r_bar, Vec m_bar,
                            double weight_decay = 0) {
  const int64_t N = n.N, P = n.P, A = n.A, D = n.D;
  Vec Z, F, Y;
  n.forward(Z, F, Y);
  // Gradients of the exact gate: dZ = F S, dW[p, c] = Σ_b dZ reads, df = Σ_b G F Z.
  Vec dW(P * D, 0.0), df(P * A, 0.0);
  std::vector<bool> active(P, false);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const int64_t bp = b * P + p;
      if (F[bp] > 0) active[p] = true;
      double S = 0;
      for (int64_t g = 0; g < A; ++g) {
        S += G[bp * A + g] * n.f[p * A + g];
        df[p * A + g] += G[bp * A + g] * F[bp] * Z[bp];
      }
      for (int64_t c = 0; c < D; ++c) dW[p * D + c] += F[bp] * S * n.reads(b, p, c);
    }
  Vec W = n.W, f = n.f, SP = n.SP;
  for (int64_t p = 0; p < P; ++p) {
    if (row_allowed(o.mask_w, active[p]))
      for (int64_t c = 0; c < D; ++c) W[p * D + c] -= lr * (dW[p * D + c] + weight_decay * n.W[p * D + c]);
    if (row_allowed(o.mask_f, active[p]))
      for (int64_t g = 0; g < A; ++g) f[p * A + g] -= lr * (df[p * A + g] + weight_decay * n.f[p * A + g]);
  }
  // Oja on W and f (from the pre-step W and f, added to the gradient step), the EMAs, the threshold, the clips.
  const double zr2 = o.z_ref * o.z_ref + o.eps_z, yr2 = o.y_ref * o.y_ref + o.eps_y;
  Vec W2 = W, f2 = f;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t c = 0; c < D; ++c) {
      double s = 0;
      for (int64_t b = 0; b < N; ++b) {
        const double z = Z[b * P + p], x = n.reads(b, p, c);
        const double decay_on = n.path == Path::Index ? x : 1.0;  // index path: the looked-up column only
        s += F[b * P + p] * (z * x - z * z / zr2 * n.W[p * D + c] * decay_on);
      }
      W2[p * D + c] = std::clamp(W[p * D + c] + o.eta_w * s / N, o.w_min, o.w_max);
    }
    for (int64_t g = 0; g < A; ++g) {
      double s = 0;
      for (int64_t b = 0; b < N; ++b) {
        const double y = Y[(b * P + p) * A + g], z = Z[b * P + p];
        s += F[b * P + p] * (y * z - y * y / yr2 * n.f[p * A + g]);
      }
      f2[p * A + g] = std::clamp(f[p * A + g] + o.eta_f * s / N, o.f_min, o.f_max);
    }
    double r = 0, m = 0;
    for (int64_t b = 0; b < N; ++b) {
      r += F[b * P + p] / N;
      m += F[b * P + p] * std::max(0.0, (Z[b * P + p] - n.SP[p]) / (o.z_ref + o.eps_z)) / N;
    }
    r_bar[p] = (1 - o.beta_r) * r_bar[p] + o.beta_r * r;
    m_bar[p] = (1 - o.beta_m) * m_bar[p] + o.beta_m * m;
    SP[p] = std::clamp(SP[p] + o.eta_sp * (o.lambda_r * (r_bar[p] - o.r_target) + o.lambda_m * (m_bar[p] - o.m_target)),
                       o.sp_min, o.sp_max);
  }
  return {W2, f2, SP, r_bar, m_bar, {}};
}

RuleState naive_rule_a_step(const NaiveLayer& n, const optim::RuleAOptions& o, Vec f_bar) {
  const int64_t N = n.N, P = n.P, A = n.A, D = n.D;
  Vec Z, F, Y;
  n.forward(Z, F, Y);
  Vec W = n.W, f = n.f, SP = n.SP;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t c = 0; c < D; ++c) {
      double pot = 0, dep = 0;
      for (int64_t b = 0; b < N; ++b) {
        pot += std::max(0.0, Z[b * P + p] - n.SP[p]) * n.reads(b, p, c) / N;
        dep += std::max(0.0, n.SP[p] - Z[b * P + p]) * n.reads(b, p, c) / N;
      }
      const double w = n.W[p * D + c];
      W[p * D + c] =
          std::clamp(w + o.eta_plus * pot * (1 - w / o.w_max) - o.eta_minus * dep * (w / o.w_max), 0.0, o.w_max);
    }
    double grow = 0, silent = 0, rate = 0;
    for (int64_t b = 0; b < N; ++b) {
      grow += F[b * P + p] * Z[b * P + p] / o.z_max / N;
      silent += (1 - F[b * P + p]) / N;
      rate += F[b * P + p] / N;
    }
    for (int64_t g = 0; g < A; ++g) {
      const double v = n.f[p * A + g];
      f[p * A + g] =
          std::clamp(v + o.rho_plus * grow * (1 - v / o.f_max) - o.rho_minus * silent * (v / o.f_max), 0.0, o.f_max);
    }
    f_bar[p] = (1 - o.beta) * f_bar[p] + o.beta * rate;
    SP[p] = std::clamp(SP[p] + o.eta_sp * (f_bar[p] - o.r_target), o.sp_min, o.sp_max);
  }
  return {W, f, SP, {}, {}, f_bar};
}

}  // namespace

TEST_CASE("learning rule B, one step: SGD on the masked rows, Oja on W and f, homeostasis, clips — against loops") {
  for (Path path : {Path::Dense, Path::Channels, Path::Index})
    for (optim::UpdateMask mask : {optim::UpdateMask::All, optim::UpdateMask::Active, optim::UpdateMask::Inactive}) {
      CAPTURE(static_cast<int>(path));
      CAPTURE(static_cast<int>(mask));
      NaiveLayer n = naive_layer(path, 70);
      Built b = build(n);
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
                                  .mask_f = mask};
      const Vec r0 = {0.1, 0.5, 0.0, 0.2}, m0 = {0.0, 0.1, 0.2, 0.3};
      {
        NoGradGuard ng;
        b.layer->r_bar.copy_(tensor(r0, {4}));
        b.layer->m_bar.copy_(tensor(m0, {4}));
      }
      const double lr = 0.1;
      optim::SGD opt(b.layer->parameters(), {.lr = lr});
      opt.add_local_rule(optim::rule_b(*b.layer, o));
      const Tensor G = randn64({n.N, n.P, n.A}, false, 71);
      sum(b.layer->forward(b.input) * G).backward();
      opt.step();
      RuleState r = naive_rule_b_step(n, G.to_vector<double>(), lr, o, r0, m0);
      check_close(b.layer->W, r.W, 1e-13, 1e-12);
      check_close(b.layer->f, r.f, 1e-13, 1e-12);
      check_close(b.layer->SP, r.SP, 1e-13, 1e-12);
      check_close(b.layer->r_bar, r.r_bar, 1e-14, 1e-13);
      check_close(b.layer->m_bar, r.m_bar, 1e-14, 1e-13);
      CHECK(b.layer->SP.to_vector<double>()[3] == 50.0);  // the silent neuron's threshold, clipped to sp_max
    }
}

TEST_CASE(
    "rule B fuse_sgd: the SGD step folded into the Oja product equals SGD then rule B (loops, each mask, "
    "weight decay); W.grad stays undefined; the input still gets its gradient") {
  for (optim::UpdateMask mask : {optim::UpdateMask::All, optim::UpdateMask::Active, optim::UpdateMask::Inactive})
    for (double wd : {0.0, 0.3}) {
      CAPTURE(static_cast<int>(mask));
      CAPTURE(wd);
      NaiveLayer n = naive_layer(Path::Dense, 72);
      Built b = build(n);
      const optim::RuleBOptions o{.eta_w = 0.05,
                                  .eta_f = 0.07,
                                  .eta_sp = 0.3,
                                  .z_ref = 0.8,
                                  .beta_r = 0.3,
                                  .r_target = 0.2,
                                  .lambda_m = 0.5,
                                  .w_min = -0.7,
                                  .w_max = 0.75,
                                  .f_min = -1,
                                  .f_max = 0.9,
                                  .mask_w = mask,
                                  .mask_f = mask,
                                  .fuse_sgd = true};
      const double lr = 0.1;
      optim::SGD opt(b.layer->parameters(), {.lr = lr, .weight_decay = wd});
      opt.add_local_rule(optim::rule_b(*b.layer, o));
      const Tensor G = randn64({n.N, n.P, n.A}, false, 73);
      const Tensor x = b.input.detach().set_requires_grad(true);
      sum(b.layer->forward(x) * G).backward();
      CHECK(!b.layer->W.grad().defined());  // deferred to the rule
      CHECK(b.layer->f.grad().defined());
      // dL/dx = dZ W with dZ[b, p] = F Σ_g G f: the deferring product still passes the input its gradient.
      Vec Z, F, Y, dx(n.N * n.D, 0.0);
      n.forward(Z, F, Y);
      const Vec g = G.to_vector<double>();
      for (int64_t r = 0; r < n.N; ++r)
        for (int64_t p = 0; p < n.P; ++p) {
          double dz = 0;
          for (int64_t a = 0; a < n.A; ++a) dz += F[r * n.P + p] * g[(r * n.P + p) * n.A + a] * n.f[p * n.A + a];
          for (int64_t c = 0; c < n.D; ++c) dx[r * n.D + c] += dz * n.W[p * n.D + c];
        }
      check_close(x.grad(), dx, 1e-14, 1e-13);
      opt.step();
      RuleState r = naive_rule_b_step(n, g, lr, o, Vec(n.P, 0.0), Vec(n.P, 0.0), wd);
      check_close(b.layer->W, r.W, 1e-13, 1e-12);
      check_close(b.layer->f, r.f, 1e-13, 1e-12);
      check_close(b.layer->SP, r.SP, 1e-13, 1e-12);
      check_close(b.layer->r_bar, r.r_bar, 1e-14, 1e-13);
    }
}

TEST_CASE("rule B fuse_sgd: several float32 steps track the unfused layer; what it cannot run with is refused") {
  auto make = [](bool fused, optim::SGDOptions so) {
    manual_seed(7);
    auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(12, 16).fan_out(3).threshold(0.1));
    auto opt = std::make_shared<optim::SGD>(layer->parameters(), so);
    opt->add_local_rule(optim::rule_b(*layer, {.eta_w = 1e-2,
                                               .eta_f = 1e-2,
                                               .eta_sp = 1e-2,
                                               .w_min = -1,
                                               .w_max = 1,
                                               .f_min = -2,
                                               .f_max = 2,
                                               .mask_w = optim::UpdateMask::Active,
                                               .fuse_sgd = fused}));
    return std::make_pair(layer, opt);
  };
  auto max_abs_diff = [](const Tensor& u, const Tensor& v) {
    NoGradGuard ng;
    return amax(abs(u - v)).item<double>();
  };
  auto [a, opt_a] = make(false, {.lr = 0.05, .weight_decay = 0.01});
  auto [b, opt_b] = make(true, {.lr = 0.05, .weight_decay = 0.01});
  for (int step = 0; step < 6; ++step) {
    const Tensor x = randn({32, 12}), G = randn({32, 16, 3});
    for (auto& [layer, opt] : {std::pair{a, opt_a}, std::pair{b, opt_b}}) {
      sum(layer->forward(x) * G).backward();
      opt->step();
      layer->zero_grad();
    }
    if (step == 2) opt_a->set_lr(0, 0.02), opt_b->set_lr(0, 0.02);  // the rule reads the lr of each step
  }
  CHECK(max_abs_diff(a->W, b->W) < 1e-5);
  CHECK(max_abs_diff(a->f, b->f) < 1e-5);
  CHECK(max_abs_diff(a->SP, b->SP) < 1e-6);
  CHECK(max_abs_diff(a->W, a->W.detach() * 0) > 0.1);  // it trained

  // Refused: optimizers other than plain SGD (nothing is modified), a second training forward before the step,
  // another rule masking W, W with a gradient of its own, paths other than the dense one, two fused rules.
  auto refuses = [](optim::Optimizer& opt, const std::shared_ptr<nn::FiringLinear>& layer, const char* what) {
    sum(layer->forward(randn({4, 12}))).backward();
    const Tensor W0 = layer->W.clone(), f0 = layer->f.clone();
    CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains(what), asc::Error);
    CHECK(same_bits(layer->W, W0));
    CHECK(same_bits(layer->f, f0));
  };
  {
    auto [layer, opt] = make(true, {.lr = 0.05, .momentum = 0.9});
    refuses(*opt, layer, "momentum 0.9");
  }
  {
    manual_seed(7);
    auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(12, 16));
    optim::Adam adam(layer->parameters(), {.lr = 1e-3});
    adam.add_local_rule(optim::rule_b(*layer, {.w_min = -1, .fuse_sgd = true}));
    refuses(adam, layer, "W is in a Adam group");
  }
  {
    auto [layer, opt] = make(true, {.lr = 0.05});
    optim::SGD other(layer->parameters(), {.lr = 0.05});
    other.add_local_rule(
        optim::rule_b(*layer, {.w_min = -1}));  // not the fused rule's optimizer: it runs nothing fused
    auto extra = optim::rule_b(*layer, {.w_min = -1, .mask_w = optim::UpdateMask::Inactive});
    opt->add_local_rule(extra);
    refuses(*opt, layer, "also masks W");
  }
  {
    auto [layer, opt] = make(true, {.lr = 0.05});
    Tensor y = layer->forward(randn({4, 12}));
    (sum(y) + sum(layer->W * layer->W)).backward();
    CHECK_THROWS_WITH_AS(opt->step(), doctest::Contains("would be taken twice"), asc::Error);
  }
  {
    auto [layer, opt] = make(true, {.lr = 0.05});
    sum(layer->forward(randn({4, 12}))).backward();
    CHECK_THROWS_WITH_AS(layer->forward(randn({4, 12})), doctest::Contains("gradient accumulation"), asc::Error);
    opt->step();  // the pending gradient is used; forward passes go on
    CHECK_NOTHROW(layer->forward(randn({4, 12})));
  }
  {
    auto [layer, opt] = make(true, {.lr = 0.05});
    CHECK_THROWS_WITH_AS(optim::rule_b(*layer, {.fuse_sgd = true}), doctest::Contains("already attached"), asc::Error);
    auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(6, 4));
    CHECK_THROWS_WITH_AS(optim::rule_b(*emb, {.fuse_sgd = true}), doctest::Contains("dense input"), asc::Error);
    auto ch = std::make_shared<nn::FiringLinear>(nn::FiringOptions(3, 4).channels(true));
    CHECK_THROWS_WITH_AS(optim::rule_b(*ch, {.fuse_sgd = true}), doctest::Contains("dense input"), asc::Error);
  }
  {
    // Eval mode defers nothing: W gets its .grad and the optimizer steps it as usual.
    auto [layer, opt] = make(true, {.lr = 0.05});
    layer->eval();
    sum(layer->forward(randn({4, 12}))).backward();
    CHECK(layer->W.grad().defined());
    const Tensor W0 = layer->W.clone();
    opt->step();
    CHECK(!same_bits(layer->W, W0));
  }
}

TEST_CASE("learning rule A, one step: potentiation / depression with soft bounds, output weights, threshold EMA") {
  for (Path path : {Path::Dense, Path::Channels, Path::Index}) {
    CAPTURE(static_cast<int>(path));
    NaiveLayer n = naive_layer(path, 80, true);
    Built b = build(n);
    const optim::RuleAOptions o{.eta_plus = 0.2,
                                .eta_minus = 0.15,
                                .rho_plus = 0.3,
                                .rho_minus = 0.25,
                                .eta_sp = 0.4,
                                .z_max = 1.5,
                                .w_max = 0.9,
                                .f_max = 0.85,
                                .beta = 0.3,
                                .r_target = 0.25};
    const Vec fb0 = {0.3, 0.1, 0.0, 0.6};
    {
      NoGradGuard ng;
      b.layer->f_bar.copy_(tensor(fb0, {4}));
    }
    optim::SGD opt(b.layer->parameters(), {.lr = 0.0});
    opt.add_local_rule(optim::rule_a(*b.layer, o));
    b.layer->forward(b.input);  // rule A needs no backward pass
    opt.step();
    RuleState r = naive_rule_a_step(n, o, fb0);
    check_close(b.layer->W, r.W, 1e-14, 1e-13);
    check_close(b.layer->f, r.f, 1e-14, 1e-13);
    check_close(b.layer->SP, r.SP, 1e-14, 1e-13);
    check_close(b.layer->f_bar, r.f_bar, 1e-14, 1e-13);
  }
}

TEST_CASE("rule B alone on linear-Gaussian inputs: firing rate to r* (within 0.01), Oja norm |W_p|^2 to Z_ref2") {
  const int64_t d = 6, P = 3, batch = 512;
  manual_seed(90);
  Tensor mix = randn({d, d}) * 0.6 + eye(d);  // x = mix s, s ~ N(0, I): correlated Gaussian inputs
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(d, P));
  optim::SGD opt(layer->parameters(), {.lr = 0.0});  // η_bp = 0: the local terms alone
  const double r_target = 0.3, z_ref = 1.2;
  opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 0.02,
                                            .eta_f = 0.0,
                                            .eta_sp = 0.05,
                                            .z_ref = z_ref,
                                            .beta_r = 0.2,
                                            .r_target = r_target,
                                            .lambda_r = 1.0,
                                            .lambda_m = 0.0,
                                            .w_min = -5,
                                            .w_max = 5,
                                            .f_min = -5,
                                            .f_max = 5}));
  Generator g(91);
  Vec rate(P, 0.0);
  const int steps = 1500, tail = 300;
  for (int step = 0; step < steps; ++step) {
    Tensor x = matmul(randn({batch, d}, {}, &g), mix.t());
    layer->forward(x);
    if (step >= steps - tail) {
      const Vec r = mean(layer->last_gate(), {0}).to_vector<double>();
      for (int64_t p = 0; p < P; ++p) rate[p] += r[p] / tail;
    }
    opt.step();
  }
  const Vec W = layer->W.to_vector<double>();
  for (int64_t p = 0; p < P; ++p) {
    CAPTURE(p);
    CHECK(std::abs(rate[p] - r_target) < 0.01);
    double n2 = 0;
    for (int64_t c = 0; c < d; ++c) n2 += W[p * d + c] * W[p * d + c];
    CHECK(std::abs(n2 - (z_ref * z_ref + 1e-6)) < 0.05 * z_ref * z_ref);
  }
}

TEST_CASE("rule B with mask = active: a silent neuron's rows stay bit-identical (momentum, weight decay)") {
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).fan_out(2));
  {
    NoGradGuard ng;
    layer->SP.copy_(tensor(Vec{-0.5, -0.5, 1e6, -0.5}, {4}, {.dtype = kFloat32}));  // neuron 2 never fires
  }
  optim::SGD opt(layer->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 0.01,
                                            .eta_f = 0.01,
                                            .w_min = -1,
                                            .w_max = 1,
                                            .f_min = -2,
                                            .f_max = 2,
                                            .mask_w = optim::UpdateMask::Active,
                                            .mask_f = optim::UpdateMask::Active}));
  const Tensor W0 = layer->W.clone(), f0 = layer->f.clone();
  for (int step = 0; step < 5; ++step) {
    Tensor y = layer->forward(randn({16, 5}));
    sum(y * y).backward();
    opt.step();
    layer->zero_grad();
  }
  CHECK(same_bits(layer->W.select(0, 2), W0.select(0, 2)));
  CHECK(same_bits(layer->f.select(0, 2), f0.select(0, 2)));
  CHECK(!same_bits(layer->W.select(0, 0), W0.select(0, 0)));
  CHECK(!same_bits(layer->f.select(0, 1), f0.select(0, 1)));
}

TEST_CASE("firing rules: no adaptation in eval mode; the rule state checkpoints, so a resumed run is bit-identical") {
  auto make = [] {
    manual_seed(100);
    auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).fan_out(2).threshold(0.1));
    return layer;
  };
  const optim::RuleBOptions o{.eta_w = 0.03,
                              .eta_f = 0.02,
                              .eta_sp = 0.1,
                              .r_target = 0.4,
                              .lambda_m = 0.3,
                              .w_min = -1,
                              .w_max = 1,
                              .f_min = -2,
                              .f_max = 2};
  // Eval mode: the forward records nothing, so a step moves nothing (lr 0).
  {
    auto layer = make();
    optim::SGD opt(layer->parameters(), {.lr = 0.0});
    opt.add_local_rule(optim::rule_b(*layer, o));
    StateDict before;  // copies: state_dict() hands out the live tensors
    for (const auto& [name, t] : layer->state_dict()) before.set(name, t.detach().clone());
    layer->eval();
    layer->forward(randn({8, 5}));
    opt.step();
    for (const auto& [name, t] : layer->state_dict()) {
      CAPTURE(name);
      CHECK(same_bits(t, before.at(name)));
    }
  }
  // Six steps in one run against three, a checkpoint (state_dict), a fresh layer, rule and optimizer, three more.
  std::vector<Tensor> batches, targets;
  Generator g(101);
  for (int i = 0; i < 6; ++i) batches.push_back(randn({12, 5}, {}, &g)), targets.push_back(randn({12, 4, 2}, {}, &g));
  auto run = [&](nn::FiringLinear& layer, int from, int to) {
    optim::SGD opt(layer.parameters(), {.lr = 0.05});
    opt.add_local_rule(optim::rule_b(layer, o));
    for (int i = from; i < to; ++i) {
      layer.zero_grad();
      sum(layer.forward(batches[i]) * targets[i]).backward();
      opt.step();
    }
  };
  auto whole = make();
  run(*whole, 0, 6);
  auto first = make();
  run(*first, 0, 3);
  StateDict saved = first->state_dict();
  CHECK(saved.contains("r_bar"));
  CHECK(saved.contains("m_bar"));
  auto resumed = std::make_shared<nn::FiringLinear>(nn::FiringOptions(5, 4).fan_out(2).threshold(0.1));
  resumed->load_state_dict(saved);
  run(*resumed, 3, 6);
  for (const auto& [name, t] : whole->state_dict()) {
    CAPTURE(name);
    CHECK(same_bits(resumed->state_dict().at(name), t));
  }
}

// ---- the low-rank cross-path SSM ---------------------------------------------------------------------------------
namespace {

// h_t = a_t s_{t-1} + u_t, s_t = h_t / sqrt(mean h_t² + eps) (rms) or h_t; a, u (B, T, R), s0 (B, R).
Vec naive_scan(const Vec& a, const Vec& u, const Vec& s0, int64_t B, int64_t T, int64_t R, bool rms, double eps) {
  Vec s(B * T * R);
  for (int64_t b = 0; b < B; ++b) {
    Vec prev(s0.begin() + b * R, s0.begin() + (b + 1) * R);
    for (int64_t t = 0; t < T; ++t) {
      Vec h(R);
      double ms = 0;
      for (int64_t c = 0; c < R; ++c) {
        h[c] = a[(b * T + t) * R + c] * prev[c] + u[(b * T + t) * R + c];
        ms += h[c] * h[c] / R;
      }
      for (int64_t c = 0; c < R; ++c) prev[c] = rms ? h[c] / std::sqrt(ms + eps) : h[c];
      std::copy(prev.begin(), prev.end(), s.begin() + (b * T + t) * R);
    }
  }
  return s;
}

}  // namespace

TEST_CASE("ssm_scan: forward against loops, float64 gradcheck through 9 steps (a, u, s0; with and without the RMS)") {
  const int64_t B = 2, T = 9, R = 5;
  for (bool rms : {false, true})
    for (bool shared_s0 : {true, false}) {
      CAPTURE(rms);
      CAPTURE(shared_s0);
      Tensor a = sigmoid(randn64({B, T, R}, false, 110)).detach().set_requires_grad(true);
      Tensor u = randn64({B, T, R}, true, 111);
      Tensor s0 = shared_s0 ? randn64({R}, true, 112) : randn64({B, R}, true, 113);
      const Vec s0v = shared_s0 ? [&] {
        Vec v = s0.to_vector<double>(), w;
        for (int64_t b = 0; b < B; ++b) w.insert(w.end(), v.begin(), v.end());
        return w;
      }() : s0.to_vector<double>();
      Tensor s = ssm_scan(a, u, s0, rms, 1e-3);
      check_close(s, naive_scan(a.to_vector<double>(), u.to_vector<double>(), s0v, B, T, R, rms, 1e-3), 1e-13, 1e-12);
      check_grad([rms](const TensorList& in) { return TensorList{ssm_scan(in[0], in[1], in[2], rms, 1e-3)}; },
                 {a, u, s0});
    }
  // T = 1024 (the longest the docs name) against the loops.
  Tensor a = sigmoid(randn64({2, 1024, 4}, false, 114)), u = randn64({2, 1024, 4}, false, 115) * 0.1;
  check_close(ssm_scan(a, u, zeros({4}, {.dtype = kFloat64}), true),
              naive_scan(a.to_vector<double>(), u.to_vector<double>(), Vec(8, 0.0), 2, 1024, 4, true, 1e-6), 1e-12,
              1e-10);
  check_error([&] { ssm_scan(a, u.narrow(1, 0, 5), zeros({4}, {.dtype = kFloat64})); }, {"ssm_scan", "a and u"});
  check_error([&] { ssm_scan(a, u, zeros({3}, {.dtype = kFloat64})); }, {"ssm_scan", "s0 must be (4) or (2, 4)"});
}

TEST_CASE(
    "CrossPathSSM: every formula against loops; gradcheck through 8 steps; a layer with ssm_rank outputs F f t~") {
  const int64_t B = 2, T = 8, P = 5, R = 3;
  for (bool rms : {false, true}) {
    CAPTURE(rms);
    manual_seed(120);
    auto ssm = std::make_shared<nn::CrossPathSSM>(
        P, R, nn::SSMOptions{.a_min = 0.05, .a_max = 0.9, .rms_norm = rms, .learn_s0 = true});
    ssm->to(kFloat64);
    {
      NoGradGuard ng;
      ssm->s0.copy_(randn64({R}, false, 121));
      ssm->b_lambda.copy_(randn64({R}, false, 122));
    }
    Tensor Z = randn64({B, T, P}, false, 123);
    Tensor F = ge(Z, 0.0).to(kFloat64);
    // Loops.
    const Vec z = Z.to_vector<double>(), fg = F.to_vector<double>(), Vr = ssm->V_r.to_vector<double>(),
              W = ssm->W_lambda.to_vector<double>(), bl = ssm->b_lambda.to_vector<double>(),
              Vb = ssm->V_b.to_vector<double>(), Vo = ssm->V_o.to_vector<double>(), s0 = ssm->s0.to_vector<double>();
    Vec expect(B * T * P);
    for (int64_t b = 0; b < B; ++b) {
      Vec s = s0;
      for (int64_t t = 0; t < T; ++t) {
        Vec tv(P), r(R, 0.0), h(R, 0.0);
        for (int64_t p = 0; p < P; ++p) tv[p] = fg[(b * T + t) * P + p] * z[(b * T + t) * P + p];
        for (int64_t k = 0; k < R; ++k)
          for (int64_t p = 0; p < P; ++p) r[k] += tv[p] * Vr[p * R + k];
        double ms = 0;
        for (int64_t k = 0; k < R; ++k) {
          double pre = bl[k], in = 0;
          for (int64_t j = 0; j < R; ++j) pre += r[j] * W[j * R + k];
          const double ak = std::clamp(1 / (1 + std::exp(-pre)), 0.05, 0.9);
          for (int64_t p = 0; p < P; ++p) in += fg[(b * T + t) * P + p] * tv[p] * Vb[p * R + k];
          h[k] = ak * s[k] + in / std::sqrt(double(R));
          ms += h[k] * h[k] / R;
        }
        for (int64_t k = 0; k < R; ++k) s[k] = rms ? h[k] / std::sqrt(ms + 1e-6) : h[k];
        for (int64_t p = 0; p < P; ++p) {
          double v = 0;
          for (int64_t k = 0; k < R; ++k) v += s[k] * Vo[k * P + p];
          expect[(b * T + t) * P + p] = v;
        }
      }
    }
    check_close(ssm->messages(Z, F), expect, 1e-13, 1e-12);
    // Gradcheck w.r.t. Z and every parameter (F fixed: the gate is not differentiated here).
    TensorList params = {ssm->V_r, ssm->W_lambda, ssm->b_lambda, ssm->V_b, ssm->V_o, ssm->s0};
    Tensor Zg = Z.detach().clone().set_requires_grad(true);
    TensorList inputs = {Zg};
    inputs.insert(inputs.end(), params.begin(), params.end());
    check_grad(
        [&](const TensorList& in) {
          nn::CrossPathSSM& m = *ssm;
          m.V_r = in[1], m.W_lambda = in[2], m.b_lambda = in[3], m.V_b = in[4], m.V_o = in[5], m.s0 = in[6];
          return TensorList{m.messages(in[0], F)};
        },
        inputs);
    ssm->V_r = params[0], ssm->W_lambda = params[1], ssm->b_lambda = params[2], ssm->V_b = params[3];
    ssm->V_o = params[4], ssm->s0 = params[5];
  }
  // A layer with the SSM: output F f t~ over (B, T, ·), gradients reach W, f and the SSM's parameters.
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(4, P).fan_out(2).ssm_rank(R).threshold(-0.2));
  layer->to(kFloat64);
  Tensor x = randn64({B, T, 4}, false, 130);
  Tensor y = layer->forward(x);
  CHECK(y.shape() == Shape{B, T, P, 2});
  Tensor Z = matmul(x, layer->W.t()).detach();
  Tensor F = ge(Z, -0.2).to(kFloat64);
  Tensor tt = layer->ssm->messages(Z, F).detach();
  check_close(y, (F * tt).view({B, T, P, 1}) * layer->f.detach().view({1, 1, P, 2}), 1e-13, 1e-12);
  sum(y * y).backward();
  for (const auto& [name, p] : layer->named_parameters()) {
    CAPTURE(name);
    if (name == "SP") continue;  // the exact gate: no gradient
    REQUIRE(p.grad().defined());
    CHECK(amax(abs(p.grad())).item<double>() > 0);
  }
  check_error([&] { layer->forward(randn64({B, 4})); }, {"FiringLinear", "time axis"});
  check_error([&] { nn::CrossPathSSM(5, 0); }, {"CrossPathSSM", "rank 0"});
  check_error([&] { nn::CrossPathSSM(5, 6); }, {"CrossPathSSM", "rank 6", "neurons 5"});
  check_error([&] { nn::FiringLinear(nn::FiringOptions(4, 3).ssm_rank(4)); }, {"CrossPathSSM", "rank 4", "neurons 3"});
  check_error([&] { nn::CrossPathSSM(5, 2, {.a_min = 0.9, .a_max = 0.5}); },
              {"CrossPathSSM", "a_min 0.9", "a_max 0.5"});
  CHECK(nn::CrossPathSSM(5, 5).rank == 5);  // P_r = P is allowed
}

TEST_CASE("rule B on CUDA (plain and fuse_sgd, mask active, weight decay) equals the CPU step, float64") {
  if (!gpu_or_skip()) return;
  for (bool fused : {false, true}) {
    CAPTURE(fused);
    auto run = [&](Device dev) {
      manual_seed(21);
      auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(9, 37).fan_out(3).threshold(0.05));
      layer->to(kFloat64);
      layer->to(dev);
      optim::SGD opt(layer->parameters(), {.lr = 0.05, .weight_decay = 0.01});
      opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 0.02,
                                                .eta_f = 0.02,
                                                .eta_sp = 0.05,
                                                .lambda_m = 0.5,
                                                .w_min = -1,
                                                .w_max = 1,
                                                .f_min = -2,
                                                .f_max = 2,
                                                .mask_w = optim::UpdateMask::Active,
                                                .fuse_sgd = fused}));
      for (int step = 0; step < 3; ++step) {
        const Tensor x = randn64({40, 9}, false, 300 + step).to(dev), G = randn64({40, 37, 3}, false, 400 + step);
        sum(layer->forward(x) * G.to(dev)).backward();
        opt.step();
        layer->zero_grad();
      }
      return std::vector<Tensor>{layer->W.to(Device::cpu()), layer->f.to(Device::cpu()), layer->SP.to(Device::cpu()),
                                 layer->r_bar.to(Device::cpu()), layer->m_bar.to(Device::cpu())};
    };
    const std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(Device::cuda());
    for (size_t i = 0; i < cpu.size(); ++i) {
      CAPTURE(i);
      check_close(gpu[i], cpu[i].to_vector<double>(), 1e-12, 1e-11);
    }
  }
}

TEST_CASE("firing_weight_update_ on CUDA equals the CPU (float64, float32; sparse and dense coefficients)") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t N = 37, P = 21, d = 13;
  manual_seed(4);
  const Tensor W0 = randn64({P, d}, false, 70), keep = rand({P}).to(kFloat64) + 0.5, X = randn64({N, d}, false, 71);
  for (double density : {0.1, 1.0})
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(density);
      CAPTURE(dtype_name(dt));
      const Tensor coef = sparse_coef(N, P, density, 72).to(dt);
      Tensor a = W0.to(dt).clone(), b = W0.to(dt).to(gpu);
      firing_weight_update_(a, keep.to(dt), coef, X.to(dt));
      firing_weight_update_(b, keep.to(dt).to(gpu), coef.to(gpu), X.to(dt).to(gpu));
      const double tol = dt == kFloat64 ? 1e-13 : 1e-5;
      check_close(b.to(Device::cpu()), a, tol, tol);
    }
}

TEST_CASE("firing_batch_sums and firing_rule_b_coef on CUDA equal the CPU (float64, float32)") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t N = 300, P = 70;  // 300 rows: two row blocks of the column sums
  const SumCase k = sum_case(N, P, 85);
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    const Tensor Z = k.Z.to(dt), F = k.F.to(dt), SP = k.SP.to(dt), dZ = k.dZ.to(dt), c = k.c.to(dt);
    const FiringBatchSums a = firing_batch_sums(Z, F, SP), b = firing_batch_sums(Z.to(gpu), F.to(gpu), SP.to(gpu));
    check_close(b.fz2.to(Device::cpu()), a.fz2, tol, tol);
    CHECK(b.fired.to(Device::cpu()).to_vector<double>() == a.fired.to_vector<double>());
    check_close(b.margin.to(Device::cpu()), a.margin, tol, tol);
    check_close(firing_rule_b_coef(Z.to(gpu), F.to(gpu), 0.7, dZ.to(gpu), c.to(gpu)).to(Device::cpu()),
                firing_rule_b_coef(Z, F, 0.7, dZ, c), tol, tol);
    check_close(firing_rule_b_coef(Z.to(gpu), F.to(gpu), 0.7).to(Device::cpu()), firing_rule_b_coef(Z, F, 0.7), tol,
                tol);
  }
}

TEST_CASE(
    "ssm_scan CUDA kernels equal the CPU kernel (float64, float32; RMS on and off; the sequential kernels and "
    "the chunked scan)") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  // T = 300 without the RMS runs the chunked scan (5 chunks, the last partial); T = 50 and the RMS the sequential one.
  for (int64_t T : {50, 300})
    for (bool rms : {false, true})
      for (DType dt : {kFloat64, kFloat32}) {
        CAPTURE(T);
        CAPTURE(rms);
        CAPTURE(dtype_name(dt));
        const int64_t B = 3, R = 130;  // R > the block's 128 threads: two channels per thread for some
        Tensor a = sigmoid(randn64({B, T, R}, false, 140)).to(dt), u = (randn64({B, T, R}, false, 141) * 0.3).to(dt);
        Tensor s0 = randn64({B, R}, false, 142).to(dt), g = randn64({B, T, R}, false, 143).to(dt);
        auto run = [&](Device dev) {
          Tensor al = a.to(dev).detach().set_requires_grad(true), ul = u.to(dev).detach().set_requires_grad(true);
          Tensor sl = s0.to(dev).detach().set_requires_grad(true);
          Tensor s = ssm_scan(al, ul, sl, rms);
          sum(s * g.to(dev)).backward();
          return TensorList{s.detach().to(Device::cpu()), al.grad().to(Device::cpu()), ul.grad().to(Device::cpu()),
                            sl.grad().to(Device::cpu())};
        };
        TensorList c = run(Device::cpu()), d = run(gpu);
        const double tol = dt == kFloat64 ? 1e-11 : 2e-4;
        for (size_t i = 0; i < c.size(); ++i) {
          CAPTURE(i);
          check_close(d[i], c[i], tol, tol);
        }
      }
}

TEST_CASE("models: the firing classifier runs with every fan-out, α = 1 included (forward and backward shapes)") {
  for (int64_t alpha : {1, 2, 3}) {
    CAPTURE(alpha);
    manual_seed(149);
    models::FiringClassifier net(models::FiringClassifierOptions(6, 3).hidden(5).fan_out(alpha));
    Tensor x = randn({4, 6});
    Tensor y = net.forward(x);
    REQUIRE(y.shape() == Shape{4, 3});
    sum(y).backward();
    for (const auto& [name, p] : net.named_parameters()) {
      INFO(name);
      CHECK(p.grad().defined());
    }
  }
}

TEST_CASE(
    "models: the firing classifier learns a separable problem; the token model (index path + SSM) learns a "
    "successor sequence") {
  manual_seed(150);
  auto net = std::make_shared<models::FiringClassifier>(models::FiringClassifierOptions(8, 2).hidden(32).fan_out(4));
  optim::Adam opt(net->parameters(), {.lr = 1e-2});
  Generator g(151);
  Tensor x = randn({256, 8}, {}, &g);
  Tensor label = gt(x.narrow(1, 0, 1) + x.narrow(1, 1, 1), 0.0).to(kInt64).view({256});
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(net->forward(x), label);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  double acc = 0;
  {
    NoGradGuard ng;
    acc = mean(eq(argmax(net->forward(x), -1), label).to(kFloat64)).item<double>();
  }
  CHECK(last < 0.5 * first);
  CHECK(acc > 0.85);

  manual_seed(152);
  auto lm = std::make_shared<models::FiringTokenModel>(models::FiringTokenModelOptions(6, 24).ssm_rank(4));
  optim::Adam opt2(lm->parameters(), {.lr = 2e-2});
  std::vector<int64_t> seq;
  for (int i = 0; i < 17 * 2; ++i) seq.push_back(i % 6);
  Tensor all = tensor(seq, {2, 17});
  Tensor inp = all.narrow(1, 0, 16).contiguous(), tgt = all.narrow(1, 1, 16).contiguous().view({32});
  double lm_first = 0, lm_last = 0;
  for (int step = 0; step < 120; ++step) {
    opt2.zero_grad();
    Tensor loss = cross_entropy(lm->forward(inp).view({32, 6}), tgt);
    loss.backward();
    opt2.step();
    (step == 0 ? lm_first : lm_last) = loss.item<double>();
  }
  CHECK(lm->forward(inp).shape() == Shape{2, 16, 6});
  CHECK(lm_last < 0.3 * lm_first);
}
