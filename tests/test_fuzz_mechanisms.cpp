// A fuzzer of the mechanism ops: ASCender's fused attention core and the firing perceptron's ops, called with random
// shapes and with options drawn from their edges (0, 1, n, n + 1, INT64_MAX, negative, NaN, ±Inf), random masks of
// the wrong dtype or shape, and NaN planted in the inputs. Every call must either throw asc::Error or return what an
// independent computation gives:
//   - ascender_attention (the fused kernel where it takes the inputs) against ascender_attention_reference, the core
//     composed from framework ops, in float64: both refuse the same arguments (the reference validates like the op),
//     or both return the same values with NaN in the same places (a NaN token must not hide inside the kernels);
//   - firing_output against F f Z in plain loops (a NaN Z outputs NaN, a silent neuron exactly 0), and its exact /
//     straight-through backward against the formulas of ops/firing.h;
//   - firing_weight_update_ against the update computed on copies taken before the call (an aliased argument gives
//     the non-aliased result or an error), and a refused call leaves W bit-identical;
//   - firing_batch_sums and firing_rule_b_coef against float64 loops.
// Anything else (another exception type, a wrong value, a sanitizer report) fails with the seed and step:
//
//   ASC_FUZZ_SEED=1234 ASC_FUZZ_SECONDS=5 build/asan/tests/test_fuzz_mechanisms
//   ASC_FUZZ_SEED=1234 ASC_FUZZ_FIRST_STEP=42 ASC_FUZZ_SECONDS=0.001 build/asan/tests/test_fuzz_mechanisms   # one step
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>

#include <fmt/ranges.h>

#include "testing.h"

using namespace asc;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

// |a - b| <= tol (1 + |b|) elementwise, with NaN exactly where the expected value has NaN and infinities equal.
bool same_values(const std::vector<double>& a, const std::vector<double>& b, double tol, std::string* why) {
  if (a.size() != b.size()) return *why = fmt::format("{} values, expected {}", a.size(), b.size()), false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = std::isnan(b[i])   ? std::isnan(a[i])
                    : std::isinf(b[i]) ? a[i] == b[i]
                                       : std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i]));
    if (!ok) return *why = fmt::format("element {}: {} where {} was expected", i, a[i], b[i]), false;
  }
  return true;
}

struct Fuzzer {
  std::mt19937_64 rng;
  const char* last = "";
  std::map<std::string, std::pair<int64_t, int64_t>> by_family;  // checked, refused

  explicit Fuzzer(uint64_t seed) : rng(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng); }
  template <class T>
  T pick(const std::vector<T>& xs) {
    return xs[static_cast<size_t>(uniform(0, static_cast<int64_t>(xs.size()) - 1))];
  }
  // An integer option: mostly `usual`, else one of the edges around n.
  int64_t int_option(int64_t usual, int64_t n) {
    return chance(0.6) ? usual : pick<int64_t>({0, 1, n - 1, n, n + 1, kMax, -1, std::numeric_limits<int64_t>::min()});
  }
  // A real option: mostly `usual`, else an edge.
  double real_option(double usual) {
    return chance(0.75) ? usual : pick<double>({0.0, -1.0, 1e-300, 1e300, kNaN, kInf, -kInf});
  }
  Tensor randn_t(const Shape& s) { return randn(s, {.dtype = kFloat64}); }
  // Occasionally plants a NaN (or an infinity) in t.
  void maybe_poison(Tensor& t, double p = 0.1) {
    if (t.numel() == 0 || !chance(p)) return;
    std::vector<double> v = t.to_vector<double>();
    v[static_cast<size_t>(uniform(0, t.numel() - 1))] = chance(0.8) ? kNaN : pick<double>({kInf, -kInf});
    t = tensor(v, t.shape());
  }
  void checked() { ++by_family[last].first; }
  void refused() { ++by_family[last].second; }

  void step() {
    switch (uniform(0, 3)) {
      case 0: return ascender();
      case 1: return firing_output_op();
      case 2: return weight_update();
      default: return rule_b_passes();
    }
  }

  // ---- ASCender: the op against the composed reference --------------------------------------------------------
  void ascender() {
    last = "ascender_attention";
    const int64_t B = uniform(1, 2), H = uniform(1, 2), T = pick<int64_t>({1, 2, 3, 5, 9}), d = uniform(1, 4);
    const int64_t dz = uniform(1, 3), da = uniform(1, 3);
    Tensor q = randn_t({B, H, T, d}), kr = randn_t({B, H, T, d}), k = randn_t({B, H, T, d}), v = randn_t({B, H, T, d});
    Tensor z = randn_t({B, H, T, dz}), e = randn_t({B, H, T, da});
    for (Tensor* t : {&q, &kr, &k, &v, &z, &e}) maybe_poison(*t, 0.05);
    AscenderCoreArgs a;
    for (int64_t h = 0; h < H; ++h) {
      a.k.push_back(int_option(uniform(1, 3), T));
      a.tau_sep.push_back(real_option(real(0.5, 2)));
      a.tau_coh.push_back(real_option(real(0.5, 2)));
      a.alpha_align.push_back(real_option(real(0, 3)));
      a.alpha_coh.push_back(real_option(real(0, 3)));
    }
    auto scalar = [&](double lo, double hi) {
      Tensor s = rand({H}, {.dtype = kFloat64}) * (hi - lo) + lo;
      maybe_poison(s, 0.03);
      return s;
    };
    a.omega_align = scalar(0.3, 0.9), a.omega_sep = scalar(0.3, 0.9), a.omega_coh = scalar(0.3, 0.9);
    a.lambda_align = scalar(0.5, 1.5), a.lambda_sep = scalar(0.5, 1.5), a.lambda_coh = scalar(0.5, 1.5);
    a.delta = scalar(0.1, 0.3), a.kappa = scalar(0.01, 3.0), a.tau_score = scalar(0.7, 1.3);
    a.include_self = chance(0.3);
    a.select_by_scores = chance(0.3);
    a.gate_position = chance(0.5) ? GatePosition::BeforeNorm : GatePosition::AfterNorm;
    a.use_align = chance(0.8), a.use_sep = chance(0.8), a.use_coh = chance(0.8);
    a.norm_eps = real_option(1e-6);
    a.omega_scale = real_option(1.0);
    if (chance(0.3)) {
      a.window = int_option(uniform(1, T), T);
      a.global_tokens = int_option(uniform(0, 1), T);
    }
    a.row_block = int_option(pick<int64_t>({0, 1, 2, 16}), T);
    if (chance(0.4)) {
      const Shape ms = pick<Shape>({{B, 1, 1, T}, {B, H, T, T}, {1, 1, T, T}, {B, T}, {T + 1, T}});
      Tensor m = gt(rand(ms), 0.25);
      if (chance(0.2)) m = m.to(kFloat32);  // a float mask: refused on every backend
      a.keep_mask = m;
    }
    if (chance(0.2)) a.bias = randn_t({1, H, T, T});

    // The arguments, named when a check fails.
    std::string nan_in;
    bool inf_in = false, spread_in = false;  // an infinity anywhere; a NaN in v, or in z with cohesion
    for (const auto& [name, t] : {std::pair{"q", &q}, {"k_rot", &kr}, {"k", &k}, {"v", &v}, {"z", &z}, {"e", &e}})
      for (double x : t->to_vector<double>())
        if (!std::isfinite(x)) {
          nan_in += std::string(name) + (std::isnan(x) ? "(NaN) " : "(inf) ");
          inf_in = inf_in || std::isinf(x);
          spread_in = spread_in || (std::isnan(x) && (t == &v || (t == &z && a.use_coh)));
          break;
        }
    INFO(
        fmt::format("B {} H {} T {} d {} d_z {} d_a {}; k {} tau_sep {} tau_coh {} alpha_align {} alpha_coh {}; "
                    "include_self {} select_by_scores {} after_norm {} align/sep/coh {}{}{} norm_eps {} omega_scale {} "
                    "window {} global {} row_block {} keep_mask {} bias {}; non-finite in: {}",
                    B, H, T, d, dz, da, a.k, a.tau_sep, a.tau_coh, a.alpha_align, a.alpha_coh, a.include_self,
                    a.select_by_scores, a.gate_position == GatePosition::AfterNorm, a.use_align, a.use_sep, a.use_coh,
                    a.norm_eps, a.omega_scale, a.window, a.global_tokens, a.row_block,
                    a.keep_mask.defined() ? fmt::format("{} {}", a.keep_mask.shape(), a.keep_mask.dtype()) : "none",
                    a.bias.defined(), nan_in));
    bool ref_ok = true, op_ok = true;
    std::string ref_error, op_error;
    Tensor y_ref, y_op;
    try {
      y_ref = ascender_attention_reference(q, kr, k, v, z, e, a);
    } catch (const Error& err) {
      ref_ok = false, ref_error = err.what();
    }
    try {
      y_op = ascender_attention(q, kr, k, v, z, e, a);
    } catch (const Error& err) {
      op_ok = false, op_error = err.what();
    }
    if (!ref_ok && !op_ok) return refused();
    INFO("op: " << (op_ok ? "returned" : op_error) << "; reference: " << (ref_ok ? "returned" : ref_error));
    REQUIRE_MESSAGE(ref_ok == op_ok, "the op and its reference disagree on whether the arguments are valid");
    std::string why;
    std::vector<double> got = y_op.to_vector<double>(), want = y_ref.to_vector<double>();
    // Where docs §13 leaves the NaN pattern to IEEE arithmetic, a NaN on one side only is not a disagreement: an
    // infinity in the inputs (no contract: inf - inf in the softmax's max subtraction, inf · 0 in the products, come
    // in a different order in the fused kernel and the composed reference), and a NaN in v_j, or in z_j with
    // cohesion, that the products A V and Σ_l w'_il z_l may carry into rows that do not attend to j (the exact NaN
    // rows are checked input by input in test_hardening_ascender). Finite values must still agree.
    if (inf_in || spread_in)
      for (size_t i = 0; i < got.size() && i < want.size(); ++i)
        if (std::isnan(got[i]) != std::isnan(want[i])) got[i] = want[i] = kNaN;
    REQUIRE_MESSAGE(same_values(got, want, 1e-8, &why), "ascender_attention vs the reference: " << why);
    checked();
  }

  // ---- firing_output: F f Z, NaN visible, silent neurons exactly 0 ---------------------------------------------
  void firing_output_op() {
    last = "firing_output";
    const int64_t N = pick<int64_t>({0, 1, 3, 40}), P = pick<int64_t>({1, 3, 70}), A = uniform(1, 3);
    Tensor Z = randn_t({N, P}), SP = randn_t({P}) * 0.5, f = randn_t({P, A});
    maybe_poison(Z, 0.3);
    GateOptions g;
    g.mode = pick<GateBackward>({GateBackward::None, GateBackward::StraightThrough, GateBackward::Surrogate});
    g.surrogate = chance(0.9) ? pick<std::string>({"sigmoid", "atan", "rectangular", "triangular"}) : "bogus";
    g.width = real_option(1.0);
    if (chance(0.1)) SP = randn_t({P + 1});  // a wrong shape
    const bool grad = g.mode != GateBackward::Surrogate && chance(0.5);
    if (grad) Z.set_requires_grad(true), f.set_requires_grad(true), SP.set_requires_grad(true);
    FiringOutput o;
    try {
      o = firing_output(Z, SP, f, g);
    } catch (const Error&) {
      return refused();
    }
    const std::vector<double> z = Z.to_vector<double>(), sp = SP.to_vector<double>(), fv = f.to_vector<double>();
    std::vector<double> want(static_cast<size_t>(N * P * A));
    for (int64_t b = 0; b < N; ++b)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = 0; c < A; ++c) {
          const double zz = z[b * P + p];
          want[(b * P + p) * A + c] = std::isnan(zz) ? kNaN : zz >= sp[p] ? fv[p * A + c] * zz : 0.0;
        }
    std::string why;
    REQUIRE_MESSAGE(same_values(o.Y.to_vector<double>(), want, 1e-15, &why), "firing_output Y: " << why);
    // Backward of a random dY, exact or straight-through gate, against ops/firing.h's formulas on finite inputs.
    bool finite = true;
    for (double x : z) finite = finite && std::isfinite(x);
    if (grad && finite && N > 0) {
      Tensor dY = randn_t({N, P, A});
      o.Y.backward(dY);
      const std::vector<double> dy = dY.to_vector<double>();
      std::vector<double> dz(static_cast<size_t>(N * P)), df(static_cast<size_t>(P * A), 0.0), dsp(P, 0.0);
      const double st = g.mode == GateBackward::StraightThrough ? 1.0 : 0.0;
      for (int64_t b = 0; b < N; ++b)
        for (int64_t p = 0; p < P; ++p) {
          const double zz = z[b * P + p], F = zz >= sp[p] ? 1.0 : 0.0;
          double S = 0;
          for (int64_t c = 0; c < A; ++c) {
            S += dy[(b * P + p) * A + c] * fv[p * A + c];
            df[p * A + c] += dy[(b * P + p) * A + c] * F * zz;
          }
          dz[b * P + p] = S * (F + zz * st);
          dsp[p] -= S * zz * st;
        }
      REQUIRE_MESSAGE(same_values(Z.grad().to_vector<double>(), dz, 1e-12, &why), "firing_output dZ: " << why);
      REQUIRE_MESSAGE(same_values(f.grad().to_vector<double>(), df, 1e-12, &why), "firing_output df: " << why);
      if (SP.grad().defined())
        REQUIRE_MESSAGE(same_values(SP.grad().to_vector<double>(), dsp, 1e-12, &why), "firing_output dSP: " << why);
    }
    checked();
  }

  // ---- firing_weight_update_: W <- keep W + coef^T X, aliasing included ----------------------------------------
  void weight_update() {
    last = "firing_weight_update_";
    const int64_t P = pick<int64_t>({1, 4, 9, 20}), d = pick<int64_t>({1, 4, 9, 20}), N = pick<int64_t>({0, 1, 4, 20});
    Tensor W = randn_t({P, d}), keep = rand({P}, {.dtype = kFloat64}), X = randn_t({N, d});
    Tensor coef = randn_t({N, P}) * gt(rand({N, P}, {.dtype = kFloat64}), pick<double>({0.0, 0.7, 0.95})).to(kFloat64);
    maybe_poison(X, 0.1);
    // Aliasing: an argument that is W itself or a view of it, where the shapes allow.
    const int64_t alias = uniform(0, 5);
    if (alias == 1 && N == P) X = W;
    if (alias == 2 && N == P && P == d) coef = W;
    if (alias == 3 && d == P) keep = W.select(0, 0);
    if (alias == 4 && N <= P) X = W.narrow(0, P - N, N);
    if (chance(0.05)) keep = keep.to(kFloat32);  // a dtype mismatch
    const std::vector<double> w0 = W.to_vector<double>(), k0 = keep.to_vector<double>(), x0 = X.to_vector<double>(),
                              c0 = coef.to_vector<double>();
    const std::vector<double> before = w0;
    try {
      NoGradGuard no_grad;
      firing_weight_update_(W, keep, coef, X);
    } catch (const Error&) {
      std::string why;
      REQUIRE_MESSAGE(same_values(W.to_vector<double>(), before, 0.0, &why), "a refused update wrote W: " << why);
      return refused();
    }
    // A zero coefficient meeting a non-finite X adds 0 on the sparse path and NaN on the dense one (0 · NaN in a
    // GEMM), as ops/firing.h says; rule B never forms that pair (a NaN input makes Z, hence the coefficient, NaN).
    // Elsewhere the result is unique.
    std::vector<double> skip(w0.size()), ieee(w0.size());
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < d; ++j) {
        double s = k0[p] * w0[p * d + j], t = s;
        for (int64_t b = 0; b < N; ++b) {
          if (c0[b * P + p] != 0) s += c0[b * P + p] * x0[b * d + j];
          t += c0[b * P + p] * x0[b * d + j];
        }
        skip[p * d + j] = s, ieee[p * d + j] = t;
      }
    const std::vector<double> got = W.to_vector<double>();
    std::string why_skip, why_ieee;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool ok =
          same_values({got[i]}, {skip[i]}, 1e-12, &why_skip) || same_values({got[i]}, {ieee[i]}, 1e-12, &why_ieee);
      REQUIRE_MESSAGE(ok, "firing_weight_update_ (alias case " << alias << "), element " << i << ": " << got[i]
                                                               << " where " << skip[i] << " was expected");
    }
    checked();
  }

  // ---- rule B's fused passes against float64 loops --------------------------------------------------------------
  void rule_b_passes() {
    last = "firing_batch_sums / firing_rule_b_coef";
    const int64_t N = pick<int64_t>({0, 1, 5, 70}), P = pick<int64_t>({1, 3, 65});
    Tensor Z = randn_t({N, P}), SP = randn_t({P}) * 0.3;
    maybe_poison(Z, 0.2);
    Tensor F = ge(Z, SP).to(kFloat64);
    Tensor dZ = randn_t({N, P}), c = rand({P}, {.dtype = kFloat64});
    const double a = real_option(0.01);
    FiringBatchSums s;
    Tensor coef;
    try {
      s = firing_batch_sums(Z, F, SP);
      coef = chance(0.5) ? firing_rule_b_coef(Z, F, a, dZ, c) : firing_rule_b_coef(Z, F, a);
    } catch (const Error&) {
      return refused();
    }
    const std::vector<double> z = Z.to_vector<double>(), fv = F.to_vector<double>(), sp = SP.to_vector<double>();
    std::vector<double> fz2(P, 0.0), fired(P, 0.0), margin(P, 0.0);
    for (int64_t b = 0; b < N; ++b)
      for (int64_t p = 0; p < P; ++p) {
        const double zz = z[b * P + p], ff = fv[b * P + p];
        if (ff == 0) continue;  // a silent neuron adds nothing, whatever its Z (documented in ops/firing.h)
        fz2[p] += ff * zz * zz, fired[p] += ff, margin[p] += ff * std::max(0.0, zz - sp[p]);
      }
    std::string why;
    REQUIRE_MESSAGE(same_values(s.fz2.to_vector<double>(), fz2, 1e-12, &why), "firing_batch_sums fz2: " << why);
    REQUIRE_MESSAGE(same_values(s.fired.to_vector<double>(), fired, 0.0, &why), "firing_batch_sums fired: " << why);
    REQUIRE_MESSAGE(same_values(s.margin.to_vector<double>(), margin, 1e-12, &why),
                    "firing_batch_sums margin: " << why);
    REQUIRE(coef.shape() == Shape{N, P});
    checked();
  }
};

}  // namespace

TEST_CASE("fuzz: the mechanism ops either throw asc::Error or agree with an independent computation") {
  const uint64_t seed = static_cast<uint64_t>(env_or("ASC_FUZZ_SEED", 20261125));
  const double seconds = env_or("ASC_FUZZ_SECONDS", 2.0);
  Fuzzer f(seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t steps = static_cast<int64_t>(env_or("ASC_FUZZ_FIRST_STEP", 0));  // to replay one failing step
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    f.rng.seed(seed * 1000003 + static_cast<uint64_t>(steps));
    manual_seed(seed + static_cast<uint64_t>(steps));
    try {
      f.step();
    } catch (...) {
      MESSAGE("reproduce with ASC_FUZZ_SEED=" << seed << " ASC_FUZZ_FIRST_STEP=" << steps << " (a '"
                                              << std::string(f.last) << "' step)");
      throw;
    }
    ++steps;
  }
  MESSAGE("fuzz: seed " << seed << ", " << steps << " steps in " << seconds << " s");
  for (const auto& [family, counts] : f.by_family) {
    MESSAGE(family << ": " << counts.first << " checked, " << counts.second << " refused");
    CHECK(counts.first > 0);  // every family produced results, not only refusals
  }
}
