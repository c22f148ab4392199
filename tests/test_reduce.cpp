// Reductions: sum, mean, var, std, max/min, amax/amin, argmax/argmin, logsumexp, norm. Forward results are
// compared with naive loops over std::vector<double>; backward with gradcheck (float64) and hand-derived values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Groups x's elements by output position: the reduced axes (wrapped, sorted) collapse to 0. Within a group the
// elements are in row-major order of the reduced coordinates, so position 0 is the "first" element.
struct Groups {
  std::vector<std::vector<double>> vals;
  Shape kept;  // keepdim shape
};

Groups group(const Tensor& x, std::vector<int64_t> axes) {
  std::vector<double> v = x.to_vector<double>();
  Shape s = x.shape();
  if (axes.empty())
    for (int i = 0; i < s.size(); ++i) axes.push_back(i);
  for (auto& a : axes) a = a < 0 ? a + s.size() : a;
  Groups g;
  g.kept = s;
  for (auto a : axes) g.kept[static_cast<int>(a)] = 1;
  g.vals.resize(static_cast<size_t>(numel_of(g.kept)));
  for (int64_t f = 0; f < static_cast<int64_t>(v.size()); ++f) {
    auto idx = unravel(f, s);
    for (auto a : axes) idx[static_cast<size_t>(a)] = 0;
    g.vals[static_cast<size_t>(ravel(idx, g.kept))].push_back(v[static_cast<size_t>(f)]);
  }
  return g;
}

template <class F>
std::vector<double> naive(const Tensor& x, const std::vector<int64_t>& axes, F f) {
  Groups g = group(x, axes);
  std::vector<double> out;
  for (auto& vals : g.vals) out.push_back(f(vals));
  return out;
}

double nsum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }
double nmean(const std::vector<double>& v) { return nsum(v) / double(v.size()); }
double nvar(const std::vector<double>& v, int64_t corr) {
  double m = nmean(v), s = 0;
  for (double a : v) s += (a - m) * (a - m);
  return s / double(int64_t(v.size()) - corr);
}
double nmax(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double nmin(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double nargmax(const std::vector<double>& v) { return double(std::max_element(v.begin(), v.end()) - v.begin()); }
double nargmin(const std::vector<double>& v) { return double(std::min_element(v.begin(), v.end()) - v.begin()); }
double nlse(const std::vector<double>& v) {
  long double s = 0;
  for (double a : v) s += std::exp(static_cast<long double>(a));
  return static_cast<double>(std::log(s));
}
double nnorm(const std::vector<double>& v, double p) {
  if (std::isinf(p)) {
    double m = 0;
    for (double a : v) m = std::max(m, std::abs(a));
    return m;
  }
  double s = 0;
  for (double a : v) s += std::pow(std::abs(a), p);
  return std::pow(s, 1.0 / p);
}

// Expected output shape for `dims` (wrapped) with/without keepdim.
Shape expected_shape(const Shape& s, std::vector<int64_t> axes, bool keepdim) {
  if (axes.empty())
    for (int i = 0; i < s.size(); ++i) axes.push_back(i);
  for (auto& a : axes) a = a < 0 ? a + s.size() : a;
  Shape out;
  for (int i = 0; i < s.size(); ++i) {
    bool r = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!r)
      out.push_back(s[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// Inputs for the forward checks: contiguous, transposed, and a strided slice, in float32 and float64.
std::vector<Tensor> forward_inputs() {
  std::vector<Tensor> xs;
  for (bool f64 : {false, true}) {
    Tensor base = f64 ? randn64({4, 5, 6}, false, 11) : randn32({4, 5, 6}, 11);
    xs.push_back(base);                                      // (4, 5, 6) contiguous
    xs.push_back(base.transpose(0, 2));                      // (6, 5, 4) transposed
    xs.push_back(base.slice(1, 0, 5, 2).slice(2, 1, 6, 1));  // (4, 3, 5) sliced
  }
  return xs;
}

// {1, 0}: consecutive axes of a contiguous input (read in place as (outer, n, inner)); {0, 2}: not consecutive.
const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {1}, {-1}, {0, 2}, {-3, -1}, {2, 0, 1}, {1, 0}};

}  // namespace

// ---- sum / mean --------------------------------------------------------------------------------------------------

TEST_CASE("sum and mean: forward vs naive over axes, keepdim, non-contiguous, float32/float64") {
  for (const Tensor& x : forward_inputs()) {
    double tol = x.dtype() == kFloat32 ? 1e-5 : 1e-12;
    for (const auto& dims : kDimSets)
      for (bool keepdim : {false, true}) {
        CAPTURE(x.shape());
        CAPTURE(dims.size());
        CAPTURE(keepdim);
        Tensor s = sum(x, Dims(dims), keepdim);
        Tensor m = mean(x, Dims(dims), keepdim);
        CHECK(s.shape() == expected_shape(x.shape(), dims, keepdim));
        CHECK(m.shape() == s.shape());
        CHECK(s.dtype() == x.dtype());
        check_close(s, naive(x, dims, nsum), tol, tol);
        check_close(m, naive(x, dims, nmean), tol, tol);
      }
  }
  // Method forms and a full reduction to a 0-d tensor.
  Tensor x = randn64({3, 4}, false, 3);
  CHECK(x.sum().dim() == 0);
  CHECK(x.sum().item<double>() == doctest::Approx(nsum(x.to_vector<double>())).epsilon(1e-12));
  CHECK(x.mean().item<double>() == doctest::Approx(nmean(x.to_vector<double>())).epsilon(1e-12));
}

TEST_CASE("sum over the leading dims of a large contiguous tensor (a bias's gradient: blocks of rows in parallel)") {
  // Shapes whose reduction runs in fixed blocks of rows (2 to 64), and ones just below that; against the float64 loop.
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2048, 512}, {0}}, {{3, 70000}, {0}}, {{4, 5, 8192}, {0, 1}}, {{16, 128, 64}, {0, 1}}, {{300, 40}, {0}}};
  for (DType dt : {kFloat32, kFloat64, kInt64})
    for (const auto& [shape, dims] : cases) {
      CAPTURE(dt);
      CAPTURE(shape);
      Tensor x = dt == kInt64 ? randint(-1000, 1000, shape, {.dtype = kInt64}) : randn64(shape, false, 17).to(dt);
      Tensor s = sum(x, Dims(dims));
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      check_close(s, naive(x, dims, nsum), dt == kInt64 ? 0 : tol, dt == kInt64 ? 0 : tol);
      // keepdim: the same numbers
      check_close(sum(x, Dims(dims), true).reshape(s.shape()), s, 0, 0);
    }
}

TEST_CASE("sum of int64 and bool stays integral; mean of int64 is float32") {
  Generator g(5);
  Tensor x = randint(-50, 50, {5, 7}, {.dtype = kInt64}, &g);
  for (const auto& dims : kDimSets)
    if (dims.size() <= 2 &&
        (dims.empty() || std::all_of(dims.begin(), dims.end(), [](int64_t d) { return d >= -2 && d <= 1; }))) {
      Tensor s = sum(x, Dims(dims));
      CHECK(s.dtype() == kInt64);
      check_close(s, naive(x, dims, nsum), 0, 0);
    }
  Tensor xt = x.t();  // non-contiguous int64
  check_close(sum(xt, {1}), naive(xt, {1}, nsum), 0, 0);
  Tensor m = mean(x, {0});
  CHECK(m.dtype() == kFloat32);
  check_close(m, naive(x, {0}, nmean), 1e-5, 1e-5);
  Tensor b = gt(x, 0.0);
  Tensor bs = sum(b);
  CHECK(bs.dtype() == kInt64);
  int64_t count = 0;
  for (auto v : x.to_vector<int64_t>()) count += v > 0;
  CHECK(bs.item<int64_t>() == count);
}

TEST_CASE("sum and mean: gradcheck") {
  for (const auto& dims : kDimSets)
    for (bool keepdim : {false, true}) {
      Dims d(dims);
      check_grad([&](const TensorList& in) { return TensorList{sum(in[0], d, keepdim)}; },
                 {randn64({3, 4, 2}, true, 21)});
      check_grad([&](const TensorList& in) { return TensorList{mean(in[0], d, keepdim)}; },
                 {randn64({3, 4, 2}, true, 22)});
    }
  // Non-contiguous input to the op.
  check_grad([](const TensorList& in) { return TensorList{sum(in[0].transpose(0, 1), {0})}; },
             {randn64({3, 4}, true, 23)});
  // mean's gradient is 1/N everywhere.
  Tensor x = randn64({2, 5}, true, 24);
  mean(x, {1}).sum().backward();
  check_close(x.grad(), std::vector<double>(10, 0.2), 1e-15, 0);
}

TEST_CASE("sum and mean: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { sum(x, {2}); }, {"sum", "dimension 2 out of range"});
  check_error([&] { sum(x, {-3}); }, {"sum", "dimension -3 out of range"});
  check_error([&] { sum(x, {1, -1}); }, {"sum", "dimension 1 appears more than once"});
  check_error([&] { mean(x, {0, 0}); }, {"mean", "dimension 0 appears more than once"});
  check_error([&] { mean(x, {5}); }, {"mean", "dimension 5 out of range"});
  check_error([&] { mean(zeros({2, 0}), {1}); }, {"mean", "empty dimension"});
}

// ---- var / std ---------------------------------------------------------------------------------------------------

TEST_CASE("var and std: forward vs naive, correction 0 and 1") {
  for (const Tensor& x : forward_inputs()) {
    double tol = x.dtype() == kFloat32 ? 1e-5 : 1e-12;
    for (const auto& dims : kDimSets)
      for (int64_t corr : {0, 1})
        for (bool keepdim : {false, true}) {
          CAPTURE(x.shape());
          CAPTURE(corr);
          Tensor v = var(x, Dims(dims), corr, keepdim);
          Tensor s = asc::std(x, Dims(dims), corr, keepdim);
          CHECK(v.shape() == expected_shape(x.shape(), dims, keepdim));
          CHECK(s.shape() == v.shape());
          auto ref = naive(x, dims, [&](const std::vector<double>& a) { return nvar(a, corr); });
          check_close(v, ref, tol, tol);
          for (auto& r : ref) r = std::sqrt(r);
          check_close(s, ref, tol, tol);
        }
  }
  // Accurate when the mean dominates (a one-pass E[x^2] - E[x]^2 would lose everything here).
  Tensor y = add(randn64({100}, false, 9), 1e8);
  CHECK(var(y).item<double>() == doctest::Approx(nvar(y.to_vector<double>(), 1)).epsilon(1e-6));
}

TEST_CASE("var and std: gradcheck") {
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}})
    for (int64_t corr : {0, 1})
      for (bool keepdim : {false, true}) {
        Dims d(dims);
        check_grad([&](const TensorList& in) { return TensorList{var(in[0], d, corr, keepdim)}; },
                   {randn64({3, 4, 2}, true, 31)});
        check_grad([&](const TensorList& in) { return TensorList{asc::std(in[0], d, corr, keepdim)}; },
                   {randn64({3, 4, 2}, true, 32)});
      }
}

TEST_CASE("var and std: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { var(x, {1}, 3); }, {"var", "N = 3", "correction = 3"});
  check_error([&] { var(x, {1}, 4); }, {"var", "N = 3", "correction = 4"});
  check_error([&] { asc::std(randn64({1, 4}), {0}, 1); }, {"std", "N = 1", "correction = 1"});
  check_error([&] { var(x, {2}); }, {"var", "dimension 2 out of range"});
  check_error([&] { var(x, {0, -2}); }, {"var", "appears more than once"});
  check_error([&] { var(zeros({0}), {}, 0); }, {"var", "N = 0"});
}

// ---- max / min / argmax / argmin ---------------------------------------------------------------------------------

TEST_CASE("max and min along a dim: values and first indices vs naive") {
  // Small integer-valued data: many ties, so "first index" is really exercised.
  Generator g(41);
  Tensor ties = randint(0, 3, {4, 5, 6}, {.dtype = kInt64}, &g);
  std::vector<Tensor> xs = forward_inputs();
  for (DType dt : {kFloat32, kFloat64, kInt64}) {
    Tensor t = ties.to(dt);
    xs.push_back(t);
    xs.push_back(t.transpose(0, 2));
  }
  for (const Tensor& x : xs)
    for (int64_t d = -x.dim(); d < x.dim(); ++d)
      for (bool keepdim : {false, true}) {
        CAPTURE(x.shape());
        CAPTURE(d);
        auto [mv, mi] = max(x, d, keepdim);
        auto [nv, ni] = min(x, d, keepdim);
        Shape es = expected_shape(x.shape(), {d}, keepdim);
        CHECK(mv.shape() == es);
        CHECK(mi.shape() == es);
        CHECK(mv.dtype() == x.dtype());
        CHECK(mi.dtype() == kInt64);
        check_close(mv, naive(x, {d}, nmax), 0, 0);
        check_close(nv, naive(x, {d}, nmin), 0, 0);
        check_close(mi, naive(x, {d}, nargmax), 0, 0);
        check_close(ni, naive(x, {d}, nargmin), 0, 0);
        check_close(argmax(x, d, keepdim), naive(x, {d}, nargmax), 0, 0);
        check_close(argmin(x, d, keepdim), naive(x, {d}, nargmin), 0, 0);
        CHECK(argmax(x, d, keepdim).shape() == es);
      }
  // A 0-d tensor reduces to itself with index 0.
  auto [v0, i0] = max(scalar_tensor(2.5), 0);
  CHECK(v0.dim() == 0);
  CHECK(v0.item<double>() == 2.5);
  CHECK(i0.item<int64_t>() == 0);
  // NaN is the maximum and the minimum (first NaN), as in PyTorch.
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor xn = tensor({1.0, nan, 5.0, nan}, {4}, {.dtype = kFloat64});
  CHECK(std::isnan(max(xn, 0).values.item<double>()));
  CHECK(max(xn, 0).indices.item<int64_t>() == 1);
  CHECK(argmin(xn, 0).item<int64_t>() == 1);
  // The same along a non-last dim (the (outer, n, inner) kernel): column 0 has a NaN at row 2, column 1 none.
  Tensor xm = tensor({1.0, 4.0, 7.0, 2.0, nan, 9.0, nan, 0.0}, {4, 2}, {.dtype = kFloat64});
  auto [mv, mi] = max(xm, 0);
  CHECK(std::isnan(mv.to_vector<double>()[0]));
  CHECK(mv.to_vector<double>()[1] == 9.0);
  check_close(mi, {2, 2}, 0, 0);
  check_close(argmin(xm, 0), {2, 3}, 0, 0);
}

TEST_CASE("max and min: gradient to the selected element") {
  for (int64_t d : {0, 1, -1})
    for (bool keepdim : {false, true}) {
      check_grad([&](const TensorList& in) { return TensorList{max(in[0], d, keepdim).values}; },
                 {randn64({3, 4, 5}, true, 51)});
      check_grad([&](const TensorList& in) { return TensorList{min(in[0], d, keepdim).values}; },
                 {randn64({3, 4, 5}, true, 52)});
    }
  check_grad([](const TensorList& in) { return TensorList{max(in[0].t(), 1).values}; }, {randn64({4, 3}, true, 53)});
  // With ties the whole gradient goes to the first maximum.
  Tensor x = tensor({1, 3, 3, 2, 0, 0, -1, 0}, {2, 4}, {.dtype = kFloat64, .requires_grad = true});
  Tensor w = tensor({10, 20}, {2}, {.dtype = kFloat64});
  (max(x, 1).values * w).sum().backward();
  check_close(x.grad(), {0, 10, 0, 0, 20, 0, 0, 0}, 0, 0);
  Tensor y = tensor({1, 3, 3, 2, 0, 0, -1, 0}, {2, 4}, {.dtype = kFloat64, .requires_grad = true});
  (min(y, 0, true).values * tensor({1, 2, 3, 4}, {1, 4}, {.dtype = kFloat64})).sum().backward();
  check_close(y.grad(), {0, 0, 0, 0, 1, 2, 3, 4}, 0, 0);
}

TEST_CASE("max/min/argmax/argmin: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { max(x, 2); }, {"max", "dimension 2 out of range"});
  check_error([&] { min(x, -3); }, {"min", "dimension -3 out of range"});
  check_error([&] { argmax(x, 5); }, {"argmax", "dimension 5 out of range"});
  check_error([&] { max(zeros({2, 0}), 1); }, {"max", "dimension 1 of size 0"});
  check_error([&] { min(zeros({0, 3}), 0); }, {"min", "dimension 0 of size 0"});
  check_error([&] { argmin(zeros({0, 3}), 0); }, {"argmin", "dimension 0 of size 0"});
  check_error([&] { max(gt(x, 0.0), 0); }, {"max", "bool"});
  // Reducing a non-empty dim of a tensor that is empty elsewhere is fine.
  CHECK(max(zeros({0, 3}), 1).values.shape() == Shape{0});
}

TEST_CASE("max / min / argmax / argmin without a dimension: over every element, as PyTorch's") {
  // against a naive loop over the row-major elements, strided views included
  const Tensor base = randn64({4, 5, 3}, false, 64);
  for (const Tensor& x :
       {base, base.transpose(0, 2), base.select(1, 2), base.narrow(2, 1, 2), tensor({2.5}, Shape{})}) {
    const std::vector<double> v = x.contiguous().to_vector<double>();
    const auto hi = std::max_element(v.begin(), v.end()), lo = std::min_element(v.begin(), v.end());
    CHECK(max(x).dim() == 0);
    CHECK(max(x).item<double>() == *hi);
    CHECK(min(x).item<double>() == *lo);
    CHECK(argmax(x).dtype() == kInt64);
    CHECK(argmax(x).dim() == 0);
    CHECK(argmax(x).item<int64_t>() == hi - v.begin());
    CHECK(argmin(x).item<int64_t>() == lo - v.begin());
  }
  // the first of tied extremes; NaN is the extreme; integers keep their dtype
  CHECK(argmax(tensor({1, 7, 3, 7}, {2, 2})).item<int64_t>() == 1);
  CHECK(argmin(tensor({4, 0, 0, 9}, {4})).item<int64_t>() == 1);
  const Tensor nan = tensor({1, NAN, 3, NAN}, {4}, {.dtype = kFloat64});
  CHECK(std::isnan(max(nan).item<double>()));
  CHECK(std::isnan(min(nan).item<double>()));
  CHECK(argmax(nan).item<int64_t>() == 1);
  CHECK(argmin(nan).item<int64_t>() == 1);
  Generator g(65);
  const Tensor xi = randint(-9, 9, {3, 4}, {.dtype = kInt64}, &g);
  CHECK(max(xi).dtype() == kInt64);
  CHECK(max(xi).item<int64_t>() == amax(xi).item<int64_t>());
  // gradient: ties share it (PyTorch's evenly distributed backward), float64 gradcheck elsewhere
  Tensor t = tensor({5, 1, 5, 2}, {2, 2}, {.dtype = kFloat64, .requires_grad = true});
  max(t).backward();
  check_close(t.grad(), {0.5, 0, 0.5, 0}, 1e-15, 0);
  check_grad([](const TensorList& in) { return TensorList{max(in[0]), min(in[0])}; }, {randn64({3, 4}, true, 66)});
  // errors
  check_error([] { max(zeros({0, 3})); }, {"max", "size 0"});
  check_error([] { argmin(zeros({2, 0})); }, {"argmin", "size 0"});
  check_error([] { max(Tensor()); }, {"max"});
  check_error([] { argmax(Tensor()); }, {"argmax"});
}

// ---- amax / amin -------------------------------------------------------------------------------------------------

TEST_CASE("amax and amin: forward vs naive over axes") {
  for (const Tensor& x : forward_inputs())
    for (const auto& dims : kDimSets)
      for (bool keepdim : {false, true}) {
        Tensor a = amax(x, Dims(dims), keepdim), b = amin(x, Dims(dims), keepdim);
        CHECK(a.shape() == expected_shape(x.shape(), dims, keepdim));
        CHECK(b.shape() == a.shape());
        check_close(a, naive(x, dims, nmax), 0, 0);
        check_close(b, naive(x, dims, nmin), 0, 0);
      }
  Generator g(61);
  Tensor xi = randint(-9, 9, {3, 4}, {.dtype = kInt64}, &g);
  CHECK(amax(xi, {1}).dtype() == kInt64);
  check_close(amax(xi, {1}), naive(xi, {1}, nmax), 0, 0);
}

TEST_CASE("amax and amin: gradient, ties split equally") {
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}, {-1}})
    for (bool keepdim : {false, true}) {
      Dims d(dims);
      check_grad([&](const TensorList& in) { return TensorList{amax(in[0], d, keepdim)}; },
                 {randn64({3, 4, 2}, true, 62)});
      check_grad([&](const TensorList& in) { return TensorList{amin(in[0], d, keepdim)}; },
                 {randn64({3, 4, 2}, true, 63)});
    }
  Tensor x = tensor({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}, {.dtype = kFloat64, .requires_grad = true});
  (amax(x, {1}) * tensor({6, 9}, {2}, {.dtype = kFloat64})).sum().backward();
  check_close(x.grad(), {0, 3, 3, 0, 3, 3, 3, 0}, 1e-15, 0);
  Tensor y = tensor({1, 3, 1, 2}, {2, 2}, {.dtype = kFloat64, .requires_grad = true});
  amin(y).backward();  // the two 1s over all axes
  check_close(y.grad(), {0.5, 0, 0.5, 0}, 1e-15, 0);
}

TEST_CASE("amax and amin: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { amax(x, {2}); }, {"amax", "dimension 2 out of range"});
  check_error([&] { amin(x, {1, 1}); }, {"amin", "dimension 1 appears more than once"});
  check_error([&] { amax(zeros({2, 0})); }, {"amax", "dimension 1 of size 0"});
}

// ---- logsumexp ---------------------------------------------------------------------------------------------------

TEST_CASE("logsumexp: forward vs naive, stable for large values") {
  for (const Tensor& x : forward_inputs()) {
    double tol = x.dtype() == kFloat32 ? 1e-5 : 1e-12;
    for (const auto& dims : kDimSets)
      for (bool keepdim : {false, true}) {
        Tensor l = logsumexp(x, Dims(dims), keepdim);
        CHECK(l.shape() == expected_shape(x.shape(), dims, keepdim));
        check_close(l, naive(x, dims, nlse), tol, tol);
      }
  }
  // exp(1000) overflows double; the max shift keeps it finite.
  Tensor big = tensor({1000, 1000, -1000, 999}, {2, 2}, {.dtype = kFloat64});
  check_close(logsumexp(big, {1}), {1000 + std::log(2.0), 999 + std::log1p(std::exp(-1999.0))}, 1e-12, 1e-14);
  Tensor big32 = tensor({100, 100}, {2}, {.dtype = kFloat32});  // exp(100) overflows float32
  check_close(logsumexp(big32), {100 + std::log(2.0)}, 1e-4, 1e-6);
}

TEST_CASE("logsumexp: -inf rows, +inf entries, no NaN in forward or backward") {
  Tensor x = tensor({-kInf, -kInf, -kInf, 0.5, -kInf, 1.5, kInf, 2.0, kInf}, {3, 3},
                    {.dtype = kFloat64, .requires_grad = true});
  Tensor l = logsumexp(x, {1});
  check_close(l, {-kInf, 1.5 + std::log1p(std::exp(-1.0)), kInf}, 1e-12, 1e-12);
  (l * tensor({2, 3, 4}, {3}, {.dtype = kFloat64})).sum().backward();
  std::vector<double> gx = x.grad().to_vector<double>();
  for (double v : gx) CHECK_FALSE(std::isnan(v));
  double s0 = 1 / (1 + std::exp(1.0));  // softmax of (0.5, 1.5)
  check_close(x.grad(), {0, 0, 0, 3 * s0, 0, 3 * (1 - s0), 2, 0, 2}, 1e-12, 1e-12);
  // Empty reduction: log(0) = -inf, as in PyTorch.
  check_close(logsumexp(zeros({2, 0}, {.dtype = kFloat64}), {1}), {-kInf, -kInf}, 0, 0);
}

TEST_CASE("logsumexp: gradcheck") {
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}})
    for (bool keepdim : {false, true}) {
      Dims d(dims);
      check_grad([&](const TensorList& in) { return TensorList{logsumexp(in[0], d, keepdim)}; },
                 {randn64({3, 4, 2}, true, 71)});
    }
  check_grad([](const TensorList& in) { return TensorList{logsumexp(in[0].t(), {1})}; }, {randn64({4, 3}, true, 72)});
  // Rows with -inf entries (but a finite max) differentiate normally w.r.t. the finite entries.
  check_grad([](const TensorList& in) { return TensorList{logsumexp(in[0] * 3.0, {1})}; }, {randn64({2, 5}, true, 73)});
}

TEST_CASE("logsumexp: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { logsumexp(x, {2}); }, {"logsumexp", "dimension 2 out of range"});
  check_error([&] { logsumexp(x, {0, -2}); }, {"logsumexp", "dimension 0 appears more than once"});
}

// ---- norm --------------------------------------------------------------------------------------------------------

TEST_CASE("norm: forward vs naive for p = 1, 1.5, 2, 3, inf") {
  for (const Tensor& x : forward_inputs()) {
    double tol = x.dtype() == kFloat32 ? 1e-5 : 1e-12;
    for (double p : {1.0, 1.5, 2.0, 3.0, kInf})
      for (const auto& dims : kDimSets)
        for (bool keepdim : {false, true}) {
          CAPTURE(p);
          Tensor nx = norm(x, p, Dims(dims), keepdim);
          CHECK(nx.shape() == expected_shape(x.shape(), dims, keepdim));
          CHECK(nx.dtype() == x.dtype());
          check_close(nx, naive(x, dims, [&](const std::vector<double>& a) { return nnorm(a, p); }), tol, tol);
        }
  }
  CHECK(norm(tensor({3, 4}, {2})).item<double>() == doctest::Approx(5.0));
}

TEST_CASE("norm: gradcheck, and the gradient at 0 is 0") {
  for (double p : {1.0, 1.5, 2.0, 3.0, kInf})
    for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}})
      for (bool keepdim : {false, true}) {
        CAPTURE(p);
        Dims d(dims);
        check_grad([&](const TensorList& in) { return TensorList{norm(in[0], p, d, keepdim)}; },
                   {randn64({3, 4, 2}, true, 81)});
      }
  for (double p : {1.0, 1.5, 2.0, 3.0, kInf}) {
    CAPTURE(p);
    Tensor z = zeros({2, 3}, {.dtype = kFloat64, .requires_grad = true});
    Tensor nz = norm(z, p, {1});
    check_close(nz, {0, 0}, 0, 0);
    nz.sum().backward();
    check_close(z.grad(), std::vector<double>(6, 0.0), 0, 0);
  }
  // A zero row next to a non-zero row: only the non-zero row gets x / ||x||.
  Tensor x = tensor({0, 0, 3, 4}, {2, 2}, {.dtype = kFloat64, .requires_grad = true});
  norm(x, 2.0, {1}).sum().backward();
  check_close(x.grad(), {0, 0, 0.6, 0.8}, 1e-15, 0);
}

TEST_CASE("norm: errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { norm(x, 0.5); }, {"norm", "p must be >= 1", "0.5"});
  check_error([&] { norm(x, -1.0); }, {"norm", "p must be >= 1", "-1"});
  check_error([&] { norm(x, std::nan("")); }, {"norm", "p must be >= 1"});
  check_error([&] { norm(x, 2.0, {3}); }, {"norm", "dimension 3 out of range"});
  check_error([&] { norm(x, 2.0, {1, -1}); }, {"norm", "dimension 1 appears more than once"});
}

// ---- large inputs (row-parallel kernels) -------------------------------------------------------------------------

TEST_CASE("max, amax, logsumexp on inputs large enough for the parallel path") {
  Tensor x = randn32({300, 257}, 91);  // 77k elements: above the parallel grain
  for (int64_t d : {0, 1}) {
    auto [v, i] = max(x, d);
    check_close(v, naive(x, {d}, nmax), 0, 0);
    check_close(i, naive(x, {d}, nargmax), 0, 0);
    check_close(argmin(x, d), naive(x, {d}, nargmin), 0, 0);
    check_close(logsumexp(x, {d}), naive(x, {d}, nlse), 1e-5, 1e-5);
  }
  check_close(amin(x), {nmin(x.to_vector<double>())}, 0, 0);
  check_close(logsumexp(x), {nlse(x.to_vector<double>())}, 1e-5, 1e-5);
}
