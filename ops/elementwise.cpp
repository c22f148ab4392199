// Elementwise ops: validation, type promotion, output allocation, the kernel call through the device dispatch,
// and each op's backward right beside its forward.
#include "ops/elementwise.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/dispatch.h"
#include "ops/reduce.h"

namespace asc {

using autograd::SavedTensor;
using math::Binary;
using math::Unary;
using math::UnaryParams;

// ---- unary ------------------------------------------------------------------------------------------------------

namespace {

Tensor unary_op(const char* name, Unary op, const Tensor& x, UnaryParams p = {}) {
  check_defined(name, x);
  Tensor xin = is_floating(x.dtype()) ? x : x.to(kFloat32);
  Tensor y = Tensor::empty(xin.shape(), xin.options());
  ASC_KERNEL(xin.device(), name, unary, op, p, xin, y);
  if (autograd::needs_grad(xin)) {
    // Save only what the derivative reads (both share storage with x / y: no copies).
    SavedTensor xs = math::unary_grad_uses_x(op) ? SavedTensor(xin, name) : SavedTensor();
    SavedTensor ys = math::unary_grad_uses_y(op) ? SavedTensor(y, name) : SavedTensor();
    autograd::record(name, {xin}, {y}, [name, op, p, xs, ys](const TensorList& g) -> TensorList {
      const Tensor& gy = g[0];
      // The kernel reads x and y only where the derivative needs them; unused slots get g as a stand-in.
      const Tensor& xv = xs.defined() ? xs.get() : gy;
      const Tensor& yv = ys.defined() ? ys.get() : gy;
      Tensor gx = Tensor::empty(gy.shape(), gy.options());
      ASC_KERNEL(gy.device(), name, unary_backward, op, p, gy, xv, yv, gx);
      return {gx};
    });
  }
  return y;
}

UnaryParams scalar(double a) {
  UnaryParams p;
  p.a = a;
  return p;
}

}  // namespace

Tensor neg(const Tensor& x) { return unary_op("neg", Unary::Neg, x); }
Tensor exp(const Tensor& x) { return unary_op("exp", Unary::Exp, x); }
Tensor log(const Tensor& x) { return unary_op("log", Unary::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", Unary::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op("rsqrt", Unary::Rsqrt, x); }
Tensor abs(const Tensor& x) { return unary_op("abs", Unary::Abs, x); }
Tensor relu(const Tensor& x) { return unary_op("relu", Unary::Relu, x); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return unary_op("gelu", tanh_approximation ? Unary::GeluTanh : Unary::Gelu, x);
}
Tensor silu(const Tensor& x) { return unary_op("silu", Unary::Silu, x); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", Unary::Sigmoid, x); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", Unary::Tanh, x); }
Tensor softplus(const Tensor& x, double beta, double threshold) {
  ASC_CHECK(beta > 0 && std::isfinite(beta), "softplus: beta must be positive and finite, got {}", beta);
  ASC_CHECK(!std::isnan(threshold), "softplus: threshold must not be NaN");
  UnaryParams p;
  p.a = beta;
  p.b = threshold;
  return unary_op("softplus", Unary::Softplus, x, p);
}
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  ASC_CHECK(!(lo && hi && *lo > *hi), "clamp: lower bound {} is above upper bound {}", *lo, *hi);
  ASC_CHECK(!(lo && std::isnan(*lo)) && !(hi && std::isnan(*hi)), "clamp: bounds must not be NaN");
  UnaryParams p;
  if (lo) p.lo = *lo;
  if (hi) p.hi = *hi;
  return unary_op("clamp", Unary::Clamp, x, p);
}
Tensor add(const Tensor& a, double b) { return unary_op("add", Unary::AddScalar, a, scalar(b)); }
Tensor sub(const Tensor& a, double b) { return unary_op("sub", Unary::AddScalar, a, scalar(-b)); }
Tensor rsub(double a, const Tensor& b) { return unary_op("rsub", Unary::RSubScalar, b, scalar(a)); }
Tensor mul(const Tensor& a, double b) { return unary_op("mul", Unary::MulScalar, a, scalar(b)); }
Tensor div(const Tensor& a, double b) { return unary_op("div", Unary::MulScalar, a, scalar(1.0 / b)); }
Tensor rdiv(double a, const Tensor& b) { return unary_op("rdiv", Unary::RDivScalar, b, scalar(a)); }
Tensor pow(const Tensor& a, double e) { return unary_op("pow", Unary::PowScalar, a, scalar(e)); }

// ---- binary -----------------------------------------------------------------------------------------------------

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  // Sum the leading extra dims and the dims where `shape` has 1 but g does not.
  const int lead = g.dim() - shape.size();
  ASC_CHECK(lead >= 0, "sum_to: cannot reduce shape {} to {}", g.shape(), shape);
  Dims axes;
  for (int i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.size(i) != 1)) axes.push_back(i);
  Tensor r = axes.empty() ? g : sum(g, axes, /*keepdim=*/true);
  return r.reshape(shape);
}

namespace {

// Promotes a and b to a common dtype and checks devices; returns the broadcast output shape.
Shape prepare_binary(const char* name, Tensor& a, Tensor& b, bool float_only) {
  check_defined(name, a, "first input");
  check_defined(name, b, "second input");
  check_same_device(name, {&a, &b});
  DType t = promote_types(a.dtype(), b.dtype());
  if (float_only && !is_floating(t)) t = kFloat32;
  if (a.dtype() != t) a = a.to(t);
  if (b.dtype() != t) b = b.to(t);
  return a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), name);
}

Tensor binary_kernel(const char* name, Binary op, const Tensor& a, const Tensor& b, const Shape& shape, DType out_dt) {
  Tensor out = Tensor::empty(shape, {out_dt, a.device()});
  ASC_KERNEL(a.device(), name, binary, op, a, b, out);
  return out;
}

// Which operands an arithmetic op's backward reads.
struct Saves {
  bool a = false, b = false, out = false;
};

// Arithmetic binary op: bool operands are promoted to int64 (as in PyTorch); gradients go through `backward`,
// which receives the saved a, b and output (undefined SavedTensors where `saves` says they are not needed).
template <class Backward>
Tensor arith(const char* name, Binary op, Tensor a, Tensor b, Saves saves, Backward backward, bool float_only = false) {
  Shape shape = prepare_binary(name, a, b, float_only);
  if (a.dtype() == kBool) {
    a = a.to(kInt64);
    b = b.to(kInt64);
  }
  Tensor out = binary_kernel(name, op, a, b, shape, a.dtype());
  if (autograd::needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    bool ga = a.requires_grad(), gb = b.requires_grad();
    SavedTensor as = saves.a ? SavedTensor(a, name) : SavedTensor();
    SavedTensor bs = saves.b ? SavedTensor(b, name) : SavedTensor();
    SavedTensor os = saves.out ? SavedTensor(out, name) : SavedTensor();
    autograd::record(name, {a, b}, {out}, [=](const TensorList& g) -> TensorList {
      auto [da, db] = backward(g[0], as, bs, os, ga, gb);
      return {da.defined() ? sum_to(da, sa) : Tensor(), db.defined() ? sum_to(db, sb) : Tensor()};
    });
  }
  return out;
}

using GradPair = std::pair<Tensor, Tensor>;

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return arith("add", Binary::Add, a, b, {}, [](const Tensor& g, auto&, auto&, auto&, bool ga, bool gb) {
    return GradPair{ga ? g : Tensor(), gb ? g : Tensor()};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return arith("sub", Binary::Sub, a, b, {}, [](const Tensor& g, auto&, auto&, auto&, bool ga, bool gb) {
    return GradPair{ga ? g : Tensor(), gb ? neg(g) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return arith("mul", Binary::Mul, a, b, {.a = b.requires_grad(), .b = a.requires_grad()},
               [](const Tensor& g, const SavedTensor& as, const SavedTensor& bs, auto&, bool ga, bool gb) {
                 return GradPair{ga ? mul(g, bs.get()) : Tensor(), gb ? mul(g, as.get()) : Tensor()};
               });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return arith(
      "div", Binary::Div, a, b, {.b = true, .out = b.requires_grad()},
      [](const Tensor& g, const SavedTensor& as, const SavedTensor& bs, const SavedTensor& os, bool ga, bool gb) {
        Tensor gdiv = div(g, bs.get());  // d(a/b)/da = 1/b ; d(a/b)/db = -(a/b)/b
        return GradPair{ga ? gdiv : Tensor(), gb ? neg(mul(gdiv, os.get())) : Tensor()};
      },
      /*float_only=*/true);
}

Tensor pow(const Tensor& a, const Tensor& b) {
  return arith(
      "pow", Binary::Pow, a, b, {.a = true, .b = true, .out = true},
      [](const Tensor& g, const SavedTensor& as, const SavedTensor& bs, const SavedTensor& os, bool ga, bool gb) {
        const Tensor &x = as.get(), &e = bs.get();
        Tensor da = ga ? mul(g, mul(e, pow(x, sub(e, 1.0)))) : Tensor();
        // d(x^e)/de = x^e log x; defined as 0 where x == 0 (the limit for e > 0).
        Tensor db = gb ? mul(g, where(eq(x, 0.0), 0.0, mul(os.get(), log(x)))) : Tensor();
        return GradPair{da, db};
      },
      /*float_only=*/true);
}

namespace {
// d max(a, b): 1 to the larger, split 1/2 each on ties, as in PyTorch: each side gets g unless it lost outright
// (g/2 on a tie). Where a or b is NaN neither lost, so both get g, as PyTorch's formula gives.
GradPair extremum_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max, bool ga, bool gb) {
  Tensor tie_half = mul(eq(a, b).to(g.dtype()), 0.5);
  Tensor da = ga ? mul(g, rsub(1.0, add((is_max ? lt(a, b) : gt(a, b)).to(g.dtype()), tie_half))) : Tensor();
  Tensor db = gb ? mul(g, rsub(1.0, add((is_max ? gt(a, b) : lt(a, b)).to(g.dtype()), tie_half))) : Tensor();
  return {da, db};
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return arith("maximum", Binary::Max, a, b, {.a = true, .b = true},
               [](const Tensor& g, const SavedTensor& as, const SavedTensor& bs, auto&, bool ga, bool gb) {
                 return extremum_grad(g, as.get(), bs.get(), true, ga, gb);
               });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  return arith("minimum", Binary::Min, a, b, {.a = true, .b = true},
               [](const Tensor& g, const SavedTensor& as, const SavedTensor& bs, auto&, bool ga, bool gb) {
                 return extremum_grad(g, as.get(), bs.get(), false, ga, gb);
               });
}

// ---- comparisons --------------------------------------------------------------------------------------------------

namespace {
Tensor compare(const char* name, Binary op, Tensor a, Tensor b) {
  Shape shape = prepare_binary(name, a, b, false);
  return binary_kernel(name, op, a, b, shape, kBool);
}
Tensor compare_scalar(const char* name, Binary op, const Tensor& a, double b) {
  check_defined(name, a);
  return compare(name, op, a,
                 scalar_tensor(b, {.dtype = is_floating(a.dtype()) ? a.dtype() : kFloat64, .device = a.device()}));
}
Tensor logical(const char* name, Binary op, Tensor a, Tensor b) {
  check_defined(name, a);
  check_defined(name, b);
  ASC_CHECK(a.dtype() == kBool && b.dtype() == kBool, "{}: expected bool tensors, got {} and {}", name, a.dtype(),
            b.dtype());
  return compare(name, op, a, b);
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", Binary::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", Binary::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", Binary::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", Binary::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", Binary::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", Binary::Ge, a, b); }
Tensor eq(const Tensor& a, double b) { return compare_scalar("eq", Binary::Eq, a, b); }
Tensor ne(const Tensor& a, double b) { return compare_scalar("ne", Binary::Ne, a, b); }
Tensor lt(const Tensor& a, double b) { return compare_scalar("lt", Binary::Lt, a, b); }
Tensor le(const Tensor& a, double b) { return compare_scalar("le", Binary::Le, a, b); }
Tensor gt(const Tensor& a, double b) { return compare_scalar("gt", Binary::Gt, a, b); }
Tensor ge(const Tensor& a, double b) { return compare_scalar("ge", Binary::Ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return logical("logical_and", Binary::And, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logical("logical_or", Binary::Or, a, b); }
Tensor logical_not(const Tensor& a) {
  check_defined("logical_not", a);
  ASC_CHECK(a.dtype() == kBool, "logical_not: expected a bool tensor, got {}", a.dtype());
  return compare("logical_not", Binary::Eq, a, scalar_tensor(0, {.dtype = kBool, .device = a.device()}));
}

Tensor isnan(const Tensor& x) {
  check_defined("isnan", x);
  if (!is_floating(x.dtype())) return zeros(x.shape(), {.dtype = kBool, .device = x.device()});
  Tensor out = Tensor::empty(x.shape(), {kBool, x.device()});
  ASC_KERNEL(x.device(), "isnan", isnan, x, out);
  return out;
}

bool has_non_finite(const Tensor& x) {
  if (!is_floating(x.dtype()) || x.numel() == 0) return false;
  NoGradGuard ng;
  // x - x is 0 for finite values and NaN for NaN / inf.
  return sum(isnan(sub(x, x)).to(kInt64)).item<int64_t>() > 0;
}

// ---- selection ----------------------------------------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  check_defined("where", cond, "condition");
  ASC_CHECK(cond.dtype() == kBool, "where: condition must be a bool tensor, got {}", cond.dtype());
  Tensor a = a_in, b = b_in;
  check_same_device("where", {&cond, &a, &b});
  Shape shape = prepare_binary("where", a, b, false);
  shape = broadcast_shapes(cond.shape(), shape, "where");
  Tensor out = Tensor::empty(shape, a.options());
  ASC_KERNEL(a.device(), "where", where, cond, a, b, out);
  if (autograd::needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    bool ga = a.requires_grad(), gb = b.requires_grad();
    autograd::record("where", {a, b}, {out}, [=, cs = SavedTensor(cond, "where")](const TensorList& g) -> TensorList {
      Tensor z = zeros({}, g[0].options());
      return {ga ? sum_to(where(cs.get(), g[0], z), sa) : Tensor(),
              gb ? sum_to(where(cs.get(), z, g[0]), sb) : Tensor()};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, double b) {
  check_defined("where", a);
  return where(cond, a, scalar_tensor(b, a.options()));
}

// ---- tril / triu ----------------------------------------------------------------------------------------------------

namespace {
// (R, C) bool on `device`: j - i <= diagonal (lower) or >= diagonal (upper).
Tensor triangle_keep(int64_t R, int64_t C, int64_t diagonal, bool lower, Device device) {
  NoGradGuard ng;
  const Tensor i = arange(R, {.dtype = kInt64, .device = device}).unsqueeze(1);  // (R, 1)
  const Tensor j = arange(C, {.dtype = kInt64, .device = device}).unsqueeze(0);  // (1, C)
  const Tensor offset = sub(j, i);                                               // (R, C): j - i
  return lower ? le(offset, static_cast<double>(diagonal)) : ge(offset, static_cast<double>(diagonal));
}

Tensor triangle(const Tensor& x, int64_t diagonal, bool lower, const char* op) {
  check_defined(op, x);
  ASC_CHECK(x.dim() >= 2, "{}: expected a tensor of at least 2 dimensions (the last two are the matrix), got shape {}",
            op, x.shape());
  // where() with a 0-d zero of x's dtype: the gradient flows through where's, masked alike
  return where(triangle_keep(x.size(-2), x.size(-1), diagonal, lower, x.device()), x,
               zeros({}, {.dtype = x.dtype(), .device = x.device()}));
}
}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true, "tril"); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false, "triu"); }

Tensor where(const Tensor& cond, double a, const Tensor& b) {
  check_defined("where", b);
  return where(cond, scalar_tensor(a, b.options()), b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", x);
  check_defined("masked_fill", mask, "mask");
  ASC_CHECK(mask.dtype() == kBool, "masked_fill: mask must be a bool tensor, got {}", mask.dtype());
  ASC_CHECK(broadcast_shapes(mask.shape(), x.shape(), "masked_fill") == x.shape(),
            "masked_fill: mask of shape {} does not broadcast to the input shape {}", mask.shape(), x.shape());
  return where(mask, scalar_tensor(value, x.options()), x);
}

}  // namespace asc
