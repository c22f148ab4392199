// nn functional ops: forward vs naive loops (float32/float64, strided inputs, non-last dims, broadcast masks),
// masked / fully masked rows, gradchecks of every differentiable op, and the error messages.
#include <cmath>
#include <limits>

#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// keep[flat] for a mask of shape ms broadcast to shape s (independent of the library's expand).
std::vector<char> broadcast_keep(const Tensor& mask, const Shape& s) {
  std::vector<double> mv = mask.to(kFloat64).to_vector<double>();
  const Shape& ms = mask.shape();
  std::vector<char> keep(static_cast<size_t>(numel_of(s)));
  for (int64_t f = 0; f < numel_of(s); ++f) {
    auto idx = unravel(f, s);
    std::vector<int64_t> midx(static_cast<size_t>(ms.size()));
    const int lead = s.size() - ms.size();
    for (int i = 0; i < ms.size(); ++i) midx[i] = ms[i] == 1 ? 0 : idx[i + lead];
    keep[f] = mv[ravel(midx, ms)] != 0;
  }
  return keep;
}

// Softmax / log-softmax along `dim` with plain loops; keep may be empty (no mask).
std::vector<double> naive_softmax(const std::vector<double>& x, const Shape& s, int dim, const std::vector<char>& keep,
                                  bool log) {
  std::vector<double> y(x.size());
  for (int64_t f = 0; f < numel_of(s); ++f) {
    auto idx = unravel(f, s);
    if (idx[dim] != 0) continue;
    std::vector<int64_t> flats;
    for (int64_t j = 0; j < s[dim]; ++j) {
      idx[dim] = j;
      flats.push_back(ravel(idx, s));
    }
    auto kept = [&](int64_t fl) { return keep.empty() || keep[fl]; };
    double m = -kInf;
    for (auto fl : flats)
      if (kept(fl)) m = std::max(m, x[fl]);
    if (m == -kInf) {
      for (auto fl : flats) y[fl] = 0;
      continue;
    }
    double z = 0;
    for (auto fl : flats)
      if (kept(fl)) z += std::exp(x[fl] - m);
    for (auto fl : flats) {
      if (!kept(fl))
        y[fl] = log ? -kInf : 0.0;
      else
        y[fl] = log ? x[fl] - m - std::log(z) : std::exp(x[fl] - m) / z;
    }
  }
  return y;
}

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

Tensor randn_dt(const Shape& s, DType dt, uint64_t seed) {
  return dt == kFloat64 ? randn64(s, false, seed) : randn32(s, seed);
}

// asc::log (the name `log` is shadowed by bool flags in some tests).
Tensor log_fn_guard(const Tensor& t) { return asc::log(t); }

}  // namespace

// ---- softmax / log_softmax -------------------------------------------------------------------------------------

TEST_CASE("softmax/log_softmax forward vs naive: dims, dtypes, non-contiguous input") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-6;
    for (bool log : {false, true}) {
      CAPTURE(log);
      Tensor x = randn_dt({3, 4, 5}, dt, 11) * 3.0;
      for (int dim : {0, 1, 2, -1, -2}) {
        CAPTURE(dim);
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
        CHECK(y.shape() == x.shape());
        CHECK(y.dtype() == dt);
        check_close(y, naive_softmax(vec(x), x.shape(), dim < 0 ? dim + 3 : dim, {}, log), tol, tol);
      }
      // Non-contiguous views: a transpose and a strided slice.
      Tensor base = randn_dt({6, 7}, dt, 12);
      Tensor xt = base.t();  // (7, 6)
      CHECK(!xt.is_contiguous());
      check_close(log ? log_softmax(xt, 1) : softmax(xt, 1), naive_softmax(vec(xt), xt.shape(), 1, {}, log), tol, tol);
      Tensor xs = base.slice(1, 0, 7, 2);  // (6, 4), stride 2
      check_close(log ? log_softmax(xs, -1) : softmax(xs, -1), naive_softmax(vec(xs), xs.shape(), 1, {}, log), tol,
                  tol);
      // Long rows (exercise the vectorised loops and their tails).
      Tensor xl = randn_dt({5, 1003}, dt, 13) * 10.0;
      check_close(log ? log_softmax(xl, 1) : softmax(xl, 1), naive_softmax(vec(xl), xl.shape(), 1, {}, log), tol, tol);
    }
  }
}

TEST_CASE("softmax: large logits are stable, rows sum to 1, 0-d input") {
  Tensor x = tensor({1000.0, 1001.0, 999.0, -1000.0, -1001.0, -1002.0}, {2, 3}, {.dtype = kFloat32});
  Tensor y = softmax(x, 1);
  CHECK(!has_non_finite(y));
  check_close(y, naive_softmax(vec(x), x.shape(), 1, {}, false), 1e-6, 1e-5);
  check_close(sum(y, {1}), {1.0, 1.0}, 1e-6);
  Tensor ly = log_softmax(x, 1);
  check_close(ly, naive_softmax(vec(x), x.shape(), 1, {}, true), 1e-5, 1e-6);
  // Very negative shifted entries underflow to exactly 0 probability, not NaN.
  Tensor z = softmax(tensor({0.0, -800.0, -1e30}, {.dtype = kFloat64}), 0);
  check_close(z, {1.0, 0.0, 0.0}, 0, 0);
  Tensor s = softmax(scalar_tensor(3.0, {.dtype = kFloat64}), 0);
  CHECK(s.dim() == 0);
  CHECK(s.item<double>() == 1.0);
  CHECK(log_softmax(scalar_tensor(3.0, {.dtype = kFloat64}), -1).item<double>() == 0.0);
}

TEST_CASE("softmax/log_softmax with broadcast masks, partially and fully masked rows") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-6;
    Tensor x = randn_dt({2, 3, 9}, dt, 21);
    // (2, 1, 9): a key-padding style mask broadcast over dim 1; batch 1 is fully masked.
    std::vector<double> mv(18, 0.0);
    for (int j = 0; j < 9; ++j) mv[j] = (j % 3 != 1) ? 1.0 : 0.0;
    Tensor mask = gt(tensor(mv, {2, 1, 9}), 0.5);
    CHECK(mask.dtype() == kBool);
    auto keep = broadcast_keep(mask, x.shape());
    for (bool log : {false, true}) {
      CAPTURE(log);
      Tensor y = log ? log_softmax(x, -1, mask) : softmax(x, -1, mask);
      auto ref = naive_softmax(vec(x), x.shape(), 2, keep, log);
      // Fully masked rows give zeros in both (the naive reference does the same by construction of the spec).
      check_close(y, ref, tol, tol);
      auto yv = vec(y);
      for (size_t i = 0; i < yv.size(); ++i) {
        CHECK(!std::isnan(yv[i]));
        if (i >= 27)
          CHECK(yv[i] == 0.0);  // batch 1: fully masked
        else if (!keep[i])
          CHECK(yv[i] == (log ? -kInf : 0.0));
      }
      // Mask along a non-last dim, broadcast (1, 3, 1) -> row masks over dim 1.
      Tensor m2 = gt(tensor({1.0, 0.0, 1.0}, {1, 3, 1}), 0.5);
      Tensor y2 = log ? log_softmax(x, 1, m2) : softmax(x, 1, m2);
      check_close(y2, naive_softmax(vec(x), x.shape(), 1, broadcast_keep(m2, x.shape()), log), tol, tol);
    }
  }
}

TEST_CASE("softmax/log_softmax: fully masked rows get zero gradient, never NaN") {
  Tensor x = randn64({3, 5}, true, 31);
  Tensor mask = gt(tensor({1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, {3, 5}), 0.5);
  Tensor g = randn64({3, 5}, false, 32);
  for (bool log : {false, true}) {
    CAPTURE(log);
    x.zero_grad();
    Tensor y = log ? log_softmax(x, 1, mask) : softmax(x, 1, mask);
    // Keep -inf out of the loss: use only kept entries.
    sum(where(mask, y, 0.0) * g).backward();
    auto gv = vec(x.grad());
    for (int j = 0; j < 5; ++j) CHECK(gv[5 + j] == 0.0);     // fully masked row
    for (int j : {1, 4}) CHECK(gv[j] == 0.0);                // masked entries of row 0
    for (int j : {0, 1, 2, 3, 4}) CHECK(gv[10 + j] == 0.0);  // a single kept entry: constant output
    for (double v : gv) CHECK(std::isfinite(v));
  }
  // Rows that are entirely -inf without a mask behave as fully masked.
  Tensor xi = tensor({-kInf, -kInf, 1.0, 2.0}, {2, 2}, {.dtype = kFloat64});
  check_close(softmax(xi, 1), naive_softmax(vec(xi), xi.shape(), 1, {}, false), 1e-12);
  check_close(softmax(xi, 1).narrow(0, 0, 1), {0.0, 0.0}, 0);
  check_close(log_softmax(xi, 1).narrow(0, 0, 1), {0.0, 0.0}, 0);
  Tensor xg = xi.clone().set_requires_grad(true);
  sum(log_softmax(xg, 1) * tensor({1.0, 2.0, 3.0, 4.0}, {2, 2}, {.dtype = kFloat64})).backward();
  check_close(xg.grad().narrow(0, 0, 1), {0.0, 0.0}, 0);
}

TEST_CASE("softmax/log_softmax gradcheck (dims, masks)") {
  Tensor mask = gt(tensor({1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0}, {3, 4}), 0.5);
  for (bool log : {false, true}) {
    CAPTURE(log);
    auto f = [log](const Tensor& x, int64_t dim, const Tensor& m) {
      return log ? log_softmax(x, dim, m) : softmax(x, dim, m);
    };
    check_grad([&](const TensorList& in) { return TensorList{f(in[0], -1, Tensor())}; }, {randn64({3, 4}, true, 41)});
    check_grad([&](const TensorList& in) { return TensorList{f(in[0], 0, Tensor())}; }, {randn64({3, 4}, true, 42)});
    check_grad([&](const TensorList& in) { return TensorList{f(in[0], 1, Tensor())}; }, {randn64({2, 3, 4}, true, 43)});
    check_grad([&](const TensorList& in) { return TensorList{f(in[0].t(), 0, Tensor())}; },
               {randn64({4, 3}, true, 44)});
    // Masked (row 2 fully masked); masked log-probs are -inf, so the checked output zeroes them.
    check_grad([&](const TensorList& in) { return TensorList{where(mask, f(in[0], 1, mask), 0.0)}; },
               {randn64({3, 4}, true, 45)});
    // Broadcast mask, reduction over dim 0.
    Tensor m0 = gt(tensor({1, 0, 1}, {3, 1}), 0.5);
    check_grad([&](const TensorList& in) { return TensorList{where(m0, f(in[0], 0, m0), 0.0)}; },
               {randn64({3, 4}, true, 46)});
  }
}

TEST_CASE("softmax errors") {
  Tensor x = randn64({2, 3});
  check_error([&] { softmax(x, 2); }, {"softmax", "dimension 2"});
  check_error([&] { log_softmax(x, -3); }, {"log_softmax", "dimension -3"});
  check_error([&] { softmax(x, 1, randn64({2, 3})); }, {"softmax", "mask must be a bool", "float64"});
  check_error([&] { softmax(x, 1, gt(randn64({3, 2}), 0.0)); }, {"softmax", "[3, 2]", "[2, 3]"});
  check_error([&] { log_softmax(x, 1, gt(randn64({4, 2, 3}), 0.0)); }, {"log_softmax", "[4, 2, 3]", "broadcast"});
  check_error([&] { softmax(arange(4), 0); }, {"softmax", "floating"});
}

// ---- cross_entropy ---------------------------------------------------------------------------------------------

namespace {

// Per-element loss with PyTorch's label smoothing; logits laid out (N, C, d...) row-major, target (N, d...).
// Returns losses (0 where ignored) and the count of non-ignored targets.
std::vector<double> naive_ce(const std::vector<double>& x, const Shape& ls, const std::vector<int64_t>& t,
                             int64_t ignore, double s, int64_t& count) {
  const int64_t N = ls[0], C = ls[1];
  int64_t inner = 1;
  for (int i = 2; i < ls.size(); ++i) inner *= ls[i];
  std::vector<double> out(static_cast<size_t>(N * inner), 0.0);
  count = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < inner; ++k) {
      int64_t tt = t[n * inner + k];
      if (tt == ignore) continue;
      ++count;
      auto at = [&](int64_t c) { return x[(n * C + c) * inner + k]; };
      double m = -kInf;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, at(c));
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += std::exp(at(c) - m);
      double lse = m + std::log(z);
      // -sum_c q_c log p_c with q = (1 - s) onehot + s / C
      double l = 0;
      for (int64_t c = 0; c < C; ++c) {
        double q = (c == tt ? 1.0 - s : 0.0) + s / C;
        l -= q * (at(c) - lse);
      }
      out[n * inner + k] = l;
    }
  return out;
}

}  // namespace

TEST_CASE("cross_entropy forward vs naive: (N, C) and (N, C, d1, d2), ignore_index, label smoothing, reductions") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-11 : 2e-5;
    for (Shape ls : {Shape{6, 5}, Shape{3, 4, 2, 3}}) {
      Tensor x = randn_dt(ls, dt, 51) * 2.0;
      Shape ts;
      for (int i = 0; i < ls.size(); ++i)
        if (i != 1) ts.push_back(ls[i]);
      Generator g(52);
      Tensor t = randint(0, ls[1], ts, {.dtype = kInt64}, &g);
      std::vector<int64_t> tv = t.to_vector<int64_t>();
      tv[1] = -100;  // ignored
      tv[3] = 7;     // a custom ignore_index below
      for (int64_t ignore : {int64_t{-100}, int64_t{7}}) {
        std::vector<int64_t> tv2 = tv;
        if (ignore == 7)
          tv2[1] = 0;
        else
          tv2[3] = 2;
        Tensor tt = tensor(tv2, ts);
        for (double s : {0.0, 0.1, 1.0}) {
          CAPTURE(s);
          int64_t count = 0;
          auto ref = naive_ce(vec(x), ls, tv2, ignore, s, count);
          double total = 0;
          for (double v : ref) total += v;
          check_close(
              cross_entropy(x, tt, {.ignore_index = ignore, .label_smoothing = s, .reduction = Reduction::None}), ref,
              tol, tol);
          Tensor ls_none =
              cross_entropy(x, tt, {.ignore_index = ignore, .label_smoothing = s, .reduction = Reduction::None});
          CHECK(ls_none.shape() == ts);
          check_close(cross_entropy(x, tt, {.ignore_index = ignore, .label_smoothing = s, .reduction = Reduction::Sum}),
                      {total}, tol, tol);
          check_close(cross_entropy(x, tt, {.ignore_index = ignore, .label_smoothing = s}), {total / count}, tol, tol);
        }
      }
    }
  }
  // Non-contiguous logits (a transposed (C, N) buffer) and the unbatched (C) form.
  Tensor base = randn64({5, 4}, false, 53);  // (C, N)
  Tensor x = base.t();                       // (N, C) = (4, 5)
  Tensor t = tensor(std::vector<int64_t>{0, 4, 2, 1}, {4});
  int64_t count = 0;
  auto ref = naive_ce(vec(x), x.shape(), {0, 4, 2, 1}, -100, 0.2, count);
  check_close(cross_entropy(x, t, {.label_smoothing = 0.2, .reduction = Reduction::None}), ref, 1e-12, 1e-12);
  Tensor x1 = x.select(0, 1);
  Tensor l1 = cross_entropy(x1, tensor(std::vector<int64_t>{4}, {}), {.label_smoothing = 0.2});
  CHECK(l1.dim() == 0);
  check_close(l1, {ref[1]}, 1e-12, 1e-12);
}

TEST_CASE("cross_entropy: large float32 logits keep their precision (loss and gradient)") {
  Tensor x = (randn64({4, 6}, false, 56) * 3.0 + 1000.0).to(kFloat32);
  x.set_requires_grad(true);
  std::vector<int64_t> tv{0, 5, 2, 3};
  Tensor t = tensor(tv, {4});
  int64_t count = 0;
  auto xv = vec(x);
  auto ref = naive_ce(xv, x.shape(), tv, -100, 0.1, count);
  Tensor l = cross_entropy(x, t, {.label_smoothing = 0.1, .reduction = Reduction::None});
  check_close(l, ref, 2e-6, 2e-6);
  sum(l).backward();
  std::vector<double> gref(24);
  for (int r = 0; r < 4; ++r) {
    auto p = naive_softmax(std::vector<double>(xv.begin() + r * 6, xv.begin() + r * 6 + 6), {6}, 0, {}, false);
    for (int c = 0; c < 6; ++c) gref[r * 6 + c] = p[c] - 0.1 / 6 - (c == tv[r] ? 0.9 : 0.0);
  }
  check_close(x.grad(), gref, 1e-6, 1e-5);
}

TEST_CASE("cross_entropy: all targets ignored gives 0 with zero gradient") {
  Tensor x = randn64({3, 4}, true, 61);
  Tensor t = tensor(std::vector<int64_t>{-100, -100, -100}, {3});
  Tensor l = cross_entropy(x, t);
  CHECK(l.item<double>() == 0.0);
  l.backward();
  check_close(x.grad(), std::vector<double>(12, 0.0), 0);
  check_close(cross_entropy(x, t, {.reduction = Reduction::Sum}), {0.0}, 0);
}

TEST_CASE("cross_entropy gradcheck w.r.t. logits") {
  Tensor t2 = tensor(std::vector<int64_t>{0, 3, -100, 2, 1}, {5});
  Tensor t4 = tensor(std::vector<int64_t>{0, 2, 1, 3, -100, 2, 1, 1, 0, 3, 3, 2}, {2, 3, 2});
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    for (double s : {0.0, 0.15}) {
      CAPTURE(s);
      check_grad(
          [&](const TensorList& in) {
            return TensorList{cross_entropy(in[0], t2, {.label_smoothing = s, .reduction = red})};
          },
          {randn64({5, 4}, true, 71)});
      check_grad(
          [&](const TensorList& in) {
            return TensorList{cross_entropy(in[0], t4, {.label_smoothing = s, .reduction = red})};
          },
          {randn64({2, 4, 3, 2}, true, 72)});
      // Non-contiguous logits.
      check_grad(
          [&](const TensorList& in) {
            return TensorList{cross_entropy(in[0].t(), t2, {.label_smoothing = s, .reduction = red})};
          },
          {randn64({4, 5}, true, 73)});
    }
}

TEST_CASE("cross_entropy errors") {
  Tensor x = randn64({3, 4});
  check_error(
      [&] {
        cross_entropy(x, tensor(std::vector<int64_t>{0, 4, 1}, {3}));
      },
      {"cross_entropy", "target value 4", "4 classes"});
  check_error(
      [&] {
        cross_entropy(x, tensor(std::vector<int64_t>{0, -1, 1}, {3}));
      },
      {"cross_entropy", "target value -1", "4 classes"});
  check_error([&] { cross_entropy(x, tensor(std::vector<int64_t>{0, 1}, {2})); }, {"cross_entropy", "[2]", "[3, 4]"});
  check_error([&] { cross_entropy(x, randn64({3})); }, {"cross_entropy", "int64", "float64"});
  check_error(
      [&] {
        cross_entropy(x, tensor(std::vector<int64_t>{0, 1, 1}, {3}), {.label_smoothing = 1.5});
      },
      {"cross_entropy", "label_smoothing", "1.5"});
  check_error(
      [&] {
        cross_entropy(randn64({2, 3, 4}), tensor(std::vector<int64_t>{0, 1}, {2}));
      },
      {"cross_entropy", "[2]", "[2, 3, 4]", "[2, 4]"});
}

// ---- mse_loss --------------------------------------------------------------------------------------------------

TEST_CASE("mse_loss vs naive, reductions, gradcheck, errors") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor a = randn_dt({4, 5}, dt, 81), b = randn_dt({5, 4}, dt, 82).t();  // b non-contiguous
    auto av = vec(a), bv = vec(b);
    std::vector<double> ref(av.size());
    double total = 0;
    for (size_t i = 0; i < av.size(); ++i) total += ref[i] = (av[i] - bv[i]) * (av[i] - bv[i]);
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    check_close(mse_loss(a, b, Reduction::None), ref, tol, tol);
    check_close(mse_loss(a, b, Reduction::Sum), {total}, tol, tol);
    check_close(mse_loss(a, b), {total / 20}, tol, tol);
  }
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    check_grad([&](const TensorList& in) { return TensorList{mse_loss(in[0], in[1], red)}; },
               {randn64({3, 4}, true, 83), randn64({3, 4}, true, 84)});
  check_error([&] { mse_loss(randn64({3, 4}), randn64({4})); }, {"mse_loss", "[3, 4]", "[4]"});
  check_error([&] { mse_loss(randn64({3, 1}), randn64({3, 4})); }, {"mse_loss", "[3, 1]", "[3, 4]"});
}

// ---- layer_norm / rms_norm -------------------------------------------------------------------------------------

namespace {

// Normalise each row of `n` trailing elements.
std::vector<double> naive_norm(const std::vector<double>& x, int64_t n, const std::vector<double>& w,
                               const std::vector<double>& b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r * n < x.size(); ++r) {
    const double* xr = x.data() + r * n;
    double mu = 0, ss = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= n;
    }
    for (int64_t j = 0; j < n; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
    double rs = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = (xr[j] - mu) * rs * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
  }
  return y;
}

}  // namespace

TEST_CASE("layer_norm / rms_norm forward vs naive") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-11 : 3e-5;
    for (bool rms : {false, true}) {
      CAPTURE(rms);
      for (Shape ns : {Shape{6}, Shape{3, 6}}) {
        Tensor x = randn_dt({2, 3, 6}, dt, 91) * 2.0 + 1.0;
        Tensor w = randn_dt(ns, dt, 92), b = randn_dt(ns, dt, 93);
        const int64_t n = numel_of(ns);
        for (int variant = 0; variant < 4; ++variant) {
          CAPTURE(variant);
          Tensor wv = (variant & 1) ? w : Tensor();
          Tensor bv = (variant & 2) ? b : Tensor();
          if (rms && bv.defined()) continue;
          Tensor y = rms ? rms_norm(x, ns, wv, 1e-5) : layer_norm(x, ns, wv, bv, 1e-5);
          CHECK(y.shape() == x.shape());
          check_close(y,
                      naive_norm(vec(x), n, wv.defined() ? vec(wv) : std::vector<double>{},
                                 bv.defined() ? vec(bv) : std::vector<double>{}, 1e-5, rms),
                      tol, tol);
        }
      }
      // Non-contiguous input: normalise over the last dim of a transposed view; a long row.
      Tensor xt = randn_dt({7, 4}, dt, 94).t();  // (4, 7)
      Tensor w = randn_dt({7}, dt, 95);
      check_close(rms ? rms_norm(xt, {7}, w) : layer_norm(xt, {7}, w),
                  naive_norm(vec(xt), 7, vec(w), {}, rms ? 1e-6 : 1e-5, rms), tol, tol);
      Tensor xl = randn_dt({3, 1001}, dt, 96);
      check_close(rms ? rms_norm(xl, {1001}) : layer_norm(xl, {1001}),
                  naive_norm(vec(xl), 1001, {}, {}, rms ? 1e-6 : 1e-5, rms), tol * 10, tol * 10);
    }
  }
}

TEST_CASE("layer_norm / rms_norm gradcheck w.r.t. x, weight, bias") {
  check_grad([](const TensorList& in) { return TensorList{layer_norm(in[0], {5}, in[1], in[2])}; },
             {randn64({3, 5}, true, 101), randn64({5}, true, 102), randn64({5}, true, 103)});
  check_grad(
      [](const TensorList& in) {
        return TensorList{layer_norm(in[0], {2, 4}, in[1], in[2], 1e-3)};
      },
      {randn64({3, 2, 4}, true, 104), randn64({2, 4}, true, 105), randn64({2, 4}, true, 106)});
  check_grad([](const TensorList& in) { return TensorList{layer_norm(in[0], {4})}; }, {randn64({2, 3, 4}, true, 107)});
  check_grad([](const TensorList& in) { return TensorList{layer_norm(in[0].t(), {3}, in[1])}; },
             {randn64({3, 4}, true, 108), randn64({3}, true, 109)});
  check_grad([](const TensorList& in) { return TensorList{rms_norm(in[0], {5}, in[1])}; },
             {randn64({3, 5}, true, 111), randn64({5}, true, 112)});
  check_grad(
      [](const TensorList& in) {
        return TensorList{rms_norm(in[0], {2, 3}, in[1], 1e-3)};
      },
      {randn64({2, 2, 3}, true, 113), randn64({2, 3}, true, 114)});
  check_grad([](const TensorList& in) { return TensorList{rms_norm(in[0], {4})}; }, {randn64({3, 4}, true, 115)});
  // Only the weight requires grad.
  Tensor x = randn64({3, 5}, false, 116);
  check_grad([&](const TensorList& in) { return TensorList{layer_norm(x, {5}, in[0], in[1])}; },
             {randn64({5}, true, 117), randn64({5}, true, 118)});
}

TEST_CASE("layer_norm / rms_norm errors") {
  Tensor x = randn64({2, 3, 4});
  check_error([&] { layer_norm(x, {3}); }, {"layer_norm", "[3]", "[2, 3, 4]"});
  check_error([&] { rms_norm(x, {2, 3, 4, 5}); }, {"rms_norm", "[2, 3, 4, 5]", "[2, 3, 4]"});
  check_error([&] { layer_norm(x, {4}, randn64({3})); }, {"layer_norm", "weight", "[3]", "[4]"});
  check_error([&] { layer_norm(x, {4}, Tensor(), randn64({4, 1})); }, {"layer_norm", "bias", "[4, 1]"});
  check_error([&] { rms_norm(x, {4}, randn32({4})); }, {"rms_norm", "weight", "float32", "float64"});
  check_error([&] { layer_norm(x, {}); }, {"layer_norm", "normalized_shape", "empty"});
}

// ---- dropout ---------------------------------------------------------------------------------------------------

TEST_CASE("dropout: generator-driven mask, scaling, identities") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn_dt({40, 50}, dt, 121) + 5.0;  // all entries far from 0
    Generator g1(7), g2(7), g3(8);
    Tensor a = dropout(x, 0.3, true, &g1), b = dropout(x, 0.3, true, &g2), c = dropout(x, 0.3, true, &g3);
    auto av = vec(a), bv = vec(b), cv = vec(c), xv = vec(x);
    CHECK(av == bv);
    CHECK(av != cv);
    // The mask is rand(shape, {dtype}, gen) >= p, drawn with the same generator state.
    Generator g4(7);
    auto u = vec(rand(x.shape(), {.dtype = dt}, &g4));
    int64_t zeros = 0;
    for (size_t i = 0; i < av.size(); ++i) {
      double expect = u[i] >= 0.3 ? xv[i] / 0.7 : 0.0;
      CHECK(std::abs(av[i] - expect) <= 1e-5 * std::abs(expect));
      zeros += av[i] == 0.0;
    }
    CHECK(zeros > 2000 * 0.25);
    CHECK(zeros < 2000 * 0.35);
    CHECK(dropout(x, 0.0).is_same(x));
    CHECK(dropout(x, 0.5, false).is_same(x));
    check_close(dropout(x, 1.0), std::vector<double>(2000, 0.0), 0);
  }
  // Non-contiguous input.
  Tensor xt = randn64({6, 5}, false, 122).t();
  Generator g(9), h(9);
  auto y = vec(dropout(xt, 0.5, true, &g));
  auto u = vec(rand(xt.shape(), {.dtype = kFloat64}, &h));
  auto xv = vec(xt);
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y[i] - (u[i] >= 0.5 ? 2 * xv[i] : 0.0)) < 1e-12);
  check_error([] { dropout(randn64({2}), 1.5); }, {"dropout", "1.5"});
  check_error([] { dropout(randn64({2}), -0.1); }, {"dropout", "-0.1"});
}

TEST_CASE("dropout float32: the vectorised mask of a long tensor is rand() >= p exactly, at any stream offset") {
  // 100003 elements: many groups of 8 Philox blocks, split across threads, a partial last group; the generator has
  // already drawn (an odd offset), so groups do not start at a multiple of 8 blocks.
  const int64_t n = 100003;
  Tensor x = full({n}, 1.0, {.dtype = kFloat32});
  Generator g(11), h(11);
  rand({5}, {}, &g), rand({5}, {}, &h);  // offset 2 blocks
  const std::vector<float> y = dropout(x, 0.25, true, &g).to_vector<float>();
  // the expected mask from the Philox stream itself (core/generator.h), not from another kernel
  const uint64_t offset = h.offset();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = uint_to_unit_float(philox4x32(11, offset + static_cast<uint64_t>(i / 4))[i % 4]);
    wrong += y[i] != (u >= 0.25f ? 1.0f / 0.75f : 0.0f);
  }
  CHECK(wrong == 0);
}

TEST_CASE("dropout: the fused pass's gradient is its mask; NaN in gives NaN out, kept or dropped") {
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    Tensor x = (randn_dt({1001}, dt, 125) + 5.0).detach().set_requires_grad();  // odd length: a partial vector
    Generator g(3), h(3);
    Tensor y = dropout(x, 0.4, true, &g);
    y.sum().backward();
    const auto u = vec(rand(x.shape(), {.dtype = dt}, &h)), gx = vec(x.grad()), yv = vec(y), xv = vec(x);
    for (size_t i = 0; i < u.size(); ++i) {
      const double keep = u[i] >= 0.4 ? (dt == kFloat32 ? double(static_cast<float>(1.0 / 0.6)) : 1.0 / 0.6) : 0.0;
      CHECK(gx[i] == keep);
      CHECK(std::abs(yv[i] - xv[i] * keep) <= 1e-6 * std::abs(xv[i] * keep));
    }
    Tensor xn = full({64}, std::numeric_limits<double>::quiet_NaN(), {.dtype = dt});
    CHECK(sum(isnan(dropout(xn, 0.5, true, &g)).to(kFloat64)).item<double>() == 64.0);
  }
}

TEST_CASE("dropout gradcheck with a fixed generator") {
  check_grad(
      [](const TensorList& in) {
        Generator g(1234);
        return TensorList{dropout(in[0], 0.4, true, &g)};
      },
      {randn64({4, 6}, true, 131)});
  check_grad([](const TensorList& in) { return TensorList{dropout(in[0], 1.0)}; }, {randn64({3}, true, 132)});
}

// ---- bias_activation_dropout ---------------------------------------------------------------------------------------

namespace {
Tensor composed(const Tensor& x, const Tensor& b, Activation act, double p, bool training, Generator* g) {
  Tensor z = b.defined() ? x + b : x;
  z = act == Activation::Gelu       ? gelu(z)
      : act == Activation::GeluTanh ? gelu(z, true)
      : act == Activation::Relu     ? relu(z)
                                    : silu(z);
  return dropout(z, p, training, g);
}
}  // namespace

TEST_CASE("bias_activation_dropout is dropout(act(x + bias)) drawn the same: values, mask, gradients, generator") {
  const Activation acts[] = {Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Silu};
  // long rows (vector loops and remainders), rows shorter than a chunk of uniforms, a 3-D input, one column
  const Shape shapes[] = {{37, 129}, {3, 5, 67}, {2, 1500}, {41, 1}};
  uint64_t seed = 300;
  for (DType dt : {kFloat32, kFloat64})
    for (const Shape& shape : shapes)
      for (Activation act : acts)
        for (double p : {0.0, 0.3, 1.0})
          for (bool with_bias : {true, false}) {
            const int act_id = static_cast<int>(act);
            CAPTURE(dt);
            CAPTURE(shape);
            CAPTURE(act_id);
            CAPTURE(p);
            CAPTURE(with_bias);
            Tensor x = randn_dt(shape, dt, ++seed).set_requires_grad();
            Tensor b = with_bias ? randn_dt({shape.back()}, dt, ++seed).set_requires_grad() : Tensor();
            Tensor gy = randn_dt(shape, dt, ++seed);
            Generator g1(seed), g2(seed);
            Tensor y1 = bias_activation_dropout(x, b, act, p, true, &g1);
            Tensor y2 = composed(x, b, act, p, true, &g2);
            TensorList in = with_bias ? TensorList{x, b} : TensorList{x};
            TensorList d1 = autograd::grad({y1}, in, {gy}), d2 = autograd::grad({y2}, in, {gy});
            // float32: the composed ops' operations in their order, so their bits; float64 within rounding (the
            // composed rows run FMA-contracted at x86-64-v3 and above)
            const double tol = dt == kFloat32 ? 0.0 : 1e-13;
            check_close(y1, y2, tol, tol);
            check_close(d1[0], d2[0], tol, tol);
            if (with_bias) check_close(d1[1], d2[1], 1e-12, dt == kFloat32 ? 1e-6 : 1e-12);
            // the generator is left where dropout leaves it
            CHECK(vec(rand({3}, {}, &g1)) == vec(rand({3}, {}, &g2)));
          }
  // outside training (or p = 0): act(x + bias), nothing drawn
  Tensor x = randn_dt({6, 9}, kFloat32, 401), b = randn_dt({9}, kFloat32, 402);
  Generator g(5), h(5);
  check_close(bias_activation_dropout(x, b, Activation::Gelu, 0.5, false, &g), gelu(x + b), 0, 0);
  CHECK(vec(rand({2}, {}, &g)) == vec(rand({2}, {}, &h)));
  // a transposed input gives the numbers its contiguous copy gives
  Tensor xt = randn_dt({9, 6}, kFloat32, 403).t();
  Generator g3(6), g4(6);
  check_close(bias_activation_dropout(xt, b, Activation::Silu, 0.2, true, &g3),
              bias_activation_dropout(xt.contiguous(), b, Activation::Silu, 0.2, true, &g4), 0, 0);
}

TEST_CASE("bias_activation_dropout: NaN stays NaN kept or dropped; empty input; 16-bit floats compose the ops") {
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    Tensor xn = full({4, 16}, std::numeric_limits<double>::quiet_NaN(), {.dtype = dt});
    Tensor b = zeros({16}, {.dtype = dt});
    Generator g(11);
    for (double p : {0.5, 1.0})
      CHECK(sum(isnan(bias_activation_dropout(xn, b, Activation::Gelu, p, true, &g)).to(kFloat64)).item<double>() ==
            64.0);
    Tensor e = bias_activation_dropout(zeros({0, 16}, {.dtype = dt}), b, Activation::Relu, 0.5, true, &g);
    CHECK(e.shape() == Shape{0, 16});
    // empty rows, and rows of no columns: the backward gives empty gradients too
    for (const Shape& shape : {Shape{0, 16}, Shape{3, 0}}) {
      Tensor xe = zeros(shape, {.dtype = dt}).set_requires_grad();
      Tensor be = zeros({shape.back()}, {.dtype = dt}).set_requires_grad();
      sum(bias_activation_dropout(xe, be, Activation::Gelu, 0.5, true, &g)).backward();
      CHECK(xe.grad().shape() == shape);
      CHECK(be.grad().shape() == Shape{shape.back()});
    }
  }
  // 16-bit floats compose the three ops (the GPU runs them; the CPU's elementwise ops refuse them clearly)
  Tensor xb = randn_dt({4, 8}, kFloat32, 404).to(kBFloat16), bb = randn_dt({8}, kFloat32, 405).to(kBFloat16);
  check_error([&] { bias_activation_dropout(xb, bb, Activation::Gelu, 0.25); }, {"bfloat16", "not supported"});
}

TEST_CASE("bias_activation_dropout gradcheck and errors (nothing drawn on error)") {
  for (Activation act : {Activation::Gelu, Activation::GeluTanh, Activation::Silu})
    check_grad(
        [act](const TensorList& in) {
          Generator g(77);
          return TensorList{bias_activation_dropout(in[0], in[1], act, 0.4, true, &g)};
        },
        {randn64({5, 7}, true, 406), randn64({7}, true, 407)});
  Generator g(13), h(13);
  const Tensor x = randn64({3, 4}), b = randn64({4});
  check_error([&] { bias_activation_dropout(x, randn64({3}), Activation::Gelu, 0.1, true, &g); }, {"bias", "[3]"});
  check_error([&] { bias_activation_dropout(x, b.to(kFloat32), Activation::Gelu, 0.1, true, &g); }, {"dtype"});
  check_error([&] { bias_activation_dropout(x, b, Activation::Gelu, 1.5, true, &g); }, {"1.5"});
  check_error([&] { bias_activation_dropout(randn64({}), Tensor(), Activation::Gelu, 0.1, true, &g); }, {"at least 1"});
  check_error([&] { bias_activation_dropout(x, b, static_cast<Activation>(9), 0.1, true, &g); }, {"activation"});
  check_error(
      [&] {
        bias_activation_dropout(full({3, 4}, 1.0, {.dtype = kInt64}), b, Activation::Gelu, 0.1);
      },
      {"bias_activation_dropout"});
  CHECK(vec(rand({2}, {}, &g)) == vec(rand({2}, {}, &h)));
}

// ---- linear ----------------------------------------------------------------------------------------------------

TEST_CASE("linear vs naive, gradcheck, errors") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    Tensor x = randn_dt({2, 3, 4}, dt, 141), w = randn_dt({5, 4}, dt, 142), b = randn_dt({5}, dt, 143);
    for (bool with_bias : {false, true}) {
      Tensor xin = x;
      for (int variant = 0; variant < 2; ++variant) {
        if (variant == 1) xin = randn_dt({4, 3, 2}, dt, 144).permute({2, 1, 0});  // non-contiguous (2, 3, 4)
        auto xv = vec(xin), wv = vec(w), bv = vec(b);
        std::vector<double> ref(30);
        for (int r = 0; r < 6; ++r)
          for (int o = 0; o < 5; ++o) {
            double s = with_bias ? bv[o] : 0.0;
            for (int i = 0; i < 4; ++i) s += xv[r * 4 + i] * wv[o * 4 + i];
            ref[r * 5 + o] = s;
          }
        Tensor y = linear(xin, w, with_bias ? b : Tensor());
        CHECK(y.shape() == Shape{2, 3, 5});
        check_close(y, ref, tol, tol);
      }
    }
    // 1-D input.
    Tensor x1 = randn_dt({4}, dt, 145);
    Tensor y1 = linear(x1, w, b);
    CHECK(y1.shape() == Shape{5});
    check_close(y1, linear(x1.unsqueeze(0), w, b).squeeze(0), tol, tol);
  }
  check_grad([](const TensorList& in) { return TensorList{linear(in[0], in[1], in[2])}; },
             {randn64({2, 3, 4}, true, 151), randn64({5, 4}, true, 152), randn64({5}, true, 153)});
  check_grad([](const TensorList& in) { return TensorList{linear(in[0], in[1])}; },
             {randn64({3, 4}, true, 154), randn64({2, 4}, true, 155)});
  Tensor x = randn64({3, 4});
  check_error([&] { linear(x, randn64({5, 3})); }, {"linear", "[3, 4]", "[5, 3]"});
  check_error([&] { linear(x, randn64({4})); }, {"linear", "weight", "[4]"});
  check_error([&] { linear(x, randn64({5, 4}), randn64({4})); }, {"linear", "bias", "[4]"});
  check_error([&] { linear(x, randn32({5, 4})); }, {"linear", "float32", "float64"});
  // addmm, what linear runs with a bias: each bad argument named, nothing computed
  const Tensor w = randn64({4, 5}), bias = randn64({5});
  check_error([&] { addmm(bias, x, randn64({3, 5})); }, {"addmm", "inner", "[3, 4]", "[3, 5]"});
  check_error([&] { addmm(randn64({4}), x, w); }, {"addmm", "bias", "[4]", "(5)"});
  check_error([&] { addmm(randn64({1, 5}), x, w); }, {"addmm", "bias", "[1, 5]"});
  check_error([&] { addmm(bias, x.unsqueeze(0), w); }, {"addmm", "2-D", "[1, 3, 4]"});
  check_error([&] { addmm(randn32({5}), x, w); }, {"addmm", "float32", "float64"});
  check_error([&] { addmm(Tensor(), x, w); }, {"addmm", "bias"});
  // empty products: no rows, or K = 0 (every row is the bias)
  CHECK(addmm(bias, randn64({0, 4}), w).shape() == Shape{0, 5});
  check_close(addmm(bias, randn64({3, 0}), randn64({0, 5})), bias.expand({3, 5}), 0, 0);
}

// ---- large inputs: the row-parallel paths, forward and backward, against composites of elementwise ops ----------

TEST_CASE("large inputs (parallel kernels) match composite autograd references") {
  const int64_t R = 96, N = 384;  // R * N * cost is above the parallel grain
  Tensor g = randn64({R, N}, false, 161);
  // softmax / log_softmax vs exp / sum / div / log
  for (bool log : {false, true}) {
    CAPTURE(log);
    Tensor x = randn64({R, N}, true, 162), xr = x.detach().clone().set_requires_grad(true);
    Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
    Tensor e = exp(xr), z = sum(e, {1}, true);
    Tensor yr = log ? sub(xr, log_fn_guard(z)) : div(e, z);
    check_close(y, yr, 1e-12, 1e-10);
    sum(y * g).backward();
    sum(yr * g).backward();
    check_close(x.grad(), xr.grad(), 1e-12, 1e-9);
  }
  // layer_norm / rms_norm with weight and bias vs mean / sub / mul / sqrt
  for (bool rms : {false, true}) {
    CAPTURE(rms);
    Tensor x = randn64({R, N}, true, 163), w = randn64({N}, true, 164), b = randn64({N}, true, 165);
    Tensor xr = x.detach().clone().set_requires_grad(true), wr = w.detach().clone().set_requires_grad(true),
           br = b.detach().clone().set_requires_grad(true);
    Tensor y = rms ? rms_norm(x, {N}, w, 1e-5) : layer_norm(x, {N}, w, b, 1e-5);
    Tensor c = rms ? xr : sub(xr, mean(xr, {1}, true));
    Tensor yr = mul(div(c, sqrt(add(mean(mul(c, c), {1}, true), 1e-5))), wr);
    if (!rms) yr = add(yr, br);
    check_close(y, yr, 1e-12, 1e-10);
    sum(y * g).backward();
    sum(yr * g).backward();
    check_close(x.grad(), xr.grad(), 1e-11, 1e-8);
    check_close(w.grad(), wr.grad(), 1e-11, 1e-8);
    if (!rms) check_close(b.grad(), br.grad(), 1e-11, 1e-8);
  }
  // cross_entropy (mean, smoothing, some ignored) vs log_softmax-free composite
  {
    Tensor x = randn64({R, N}, true, 166), xr = x.detach().clone().set_requires_grad(true);
    Generator gen(167);
    std::vector<int64_t> tv = randint(0, N, {R}, {.dtype = kInt64}, &gen).to_vector<int64_t>();
    for (int i = 0; i < R; i += 7) tv[i] = -100;
    Tensor t = tensor(tv, {R});
    const double s = 0.05;
    Tensor l = cross_entropy(x, t, {.label_smoothing = s});
    // q as a dense tensor, zero rows for ignored targets; loss = -sum q * (x - lse) / count
    std::vector<double> q(static_cast<size_t>(R * N), 0.0);
    int64_t count = 0;
    for (int64_t r = 0; r < R; ++r) {
      if (tv[r] == -100) continue;
      ++count;
      for (int64_t c = 0; c < N; ++c) q[r * N + c] = s / N + (c == tv[r] ? 1.0 - s : 0.0);
    }
    Tensor lse = log_fn_guard(sum(exp(xr), {1}, true));
    Tensor lr = div(neg(sum(mul(tensor(q, {R, N}), sub(xr, lse)))), static_cast<double>(count));
    check_close(l, lr, 1e-12, 1e-10);
    l.backward();
    lr.backward();
    check_close(x.grad(), xr.grad(), 1e-13, 1e-9);
  }
}

TEST_CASE("NaN propagates; empty inputs work") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = tensor({1.0, nan, 2.0, 0.5, 1.5, -1.0}, {2, 3}, {.dtype = dt});
    for (bool log : {false, true}) {
      auto y = vec(log ? log_softmax(x, 1) : softmax(x, 1));
      for (int j = 0; j < 3; ++j) CHECK(std::isnan(y[j]));
      for (int j = 3; j < 6; ++j) CHECK(std::isfinite(y[j]));
    }
    auto l = vec(cross_entropy(x, tensor(std::vector<int64_t>{0, 1}, {2}), {.reduction = Reduction::None}));
    CHECK(std::isnan(l[0]));
    CHECK(std::isfinite(l[1]));
    CHECK(std::isnan(vec(layer_norm(x, {3}))[0]));
  }
  CHECK(softmax(randn64({0, 3}), 1).shape() == Shape{0, 3});
  CHECK(log_softmax(randn64({3, 0}), 1).shape() == Shape{3, 0});
  CHECK(layer_norm(randn64({0, 4}), {4}).shape() == Shape{0, 4});
  CHECK(rms_norm(randn64({0, 4}), {4}).shape() == Shape{0, 4});
  Tensor x0 = randn64({0, 4}, true, 171);
  Tensor l0 = cross_entropy(x0, tensor(std::vector<int64_t>{}, {0}));
  CHECK(l0.item<double>() == 0.0);
  l0.backward();
  CHECK(x0.grad().shape() == Shape{0, 4});
}

TEST_CASE("float32 backward kernels agree with float64") {
  Tensor x64 = randn64({5, 33}, false, 181), g64 = randn64({5, 33}, false, 182), w64 = randn64({33}, false, 183);
  Tensor mask = gt(randn64({1, 33}, false, 184), -0.5);
  auto grads = [&](DType dt, int op) {
    Tensor x = x64.to(dt).detach().clone().set_requires_grad(true);
    Tensor w = w64.to(dt).detach().clone().set_requires_grad(true);
    Tensor y;
    switch (op) {
      case 0: y = softmax(x, 1, mask); break;
      case 1: y = where(mask, log_softmax(x, 1, mask), 0.0); break;
      case 2: y = layer_norm(x, {33}, w, w); break;
      default: y = rms_norm(x, {33}, w); break;
    }
    sum(y * g64.to(dt)).backward();
    return std::pair<Tensor, Tensor>{x.grad(), op >= 2 ? w.grad() : Tensor()};
  };
  for (int op = 0; op < 4; ++op) {
    CAPTURE(op);
    auto [gx32, gw32] = grads(kFloat32, op);
    auto [gx64, gw64] = grads(kFloat64, op);
    check_close(gx32, gx64, 2e-5, 2e-4);
    if (op >= 2) check_close(gw32, gw64, 2e-5, 2e-4);
  }
}
