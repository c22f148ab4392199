// Tests of ops/index.h: forward against naive loops over std::vector (float32 and float64, non-contiguous
// inputs and indices, repeated indices), gradchecks of every differentiable op, and the error messages.
#include <limits>
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

Tensor itensor(const std::vector<int64_t>& v, const Shape& s) { return tensor(v, s); }

Tensor rand_index(int64_t n, const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randint(0, n, s, {.dtype = kInt64}, &g);
}

Tensor rand_of(DType dt, const Shape& s, uint64_t seed) {
  return dt == kFloat64 ? randn64(s, false, seed) : randn32(s, seed);
}

double tol(DType dt) { return dt == kFloat64 ? 1e-12 : 1e-6; }

// Naive references ------------------------------------------------------------------------------------------------

std::vector<double> ref_index_select(const Tensor& x, int d, const Tensor& index) {
  auto xv = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  Shape os = x.shape();
  os[d] = static_cast<int64_t>(iv.size());
  std::vector<double> out(static_cast<size_t>(numel_of(os)));
  for (int64_t f = 0; f < numel_of(os); ++f) {
    auto p = unravel(f, os);
    p[d] = iv[static_cast<size_t>(p[d])];
    out[static_cast<size_t>(f)] = xv[static_cast<size_t>(ravel(p, x.shape()))];
  }
  return out;
}

std::vector<double> ref_gather(const Tensor& x, int d, const Tensor& index) {
  auto xv = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  std::vector<double> out(iv.size());
  for (int64_t f = 0; f < index.numel(); ++f) {
    auto p = unravel(f, index.shape());
    p[d] = iv[static_cast<size_t>(f)];
    out[static_cast<size_t>(f)] = xv[static_cast<size_t>(ravel(p, x.shape()))];
  }
  return out;
}

std::vector<double> ref_scatter_add(const Tensor& x, int d, const Tensor& index, const Tensor& src) {
  auto out = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  auto sv = src.to_vector<double>();
  for (int64_t f = 0; f < index.numel(); ++f) {
    auto p = unravel(f, index.shape());
    p[d] = iv[static_cast<size_t>(f)];
    out[static_cast<size_t>(ravel(p, x.shape()))] += sv[static_cast<size_t>(f)];
  }
  return out;
}

std::vector<double> ref_cat(const TensorList& xs, int d) {
  Shape os = xs[0].shape();
  os[d] = 0;
  for (auto& x : xs) os[d] += x.size(d);
  std::vector<double> out(static_cast<size_t>(numel_of(os)));
  for (int64_t f = 0; f < numel_of(os); ++f) {
    auto p = unravel(f, os);
    size_t i = 0;
    while (p[d] >= xs[i].size(d)) p[d] -= xs[i++].size(d);
    out[static_cast<size_t>(f)] = xs[i].to_vector<double>()[static_cast<size_t>(ravel(p, xs[i].shape()))];
  }
  return out;
}

std::vector<double> ref_stack(const TensorList& xs, int d) {
  Shape os = xs[0].shape();
  os.insert(d, static_cast<int64_t>(xs.size()));
  std::vector<double> out(static_cast<size_t>(numel_of(os)));
  for (int64_t f = 0; f < numel_of(os); ++f) {
    auto p = unravel(f, os);
    const size_t i = static_cast<size_t>(p[d]);
    p.erase(p.begin() + d);
    out[static_cast<size_t>(f)] = xs[i].to_vector<double>()[static_cast<size_t>(ravel(p, xs[i].shape()))];
  }
  return out;
}

}  // namespace

// ---- index_select -----------------------------------------------------------------------------------------------

TEST_CASE("index_select: forward vs naive, all dims, repeated and non-contiguous indices") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = rand_of(dt, {4, 5, 6}, 11);
    for (int64_t dim : {0, 1, 2, -1}) {
      const int d = dim < 0 ? dim + 3 : static_cast<int>(dim);
      Tensor index = itensor({x.size(d) - 1, 0, 2, 2, 1, 0, 0}, {7});
      Tensor y = index_select(x, dim, index);
      Shape es = x.shape();
      es[d] = 7;
      CHECK(y.shape() == es);
      CHECK(y.dtype() == dt);
      check_close(y, ref_index_select(x, d, index), tol(dt), 0);
    }
    // Non-contiguous x (a transpose) and index (a strided slice).
    Tensor xt = rand_of(dt, {6, 3}, 12).t();  // (3, 6)
    CHECK_FALSE(xt.is_contiguous());
    Tensor index = rand_index(6, {10}, 13).slice(0, 0, 10, 2);
    CHECK_FALSE(index.is_contiguous());
    check_close(index_select(xt, 1, index), ref_index_select(xt, 1, index), tol(dt), 0);
    // A 0-D index keeps the dimension with size 1; an empty index gives an empty dim.
    check_close(index_select(xt, 0, itensor({2}, {})), ref_index_select(xt, 0, itensor({2}, {1})), tol(dt), 0);
    CHECK(index_select(xt, 0, tensor(std::vector<int64_t>{}, {0})).shape() == Shape{0, 6});
  }
  // int64 data works too.
  Tensor xi = arange(12).reshape({3, 4});
  check_close(index_select(xi, 1, itensor({3, 1}, {2})), ref_index_select(xi, 1, itensor({3, 1}, {2})), 0, 0);
}

TEST_CASE("index_select: backward accumulates repeated indices; gradcheck") {
  Tensor x = randn64({4, 3}, true, 3);
  Tensor index = itensor({1, 3, 1, 1}, {4});
  Tensor w = randn64({4, 3}, false, 4);
  (index_select(x, 0, index) * w).sum().backward();
  // Naive: grad[r][c] = sum over j with index[j] == r of w[j][c].
  auto wv = w.to_vector<double>();
  std::vector<double> expect(12, 0.0);
  const int64_t iv[4] = {1, 3, 1, 1};
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 3; ++c) expect[static_cast<size_t>(iv[j] * 3 + c)] += wv[static_cast<size_t>(j * 3 + c)];
  check_close(x.grad(), expect, 1e-12, 0);

  for (int64_t dim : {0, 1, 2}) {
    Tensor xs = randn64({3, 4, 5}, true, 5 + static_cast<uint64_t>(dim));
    Tensor idx = rand_index(xs.size(dim), {6}, 20 + static_cast<uint64_t>(dim));
    check_grad([&](const TensorList& in) { return TensorList{index_select(in[0], dim, idx)}; }, {xs});
  }
  // Through a non-contiguous input.
  Tensor base = randn64({5, 4}, true, 9);
  check_grad(
      [&](const TensorList& in) {
        return TensorList{index_select(in[0].t(), 1, itensor({4, 0, 4}, {3}))};
      },
      {base});
}

// ---- gather -----------------------------------------------------------------------------------------------------

TEST_CASE("gather: forward vs naive, smaller index, non-contiguous x and index") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = rand_of(dt, {4, 5, 3}, 21);
    for (int d = 0; d < 3; ++d) {
      Shape is = {3, 4, 2};  // <= x's sizes on the other dims
      is[d] = 7;             // larger than x on `dim` is allowed
      Tensor index = rand_index(x.size(d), is, 30 + static_cast<uint64_t>(d));
      Tensor y = gather(x, d, index);
      CHECK(y.shape() == is);
      check_close(y, ref_gather(x, d, index), tol(dt), 0);
      check_close(gather(x, d - 3, index), ref_gather(x, d, index), tol(dt), 0);  // negative dim
    }
    Tensor xt = rand_of(dt, {5, 4}, 22).t();    // (4, 5), transposed
    Tensor it = rand_index(5, {3, 4}, 23).t();  // (4, 3), transposed
    CHECK_FALSE(it.is_contiguous());
    check_close(gather(xt, 1, it), ref_gather(xt, 1, it), tol(dt), 0);
    Tensor it0 = rand_index(4, {6, 10}, 24).slice(1, 1, 10, 2);  // (6, 5), strided
    check_close(gather(xt, 0, it0), ref_gather(xt, 0, it0), tol(dt), 0);
  }
  // 0-d x and index.
  Tensor s = scalar_tensor(2.5, {.dtype = kFloat64});
  CHECK(gather(s, 0, itensor({0}, {})).item<double>() == 2.5);
}

TEST_CASE("gather: backward scatters with accumulation; gradcheck") {
  Tensor x = randn64({2, 3}, true, 31);
  Tensor index = itensor({2, 2, 0, 1, 1, 1, 1, 1}, {2, 4});
  gather(x, 1, index).sum().backward();
  check_close(x.grad(), {1, 1, 2, 0, 4, 0}, 0, 0);  // row 0 reads 2, 2, 0, 1; row 1 reads 1 four times

  for (int d = 0; d < 3; ++d) {
    Tensor xs = randn64({3, 4, 2}, true, 40 + static_cast<uint64_t>(d));
    Shape is = {2, 3, 2};
    is[d] = 5;
    Tensor idx = rand_index(xs.size(d), is, 50 + static_cast<uint64_t>(d));
    check_grad([&](const TensorList& in) { return TensorList{gather(in[0], d, idx)}; }, {xs});
  }
  Tensor base = randn64({4, 3}, true, 33);
  Tensor it = rand_index(4, {2, 3}, 34).t();
  check_grad([&](const TensorList& in) { return TensorList{gather(in[0].t(), 1, it)}; }, {base});
}

// ---- scatter_add ------------------------------------------------------------------------------------------------

TEST_CASE("scatter_add: forward vs naive with repeated indices, non-contiguous, does not modify x") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = rand_of(dt, {4, 3, 5}, 61);
    std::vector<double> x_before = x.to_vector<double>();
    for (int d = 0; d < 3; ++d) {
      Shape is = {2, 3, 4};
      is[d] = 6;
      Tensor index = rand_index(x.size(d), is, 70 + static_cast<uint64_t>(d));
      Tensor src = rand_of(dt, is, 80 + static_cast<uint64_t>(d));
      check_close(scatter_add(x, d, index, src), ref_scatter_add(x, d, index, src), tol(dt), tol(dt));
    }
    CHECK(x.to_vector<double>() == x_before);
    Tensor xt = rand_of(dt, {5, 4}, 62).t();    // (4, 5)
    Tensor it = rand_index(4, {5, 3}, 63).t();  // (3, 5) along dim 0
    Tensor st = rand_of(dt, {5, 3}, 64).t();    // (3, 5)
    check_close(scatter_add(xt, 0, it, st), ref_scatter_add(xt, 0, it, st), tol(dt), tol(dt));
  }
  Tensor xi = zeros({3}, {.dtype = kInt64});
  check_close(scatter_add(xi, 0, itensor({0, 2, 2, 2}, {4}), itensor({5, 1, 2, 3}, {4})), {5, 0, 6}, 0, 0);
}

TEST_CASE("scatter_add: gradients for x (identity) and src (gather); gradcheck") {
  Tensor x = randn64({3, 4}, true, 91);
  Tensor src = randn64({2, 4}, true, 92);
  Tensor index = itensor({0, 2, 2, 1, 0, 0, 2, 1}, {2, 4});
  Tensor w = randn64({3, 4}, false, 93);
  (scatter_add(x, 0, index, src) * w).sum().backward();
  check_close(x.grad(), w.to_vector<double>(), 0, 0);
  check_close(src.grad(), ref_gather(w, 0, index), 1e-12, 0);

  for (int d = 0; d < 2; ++d) {
    Tensor xs = randn64({4, 5}, true, 100 + static_cast<uint64_t>(d));
    Shape is = {3, 4};
    is[d] = 6;
    Tensor ss = randn64(is, true, 110 + static_cast<uint64_t>(d));
    Tensor idx = rand_index(xs.size(d), is, 120 + static_cast<uint64_t>(d));
    check_grad([&](const TensorList& in) { return TensorList{scatter_add(in[0], d, idx, in[1])}; }, {xs, ss});
  }
}

// ---- cat / stack ------------------------------------------------------------------------------------------------

TEST_CASE("cat: forward vs naive, including a transposed view and int64") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor a = rand_of(dt, {2, 3, 4}, 131);
    Tensor b = rand_of(dt, {2, 3, 1}, 132);
    Tensor c = rand_of(dt, {2, 4, 3}, 133).transpose(1, 2);  // (2, 3, 4) non-contiguous
    CHECK_FALSE(c.is_contiguous());
    Tensor y = cat({a, b, c}, -1);
    CHECK(y.shape() == Shape{2, 3, 9});
    check_close(y, ref_cat({a, b, c}, 2), 0, 0);
    Tensor y0 = cat({a, c, a}, 0);
    CHECK(y0.shape() == Shape{6, 3, 4});
    check_close(y0, ref_cat({a, c, a}, 0), 0, 0);
    Tensor e = rand_of(dt, {2, 0, 4}, 134);
    check_close(cat({a, e, c}, 1), ref_cat({a, e, c}, 1), 0, 0);
    check_close(cat({a}, 1), a, 0, 0);
  }
  Tensor i1 = arange(6).reshape({2, 3}), i2 = arange(4).reshape({2, 2});
  check_close(cat({i1, i2}, 1), ref_cat({i1, i2}, 1), 0, 0);
}

TEST_CASE("cat: backward slices the gradient; gradcheck") {
  Tensor a = randn64({2, 3}, true, 141);
  Tensor b = randn64({2, 2}, false, 142);
  Tensor c = randn64({2, 1}, true, 143);
  Tensor w = randn64({2, 6}, false, 144);
  (cat({a, b, c}, 1) * w).sum().backward();
  auto wv = w.to_vector<double>();
  check_close(a.grad(), {wv[0], wv[1], wv[2], wv[6], wv[7], wv[8]}, 0, 0);
  check_close(c.grad(), {wv[5], wv[11]}, 0, 0);
  CHECK_FALSE(b.grad().defined());

  for (int d = 0; d < 3; ++d) {
    Shape sa = {2, 3, 2}, sb = {2, 3, 2};
    sb[d] = 4;
    Tensor p = randn64(sa, true, 150 + static_cast<uint64_t>(d)), q = randn64(sb, true, 160 + static_cast<uint64_t>(d));
    check_grad([&](const TensorList& in) { return TensorList{cat({in[0], in[1], in[0]}, d)}; }, {p, q});
  }
  Tensor base = randn64({3, 2}, true, 170);
  Tensor other = randn64({3, 3}, true, 171);
  check_grad([](const TensorList& in) { return TensorList{cat({in[0].t(), in[1]}, 0)}; }, {base, other});
}

TEST_CASE("stack: forward vs naive; backward selects slices; gradcheck") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor a = rand_of(dt, {3, 4}, 181), b = rand_of(dt, {4, 3}, 182).t(), c = rand_of(dt, {3, 4}, 183);
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      const int d = dim < 0 ? static_cast<int>(dim) + 3 : static_cast<int>(dim);
      Tensor y = stack({a, b, c}, dim);
      Shape es = {3, 4};
      es.insert(d, 3);
      CHECK(y.shape() == es);
      check_close(y, ref_stack({a, b, c}, d), 0, 0);
    }
  }
  Tensor a = randn64({2, 3}, true, 184), b = randn64({2, 3}, true, 185);
  Tensor w = randn64({2, 2, 3}, false, 186);
  (stack({a, b}, 1) * w).sum().backward();
  auto wv = w.to_vector<double>();
  check_close(a.grad(), {wv[0], wv[1], wv[2], wv[6], wv[7], wv[8]}, 0, 0);
  check_close(b.grad(), {wv[3], wv[4], wv[5], wv[9], wv[10], wv[11]}, 0, 0);
  for (int d = 0; d < 3; ++d)
    check_grad(
        [&](const TensorList& in) {
          return TensorList{stack({in[0], in[1].t(), in[0]}, d)};
        },
        {randn64({2, 3}, true, 190), randn64({3, 2}, true, 191)});
  // A scalar list stacks into a vector.
  check_close(stack({scalar_tensor(1.0), scalar_tensor(2.0)}, 0), {1, 2}, 0, 0);
}

// ---- split / chunk ----------------------------------------------------------------------------------------------

TEST_CASE("split / chunk: piece sizes, values, views; gradcheck through the pieces") {
  Tensor x = randn64({5, 7}, false, 201);
  auto xv = x.to_vector<double>();
  TensorList s = split(x, 3, 1);
  REQUIRE(s.size() == 3);
  CHECK(s[0].shape() == Shape{5, 3});
  CHECK(s[2].shape() == Shape{5, 1});
  for (size_t k = 0; k < s.size(); ++k) {
    CHECK(s[k].shares_storage(x));
    std::vector<double> expect;
    for (int r = 0; r < 5; ++r)
      for (int64_t c = 3 * static_cast<int64_t>(k); c < std::min<int64_t>(7, 3 * static_cast<int64_t>(k) + 3); ++c)
        expect.push_back(xv[static_cast<size_t>(r * 7 + c)]);
    check_close(s[k], expect, 0, 0);
  }
  CHECK(split(x, 5, 0).size() == 1);
  CHECK(split(x, 10, -1).size() == 1);
  TensorList c = chunk(x, 3, 1);  // ceil(7/3) = 3 -> sizes 3, 3, 1
  REQUIRE(c.size() == 3);
  CHECK(c[0].size(1) == 3);
  CHECK(c[2].size(1) == 1);
  TensorList c4 = chunk(x, 4, 0);  // ceil(5/4) = 2 -> sizes 2, 2, 1 (fewer pieces, as in PyTorch)
  REQUIRE(c4.size() == 3);
  CHECK(c4[2].size(0) == 1);
  check_close(c4[1], std::vector<double>(xv.begin() + 14, xv.begin() + 28), 0, 0);
  CHECK(chunk(zeros({0, 2}), 3, 0).size() == 3);
  CHECK(split(zeros({0, 2}), 2, 0).size() == 1);

  Tensor w = randn64({5, 7}, true, 202);
  check_grad(
      [](const TensorList& in) {
        TensorList p = split(in[0], 2, 1);
        return TensorList{p[0] * p[1], p[3].exp(), p[2]};
      },
      {w});
  check_grad(
      [](const TensorList& in) {
        TensorList p = chunk(in[0].t(), 2, 0);  // through a non-contiguous input
        return TensorList{p[0].sum({0}) * p[1].sum({0}) + p[0].select(0, 1)};
      },
      {w});
  // The gradient of an unused piece is zero in the input.
  Tensor v = randn64({6}, true, 203);
  (chunk(v, 3, 0)[1] * 2.0).sum().backward();
  check_close(v.grad(), {0, 0, 2, 2, 0, 0}, 0, 0);
  // All pieces come from one node whose backward is one cat (not a node per piece, each building an input-sized
  // zero tensor); a piece used twice, and one used by a later piece's consumer, still sum correctly.
  TensorList q = split(v, 4, 0);
  REQUIRE(q.size() == 2);
  REQUIRE(q[0].grad_fn() != nullptr);
  CHECK(q[0].grad_fn() == q[1].grad_fn());
  CHECK(q[0].grad_fn()->name() == "split");
  v.zero_grad();
  (q[0].sum() * 3.0 + q[1].sum() + q[1].select(0, 0) * 5.0).backward();
  check_close(v.grad(), {3, 3, 3, 3, 6, 1}, 0, 0);
  // Without grad mode no node is recorded; the pieces stay views.
  {
    NoGradGuard ng;
    TensorList r = split(v, 4, 0);
    CHECK(r[0].grad_fn() == nullptr);
    CHECK(r[1].shares_storage(v));
  }
}

TEST_CASE("split_with_sizes: unequal and empty pieces, one node, gradcheck; sizes that do not add up are errors") {
  Tensor x = randn64({4, 9}, false, 204);
  auto xv = x.to_vector<double>();
  TensorList s = split_with_sizes(x, {2, 0, 4, 3}, -1);
  REQUIRE(s.size() == 4);
  const int64_t starts[] = {0, 2, 2, 6}, sizes[] = {2, 0, 4, 3};
  for (size_t k = 0; k < 4; ++k) {
    CHECK(s[k].shape() == Shape{4, sizes[k]});
    std::vector<double> expect;
    for (int r = 0; r < 4; ++r)
      for (int64_t c = starts[k]; c < starts[k] + sizes[k]; ++c) expect.push_back(xv[static_cast<size_t>(r * 9 + c)]);
    check_close(s[k], expect, 0, 0);
    if (sizes[k] > 0) CHECK(s[k].shares_storage(x));
  }
  check_grad(
      [](const TensorList& in) {
        TensorList p = split_with_sizes(in[0], {1, 3, 1}, 0);  // rows of a (5, 7)
        return TensorList{p[0] * p[2], p[1].exp()};
      },
      {randn64({5, 7}, true, 205)});
  Tensor v = randn64({6}, true, 206);
  TensorList q = split_with_sizes(v, {1, 2, 3}, 0);
  REQUIRE(q[0].grad_fn() != nullptr);
  CHECK(q[0].grad_fn() == q[2].grad_fn());
  (q[1].sum() * 2.0 + q[2].select(0, 2) * 7.0).backward();  // q[0] unused: zero gradient
  check_close(v.grad(), {0, 2, 2, 0, 0, 7}, 0, 0);
  CHECK(split_with_sizes(x, {9}, 1)[0].shape() == Shape{4, 9});  // one piece: the whole dim
  check_error([&] { split_with_sizes(x, {4, 4}, 1); }, {"split_with_sizes", "8", "9"});
  check_error([&] { split_with_sizes(x, {-1, 10}, 1); }, {"split_with_sizes", "non-negative"});
  check_error([&] { split_with_sizes(x, {10}, 1); }, {"split_with_sizes", "more than", "9"});
  check_error(
      [&] {
        split_with_sizes(x, {5, std::numeric_limits<int64_t>::max()}, 1);
      },
      {"split_with_sizes", "more than"});
  check_error([&] { split_with_sizes(x, {}, 1); }, {"split_with_sizes", "no sizes"});
  check_error([&] { split_with_sizes(x, {4}, 2); }, {"split_with_sizes"});
  check_error([&] { split_with_sizes(Tensor(), {1}, 0); }, {"split_with_sizes"});
  check_error([&] { split_with_sizes(scalar_tensor(1.0), {1}, 0); }, {"split_with_sizes", "at least 1 dimension"});
}

// ---- one_hot / embedding ----------------------------------------------------------------------------------------

TEST_CASE("one_hot: vs naive, dtypes, non-contiguous index") {
  Tensor index = rand_index(5, {4, 3}, 211).t();  // (3, 4) non-contiguous
  auto iv = index.to_vector<int64_t>();
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool}) {
    Tensor y = one_hot(index, 6, dt);
    CHECK(y.shape() == Shape{3, 4, 6});
    CHECK(y.dtype() == dt);
    std::vector<double> expect(72, 0.0);
    for (size_t j = 0; j < iv.size(); ++j) expect[j * 6 + static_cast<size_t>(iv[j])] = 1.0;
    check_close(y, expect, 0, 0);
  }
  check_close(one_hot(itensor({2}, {}), 3), {0, 0, 1}, 0, 0);
  CHECK_FALSE(one_hot(index, 6).requires_grad());
}

TEST_CASE("embedding: forward vs naive; backward accumulates and skips padding_idx; gradcheck") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor wt = rand_of(dt, {7, 4}, 221);
    Tensor index = rand_index(7, {5, 3}, 222).t();  // (3, 5) non-contiguous
    Tensor y = embedding(wt, index);
    CHECK(y.shape() == Shape{3, 5, 4});
    auto wv = wt.to_vector<double>();
    auto iv = index.to_vector<int64_t>();
    std::vector<double> expect;
    for (int64_t t : iv)
      for (int c = 0; c < 4; ++c) expect.push_back(wv[static_cast<size_t>(t * 4 + c)]);
    check_close(y, expect, 0, 0);
    // Padding rows still read the table in the forward pass (as in PyTorch).
    check_close(embedding(wt, index, 2), expect, 0, 0);
  }
  Tensor w = randn64({6, 3}, true, 231);
  Tensor index = itensor({1, 4, 1, 0, 4, 4, 5, 1}, {2, 4});
  Tensor g = randn64({2, 4, 3}, false, 232);
  (embedding(w, index, /*padding_idx=*/4) * g).sum().backward();
  auto gv = g.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  std::vector<double> expect(18, 0.0);
  for (size_t j = 0; j < iv.size(); ++j)
    if (iv[j] != 4)
      for (size_t c = 0; c < 3; ++c) expect[static_cast<size_t>(iv[j]) * 3 + c] += gv[j * 3 + c];
  check_close(w.grad(), expect, 1e-12, 0);
  CHECK(w.grad().to_vector<double>()[12] == 0.0);  // row 4 (padding) gets nothing

  Tensor w2 = randn64({5, 4}, true, 233);
  Tensor idx2 = rand_index(5, {3, 6}, 234);
  check_grad([&](const TensorList& in) { return TensorList{embedding(in[0], idx2)}; }, {w2});
  check_grad([&](const TensorList& in) { return TensorList{embedding(in[0], itensor({3, 3, 0}, {3}))}; }, {w2});
  // A 0-d index gives a (D,) row.
  CHECK(embedding(w2, itensor({2}, {})).shape() == Shape{4});
}

// ---- errors -----------------------------------------------------------------------------------------------------

TEST_CASE("errors: index dtype, bounds (checked before writing), shapes") {
  Tensor x = randn64({3, 4});
  Tensor fidx = tensor({0.0, 1.0}, {2});
  check_error([&] { index_select(x, 0, fidx); }, {"index_select", "int64", "float32"});
  check_error([&] { gather(x, 0, fidx.reshape({1, 2})); }, {"gather", "int64"});
  check_error([&] { scatter_add(x, 0, fidx.reshape({1, 2}), x); }, {"scatter_add", "int64"});
  check_error([&] { one_hot(fidx, 3); }, {"one_hot", "int64"});
  check_error([&] { embedding(x, fidx); }, {"embedding", "int64"});

  check_error([&] { index_select(x, 1, itensor({0, 4}, {2})); }, {"index_select", "index 4", "size 4"});
  check_error([&] { index_select(x, 0, itensor({-1}, {1})); }, {"index_select", "index -1", "size 3", "negative"});
  check_error([&] { index_select(x, 2, itensor({0}, {1})); }, {"index_select", "dimension 2"});
  check_error([&] { index_select(x, 0, itensor({0, 1}, {1, 2})); }, {"index_select", "1-D", "[1, 2]"});
  check_error([&] { gather(x, 1, itensor({0, 9}, {1, 2})); }, {"gather", "index 9", "size 4"});
  check_error([&] { gather(x, 0, itensor({-2, 0}, {1, 2})); }, {"gather", "index -2", "size 3"});
  check_error([&] { gather(x, 0, itensor({0, 1}, {2})); }, {"gather", "same rank", "[2]", "[3, 4]"});
  check_error([&] { gather(x, 0, zeros({1, 5}, {.dtype = kInt64})); }, {"gather", "[1, 5]", "dimension 1"});

  // scatter_add validates before writing: x is untouched and no partial result is produced.
  Tensor xs = randn64({3, 4});
  auto before = xs.to_vector<double>();
  check_error(
      [&] {
        scatter_add(xs, 0, itensor({0, 1, 3, 0}, {1, 4}), randn64({1, 4}));
      },
      {"scatter_add", "index 3", "size 3"});
  CHECK(xs.to_vector<double>() == before);
  check_error(
      [&] {
        scatter_add(xs, 0, itensor({0, 1, 2, 0}, {1, 4}), randn64({2, 4}));
      },
      {"scatter_add", "src shape [2, 4]", "index shape [1, 4]"});
  check_error(
      [&] {
        scatter_add(xs, 0, itensor({0, 1, 2, 0}, {1, 4}), randn32({1, 4}));
      },
      {"scatter_add", "float32", "float64"});
  check_error(
      [&] {
        scatter_add(xs, 1, zeros({4, 1}, {.dtype = kInt64}), randn64({4, 1}));
      },
      {"scatter_add", "[4, 1]", "[3, 4]"});

  check_error([&] { one_hot(itensor({0, 3}, {2}), 3); }, {"one_hot", "index 3", "num_classes 3"});
  check_error([&] { one_hot(itensor({-1}, {1}), 3); }, {"one_hot", "index -1"});
  check_error([&] { one_hot(itensor({0}, {1}), 0); }, {"one_hot", "num_classes", "0"});

  check_error([&] { embedding(x, itensor({0, 3}, {2})); }, {"embedding", "index 3", "3 embeddings"});
  check_error([&] { embedding(x, itensor({-1}, {1})); }, {"embedding", "index -1"});
  check_error([&] { embedding(x, itensor({0}, {1}), 3); }, {"embedding", "padding_idx 3"});
  check_error([&] { embedding(x, itensor({0}, {1}), -2); }, {"embedding", "padding_idx -2"});
  check_error([&] { embedding(randn64({3}), itensor({0}, {1})); }, {"embedding", "2-D", "[3]"});
}

TEST_CASE("errors: cat / stack / split / chunk") {
  Tensor a = randn64({2, 3}), b = randn64({2, 4});
  check_error([&] { cat({}, 0); }, {"cat", "non-empty"});
  check_error([&] { stack({}, 0); }, {"stack", "non-empty"});
  check_error([&] { cat({a, b}, 0); }, {"cat", "position 1", "[2, 4]", "[2, 3]"});
  check_error([&] { cat({a, randn32({2, 3})}, 0); }, {"cat", "position 1", "float32", "float64"});
  check_error([&] { cat({a, randn64({2, 3, 1})}, 0); }, {"cat", "position 1", "3 dimensions", "[2, 3, 1]"});
  check_error([&] { cat({a, a}, 2); }, {"cat", "dimension 2"});
  check_error([&] { cat({a, a}, -3); }, {"cat", "dimension -3"});
  check_error([&] { cat({scalar_tensor(1.0), scalar_tensor(2.0)}, 0); }, {"cat", "zero-dimensional"});
  check_error([&] { stack({a, a, b}, 0); }, {"stack", "position 2", "[2, 4]", "[2, 3]"});
  check_error([&] { stack({a, randn32({2, 3})}, 0); }, {"stack", "position 1", "float32"});
  check_error([&] { stack({a, a}, 3); }, {"stack", "dimension 3"});
  check_error([&] { split(a, 0, 0); }, {"split", "positive", "0"});
  check_error([&] { split(a, -2, 0); }, {"split", "-2"});
  check_error([&] { split(a, 1, 2); }, {"split", "dimension 2"});
  check_error([&] { chunk(a, 0, 0); }, {"chunk", "positive", "0"});
  check_error([&] { chunk(scalar_tensor(1.0), 2, 0); }, {"chunk", "at least 1 dimension"});
}
