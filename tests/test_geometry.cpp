// Tests of ops/geometry.h: topk, pairwise_sqdist, cosine_similarity_matrix, normalize_rows, row_standardize,
// hard_gate and the surrogate registry. Forward results are compared with naive loops over std::vector<double>;
// gradients with float64 gradcheck (or, for the surrogate backward, with the closed form written here).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

// ---- naive references ----------------------------------------------------------------------------------------

struct NaiveTopk {
  std::vector<double> values;
  std::vector<int64_t> indices;
};

// x viewed as rows of length n; mask (same numel, or empty = all valid); diag_n > 0 excludes column r % diag_n.
NaiveTopk naive_topk(const std::vector<double>& x, int64_t n, int64_t k, bool largest, const std::vector<double>& mask,
                     int64_t diag_n) {
  NaiveTopk r;
  const int64_t R = static_cast<int64_t>(x.size()) / n;
  for (int64_t row = 0; row < R; ++row) {
    std::vector<std::pair<double, int64_t>> c;
    for (int64_t j = 0; j < n; ++j) {
      if (!mask.empty() && mask[row * n + j] == 0) continue;
      if (diag_n > 0 && j == row % diag_n) continue;
      c.push_back({x[row * n + j], j});
    }
    // Selection sort: best value first, lower index on ties.
    for (int64_t t = 0; t < k; ++t) {
      size_t best = t;
      for (size_t q = t + 1; q < c.size(); ++q) {
        bool better = largest ? c[q].first > c[best].first : c[q].first < c[best].first;
        if (c[q].first == c[best].first) better = c[q].second < c[best].second;
        if (better) best = q;
      }
      std::swap(c[t], c[best]);
      r.values.push_back(c[t].first);
      r.indices.push_back(c[t].second);
    }
  }
  return r;
}

// X (B, n, d), Y (B, m, d) row-major -> (B, n, m).
std::vector<double> naive_sqdist(const std::vector<double>& X, const std::vector<double>& Y, int64_t B, int64_t n,
                                 int64_t m, int64_t d) {
  std::vector<double> out(B * n * m);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t t = 0; t < d; ++t) {
          double diff = X[(b * n + i) * d + t] - Y[(b * m + j) * d + t];
          s += diff * diff;
        }
        out[(b * n + i) * m + j] = s;
      }
  return out;
}

std::vector<double> naive_cosine(const std::vector<double>& X, const std::vector<double>& Y, int64_t B, int64_t n,
                                 int64_t m, int64_t d, double eps) {
  std::vector<double> out(B * n * m);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double dot = 0, nx = 0, ny = 0;
        for (int64_t t = 0; t < d; ++t) {
          double xv = X[(b * n + i) * d + t], yv = Y[(b * m + j) * d + t];
          dot += xv * yv;
          nx += xv * xv;
          ny += yv * yv;
        }
        out[(b * n + i) * m + j] = dot / (std::max(std::sqrt(nx), eps) * std::max(std::sqrt(ny), eps));
      }
  return out;
}

std::vector<double> naive_normalize(const std::vector<double>& x, int64_t d, double eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += x[r * d + j] * x[r * d + j];
    double den = std::max(std::sqrt(ss), eps);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = x[r * d + j] / den;
  }
  return out;
}

std::vector<double> naive_standardize(const std::vector<double>& x, int64_t n, const std::vector<double>& mask,
                                      double eps) {
  std::vector<double> out(x.size(), 0.0);
  for (size_t r = 0; r < x.size() / n; ++r) {
    double cnt = 0, s = 0;
    for (int64_t j = 0; j < n; ++j)
      if (mask.empty() || mask[r * n + j] != 0) cnt += 1, s += x[r * n + j];
    if (cnt == 0) continue;
    double mu = s / cnt, v = 0;
    for (int64_t j = 0; j < n; ++j)
      if (mask.empty() || mask[r * n + j] != 0) v += (x[r * n + j] - mu) * (x[r * n + j] - mu);
    double sd = std::sqrt(v / cnt);
    for (int64_t j = 0; j < n; ++j)
      if (mask.empty() || mask[r * n + j] != 0) out[r * n + j] = (x[r * n + j] - mu) / (sd + eps);
  }
  return out;
}

// Closed forms of the registry entries, written independently of ops/geometry.cpp.
double closed_form(const std::string& name, double u, double w) {
  if (name == "sigmoid") {
    double s = 1.0 / (1.0 + std::exp(-w * u));
    return w * s * (1.0 - s);
  }
  if (name == "rectangular") return std::abs(u) < w / 2 ? 1.0 / w : 0.0;
  if (name == "triangular") return std::abs(u) < w ? (1.0 - std::abs(u) / w) / w : 0.0;
  if (name == "atan") return w / (2.0 * (1.0 + std::pow(std::numbers::pi / 2 * w * u, 2)));
  return std::nan("");
}

Tensor bool_mask(const std::vector<double>& v, const Shape& s) { return ne(tensor(v, s), 0.0); }

std::vector<double> expand_values(const Tensor& t, const Shape& s) {
  return t.expand(s).contiguous().to_vector<double>();
}

}  // namespace

// =================================================================================================================
// topk
// =================================================================================================================

TEST_CASE("topk: forward matches a naive selection (largest/smallest, float32/float64, several k)") {
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor x = randn64({3, 4, 9}, false, 11).to(dt);
    auto xv = x.to_vector<double>();
    for (bool largest : {true, false})
      for (int64_t k : {1, 3, 9}) {
        CAPTURE(largest);
        CAPTURE(k);
        auto [v, i] = topk(x, k, {.largest = largest});
        CHECK(v.shape() == Shape{3, 4, k});
        CHECK(i.shape() == Shape{3, 4, k});
        CHECK(v.dtype() == dt);
        CHECK(i.dtype() == kInt64);
        NaiveTopk ref = naive_topk(xv, 9, k, largest, {}, 0);
        check_close(v, ref.values, 0, 0);
        CHECK(i.to_vector<int64_t>() == ref.indices);
      }
  }
}

TEST_CASE("topk: non-contiguous input, 1-D input") {
  Tensor base = randn64({6, 5}, false, 3);
  Tensor xt = base.t();  // (5, 6), not contiguous
  REQUIRE_FALSE(xt.is_contiguous());
  auto [v, i] = topk(xt, 2);
  NaiveTopk ref = naive_topk(xt.contiguous().to_vector<double>(), 6, 2, true, {}, 0);
  check_close(v, ref.values, 0, 0);
  CHECK(i.to_vector<int64_t>() == ref.indices);

  Tensor x1 = tensor({0.5, -1.0, 3.0, 2.0}, {.dtype = kFloat64});
  auto [v1, i1] = topk(x1, 2, {.largest = false});
  check_close(v1, {-1.0, 0.5}, 0, 0);
  CHECK(i1.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
}

TEST_CASE("topk: ties are broken by the lower index") {
  Tensor x = tensor({1, 3, 3, 2, 3, 1}, {1, 6}, {.dtype = kFloat64});
  auto [v, i] = topk(x, 4);
  check_close(v, {3, 3, 3, 2}, 0, 0);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 4, 3});
  auto [vs, is] = topk(x, 3, {.largest = false});
  check_close(vs, {1, 1, 2}, 0, 0);
  CHECK(is.to_vector<int64_t>() == std::vector<int64_t>{0, 5, 3});
  // Larger rows of equal values: the partial selection must still return the lowest indices, in order.
  Tensor c = full({2, 40}, 1.5, {.dtype = kFloat64});
  auto [vc, ic] = topk(c, 5);
  std::vector<int64_t> want;
  for (int r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 5; ++j) want.push_back(j);
  CHECK(ic.to_vector<int64_t>() == want);
}

TEST_CASE("topk: exclude_diagonal and masks (broadcast), against the naive selection") {
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor x = randn64({2, 6, 6}, false, 21).to(dt);
    auto xv = x.to_vector<double>();
    auto [v, i] = topk(x, 3, {.exclude_diagonal = true});
    NaiveTopk ref = naive_topk(xv, 6, 3, true, {}, 6);
    check_close(v, ref.values, 0, 0);
    CHECK(i.to_vector<int64_t>() == ref.indices);
    for (int64_t r = 0; r < 12; ++r)
      for (int64_t j = 0; j < 3; ++j) CHECK(i.to_vector<int64_t>()[r * 3 + j] != r % 6);

    // A (6, 6) mask broadcast over the batch, plus the diagonal excluded; smallest.
    std::vector<double> mv(36);
    for (int a = 0; a < 6; ++a)
      for (int b = 0; b < 6; ++b) mv[a * 6 + b] = ((a + 2 * b) % 3 != 0) ? 1 : 0;
    Tensor mask = bool_mask(mv, {6, 6});
    auto [vm, im] = topk(x, 2, {.largest = false, .exclude_diagonal = true, .mask = mask});
    std::vector<double> mfull = expand_values(mask.to(kFloat64), {2, 6, 6});
    NaiveTopk refm = naive_topk(xv, 6, 2, false, mfull, 6);
    check_close(vm, refm.values, 0, 0);
    CHECK(im.to_vector<int64_t>() == refm.indices);

    // A per-column mask of shape (6) broadcast to every row.
    Tensor colmask = bool_mask({1, 0, 1, 1, 0, 1}, {6});
    auto [vc, ic] = topk(x, 4, {.mask = colmask});
    NaiveTopk refc = naive_topk(xv, 6, 4, true, expand_values(colmask.to(kFloat64), {2, 6, 6}), 0);
    check_close(vc, refc.values, 0, 0);
    CHECK(ic.to_vector<int64_t>() == refc.indices);
  }
}

TEST_CASE("topk: gradient scatters into the selected entries") {
  Tensor x = randn64({2, 3, 7}, true, 5);
  check_grad([](const TensorList& in) { return TensorList{topk(in[0], 3).values}; }, {x});
  check_grad([](const TensorList& in) { return TensorList{topk(in[0], 2, {.largest = false}).values}; }, {x});
  Tensor sq = randn64({2, 5, 5}, true, 6);
  Tensor mask = bool_mask({1, 1, 0, 1, 1}, {5});
  check_grad(
      [&](const TensorList& in) { return TensorList{topk(in[0], 2, {.exclude_diagonal = true, .mask = mask}).values}; },
      {sq});
  // Non-contiguous input.
  Tensor base = randn64({7, 4}, true, 8);
  check_grad([](const TensorList& in) { return TensorList{topk(in[0].t(), 2).values}; }, {base});

  // Explicit scatter: d sum(w * values) / dx = w at the selected index, 0 elsewhere.
  Tensor xl = randn64({3, 6}, true, 9);
  Tensor w = randn64({3, 2}, false, 10);
  auto [v, i] = topk(xl, 2);
  sum(mul(v, w)).backward();
  std::vector<double> want(18, 0.0), wv = w.to_vector<double>();
  auto iv = i.to_vector<int64_t>();
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 2; ++j) want[r * 6 + iv[r * 2 + j]] += wv[r * 2 + j];
  check_close(xl.grad(), want, 0, 0);
  CHECK_FALSE(i.requires_grad());
}

TEST_CASE("topk: bad inputs") {
  Tensor x = randn64({2, 4, 4});
  check_error([&] { topk(x, 0); }, {"topk", "k = 0", "[2, 4, 4]"});
  check_error([&] { topk(x, 5); }, {"topk", "k = 5", "4 selectable", "row length 4", "[2, 4, 4]"});
  check_error([&] { topk(x, 4, {.exclude_diagonal = true}); }, {"topk", "k = 4", "3 selectable", "[2, 4, 4]"});
  check_error([&] { topk(randn64({3, 4}), 1, {.exclude_diagonal = true}); }, {"topk", "square", "[3, 4]"});
  check_error([&] { topk(randn64({4}), 1, {.exclude_diagonal = true}); }, {"topk", "square", "[4]"});
  // The column mask leaves 2 entries per row; with the diagonal also excluded, row 0 keeps only 1.
  Tensor mask = bool_mask({1, 1, 0, 0}, {4});
  check_error([&] { topk(x, 3, {.mask = mask}); }, {"topk", "k = 3", "2 selectable", "row 0", "[2, 4, 4]"});
  check_error([&] { topk(x, 2, {.exclude_diagonal = true, .mask = mask}); },
              {"topk", "k = 2", "1 selectable", "row 0"});
  check_error([&] { topk(x, 1, {.mask = ones({4})}); }, {"topk", "mask must be a bool", "float32"});
  check_error([&] { topk(x, 1, {.mask = bool_mask({1, 1, 1}, {3})}); }, {"topk", "mask of shape [3]", "[2, 4, 4]"});
  check_error([&] { topk(randint(0, 5, {3, 4}), 1); }, {"topk", "int64"});
  check_error([&] { topk(scalar_tensor(1.0), 1); }, {"topk", "at least 1 dimension"});
  check_error([&] { topk(Tensor(), 1); }, {"topk", "undefined"});
}

// =================================================================================================================
// pairwise_sqdist and cosine_similarity_matrix
// =================================================================================================================

TEST_CASE("pairwise_sqdist: forward vs naive, broadcast batch, non-contiguous, float32/float64") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-10 : 1e-4;
    Tensor X = randn64({2, 5, 3}, false, 1).to(dt), Y = randn64({2, 4, 3}, false, 2).to(dt);
    Tensor D = pairwise_sqdist(X, Y);
    CHECK(D.shape() == Shape{2, 5, 4});
    CHECK(D.dtype() == dt);
    check_close(D, naive_sqdist(X.to_vector<double>(), Y.to_vector<double>(), 2, 5, 4, 3), tol, tol);

    // Broadcast: X (2, 1, 5, 3) against Y (3, 4, 3) -> (2, 3, 5, 4).
    Tensor Xb = randn64({2, 1, 5, 3}, false, 3).to(dt), Yb = randn64({3, 4, 3}, false, 4).to(dt);
    Tensor Db = pairwise_sqdist(Xb, Yb);
    CHECK(Db.shape() == Shape{2, 3, 5, 4});
    check_close(Db, naive_sqdist(expand_values(Xb, {2, 3, 5, 3}), expand_values(Yb, {2, 3, 4, 3}), 6, 5, 4, 3), tol,
                tol);

    // Non-contiguous: transposed views.
    Tensor Xt = randn64({3, 6}, false, 5).to(dt).t(), Yt = randn64({3, 4}, false, 6).to(dt).t();
    check_close(pairwise_sqdist(Xt, Yt),
                naive_sqdist(Xt.contiguous().to_vector<double>(), Yt.contiguous().to_vector<double>(), 1, 6, 4, 3), tol,
                tol);

    // Z against itself: zero diagonal (clamped at 0, never negative), symmetric.
    Tensor Z = randn64({7, 4}, false, 7).to(dt);
    auto dz = pairwise_sqdist(Z, Z).to_vector<double>();
    for (int i = 0; i < 7; ++i) {
      CHECK(dz[i * 7 + i] >= 0);
      CHECK(dz[i * 7 + i] <= tol * 10);
      for (int j = 0; j < 7; ++j) CHECK(dz[i * 7 + j] >= 0);
    }
  }
}

TEST_CASE("pairwise_sqdist: gradcheck (several shapes, broadcast, X == Y)") {
  check_grad([](const TensorList& in) { return TensorList{pairwise_sqdist(in[0], in[1])}; },
             {randn64({4, 3}, true, 1), randn64({5, 3}, true, 2)});
  check_grad([](const TensorList& in) { return TensorList{pairwise_sqdist(in[0], in[1])}; },
             {randn64({2, 1, 3, 2}, true, 3), randn64({3, 4, 2}, true, 4)});
  check_grad([](const TensorList& in) { return TensorList{pairwise_sqdist(in[0], in[0])}; },
             {randn64({2, 5, 3}, true, 5)});
  // Only one side requiring grad, non-contiguous.
  Tensor Yc = randn64({4, 3}, false, 6);
  check_grad([&](const TensorList& in) { return TensorList{pairwise_sqdist(in[0].t(), Yc)}; },
             {randn64({3, 5}, true, 7)});
}

TEST_CASE("pairwise_sqdist: bad inputs") {
  check_error(
      [] {
        pairwise_sqdist(randn64({4, 3}), randn64({4, 2}));
      },
      {"pairwise_sqdist", "feature sizes differ", "[4, 3]", "[4, 2]"});
  check_error([] { pairwise_sqdist(randn64({4, 3}), randn32({4, 3})); }, {"pairwise_sqdist", "float64", "float32"});
  check_error([] { pairwise_sqdist(randn64({3}), randn64({4, 3})); }, {"pairwise_sqdist", "(.., n, d)", "[3]"});
  check_error([] { pairwise_sqdist(randn64({2, 4, 3}), randn64({3, 4, 3})); }, {"pairwise_sqdist", "[2]", "[3]"});
  check_error([] { pairwise_sqdist(randint(0, 3, {4, 3}), randint(0, 3, {4, 3})); }, {"pairwise_sqdist", "int64"});
}

TEST_CASE("cosine_similarity_matrix: forward vs naive (zero row uses eps), gradcheck, errors") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    Tensor X = randn64({2, 5, 3}, false, 1).to(dt), Y = randn64({2, 4, 3}, false, 2).to(dt);
    check_close(cosine_similarity_matrix(X, Y),
                naive_cosine(X.to_vector<double>(), Y.to_vector<double>(), 2, 5, 4, 3, 1e-8), tol, tol);
    // A zero row and a broadcast, non-contiguous Y.
    std::vector<double> xv = randn64({4, 3}, false, 3).to_vector<double>();
    std::fill(xv.begin() + 3, xv.begin() + 6, 0.0);
    Tensor X0 = tensor(xv, {4, 3}).to(dt);
    Tensor Y3 = randn64({2, 3, 5}, false, 4).to(dt).transpose(-1, -2);  // (2, 5, 3), non-contiguous
    Tensor C = cosine_similarity_matrix(X0, Y3, 0.5);
    CHECK(C.shape() == Shape{2, 4, 5});
    check_close(C, naive_cosine(expand_values(X0, {2, 4, 3}), Y3.contiguous().to_vector<double>(), 2, 4, 5, 3, 0.5),
                tol, tol);
    for (double c : C.to_vector<double>()) CHECK(std::isfinite(c));
  }
  check_grad([](const TensorList& in) { return TensorList{cosine_similarity_matrix(in[0], in[1])}; },
             {randn64({2, 4, 3}, true, 5), randn64({2, 3, 3}, true, 6)});
  check_grad([](const TensorList& in) { return TensorList{cosine_similarity_matrix(in[0], in[0])}; },
             {randn64({5, 4}, true, 7)});
  check_error(
      [] {
        cosine_similarity_matrix(randn64({4, 3}), randn64({4, 2}));
      },
      {"cosine_similarity_matrix", "feature sizes differ"});
  check_error(
      [] {
        cosine_similarity_matrix(randn64({4, 3}), randn64({4, 3}), -1.0);
      },
      {"cosine_similarity_matrix", "eps", "-1"});
}

// =================================================================================================================
// normalize_rows and row_standardize
// =================================================================================================================

TEST_CASE("normalize_rows: forward vs naive (small and zero rows), non-contiguous, float32/float64") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 1e-6;
    std::vector<double> xv = randn64({3, 4, 5}, false, 1).to_vector<double>();
    for (int j = 0; j < 5; ++j) xv[5 + j] = 0.0;     // a zero row
    for (int j = 0; j < 5; ++j) xv[10 + j] *= 1e-3;  // a row below eps = 0.1
    Tensor x = tensor(xv, {3, 4, 5}).to(dt);
    check_close(normalize_rows(x), naive_normalize(x.to_vector<double>(), 5, 1e-12), tol, tol);
    check_close(normalize_rows(x, 0.1), naive_normalize(x.to_vector<double>(), 5, 0.1), tol, tol);
    Tensor xt = randn64({5, 3}, false, 2).to(dt).t();
    check_close(normalize_rows(xt), naive_normalize(xt.contiguous().to_vector<double>(), 5, 1e-12), tol, tol);
  }
}

TEST_CASE("normalize_rows: gradcheck above and below eps; zero rows give a finite gradient g / eps") {
  check_grad([](const TensorList& in) { return TensorList{normalize_rows(in[0])}; }, {randn64({3, 4, 5}, true, 3)});
  check_grad([](const TensorList& in) { return TensorList{normalize_rows(in[0].t())}; }, {randn64({4, 3}, true, 4)});
  // Rows with norm below eps = 10 (clamped branch) mixed with rows above it.
  Tensor x = mul(randn64({4, 3}, false, 5), tensor({1.0, 1.0, 20.0, 20.0}, {4, 1}, {.dtype = kFloat64}));
  x.set_requires_grad(true);
  for (double n : sum(mul(x, x), {-1}).sqrt().to_vector<double>()) REQUIRE(std::abs(n - 10.0) > 0.5);
  check_grad([](const TensorList& in) { return TensorList{normalize_rows(in[0], 10.0)}; }, {x});

  Tensor z = zeros({2, 3}, {.dtype = kFloat64, .requires_grad = true});
  Tensor g = randn64({2, 3}, false, 6);
  sum(mul(normalize_rows(z, 0.25), g)).backward();
  check_close(z.grad(), div(g, 0.25), 1e-12, 0);
  check_error([] { normalize_rows(randn64({3}), 0.0); }, {"normalize_rows", "eps", "0"});
  check_error([] { normalize_rows(scalar_tensor(1.0)); }, {"normalize_rows", "at least 1 dimension"});
  check_error([] { normalize_rows(randint(0, 3, {2, 2})); }, {"normalize_rows", "int64"});
}

TEST_CASE("row_standardize: forward vs naive, with and without mask, non-contiguous, float32/float64") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-10 : 1e-4;
    Tensor x = randn64({2, 3, 6}, false, 1).to(dt);
    auto xv = x.to_vector<double>();
    check_close(row_standardize(x), naive_standardize(xv, 6, {}, 1e-6), tol, tol);
    check_close(row_standardize(x, {}, 0.5), naive_standardize(xv, 6, {}, 0.5), tol, tol);

    // A (3, 6) mask broadcast over the batch; row 1 fully invalid.
    std::vector<double> mv = {1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0};
    Tensor mask = bool_mask(mv, {3, 6});
    Tensor y = row_standardize(x, mask);
    auto want = naive_standardize(xv, 6, expand_values(mask.to(kFloat64), {2, 3, 6}), 1e-6);
    check_close(y, want, tol, tol);
    auto yv = y.to_vector<double>();
    for (int b = 0; b < 2; ++b)
      for (int j = 0; j < 6; ++j) CHECK(yv[(b * 3 + 1) * 6 + j] == 0.0);

    // -inf at masked positions (masked scores) do not leak into the result.
    Tensor xinf = masked_fill(x, logical_not(mask), -std::numeric_limits<double>::infinity());
    check_close(row_standardize(xinf, mask), want, tol, tol);

    Tensor xt = randn64({6, 4}, false, 2).to(dt).t();
    check_close(row_standardize(xt), naive_standardize(xt.contiguous().to_vector<double>(), 6, {}, 1e-6), tol, tol);
  }
  // Constant row: zeros.
  check_close(row_standardize(full({2, 5}, 3.0, {.dtype = kFloat64})), std::vector<double>(10, 0.0), 1e-12, 0);
}

TEST_CASE("row_standardize: gradcheck with and without a mask; fully invalid rows get zero gradient") {
  check_grad([](const TensorList& in) { return TensorList{row_standardize(in[0])}; }, {randn64({3, 5}, true, 3)});
  check_grad([](const TensorList& in) { return TensorList{row_standardize(in[0], {}, 0.3)}; },
             {randn64({2, 2, 4}, true, 4)});
  Tensor mask = bool_mask({1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1}, {3, 5});
  check_grad([&](const TensorList& in) { return TensorList{row_standardize(in[0], mask)}; },
             {randn64({2, 3, 5}, true, 5)});
  check_grad([&](const TensorList& in) { return TensorList{row_standardize(in[0].t(), mask)}; },
             {randn64({5, 3}, true, 6)});

  Tensor x = randn64({3, 5}, true, 7);
  Tensor g = randn64({3, 5}, false, 8);
  sum(mul(row_standardize(x, mask), g)).backward();
  auto gx = x.grad().to_vector<double>();
  auto mv = mask.to(kFloat64).to_vector<double>();
  for (int i = 0; i < 15; ++i) {
    CHECK(std::isfinite(gx[i]));
    if (mv[i] == 0) CHECK(gx[i] == 0.0);
  }
  // Constant row (std 0): finite gradient (g - mean g) / eps.
  Tensor c = full({1, 4}, 2.0, {.dtype = kFloat64, .requires_grad = true});
  Tensor gc = tensor({1.0, 2.0, 3.0, 6.0}, {1, 4}, {.dtype = kFloat64});
  sum(mul(row_standardize(c, {}, 0.5), gc)).backward();
  check_close(c.grad(), {-2.0 / 0.5, -1.0 / 0.5, 0.0, 3.0 / 0.5}, 1e-12, 0);

  check_error(
      [] {
        row_standardize(randn64({3, 4}), bool_mask({1, 1, 1}, {3}));
      },
      {"row_standardize", "mask of shape [3]", "[3, 4]"});
  check_error([] { row_standardize(randn64({3, 4}), ones({4})); }, {"row_standardize", "bool", "float32"});
  check_error([] { row_standardize(randn64({3, 4}), {}, -1.0); }, {"row_standardize", "eps", "-1"});
  check_error([] { row_standardize(randint(0, 3, {2, 2})); }, {"row_standardize", "int64"});
}

// =================================================================================================================
// hard_gate and the surrogate registry
// =================================================================================================================

TEST_CASE("surrogate registry: every entry integrates to 1 and matches its closed form") {
  auto names = surrogate_names();
  for (const char* want : {"sigmoid", "rectangular", "triangular", "atan"})
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
  for (const auto& name : names) {
    if (name.rfind("test_", 0) == 0) continue;  // entries registered by other tests
    const Surrogate& s = surrogate(name);
    CHECK(s.name == name);
    for (double w : {0.5, 1.0, 4.0}) {
      CAPTURE(name);
      CAPTURE(w);
      // Midpoint rule over [-L, L]; atan's tails (~ 4 / (pi^2 w L)) need a wide interval.
      const double L = name == "atan" ? 4000.0 : 60.0, h = name == "atan" ? 2e-3 : 1e-4;
      double integral = 0;
      for (double u = -L + h / 2; u < L; u += h) integral += s.derivative(u, w) * h;
      CHECK(integral == doctest::Approx(1.0).epsilon(1e-3));
      for (double u : {-1.3, -0.2, 0.0, 0.1, 0.3, 0.9, 2.5}) {
        CAPTURE(u);
        CHECK(s.derivative(u, w) == doctest::Approx(closed_form(name, u, w)).epsilon(1e-12));
      }
    }
  }
  check_error([] { surrogate("nope"); }, {"surrogate", "nope", "sigmoid", "rectangular", "triangular", "atan"});
}

TEST_CASE("hard_gate: forward F = 1[z >= theta] with broadcast theta, float32/float64, non-contiguous") {
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor z = randn64({3, 4}, false, 1).to(dt);
    Tensor theta = tensor({0.1, -0.2, 0.0, 0.5}, {4}).to(dt);
    // Make one entry hit its threshold exactly (>= fires).
    std::vector<double> zv = z.to_vector<double>();
    zv[1] = theta.to_vector<double>()[1];
    z = tensor(zv, {3, 4}).to(dt);
    Tensor F = hard_gate(z, theta);
    CHECK(F.dtype() == dt);
    CHECK(F.shape() == Shape{3, 4});
    auto tv = theta.to_vector<double>();
    std::vector<double> want(12);
    for (int i = 0; i < 12; ++i) want[i] = zv[i] >= tv[i % 4] ? 1.0 : 0.0;
    check_close(F, want, 0, 0);
    CHECK(F.to_vector<double>()[1] == 1.0);
    // Non-contiguous z, scalar theta of the other float dtype.
    Tensor zt = z.t();
    Tensor F2 = hard_gate(zt, scalar_tensor(0.05, {.dtype = kFloat64}));
    auto ztv = zt.contiguous().to_vector<double>();
    for (size_t i = 0; i < ztv.size(); ++i)
      CHECK(F2.to_vector<double>()[i] == (ztv[i] >= (dt == kFloat32 ? double(float(0.05)) : 0.05) ? 1.0 : 0.0));
  }
}

TEST_CASE("hard_gate: backward modes none / straight-through / every registered surrogate") {
  Tensor z0 = randn64({3, 4}, false, 2);
  Tensor theta0 = mul(randn64({4}, false, 3), 0.3);
  Tensor g = randn64({3, 4}, false, 4);
  auto zv = z0.to_vector<double>(), tv = theta0.to_vector<double>(), gv = g.to_vector<double>();

  auto run = [&](GateOptions o) {
    Tensor z = z0.clone().set_requires_grad(true);
    Tensor th = theta0.clone().set_requires_grad(true);
    sum(mul(hard_gate(z, th, o), g)).backward();
    return std::pair{z.grad(), th.grad()};
  };

  {
    auto [dz, dt] = run({.mode = GateBackward::None});
    check_close(dz, std::vector<double>(12, 0.0), 0, 0);
    check_close(dt, std::vector<double>(4, 0.0), 0, 0);
  }
  {
    auto [dz, dt] = run({.mode = GateBackward::StraightThrough});
    check_close(dz, gv, 0, 0);
    std::vector<double> want(4, 0.0);
    for (int i = 0; i < 12; ++i) want[i % 4] -= gv[i];
    check_close(dt, want, 1e-12, 0);
  }
  for (const auto& name : {"sigmoid", "rectangular", "triangular", "atan"})
    for (double w : {0.7, 2.0}) {
      CAPTURE(name);
      CAPTURE(w);
      auto [dz, dt] = run({.mode = GateBackward::Surrogate, .surrogate = name, .width = w});
      std::vector<double> wz(12), wt(4, 0.0);
      for (int i = 0; i < 12; ++i) {
        wz[i] = gv[i] * closed_form(name, zv[i] - tv[i % 4], w);
        wt[i % 4] -= wz[i];
      }
      check_close(dz, wz, 1e-12, 1e-10);
      check_close(dt, wt, 1e-12, 1e-10);
    }
  // Non-trivial: at least some rectangular weights are zero and some not, so the test sees the window.
  int inside = 0;
  for (int i = 0; i < 12; ++i) inside += std::abs(zv[i] - tv[i % 4]) < 0.35;
  CHECK(inside > 0);
  CHECK(inside < 12);
}

TEST_CASE("hard_gate: a registered custom surrogate is used by the backward; registry errors") {
  register_surrogate({"test_quadratic",
                      [](double u, double w) { return std::abs(u) < w ? 0.75 / w * (1.0 - (u / w) * (u / w)) : 0.0; }});
  auto names = surrogate_names();
  CHECK(std::find(names.begin(), names.end(), "test_quadratic") != names.end());
  Tensor z = tensor({-0.5, 0.2, 1.5}, {.dtype = kFloat64, .requires_grad = true});
  Tensor th = scalar_tensor(0.0, {.dtype = kFloat64});
  sum(hard_gate(z, th, {.mode = GateBackward::Surrogate, .surrogate = "test_quadratic", .width = 1.0})).backward();
  check_close(z.grad(), {0.75 * 0.75, 0.75 * 0.96, 0.0}, 1e-12, 0);
  check_error(
      [] {
        register_surrogate({"sigmoid", [](double, double) { return 0.0; }});
      },
      {"register_surrogate", "sigmoid", "already registered"});
  check_error([] { register_surrogate({"", [](double, double) { return 0.0; }}); }, {"register_surrogate", "name"});
  check_error([] { register_surrogate({"test_empty", {}}); }, {"register_surrogate", "test_empty", "derivative"});
}

TEST_CASE("hard_gate: bad inputs") {
  Tensor z = randn64({3, 4});
  check_error([&] { hard_gate(z, randn64({3})); }, {"hard_gate", "theta of shape [3]", "[3, 4]"});
  check_error([&] { hard_gate(z, randn64({2, 3, 4})); }, {"hard_gate", "theta of shape [2, 3, 4]"});
  check_error([&] { hard_gate(z, randn64({4}), {.mode = GateBackward::Surrogate, .surrogate = "bogus"}); },
              {"hard_gate", "bogus", "sigmoid", "rectangular", "triangular", "atan"});
  check_error([&] { hard_gate(z, randn64({4}), {.mode = GateBackward::Surrogate, .width = 0.0}); },
              {"hard_gate", "width", "0"});
  check_error([&] { hard_gate(z, randn64({4}), {.width = -2.0}); }, {"hard_gate", "width", "-2"});
  check_error([&] { hard_gate(randint(0, 3, {3, 4}), randn64({4})); }, {"hard_gate", "int64"});
  check_error([&] { hard_gate(z, randint(0, 3, {4})); }, {"hard_gate", "theta", "int64"});
}
