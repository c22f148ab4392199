// Elementwise ops beyond the op table (tests/op_table.cpp holds each unary and binary op with its float64 reference,
// checked through contiguous, transposed, sliced and broadcast inputs, and gradchecked, by test_op_table): GELU's
// float32 accuracy in the tails, pow(x, 2)'s exact square, derivative conventions at kinks and ties, comparisons and
// logical ops, error cases, integer arithmetic.
#include <bit>
#include <functional>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

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

// The float32 transcendental ops run vectorised functions of their own on the CPU (ops/cpu/vec_math.h: exp_full,
// log_full, tanh_full, sigmoid_full), not libm. Measured here against float64 libm on every 9973rd float32 bit pattern
// (both signs, subnormals to infinities) plus the edges of each function's range, at every instruction set level this
// processor runs: the forward within 4 ulp of the correctly rounded value (a subnormal result within 4 ulp of 2^-149
// for silu, whose x σ(x) rounds twice there), the derivatives close, the IEEE special values as libm gives them, and a
// strided view the same bits as its contiguous copy.
TEST_CASE("float32 exp / log / tanh / sigmoid / silu / softplus / gelu-tanh on the CPU: within 4 ulp of float64") {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 9973) xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  // edges: zeros, subnormals, tanh's switch at 0.625, exp's overflow and underflow thresholds, softplus's threshold
  // (β 2, threshold 20: x = 10)
  for (float e :
       {0.0f,   -0.0f,  1e-45f, -1e-45f, 1.17549435e-38f, 1.0f,    0.625f,  -0.625f, 0.62499994f, 9.0f,  -9.0f,
        88.72f, 88.73f, -87.4f, -103.2f, -103.9f,         -104.0f, -150.0f, 10.0f,   10.000001f,  20.0f, -20.0f})
    xs.push_back(e);
  while (xs.size() % 16 != 0) xs.push_back(0.5f);  // whole rows of the strided view below
  const int64_t n = static_cast<int64_t>(xs.size());
  auto sig = [](double v) { return v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v)); };
  auto gelu_u = [](double v) { return 0.7978845608028654 * (v + 0.044715 * v * v * v); };
  struct Case {
    std::string name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref, dref;
    double sub_abs;  // a subnormal result's allowed error beyond 4 ulp
    // ulp beyond 4 for an ill-conditioned argument: GELU-tanh's e^{2u} carries u's own float rounding times |2u|
    std::function<double(double)> cond = [](double) { return 0.0; };
  };
  const std::vector<Case> cases = {
      {"exp", [](const Tensor& t) { return exp(t); }, [](double v) { return std::exp(v); },
       [](double v) { return std::exp(v); }, 0},
      {"log", [](const Tensor& t) { return log(t); }, [](double v) { return std::log(v); },
       [](double v) { return 1 / v; }, 0},
      {"tanh", [](const Tensor& t) { return tanh(t); }, [](double v) { return std::tanh(v); },
       [](double v) { return 1 - std::tanh(v) * std::tanh(v); }, 0},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, sig, [&](double v) { return sig(v) * (1 - sig(v)); }, 0},
      {"silu", [](const Tensor& t) { return silu(t); }, [&](double v) { return v * sig(v); },
       [&](double v) { return sig(v) * (1 + v * (1 - sig(v))); }, 1e-43},
      {"softplus(β 2, threshold 20)", [](const Tensor& t) { return softplus(t, 2.0, 20.0); },
       [](double v) { return 2 * v > 20 ? v : std::log1p(std::exp(2 * v)) / 2; },
       [&](double v) { return 2 * v > 20 ? 1 : sig(2 * v); }, 0},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, true); }, [&](double v) { return v * sig(2 * gelu_u(v)); },
       [&](double v) {
         const double s = sig(2 * gelu_u(v));
         return s + 2 * v * s * (1 - s) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
       },
       0, [&](double v) { return 4 * std::abs(2 * gelu_u(v)); }},
  };
  const CpuIsa prev = cpu_isa();
  for (CpuIsa isa : {CpuIsa::baseline, CpuIsa::x86_64_v3, CpuIsa::x86_64_v4}) {
    if (isa > cpu_isa_supported()) continue;
    set_cpu_isa(isa);
    const std::string level = cpu_isa_name(isa);
    CAPTURE(level);
    for (const Case& c : cases) {
      CAPTURE(c.name);
      Tensor x = tensor(xs, {n}, {.requires_grad = true});
      Tensor y = c.op(x);
      y.backward(full({n}, 1.0, {.dtype = kFloat32}));
      const std::vector<float> yv = y.to_vector<float>(), gv = x.grad().to_vector<float>();
      int64_t bad = 0, bad_grad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = xs[i], r = c.ref(v), dr = c.dref(v);
        if (std::isnan(r)) {
          bad += !std::isnan(yv[i]);
        } else if (std::isinf(static_cast<float>(r))) {  // overflows in float32 (or is infinite)
          bad += yv[i] != static_cast<float>(r);
        } else {
          int e = 0;
          std::frexp(r, &e);
          const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
          bad += !(std::abs(yv[i] - r) <= (4 + c.cond(v)) * ulp + c.sub_abs);
        }
        // derivatives: within a few float roundings of float64's value, where it is a finite float32 and the
        // function not saturated (beyond |x| = 10^4 GELU-tanh's x³ overflows, as in PyTorch)
        if (std::isfinite(static_cast<float>(dr)) && std::abs(v) < 1e4)
          bad_grad += !(std::abs(gv[i] - dr) <= 1e-6 * std::max(1.0, std::abs(dr)));
      }
      CHECK(bad == 0);
      CHECK(bad_grad == 0);
      // NaN in, NaN out; a strided view gives its contiguous copy's bits
      CHECK(std::isnan(c.op(tensor({NAN}, {1}, {.dtype = kFloat32})).item<float>()));
      Tensor x2 = x.detach().reshape({16, n / 16});
      CHECK(same_bits(c.op(x2.t()).contiguous(), c.op(x2.t().contiguous())));
    }
    // IEEE specials as libm gives them
    const Tensor sp = tensor({0.0, -0.0, INFINITY, -INFINITY, -1.0}, {5}, {.dtype = kFloat32});
    CHECK(exp(sp).to_vector<float>() == std::vector<float>{1, 1, INFINITY, 0, std::exp(-1.0f)});
    const std::vector<float> lg = log(sp).to_vector<float>();
    CHECK((lg[0] == -INFINITY && lg[1] == -INFINITY && lg[2] == INFINITY && std::isnan(lg[3]) && std::isnan(lg[4])));
    const std::vector<float> th = tanh(sp).to_vector<float>();
    CHECK((th[0] == 0 && !std::signbit(th[0]) && th[1] == 0 && std::signbit(th[1]) && th[2] == 1 && th[3] == -1));
    CHECK(sigmoid(sp).to_vector<float>()[2] == 1.0f);
    CHECK(sigmoid(sp).to_vector<float>()[3] == 0.0f);
  }
  set_cpu_isa(prev);
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
