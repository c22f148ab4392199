// ASCender swarm attention (nn/ascender_attention.h, docs/ascender.md): the reference core against independent
// float64 loops term by term (masks, causal, include_self, both gate positions, per-head k, switched-off terms,
// rows with fewer keys than k), float64 gradcheck with respect to every input and learnable scalar, the gate and
// constant-row decisions, the layer end to end, and bad input.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cuda/cuda.h"
#include "nn/nn.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;
using asc::AscenderBackend;
using nn::AscenderCoreArgs;
using nn::GatePosition;

namespace {

using Vec = std::vector<double>;

Tensor head(const Tensor& t) { return t.view({1, t.numel(), 1, 1}); }  // (H) -> (1, H, 1, 1)

struct Inputs {
  int64_t B = 2, H = 2, T = 7, d = 4, dz = 3, da = 3;
  Tensor q, k_rot, k, v, z, e;  // float64, (B, H, T, ·)
};

Inputs make_inputs(int64_t B, int64_t H, int64_t T, uint64_t seed, bool requires_grad = false, int64_t d = 4,
                   int64_t dl = 3) {
  Inputs in;
  in.B = B, in.H = H, in.T = T, in.d = d, in.dz = dl, in.da = dl;
  in.q = randn64({B, H, T, in.d}, requires_grad, seed);
  in.k_rot = randn64({B, H, T, in.d}, requires_grad, seed + 1);
  in.k = randn64({B, H, T, in.d}, requires_grad, seed + 2);
  in.v = randn64({B, H, T, in.d}, requires_grad, seed + 3);
  in.z = randn64({B, H, T, in.dz}, requires_grad, seed + 4) * 0.7;  // spread comparable to τ = 1
  in.e = randn64({B, H, T, in.da}, requires_grad, seed + 5);
  if (requires_grad) in.z = in.z.detach().set_requires_grad(true);
  return in;
}

AscenderCoreArgs make_args(int64_t H, uint64_t seed) {
  AscenderCoreArgs a;
  a.k = std::vector<int64_t>(H, 3);
  a.tau_sep = std::vector<double>(H, 1.3);
  a.tau_coh = std::vector<double>(H, 0.9);
  a.alpha_align = std::vector<double>(H, 2.0);
  a.alpha_coh = std::vector<double>(H, 1.5);
  Generator g(seed);
  auto pos = [&](double lo, double hi) { return rand({H}, {.dtype = kFloat64}, &g) * (hi - lo) + lo; };
  a.omega_align = pos(0.5, 0.9), a.omega_sep = pos(0.4, 0.8), a.omega_coh = pos(0.3, 0.7);
  a.lambda_align = pos(0.5, 1.5), a.lambda_sep = pos(0.5, 1.5), a.lambda_coh = pos(0.5, 1.5);
  a.delta = pos(0.1, 0.3), a.kappa = pos(1.5, 3.0), a.tau_score = pos(0.7, 1.3);
  a.row_block = 16;  // small tiles: the fused kernel crosses its block boundaries at these short lengths
  return a;
}

// A (2, 1, 1, T) keep-mask of key padding for a batch of 2: batch 1's tokens from `first_pad` on are padding.
Tensor batch1_padding(int64_t T, int64_t first_pad) {
  std::vector<int64_t> valid(2 * T, 1);
  for (int64_t t = first_pad; t < T; ++t) valid[T + t] = 0;
  return tensor(valid, {2, T}).to(kBool).view({2, 1, 1, T});
}

// The same heads / learnable scalars in another dtype (detached).
Inputs as_dtype(Inputs in, DType dt) {
  for (Tensor* t : {&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e}) *t = t->detach().to(dt);
  return in;
}
AscenderCoreArgs as_dtype(AscenderCoreArgs a, DType dt) {
  for (Tensor* t : {&a.omega_align, &a.omega_sep, &a.omega_coh, &a.lambda_align, &a.lambda_sep, &a.lambda_coh, &a.delta,
                    &a.kappa, &a.tau_score})
    *t = t->detach().to(dt);
  return a;
}

// ---- the naive reference: docs/ascender.md §1-6 and §12 in plain loops, one (b, h) at a time -------------------
struct Naive {
  Vec S_base, align, sep, coh, S, A, Y, raw_align, raw_sep, raw_coh, gamma_align, eta, gamma_coh;
  Vec L_coh, L_sep, L_align;  // per (b, h, i); NaN where the row does not count
};

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// (x - μ) / (σ + eps) over the kept entries; 0 on constant rows (σ <= 1e-5 max|x|) and on masked entries.
Vec normalize_row(const Vec& x, const std::vector<bool>& kept, double eps) {
  double n = 0, mu = 0, var = 0, big = 0;
  for (size_t j = 0; j < x.size(); ++j)
    if (kept[j]) n += 1, mu += x[j], big = std::max(big, std::abs(x[j]));
  Vec out(x.size(), 0.0);
  if (n == 0) return out;
  mu /= n;
  for (size_t j = 0; j < x.size(); ++j)
    if (kept[j]) var += (x[j] - mu) * (x[j] - mu) / n;
  const double sd = std::sqrt(var);
  if (sd <= 1e-5 * big) return out;
  for (size_t j = 0; j < x.size(); ++j)
    if (kept[j]) out[j] = (x[j] - mu) / (sd + eps);
  return out;
}

Naive naive(const Inputs& in, const AscenderCoreArgs& p, const Tensor& keep_bhtt /* (B, H, T, T) bool */,
            const Tensor& bias_bhtt /* (B, H, T, T) or undefined */) {
  const int64_t B = in.B, H = in.H, T = in.T, d = in.d, dz = in.dz, da = in.da;
  Vec Q = in.q.to_vector<double>(), KR = in.k_rot.to_vector<double>(), K = in.k.to_vector<double>(),
      V = in.v.to_vector<double>(), Z = in.z.to_vector<double>(), E = in.e.to_vector<double>();
  std::vector<int64_t> keep = keep_bhtt.to(kInt64).to_vector<int64_t>();
  Vec bias = bias_bhtt.defined() ? bias_bhtt.to_vector<double>() : Vec(B * H * T * T, 0.0);
  auto sc = [](const Tensor& t, int64_t h) { return t.to_vector<double>()[h]; };
  const bool after = p.gate_position == GatePosition::AfterNorm;
  Naive o;
  for (auto* v : {&o.S_base, &o.align, &o.sep, &o.coh, &o.S, &o.A, &o.raw_align, &o.raw_sep, &o.raw_coh})
    v->assign(B * H * T * T, 0.0);
  o.Y.assign(B * H * T * d, 0.0);
  for (auto* v : {&o.gamma_align, &o.eta, &o.gamma_coh}) v->assign(B * H * T, 0.0);
  for (auto* v : {&o.L_coh, &o.L_sep, &o.L_align}) v->assign(B * H * T, NAN);
  std::vector<Vec> u_all(B * H * T);                       // u_i per (b, h, i)
  std::vector<std::vector<int64_t>> nbr_all(B * H * T);    // N(i)
  std::vector<Vec> dc_all(B * H * T), phi_all(B * H * T);  // per row

  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      auto row = [&](const Vec& M, int64_t i, int64_t w) {
        return Vec(M.begin() + (bh * T + i) * w, M.begin() + (bh * T + i + 1) * w);
      };
      auto dot = [](const Vec& x, const Vec& y) { return std::inner_product(x.begin(), x.end(), y.begin(), 0.0); };
      auto sqd = [](const Vec& x, const Vec& y) {
        double s = 0;
        for (size_t t = 0; t < x.size(); ++t) s += (x[t] - y[t]) * (x[t] - y[t]);
        return s;
      };
      auto unit = [&](Vec x, double floor) {
        const double nr = std::max(std::sqrt(dot(x, x)), floor);
        for (auto& v : x) v /= nr;
        return x;
      };
      const double lam_a = sc(p.lambda_align, h), lam_s = sc(p.lambda_sep, h), lam_c = sc(p.lambda_coh, h);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t r0 = (bh * T + i) * T;  // row i of the (T, T) score block
        std::vector<bool> kept(T);
        for (int64_t j = 0; j < T; ++j) kept[j] = keep[r0 + j] != 0;
        Vec a(T), w_sep(T), w_coh(T), d2(T);
        for (int64_t j = 0; j < T; ++j) {
          o.S_base[r0 + j] = dot(row(Q, i, d), row(KR, j, d)) / std::sqrt(double(d));
          Vec ei = row(E, i, da), ej = row(E, j, da);
          a[j] = dot(ei, ej) / (std::max(std::sqrt(dot(ei, ei)), 1e-8) * std::max(std::sqrt(dot(ej, ej)), 1e-8));
          d2[j] = sqd(row(Z, i, dz), row(Z, j, dz));
          w_sep[j] = std::exp(-d2[j] / p.tau_sep[h]);
          w_coh[j] = std::exp(-d2[j] / p.tau_coh[h]);
        }
        // N(i): the k_h best kept j (j != i unless include_self) by affinity, ties to the lower index.
        std::vector<int64_t> cand;
        for (int64_t j = 0; j < T; ++j)
          if (kept[j] && (p.include_self || j != i)) cand.push_back(j);
        Vec by(T);  // the selection score: affinity, or (AscenderMode::Reuse) the base score
        for (int64_t j = 0; j < T; ++j) by[j] = p.select_by_scores ? o.S_base[r0 + j] : a[j];
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return by[x] > by[y]; });
        cand.resize(std::min<size_t>(cand.size(), static_cast<size_t>(p.k[h])));
        Vec S(T);
        for (int64_t j = 0; j < T; ++j) S[j] = o.S_base[r0 + j] + bias[r0 + j];
        if (p.use_align) {
          Vec s(d, 0.0);
          for (int64_t l : cand) {
            Vec kl = unit(row(K, l, d), 1e-12);
            for (int64_t t = 0; t < d; ++t) s[t] += kl[t];
          }
          double var = 0;  // the definition: mean squared distance of the neighbours' unit keys to their mean
          if (!cand.empty()) {
            Vec kbar = s;
            for (auto& v : kbar) v /= double(cand.size());
            for (int64_t l : cand) var += sqd(unit(row(K, l, d), 1e-12), kbar) / double(cand.size());
          }  // else 0: the variance of no vectors (SPEC §1.16), so γ = 1/2
          const Vec u = unit(s, 1e-12);
          u_all[bh * T + i] = u;
          nbr_all[bh * T + i] = cand;
          const double gamma = sig(-p.alpha_align[h] * var);
          Vec r(T);
          for (int64_t j = 0; j < T; ++j) r[j] = dot(unit(row(K, j, d), 1e-12), u);
          Vec raw = r;
          if (!after)
            for (auto& x : raw) x *= lam_a * gamma;
          Vec bt = normalize_row(raw, kept, p.norm_eps);
          if (after)
            for (auto& x : bt) x *= lam_a * gamma;
          for (int64_t j = 0; j < T; ++j) o.raw_align[r0 + j] = raw[j], o.align[r0 + j] = bt[j];
          for (int64_t j = 0; j < T; ++j) S[j] += sc(p.omega_align, h) * bt[j];
          o.gamma_align[bh * T + i] = gamma;
        }
        if (p.use_sep) {
          double rho = 0;
          for (int64_t l = 0; l < T; ++l)
            if (kept[l] && l != i) rho += w_sep[l];
          const double eta = std::min(1.0, rho / sc(p.kappa, h));
          Vec raw(T);
          for (int64_t j = 0; j < T; ++j) {
            const double phi = w_sep[j] * std::max(0.0, a[j] - sc(p.delta, h));
            raw[j] = after ? -phi : -lam_s * eta * phi;
            phi_all[bh * T + i].push_back(phi);
          }
          Vec bt = normalize_row(raw, kept, p.norm_eps);
          if (after)
            for (auto& x : bt) x *= lam_s * eta;
          for (int64_t j = 0; j < T; ++j) o.raw_sep[r0 + j] = raw[j], o.sep[r0 + j] = bt[j];
          for (int64_t j = 0; j < T; ++j) S[j] += sc(p.omega_sep, h) * bt[j];
          o.eta[bh * T + i] = eta;
        }
        if (p.use_coh) {
          Vec c(dz, 0.0);
          double ws = 0;
          for (int64_t l = 0; l < T; ++l)
            if (kept[l]) {
              ws += w_coh[l];
              for (int64_t t = 0; t < dz; ++t) c[t] += w_coh[l] * Z[(bh * T + l) * dz + t];
            }
          ws = std::max(ws, 1e-30);
          for (auto& x : c) x /= ws;
          double var = 0;
          for (int64_t l = 0; l < T; ++l)
            if (kept[l]) var += w_coh[l] * sqd(row(Z, l, dz), c) / ws;
          const double gamma = sig(-p.alpha_coh[h] * var);
          Vec raw(T);
          for (int64_t j = 0; j < T; ++j) {
            const double dc = sqd(row(Z, j, dz), c);
            raw[j] = after ? -dc : -lam_c * gamma * dc / p.tau_coh[h];
            dc_all[bh * T + i].push_back(dc);
          }
          Vec bt = normalize_row(raw, kept, p.norm_eps);
          if (after)
            for (auto& x : bt) x *= lam_c * gamma;
          for (int64_t j = 0; j < T; ++j) o.raw_coh[r0 + j] = raw[j], o.coh[r0 + j] = bt[j];
          for (int64_t j = 0; j < T; ++j) S[j] += sc(p.omega_coh, h) * bt[j];
          o.gamma_coh[bh * T + i] = gamma;
        }
        double m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          o.S[r0 + j] = S[j];
          if (kept[j]) m = std::max(m, S[j] / sc(p.tau_score, h));
        }
        if (m == -INFINITY) continue;  // no kept key: A and Y stay 0
        double zsum = 0;
        for (int64_t j = 0; j < T; ++j)
          if (kept[j]) zsum += std::exp(S[j] / sc(p.tau_score, h) - m);
        for (int64_t j = 0; j < T; ++j) {
          const double A = kept[j] ? std::exp(S[j] / sc(p.tau_score, h) - m) / zsum : 0.0;
          o.A[r0 + j] = A;
          for (int64_t t = 0; t < d; ++t) o.Y[(bh * T + i) * d + t] += A * V[(bh * T + j) * d + t];
        }
        // Auxiliary losses of a row that attends to something.
        if (p.use_coh) {
          double l = 0;
          for (int64_t j = 0; j < T; ++j) l += o.A[r0 + j] * dc_all[bh * T + i][j];
          o.L_coh[bh * T + i] = l;
        }
        if (p.use_sep) {
          double l = 0;
          for (int64_t j = 0; j < T; ++j) l += o.A[r0 + j] * phi_all[bh * T + i][j];
          o.L_sep[bh * T + i] = l;
        }
      }
      if (p.use_align)  // needs every row's u first
        for (int64_t i = 0; i < T; ++i) {
          const auto& nb = nbr_all[bh * T + i];
          if (nb.empty()) continue;
          Vec ubar(d, 0.0);
          for (int64_t l : nb)
            for (int64_t t = 0; t < d; ++t) ubar[t] += u_all[bh * T + l][t] / double(nb.size());
          o.L_align[bh * T + i] = 1.0 - dot(u_all[bh * T + i], ubar);
        }
    }
  return o;
}

void check_vec(const Tensor& t, const Vec& ref, double tol, const char* what) {
  INFO(what);
  REQUIRE(t.defined());
  check_close(t, ref, tol, tol);
}

// The reference core against the loops on every output of the decomposition.
void compare(const Inputs& in, const AscenderCoreArgs& p, double tol = 1e-10) {
  nn::AscenderDecomposition dec;
  Tensor y = nn::ascender_attention_reference(in.q, in.k_rot, in.k, in.v, in.z, in.e, p, &dec);
  const Shape sc{in.B, in.H, in.T, in.T};
  Tensor keep = p.keep_mask.defined() ? p.keep_mask.expand(sc).contiguous() : ones(sc).to(kBool);
  Tensor bias = p.bias.defined() ? p.bias.expand(sc).contiguous() : Tensor();
  Naive n = naive(in, p, keep, bias);
  check_vec(dec.S_base, n.S_base, tol, "S_base");
  check_vec(dec.raw_align, n.raw_align, tol, "raw_align");
  check_vec(dec.align, n.align, tol, "align");
  check_vec(dec.raw_sep, n.raw_sep, tol, "raw_sep");
  check_vec(dec.sep, n.sep, tol, "sep");
  check_vec(dec.raw_coh, n.raw_coh, tol, "raw_coh");
  check_vec(dec.coh, n.coh, tol, "coh");
  check_vec(dec.A, n.A, tol, "A");
  check_vec(y, n.Y, tol, "Y");
  if (p.use_align) check_vec(dec.gamma_align, n.gamma_align, tol, "gamma_align");
  if (p.use_sep) check_vec(dec.eta, n.eta, tol, "eta");
  if (p.use_coh) check_vec(dec.gamma_coh, n.gamma_coh, tol, "gamma_coh");
  // The decomposition sums to S on the kept entries, and S is -inf on the others.
  Tensor sum_terms = dec.S_base + head(p.omega_align) * dec.align + head(p.omega_sep) * dec.sep +
                     head(p.omega_coh) * dec.coh + (bias.defined() ? bias : zeros(sc, {.dtype = kFloat64}));
  CHECK(amax(abs(where(keep, sum_terms - dec.S, 0.0))).item<double>() < 1e-12);
  CHECK(sum(logical_and(logical_not(keep), ne(dec.S, -INFINITY)).to(kFloat64)).item<double>() == 0.0);
}

}  // namespace

TEST_CASE("AscenderAttention core: every term equals float64 loops (no mask, padding, causal, both gate positions)") {
  for (GatePosition gp : {GatePosition::BeforeNorm, GatePosition::AfterNorm})
    for (int mask_kind = 0; mask_kind < 3; ++mask_kind) {
      CAPTURE(static_cast<int>(gp));
      CAPTURE(mask_kind);
      Inputs in = make_inputs(2, 2, 7, 10 + mask_kind);
      AscenderCoreArgs p = make_args(2, 3);
      p.gate_position = gp;
      if (mask_kind == 1) {  // padding: batch 1 has its last 3 tokens padded
        Tensor valid = tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 7}).to(kBool);
        p.keep_mask = valid.view({2, 1, 1, 7});
      } else if (mask_kind == 2) {  // causal: row i keeps i + 1 keys, so rows 0..2 have fewer than k + 1
        p.keep_mask = causal_keep_mask(7, 7, Device::cpu()).view({1, 1, 7, 7});
      }
      compare(in, p);
    }
}

TEST_CASE("AscenderAttention core: include_self, per-head k, switched-off terms and an additive bias") {
  Inputs in = make_inputs(1, 3, 9, 40);
  AscenderCoreArgs p = make_args(3, 41);
  p.k = {1, 4, 9};  // 9 > the 8 other keys: the row uses every selectable key
  p.tau_sep = {0.8, 1.3, 2.0};
  p.alpha_coh = {0.0, 1.0, 3.0};
  compare(in, p);
  p.include_self = true;
  compare(in, p);
  p.use_sep = false;
  p.bias = randn64({1, 3, 9, 9}, false, 42);
  compare(in, p);
  p.use_align = false, p.use_coh = false, p.use_sep = true;
  compare(in, p);
}

TEST_CASE("AscenderAttention core: a fully masked row gives zeros and no NaN, forward and backward") {
  Inputs in = make_inputs(2, 1, 5, 50, true);
  AscenderCoreArgs p = make_args(1, 51);
  Tensor valid = tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 0, 0, 0, 0, 0}, {2, 5}).to(kBool);  // batch 1: no keys
  p.keep_mask = valid.view({2, 1, 1, 5});
  Tensor y = nn::ascender_attention_reference(in.q, in.k_rot, in.k, in.v, in.z, in.e, p);
  CHECK(amax(abs(y.select(0, 1))).item<double>() == 0.0);
  y.sum().backward();
  for (const Tensor* t : {&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e}) {
    REQUIRE(t->grad().defined());
    CHECK(sum(isnan(t->grad()).to(kFloat64)).item<double>() == 0.0);
  }
  compare(make_inputs(2, 1, 5, 50), p);
}

TEST_CASE("AscenderAttention core: float64 gradcheck w.r.t. every input and every learnable scalar") {
  for (GatePosition gp : {GatePosition::BeforeNorm, GatePosition::AfterNorm}) {
    CAPTURE(static_cast<int>(gp));
    Inputs in = make_inputs(1, 2, 6, 60, true);
    AscenderCoreArgs p = make_args(2, 61);
    p.gate_position = gp;
    p.keep_mask = causal_keep_mask(6, 6, Device::cpu()).view({1, 1, 6, 6});
    TensorList scalars = {p.omega_align, p.omega_sep, p.omega_coh, p.lambda_align, p.lambda_sep,
                          p.lambda_coh,  p.delta,     p.kappa,     p.tau_score};
    for (Tensor& s : scalars) s.set_requires_grad(true);
    TensorList inputs = {in.q, in.k_rot, in.k, in.v, in.z, in.e};
    inputs.insert(inputs.end(), scalars.begin(), scalars.end());
    check_grad(
        [&](const TensorList& x) {
          AscenderCoreArgs a = p;
          a.omega_align = x[6], a.omega_sep = x[7], a.omega_coh = x[8], a.lambda_align = x[9];
          a.lambda_sep = x[10], a.lambda_coh = x[11], a.delta = x[12], a.kappa = x[13], a.tau_score = x[14];
          return TensorList{nn::ascender_attention_reference(x[0], x[1], x[2], x[3], x[4], x[5], a)};
        },
        inputs);
  }
}

TEST_CASE("AscenderAttention gates (docs §12.2): before_norm cancels λ and α up to ε, after_norm makes them act") {
  Inputs in = make_inputs(1, 1, 8, 70);
  AscenderCoreArgs p = make_args(1, 71);
  auto S_of = [&](const AscenderCoreArgs& a, nn::AscenderDecomposition& dec) {
    nn::ascender_attention_reference(in.q, in.k_rot, in.k, in.v, in.z, in.e, a, &dec);
    return dec.S;
  };
  double change_of[2] = {0, 0};
  for (GatePosition gp : {GatePosition::BeforeNorm, GatePosition::AfterNorm}) {
    p.gate_position = gp;
    AscenderCoreArgs q = p;
    q.lambda_align = p.lambda_align * 3.0, q.lambda_sep = p.lambda_sep * 0.2, q.lambda_coh = p.lambda_coh * 5.0;
    q.alpha_align = {7.0}, q.alpha_coh = {0.1};
    nn::AscenderDecomposition d1, d2;
    const double change = amax(abs(S_of(p, d1) - S_of(q, d2))).item<double>();
    // The raw terms see λ and the gates in both orders...
    CHECK(amax(abs(d1.gamma_align - d2.gamma_align)).item<double>() > 1e-3);
    CHECK(amax(abs(d1.gamma_coh - d2.gamma_coh)).item<double>() > 1e-3);
    if (gp == GatePosition::BeforeNorm) CHECK(amax(abs(d1.raw_sep - d2.raw_sep)).item<double>() > 1e-3);
    change_of[gp == GatePosition::AfterNorm] = change;
  }
  // ... but before_norm's normalisation removes them from S, up to ε / σ (here the smallest λη is ~0.1, so ε/c ~
  // 1e-5 against row spreads ~0.03), while after_norm's S moves by orders of magnitude more.
  CHECK(change_of[0] < 1e-3);
  CHECK(change_of[1] > 1e-2);
  CHECK(change_of[0] < 0.02 * change_of[1]);
}

TEST_CASE("AscenderAttention constant rows (docs §12.3): β̃ = 0 in float32 and float64") {
  // Every z equal and every e equal: w, a and so every raw bias are constant along each row.
  for (DType dt : {kFloat64, kFloat32}) {
    Inputs in = make_inputs(1, 1, 6, 80);
    in.z = ones({1, 1, 6, 3}, {.dtype = kFloat64}) * 0.3;
    in.e = ones({1, 1, 6, 3}, {.dtype = kFloat64});
    for (Tensor* t : {&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e}) *t = t->to(dt);
    AscenderCoreArgs p = make_args(1, 81);
    for (Tensor* t : {&p.omega_align, &p.omega_sep, &p.omega_coh, &p.lambda_align, &p.lambda_sep, &p.lambda_coh,
                      &p.delta, &p.kappa, &p.tau_score})
      *t = t->to(dt);
    p.use_align = false;  // alignment is not constant here (it reads the keys)
    nn::AscenderDecomposition dec;
    nn::ascender_attention_reference(in.q, in.k_rot, in.k, in.v, in.z, in.e, p, &dec);
    CHECK(amax(abs(dec.sep)).item<double>() == 0.0);
    CHECK(amax(abs(dec.coh)).item<double>() == 0.0);
  }
  // The first causal row has one key: its alignment term is constant too.
  Inputs in = make_inputs(1, 1, 5, 82);
  AscenderCoreArgs p = make_args(1, 83);
  p.keep_mask = causal_keep_mask(5, 5, Device::cpu()).view({1, 1, 5, 5});
  nn::AscenderDecomposition dec;
  const Inputs in32 = as_dtype(in, kFloat32);
  nn::ascender_attention_reference(in32.q, in32.k_rot, in32.k, in32.v, in32.z, in32.e, as_dtype(p, kFloat32), &dec);
  CHECK(amax(abs(dec.align.narrow(2, 0, 1))).item<double>() == 0.0);
  CHECK(amax(abs(dec.sep.narrow(2, 0, 1))).item<double>() == 0.0);
}

TEST_CASE("AscenderAttention layer: projections + core + output equal the reference core; blocks and training") {
  manual_seed(3);
  auto opts = nn::AscenderAttentionOptions(16, 2).k({2, 3}).gate_position(GatePosition::AfterNorm).rope(true);
  auto attn = std::make_shared<nn::AscenderAttention>(opts);
  attn->to(kFloat64);
  attn->need_decomposition = true;
  Tensor x = randn64({2, 6, 16}, false, 90);
  Tensor valid = tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6}).to(kBool);
  Tensor y = attn->attend(x, {.key_padding_mask = valid, .causal = true, .need_weights = true});
  CHECK(y.shape() == Shape{2, 6, 16});
  CHECK(attn->attention_weights().shape() == Shape{2, 2, 6, 6});
  CHECK(attn->decomposition().S.shape() == Shape{2, 2, 6, 6});
  // Rows sum to 1 over kept keys.
  CHECK(amax(abs(sum(attn->attention_weights(), {-1}) - 1.0)).item<double>() < 1e-12);
  // In a Transformer block through the factory, and a few training steps lower the loss.
  auto block_opts = nn::TransformerBlockOptions(16, 2).ffn(32);
  auto block = std::make_shared<nn::TransformerEncoderBlock>(block_opts, nn::ascender_attention_factory(opts));
  Tensor target = randn({2, 6, 16});
  Tensor xin = randn({2, 6, 16});
  optim::AdamW opt(block->parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss(block->forward(xin, {.key_padding_mask = valid}), target);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.7 * first);
}

TEST_CASE("AscenderAttention: bad options and inputs are clear errors") {
  check_error([] { nn::AscenderAttention(nn::AscenderAttentionOptions(10, 3)); },
              {"AscenderAttention", "multiple of heads 3"});
  check_error([] { nn::AscenderAttention(nn::AscenderAttentionOptions(8, 2).k({0})); }, {"k must be >= 1"});
  check_error(
      [] {
        nn::AscenderAttention(nn::AscenderAttentionOptions(8, 2).k({1, 2, 3}));
      },
      {"k needs 1 or 2 (heads) values, got 3"});
  check_error([] { nn::AscenderAttention(nn::AscenderAttentionOptions(8, 2).tau_sep({0.0})); },
              {"tau_sep must be > 0"});
  check_error([] { nn::AscenderAttention(nn::AscenderAttentionOptions(8, 2).tau_coh({-1.0})); },
              {"tau_coh must be > 0"});
  check_error([] { nn::AscenderAttention(nn::AscenderAttentionOptions(8, 2).alpha_align({-1.0})); },
              {"alpha_align must be >= 0"});
  nn::AscenderAttention attn(nn::AscenderAttentionOptions(8, 2));
  check_error([&] { attn.attend(randn({2, 5, 6}), {}); }, {"expected x (B, T, 8)"});
  check_error(
      [&] {
        attn.attend(randn({2, 5, 8}), {.key_padding_mask = ones({2, 4}).to(kBool)});
      },
      {"key_padding_mask must be bool (B, S) = (2, 5)"});
  check_error([&] { attn.attend(randn({2, 5, 8}), {.context = randn({2, 3, 8})}); }, {"self-attention only"});
}

TEST_CASE("AscenderAttention auxiliary losses (docs §11) equal float64 loops, with masks") {
  auto mean_of = [](const Vec& v) {
    double s = 0, n = 0;
    for (double x : v)
      if (!std::isnan(x)) s += x, n += 1;
    return s / std::max(n, 1.0);
  };
  for (int mask_kind = 0; mask_kind < 2; ++mask_kind) {
    Inputs in = make_inputs(2, 2, 6, 100 + mask_kind);
    AscenderCoreArgs p = make_args(2, 101);
    p.want_aux = true;
    if (mask_kind == 1) p.keep_mask = causal_keep_mask(6, 6, Device::cpu()).view({1, 1, 6, 6});
    nn::AscenderAux aux;
    nn::ascender_attention_reference(in.q, in.k_rot, in.k, in.v, in.z, in.e, p, nullptr, &aux);
    const Shape sc{2, 2, 6, 6};
    Tensor keep = p.keep_mask.defined() ? p.keep_mask.expand(sc).contiguous() : ones(sc).to(kBool);
    Naive n = naive(in, p, keep, Tensor());
    CHECK(aux.coh.item<double>() == doctest::Approx(mean_of(n.L_coh)).epsilon(1e-12));
    CHECK(aux.sep.item<double>() == doctest::Approx(mean_of(n.L_sep)).epsilon(1e-12));
    CHECK(aux.align.item<double>() == doctest::Approx(mean_of(n.L_align)).epsilon(1e-12));
  }
}

TEST_CASE("AscenderAttention schedule: ω warm-up, separation from its step, aux from its step; the step checkpoints") {
  manual_seed(4);
  auto opts = nn::AscenderAttentionOptions(8, 2).k({2}).warmup_steps(4).sep_start_step(3).aux_coh(0.5).aux_align(0.25);
  auto attn = std::make_shared<nn::AscenderAttention>(opts);
  attn->to(kFloat64);
  attn->need_decomposition = true;
  Tensor x = randn64({1, 5, 8}, false, 110);
  auto base_gap = [&] {  // |S - S_base|: 0 while every ω is scaled by 0
    const nn::AscenderDecomposition& d = attn->decomposition();
    return amax(abs(d.S - d.S_base)).item<double>();
  };
  attn->train();
  attn->attend(x, {});  // step 0: m_ω = 0, no separation, no aux yet (aux starts at warmup_steps = 4)
  CHECK(base_gap() == 0.0);
  CHECK(amax(abs(attn->decomposition().sep)).item<double>() == 0.0);
  CHECK(attn->aux_loss().item<double>() == 0.0);
  CHECK(attn->step() == 1);
  attn->attend(x, {});                                 // step 1: m_ω = 1/4
  CHECK(attn->omega_scale() == doctest::Approx(0.5));  // already the next step's factor
  const nn::AscenderDecomposition& d = attn->decomposition();
  Tensor expect = d.S_base + (head(attn->omega_align).to(kFloat64) * d.align + head(attn->omega_coh) * d.coh) * 0.25;
  CHECK(amax(abs(d.S - expect)).item<double>() < 1e-12);
  attn->set_step(3);
  attn->attend(x, {});  // step 3: separation on
  CHECK(amax(abs(attn->decomposition().sep)).item<double>() > 0.0);
  attn->attend(x, {});  // step 4: aux on
  const nn::AscenderAux& a = attn->aux();
  CHECK(attn->aux_loss().item<double>() ==
        doctest::Approx(0.5 * a.coh.item<double>() + 0.25 * a.align.item<double>()).epsilon(1e-12));
  attn->aux_loss().backward();  // differentiable
  CHECK(attn->z_proj->weight.grad().defined());
  // Evaluation does not advance the schedule; the step is a buffer of the state dict.
  attn->eval();
  attn->attend(x, {});
  CHECK(attn->step() == 5);
  StateDict sd = attn->state_dict();
  REQUIRE(sd.contains("step"));
  auto other = std::make_shared<nn::AscenderAttention>(opts);
  other->to(kFloat64);
  other->load_state_dict(sd);
  CHECK(other->step() == 5);
  check_error([&] { attn->set_step(-1); }, {"step must be >= 0"});
}

TEST_CASE(
    "AscenderAttention modes: windowed restricts every statistic to the window (and equals full when it "
    "covers the sequence); reuse selects neighbours by the base scores") {
  // Windowed = the core with the window's keep-mask: checked against the loops with that mask.
  Tensor win = nn::ascender_window_mask(9, 2, 1, Device::cpu());  // |i - j| < 2, token 0 global
  std::vector<int64_t> expect;
  for (int i = 0; i < 9; ++i)
    for (int j = 0; j < 9; ++j) expect.push_back(std::abs(i - j) < 2 || i < 1 || j < 1);
  CHECK(win.to(kInt64).to_vector<int64_t>() == expect);
  Inputs in = make_inputs(1, 2, 9, 120);
  AscenderCoreArgs p = make_args(2, 121);
  p.keep_mask = win.view({1, 1, 9, 9});
  compare(in, p);
  // The layer: a window covering the sequence gives exactly the full layer.
  manual_seed(7);
  auto full = std::make_shared<nn::AscenderAttention>(nn::AscenderAttentionOptions(8, 2).k({2}));
  auto windowed = std::make_shared<nn::AscenderAttention>(
      nn::AscenderAttentionOptions(8, 2).k({2}).mode(nn::AscenderMode::Windowed).window(6).global_tokens(0));
  windowed->load_state_dict(full->state_dict());
  Tensor x = randn({2, 6, 8});
  CHECK(amax(abs(full->attend(x, {.causal = true}) - windowed->attend(x, {.causal = true}))).item<double>() == 0.0);
  // ... and a narrower window changes it.
  auto narrow = std::make_shared<nn::AscenderAttention>(
      nn::AscenderAttentionOptions(8, 2).k({2}).mode(nn::AscenderMode::Windowed).window(2).global_tokens(1));
  narrow->load_state_dict(full->state_dict());
  CHECK(amax(abs(full->attend(x, {}) - narrow->attend(x, {}))).item<double>() > 1e-4);
  // Reuse: N(i) from the base scores.
  AscenderCoreArgs r = make_args(2, 122);
  r.select_by_scores = true;
  compare(make_inputs(2, 2, 7, 123), r);
  r.keep_mask = causal_keep_mask(7, 7, Device::cpu()).view({1, 1, 7, 7});
  compare(make_inputs(2, 2, 7, 124), r);
}

// ---- the fused CPU kernel against the reference -----------------------------------------------------------------
namespace {

struct BackendScope {
  AscenderBackend prev = ascender_backend();
  explicit BackendScope(AscenderBackend b) { set_ascender_backend(b); }
  ~BackendScope() { set_ascender_backend(prev); }
};

// Moves the tensors of the arguments (scalars, mask, bias) to `dev`.
AscenderCoreArgs args_to(AscenderCoreArgs a, Device dev) {
  for (Tensor* t : {&a.omega_align, &a.omega_sep, &a.omega_coh, &a.lambda_align, &a.lambda_sep, &a.lambda_coh, &a.delta,
                    &a.kappa, &a.tau_score, &a.keep_mask, &a.bias})
    if (t->defined()) *t = t->to(dev);
  return a;
}

// y and the gradients of <w, y> w.r.t. the six head tensors and the nine scalars, on fresh leaves on `dev`;
// returned on the CPU.
TensorList run_core(const Inputs& in, const AscenderCoreArgs& p0, const Tensor& w, AscenderBackend backend,
                    Device dev = Device::cpu()) {
  BackendScope scope(backend);
  const AscenderCoreArgs p = args_to(p0, dev);
  TensorList leaves = {in.q,         in.k_rot,      in.k,        in.v,        in.z,
                       in.e,         p.omega_align, p.omega_sep, p.omega_coh, p.lambda_align,
                       p.lambda_sep, p.lambda_coh,  p.delta,     p.kappa,     p.tau_score};
  for (Tensor& t : leaves) t = t.detach().to(dev).clone().set_requires_grad(true);
  AscenderCoreArgs a = p;
  a.omega_align = leaves[6], a.omega_sep = leaves[7], a.omega_coh = leaves[8], a.lambda_align = leaves[9];
  a.lambda_sep = leaves[10], a.lambda_coh = leaves[11], a.delta = leaves[12], a.kappa = leaves[13];
  a.tau_score = leaves[14];
  if (backend == AscenderBackend::Fused)
    REQUIRE(ascender_choice(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], a) ==
            (dev.is_cuda() ? "fused (CUDA)" : "fused (CPU)"));
  Tensor y = ascender_attention(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], a);
  sum(y * w.to(dev)).backward();
  // bfloat16 / float16 (CUDA only) come back as float32.
  auto back = [](const Tensor& t) {
    return (t.dtype() == kBFloat16 || t.dtype() == kFloat16 ? t.to(kFloat32) : t).to(Device::cpu());
  };
  TensorList out = {back(y.detach())};
  for (const Tensor& t : leaves) {
    if (t.grad().defined()) REQUIRE(t.grad().dtype() == t.dtype());
    out.push_back(back(t.grad().defined() ? t.grad() : zeros_like(t)));
  }
  return out;
}

const char* const kGradNames[] = {
    "y",          "dq",         "dk_rot",        "dk",          "dv",          "dz",     "de",     "domega_align",
    "domega_sep", "domega_coh", "dlambda_align", "dlambda_sep", "dlambda_coh", "ddelta", "dkappa", "dtau_score"};

void compare_fused(const Inputs& in, const AscenderCoreArgs& p, double tol) {
  Tensor w = randn64(in.v.shape(), false, 999).to(in.q.dtype());
  TensorList ref = run_core(in, p, w, AscenderBackend::Reference);
  TensorList fused = run_core(in, p, w, AscenderBackend::Fused);
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO(std::string(kGradNames[i]));
    check_close(fused[i], ref[i], tol, tol);
  }
}

}  // namespace

TEST_CASE("AscenderAttention fused CPU kernel: forward and every gradient equal the reference (float64)") {
  // T = 45 spans three row blocks of the kernel (16 rows each, make_args).
  for (GatePosition gp : {GatePosition::BeforeNorm, GatePosition::AfterNorm})
    for (int mask_kind = 0; mask_kind < 4; ++mask_kind) {
      CAPTURE(static_cast<int>(gp));
      CAPTURE(mask_kind);
      Inputs in = make_inputs(2, 2, 45, 200 + mask_kind);
      AscenderCoreArgs p = make_args(2, 201);
      p.gate_position = gp;
      p.k = {3, 5};
      if (mask_kind == 1) {
        p.keep_mask = batch1_padding(45, 38);
      } else if (mask_kind == 2) {
        p.keep_mask = causal_keep_mask(45, 45, Device::cpu()).view({1, 1, 45, 45});
      } else if (mask_kind == 3) {
        p.keep_mask = ascender_window_mask(45, 6, 2, Device::cpu()).view({1, 1, 45, 45});
      }
      compare_fused(in, p, 1e-9);
      // One temperature for both kernels (the layer's default): the kernel then takes w' from w on kept keys
      p.tau_coh = p.tau_sep;
      compare_fused(in, p, 1e-9);
    }
}

TEST_CASE("AscenderAttention fused CPU kernel: include_self, reuse, switched-off terms, bias, warm-up factor") {
  Inputs in = make_inputs(1, 3, 37, 210);
  AscenderCoreArgs p = make_args(3, 211);
  p.k = {1, 4, 40};
  p.include_self = true;
  compare_fused(in, p, 1e-9);
  p.include_self = false;
  p.select_by_scores = true;
  p.bias = randn64({1, 3, 37, 37}, false, 212);
  p.omega_scale = 0.3;
  compare_fused(in, p, 1e-9);
  p.use_align = false;
  compare_fused(in, p, 1e-9);
  p.use_align = true, p.use_sep = false, p.use_coh = false;
  compare_fused(in, p, 1e-9);
  // Separation without cohesion and cohesion without separation: the kernel's shared pass over d² has a branch each.
  p.use_sep = true;
  compare_fused(in, p, 1e-9);
  p.use_sep = false, p.use_coh = true;
  compare_fused(in, p, 1e-9);
}

TEST_CASE("AscenderAttention fused CPU kernel: neighbourhoods with many tied affinities or scores (lower index wins)") {
  // One-hot ê (3 classes) makes every affinity exactly 0 or 1, so about T/3 keys tie for each row's top k; one-hot q
  // and k_rot do the same to the base scores (select_by_scores). T = 130 puts several chunks of the kernel's top-k
  // bound in a row; the fused kernel must keep the same lowest-index ties as the reference's topk.
  const int64_t T = 130;
  auto one_hot = [&](int64_t width, int64_t classes, uint64_t salt) {
    std::vector<double> x(2 * T * width, 0.0);
    for (int64_t r = 0; r < 2 * T; ++r) x[r * width + (r * 7 + salt * (r / 5)) % classes] = 1.0;
    return tensor(x, {1, 2, T, width});
  };
  Inputs in = make_inputs(1, 2, T, 230);
  in.e = one_hot(in.da, 3, 1);
  AscenderCoreArgs p = make_args(2, 231);
  p.k = {2, 5};
  compare_fused(in, p, 1e-9);
  p.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
  compare_fused(in, p, 1e-9);
  p.select_by_scores = true;
  in.q = one_hot(in.d, in.d, 2), in.k_rot = one_hot(in.d, in.d, 3);
  compare_fused(in, p, 1e-9);
  // The first T rows of a 2T-token head: at most 32 candidates a row, which the kernel ranks all at once instead of
  // inserting them one by one (both with about a third of them tied, larger k than ties and fewer).
  Inputs shorter = make_inputs(1, 2, 30, 232);
  shorter.e = one_hot(in.da, 3, 4).narrow(2, 0, 30).contiguous();
  AscenderCoreArgs q = make_args(2, 233);
  for (std::vector<int64_t> k : {std::vector<int64_t>{3, 12}, {1, 29}}) {
    q.k = k;
    compare_fused(shorter, q, 1e-9);
  }
}

TEST_CASE("AscenderAttention fused CPU kernel: rows with no kept key (zeros, no NaN, forward and backward)") {
  AscenderCoreArgs p = make_args(1, 51);
  Tensor valid = tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 0, 0, 0, 0, 0}, {2, 5}).to(kBool);  // batch 1: no keys
  p.keep_mask = valid.view({2, 1, 1, 5});
  compare_fused(make_inputs(2, 1, 5, 50), p, 1e-9);
}

TEST_CASE("AscenderAttention fused CPU kernel: float64 gradcheck, and float32 close to the float64 reference") {
  Inputs in = make_inputs(1, 2, 35, 220, true);
  AscenderCoreArgs p = make_args(2, 221);
  p.gate_position = GatePosition::AfterNorm;
  p.keep_mask = causal_keep_mask(35, 35, Device::cpu()).view({1, 1, 35, 35});
  TensorList scalars = {p.omega_align, p.omega_sep, p.omega_coh, p.lambda_align, p.lambda_sep,
                        p.lambda_coh,  p.delta,     p.kappa,     p.tau_score};
  for (Tensor& s : scalars) s.set_requires_grad(true);
  TensorList inputs = {in.q, in.k_rot, in.k, in.v, in.z, in.e};
  inputs.insert(inputs.end(), scalars.begin(), scalars.end());
  BackendScope fused(AscenderBackend::Fused);
  check_grad(
      [&](const TensorList& x) {
        AscenderCoreArgs a = p;
        a.omega_align = x[6], a.omega_sep = x[7], a.omega_coh = x[8], a.lambda_align = x[9];
        a.lambda_sep = x[10], a.lambda_coh = x[11], a.delta = x[12], a.kappa = x[13], a.tau_score = x[14];
        return TensorList{ascender_attention(x[0], x[1], x[2], x[3], x[4], x[5], a)};
      },
      inputs);
  // float32 inputs through the kernel against the float64 reference on the same (rounded) values.
  const Inputs in32 = as_dtype(in, kFloat32);
  const AscenderCoreArgs p32 = as_dtype(p, kFloat32);
  Tensor y32 = ascender_attention(in32.q, in32.k_rot, in32.k, in32.v, in32.z, in32.e, p32);
  BackendScope ref(AscenderBackend::Reference);
  const Inputs in64 = as_dtype(in32, kFloat64);  // the same rounded values, in float64
  Tensor y64 = ascender_attention(in64.q, in64.k_rot, in64.k, in64.v, in64.z, in64.e, as_dtype(p32, kFloat64));
  check_close(y32, y64, 2e-4, 2e-3);
}

TEST_CASE("AscenderAttention fused CPU kernel, windowed: only the window's key columns, equal to the reference") {
  // T = 100 with w = 5: every block of 16 rows past the global ones gathers at most 16 + 8 + g key columns, so the
  // kernel's gathered path (and its scatter of key gradients) runs; rows < g and blocks holding them see every key.
  for (int64_t g : {0, 2})
    for (int mask_kind = 0; mask_kind < 3; ++mask_kind) {
      CAPTURE(g);
      CAPTURE(mask_kind);
      Inputs in = make_inputs(2, 2, 100, 240 + mask_kind);
      AscenderCoreArgs p = make_args(2, 241);
      p.k = {2, 6};
      p.window = 5, p.global_tokens = g;
      p.gate_position = mask_kind == 1 ? GatePosition::AfterNorm : GatePosition::BeforeNorm;
      p.include_self = mask_kind == 2;
      p.select_by_scores = mask_kind == 2;
      if (mask_kind == 1) {
        p.keep_mask = batch1_padding(100, 90);
      } else if (mask_kind == 2) {
        p.keep_mask = causal_keep_mask(100, 100, Device::cpu()).view({1, 1, 100, 100});
        p.bias = randn64({1, 2, 100, 100}, false, 242);
      }
      compare_fused(in, p, 1e-9);
      // The window given as an explicit (T, T) keep-mask is the same computation (the reference builds exactly that).
      AscenderCoreArgs as_mask = p;
      as_mask.window = 0, as_mask.global_tokens = 0;
      Tensor win = ascender_window_mask(100, 5, g, Device::cpu()).view({1, 1, 100, 100});
      as_mask.keep_mask = p.keep_mask.defined() ? logical_and(p.keep_mask, win) : win;
      Tensor w = randn64(in.v.shape(), false, 243);
      check_close(run_core(in, as_mask, w, AscenderBackend::Fused)[0], run_core(in, p, w, AscenderBackend::Fused)[0],
                  1e-12, 1e-12);
    }
  // The kernel's default tiles (64 rows) over three blocks, full and windowed.
  Inputs in150 = make_inputs(1, 1, 150, 260);
  AscenderCoreArgs p150 = make_args(1, 261);
  p150.row_block = 0;
  compare_fused(in150, p150, 1e-9);
  p150.window = 20, p150.global_tokens = 3;
  compare_fused(in150, p150, 1e-9);
  // float64 gradcheck through gathered blocks (g = 0: every block gathers).
  Inputs in = make_inputs(1, 1, 40, 250, true);
  AscenderCoreArgs p = make_args(1, 251);
  p.window = 3, p.global_tokens = 0;
  p.gate_position = GatePosition::AfterNorm;
  BackendScope fused(AscenderBackend::Fused);
  check_grad([&](const TensorList& x) { return TensorList{ascender_attention(x[0], x[1], x[2], x[3], x[4], x[5], p)}; },
             {in.q, in.k_rot, in.k, in.v, in.z, in.e});
  AscenderCoreArgs bad = p;
  bad.window = -1;
  check_error([&] { ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, bad); },
              {"ascender_attention", "window -1 and global_tokens 0 must be >= 0"});
  bad = p;
  bad.k = {0};
  check_error([&] { ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, bad); },
              {"ascender_attention", "head 0 needs k >= 1", "got k 0"});
  bad = p;
  bad.tau_coh = {-0.5};
  check_error([&] { ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, bad); }, {"tau_coh -0.5"});
}

TEST_CASE("AscenderAttention fused CPU kernel: when it runs, and why not") {
  Inputs in = make_inputs(1, 2, 6, 230);
  AscenderCoreArgs p = make_args(2, 231);
  CHECK(ascender_choice(in.q, in.k_rot, in.k, in.v, in.z, in.e, p) == "fused (CPU)");
  CHECK(ascender_choice(in.q, in.k_rot, in.k, in.v, in.z, in.e, p, true) ==
        "reference: the decomposition was requested");
  AscenderCoreArgs q = p;
  q.want_aux = true;
  CHECK(ascender_choice(in.q, in.k_rot, in.k, in.v, in.z, in.e, q) == "reference: the auxiliary losses were requested");
  q = p;
  q.dropout = 0.1, q.training = true;
  CHECK(ascender_choice(in.q, in.k_rot, in.k, in.v, in.z, in.e, q) == "reference: attention dropout");
  {
    BackendScope r(AscenderBackend::Reference);
    CHECK(ascender_choice(in.q, in.k_rot, in.k, in.v, in.z, in.e, p) == "reference: the Reference backend is selected");
  }
  BackendScope f(AscenderBackend::Fused);
  nn::AscenderDecomposition dec;
  check_error([&] { ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, p, &dec); },
              {"the Fused backend cannot run", "decomposition"});
  AscenderCoreArgs bad = p;
  bad.k = {3};
  check_error([&] { ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, bad); }, {"k has 1 values for 2 heads"});
}

TEST_CASE(
    "AscenderAttention fused CUDA kernels: forward and every gradient equal the CPU kernel (float64, float32, "
    "bfloat16, float16; short and long rows)") {
  if (!cuda::is_available()) {
    MESSAGE("no CUDA device: skipped (the emulator build runs it)");
    return;
  }
  const Device gpu = Device::cuda();
  for (DType dt : {kFloat64, kFloat32})
    for (int kind = 0; kind < 7; ++kind) {
      CAPTURE(dtype_name(dt));
      CAPTURE(kind);
      const int64_t T = 40;
      Inputs in64 = make_inputs(2, 2, T, 300 + kind);
      if (kind == 6) {  // one-hot ê: affinities exactly 0 or 1, about T/3 keys tie for each top k (lower index wins)
        std::vector<double> e(2 * 2 * T * in64.da, 0.0);
        for (int64_t r = 0; r < 2 * 2 * T; ++r) e[r * in64.da + (r * 7 + r / 5) % 3] = 1.0;
        in64.e = tensor(e, {2, 2, T, in64.da});
      }
      Inputs in = as_dtype(in64, dt);
      AscenderCoreArgs p = make_args(2, 301);
      p.k = {3, 6};
      if (kind == 1) {  // after_norm, padding (batch 1 keeps 33 keys)
        p.gate_position = GatePosition::AfterNorm;
        p.keep_mask = batch1_padding(T, 33);
      } else if (kind == 2) {  // causal, bias, include_self
        p.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
        p.bias = randn64({1, 2, T, T}, false, 302);
        p.include_self = true;
      } else if (kind == 3) {  // window and global tokens, neighbourhoods from the base scores
        p.window = 5, p.global_tokens = 2, p.select_by_scores = true;
      } else if (kind == 4) {  // a term off, warm-up factor
        p.use_sep = false, p.omega_scale = 0.4;
      } else if (kind == 5) {  // after_norm with the other terms off; fully masked rows of batch 1
        p.gate_position = GatePosition::AfterNorm;
        p.use_align = false, p.use_coh = false;
        std::vector<int64_t> keep(2 * T * T, 1);
        for (int64_t x = (T + 30) * T; x < 2 * T * T; ++x) keep[x] = 0;  // batch 1, rows 30..39
        p.keep_mask = tensor(keep, {2, 1, T, T}).to(kBool);
      }
      p = as_dtype(p, dt);
      if (p.bias.defined()) p.bias = p.bias.to(dt);
      const double tol = dt == kFloat64 ? 1e-9 : 3e-4;
      // Inference (no gradient): the forward kernel alone.
      {
        NoGradGuard ng;
        BackendScope fused(AscenderBackend::Fused);
        Tensor y_cpu = ascender_attention(in.q, in.k_rot, in.k, in.v, in.z, in.e, p);
        AscenderCoreArgs pg = args_to(p, gpu);
        Inputs ig = in;
        for (Tensor* t : {&ig.q, &ig.k_rot, &ig.k, &ig.v, &ig.z, &ig.e}) *t = t->to(gpu);
        CHECK(ascender_choice(ig.q, ig.k_rot, ig.k, ig.v, ig.z, ig.e, pg) == "fused (CUDA)");
        check_close(ascender_attention(ig.q, ig.k_rot, ig.k, ig.v, ig.z, ig.e, pg).to(Device::cpu()), y_cpu,
                    dt == kFloat64 ? 1e-10 : 2e-4, dt == kFloat64 ? 1e-10 : 2e-4);
      }
      // Training: forward and backward kernels against the CPU kernel's y and 15 gradients.
      Tensor w = randn64(in.v.shape(), false, 999).to(dt);
      TensorList cpu_out = run_core(in, p, w, AscenderBackend::Fused);
      TensorList gpu_out = run_core(in, p, w, AscenderBackend::Fused, gpu);
      for (size_t i = 0; i < cpu_out.size(); ++i) {
        INFO(std::string(kGradNames[i]));
        check_close(gpu_out[i], cpu_out[i], tol, tol);
      }
    }
  // bfloat16 / float16 heads, computed in float32: against the CPU kernel in float32 on the same rounded values (the
  // CPU stores no 16-bit floats, so the rounding happens on the device).
  for (DType dt : {kBFloat16, kFloat16})
    for (int kind = 0; kind < 2; ++kind) {
      CAPTURE(dtype_name(dt));
      CAPTURE(kind);
      const int64_t T = 24;
      auto half = [&](const Tensor& t) { return t.to(gpu).to(dt); };
      auto rounded = [&](const Tensor& t) { return half(t).to(kFloat32).to(Device::cpu()); };
      Inputs in = make_inputs(2, 2, T, 340 + kind);
      for (Tensor* t : {&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e}) *t = rounded(*t);
      AscenderCoreArgs p = make_args(2, 341);
      for (Tensor* t : {&p.omega_align, &p.omega_sep, &p.omega_coh, &p.lambda_align, &p.lambda_sep, &p.lambda_coh,
                        &p.delta, &p.kappa, &p.tau_score})
        *t = rounded(*t);
      p.k = {3, 4};
      if (kind == 1) {
        p.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
        p.bias = rounded(randn64({1, 2, T, T}, false, 342));
        p.gate_position = GatePosition::AfterNorm;
      }
      Tensor w = rounded(randn64(in.v.shape(), false, 997));
      TensorList cpu_out = run_core(in, p, w, AscenderBackend::Fused);
      Inputs in16 = in;
      for (Tensor* t : {&in16.q, &in16.k_rot, &in16.k, &in16.v, &in16.z, &in16.e}) *t = half(*t);
      AscenderCoreArgs p16 = args_to(p, gpu);
      for (Tensor* t : {&p16.omega_align, &p16.omega_sep, &p16.omega_coh, &p16.lambda_align, &p16.lambda_sep,
                        &p16.lambda_coh, &p16.delta, &p16.kappa, &p16.tau_score, &p16.bias})
        if (t->defined()) *t = half(*t);
      TensorList gpu_out = run_core(in16, p16, half(w), AscenderBackend::Fused, gpu);
      const double tol = dt == kBFloat16 ? 1e-2 : 2e-3;
      for (size_t i = 0; i < cpu_out.size(); ++i) {
        INFO(std::string(kGradNames[i]));
        check_close(gpu_out[i], cpu_out[i], tol, tol);
      }
    }
  // Rows longer than shared memory holds (float64: 640 keys forward, 320 backward): the row's arrays in a global
  // workspace; a budget of 1 MiB leaves 9 rows per head in flight, so each block visits about 78 rows in turn.
  struct EnvScope {
    EnvScope() { setenv("ASC_ASCENDER_SCRATCH_MB", "1", 1); }
    ~EnvScope() { unsetenv("ASC_ASCENDER_SCRATCH_MB"); }
  } env;
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    const int64_t T = 700;
    Inputs in = make_inputs(1, 2, T, 320 + kind);
    AscenderCoreArgs p = make_args(2, 321);
    p.k = {4, 9};
    if (kind == 0)
      p.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
    else
      p.window = 40, p.global_tokens = 3, p.gate_position = GatePosition::AfterNorm;
    Tensor w = randn64(in.v.shape(), false, 998);
    TensorList cpu_out = run_core(in, p, w, AscenderBackend::Fused);
    TensorList gpu_out = run_core(in, p, w, AscenderBackend::Fused, gpu);
    for (size_t i = 0; i < cpu_out.size(); ++i) {
      INFO(std::string(kGradNames[i]));
      check_close(gpu_out[i], cpu_out[i], 1e-9, 1e-9);
    }
  }
  setenv("ASC_ASCENDER_SCRATCH_MB", "lots", 1);
  check_error(
      [&] {
        run_core(make_inputs(1, 1, 700, 330), make_args(1, 331), randn64({1, 1, 700, 4}, false, 332),
                 AscenderBackend::Fused, gpu);
      },
      {"ASC_ASCENDER_SCRATCH_MB must be a positive number of MiB, got 'lots'"});
}

TEST_CASE(
    "AscenderAttention on CUDA tensor cores (cuda/ascender_mma.cu; bfloat16, float16, float32 as TF32): forward and "
    "every gradient against the CPU kernel on the same rounded inputs, across row blocks, key tiles and windows") {
  if (!cuda::is_available()) {
    MESSAGE("no CUDA device: skipped (the emulator build runs it)");
    return;
  }
  const Device gpu = Device::cuda();
  // T = 100: two blocks of 64 query rows, four tiles of 32 keys. One-hot ê: the affinities are exactly 0 or 1 in any
  // operand precision, so rounding cannot move a key across a neighbourhood's boundary, and the ties (about T/3 keys
  // each) go to the lower index on both sides. By the base scores (Reuse) only where the products are exact
  // (16-bit inputs).
  const int64_t T = 100;
  for (DType dt : {kBFloat16, kFloat16, kFloat32})
    for (int kind = 0; kind < 7; ++kind) {
      CAPTURE(dtype_name(dt));
      CAPTURE(kind);
      const Tf32Scope tf32(dt == kFloat32);
      auto dev = [&](const Tensor& t) { return t.to(gpu).to(dt); };
      auto rounded = [&](const Tensor& t) { return dev(t).to(kFloat32).to(Device::cpu()); };
      // Widths of whole 16-byte pieces (d 16, d_z = d_a 8), which the tiles are copied in (cuda/async_copy.cuh);
      // kinds 1 and 5 the narrow widths, copied element by element.
      const bool wide = kind != 1 && kind != 5;
      Inputs in = make_inputs(2, 2, T, 360 + kind, false, wide ? 16 : 4, wide ? 8 : 3);
      std::vector<double> e(2 * 2 * T * in.da, 0.0);
      for (int64_t r = 0; r < 2 * 2 * T; ++r) e[r * in.da + (r * 7 + r / 5) % 3] = 1.0;
      in.e = tensor(e, {2, 2, T, in.da});
      for (Tensor* t : {&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e}) *t = rounded(*t);
      AscenderCoreArgs p = make_args(2, 361);
      for (Tensor* t : {&p.omega_align, &p.omega_sep, &p.omega_coh, &p.lambda_align, &p.lambda_sep, &p.lambda_coh,
                        &p.delta, &p.kappa, &p.tau_score})
        *t = rounded(*t);
      p.k = {3, 6};
      if (kind == 1) {  // after_norm, padding (batch 1 keeps 83 keys)
        p.gate_position = GatePosition::AfterNorm;
        p.keep_mask = batch1_padding(T, 83);
      } else if (kind == 2) {  // causal, bias, include_self
        p.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
        p.bias = rounded(randn64({1, 2, T, T}, false, 362));
        p.include_self = true;
      } else if (kind == 3) {  // a window and global tokens: blocks visit their band's tiles and the globals' only
        p.window = 9, p.global_tokens = 3, p.select_by_scores = dt != kFloat32;
      } else if (kind == 4) {  // a term off, warm-up factor
        p.use_sep = false, p.omega_scale = 0.4;
      } else if (kind == 5) {  // after_norm with the other terms off; fully masked rows of batch 1
        p.gate_position = GatePosition::AfterNorm;
        p.use_align = false, p.use_coh = false;
        std::vector<int64_t> keep(2 * T * T, 1);
        for (int64_t x = (T + 70) * T; x < 2 * T * T; ++x) keep[x] = 0;  // batch 1, rows 70..99
        p.keep_mask = tensor(keep, {2, 1, T, T}).to(kBool);
      } else if (kind == 6) {  // a NaN in one row's query: NaN where the CPU kernel has NaN, numbers elsewhere
        std::vector<double> q = in.q.to_vector<double>();
        q[(T + 37) * in.d + 1] = std::nan("");  // batch 0, head 1, row 37
        in.q = tensor(q, in.q.shape()).to(kFloat32);
      }
      Tensor w = rounded(randn64(in.v.shape(), false, 363));
      TensorList cpu_out = run_core(in, p, w, AscenderBackend::Fused);
      Inputs ind = in;
      for (Tensor* t : {&ind.q, &ind.k_rot, &ind.k, &ind.v, &ind.z, &ind.e}) *t = dev(*t);
      AscenderCoreArgs pd = args_to(p, gpu);
      for (Tensor* t : {&pd.omega_align, &pd.omega_sep, &pd.omega_coh, &pd.lambda_align, &pd.lambda_sep, &pd.lambda_coh,
                        &pd.delta, &pd.kappa, &pd.tau_score, &pd.bias})
        if (t->defined()) *t = dev(*t);
      TensorList gpu_out = run_core(ind, pd, dev(w), AscenderBackend::Fused, gpu);
      // bfloat16 keeps 8 significant bits, float16 and TF32 11; the probabilities enter A V rounded as the operands,
      // and the backward's products take dS, dr, dφ, ... rounded the same way (as FlashAttention-2's dS), after S
      // and P recomputed from rounded operands. 1.5 times that for the sums over many rows: the learnable scalars'
      // gradients (every row of the batch, with cancellation), and dk — with one-hot ê under a causal mask the first
      // keys are in nearly every row's N(i) (ties go to the lower index), so their dk̂ sums about T rows' ds_i.
      // A scalar's gradient can be a small remainder of its sum: then its error scales with the largest of the
      // heads' values, not with its own (with d 16, head 1's dω_align is 0.065 beside head 0's -11.9, and moves
      // between 0.025 and 0.090 in float64 when k changes by 0.2 %).
      const double tol = dt == kBFloat16 ? 2e-2 : 5e-3;
      for (size_t i = 0; i < cpu_out.size(); ++i) {
        INFO(std::string(kGradNames[i]));
        const double t = i == 3 || i >= 7 ? 1.5 * tol : tol;  // dk, the scalars (kGradNames)
        const double scale = i >= 7 ? std::max(1.0, max(abs(cpu_out[i])).item<double>()) : 1.0;
        check_close(gpu_out[i], cpu_out[i], t, t * scale);
      }
    }
}

TEST_CASE(
    "AscenderAttention in deterministic mode on CUDA: the reference runs instead of the row kernels' atomicAdd "
    "backward, and its gradients repeat bit for bit and equal the CPU's; the tensor-core backward runs, and repeats") {
  if (!cuda::is_available()) {
    MESSAGE("no CUDA device: skipped (the emulator build runs it)");
    return;
  }
  struct Reset {
    ~Reset() { use_deterministic_algorithms(false); }
  } reset;
  const Device gpu = Device::cuda();
  Inputs in = make_inputs(1, 2, 12, 500);
  AscenderCoreArgs p = make_args(2, 501);
  p.k = {3, 4};
  use_deterministic_algorithms(true);
  {
    const AscenderCoreArgs pg = args_to(p, gpu);
    Tensor q = in.q.to(gpu).set_requires_grad(true);
    CHECK(ascender_choice(q, in.k_rot.to(gpu), in.k.to(gpu), in.v.to(gpu), in.z.to(gpu), in.e.to(gpu), pg) ==
          "reference: deterministic mode: the CUDA row kernel's backward accumulates with atomicAdd (the tensor-core "
          "kernels', for bfloat16, float16 and float32 as TF32, does not)");
    NoGradGuard ng;  // no gradient wanted: the fused kernel (its forward has no atomics) still runs
    CHECK(ascender_choice(q, in.k_rot.to(gpu), in.k.to(gpu), in.v.to(gpu), in.z.to(gpu), in.e.to(gpu), pg) ==
          "fused (CUDA)");
  }
  Tensor w = randn64(in.v.shape(), false, 502);
  const TensorList a = run_core(in, p, w, AscenderBackend::Auto, gpu);
  const TensorList b = run_core(in, p, w, AscenderBackend::Auto, gpu);
  {
    BackendScope scope(AscenderBackend::Fused);
    const AscenderCoreArgs pg = args_to(p, gpu);
    Tensor q = in.q.to(gpu).set_requires_grad(true);
    CHECK_THROWS_WITH_AS(
        ascender_attention(q, in.k_rot.to(gpu), in.k.to(gpu), in.v.to(gpu), in.z.to(gpu), in.e.to(gpu), pg),
        doctest::Contains("deterministic mode"), Error);
  }
  // bfloat16: the tensor-core kernels, whose backward writes every gradient once — the fused path in deterministic
  // mode too, bit for bit the same from run to run (T = 70: two row blocks, three key blocks, a window).
  {
    Inputs ib = make_inputs(2, 2, 70, 510);
    AscenderCoreArgs pb = make_args(2, 511);
    pb.k = {3, 5};
    pb.window = 20, pb.global_tokens = 2;
    auto bf = [&](const Tensor& t) { return t.to(gpu).to(kBFloat16); };
    for (Tensor* t : {&ib.q, &ib.k_rot, &ib.k, &ib.v, &ib.z, &ib.e}) *t = bf(*t);
    AscenderCoreArgs pbg = args_to(pb, gpu);
    for (Tensor* t : {&pbg.omega_align, &pbg.omega_sep, &pbg.omega_coh, &pbg.lambda_align, &pbg.lambda_sep,
                      &pbg.lambda_coh, &pbg.delta, &pbg.kappa, &pbg.tau_score})
      *t = bf(*t);
    Tensor q = ib.q.detach().set_requires_grad(true);
    CHECK(ascender_choice(q, ib.k_rot, ib.k, ib.v, ib.z, ib.e, pbg) == "fused (CUDA)");
    const Tensor wb = bf(randn64(ib.v.shape(), false, 512));
    const TensorList x = run_core(ib, pbg, wb, AscenderBackend::Fused, gpu);
    const TensorList y = run_core(ib, pbg, wb, AscenderBackend::Fused, gpu);
    for (size_t i = 0; i < x.size(); ++i) {
      CAPTURE(kGradNames[i]);
      CHECK(x[i].to(kFloat32).to_vector<float>() == y[i].to(kFloat32).to_vector<float>());
    }
  }
  use_deterministic_algorithms(false);
  const TensorList cpu = run_core(in, p, w, AscenderBackend::Reference);
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(kGradNames[i]);
    CHECK(a[i].to_vector<double>() == b[i].to_vector<double>());
    const auto x = a[i].to_vector<double>(), y = cpu[i].to_vector<double>();
    for (size_t j = 0; j < x.size(); ++j) CHECK(x[j] == doctest::Approx(y[j]).epsilon(1e-9));
  }
}
