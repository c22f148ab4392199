// The calls docs/pytorch.md listed as gaps and that are now filled: prod, any / all (ops/reduce.h), tril / triu
// (ops/elementwise.h), scatter (ops/index.h), nll_loss and nn::NLLLoss (ops/nn_functional.h, nn/loss.h), multinomial,
// eye(n, m), rand_like / randn_like and Tensor::add_(double) (core/tensor.h), nn::Flatten, nn::Softmax,
// nn::LogSoftmax and nn::ModuleDict (nn/layers.h), Module::apply (nn/module.h) and cuda::is_bf16_supported
// (cuda/cuda.h). Forward results against naive float64 loops over std::vector (never the op as its own reference),
// gradients against hand-derived values and float64 gradcheck, sampling against its probabilities within 5 standard
// errors, and the errors. DistributedDataParallel::no_sync is tested with the other 2-rank cases in
// tests/test_distributed.cpp; the op table (tests/op_table.cpp) holds the entries the parity, ISA and fuzz tests read.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "nn/nn.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

int wrap(int64_t dim, int rank) { return static_cast<int>(dim < 0 ? dim + rank : dim); }

// The elements of x (read as double) grouped along `dim`: one group per output position, in row-major order of the
// other dims; each group in order along dim. An empty dim gives empty groups.
std::vector<std::vector<double>> groups_along(const Tensor& x, int64_t dim) {
  const Shape s = x.shape();
  const int d = wrap(dim, s.size());
  const std::vector<double> v = vec(x);
  Shape kept = s;
  kept[d] = 1;
  std::vector<std::vector<double>> g(static_cast<size_t>(numel_of(kept)));
  for (int64_t f = 0; f < static_cast<int64_t>(v.size()); ++f) {
    auto idx = unravel(f, s);
    idx[static_cast<size_t>(d)] = 0;
    g[static_cast<size_t>(ravel(idx, kept))].push_back(v[static_cast<size_t>(f)]);
  }
  return g;
}

std::vector<double> naive_reduce(const Tensor& x, int64_t dim,
                                 const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> out;
  for (const auto& g : groups_along(x, dim)) out.push_back(f(g));
  return out;
}

Shape reduced_shape(const Shape& s, int64_t dim, bool keepdim) {
  const int d = wrap(dim, s.size());
  Shape out;
  for (int i = 0; i < s.size(); ++i) {
    if (i != d)
      out.push_back(s[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

double nprod(const std::vector<double>& v) {
  double p = 1;
  for (double a : v) p *= a;
  return p;
}
// NaN is non-zero (NaN != 0 is true, NaN == 0 false): it counts as true for both.
double nany(const std::vector<double>& v) {
  for (double a : v)
    if (a != 0) return 1;
  return 0;
}
double nall(const std::vector<double>& v) {
  for (double a : v)
    if (a == 0) return 0;
  return 1;
}

// Values near 1 (products of a few dozen stay O(1), so float32 is compared relatively, not against an atol).
Tensor near_one(const Shape& s, DType dt, uint64_t seed) {
  Tensor x = randn64(s, false, seed) * 0.3 + 1.0;
  return x.to(dt);
}

// tril (lower) / triu over the last two dims with plain loops.
std::vector<double> naive_tri(const Tensor& x, int64_t diagonal, bool lower) {
  const Shape s = x.shape();
  std::vector<double> v = vec(x);
  for (int64_t f = 0; f < static_cast<int64_t>(v.size()); ++f) {
    auto idx = unravel(f, s);
    const int64_t i = idx[idx.size() - 2], j = idx[idx.size() - 1];
    const bool keep = lower ? j - i <= diagonal : j - i >= diagonal;
    if (!keep) v[static_cast<size_t>(f)] = 0.0;
  }
  return v;
}

// out = x, then out[.., index[p], ..] = src[p] (or value) for every position p of index, in row-major order of p.
std::vector<double> naive_scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                                  double value = 0) {
  const int d = wrap(dim, x.dim());
  std::vector<double> out = vec(x);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  const std::vector<double> sv = src.defined() ? vec(src) : std::vector<double>();
  for (int64_t f = 0; f < index.numel(); ++f) {
    const auto p = unravel(f, index.shape());
    auto q = p;
    q[static_cast<size_t>(d)] = iv[static_cast<size_t>(f)];
    out[static_cast<size_t>(ravel(q, x.shape()))] =
        src.defined() ? sv[static_cast<size_t>(ravel(p, src.shape()))] : value;
  }
  return out;
}

// The values of x at index's positions along dim (torch.gather), with plain loops.
std::vector<double> naive_gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const int d = wrap(dim, x.dim());
  const std::vector<double> xv = vec(x);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  std::vector<double> out;
  for (int64_t f = 0; f < index.numel(); ++f) {
    auto p = unravel(f, index.shape());
    p[static_cast<size_t>(d)] = iv[static_cast<size_t>(f)];
    out.push_back(xv[static_cast<size_t>(ravel(p, x.shape()))]);
  }
  return out;
}

// An int64 index of shape `is` into x's dim `dim` (size n >= is[dim]) whose entries are distinct along dim: each line
// along dim takes the first is[dim] entries of its own random permutation of 0..n-1.
Tensor unique_index(int64_t n, const Shape& is, int64_t dim, uint64_t seed) {
  const int d = wrap(dim, is.size());
  REQUIRE(is[d] <= n);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> iv(static_cast<size_t>(numel_of(is)));
  Shape lines = is;
  lines[d] = 1;
  for (int64_t l = 0; l < numel_of(lines); ++l) {
    std::vector<int64_t> perm(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    auto p = unravel(l, lines);
    for (int64_t k = 0; k < is[d]; ++k) {
      p[static_cast<size_t>(d)] = k;
      iv[static_cast<size_t>(ravel(p, is))] = perm[static_cast<size_t>(k)];
    }
  }
  return tensor(iv, is);
}

// nll_loss with plain loops: x (N, C, d...) flat, t (N, d...) flat; w empty: every class 1. Returns the per-position
// losses (0 where ignored) and adds the weights of the targets counted to *weight_sum.
std::vector<double> naive_nll(const std::vector<double>& x, const Shape& xs, const std::vector<int64_t>& t,
                              const std::vector<double>& w, int64_t ignore, double* weight_sum) {
  const int64_t n = xs[0], c = xs[1];
  int64_t inner = 1;
  for (int i = 2; i < xs.size(); ++i) inner *= xs[i];
  std::vector<double> out(static_cast<size_t>(n * inner), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < inner; ++k) {
      const int64_t tgt = t[static_cast<size_t>(i * inner + k)];
      if (tgt == ignore) continue;
      const double wt = w.empty() ? 1.0 : w[static_cast<size_t>(tgt)];
      out[static_cast<size_t>(i * inner + k)] = -wt * x[static_cast<size_t>((i * c + tgt) * inner + k)];
      *weight_sum += wt;
    }
  return out;
}

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Draw frequencies of categories 0..c-1 in `draws`.
std::vector<double> frequencies(const std::vector<int64_t>& draws, int64_t c) {
  std::vector<double> f(static_cast<size_t>(c), 0.0);
  for (int64_t v : draws) {
    REQUIRE(v >= 0);
    REQUIRE(v < c);
    f[static_cast<size_t>(v)] += 1.0;
  }
  for (double& a : f) a /= static_cast<double>(draws.size());
  return f;
}

// Each observed frequency within 5 standard errors of its probability (binomial: sqrt(p (1 - p) / n)); a
// probability of 0 must never be drawn.
void check_frequencies(const std::vector<double>& freq, const std::vector<double>& p, int64_t n) {
  REQUIRE(freq.size() == p.size());
  for (size_t c = 0; c < p.size(); ++c) {
    CAPTURE(c);
    if (p[c] == 0) {
      CHECK(freq[c] == 0.0);
      continue;
    }
    const double se = std::sqrt(p[c] * (1 - p[c]) / static_cast<double>(n));
    CHECK_MESSAGE(std::abs(freq[c] - p[c]) <= 5 * se, "frequency " << freq[c] << ", probability " << p[c]);
  }
}

std::vector<double> normalised(std::vector<double> w) {
  const double s = total(w);
  for (double& a : w) a /= s;
  return w;
}

}  // namespace

// ---- prod --------------------------------------------------------------------------------------------------------

TEST_CASE("prod: all elements and along each dim vs naive loops, keepdim, negative dim, views, float32/float64") {
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    const Tensor base = near_one({3, 4, 5}, dt, 11);
    for (const Tensor& x : {base, base.transpose(0, 2), base.slice(1, 0, 4, 2).slice(2, 1, 5, 1)}) {
      CAPTURE(dt);
      CAPTURE(x.shape());
      const Tensor all_p = prod(x);
      CHECK(all_p.dim() == 0);
      CHECK(all_p.dtype() == dt);
      check_close(all_p, {nprod(vec(x))}, tol, tol);
      for (int64_t d : {0, 1, 2, -1, -2, -3})
        for (bool keepdim : {false, true}) {
          CAPTURE(d);
          CAPTURE(keepdim);
          const Tensor p = prod(x, d, keepdim);
          CHECK(p.shape() == reduced_shape(x.shape(), d, keepdim));
          CHECK(p.dtype() == dt);
          check_close(p, naive_reduce(x, d, nprod), tol, tol);
        }
    }
  }
  // Signs and magnitudes of plain normal values, and a long row.
  const Tensor y = randn64({7, 33}, false, 12);
  check_close(prod(y, 1), naive_reduce(y, 1, nprod), 1e-300, 1e-12);
  check_close(prod(y, 0, true), naive_reduce(y, 0, nprod), 1e-300, 1e-12);
}

TEST_CASE("prod: a 0-d input, an empty tensor gives 1, an empty dim gives ones, errors") {
  const Tensor s = scalar_tensor(-2.5, {.dtype = kFloat64});
  CHECK(prod(s).dim() == 0);
  CHECK(prod(s).item<double>() == -2.5);
  CHECK(prod(s, 0).dim() == 0);
  CHECK(prod(s, -1).item<double>() == -2.5);
  CHECK(prod(s, 0, true).item<double>() == -2.5);

  const Tensor e = zeros({0}, {.dtype = kFloat64});
  CHECK(prod(e).dim() == 0);
  CHECK(prod(e).dtype() == kFloat64);
  CHECK(prod(e).item<double>() == 1.0);
  const Tensor e3 = zeros({2, 0, 3}, {.dtype = kFloat32});
  CHECK(prod(e3).item<double>() == 1.0);
  CHECK(prod(e3, 1).shape() == Shape({2, 3}));
  check_close(prod(e3, 1), std::vector<double>(6, 1.0), 0, 0);
  CHECK(prod(e3, 1, true).shape() == Shape({2, 1, 3}));
  check_close(prod(e3, -2, true), std::vector<double>(6, 1.0), 0, 0);
  CHECK(prod(e3, 0).shape() == Shape({0, 3}));
  CHECK(prod(e3, 2).shape() == Shape({2, 0}));
  CHECK(prod(zeros({0, 2}, {.dtype = kInt64})).dtype() == kInt64);
  CHECK(prod(zeros({0, 2}, {.dtype = kInt64})).item<int64_t>() == 1);

  const Tensor x = randn64({2, 3, 4});
  check_error([&] { prod(x, 3); }, {"prod", "3"});
  check_error([&] { prod(x, -4); }, {"prod", "-4"});
  check_error([] { prod(Tensor()); }, {"prod"});
}

TEST_CASE("prod: int64 and bool inputs give int64 (exact beyond 2^53); NaN and infinities propagate") {
  const Tensor i = tensor(std::vector<int64_t>{2, -3, 1, 4, 5, -1}, {2, 3});
  CHECK(prod(i).dtype() == kInt64);
  CHECK(prod(i).item<int64_t>() == 120);
  CHECK(prod(i, 1).dtype() == kInt64);
  CHECK(prod(i, 1).to_vector<int64_t>() == std::vector<int64_t>{-6, -20});
  CHECK(prod(i, 0, true).shape() == Shape({1, 3}));
  CHECK(prod(i, 0, true).to_vector<int64_t>() == std::vector<int64_t>{8, -15, -1});
  CHECK(prod(i.t(), 1).to_vector<int64_t>() == std::vector<int64_t>{8, -15, -1});
  // (2^31 + 11)(2^30 + 3) = 2^61 + 17 * 2^30 + 33: not a double, so only integer arithmetic gets it.
  const Tensor big = tensor(std::vector<int64_t>{(int64_t{1} << 31) + 11, (int64_t{1} << 30) + 3}, {2});
  CHECK(prod(big).item<int64_t>() == int64_t{2305843027467304993});
  CHECK(prod(big, 0).item<int64_t>() == int64_t{2305843027467304993});

  const Tensor b = gt(tensor({1, -1, 2, 3, 4, 5}, {2, 3}, {.dtype = kFloat64}), 0.0);  // {1, 0, 1}, {1, 1, 1}
  REQUIRE(b.dtype() == kBool);
  CHECK(prod(b).dtype() == kInt64);
  CHECK(prod(b).item<int64_t>() == 0);
  CHECK(prod(b, 1).dtype() == kInt64);
  CHECK(prod(b, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK(prod(b, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});

  const double nan = std::nan("");
  const Tensor n =
      tensor({1.0, nan, 3.0, 4.0, 0.0, nan, kInf, 2.0, kInf, 0.0, -kInf, 2.0}, {6, 2}, {.dtype = kFloat64});
  CHECK(std::isnan(prod(n).item<double>()));
  check_close(prod(n, 1), {nan, 12.0, nan, kInf, nan, -kInf}, 0, 0);  // inf * 0 is NaN, as IEEE
  for (DType dt : {kFloat32, kFloat64})
    CHECK(std::isnan(prod(tensor({2.0, nan, 0.0}, {3}, {.dtype = dt})).item<double>()));
}

TEST_CASE("prod: the gradient is exactly the product of the other elements, also with one zero and with two zeros") {
  const std::vector<std::vector<double>> cases = {
      {1.5, -2.0, 0.5, 3.0, -0.25}, {1.5, -2.0, 0.0, 3.0, -0.25}, {0.0, -2.0, 0.5, 0.0, -0.25}, {0.0}, {-4.0}};
  for (const auto& v : cases) {
    CAPTURE(v.size());
    std::vector<double> expected;
    for (size_t i = 0; i < v.size(); ++i) {
      double p = 1;
      for (size_t k = 0; k < v.size(); ++k)
        if (k != i) p *= v[k];
      expected.push_back(p);
    }
    Tensor x = tensor(v, {static_cast<int64_t>(v.size())});
    x.set_requires_grad(true);
    prod(x).backward();
    check_close(x.grad(), expected, 0, 1e-14);  // zeros exactly zero: no division by x
    Tensor x2 = tensor(v, {static_cast<int64_t>(v.size())});
    x2.set_requires_grad(true);
    prod(x2, 0).backward();
    check_close(x2.grad(), expected, 0, 1e-14);
  }
  // Along a dim: row 0 without zeros, row 1 with one, row 2 with two; the upstream gradient w scales each row.
  const std::vector<double> rows = {2.0, -1.5, 0.5, 4.0, 3.0, 0.0, -2.0, 1.25, 0.0, 7.0, 0.0, -3.0};
  Tensor x = tensor(rows, {3, 4});
  x.set_requires_grad(true);
  const std::vector<double> w = {0.5, -2.0, 3.0};
  (prod(x, 1) * tensor(w, {3})).sum().backward();
  std::vector<double> expected;
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 4; ++j) {
      double p = w[static_cast<size_t>(r)];
      for (int k = 0; k < 4; ++k)
        if (k != j) p *= rows[static_cast<size_t>(r * 4 + k)];
      expected.push_back(p);
    }
  check_close(x.grad(), expected, 0, 1e-14);
}

TEST_CASE("prod: gradcheck on inputs holding zeros, every dim and keepdim; the gradient of a transposed input") {
  std::vector<double> v = vec(randn64({3, 4}, false, 31));
  v[1] = 0.0;         // row 0: one zero
  v[5] = v[6] = 0.0;  // row 1: two zeros; column 1: zeros at rows 0 and 1
  Tensor x = tensor(v, {3, 4});
  x.set_requires_grad(true);
  check_grad([](const TensorList& in) { return TensorList{prod(in[0])}; }, {x});
  for (int64_t d : {0, 1, -1})
    for (bool keepdim : {false, true})
      check_grad([d, keepdim](const TensorList& in) { return TensorList{prod(in[0], d, keepdim)}; }, {x});
  check_grad([](const TensorList& in) { return TensorList{prod(in[0], 1)}; }, {randn64({2, 3, 5}, true, 32)});
  check_grad([](const TensorList& in) { return TensorList{prod(in[0].transpose(0, 2), 0)}; },
             {randn64({2, 3, 5}, true, 33)});

  // A transposed leaf: y = prod(x^T, 1) is the product down each column of x (4, 3).
  Tensor leaf = near_one({4, 3}, kFloat64, 34);
  leaf.set_requires_grad(true);
  const std::vector<double> lv = vec(leaf), w = {1.5, -0.5, 2.0};
  (prod(leaf.t(), 1) * tensor(w, {3})).sum().backward();
  std::vector<double> expected(12);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) {
      double p = w[static_cast<size_t>(j)];
      for (int k = 0; k < 4; ++k)
        if (k != i) p *= lv[static_cast<size_t>(k * 3 + j)];
      expected[static_cast<size_t>(i * 3 + j)] = p;
    }
  check_close(leaf.grad(), expected, 0, 1e-13);
  // A sliced (strided) leaf through the full product.
  Tensor wide = near_one({3, 8}, kFloat64, 35);
  wide.set_requires_grad(true);
  prod(wide.slice(1, 0, 8, 2)).backward();
  const std::vector<double> wv = vec(wide);
  std::vector<double> g(24, 0.0);
  for (int f = 0; f < 24; ++f) {
    if (f % 2) continue;  // odd columns are not read
    double p = 1;
    for (int k = 0; k < 24; k += 2)
      if (k != f) p *= wv[static_cast<size_t>(k)];
    g[static_cast<size_t>(f)] = p;
  }
  check_close(wide.grad(), g, 0, 1e-13);
}

// ---- any / all ---------------------------------------------------------------------------------------------------

TEST_CASE("any / all: with and without dim, keepdim, views vs naive; bool result; NaN counts as true, -0 as false") {
  Generator g(41);
  std::vector<double> v = vec(randint(-1, 2, {3, 4, 5}, {.dtype = kInt64}, &g));  // about a third zeros
  v[7] = std::nan("");
  v[8] = -0.0;
  v[33] = std::nan("");
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor base = tensor(v, {3, 4, 5}, {.dtype = dt});
    for (const Tensor& x : {base, base.transpose(0, 2), base.slice(2, 1, 5, 2)}) {
      CAPTURE(dt);
      CAPTURE(x.shape());
      const Tensor a = any(x), l = all(x);
      CHECK(a.dtype() == kBool);
      CHECK(l.dtype() == kBool);
      CHECK(a.dim() == 0);
      CHECK(a.item<bool>() == (nany(vec(x)) == 1));
      CHECK(l.item<bool>() == (nall(vec(x)) == 1));
      for (int64_t d : {0, 1, 2, -1})
        for (bool keepdim : {false, true}) {
          CAPTURE(d);
          CAPTURE(keepdim);
          const Tensor ad = any(x, d, keepdim), ld = all(x, d, keepdim);
          CHECK(ad.dtype() == kBool);
          CHECK(ld.dtype() == kBool);
          CHECK(ad.shape() == reduced_shape(x.shape(), d, keepdim));
          CHECK(ld.shape() == reduced_shape(x.shape(), d, keepdim));
          check_close(ad, naive_reduce(x, d, nany), 0, 0);
          check_close(ld, naive_reduce(x, d, nall), 0, 0);
        }
    }
  }
  const double nan = std::nan("");
  const Tensor t = tensor({0.0, nan, nan, 1.0, nan, 0.0, -0.0, 0.0}, {4, 2}, {.dtype = kFloat64});
  check_close(any(t, 1), {1, 1, 1, 0}, 0, 0);
  check_close(all(t, 1), {0, 1, 0, 0}, 0, 0);
  CHECK(any(ones({3})).item<bool>());
  CHECK(all(ones({3})).item<bool>());
  CHECK_FALSE(any(zeros({3})).item<bool>());
  CHECK_FALSE(all(tensor({1.0, 2.0, 0.0}, {3})).item<bool>());
  CHECK(all(tensor({nan, kInf, -kInf}, {3}, {.dtype = kFloat64})).item<bool>());
  CHECK_FALSE(any(tensor({0.0, -0.0}, {2}, {.dtype = kFloat64})).item<bool>());
  // A 0-d input; not differentiable: the result of an input requiring grad does not require grad.
  CHECK(any(scalar_tensor(0.5)).item<bool>());
  CHECK_FALSE(all(scalar_tensor(0.0)).item<bool>());
  const Tensor r = randn64({3, 4}, true, 42);
  CHECK_FALSE(any(r).requires_grad());
  CHECK_FALSE(all(r, 1).requires_grad());
}

TEST_CASE("any / all: empty input (any false, all true), bool and int64 inputs, errors") {
  CHECK_FALSE(any(zeros({0})).item<bool>());
  CHECK(all(zeros({0})).item<bool>());
  CHECK(any(zeros({0})).dtype() == kBool);
  const Tensor e = zeros({2, 0, 3});
  CHECK_FALSE(any(e).item<bool>());
  CHECK(all(e).item<bool>());
  CHECK(any(e, 1).shape() == Shape({2, 3}));
  check_close(any(e, 1), std::vector<double>(6, 0.0), 0, 0);
  check_close(all(e, 1), std::vector<double>(6, 1.0), 0, 0);
  CHECK(all(e, 1, true).shape() == Shape({2, 1, 3}));
  CHECK(any(e, 0).shape() == Shape({0, 3}));
  CHECK(all(e, 2).shape() == Shape({2, 0}));

  Generator g(43);
  const Tensor b = lt(rand({5, 6}, {.dtype = kFloat64}, &g), 0.6);  // bool
  const Tensor i = randint(-1, 2, {5, 6}, {.dtype = kInt64}, &g);
  for (const Tensor& x : {b, i, b.t(), i.t()}) {
    CAPTURE(x.dtype());
    CHECK(any(x).dtype() == kBool);
    CHECK(any(x).item<bool>() == (nany(vec(x)) == 1));
    CHECK(all(x).item<bool>() == (nall(vec(x)) == 1));
    for (int64_t d : {0, 1}) {
      check_close(any(x, d), naive_reduce(x, d, nany), 0, 0);
      check_close(all(x, d, true), naive_reduce(x, d, nall), 0, 0);
      CHECK(all(x, d, true).dtype() == kBool);
    }
  }
  const Tensor x = randn64({2, 3});
  check_error([&] { any(x, 2); }, {"any", "2"});
  check_error([&] { all(x, -3); }, {"all", "-3"});
}

// ---- tril / triu -------------------------------------------------------------------------------------------------

TEST_CASE("tril / triu: vs naive on 2-D and batched input, diagonals below and above, non-square, views") {
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& s : {Shape{4, 4}, Shape{3, 5}, Shape{5, 3}, Shape{2, 3, 4}, Shape{2, 2, 4, 3}}) {
      const Tensor base = dt == kFloat64 ? randn64(s, false, 51) : randn32(s, 51);
      for (const Tensor& x : {base, base.transpose(-1, -2), base.slice(-1, 0, s[s.size() - 1], 2)}) {
        for (int64_t diag : {-6, -2, -1, 0, 1, 2, 6}) {
          CAPTURE(dt);
          CAPTURE(x.shape());
          CAPTURE(diag);
          const Tensor lo = tril(x, diag), up = triu(x, diag);
          CHECK(lo.shape() == x.shape());
          CHECK(up.shape() == x.shape());
          CHECK(lo.dtype() == dt);
          check_close(lo, naive_tri(x, diag, true), 0, 0);
          check_close(up, naive_tri(x, diag, false), 0, 0);
        }
      }
      const Tensor lo = tril(base), up = triu(base);  // the default diagonal is 0
      check_close(lo, naive_tri(base, 0, true), 0, 0);
      check_close(up, naive_tri(base, 0, false), 0, 0);
    }
  }
  // Out of place: the input is untouched.
  const Tensor x = randn64({3, 3}, false, 52);
  const std::vector<double> before = vec(x);
  (void)tril(x);
  (void)triu(x, 1);
  CHECK(vec(x) == before);
}

TEST_CASE("tril / triu: int64 and bool keep their dtype; inf and NaN in the zeroed places become 0; errors") {
  const Tensor i = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  CHECK(tril(i).dtype() == kInt64);
  CHECK(tril(i).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  CHECK(triu(i, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12});
  CHECK(tril(i, -1).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  // nanoGPT's bias buffer: tril of a bool matrix of ones is the causal keep pattern.
  const Tensor causal = tril(ones({4, 4}, {.dtype = kBool}));
  CHECK(causal.dtype() == kBool);
  std::vector<double> want;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) want.push_back(c <= r ? 1.0 : 0.0);
  check_close(causal, want, 0, 0);
  check_close(tril(ones({4, 4})), want, 0, 0);
  // The masked places are written 0 (a selection, not a product with the mask: NaN * 0 would be NaN).
  const double nan = std::nan("");
  const Tensor special = tensor({nan, kInf, -kInf, nan, nan, kInf, kInf, -kInf, nan}, {3, 3}, {.dtype = kFloat64});
  check_close(tril(special), {nan, 0, 0, nan, nan, 0, kInf, -kInf, nan}, 0, 0);
  check_close(triu(special, 1), {0, kInf, -kInf, 0, 0, kInf, 0, 0, 0}, 0, 0);
  // Empty matrices keep their shape.
  CHECK(tril(zeros({0, 3})).shape() == Shape({0, 3}));
  CHECK(triu(zeros({2, 3, 0})).shape() == Shape({2, 3, 0}));

  check_error([] { tril(randn64({5})); }, {"tril"});
  check_error([] { triu(randn64({5})); }, {"triu"});
  check_error([] { tril(scalar_tensor(1.0)); }, {"tril"});
}

TEST_CASE("tril / triu: the gradient is masked alike; gradcheck") {
  Tensor x = randn64({3, 4}, true, 61);
  const Tensor w = randn64({3, 4}, false, 62);
  (tril(x, 1) * w).sum().backward();
  check_close(x.grad(), naive_tri(w, 1, true), 0, 0);
  Tensor y = randn64({2, 3, 4}, true, 63);
  (triu(y, -1) * 1.0).sum().backward();
  check_close(y.grad(), naive_tri(ones({2, 3, 4}, {.dtype = kFloat64}), -1, false), 0, 0);

  for (int64_t diag : {-1, 0, 2}) {
    check_grad([diag](const TensorList& in) { return TensorList{tril(in[0], diag)}; }, {randn64({2, 3, 4}, true, 64)});
    check_grad([diag](const TensorList& in) { return TensorList{triu(in[0], diag)}; }, {randn64({4, 3}, true, 65)});
  }
  check_grad([](const TensorList& in) { return TensorList{tril(in[0].transpose(0, 1), -1)}; },
             {randn64({4, 3}, true, 66)});
}

// ---- scatter -----------------------------------------------------------------------------------------------------

TEST_CASE("scatter: src and value forms vs naive, dims 0 and 1, a 3-D case, index smaller than x, x untouched") {
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    const Tensor x = randn64({4, 5}, false, 71).to(dt);
    const std::vector<double> x_before = vec(x);
    for (int64_t d : {0, 1, -1}) {
      CAPTURE(d);
      const Shape is = {3, 4};  // at most x's size along d, smaller than x on the other dim
      const Tensor index = unique_index(x.size(d), is, d, 72 + static_cast<uint64_t>(d + 1));
      const Tensor src = randn64(is, false, 73).to(dt);  // index's shape
      const Tensor out = scatter(x, d, index, src);
      CHECK(out.shape() == x.shape());
      CHECK(out.dtype() == dt);
      check_close(out, naive_scatter(x, d, index, src), 0, 0);
      const Tensor filled = scatter(x, d, index, 2.5);
      CHECK(filled.dtype() == dt);
      check_close(filled, naive_scatter(x, d, index, Tensor(), 2.5), 0, 0);
    }
    CHECK(vec(x) == x_before);
    // 3-D, along each dim; index smaller than x on every dim.
    const Tensor x3 = randn64({3, 4, 5}, false, 75).to(dt);
    for (int64_t d : {0, 1, 2}) {
      CAPTURE(d);
      Shape is = {2, 3, 4};
      is[static_cast<int>(d)] = x3.size(d) - 1;
      const Tensor index = unique_index(x3.size(d), is, d, 76 + static_cast<uint64_t>(d));
      const Tensor src = randn64(is, false, 77).to(dt);
      check_close(scatter(x3, d, index, src), naive_scatter(x3, d, index, src), 0, 0);
      check_close(scatter(x3, d, index, -1.0), naive_scatter(x3, d, index, Tensor(), -1.0), 0, 0);
    }
    // Non-contiguous x, index and src (transposed buffers).
    const Tensor xt = randn64({5, 4}, false, 78).to(dt).t();  // (4, 5)
    const Tensor it = unique_index(4, {5, 3}, 1, 79).t();     // (3, 5), distinct along dim 0
    const Tensor st = randn64({5, 3}, false, 80).to(dt).t();  // (3, 5)
    check_close(scatter(xt, 0, it, st), naive_scatter(xt, 0, it, st), 0, 0);
  }
  // One-hot rows from the value form (the transforms page's x.scatter_(0, idx, value=1)).
  const Tensor ids = tensor(std::vector<int64_t>{3, 0, 9}, {3, 1});
  const Tensor hot = scatter(zeros({3, 10}), 1, ids, 1.0);
  std::vector<double> want(30, 0.0);
  want[3] = want[10] = want[29] = 1.0;
  check_close(hot, want, 0, 0);
  // An index with no elements writes nothing.
  const Tensor x = randn64({2, 3}, false, 81);
  check_close(scatter(x, 0, zeros({0, 3}, {.dtype = kInt64}), randn64({0, 3})), vec(x), 0, 0);
}

TEST_CASE("scatter: where an index repeats along dim the last write wins, and only that one gets a gradient") {
  // Column j of the index repeats row 1 (twice in column 0, three times in column 2).
  const Tensor x = randn64({3, 3}, false, 91);
  const Tensor index = tensor(std::vector<int64_t>{1, 0, 1, 1, 2, 1, 0, 1, 1}, {3, 3});
  Tensor src = randn64({3, 3}, true, 92);  // distinct values: the winner is recognisable
  const Tensor out = scatter(x, 0, index, src);
  const std::vector<double> ov = vec(out), sv = vec(src), xv = vec(x);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) {
      CAPTURE(r);
      CAPTURE(c);
      std::vector<double> written;
      for (int i = 0; i < 3; ++i)
        if (iv[static_cast<size_t>(i * 3 + c)] == r) written.push_back(sv[static_cast<size_t>(i * 3 + c)]);
      const double o = ov[static_cast<size_t>(r * 3 + c)];
      if (written.empty()) {
        CHECK(o == xv[static_cast<size_t>(r * 3 + c)]);
      } else {
        CHECK(std::find(written.begin(), written.end(), o) != written.end());  // one of the writes (PyTorch)
        CHECK(o == written.back());  // the last along dim, as ops/index.h specifies on every device
      }
    }
  // The upstream gradient at a written place goes to the write that won it; the losing duplicates get none.
  const Tensor w = randn64({3, 3}, false, 93);
  (out * w).sum().backward();
  const std::vector<double> gs = vec(src.grad()), wv = vec(w);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 3; ++c) {
      CAPTURE(i);
      CAPTURE(c);
      const int r = static_cast<int>(iv[static_cast<size_t>(i * 3 + c)]);
      const bool won = ov[static_cast<size_t>(r * 3 + c)] == sv[static_cast<size_t>(i * 3 + c)];
      CHECK(gs[static_cast<size_t>(i * 3 + c)] == (won ? wv[static_cast<size_t>(r * 3 + c)] : 0.0));
    }
}

TEST_CASE("scatter: gradient of x is zero where written, of src the gathered gradient; gradcheck, unique indices") {
  for (int64_t d : {0, 1}) {
    CAPTURE(d);
    Tensor x = randn64({4, 5}, true, 101);
    const Shape is = {3, 4};
    Tensor src = randn64(is, true, 102);
    const Tensor index = unique_index(x.size(d), is, d, 103 + static_cast<uint64_t>(d));
    const Tensor w = randn64({4, 5}, false, 104);
    (scatter(x, d, index, src) * w).sum().backward();
    // x: w where not written, 0 where written.
    const std::vector<double> written = naive_scatter(ones({4, 5}, {.dtype = kFloat64}), d, index, Tensor(), 0.0);
    std::vector<double> gx = vec(w);
    for (size_t f = 0; f < gx.size(); ++f) gx[f] *= written[f];
    check_close(x.grad(), gx, 0, 0);
    // src: w gathered at index's positions (every write wins: the indices are distinct along dim).
    check_close(src.grad(), naive_gather(w, d, index), 0, 0);

    check_grad([d, index](const TensorList& in) { return TensorList{scatter(in[0], d, index, in[1])}; },
               {randn64({4, 5}, true, 105), randn64(is, true, 106)});
    check_grad([d, index](const TensorList& in) { return TensorList{scatter(in[0], d, index, -0.5)}; },
               {randn64({4, 5}, true, 107)});
  }
  // 3-D, through transposed views of x and src.
  const Tensor index = unique_index(4, {2, 3, 3}, 1, 108);
  check_grad(
      [index](const TensorList& in) {
        return TensorList{scatter(in[0].transpose(0, 2), 1, index, in[1].transpose(0, 2))};
      },
      {randn64({5, 4, 3}, true, 109), randn64({3, 3, 2}, true, 110)});
}

TEST_CASE("scatter: errors, out-of-range index, mismatched rank, index larger than x, src not index's shape") {
  const Tensor x = randn64({3, 4});
  const std::vector<double> before = vec(x);
  check_error(
      [&] {
        scatter(x, 0, tensor(std::vector<int64_t>{0, 1, 3, 0}, {1, 4}), randn64({1, 4}));
      },
      {"scatter", "3"});
  check_error([&] { scatter(x, 1, tensor(std::vector<int64_t>{0, 4}, {1, 2}), randn64({1, 2})); }, {"scatter", "4"});
  check_error([&] { scatter(x, 0, tensor(std::vector<int64_t>{-1, 0}, {1, 2}), randn64({1, 2})); }, {"scatter", "-1"});
  check_error([&] { scatter(x, 0, tensor(std::vector<int64_t>{0, 3}, {1, 2}), 1.0); }, {"scatter", "3"});
  CHECK(vec(x) == before);  // out of place: x is never written
  // index of another rank than x; src of another rank than index
  check_error([&] { scatter(x, 0, tensor(std::vector<int64_t>{0, 1}, {2}), randn64({2})); }, {"scatter"});
  check_error([&] { scatter(x, 0, tensor(std::vector<int64_t>{0, 1}, {1, 2}), randn64({2})); }, {"scatter"});
  check_error([&] { scatter(x, 0, tensor(std::vector<int64_t>{0, 1}, {2}), 1.0); }, {"scatter"});
  // index larger than x on a dim other than `dim`; src smaller or larger than index (ops/index.h: exactly its shape,
  // where PyTorch also takes a larger src)
  check_error([&] { scatter(x, 0, zeros({1, 5}, {.dtype = kInt64}), randn64({1, 5})); }, {"scatter"});
  check_error([&] { scatter(x, 0, zeros({2, 4}, {.dtype = kInt64}), randn64({1, 4})); }, {"scatter"});
  check_error([&] { scatter(x, 0, zeros({1, 4}, {.dtype = kInt64}), randn64({2, 4})); }, {"scatter"});
  check_error([&] { scatter(x, 0, zeros({1, 2}, {.dtype = kInt64}), randn64({3, 4})); }, {"scatter"});
  check_error([&] { scatter(x, 2, zeros({1, 4}, {.dtype = kInt64}), randn64({1, 4})); }, {"scatter"});
  check_error([&] { scatter(x, 0, tensor({0.0, 1.0}, {1, 2}), randn64({1, 2})); }, {"scatter"});
}

// ---- nll_loss / nn::NLLLoss --------------------------------------------------------------------------------------

TEST_CASE("nll_loss: vs naive for (N, C) and (N, C, d1, d2), class weights, ignore_index, reductions") {
  const std::vector<double> wv = {0.5, 1.0, 2.0, 0.25};
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-6;
    for (const Shape& xs : {Shape{6, 4}, Shape{2, 4, 3, 2}}) {
      CAPTURE(dt);
      CAPTURE(xs);
      const Tensor x = log_softmax(randn64(xs, false, 111) * 2.0, 1).to(dt);  // log-probabilities
      Shape ts;
      for (int i = 0; i < xs.size(); ++i)
        if (i != 1) ts.push_back(xs[i]);
      Generator g(112);
      std::vector<int64_t> tv = randint(0, 4, ts, {.dtype = kInt64}, &g).to_vector<int64_t>();
      tv[1] = -100;
      tv[4] = 3;  // the custom ignore_index below
      for (int64_t ignore : {int64_t{-100}, int64_t{3}}) {
        std::vector<int64_t> t2 = tv;
        if (ignore == 3) t2[1] = 0;  // -100 is no class once it is not ignored
        const Tensor t = tensor(t2, ts);
        for (bool weighted : {false, true}) {
          CAPTURE(ignore);
          CAPTURE(weighted);
          const Tensor w = weighted ? tensor(wv, {4}).to(dt) : Tensor();
          double wsum = 0;
          const std::vector<double> per =
              naive_nll(vec(x), xs, t2, weighted ? wv : std::vector<double>(), ignore, &wsum);
          const Tensor none = nll_loss(x, t, {.weight = w, .ignore_index = ignore, .reduction = Reduction::None});
          CHECK(none.shape() == ts);
          CHECK(none.dtype() == dt);
          check_close(none, per, tol, tol);
          const Tensor s = nll_loss(x, t, {.weight = w, .ignore_index = ignore, .reduction = Reduction::Sum});
          CHECK(s.dim() == 0);
          check_close(s, {total(per)}, tol, tol);
          const Tensor m = nll_loss(x, t, {.weight = w, .ignore_index = ignore});  // Mean by default
          CHECK(m.dim() == 0);
          check_close(m, {total(per) / wsum}, tol, tol);
        }
      }
    }
  }
  // Defaults: ignore_index -100, mean; a non-contiguous input (a transposed (C, N) buffer).
  const Tensor x = log_softmax(randn64({5, 6}, false, 113), 0).t();  // (6, 5)
  const std::vector<int64_t> tv = {0, 4, -100, 2, 1, 4};
  double wsum = 0;
  const std::vector<double> per = naive_nll(vec(x), x.shape(), tv, {}, -100, &wsum);
  CHECK(wsum == 5.0);
  check_close(nll_loss(x, tensor(tv, {6})), {total(per) / 5.0}, 1e-12, 1e-12);
  check_close(nll_loss(x, tensor(tv, {6}), {.reduction = Reduction::None}), per, 1e-12, 1e-12);
}

TEST_CASE("nll_loss: every target ignored gives 0 (mean and sum), zeros (none), and a zero gradient") {
  Tensor x = randn64({3, 4}, true, 121);
  const Tensor t = tensor(std::vector<int64_t>{-100, -100, -100}, {3});
  const Tensor l = nll_loss(x, t);
  CHECK(l.item<double>() == 0.0);
  l.backward();
  check_close(x.grad(), std::vector<double>(12, 0.0), 0, 0);
  const Tensor w = tensor({1.0, 2.0, 3.0, 4.0}, {4}, {.dtype = kFloat64});
  CHECK(nll_loss(x, t, {.weight = w}).item<double>() == 0.0);
  CHECK(nll_loss(x, t, {.reduction = Reduction::Sum}).item<double>() == 0.0);
  check_close(nll_loss(x, t, {.reduction = Reduction::None}), {0, 0, 0}, 0, 0);
  // An ignored target's row may hold inf or NaN: it contributes nothing, not NaN.
  const Tensor bad = tensor({std::nan(""), kInf, -kInf, 1.0, -0.5, -1.0, -2.0, -0.1}, {2, 4}, {.dtype = kFloat64});
  const Tensor t2 = tensor(std::vector<int64_t>{-100, 2}, {2});
  check_close(nll_loss(bad, t2), {2.0}, 0, 0);
  check_close(nll_loss(bad, t2, {.reduction = Reduction::None}), {0.0, 2.0}, 0, 0);
}

TEST_CASE("nll_loss: cross_entropy(x, t) equals nll_loss(log_softmax(x, 1), t), loss and gradient") {
  for (const Shape& xs : {Shape{6, 5}, Shape{2, 5, 3}}) {
    CAPTURE(xs);
    Shape ts;
    for (int i = 0; i < xs.size(); ++i)
      if (i != 1) ts.push_back(xs[i]);
    Generator g(131);
    std::vector<int64_t> tv = randint(0, 5, ts, {.dtype = kInt64}, &g).to_vector<int64_t>();
    tv[2] = -100;
    const Tensor t = tensor(tv, ts);
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      Tensor a = randn64(xs, true, 132), b = randn64(xs, true, 132);
      const Tensor ce = cross_entropy(a, t, {.reduction = red});
      const Tensor nl = nll_loss(log_softmax(b, 1), t, {.reduction = red});
      check_close(nl, ce, 1e-12, 1e-12);
      const Tensor cot = randn64(ce.shape(), false, 133);
      (ce * cot).sum().backward();
      (nl * cot).sum().backward();
      check_close(b.grad(), a.grad(), 1e-12, 1e-10);
    }
  }
}

TEST_CASE("nll_loss: the gradient is -weight[t] / sum of weights at the targets; gradcheck") {
  Tensor x = randn64({5, 4}, true, 141);
  const std::vector<int64_t> tv = {3, 0, -100, 3, 1};
  const std::vector<double> wv = {0.5, 2.0, 1.0, 0.25};
  const Tensor w = tensor(wv, {4});
  nll_loss(x, tensor(tv, {5}), {.weight = w}).backward();
  const double wsum = 0.25 + 0.5 + 0.25 + 2.0;
  std::vector<double> g(20, 0.0);
  for (int n = 0; n < 5; ++n)
    if (tv[static_cast<size_t>(n)] >= 0)
      g[static_cast<size_t>(n * 4 + tv[static_cast<size_t>(n)])] =
          -wv[static_cast<size_t>(tv[static_cast<size_t>(n)])] / wsum;
  check_close(x.grad(), g, 1e-15, 1e-14);

  const Tensor t = tensor(tv, {5});
  const Tensor t_ignore3 = tensor(std::vector<int64_t>{3, 0, 2, 3, 1}, {5});  // (-100 is no class once 3 is ignored)
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    check_grad([&](const TensorList& in) { return TensorList{nll_loss(in[0], t, {.weight = w, .reduction = red})}; },
               {randn64({5, 4}, true, 142)});
    check_grad(
        [&](const TensorList& in) {
          return TensorList{nll_loss(in[0], t_ignore3, {.ignore_index = 3, .reduction = red})};
        },
        {randn64({5, 4}, true, 143)});
  }
  const Tensor t3 = tensor(std::vector<int64_t>{0, 2, 1, -100, 3, 3}, {2, 3});
  check_grad([&](const TensorList& in) { return TensorList{nll_loss(in[0], t3, {.weight = w})}; },
             {randn64({2, 4, 3}, true, 144)});
  check_grad([&](const TensorList& in) { return TensorList{nll_loss(in[0].transpose(1, 2), t3)}; },
             {randn64({2, 3, 4}, true, 145)});
}

TEST_CASE("nll_loss: errors, target out of range, shapes, dtypes") {
  const Tensor x = randn64({3, 4});
  check_error([&] { nll_loss(x, tensor(std::vector<int64_t>{0, 4, 1}, {3})); }, {"nll_loss", "4"});
  check_error([&] { nll_loss(x, tensor(std::vector<int64_t>{0, -1, 1}, {3})); }, {"nll_loss", "-1"});
  check_error(
      [&] {
        nll_loss(x, tensor(std::vector<int64_t>{0, -100, 1}, {3}), {.ignore_index = 1});
      },
      {"nll_loss", "-100"});
  check_error([&] { nll_loss(x, tensor(std::vector<int64_t>{0, 1}, {2})); }, {"nll_loss"});
  check_error([&] { nll_loss(x, tensor({0.0, 1.0, 2.0}, {3})); }, {"nll_loss"});
  check_error(
      [&] {
        nll_loss(x, tensor(std::vector<int64_t>{0, 1, 2}, {3}), {.weight = ones({5}, {.dtype = kFloat64})});
      },
      {"nll_loss"});
  check_error([&] { nll_loss(randn64({3, 4, 2}), tensor(std::vector<int64_t>{0, 1, 2}, {3})); }, {"nll_loss"});
}

TEST_CASE("nn::NLLLoss: equals nll_loss; the class weights are a buffer in the state dict and follow to()") {
  const Tensor x = log_softmax(randn64({6, 4}, false, 151), 1);
  const Tensor t = tensor(std::vector<int64_t>{0, 3, 2, 2, 1, 3}, {6});
  nn::NLLLoss plain;
  CHECK(plain.type_name() == "NLLLoss");
  CHECK(plain.state_dict().size() == 0);
  CHECK(plain.named_parameters().empty());
  CHECK(same_bits(plain(x, t), nll_loss(x, t)));

  const Tensor w = tensor({0.5, 1.0, 2.0, 0.25}, {4}, {.dtype = kFloat64});
  nn::NLLLoss weighted(nn::NLLLossOptions().weight(w).ignore_index(2).reduction(Reduction::Sum));
  CHECK(weighted.options.ignore_index() == 2);
  CHECK(weighted.options.reduction() == Reduction::Sum);
  CHECK(same_bits(weighted(x, t), nll_loss(x, t, {.weight = w, .ignore_index = 2, .reduction = Reduction::Sum})));
  double wsum = 0;
  check_close(weighted(x, t), {total(naive_nll(vec(x), x.shape(), t.to_vector<int64_t>(), vec(w), 2, &wsum))}, 1e-12,
              1e-12);
  const StateDict sd = weighted.state_dict();
  CHECK(sd.size() == 1);
  REQUIRE(sd.contains("weight"));
  check_close(sd.at("weight"), vec(w), 0, 0);
  CHECK(weighted.named_parameters().empty());
  CHECK(weighted.named_buffers().size() == 1);
  CHECK(weighted.num_parameters() == 0);
  // The buffer moves with the module.
  weighted.to(kFloat32);
  CHECK(weighted.weight.dtype() == kFloat32);
  CHECK(weighted.state_dict().at("weight").dtype() == kFloat32);
  const Tensor x32 = x.to(kFloat32);
  check_close(weighted(x32, t),
              nll_loss(x32, t,
                       {.weight = tensor({0.5, 1.0, 2.0, 0.25}, {4}, {.dtype = kFloat32}),
                        .ignore_index = 2,
                        .reduction = Reduction::Sum}),
              0, 0);
  // The gradient flows to the input through the module (fresh weights: the module above may share w's storage).
  const Tensor w2 = tensor({0.5, 1.0, 2.0, 0.25}, {4}, {.dtype = kFloat64});
  Tensor xg = randn64({6, 4}, true, 152);
  nn::NLLLoss mean_loss(nn::NLLLossOptions().weight(w2));
  mean_loss(xg, t).backward();
  Tensor xr = xg.detach().clone().set_requires_grad(true);
  nll_loss(xr, t, {.weight = tensor({0.5, 1.0, 2.0, 0.25}, {4}, {.dtype = kFloat64})}).backward();
  check_close(xg.grad(), xr.grad(), 0, 0);
}

// ---- multinomial -------------------------------------------------------------------------------------------------

TEST_CASE("multinomial: shape, dtype, device; with replacement the frequencies follow the weights") {
  const std::vector<double> wv = {1.0, 2.0, 0.0, 3.0, 4.0};  // need not sum to 1
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    Generator g(161);
    const int64_t n = 20000;
    const Tensor s = multinomial(tensor(wv, {5}).to(dt), n, /*replacement=*/true, &g);
    CHECK(s.shape() == Shape({n}));
    CHECK(s.dtype() == kInt64);
    CHECK(s.device() == Device::cpu());
    CHECK_FALSE(s.requires_grad());
    check_frequencies(frequencies(s.to_vector<int64_t>(), 5), normalised(wv), n);
  }
  // (N, C): each row its own distribution; a one-hot row always gives its category; tiny weights are as good.
  const std::vector<double> rows = {1.0,  2.0,  0.0, 3.0, 4.0,  //
                                    0.0,  0.0,  7.5, 0.0, 0.0,  //
                                    1e-6, 3e-6, 0.0, 0.0, 0.0,  //
                                    0.2,  0.2,  0.2, 0.2, 0.2};
  Generator g(162);
  const int64_t n = 20000;
  const Tensor s = multinomial(tensor(rows, {4, 5}), n, true, &g);
  REQUIRE(s.shape() == Shape({4, n}));
  const std::vector<int64_t> sv = s.to_vector<int64_t>();
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const std::vector<int64_t> row(sv.begin() + r * n, sv.begin() + (r + 1) * n);
    check_frequencies(frequencies(row, 5),
                      normalised(std::vector<double>(rows.begin() + r * 5, rows.begin() + (r + 1) * 5)), n);
  }
  // More samples than categories with replacement; weights that require grad give a result without.
  Tensor wg = tensor({0.3, 0.7}, {2}, {.dtype = kFloat64});
  wg.set_requires_grad(true);
  const Tensor few = multinomial(wg, 9, true, &g);
  CHECK(few.shape() == Shape({9}));
  CHECK_FALSE(few.requires_grad());
  // Non-contiguous weights: the rows of a transposed (C, N) buffer, each with one non-zero weight.
  const Tensor buf = tensor({0.0, 0.0, 5.0, 3.0, 0.0, 0.0, 0.0, 1.0, 0.0}, {3, 3}, {.dtype = kFloat64});  // (C, N)
  const Tensor wt = buf.t();  // row r = column r of buf: row 0 {0, 3, 0}, row 1 {0, 0, 1}, row 2 {5, 0, 0}
  CHECK(multinomial(wt, 4, true, &g).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0});
}

TEST_CASE("multinomial: without replacement a row's samples are distinct and never a zero-weight category") {
  const std::vector<double> wv = {0.0, 1.0, 5.0, 0.0, 2.0, 0.5};  // four non-zero weights
  const std::set<int64_t> nonzero = {1, 2, 4, 5};
  Generator g(171);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<int64_t> all = multinomial(tensor(wv, {6}), 4, false, &g).to_vector<int64_t>();
    CHECK(std::set<int64_t>(all.begin(), all.end()) == nonzero);  // every non-zero category once
    const std::vector<int64_t> two = multinomial(tensor(wv, {6}), 2, false, &g).to_vector<int64_t>();
    REQUIRE(two.size() == 2u);
    CHECK(two[0] != two[1]);
    CHECK(nonzero.count(two[0]));
    CHECK(nonzero.count(two[1]));
  }
  // Many rows at once: the first sample follows the weights, the second the weights without the first's category,
  // P(second = j) = sum over i != j of p_i p_j / (1 - p_i).
  const int64_t n = 20000;
  const Tensor many = multinomial(tensor(wv, {1, 6}).expand({n, 6}).contiguous(), 2, false, &g);
  REQUIRE(many.shape() == Shape({n, 2}));
  const std::vector<int64_t> mv = many.to_vector<int64_t>();
  std::vector<int64_t> first, second;
  bool distinct = true;
  for (int64_t r = 0; r < n; ++r) {
    first.push_back(mv[static_cast<size_t>(2 * r)]);
    second.push_back(mv[static_cast<size_t>(2 * r + 1)]);
    distinct &= first.back() != second.back();
  }
  CHECK(distinct);
  const std::vector<double> p = normalised(wv);
  check_frequencies(frequencies(first, 6), p, n);
  std::vector<double> p2(6, 0.0);
  for (size_t j = 0; j < 6; ++j)
    for (size_t i = 0; i < 6; ++i)
      if (i != j && p[i] < 1) p2[j] += p[i] * p[j] / (1 - p[i]);
  check_frequencies(frequencies(second, 6), p2, n);
  // As many samples as categories (all non-zero): a permutation of every row.
  const std::vector<int64_t> perm = multinomial(ones({3, 5}, {.dtype = kFloat64}), 5, false, &g).to_vector<int64_t>();
  for (int r = 0; r < 3; ++r)
    CHECK(std::set<int64_t>(perm.begin() + r * 5, perm.begin() + (r + 1) * 5) == std::set<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("multinomial: the same generator seed gives the same draws; the default generator follows manual_seed") {
  const Tensor w = tensor({0.1, 0.4, 0.2, 0.3}, {2, 2}, {.dtype = kFloat64});
  Generator a(181), b(181);
  const Tensor da = multinomial(w, 50, true, &a), db = multinomial(w, 50, true, &b);
  CHECK(da.to_vector<int64_t>() == db.to_vector<int64_t>());
  CHECK(multinomial(w, 50, true, &a).to_vector<int64_t>() != da.to_vector<int64_t>());  // the generator advanced
  Generator c(181), d(181);
  CHECK(multinomial(w, 2, false, &c).to_vector<int64_t>() == multinomial(w, 2, false, &d).to_vector<int64_t>());
  manual_seed(182);
  const std::vector<int64_t> first = multinomial(w, 40, true).to_vector<int64_t>();
  manual_seed(182);
  CHECK(multinomial(w, 40, true).to_vector<int64_t>() == first);
}

TEST_CASE("multinomial: errors, negative / NaN / infinite weights, an all-zero row, too many samples, 3-D input") {
  Generator g(191);
  check_error([&] { multinomial(tensor({1.0, -0.5, 2.0}, {3}), 1, false, &g); }, {"multinomial"});
  check_error([&] { multinomial(tensor({1.0, std::nan(""), 2.0}, {3}), 1, false, &g); }, {"multinomial"});
  check_error([&] { multinomial(tensor({1.0, kInf, 2.0}, {3}, {.dtype = kFloat64}), 1, true, &g); }, {"multinomial"});
  check_error([&] { multinomial(tensor({1.0, 2.0, 0.0, 0.0}, {2, 2}), 1, true, &g); }, {"multinomial"});
  check_error([&] { multinomial(zeros({3}), 1, true, &g); }, {"multinomial"});
  check_error([&] { multinomial(ones({3}), 4, false, &g); }, {"multinomial", "4"});
  check_error([&] { multinomial(tensor({1.0, 0.0, 2.0}, {3}), 3, false, &g); }, {"multinomial", "3"});
  check_error([&] { multinomial(ones({2, 2, 3}), 1, true, &g); }, {"multinomial"});
  check_error([&] { multinomial(scalar_tensor(1.0), 1, true, &g); }, {"multinomial"});
}

// ---- eye(n, m), rand_like / randn_like, add_(double) -------------------------------------------------------------

TEST_CASE("eye(n, m): vs naive for n < m, n > m, n == m and zero sizes; the dtype option") {
  for (auto [n, m] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {5, 3}, {4, 4}, {1, 1}, {0, 3}, {3, 0}, {0, 0}}) {
    CAPTURE(n);
    CAPTURE(m);
    // the 16-bit floats too (filled in float32 and rounded: a bfloat16 model on CUDA asks for them)
    for (DType dt : {kFloat32, kFloat64, kInt64, kBFloat16, kFloat16}) {
      const Tensor e = eye(n, m, {.dtype = dt});
      CHECK(e.shape() == Shape({n, m}));
      CHECK(e.dtype() == dt);
      std::vector<double> want;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) want.push_back(i == j ? 1.0 : 0.0);
      check_close(e.to(kFloat64), want, 0, 0);
    }
  }
  CHECK(same_bits(eye(4, 4), eye(4)));
  CHECK(same_bits(arange(5, {.dtype = kBFloat16}).to(kFloat32), arange(5, {.dtype = kFloat32})));
  CHECK(eye(2, 3).dtype() == kFloat32);
  Tensor g = eye(4, 5, {.dtype = kFloat64, .requires_grad = true});  // torch.eye(4, 5, requires_grad=True)
  CHECK(g.requires_grad());
  check_error([] { eye(-1, 3); }, {"eye"});
  check_error([] { eye(3, -2); }, {"eye"});
}

TEST_CASE("rand_like / randn_like: shape, dtype and device of the input, the draws of rand / randn; ints refused") {
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    const Tensor x = randn64({5, 7}, true, 201).to(dt).t();  // non-contiguous (7, 5), requires grad
    Generator g1(202), g2(202);
    const Tensor r = rand_like(x, &g1);
    CHECK(r.shape() == x.shape());
    CHECK(r.dtype() == dt);
    CHECK(r.device() == x.device());
    CHECK_FALSE(r.requires_grad());
    CHECK(same_bits(r, rand(x.shape(), {.dtype = dt}, &g2)));
    for (double v : vec(r)) {
      CHECK(v >= 0.0);
      CHECK(v < 1.0);
    }
    const Tensor n = randn_like(x, &g1);
    CHECK(n.shape() == x.shape());
    CHECK(n.dtype() == dt);
    CHECK_FALSE(n.requires_grad());
    CHECK(same_bits(n, randn(x.shape(), {.dtype = dt}, &g2)));
  }
  // Large draws: the moments of U[0, 1) and N(0, 1).
  Generator g(203);
  const std::vector<double> u = vec(rand_like(zeros({100000}, {.dtype = kFloat64}), &g));
  const std::vector<double> z = vec(randn_like(zeros({100000}, {.dtype = kFloat64}), &g));
  const double mu = total(u) / 1e5, mz = total(z) / 1e5;
  double vz = 0;
  for (double a : z) vz += (a - mz) * (a - mz) / 1e5;
  CHECK(std::abs(mu - 0.5) < 0.005);
  CHECK(std::abs(mz) < 0.02);
  CHECK(std::abs(vz - 1.0) < 0.03);
  // The default generator when none is given.
  const Tensor s = zeros({4});
  manual_seed(204);
  const Tensor a = rand_like(s);
  manual_seed(204);
  CHECK(same_bits(a, rand({4})));
  check_error([] { rand_like(zeros({3}, {.dtype = kInt64})); }, {"rand"});
  check_error([] { randn_like(zeros({3}, {.dtype = kInt64})); }, {"rand"});
  check_error([] { rand_like(ones({3}, {.dtype = kBool})); }, {"rand"});
}

TEST_CASE("Tensor::add_(double): adds in place, through views, returns *this; int64 exact; refused on a grad leaf") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = dt});
    const uint64_t v0 = x.impl()->storage->version();
    Tensor& r = x.add_(0.5);
    CHECK(&r == &x);
    CHECK(x.impl()->storage->version() > v0);
    CHECK(x.dtype() == dt);
    check_close(x, {1.5, 2.5, 3.5, 4.5, 5.5, 6.5}, 0, 0);
    x.add_(-2.0);
    check_close(x, {-0.5, 0.5, 1.5, 2.5, 3.5, 4.5}, 0, 0);
    x.t().add_(1.0);  // through a transposed view: every element of x
    check_close(x, {0.5, 1.5, 2.5, 3.5, 4.5, 5.5}, 0, 0);
    x.select(1, 0).add_(10.0);  // a column
    check_close(x, {10.5, 1.5, 2.5, 13.5, 4.5, 5.5}, 0, 0);
    x.slice(1, 0, 3, 2).add_(100.0);  // columns 0 and 2
    check_close(x, {110.5, 1.5, 102.5, 113.5, 4.5, 105.5}, 0, 0);
  }
  Tensor i = tensor(std::vector<int64_t>{1, -2, 3}, {3});
  i.add_(4.0);
  CHECK(i.dtype() == kInt64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{5, 2, 7});
  // Beyond 2^24 (float32) and 2^53 (double) every integer still counts.
  Tensor big = tensor(std::vector<int64_t>{(int64_t{1} << 40) + 1, (int64_t{1} << 60) + 1}, {2});
  big.add_(1.0);
  CHECK(big.to_vector<int64_t>() == std::vector<int64_t>{(int64_t{1} << 40) + 2, (int64_t{1} << 60) + 2});

  Tensor w = ones({2}, {.dtype = kFloat64, .requires_grad = true});
  check_error([&] { w.add_(1.0); }, {"add_", "requires grad"});
  check_close(w, {1, 1}, 0, 0);
  {
    NoGradGuard ng;
    w.add_(1.0);  // parameter updates are allowed without grad mode
  }
  check_close(w, {2, 2}, 0, 0);
  CHECK(w.requires_grad());
}

// ---- nn::Flatten, nn::Softmax, nn::LogSoftmax --------------------------------------------------------------------

TEST_CASE("nn::Flatten: default start_dim 1, explicit and negative dims, equals Tensor::flatten; extra_repr") {
  const Tensor x = randn64({2, 3, 4, 5}, false, 211);
  nn::Flatten f;
  CHECK(f.type_name() == "Flatten");
  CHECK(f.start_dim == 1);
  CHECK(f.end_dim == -1);
  const Tensor y = f(x);
  CHECK(y.shape() == Shape({2, 60}));
  check_close(y, vec(x), 0, 0);  // row-major order kept
  for (auto [s, e, want] : std::vector<std::tuple<int64_t, int64_t, Shape>>{{0, -1, {120}},
                                                                            {0, 2, {24, 5}},
                                                                            {1, 2, {2, 12, 5}},
                                                                            {-3, -2, {2, 12, 5}},
                                                                            {2, 3, {2, 3, 20}},
                                                                            {3, 3, {2, 3, 4, 5}}}) {
    CAPTURE(s);
    CAPTURE(e);
    nn::Flatten fl(s, e);
    const Tensor z = fl(x);
    CHECK(z.shape() == want);
    CHECK(same_bits(z, x.flatten(s, e)));
    check_close(z, vec(x), 0, 0);
  }
  // A non-contiguous input is read in its logical order.
  const Tensor xt = x.transpose(1, 3);
  check_close(f(xt), vec(xt), 0, 0);
  CHECK(f(xt).shape() == Shape({2, 60}));
  // The gradient passes through unchanged.
  Tensor xg = randn64({2, 3, 4}, true, 212);
  (f(xg) * 2.0).sum().backward();
  check_close(xg.grad(), std::vector<double>(24, 2.0), 0, 0);
  const std::string repr = f.extra_repr();
  CHECK(repr.find("start_dim") != std::string::npos);
  CHECK(repr.find("end_dim") != std::string::npos);
  CHECK(repr.find("-1") != std::string::npos);
  CHECK(f.to_string().rfind("Flatten(", 0) == 0);
  CHECK(nn::Flatten(0, 2).extra_repr().find("2") != std::string::npos);
}

TEST_CASE("nn::Softmax / nn::LogSoftmax: equal the functions along dim, gradients, extra_repr names the dim") {
  const Tensor x = randn64({3, 4, 5}, false, 221);
  for (int64_t d : {0, 1, 2, -1}) {
    CAPTURE(d);
    nn::Softmax sm(d);
    nn::LogSoftmax lsm(d);
    CHECK(sm.dim == d);
    CHECK(lsm.dim == d);
    CHECK(same_bits(sm(x), softmax(x, d)));
    CHECK(same_bits(lsm(x), log_softmax(x, d)));
    const std::string dim_text = std::to_string(d);
    CHECK(sm.extra_repr().find("dim") != std::string::npos);
    CHECK(sm.extra_repr().find(dim_text) != std::string::npos);
    CHECK(lsm.extra_repr().find(dim_text) != std::string::npos);
    CHECK(sm.to_string() == "Softmax(" + sm.extra_repr() + ")");
    CHECK(lsm.to_string() == "LogSoftmax(" + lsm.extra_repr() + ")");
  }
  CHECK(nn::Softmax(1).type_name() == "Softmax");
  CHECK(nn::LogSoftmax(1).type_name() == "LogSoftmax");
  // Non-contiguous input, float32.
  const Tensor x32 = randn32({5, 6}, 222).t();
  CHECK(same_bits(nn::Softmax(1)(x32), softmax(x32, 1)));
  nn::LogSoftmax lsm(1);
  check_grad([&](const TensorList& in) { return TensorList{lsm(in[0])}; }, {randn64({3, 5}, true, 223)});
  nn::Softmax sm(0);
  check_grad([&](const TensorList& in) { return TensorList{sm(in[0])}; }, {randn64({3, 5}, true, 224)});
}

// ---- nn::ModuleDict ----------------------------------------------------------------------------------------------

TEST_CASE("nn::ModuleDict: state-dict names <key>.<param>, insertion order, contains, lookups and their errors") {
  manual_seed(231);
  auto wte = std::make_shared<nn::Embedding>(10, 4);
  auto head = std::make_shared<nn::Linear>(4, 10);
  auto drop = std::make_shared<nn::Dropout>(0.1);
  auto dict = std::make_shared<nn::ModuleDict>();
  CHECK(dict->empty());
  CHECK(dict->type_name() == "ModuleDict");
  dict->insert("wte", wte);
  dict->insert("lm_head", head);
  dict->insert("drop", drop);
  CHECK(dict->size() == 3);
  CHECK_FALSE(dict->empty());
  CHECK(dict->keys() == std::vector<std::string>{"wte", "lm_head", "drop"});  // insertion order, not sorted
  std::vector<std::string> seen;
  std::vector<const nn::Module*> mods;
  for (const auto& [key, m] : *dict) {
    seen.push_back(key);
    mods.push_back(m.get());
  }
  CHECK(seen == std::vector<std::string>{"wte", "lm_head", "drop"});
  CHECK(mods == std::vector<const nn::Module*>{wte.get(), head.get(), drop.get()});
  CHECK(dict->contains("wte"));
  CHECK(dict->contains("drop"));
  CHECK_FALSE(dict->contains("wpe"));
  CHECK((*dict)["lm_head"].get() == head.get());
  CHECK(dict->at<nn::Linear>("lm_head").get() == head.get());
  CHECK(dict->at<nn::Module>("drop").get() == drop.get());

  // Registered children: names, parameters, state dict, printout.
  auto kids = dict->named_children();
  REQUIRE(kids.size() == 3);
  CHECK(kids[1].first == "lm_head");
  std::vector<std::string> names;
  for (const auto& [n, t] : dict->state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"wte.weight", "lm_head.weight", "lm_head.bias"});
  CHECK(dict->num_parameters() == 10 * 4 + 4 * 10 + 10);
  CHECK(dict->parameters().size() == 3);
  CHECK(dict->to_string().find("(wte): Embedding(") != std::string::npos);
  dict->eval();
  CHECK_FALSE(drop->is_training());
  // Inside a model: nanoGPT's transformer.wte.weight.
  nn::Module gpt("GPT");
  gpt.register_module("transformer", dict);
  CHECK(gpt.state_dict().contains("transformer.wte.weight"));
  CHECK(gpt.state_dict().contains("transformer.lm_head.bias"));
  CHECK(gpt.num_parameters() == dict->num_parameters());
  // Looked-up modules are the registered ones: a forward through them trains them.
  Tensor e = dict->at<nn::Embedding>("wte")->forward(tensor(std::vector<int64_t>{1, 3}, {2}));
  CHECK(e.shape() == Shape({2, 4}));

  // The initializer-list form.
  nn::ModuleDict d2({{"a", std::make_shared<nn::Linear>(2, 3)}, {"b", std::make_shared<nn::ReLU>()}});
  CHECK(d2.keys() == std::vector<std::string>{"a", "b"});
  CHECK(d2.named_parameters()[0].first == "a.weight");
  CHECK(d2.num_parameters() == 2 * 3 + 3);

  check_error([&] { (void)(*dict)["wpe"]; }, {"wpe"});
  check_error([&] { dict->insert("wte", std::make_shared<nn::ReLU>()); }, {"wte"});
  check_error([&] { (void)dict->at<nn::Embedding>("lm_head"); }, {"lm_head"});
  check_error([&] { (void)dict->at<nn::Linear>("nowhere"); }, {"nowhere"});
  check_error([&] { dict->insert("a.b", std::make_shared<nn::ReLU>()); }, {"a.b"});
  check_error([&] { dict->insert("empty_slot", nullptr); }, {"empty_slot"});
  check_error([&] { (*dict)(zeros({1, 4})); }, {"ModuleDict"});  // no forward of its own
  CHECK(dict->size() == 3);                                      // nothing half-inserted
  CHECK(dict->named_children().size() == 3);
}

// ---- Module::apply -----------------------------------------------------------------------------------------------

TEST_CASE("Module::apply: children's subtrees first, depth first in registration order, then the module; returns it") {
  auto root = std::make_shared<nn::Module>("Root");
  auto encoder =
      root->register_module("encoder", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                           std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::Tanh>()}));
  root->register_module("head", std::make_shared<nn::Linear>(4, 2));
  auto extra = root->register_module(
      "extra", std::make_shared<nn::ModuleDict>(std::initializer_list<nn::ModuleDict::Item>{
                   {"proj", std::make_shared<nn::Linear>(2, 2, false)}, {"act", std::make_shared<nn::ReLU>()}}));

  std::vector<const nn::Module*> order;
  std::vector<std::string> types;
  nn::Module& returned = root->apply([&](nn::Module& m) {
    order.push_back(&m);
    types.push_back(m.type_name());
  });
  CHECK(&returned == root.get());
  // Post-order: every child's subtree (depth first, registration order), then the module itself.
  CHECK(types ==
        std::vector<std::string>{"Linear", "Tanh", "Sequential", "Linear", "Linear", "ReLU", "ModuleDict", "Root"});
  std::map<std::string, const nn::Module*> by_name;
  for (const auto& [n, m] : root->named_modules()) by_name[n] = m.get();
  std::vector<const nn::Module*> want;
  for (const char* n : {"encoder.0", "encoder.1", "encoder", "head", "extra.proj", "extra.act", "extra", ""})
    want.push_back(by_name.at(n));
  CHECK(order == want);
  CHECK(order.size() == root->named_modules().size());  // each module once

  // On a subtree, and on a module without children: fn on it alone.
  types.clear();
  encoder->apply([&](nn::Module& m) { types.push_back(m.type_name()); });
  CHECK(types == std::vector<std::string>{"Linear", "Tanh", "Sequential"});
  nn::Linear lone(2, 2);
  int calls = 0;
  CHECK(&lone.apply([&](nn::Module&) { ++calls; }) == &lone);
  CHECK(calls == 1);
}

TEST_CASE("Module::apply: the usual initialisation of every Linear over a whole model") {
  manual_seed(241);
  auto root = std::make_shared<nn::Module>("Net");
  root->register_module("fc1", std::make_shared<nn::Linear>(3, 5));
  root->register_module("body", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                    std::make_shared<nn::Linear>(5, 5), std::make_shared<nn::GELU>(),
                                    std::make_shared<nn::Linear>(5, 2, false)}));
  root->register_module("emb", std::make_shared<nn::Embedding>(7, 3));
  int linears = 0;
  root->apply([&](nn::Module& m) {
    if (auto* l = dynamic_cast<nn::Linear*>(&m)) {
      ++linears;
      NoGradGuard ng;
      l->weight.fill_(0.25);
      if (l->bias.defined()) l->bias.zero_();
    }
  });
  CHECK(linears == 3);
  for (const auto& [name, p] : root->named_parameters()) {
    CAPTURE(name);
    const std::vector<double> v = vec(p);
    if (name == "emb.weight") {
      CHECK(std::any_of(v.begin(), v.end(), [](double a) { return a != 0.25 && a != 0.0; }));  // untouched
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      CHECK(v == std::vector<double>(v.size(), 0.0));
    } else {
      CHECK(v == std::vector<double>(v.size(), 0.25));
    }
    CHECK(p.requires_grad());  // still parameters
  }
  // The model computes through the initialised weights: fc1 gives 0.25 * 3 everywhere, body.0 0.25 * 5 * that, and
  // body.2 (no bias) 0.25 * 5 * gelu(that).
  const Tensor y = (*root->named_children()[1].second)((*root->named_children()[0].second)(ones({1, 3})));
  CHECK(y.shape() == Shape({1, 2}));
  const double h = 0.25 * 5 * (0.25 * 3), gelu_h = 0.5 * h * (1 + std::erf(h / std::sqrt(2.0)));
  check_close(y, {0.25 * 5 * gelu_h, 0.25 * 5 * gelu_h}, 1e-6, 1e-6);
}

// ---- cuda::is_bf16_supported ---------------------------------------------------------------------------------------

TEST_CASE("cuda::is_bf16_supported: false without a CUDA device") {
  if (!cuda::is_available()) {
    CHECK_FALSE(cuda::is_bf16_supported());
    CHECK_FALSE(cuda::is_bf16_supported(0));
    CHECK_FALSE(cuda::is_bf16_supported(3));
    return;
  }
  bool supported = false;
  CHECK_NOTHROW(supported = cuda::is_bf16_supported());
  MESSAGE(cuda::device_name() << ": is_bf16_supported() = " << supported);
  CHECK(cuda::is_bf16_supported(0) == supported);
}

// ---- the same calls on a GPU ---------------------------------------------------------------------------------------

TEST_CASE("CUDA: prod, any / all, tril / triu, scatter, nll_loss, multinomial, eye, rand_like and add_ match the CPU") {
  if (!gpu_or_skip()) return;
  const Device dev = Device::cuda();
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    const Tensor x = near_one({4, 5, 6}, dt, 251);
    const Tensor xg = x.to(dev);
    CHECK(prod(xg).device() == dev);
    check_close(prod(xg).cpu(), prod(x), tol, tol);
    check_close(prod(xg.transpose(0, 2), 1, true).cpu(), prod(x.transpose(0, 2), 1, true), tol, tol);
    Tensor leaf = x.to(dev).detach().set_requires_grad(true), leaf_cpu = x.detach().clone().set_requires_grad(true);
    prod(leaf, 2).sum().backward();
    prod(leaf_cpu, 2).sum().backward();
    check_close(leaf.grad().cpu(), leaf_cpu.grad(), tol, tol);

    std::vector<double> v = vec(randint(-1, 2, {4, 5, 6}, {.dtype = kInt64}));
    v[3] = std::nan("");
    const Tensor z = tensor(v, {4, 5, 6}, {.dtype = dt});
    CHECK(same_bits(any(z.to(dev), 1).cpu(), any(z, 1)));
    CHECK(same_bits(all(z.to(dev), -1, true).cpu(), all(z, -1, true)));
    CHECK(same_bits(any(z.to(dev)).cpu(), any(z)));
    CHECK(same_bits(all(z.to(dev)).cpu(), all(z)));

    CHECK(same_bits(tril(xg, 1).cpu(), tril(x, 1)));
    CHECK(same_bits(triu(xg.transpose(-1, -2), -2).cpu(), triu(x.transpose(-1, -2), -2)));

    const Tensor index = unique_index(5, {4, 3, 6}, 1, 252);
    const Tensor src = near_one({4, 3, 6}, dt, 253);
    CHECK(same_bits(scatter(xg, 1, index.to(dev), src.to(dev)).cpu(), scatter(x, 1, index, src)));
    CHECK(same_bits(scatter(xg, 1, index.to(dev), 0.5).cpu(), scatter(x, 1, index, 0.5)));

    const Tensor logp = log_softmax(randn64({6, 5}, false, 254), 1).to(dt);
    const Tensor t = tensor(std::vector<int64_t>{0, 4, -100, 2, 1, 4}, {6});
    const Tensor w = tensor({0.5, 1.0, 2.0, 0.25, 3.0}, {5}).to(dt);
    check_close(nll_loss(logp.to(dev), t.to(dev), {.weight = w.to(dev)}).cpu(), nll_loss(logp, t, {.weight = w}), tol,
                tol);

    Generator g1(255), g2(255);
    const Tensor probs = softmax(randn64({3, 7}, false, 256), -1).to(dt);
    const Tensor mg = multinomial(probs.to(dev), 4, false, &g1);
    CHECK(mg.device() == dev);
    CHECK(mg.cpu().to_vector<int64_t>() == multinomial(probs, 4, false, &g2).to_vector<int64_t>());  // host draws

    CHECK(eye(3, 5, {.dtype = dt, .device = dev}).device() == dev);
    CHECK(same_bits(eye(3, 5, {.dtype = dt, .device = dev}).cpu(), eye(3, 5, {.dtype = dt})));
    Generator r1(257), r2(257);
    const Tensor rl = rand_like(xg, &r1);
    CHECK(rl.device() == dev);
    CHECK(rl.dtype() == dt);
    CHECK(same_bits(rl.cpu(), rand_like(x, &r2)));  // CUDA draws the CPU's stream
    CHECK(randn_like(xg, &r1).device() == dev);

    Tensor a = xg.clone();
    a.add_(1.5);
    check_close(a.cpu(), x + 1.5, 0, 0);
  }
}
