// Hardening of the firing perceptron's ops and kernels (ops/firing.h) and of the firing layers' options: NaN
// propagates through the gate (SPEC §2: a neuron whose Z or SP is NaN outputs NaN, and its gradients are NaN; a
// silent neuron with a finite Z outputs exactly 0), on the CPU and on CUDA, against an independent float64 loop;
// an exception thrown by a user surrogate reaches the caller; integer sizes at 0, 1, n, n + 1 and INT64_MAX; non-finite
// options refused with a clear error (the "Accepted options" table of docs/firing.md, walked bound by bound); aliased
// inputs of firing_weight_update_ give the unaliased result; CUDA refuses what the CPU refuses; and the results are
// bit-identical for 1, 2 and 3 threads.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing.h"

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

using namespace asc;
using namespace asc::testing;

namespace {

using Vec = std::vector<double>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

struct Deterministic {
  bool saved = deterministic_algorithms_enabled();
  Deterministic() { use_deterministic_algorithms(true); }
  ~Deterministic() { use_deterministic_algorithms(saved); }
};

// The surrogate derivatives, written again from docs/ops.md; "b1_parabola" is a user-registered one.
double surrogate_ref(const std::string& name, double u, double w) {
  if (name == "sigmoid") {
    const double s = 1 / (1 + std::exp(-w * u));
    return w * s * (1 - s);
  }
  if (name == "rectangular") return std::abs(u) < w / 2 ? 1 / w : 0.0;
  if (name == "triangular") return std::max(0.0, 1 - std::abs(u) / w) / w;
  if (name == "atan") return w / (2 * (1 + std::pow(3.14159265358979323846 / 2 * w * u, 2)));
  if (name == "b1_parabola") return std::max(0.0, 1 - (u / w) * (u / w)) * 0.75 / w;
  FAIL("unknown surrogate " << name);
  return 0;
}

void register_user_surrogates() {
  static bool done = false;
  if (done) return;
  register_surrogate(
      {"b1_parabola", [](double u, double w) { return std::max(0.0, 1 - (u / w) * (u / w)) * 0.75 / w; }});
  // Throws for some arguments only, so that it fails in the middle of a backward pass.
  register_surrogate({"b1_throws", [](double u, double) -> double {
                        if (u > 1.5) throw std::runtime_error("b1_throws: user surrogate failed");
                        return 1.0;
                      }});
  register_surrogate({"b1_throws_asc", [](double u, double) -> double {
                        if (u > 1.5) throw asc::Error("b1_throws_asc: user surrogate failed");
                        return 1.0;
                      }});
  done = true;
}

// The firing gate in float64 loops, with SPEC §2's NaN rule written out: F = NaN where Z or SP is NaN (the gate is
// undefined), else 1[Z >= SP]; Y = F f Z except exactly 0 where F = 0; S = Σ_g dY f;
//   exact gate:  dZ = S F (0 where F = 0),  dSP = NaN for an undefined neuron, else 0
//   otherwise:   zd = Z s'(Z − SP) (NaN where undefined),  dZ = S (F + zd),  dSP = −Σ_b S zd
//   df = Σ_b dY F Z over the (b, p) with F ≠ 0.
struct Ref {
  Vec Y, F, dZ, dSP, df;
};
Ref reference(const Vec& Z, const Vec& SP, const Vec& f, const Vec& dY, int64_t N, int64_t P, int64_t A,
              GateBackward mode, const std::string& sur, double width) {
  Ref r;
  r.Y.assign(N * P * A, 0.0), r.F.assign(N * P, 0.0), r.dZ.assign(N * P, 0.0), r.dSP.assign(P, 0.0);
  r.df.assign(P * A, 0.0);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const double z = Z[b * P + p], s = SP[p];
      const bool undefined = std::isnan(z) || std::isnan(s);
      const double F = undefined ? kNaN : z >= s ? 1.0 : 0.0;
      r.F[b * P + p] = F;
      double S = 0;
      for (int64_t g = 0; g < A; ++g) {
        const double dy = dY[(b * P + p) * A + g];
        S += dy * f[p * A + g];
        if (F != 0) {
          r.Y[(b * P + p) * A + g] = F * f[p * A + g] * z;
          r.df[p * A + g] += dy * F * z;
        }
      }
      if (mode == GateBackward::None) {
        r.dZ[b * P + p] = F == 0 ? 0.0 : S * F;
        if (undefined) r.dSP[p] = kNaN;
      } else {
        const double d = mode == GateBackward::StraightThrough ? 1.0 : surrogate_ref(sur, z - s, width);
        const double zd = undefined ? kNaN : z * d;
        r.dZ[b * P + p] = S * (F + zd);
        r.dSP[p] -= S * zd;
      }
    }
  return r;
}

struct Run {
  Tensor Y, F, dZ, dSP, df;
};
// firing_output forward and the gradients of <dY, Y> on `dev` in `dt`, returned on the CPU in float64.
Run run(const Tensor& Z, const Tensor& SP, const Tensor& f, const Tensor& dY, const GateOptions& gate, DType dt,
        Device dev) {
  auto leaf = [&](const Tensor& t) { return t.to(dt).to(dev).detach().set_requires_grad(true); };
  Tensor z = leaf(Z), sp = leaf(SP), fw = leaf(f);
  FiringOutput o = firing_output(z, sp, fw, gate);
  o.Y.backward(dY.to(dt).to(dev));
  auto back = [](const Tensor& t) { return t.to(Device::cpu()).to(kFloat64); };
  return {back(o.Y.detach()), back(o.F), back(z.grad()), back(sp.grad()), back(fw.grad())};
}

// A case with every kind of neuron: NaN Z, NaN SP, a NaN output weight, infinite Z that fires and that is silent,
// a NaN upstream gradient at a silent neuron, and (with `quiet`) rows where fewer than a quarter of the neurons fire.
struct Case {
  int64_t N, P, A;
  Vec Z, SP, f, dY;
};
Case nan_case(int64_t N, int64_t P, int64_t A, bool quiet, uint64_t seed) {
  Case c{N,
         P,
         A,
         randn64({N, P}, false, seed).to_vector<double>(),
         (randn64({P}, false, seed + 1) * 0.3 + (quiet ? 1.2 : 0.0)).to_vector<double>(),
         randn64({P, A}, false, seed + 2).to_vector<double>(),
         randn64({N, P, A}, false, seed + 3).to_vector<double>()};
  c.Z[1 * P + 2] = kNaN;           // NaN Z
  c.SP[4] = kNaN;                  // NaN threshold: neuron 4 is undefined in every row
  c.f[0 * A + (A - 1)] = kNaN;     // a NaN output weight: NaN where neuron 0 fires, 0 where it is silent
  c.Z[2 * P + 1] = kInf;           // fires
  c.Z[3 * P + 3] = -kInf;          // silent
  c.Z[0 * P + 5] = c.SP[5] - 1.0;  // silent, with a NaN upstream gradient: ignored by the exact gate
  c.dY[(0 * P + 5) * A] = kNaN;
  c.Z[(N - 1) * P + 6] = c.SP[6];  // equality fires
  return c;
}

void check_case(const Case& c, const GateOptions& gate, DType dt, Device dev) {
  const Tensor Z = tensor(c.Z, {c.N, c.P}), SP = tensor(c.SP, {c.P}), f = tensor(c.f, {c.P, c.A});
  const Tensor dY = tensor(c.dY, {c.N, c.P, c.A});
  // The reference sees the inputs rounded to dt, as the op does.
  auto rounded = [&](const Tensor& t) { return t.to(dt).to(kFloat64).to_vector<double>(); };
  const Ref r =
      reference(rounded(Z), rounded(SP), rounded(f), rounded(dY), c.N, c.P, c.A, gate.mode, gate.surrogate, gate.width);
  const Run o = run(Z, SP, f, dY, gate, dt, dev);
  const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
  check_close(o.Y, r.Y, tol, tol);
  check_close(o.F, r.F, 0, 0);
  check_close(o.dZ, r.dZ, tol, tol);
  check_close(o.dSP, r.dSP, tol * c.N, tol);
  check_close(o.df, r.df, tol * c.N, tol);
  // Silent neurons with a finite Z: exactly +0 output (not -0, not NaN) and, with the exact gate, dZ exactly 0.
  const Vec Y = o.Y.to_vector<double>(), F = o.F.to_vector<double>(), dZ = o.dZ.to_vector<double>();
  for (int64_t i = 0; i < c.N * c.P; ++i)
    if (F[i] == 0) {
      for (int64_t g = 0; g < c.A; ++g) REQUIRE((Y[i * c.A + g] == 0 && !std::signbit(Y[i * c.A + g])));
      if (gate.mode == GateBackward::None) REQUIRE(dZ[i] == 0);
    }
  // The undefined neurons: NaN outputs and gradients, whatever the gate.
  CHECK(std::isnan(Y[(1 * c.P + 2) * c.A]));
  CHECK(std::isnan(dZ[1 * c.P + 2]));
  CHECK(std::isnan(o.dSP.to_vector<double>()[4]));
  CHECK(std::isnan(o.df.to_vector<double>()[4 * c.A]));
}

std::vector<GateOptions> every_gate(bool with_user) {
  std::vector<GateOptions> g = {{.mode = GateBackward::None}, {.mode = GateBackward::StraightThrough}};
  for (const char* s : {"sigmoid", "rectangular", "triangular", "atan"})
    g.push_back({.mode = GateBackward::Surrogate, .surrogate = s, .width = 1.3});
  if (with_user) g.push_back({.mode = GateBackward::Surrogate, .surrogate = "b1_parabola", .width = 0.9});
  return g;
}

}  // namespace

// ---- class 6: NaN propagates through the gate ------------------------------------------------------------------

TEST_CASE(
    "firing_output NaN: an undefined neuron (Z or SP NaN) outputs NaN and gets NaN gradients; a silent one "
    "with a finite Z outputs exactly 0 — every gate, every fan-out path, float64 and float32, against loops") {
  register_user_surrogates();
  for (int64_t A : {1, 2, 3, 4})
    for (bool quiet : {false, true})
      for (const GateOptions& gate : every_gate(true))
        for (DType dt : {kFloat64, kFloat32}) {
          CAPTURE(A);
          CAPTURE(quiet);
          CAPTURE(static_cast<int>(gate.mode));
          CAPTURE(gate.surrogate);
          CAPTURE(dtype_name(dt));
          check_case(nan_case(quiet ? 200 : 9, 8, A, quiet, 300 + A), gate, dt, Device::cpu());
        }
}

TEST_CASE("firing_output NaN on CUDA: the same NaN and silent-neuron results as the loops (float64, float32)") {
  if (!gpu_or_skip()) return;
  for (int64_t A : {1, 3})
    for (const GateOptions& gate : every_gate(false))
      for (DType dt : {kFloat64, kFloat32}) {
        CAPTURE(A);
        CAPTURE(static_cast<int>(gate.mode));
        CAPTURE(gate.surrogate);
        check_case(nan_case(70, 8, A, false, 400 + A), gate, dt, Device::cuda());
      }
}

TEST_CASE(
    "firing layers NaN: NaN in the input, in W (dense and index path), in f and in SP shows in the output "
    "and the gradients; the other neurons are untouched") {
  manual_seed(11);
  auto lin = std::make_shared<nn::FiringLinear>(nn::FiringOptions(3, 4).fan_out(2).threshold(-0.5));
  lin->to(kFloat64);
  Tensor x = randn64({5, 3});
  {
    std::vector<double> v = x.to_vector<double>();
    v[1 * 3 + 0] = kNaN;  // row 1: every Z of that row is NaN
    x = tensor(v, {5, 3}).set_requires_grad(true);
  }
  Tensor y = lin->forward(x);  // (5, 4, 2)
  const Vec Y = y.to_vector<double>();
  for (int64_t b = 0; b < 5; ++b)
    for (int64_t i = 0; i < 8; ++i) CHECK(std::isnan(Y[b * 8 + i]) == (b == 1));
  sum(y).backward();
  CHECK(std::isnan(x.grad().to_vector<double>()[1 * 3 + 2]));  // dX = dZ W: row 1 NaN
  CHECK(std::isnan(x.grad().to_vector<double>()[0]) == false);
  CHECK(has_non_finite(lin->W.grad()));  // dW = dZᵀ X: NaN
  CHECK(has_non_finite(lin->f.grad()));  // df = Σ_b dY F Z: NaN

  // NaN in W[2, :]: neuron 2 is undefined in every row; the others are not.
  lin->zero_grad();
  {
    NoGradGuard ng;
    lin->W.narrow(0, 2, 1).fill_(kNaN);
  }
  const Vec Y2 = lin->forward(randn64({5, 3}, false, 12)).to_vector<double>();
  for (int64_t b = 0; b < 5; ++b)
    for (int64_t p = 0; p < 4; ++p)
      for (int64_t g = 0; g < 2; ++g) CHECK(std::isnan(Y2[(b * 4 + p) * 2 + g]) == (p == 2));

  // The index path: a NaN entry of the table reaches exactly the tokens that look it up.
  auto emb = std::make_shared<nn::FiringEmbedding>(nn::FiringOptions(6, 3).threshold(-10));
  emb->to(kFloat64);
  {
    NoGradGuard ng;
    emb->W.narrow(0, 1, 1).narrow(1, 4, 1).fill_(kNaN);  // W[1, 4]
  }
  const Tensor tok = tensor(std::vector<int64_t>{4, 0, 4, 2}, {4});
  Tensor ye = emb->forward(tok);  // (4, 3): every neuron fires (threshold -10) except where undefined
  const Vec Ye = ye.to_vector<double>();
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t p = 0; p < 3; ++p) CHECK(std::isnan(Ye[b * 3 + p]) == (p == 1 && b != 1 && b != 3));
  sum(ye).backward();
  CHECK(std::isnan(emb->W.grad().to_vector<double>()[1 * 6 + 4]));
  CHECK(emb->W.grad().to_vector<double>()[0 * 6 + 4] == 2.0);  // neuron 0, token 4: two rows, dZ = 1 each
}

TEST_CASE("firing layers NaN: a NaN threshold or output weight; the gate F reports NaN where undefined") {
  auto lin = std::make_shared<nn::FiringLinear>(nn::FiringOptions(3, 4).fan_out(2));
  lin->to(kFloat64);
  {
    NoGradGuard ng;
    lin->SP.narrow(0, 3, 1).fill_(kNaN);
    lin->f.narrow(0, 0, 1).fill_(kNaN);
  }
  const Tensor x = randn64({6, 3}, false, 13);
  const Vec Y = lin->forward(x).to_vector<double>(), F = lin->last_gate().to_vector<double>();
  for (int64_t b = 0; b < 6; ++b) {
    CHECK(std::isnan(F[b * 4 + 3]));
    for (int64_t g = 0; g < 2; ++g) {
      CHECK(std::isnan(Y[(b * 4 + 3) * 2 + g]));
      // NaN f: NaN where neuron 0 fires, exactly 0 where it is silent (its f Z is never formed).
      if (F[b * 4 + 0] == 1)
        CHECK(std::isnan(Y[(b * 4 + 0) * 2 + g]));
      else
        CHECK(Y[(b * 4 + 0) * 2 + g] == 0);
    }
  }
  // With the cross-path SSM: a NaN input at step 2 of sequence 1 reaches that sequence's output (from step 2 on,
  // through the state), not sequence 0's.
  auto ssm = std::make_shared<nn::FiringLinear>(nn::FiringOptions(3, 4).ssm_rank(2).threshold(-10));
  ssm->to(kFloat64);
  std::vector<double> xv = randn64({2, 5, 3}, false, 14).to_vector<double>();
  xv[(1 * 5 + 2) * 3 + 1] = kNaN;
  const Vec Ys = ssm->forward(tensor(xv, {2, 5, 3})).to_vector<double>();  // (2, 5, 4)
  for (int64_t t = 0; t < 5; ++t) {
    CHECK(!std::isnan(Ys[(0 * 5 + t) * 4]));
    CHECK(std::isnan(Ys[(1 * 5 + t) * 4]) == (t >= 2));
  }
}

TEST_CASE(
    "firing_batch_sums / firing_rule_b_coef NaN: an undefined gate or NaN Z makes the sums NaN (max(0, NaN) "
    "is NaN); a silent (b, p) adds nothing, even an infinite Z") {
  NoGradGuard ng;
  for (Device dev : {Device::cpu(), Device::cuda()}) {
    if (dev.is_cuda() && !cuda::is_available()) continue;
    const Tensor Z = tensor(Vec{kNaN, 1.0, -kInf, 2.0, 0.5, 3.0}, {2, 3}).to(dev);
    const Tensor F = tensor(Vec{kNaN, 1.0, 0.0, 1.0, 0.0, kNaN}, {2, 3}).to(dev);
    const Tensor SP = tensor(Vec{0.0, 0.0, kNaN}, {3}).to(dev);
    FiringBatchSums s = firing_batch_sums(Z, F, SP);
    const Vec fz2 = s.fz2.to_vector<double>(), fired = s.fired.to_vector<double>(), m = s.margin.to_vector<double>();
    CHECK(std::isnan(fz2[0]));
    CHECK(std::isnan(fired[0]));
    CHECK(std::isnan(m[0]));
    CHECK(fz2[1] == 1.0);  // 1² (row 0) + nothing (row 1 silent)
    CHECK(fired[1] == 1.0);
    CHECK(m[1] == 1.0);
    CHECK(std::isnan(fz2[2]));  // row 1: F NaN, Z 3 — an undefined gate
    CHECK(std::isnan(m[2]));    // and max(0, 3 − NaN) is NaN
    const Vec coef = firing_rule_b_coef(Z, F, 2.0).to_vector<double>();
    CHECK(std::isnan(coef[0]));
    CHECK(coef[1] == 2.0);
    CHECK((coef[2] == 0 && !std::signbit(coef[2])));  // silent, Z = -inf: exactly +0
    CHECK(std::isnan(coef[5]));
  }
}

// ---- class 3: a user surrogate that throws ---------------------------------------------------------------------

TEST_CASE(
    "firing_output: a user surrogate that throws in the backward pass reaches the caller (sizes that go "
    "parallel), and the op works again after it") {
  register_user_surrogates();
  for (const char* name : {"b1_throws", "b1_throws_asc"}) {
    CAPTURE(name);
    Tensor Z = (randn64({4096, 64}, false, 21) * 2).set_requires_grad(true);
    Tensor SP = zeros({64}, {.dtype = kFloat64}).set_requires_grad(true), f = ones({64, 2}, {.dtype = kFloat64});
    FiringOutput o = firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .surrogate = name});
    CHECK_THROWS(sum(o.Y).backward());
  }
  // The layer: the same, through Module::forward and the engine.
  auto lin = std::make_shared<nn::FiringLinear>(
      nn::FiringOptions(16, 256).backward(GateBackward::Surrogate).surrogate("b1_throws").threshold(-3));
  CHECK_THROWS(sum(lin->forward(randn({512, 16}) * 40)).backward());
  Tensor Z = randn64({4096, 64}, true, 22);
  FiringOutput o = firing_output(Z, zeros({64}, {.dtype = kFloat64}), ones({64, 1}, {.dtype = kFloat64}),
                                 {.mode = GateBackward::Surrogate, .surrogate = "b1_parabola"});
  sum(o.Y).backward();
  CHECK(!has_non_finite(Z.grad()));
}

// ---- class 2: integer options at the extremes; size products --------------------------------------------------

TEST_CASE(
    "firing ops at the size extremes: 0, 1, n, n+1 rows/neurons/outputs; empty tensors with an INT64_MAX "
    "dimension return at once; outputs whose size overflows are refused") {
  // Fan-out alpha: 0 refused; 1, 4 (n), 5 (n + 1) run against the loops (the specialised and the generic path).
  check_error([&] { firing_output(randn64({2, 3}), randn64({3}), randn64({3, 0})); }, {"firing_output", "alpha >= 1"});
  for (int64_t A : {1, 4, 5})
    for (int64_t N : {1, 64, 65})
      for (int64_t P : {1, 7}) {
        CAPTURE(A);
        CAPTURE(N);
        CAPTURE(P);
        const Tensor Z = randn64({N, P}, false, 31), SP = randn64({P}, false, 32) * 0.2, f = randn64({P, A}, false, 33);
        const Tensor dY = randn64({N, P, A}, false, 34);
        const GateOptions gate{.mode = GateBackward::Surrogate, .surrogate = "atan", .width = 0.7};
        const Ref r = reference(Z.to_vector<double>(), SP.to_vector<double>(), f.to_vector<double>(),
                                dY.to_vector<double>(), N, P, A, gate.mode, gate.surrogate, gate.width);
        const Run o = run(Z, SP, f, dY, gate, kFloat64, Device::cpu());
        check_close(o.Y, r.Y, 1e-13, 1e-13);
        check_close(o.dZ, r.dZ, 1e-13, 1e-13);
        check_close(o.dSP, r.dSP, 1e-12, 1e-12);
        check_close(o.df, r.df, 1e-12, 1e-12);
      }
  // No neurons and INT64_MAX rows (an empty tensor may have one huge dimension): nothing to do, at once. With α = 3
  // the output's shape (INT64_MAX, 0, 3) cannot exist (its nonzero sizes overflow): refused by the op.
  for (GateBackward mode : {GateBackward::None, GateBackward::Surrogate}) {
    Tensor Z = Tensor::empty({kMax, 0}, {.dtype = kFloat64}).set_requires_grad(true);
    Tensor SP = Tensor::empty({0}, {.dtype = kFloat64}).set_requires_grad(true);
    Tensor f = Tensor::empty({0, 1}, {.dtype = kFloat64}).set_requires_grad(true);
    FiringOutput o = firing_output(Z, SP, f, {.mode = mode});
    CHECK(o.Y.shape() == Shape{kMax, 0, 1});
    o.Y.backward(Tensor::empty({kMax, 0, 1}, {.dtype = kFloat64}));
    CHECK(f.grad().shape() == Shape{0, 1});
    check_error(
        [&] {
          firing_output(Z, SP, Tensor::empty({0, 3}, {.dtype = kFloat64}), {.mode = mode});
        },
        {"firing_output", "more elements than fit"});
  }
  // alpha = INT64_MAX (f (0, INT64_MAX) is a valid empty tensor): Y (1, 0, INT64_MAX) is empty and fine; with two
  // rows its size overflows and is refused by the op.
  {
    Tensor f = Tensor::empty({0, kMax}, {.dtype = kFloat64});
    FiringOutput o =
        firing_output(Tensor::empty({1, 0}, {.dtype = kFloat64}), Tensor::empty({0}, {.dtype = kFloat64}), f);
    CHECK(o.Y.numel() == 0);
    const Tensor Z2 = Tensor::empty({2, 0}, {.dtype = kFloat64}), SP0 = Tensor::empty({0}, {.dtype = kFloat64});
    check_error([&] { firing_output(Z2, SP0, f); }, {"firing_output", "more elements than fit"});
  }
  // The rule ops and the scan on empty tensors with an INT64_MAX dimension.
  {
    NoGradGuard ng;
    const Tensor Ze = Tensor::empty({0, kMax}, {.dtype = kFloat64});
    CHECK(firing_rule_b_coef(Ze, Ze, 1.0).shape() == Shape{0, kMax});
    const Tensor Zr = Tensor::empty({kMax, 0}, {.dtype = kFloat64});
    FiringBatchSums s = firing_batch_sums(Zr, Zr, Tensor::empty({0}, {.dtype = kFloat64}));
    CHECK(s.fz2.numel() == 0);
    CHECK(firing_rule_b_coef(Zr, Zr, 1.0).shape() == Shape{kMax, 0});
    // firing_weight_update_: no rows (W <- keep W), no neurons, no inputs, and INT64_MAX rows of nothing.
    Tensor W = randn64({3, 2}, false, 35);
    const Tensor W0 = W.clone(), keep = tensor(Vec{0.5, 2, -1}, {3});
    firing_weight_update_(W, keep, Tensor::empty({0, 3}, {.dtype = kFloat64}),
                          Tensor::empty({0, 2}, {.dtype = kFloat64}));
    check_close(W, W0 * keep.view({3, 1}), 0, 0);
    Tensor We = Tensor::empty({0, 0}, {.dtype = kFloat64});
    firing_weight_update_(We, Tensor::empty({0}, {.dtype = kFloat64}), Tensor::empty({kMax, 0}, {.dtype = kFloat64}),
                          Tensor::empty({kMax, 0}, {.dtype = kFloat64}));
    Tensor Wd = Tensor::empty({3, 0}, {.dtype = kFloat64});
    firing_weight_update_(Wd, keep, randn64({4, 3}), Tensor::empty({4, 0}, {.dtype = kFloat64}));
    CHECK(Wd.shape() == Shape{3, 0});
  }
  // ssm_scan: no steps, no rows, no channels, and INT64_MAX rows of no steps; forward and backward.
  for (Shape sh : {Shape{2, 0, 3}, Shape{0, 4, 3}, Shape{2, 4, 0}, Shape{kMax, 0, 1}, Shape{1, kMax, 0}}) {
    CAPTURE(sh);
    for (bool rms : {false, true}) {
      Tensor a = Tensor::empty(sh, {.dtype = kFloat64}).set_requires_grad(true);
      const Tensor u = Tensor::empty(sh, {.dtype = kFloat64});
      Tensor s0 = full({sh[2]}, 0.25, {.dtype = kFloat64}).set_requires_grad(true);
      Tensor s = ssm_scan(a, u, s0, rms);
      CHECK(s.shape() == sh);
      s.backward(Tensor::empty(sh, {.dtype = kFloat64}));
      CHECK(a.grad().shape() == sh);
      CHECK(s0.grad().shape() == Shape{sh[2]});
      if (s0.numel() > 0) CHECK(amax(abs(s0.grad())).item<double>() == 0.0);  // no steps: no gradient
    }
  }
}

TEST_CASE("firing layers: integer options at 0, 1, n, n+1 and INT64_MAX — refused with a clear error or built") {
  using nn::FiringOptions;
  auto build = [](const FiringOptions& o) { return std::make_shared<nn::FiringLinear>(o); };
  // 0 and negative: refused.
  for (int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    check_error([&] { build(FiringOptions(bad, 4)); }, {"FiringLinear", "must be positive"});
    check_error([&] { build(FiringOptions(3, bad)); }, {"FiringLinear", "must be positive"});
    check_error([&] { build(FiringOptions(3, 4).fan_out(bad)); }, {"FiringLinear", "must be positive"});
  }
  check_error([&] { build(FiringOptions(3, 4).ssm_rank(-1)); }, {"FiringLinear", "ssm_rank"});
  // 1, n, n + 1 build; the rank at P (n) builds and at P + 1 is refused.
  for (int64_t v : {1, 4, 5}) {
    CHECK(build(FiringOptions(v, 4))->W.shape() == Shape{4, v});
    CHECK(build(FiringOptions(3, v))->W.shape() == Shape{v, 3});
    CHECK(build(FiringOptions(3, 4).fan_out(v))->f.shape() == Shape{4, v});
  }
  CHECK(build(FiringOptions(3, 4).ssm_rank(1))->ssm->rank == 1);
  CHECK(build(FiringOptions(3, 4).ssm_rank(4))->ssm->rank == 4);
  check_error([&] { build(FiringOptions(3, 4).ssm_rank(5)); }, {"CrossPathSSM", "rank 5 exceeds"});
  // INT64_MAX: a size that cannot exist is refused by the layer with a message naming it, not an overflow.
  check_error([&] { build(FiringOptions(kMax, 4)); }, {"FiringLinear"});
  check_error([&] { build(FiringOptions(3, kMax)); }, {"FiringLinear"});
  check_error([&] { build(FiringOptions(3, 4).fan_out(kMax)); }, {"FiringLinear"});
  check_error([&] { build(FiringOptions(3, 4).ssm_rank(kMax)); }, {"CrossPathSSM"});
  check_error([&] { std::make_shared<nn::FiringEmbedding>(FiringOptions(kMax, 2)); }, {"FiringEmbedding"});
  check_error([&] { std::make_shared<nn::CrossPathSSM>(kMax, kMax); }, {"CrossPathSSM"});
  check_error([&] { std::make_shared<nn::CrossPathSSM>(int64_t{1} << 32, int64_t{1} << 32); }, {"CrossPathSSM"});
  check_error([&] { nn::FiringStack({3, kMax, 2}); }, {"FiringLinear"});
}

// ---- class 5: non-finite options; the accepted-options table, walked ------------------------------------------

TEST_CASE(
    "accepted options, ops: each bound of docs/firing.md's table, each side — refused with a clear error "
    "or accepted") {
  const Tensor Z = randn64({4, 3}), SP = randn64({3}), f = randn64({3, 2});
  // gate.width: finite and > 0.
  for (double w : {0.0, -1.0, kNaN, kInf, -kInf})
    check_error([&] { firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .width = w}); },
                {"firing_output", "width must be positive and finite"});
  for (double w : {1e-300, 1.0, 1e300})
    CHECK(firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .width = w}).Y.defined());
  // gate.mode: the three values only.
  check_error([&] { firing_output(Z, SP, f, {.mode = static_cast<GateBackward>(7)}); },
              {"firing_output", "unknown gate backward mode 7"});
  // gate.surrogate: a registered name.
  check_error([&] { firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .surrogate = ""}); },
              {"firing_output", "unknown surrogate"});
  // firing_rule_b_coef's a: finite.
  {
    NoGradGuard ng;
    const Tensor F = ones({4, 3}, {.dtype = kFloat64});
    for (double a : {kNaN, kInf, -kInf})
      check_error([&] { firing_rule_b_coef(Z, F, a); }, {"firing_rule_b_coef", "finite"});
    for (double a : {0.0, -1e300, 1e300}) CHECK(firing_rule_b_coef(Z, F, a).shape() == Z.shape());
  }
  // ssm_scan's eps: finite and > 0.
  const Tensor a = full({1, 2, 3}, 0.5, {.dtype = kFloat64}), u = randn64({1, 2, 3});
  const Tensor s0 = zeros({3}, {.dtype = kFloat64});
  for (double eps : {0.0, -1e-6, kNaN, kInf, -kInf})
    check_error([&] { ssm_scan(a, u, s0, true, eps); }, {"ssm_scan", "eps must be positive and finite"});
  for (double eps : {1e-300, 1e-6, 1e300}) CHECK(ssm_scan(a, u, s0, true, eps).shape() == a.shape());
}

TEST_CASE(
    "accepted options, layers: threshold, surrogate_width, backward, and the SSM's a_min, a_max, rms_eps — "
    "each bound, each side") {
  using nn::FiringOptions;
  auto build = [](const FiringOptions& o) { return std::make_shared<nn::FiringLinear>(o); };
  // threshold: finite in float32 (SP's dtype at construction).
  for (double t : {kNaN, kInf, -kInf, 1e300, -1e39})
    check_error([&] { build(FiringOptions(3, 4).threshold(t)); }, {"FiringLinear", "threshold must be finite"});
  for (double t : {-3e38, -1.0, 0.0, 3e38})
    CHECK(build(FiringOptions(3, 4).threshold(t))->SP.to_vector<float>()[0] == static_cast<float>(t));
  for (double w : {0.0, -1.0, kNaN, kInf, -kInf})
    check_error([&] { build(FiringOptions(3, 4).surrogate_width(w)); },
                {"FiringLinear", "surrogate_width must be positive and finite"});
  for (double w : {1e-300, 1e300}) CHECK(build(FiringOptions(3, 4).surrogate_width(w))->options.surrogate_width() == w);
  check_error([&] { build(FiringOptions(3, 4).backward(static_cast<GateBackward>(-1))); },
              {"FiringLinear", "unknown backward mode"});
  check_error([&] { build(FiringOptions(3, 4).backward(GateBackward::Surrogate).surrogate("nope")); }, {"nope"});
  // The SSM: 0 <= a_min <= a_max <= 1, rms_eps finite > 0.
  auto ssm = [&](nn::SSMOptions s) { return build(FiringOptions(3, 4).ssm_rank(2).ssm(s)); };
  for (auto [lo, hi] :
       {std::pair{-1e-9, 0.5}, {0.5, 1 + 1e-9}, {0.6, 0.5}, {kNaN, 0.5}, {0.1, kNaN}, {-kInf, 0.5}, {0.1, kInf}})
    check_error([&] { ssm({.a_min = lo, .a_max = hi}); }, {"CrossPathSSM", "a_min <= a_max"});
  for (auto [lo, hi] : {std::pair{0.0, 1.0}, {0.5, 0.5}, {0.0, 0.0}, {1.0, 1.0}})
    CHECK(ssm({.a_min = lo, .a_max = hi})->ssm);
  for (double eps : {0.0, -1.0, kNaN, kInf})
    check_error([&] { ssm({.rms_norm = true, .rms_eps = eps}); }, {"CrossPathSSM", "rms_eps"});
  for (double eps : {1e-300, 1e300}) CHECK(ssm({.rms_norm = true, .rms_eps = eps})->ssm);
}

// ---- class 4: CUDA validates like the CPU ----------------------------------------------------------------------

TEST_CASE("firing ops on CUDA refuse what the CPU refuses, with the same message, before anything runs") {
  if (!gpu_or_skip()) return;
  register_user_surrogates();
  for (Device dev : {Device::cpu(), Device::cuda()}) {
    CAPTURE(dev.is_cuda());
    auto d = [&](const Tensor& t) { return t.to(dev); };
    const Tensor Z = d(randn64({4, 3})), SP = d(randn64({3})), f = d(randn64({3, 2}));
    check_error([&] { firing_output(Z, d(randn64({2})), f); }, {"firing_output", "SP [2]"});
    check_error([&] { firing_output(Z, SP, f, {.mode = GateBackward::Surrogate, .width = kNaN}); }, {"width"});
    check_error([&] { firing_output(Z, SP, f, {.mode = static_cast<GateBackward>(9)}); }, {"unknown gate backward"});
    check_error([&] { firing_output(Z, SP.to(kFloat32), f); }, {"firing_output", "share a dtype"});
    NoGradGuard ng;
    Tensor W = d(randn64({3, 2}));
    check_error(
        [&] {
          firing_weight_update_(W, d(randn64({3})), d(randn64({4, 3})), d(randn64({4, 2})).to(kFloat32));
        },
        {"firing_weight_update_", "share a dtype"});
    check_error(
        [&] {
          firing_weight_update_(W, d(randn64({2})), d(randn64({4, 3})), d(randn64({4, 2})));
        },
        {"firing_weight_update_", "keep [2]"});
    check_error([&] { firing_rule_b_coef(Z, Z, kInf); }, {"firing_rule_b_coef", "finite"});
    check_error([&] { firing_batch_sums(Z, Z.to(kFloat32), SP); }, {"firing_batch_sums", "share a dtype"});
    check_error(
        [&] {
          ssm_scan(d(randn64({1, 2, 3})), d(randn64({1, 2, 3})), d(randn64({3})), true, kNaN);
        },
        {"ssm_scan", "eps"});
  }
  // What only CUDA cannot run is refused by the op too: a user surrogate, more than 1024 state channels.
  const Tensor Z = randn64({4, 3}).to(Device::cuda()), SP = randn64({3}).to(Device::cuda());
  const Tensor f1 = randn64({3, 1}).to(Device::cuda());
  check_error([&] { firing_output(Z, SP, f1, {.mode = GateBackward::Surrogate, .surrogate = "b1_parabola"}); },
              {"firing_output", "no CUDA kernel"});
  const Tensor a = full({1, 2, 1025}, 0.5, {.dtype = kFloat64, .device = Device::cuda()});
  check_error([&] { ssm_scan(a, a, zeros({1025}, {.dtype = kFloat64, .device = Device::cuda()})); },
              {"ssm_scan", "at most 1024"});
}

// ---- class 7: aliasing -----------------------------------------------------------------------------------------

TEST_CASE(
    "firing_weight_update_: keep, coef or X sharing W's memory (W itself, a view, a partial overlap) give the "
    "result of the unaliased call — sparse and dense path, CPU and CUDA") {
  NoGradGuard ng;
  std::vector<Device> devs = {Device::cpu()};
  if (cuda::is_available()) devs.push_back(Device::cuda());
  for (Device dev : devs)
    for (bool sparse : {false, true}) {
      CAPTURE(dev.is_cuda());
      CAPTURE(sparse);
      const int64_t P = 6;
      auto coef_of = [&](uint64_t seed) {
        Tensor c = randn64({P, P}, false, seed);
        if (sparse) c = c * gt(randn64({P, P}, false, seed + 1), 1.0).to(kFloat64);  // mostly zero
        return c.to(dev);
      };
      // `make(buf)` builds (W, keep, coef, X) with some of them views of buf; the same call on copies is the truth.
      using Args = std::array<Tensor, 4>;
      auto check = [&](const char* what, const std::function<Args(Tensor&)>& make) {
        CAPTURE(what);
        Tensor buf = randn64({P + 3, P}, false, 40).to(dev);
        Tensor ref_buf = buf.clone();
        Args al = make(buf), rf = make(ref_buf);
        const Tensor keep = rf[1].clone(), coef = rf[2].clone(), X = rf[3].clone();
        firing_weight_update_(rf[0], keep, coef, X);
        firing_weight_update_(al[0], al[1], al[2], al[3]);
        CHECK(same_bits(al[0].to(Device::cpu()), rf[0].to(Device::cpu())));
      };
      const Tensor kp = (randn64({P}, false, 41) * 0.1 + 1).to(dev), cf = coef_of(42);
      check("X = W", [&](Tensor& b) {
        Tensor W = b.narrow(0, 0, P);
        return Args{W, kp, cf, W};
      });
      const Tensor Xr = randn64({P, P}, false, 43).to(dev);
      check("coef = W", [&](Tensor& b) {
        Tensor W = b.narrow(0, 0, P);
        return Args{W, kp, W, Xr};
      });
      check("keep = a column of W", [&](Tensor& b) {
        Tensor W = b.narrow(0, 0, P);
        return Args{W, W.select(1, 2), cf, Xr};
      });
      check("X overlaps W by 3 rows", [&](Tensor& b) { return Args{b.narrow(0, 0, P), kp, cf, b.narrow(0, 3, P)}; });
      check("X = W transposed", [&](Tensor& b) {
        Tensor W = b.narrow(0, 0, P);
        return Args{W, kp, cf, W.t()};
      });
      check("X next to W, not overlapping", [&](Tensor& b) {
        return Args{b.narrow(0, 3, P), kp, cf.narrow(0, 0, 3), b.narrow(0, 0, 3)};
      });
    }
}

// ---- class 12: determinism across thread counts ----------------------------------------------------------------

TEST_CASE(
    "firing ops with use_deterministic_algorithms: bit-identical results for 1, 2 and 3 threads (forward, "
    "backward of every gate, weight update, rule sums and coefficients, the scan)") {
  register_user_surrogates();
  Deterministic det;
  auto outputs = [&]() {
    std::vector<Tensor> out;
    // Many rows (several row chunks) and few rows (one chunk split over neurons), every gate.
    for (auto [N, P, A] : {std::array<int64_t, 3>{1000, 50, 3}, {40, 300, 2}, {700, 9, 1}})
      for (const GateOptions& gate : every_gate(true)) {
        Tensor Z = randn32({N, P}, 50).set_requires_grad(true), SP = (randn32({P}, 51) * 0.5).set_requires_grad(true);
        Tensor f = randn32({P, A}, 52).set_requires_grad(true);
        FiringOutput o = firing_output(Z, SP, f, gate);
        o.Y.backward(randn32({N, P, A}, 53));
        for (const Tensor& t : {o.Y, o.F, Z.grad(), SP.grad(), f.grad()}) out.push_back(t.detach().clone());
      }
    NoGradGuard ng;
    for (bool sparse : {false, true}) {
      Tensor W = randn32({200, 150}, 60);
      Tensor coef = randn32({300, 200}, 61);
      if (sparse) coef = coef * gt(randn32({300, 200}, 62), 1.2).to(kFloat32);
      firing_weight_update_(W, randn32({200}, 63), coef, randn32({300, 150}, 64));
      out.push_back(W);
    }
    const Tensor Z = randn32({500, 300}, 70), F = gt(Z, 0.3).to(kFloat32), SP = randn32({300}, 71);
    FiringBatchSums s = firing_batch_sums(Z, F, SP);
    out.insert(out.end(), {s.fz2, s.fired, s.margin, firing_rule_b_coef(Z, F, 0.3, randn32({500, 300}, 72), SP)});
    EnableGradGuard g;
    for (bool rms : {false, true}) {
      Tensor a = sigmoid(randn32({16, 64, 32}, 80)).set_requires_grad(true);
      Tensor u = randn32({16, 64, 32}, 81).set_requires_grad(true);
      Tensor s0 = randn32({32}, 82).set_requires_grad(true);
      Tensor st = ssm_scan(a, u, s0, rms);
      st.backward(randn32({16, 64, 32}, 83));
      out.insert(out.end(), {st.detach().clone(), a.grad(), u.grad(), s0.grad()});
    }
    return out;
  };
  std::vector<Tensor> one;
  {
    ThreadCount tc(1);
    one = outputs();
  }
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    ThreadCount tc(threads);
    const std::vector<Tensor> many = outputs();
    REQUIRE(many.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bits(many[i], one[i]));
    }
  }
}
