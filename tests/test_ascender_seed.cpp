// The ASCender seed pseudocode (docs/ascender.md §1-6, with its decisions) written as one
// single-head function using ONLY framework ops: matmul, the geometry ops (topk, pairwise_sqdist,
// cosine_similarity_matrix, normalize_rows, row_standardize), elementwise ops, sum and views. It is checked
//   (1) forward, term by term, against an independent naive implementation in plain double loops, and
//   (2) by float64 gradcheck of Y w.r.t. X, W_Q, W_K, W_V, U and P.
// This test is the proof that the op set suffices to write ASCender.
//
// Choices where the seeds leave room (and the naive reference follows them): phi_ij includes j == i, as in the
// seed's formula and the 001 PyTorch reference; rho_i excludes l == i (docs/ascender.md §4); the cohesion centroid and
// its variance sum over every l including i (docs/ascender.md §5); softmax is composed as exp(T - c) / sum exp(T - c)
// with c a detached per-row maximum (from topk with k = 1), since the softmax op belongs to another group.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

struct AscParams {
  int64_t k = 2;
  double tau_sep = 1.0, tau_coh = 1.5;
  double lambda_align = 1.0, lambda_sep = 1.0, lambda_coh = 1.0;
  double omega_a = 0.7, omega_s = 0.5, omega_c = 0.6;  // larger than the 0.1 default so each term shows in Y
  double alpha_align = 2.0, alpha_coh = 1.5;
  double delta = 0.2, kappa = 2.0, tau_score = 0.8;
  double norm_eps = 1e-6;
};

struct AscOut {
  Tensor S_base, b_align, b_sep, b_coh, S, A, Y;
};

// ---- the head, from framework ops ---------------------------------------------------------------------------
AscOut ascender_head(const Tensor& X, const Tensor& WQ, const Tensor& WK, const Tensor& WV, const Tensor& U,
                     const Tensor& P, const AscParams& p) {
  const int64_t n = X.size(0), d = WQ.size(1);
  Tensor Q = matmul(X, WQ), K = matmul(X, WK), V = matmul(X, WV);
  Tensor Z = matmul(X, U);  // latent coordinates
  Tensor H = matmul(X, P);  // semantic projection for the affinity

  // (1) base scores
  Tensor S_base = div(matmul(Q, K.t()), std::sqrt(static_cast<double>(d)));

  // (2) neighbourhoods and kernels
  Tensor a = cosine_similarity_matrix(H, H);
  Tensor nb = topk(a, p.k, {.exclude_diagonal = true}).indices;  // (n, k), not differentiable
  // 0/1 neighbour matrix M[i, j] = 1 iff j in N_k(i): compare the indices with arange(n) and sum over the k slots.
  Tensor M = sum(eq(nb.unsqueeze(-1), arange(n).reshape({1, 1, n})), {1}).to(X.dtype());  // (n, n)
  Tensor d2 = pairwise_sqdist(Z, Z);
  Tensor w_sep = exp(div(neg(d2), p.tau_sep));
  Tensor w_coh = exp(div(neg(d2), p.tau_coh));

  // (3) alignment
  Tensor k_hat = normalize_rows(K);                     // (n, d)
  Tensor k_sum = matmul(M, k_hat);                      // sum over the neighbours, (n, d)
  Tensor k_bar = div(k_sum, static_cast<double>(p.k));  // mean unit key of the neighbours
  Tensor u = normalize_rows(k_sum);
  Tensor r_align = matmul(u, k_hat.t());                             // r[i, j] = k_hat[j] . u[i]
  Tensor var_align = rsub(1.0, sum(mul(k_bar, k_bar), {-1}, true));  // (n, 1): 1 - ||k_bar||^2
  Tensor gate_align = sigmoid(mul(var_align, -p.alpha_align));
  Tensor b_align = mul(mul(gate_align, r_align), p.lambda_align);

  // (4) separation
  Tensor off_diag = rsub(1.0, eye(n, {.dtype = X.dtype()}));
  Tensor rho = sum(mul(w_sep, off_diag), {-1}, true);  // (n, 1), l != i
  Tensor eta = minimum(div(rho, p.kappa), ones_like(rho));
  Tensor phi = mul(w_sep, relu(sub(a, p.delta)));
  Tensor b_sep = mul(mul(eta, phi), -p.lambda_sep);

  // (5) cohesion
  Tensor w_row = sum(w_coh, {-1}, true);    // (n, 1)
  Tensor C = div(matmul(w_coh, Z), w_row);  // weighted centroids c_i, (n, d_z)
  Tensor dc = pairwise_sqdist(C, Z);        // dc[i, j] = ||z_j - c_i||^2
  Tensor var_coh = div(sum(mul(w_coh, dc), {-1}, true), w_row);
  Tensor gate_coh = sigmoid(mul(var_coh, -p.alpha_coh));
  Tensor b_coh = mul(mul(gate_coh, neg(dc)), p.lambda_coh / p.tau_coh);

  // (6) normalise, combine, softmax (composed), values
  Tensor ba = row_standardize(b_align, {}, p.norm_eps);
  Tensor bs = row_standardize(b_sep, {}, p.norm_eps);
  Tensor bc = row_standardize(b_coh, {}, p.norm_eps);
  Tensor S = add(add(add(S_base, mul(ba, p.omega_a)), mul(bs, p.omega_s)), mul(bc, p.omega_c));
  Tensor T = div(S, p.tau_score);
  Tensor c = topk(T.detach(), 1).values;  // detached row max: softmax is shift-invariant
  Tensor E = exp(sub(T, c));
  Tensor A = div(E, sum(E, {-1}, true));
  Tensor Y = matmul(A, V);
  return {S_base, ba, bs, bc, S, A, Y};
}

// ---- the naive reference ------------------------------------------------------------------------------------
using Vec = std::vector<double>;

struct NaiveOut {
  Vec S_base, b_align, b_sep, b_coh, S, A, Y;
  Vec a, rho;                               // for the margin checks
  std::vector<std::vector<int64_t>> nbr;    // neighbour lists
  std::vector<std::vector<int64_t>> order;  // every j != i sorted by affinity
};

Vec naive_mm(const Vec& A, const Vec& B, int64_t n, int64_t p, int64_t m) {
  Vec C(n * m, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t t = 0; t < p; ++t) C[i * m + j] += A[i * p + t] * B[t * m + j];
  return C;
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Vec standardize_rows(const Vec& b, int64_t n, double eps) {
  Vec out(n * n);
  for (int64_t i = 0; i < n; ++i) {
    double mu = 0, v = 0;
    for (int64_t j = 0; j < n; ++j) mu += b[i * n + j] / n;
    for (int64_t j = 0; j < n; ++j) v += (b[i * n + j] - mu) * (b[i * n + j] - mu) / n;
    for (int64_t j = 0; j < n; ++j) out[i * n + j] = (b[i * n + j] - mu) / (std::sqrt(v) + eps);
  }
  return out;
}

NaiveOut naive_head(const Vec& X, const Vec& WQ, const Vec& WK, const Vec& WV, const Vec& U, const Vec& P, int64_t n,
                    int64_t dm, int64_t d, int64_t dz, int64_t da, const AscParams& p) {
  NaiveOut o;
  Vec Q = naive_mm(X, WQ, n, dm, d), K = naive_mm(X, WK, n, dm, d), V = naive_mm(X, WV, n, dm, d);
  Vec Z = naive_mm(X, U, n, dm, dz), H = naive_mm(X, P, n, dm, da);
  auto row = [](const Vec& M, int64_t i, int64_t w) { return Vec(M.begin() + i * w, M.begin() + (i + 1) * w); };
  auto dot = [](const Vec& x, const Vec& y) { return std::inner_product(x.begin(), x.end(), y.begin(), 0.0); };
  auto sq = [&](const Vec& x, const Vec& y) {
    double s = 0;
    for (size_t t = 0; t < x.size(); ++t) s += (x[t] - y[t]) * (x[t] - y[t]);
    return s;
  };

  o.S_base.assign(n * n, 0);
  o.a.assign(n * n, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      o.S_base[i * n + j] = dot(row(Q, i, d), row(K, j, d)) / std::sqrt(double(d));
      Vec hi = row(H, i, da), hj = row(H, j, da);
      o.a[i * n + j] = dot(hi, hj) / (std::max(std::sqrt(dot(hi, hi)), 1e-8) * std::max(std::sqrt(dot(hj, hj)), 1e-8));
    }
  // neighbourhoods: top-k of a over j != i, ties by the lower index
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> js;
    for (int64_t j = 0; j < n; ++j)
      if (j != i) js.push_back(j);
    std::stable_sort(js.begin(), js.end(), [&](int64_t x, int64_t y) { return o.a[i * n + x] > o.a[i * n + y]; });
    o.order.push_back(js);
    o.nbr.emplace_back(js.begin(), js.begin() + p.k);
  }
  // alignment
  std::vector<Vec> khat(n);
  for (int64_t j = 0; j < n; ++j) {
    Vec kj = row(K, j, d);
    double nr = std::max(std::sqrt(dot(kj, kj)), 1e-12);
    for (auto& v : kj) v /= nr;
    khat[j] = kj;
  }
  Vec b_align(n * n);
  for (int64_t i = 0; i < n; ++i) {
    Vec s(d, 0.0);
    for (int64_t l : o.nbr[i])
      for (int64_t t = 0; t < d; ++t) s[t] += khat[l][t];
    Vec kbar = s;
    for (auto& v : kbar) v /= double(p.k);
    double var = 0;  // the definition: (1/k) sum_l ||k_hat_l - k_bar||^2
    for (int64_t l : o.nbr[i]) var += sq(khat[l], kbar) / double(p.k);
    double ns = std::max(std::sqrt(dot(s, s)), 1e-12);
    Vec ui = s;
    for (auto& v : ui) v /= ns;
    double gate = sig(-p.alpha_align * var);
    for (int64_t j = 0; j < n; ++j) b_align[i * n + j] = p.lambda_align * gate * dot(khat[j], ui);
  }
  // separation
  Vec b_sep(n * n);
  o.rho.assign(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t l = 0; l < n; ++l)
      if (l != i) o.rho[i] += std::exp(-sq(row(Z, i, dz), row(Z, l, dz)) / p.tau_sep);
    double eta = std::min(1.0, o.rho[i] / p.kappa);
    for (int64_t j = 0; j < n; ++j) {
      double w = std::exp(-sq(row(Z, i, dz), row(Z, j, dz)) / p.tau_sep);
      b_sep[i * n + j] = -p.lambda_sep * eta * w * std::max(0.0, o.a[i * n + j] - p.delta);
    }
  }
  // cohesion
  Vec b_coh(n * n);
  for (int64_t i = 0; i < n; ++i) {
    Vec c(dz, 0.0);
    double wsum = 0;
    for (int64_t l = 0; l < n; ++l) {
      double w = std::exp(-sq(row(Z, i, dz), row(Z, l, dz)) / p.tau_coh);
      wsum += w;
      for (int64_t t = 0; t < dz; ++t) c[t] += w * Z[l * dz + t];
    }
    for (auto& v : c) v /= wsum;
    double var = 0;
    for (int64_t l = 0; l < n; ++l)
      var += std::exp(-sq(row(Z, i, dz), row(Z, l, dz)) / p.tau_coh) * sq(row(Z, l, dz), c) / wsum;
    double gate = sig(-p.alpha_coh * var);
    for (int64_t j = 0; j < n; ++j) b_coh[i * n + j] = p.lambda_coh * gate * (-sq(row(Z, j, dz), c)) / p.tau_coh;
  }
  o.b_align = standardize_rows(b_align, n, p.norm_eps);
  o.b_sep = standardize_rows(b_sep, n, p.norm_eps);
  o.b_coh = standardize_rows(b_coh, n, p.norm_eps);
  o.S.resize(n * n);
  o.A.resize(n * n);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < n; ++j) {
      o.S[i * n + j] = o.S_base[i * n + j] + p.omega_a * o.b_align[i * n + j] + p.omega_s * o.b_sep[i * n + j] +
                       p.omega_c * o.b_coh[i * n + j];
      mx = std::max(mx, o.S[i * n + j] / p.tau_score);
    }
    for (int64_t j = 0; j < n; ++j) z += std::exp(o.S[i * n + j] / p.tau_score - mx);
    for (int64_t j = 0; j < n; ++j) o.A[i * n + j] = std::exp(o.S[i * n + j] / p.tau_score - mx) / z;
  }
  o.Y = naive_mm(o.A, V, n, n, d);
  return o;
}

constexpr int64_t n = 5, dm = 4, d = 3, dz = 2, da = 3;

struct Inputs {
  Tensor X, WQ, WK, WV, U, P;
  TensorList list() const { return {X, WQ, WK, WV, U, P}; }
};

Inputs make_inputs(uint64_t seed) {
  return {randn64({n, dm}, true, seed),
          mul(randn64({dm, d}, false, seed + 1), 0.6).set_requires_grad(true),
          mul(randn64({dm, d}, false, seed + 2), 0.6).set_requires_grad(true),
          mul(randn64({dm, d}, false, seed + 3), 0.6).set_requires_grad(true),
          mul(randn64({dm, dz}, false, seed + 4), 0.5).set_requires_grad(true),
          mul(randn64({dm, da}, false, seed + 5), 0.6).set_requires_grad(true)};
}

NaiveOut naive_of(const Inputs& in, const AscParams& p) {
  auto v = [](const Tensor& t) { return t.to_vector<double>(); };
  return naive_head(v(in.X), v(in.WQ), v(in.WK), v(in.WV), v(in.U), v(in.P), n, dm, d, dz, da, p);
}

// kappa halfway across the widest gap between consecutive sorted rho values: some rows have eta clipped at 1,
// some not, none near the kink. Chosen from the naive rho (not from the code under test).
double pick_kappa(const Vec& rho) {
  Vec r = rho;
  std::sort(r.begin(), r.end());
  size_t best = 0;
  for (size_t i = 1; i + 1 < r.size(); ++i)
    if (r[i + 1] - r[i] > r[best + 1] - r[best]) best = i;
  return 0.5 * (r[best] + r[best + 1]);
}

// The inputs must keep every discrete choice away from its switching point, so finite differences see one branch.
void require_margins(const NaiveOut& o, const AscParams& p) {
  for (int64_t i = 0; i < n; ++i) {
    const auto& js = o.order[i];
    REQUIRE(o.a[i * n + js[p.k - 1]] - o.a[i * n + js[p.k]] > 1e-3);                     // no top-k tie at the boundary
    for (int64_t j = 0; j < n; ++j) REQUIRE(std::abs(o.a[i * n + j] - p.delta) > 1e-3);  // relu(a - delta) kink
    REQUIRE(std::abs(o.rho[i] / p.kappa - 1.0) > 1e-3);                                  // min(1, rho/kappa) kink
  }
}

}  // namespace

TEST_CASE("ASCender seed head: forward matches an independent naive implementation, term by term") {
  for (uint64_t seed : {100, 200, 300}) {
    CAPTURE(seed);
    Inputs in = make_inputs(seed);
    AscParams p;
    p.kappa = pick_kappa(naive_of(in, p).rho);
    NaiveOut ref = naive_of(in, p);
    require_margins(ref, p);
    // The regime is non-trivial: some rows have eta clipped at 1 and some not, and some affinities above delta.
    int clipped = 0, above = 0;
    for (int64_t i = 0; i < n; ++i) {
      clipped += ref.rho[i] > p.kappa;
      for (int64_t j = 0; j < n; ++j) above += (i != j && ref.a[i * n + j] > p.delta);
    }
    CHECK(clipped > 0);
    CHECK(clipped < n);
    CHECK(above > 0);

    AscOut out = ascender_head(in.X, in.WQ, in.WK, in.WV, in.U, in.P, p);
    check_close(out.S_base, ref.S_base, 1e-10, 1e-9);
    check_close(out.b_align, ref.b_align, 1e-8, 1e-7);
    check_close(out.b_sep, ref.b_sep, 1e-8, 1e-7);
    check_close(out.b_coh, ref.b_coh, 1e-8, 1e-7);
    check_close(out.S, ref.S, 1e-8, 1e-7);
    check_close(out.A, ref.A, 1e-9, 1e-8);
    check_close(out.Y, ref.Y, 1e-9, 1e-8);
    CHECK(out.Y.shape() == Shape{n, d});
    // Rows of A sum to 1.
    for (double s : sum(out.A, {-1}).to_vector<double>()) CHECK(s == doctest::Approx(1.0).epsilon(1e-12));

    // The same in float32 (looser tolerance).
    AscOut o32 = ascender_head(in.X.to(kFloat32), in.WQ.to(kFloat32), in.WK.to(kFloat32), in.WV.to(kFloat32),
                               in.U.to(kFloat32), in.P.to(kFloat32), p);
    check_close(o32.Y, ref.Y, 2e-4, 2e-3);
  }
}

TEST_CASE("ASCender seed head: the biases change the result (the test sees each term)") {
  Inputs in = make_inputs(100);
  AscParams p;
  p.kappa = pick_kappa(naive_of(in, p).rho);
  Vec base = ascender_head(in.X, in.WQ, in.WK, in.WV, in.U, in.P, p).Y.to_vector<double>();
  for (int which = 0; which < 3; ++which) {
    AscParams q = p;
    (which == 0 ? q.omega_a : which == 1 ? q.omega_s : q.omega_c) = 0.0;
    Vec y = ascender_head(in.X, in.WQ, in.WK, in.WV, in.U, in.P, q).Y.to_vector<double>();
    double diff = 0;
    for (size_t i = 0; i < y.size(); ++i) diff = std::max(diff, std::abs(y[i] - base[i]));
    CAPTURE(which);
    CHECK(diff > 1e-3);
  }
}

TEST_CASE("ASCender seed head: gradcheck of Y w.r.t. X, W_Q, W_K, W_V, U, P (float64)") {
  for (uint64_t seed : {100, 200}) {
    CAPTURE(seed);
    Inputs in = make_inputs(seed);
    AscParams p;
    p.kappa = pick_kappa(naive_of(in, p).rho);
    require_margins(naive_of(in, p), p);
    check_grad([p](const TensorList& t) { return TensorList{ascender_head(t[0], t[1], t[2], t[3], t[4], t[5], p).Y}; },
               in.list());
    // A scalar loss through the whole head reaches every parameter.
    Tensor loss = sum(mul(ascender_head(in.X, in.WQ, in.WK, in.WV, in.U, in.P, p).Y, randn64({n, d}, false, 9)));
    loss.backward();
    for (const Tensor& t : in.list()) {
      REQUIRE(t.grad().defined());
      double mx = 0;
      for (double g : t.grad().to_vector<double>()) mx = std::max(mx, std::abs(g));
      CHECK(mx > 1e-6);
    }
  }
}
