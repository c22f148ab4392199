// Elementwise ops: forward against naive loops (contiguous, transposed, broadcast; float32 and float64),
// float64 gradchecks, and error cases.
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input domain for random tests
};

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.1, 5},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.1, 5},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 5},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::abs(x); }, -3, 3},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, -3, 3},
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); },
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigm(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigm, -5, 5},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"softplus", [](const Tensor& x) { return softplus(x, 2.0, 5.0); },
       [](double x) { return 2 * x > 5 ? x : std::log1p(std::exp(2 * x)) / 2; }, -4, 4},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); },
       [](double x) { return std::min(0.7, std::max(-0.5, x)); }, -2, 2},
      {"clamp_lo", [](const Tensor& x) { return clamp(x, 0.2, std::nullopt); },
       [](double x) { return std::max(0.2, x); }, -2, 2},
      {"add_scalar", [](const Tensor& x) { return x + 1.5; }, [](double x) { return x + 1.5; }, -2, 2},
      {"sub_scalar", [](const Tensor& x) { return x - 1.5; }, [](double x) { return x - 1.5; }, -2, 2},
      {"rsub_scalar", [](const Tensor& x) { return 1.5 - x; }, [](double x) { return 1.5 - x; }, -2, 2},
      {"mul_scalar", [](const Tensor& x) { return x * -2.0; }, [](double x) { return -2 * x; }, -2, 2},
      {"div_scalar", [](const Tensor& x) { return x / 4.0; }, [](double x) { return x / 4; }, -2, 2},
      {"rdiv_scalar", [](const Tensor& x) { return 2.0 / x; }, [](double x) { return 2 / x; }, 0.5, 3},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }, [](double x) { return std::pow(x, 2.5); }, 0.2, 3},
      {"pow_square", [](const Tensor& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, -3, 3},
  };
}

// Uniform random in [lo, hi), avoiding a band around 0 for ops with a kink there.
Tensor uniform64(const Shape& s, double lo, double hi, uint64_t seed) {
  Generator g(seed);
  return rand(s, {.dtype = kFloat64}, &g) * (hi - lo) + lo;
}

Tensor away_from_kinks(const Tensor& x) {
  // push |x| < 0.05 and values near the clamp bounds away (gradcheck is undefined at kinks)
  auto v = x.to_vector<double>();
  for (double& e : v) {
    for (double k : {0.0, -0.5, 0.7, 0.2})
      if (std::abs(e - k) < 0.05) e = k + 0.1;
  }
  return tensor(std::span<const double>(v), x.shape(), {.dtype = kFloat64});
}

}  // namespace

TEST_CASE("unary ops: forward vs naive, contiguous and transposed, float32 and float64") {
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    Tensor x = uniform64({5, 7}, c.lo, c.hi, 3);
    auto xv = x.to_vector<double>();
    std::vector<double> ref;
    for (double v : xv) ref.push_back(c.ref(v));
    check_close(c.op(x), ref, 1e-12, 1e-10);
    check_close(c.op(x.to(kFloat32)), ref, 1e-5, 1e-5);
    CHECK(c.op(x.to(kFloat32)).dtype() == kFloat32);
    // non-contiguous input: the transposed view, compared with the transposed reference
    Tensor xt = x.t();
    Tensor yt = c.op(xt);
    CHECK(yt.shape() == Shape{7, 5});
    auto yv = yt.to_vector<double>();
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 5; ++j) CHECK(yv[i * 5 + j] == doctest::Approx(ref[j * 7 + i]).epsilon(1e-10));
  }
}

TEST_CASE(
    "gelu float32 on the CPU: near float precision in the centre and the tails, contiguous = strided, NaN / inf") {
  // The float32 CPU kernel computes Φ from erfc (ops/cpu/vec_math.h), so its relative error stays small where
  // 1 + erf(x/√2) would cancel (x < -4); the reference is float64 erfc. Rows long enough for the vectorised,
  // multi-threaded loops, and a transposed view of the same values.
  const int64_t n = 1 << 16;
  std::vector<float> xs(n);
  for (int64_t i = 0; i < n; ++i) xs[i] = -9.0f + 18.0f * static_cast<float>(i) / static_cast<float>(n - 1);
  Tensor x = tensor(xs, {n}, {.requires_grad = true});
  Tensor y = gelu(x);
  Tensor g = full({n}, 0.75, {.dtype = kFloat32});
  y.backward(g);
  const std::vector<float> yv = y.to_vector<float>(), gv = x.grad().to_vector<float>();
  double worst_centre = 0, worst_mid = 0, worst_tail = 0, worst_grad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xd = xs[i], cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double ref = xd * cdf, ref_grad = 0.75 * (cdf + xd * std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI));
    if (ref == 0) continue;
    const double rel = std::abs(yv[i] - ref) / std::abs(ref);
    (std::abs(xd) <= 2 ? worst_centre
     : xd >= -4        ? worst_mid
                       : worst_tail) = std::max(std::abs(xd) <= 2 ? worst_centre
                                         : xd >= -4        ? worst_mid
                                                           : worst_tail,
                                         rel);
    worst_grad = std::max(worst_grad, std::abs(gv[i] - ref_grad));
  }
  CHECK(worst_centre < 1e-6);
  CHECK(worst_mid < 3e-6);
  CHECK(worst_tail < 3e-5);  // values below 1e-4 |x|: the float exponent's own precision
  CHECK(worst_grad < 1e-6);
  // a strided view gets the same numbers, bit for bit
  Tensor x2 = x.detach().reshape({256, 256});
  CHECK(gelu(x2.t()).contiguous().to_vector<float>() == gelu(x2.t().contiguous()).to_vector<float>());
  // IEEE specials as x/2 (1 + erf(x/√2)) gives them
  const std::vector<float> sp =
      gelu(tensor({NAN, INFINITY, -INFINITY, 0.0}, {4}, {.dtype = kFloat32})).to_vector<float>();
  CHECK(std::isnan(sp[0]));
  CHECK(sp[1] == INFINITY);
  CHECK(std::isnan(sp[2]));
  CHECK(sp[3] == 0.0f);
}

TEST_CASE("unary ops: float64 gradcheck") {
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    Tensor x = away_from_kinks(uniform64({3, 4}, c.lo, c.hi, 5)).set_requires_grad(true);
    check_grad([&](const TensorList& in) { return TensorList{c.op(in[0])}; }, {x});
    check_grad([&](const TensorList& in) { return TensorList{c.op(in[0].t())}; }, {x});
  }
}

// pow(x, 2) is computed as x · x (no libm call): the square correctly rounded, the special values as pow gives them.
TEST_CASE("pow(x, 2): the exact square, special values, and its gradient 2x") {
  const std::vector<double> xs = {-3.0, -0.0, 0.0, 1.1, 1e20, -1e-30, INFINITY, -INFINITY, NAN};
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = tensor(xs, {static_cast<int64_t>(xs.size())}, {.dtype = dt, .requires_grad = true});
    Tensor y = pow(x, 2.0);
    sum(y).backward();
    const auto xv = x.to_vector<double>(), yv = y.to_vector<double>(), gv = x.grad().to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      CAPTURE(xs[i]);
      // the float product of two floats is exact in double: rounding it once gives the correctly rounded square
      const double want = dt == kFloat32 ? static_cast<double>(static_cast<float>(xv[i] * xv[i])) : xv[i] * xv[i];
      if (std::isnan(want)) {
        CHECK(std::isnan(yv[i]));
        CHECK(std::isnan(gv[i]));
      } else {
        CHECK(yv[i] == want);
        CHECK(!std::signbit(yv[i]));
        CHECK(gv[i] == 2 * xv[i]);
      }
    }
  }
}

TEST_CASE("relu / abs / clamp derivative conventions at the kinks") {
  Tensor x = tensor({-1.0, 0.0, 1.0}, {.dtype = kFloat64, .requires_grad = true});
  relu(x).sum().backward();
  check_close(x.grad(), {0, 0, 1});
  x.zero_grad();
  abs(x).sum().backward();
  check_close(x.grad(), {-1, 0, 1});
  x.zero_grad();
  clamp(x, -1.0, 0.5).sum().backward();
  check_close(x.grad(), {1, 1, 0});
  check_close(softplus(tensor({100.0}, {.dtype = kFloat64})), {100});  // threshold keeps it finite
  check_close(sigmoid(tensor({-800.0, 800.0}, {.dtype = kFloat64})), {0, 1});
}

namespace {
struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  double lo, hi;
};
std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, -2, 2},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, -2, 2},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, -2, 2},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); }, 0.3, 2},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, -2, 2},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, -2, 2},
  };
}

// Naive broadcast: for each output index, read a and b at the broadcast positions.
std::vector<double> naive_broadcast(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  Shape out = broadcast_shapes(a.shape(), b.shape(), "test");
  auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> r;
  for (int64_t i = 0; i < numel_of(out); ++i) {
    auto idx = unravel(i, out);
    auto pick = [&](const Shape& s) {
      std::vector<int64_t> j;
      for (int d = 0; d < s.size(); ++d) {
        int64_t o = idx[static_cast<size_t>(out.size() - s.size() + d)];
        j.push_back(s[d] == 1 ? 0 : o);
      }
      return ravel(j, s);
    };
    r.push_back(f(av[static_cast<size_t>(pick(a.shape()))], bv[static_cast<size_t>(pick(b.shape()))]));
  }
  return r;
}
}  // namespace

TEST_CASE("binary ops: broadcasting and non-contiguous operands vs naive") {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{3, 4}, {3, 4}},    {{3, 4}, {4}},    {{3, 1}, {1, 4}},
                                                       {{2, 3, 4}, {3, 1}}, {{4}, {2, 3, 4}}, {{}, {2, 3}}};
  for (const auto& c : binary_cases()) {
    INFO(c.name);
    for (auto& [sa, sb] : shapes) {
      Tensor a = uniform64(sa, c.lo, c.hi, 11), b = uniform64(sb, c.lo, c.hi, 12);
      check_close(c.op(a, b), naive_broadcast(a, b, c.ref), 1e-12, 1e-10);
      check_close(c.op(a.to(kFloat32), b.to(kFloat32)), naive_broadcast(a, b, c.ref), 1e-5, 1e-5);
    }
    Tensor a = uniform64({4, 3}, c.lo, c.hi, 13), b = uniform64({3, 4}, c.lo, c.hi, 14);
    check_close(c.op(a.t(), b), naive_broadcast(a.t().contiguous(), b, c.ref), 1e-12, 1e-10);
    Tensor s = uniform64({3, 8}, c.lo, c.hi, 15).slice(1, 0, 8, 2);  // strided columns
    check_close(c.op(s, b), naive_broadcast(s.contiguous(), b, c.ref), 1e-12, 1e-10);
  }
}

TEST_CASE("binary ops: float64 gradcheck with broadcasting") {
  for (const auto& c : binary_cases()) {
    INFO(c.name);
    Tensor a = uniform64({2, 3, 4}, c.lo, c.hi, 21).set_requires_grad(true);
    Tensor b = uniform64({3, 1}, c.lo, c.hi, 22).set_requires_grad(true);
    check_grad([&](const TensorList& in) { return TensorList{c.op(in[0], in[1])}; }, {a, b});
    Tensor at = uniform64({4, 3}, c.lo, c.hi, 23).set_requires_grad(true);
    Tensor bt = uniform64({4}, c.lo, c.hi, 24).set_requires_grad(true);
    check_grad([&](const TensorList& in) { return TensorList{c.op(in[0].t(), in[1].unsqueeze(0))}; }, {at, bt});
  }
}

TEST_CASE("maximum/minimum split the gradient on ties") {
  Tensor a = tensor({1.0, 2.0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = tensor({1.0, 3.0}, {.dtype = kFloat64, .requires_grad = true});
  maximum(a, b).sum().backward();
  check_close(a.grad(), {0.5, 0});
  check_close(b.grad(), {0.5, 1});
}

TEST_CASE("comparisons, logical ops, where, masked_fill") {
  Tensor a = tensor({1, 2, 3, 4}, {2, 2}), b = tensor({2, 2}, {2});
  CHECK(eq(a, b).dtype() == kBool);
  check_close(eq(a, b), {0, 1, 0, 0});
  check_close(ne(a, b), {1, 0, 1, 1});
  check_close(lt(a, b), {1, 0, 0, 0});
  check_close(le(a, b), {1, 1, 0, 0});
  check_close(gt(a, b), {0, 0, 1, 1});
  check_close(ge(a, b), {0, 1, 1, 1});
  check_close(gt(a, 2.5), {0, 0, 1, 1});
  check_close(le(a.t(), 2.0), {1, 0, 1, 0});
  check_close(logical_and(gt(a, 1.5), lt(a, 3.5)), {0, 1, 1, 0});
  check_close(logical_or(lt(a, 1.5), gt(a, 3.5)), {1, 0, 0, 1});
  check_close(logical_not(gt(a, 2.5)), {1, 1, 0, 0});
  Tensor m = tensor({1, 0}, {2}).to(kBool);  // broadcast over rows
  check_close(where(m, a, -a), {1, -2, 3, -4});
  check_close(where(m, a, 0.0), {1, 0, 3, 0});
  check_close(masked_fill(a, m, -9.0), {-9, 2, -9, 4});
  Tensor x = randn64({3, 4}, true, 3), y = randn64({4}, true, 4);
  Tensor cond = gt(randn64({3, 1}, false, 5), 0.0);
  check_grad([&](const TensorList& in) { return TensorList{where(cond, in[0], in[1])}; }, {x, y});
  check_grad([&](const TensorList& in) { return TensorList{masked_fill(in[0], cond, 2.0)}; }, {x});
  check_close(isnan(tensor({1.0, NAN, 2.0}, {3})), {0, 1, 0});
  CHECK(has_non_finite(tensor({1.0, INFINITY}, {2})));
  CHECK(!has_non_finite(tensor({1.0, 2.0}, {2})));
  check_error([&] { where(a, a, a); }, {"where", "bool"});
  check_error([&] { masked_fill(a, tensor({1, 0, 1}, {3}).to(kBool), 0.0); }, {"masked_fill"});
  check_error([&] { logical_and(a, a); }, {"logical_and", "bool"});
}

TEST_CASE("elementwise error cases") {
  check_error([] { add(ones({2, 3}), ones({3, 2})); }, {"add", "[2, 3]", "[3, 2]"});
  check_error([] { mul(Tensor(), ones({2})); }, {"mul", "undefined"});
  check_error([] { clamp(ones({2}), 1.0, 0.0); }, {"clamp", "above"});
  check_error([] { softplus(ones({2}), -1.0); }, {"softplus", "beta"});
  check_error([] { sum_to(ones({3}), {2, 3}); }, {"sum_to"});
}

TEST_CASE("integer arithmetic stays integer; float ops on int64 promote to float32") {
  Tensor i = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  CHECK((i * i).to_vector<int64_t>() == std::vector<int64_t>{1, 4, 9});
  CHECK(exp(i).dtype() == kFloat32);
  CHECK(div(i, i).dtype() == kFloat32);
}
