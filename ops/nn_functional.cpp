// nn functional ops: validation, layout (the reduced dim moved last and made contiguous), the fused CPU kernels
// through the device dispatch (ops/kernel_list.inc), and each op's backward right beside its forward.
// mse_loss, dropout and linear are composites of elementwise ops / matmul and get their gradients from those.
#include "ops/nn_functional.h"

#include <cmath>
#include <vector>

#include "autograd/node.h"
#include "core/autocast.h"
#include "core/generator.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/kernels.h"
#include "ops/linalg.h"
#include "ops/reduce.h"

namespace asc {

using autograd::SavedTensor;

namespace {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "None";
    case Reduction::Mean: return "Mean";
    case Reduction::Sum: return "Sum";
  }
  return "?";
}

// True when `m` broadcasts to exactly `s` (it may not enlarge s).
bool broadcasts_to(const Shape& m, const Shape& s) {
  if (m.size() > s.size()) return false;
  const int lead = s.size() - m.size();
  for (int i = 0; i < m.size(); ++i)
    if (m[i] != 1 && m[i] != s[i + lead]) return false;
  return true;
}

// ---- softmax / log_softmax -------------------------------------------------------------------------------------

Tensor softmax_impl(const char* name, bool log, const Tensor& x_in, int64_t dim, const Tensor& mask_in) {
  check_defined(name, x_in);
  check_floating(name, x_in);
  check_same_device(name, {&x_in, &mask_in});
  const int d0 = wrap_dim(dim, x_in.dim(), name);
  if (mask_in.defined()) {
    ASC_CHECK(mask_in.dtype() == kBool, "{}: mask must be a bool tensor (true = keep), got {}", name, mask_in.dtype());
    ASC_CHECK(broadcasts_to(mask_in.shape(), x_in.shape()), "{}: mask of shape {} does not broadcast to input shape {}",
              name, mask_in.shape(), x_in.shape());
  }
  // A 0-d input is a row of one element.
  const bool scalar = x_in.dim() == 0;
  const Tensor x = scalar ? x_in.reshape({1}) : x_in;
  const int d = scalar ? 0 : d0, last = x.dim() - 1;
  Tensor xt = x.detach();
  if (d != last) xt = xt.transpose(d, last);
  xt = xt.contiguous();
  Tensor mt;
  if (mask_in.defined()) {
    mt = mask_in.expand(x_in.shape());
    if (scalar) mt = mt.reshape({1});
    if (d != last) mt = mt.transpose(d, last);
    mt = mt.contiguous();
  }
  Tensor yt = Tensor::empty(xt.shape(), xt.options());
  ASC_KERNEL(x.device(), name, softmax_forward, xt, mt, log, yt);
  Tensor y = d == last ? yt : yt.transpose(d, last).contiguous();
  if (autograd::needs_grad(x)) {
    autograd::record(name, {x}, {y},
                     [name, log, d, last, ys = SavedTensor(yt, name),
                      ms = mt.defined() ? SavedTensor(mt, name) : SavedTensor()](const TensorList& g) -> TensorList {
                       Tensor gt = d == last ? g[0] : g[0].transpose(d, last);
                       gt = gt.contiguous();
                       const Tensor& yv = ys.get();
                       Tensor mv = ms.defined() ? ms.get() : Tensor();
                       Tensor gxt = Tensor::empty(yv.shape(), yv.options());
                       ASC_KERNEL(yv.device(), name, softmax_backward, gt, yv, mv, log, gxt);
                       return {d == last ? gxt : gxt.transpose(d, last).contiguous()};
                     });
  }
  return scalar ? y.reshape({}) : y;
}

// ---- layer_norm / rms_norm -------------------------------------------------------------------------------------

Tensor norm_impl(const char* name, bool rms, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias,
                 double eps) {
  check_defined(name, x);
  check_floating(name, x);
  check_same_device(name, {&x, &weight, &bias});
  ASC_CHECK(ns.size() >= 1, "{}: normalized_shape must not be empty (input shape {})", name, x.shape());
  bool match = ns.size() <= x.dim();
  for (int i = 0; match && i < ns.size(); ++i) match = ns[i] == x.size(x.dim() - ns.size() + i);
  ASC_CHECK(match, "{}: normalized_shape {} does not match the trailing dimensions of input shape {}", name, ns,
            x.shape());
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    ASC_CHECK(p->shape() == ns, "{}: {} shape {} must equal normalized_shape {}", name, what, p->shape(), ns);
    ASC_CHECK(p->dtype() == x.dtype(), "{}: {} dtype {} differs from input dtype {}", name, what, p->dtype(),
              x.dtype());
  }
  ASC_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps must be finite and non-negative, got {}", name, eps);
  const int64_t n = numel_of(ns);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor x2 = x.detach().contiguous().reshape({rows, n});
  Tensor w1 = weight.defined() ? weight.detach().contiguous().reshape({n}) : Tensor();
  Tensor b1 = bias.defined() ? bias.detach().contiguous().reshape({n}) : Tensor();
  Tensor y2 = Tensor::empty({rows, n}, x.options());
  // Row statistics in the accumulation dtype: float32 for bfloat16 / float16 inputs (rounding rstd to 16 bits would
  // put a per-row error of up to 2^-9 into every gradient, which the weight gradient's sum over rows accumulates).
  const DType stat_dt = accumulate_dtype(x.dtype());
  Tensor mean = rms ? Tensor() : Tensor::empty({rows}, {.dtype = stat_dt, .device = x.device()});
  Tensor rstd = Tensor::empty({rows}, {.dtype = stat_dt, .device = x.device()});
  ASC_KERNEL(x.device(), name, layer_norm_forward, x2, w1, b1, eps, rms, y2, mean, rstd);
  Tensor y = y2.view(x.shape());
  if (autograd::needs_grad(x, weight, bias)) {
    const bool gx_needed = x.requires_grad(), gw_needed = weight.defined() && weight.requires_grad(),
               gb_needed = bias.defined() && bias.requires_grad();
    Shape xs = x.shape();
    autograd::record(name, {x, weight, bias}, {y},
                     [=, xsv = SavedTensor(x2, name), ws = w1.defined() ? SavedTensor(w1, name) : SavedTensor(),
                      ms = rms ? SavedTensor() : SavedTensor(mean, name),
                      rs = SavedTensor(rstd, name)](const TensorList& g) -> TensorList {
                       const Tensor& xv = xsv.get();
                       Tensor g2 = g[0].contiguous().reshape({rows, n});
                       Tensor wv = ws.defined() ? ws.get() : Tensor();
                       Tensor mv = ms.defined() ? ms.get() : Tensor();
                       Tensor gx = gx_needed ? Tensor::empty({rows, n}, xv.options()) : Tensor();
                       Tensor gw = gw_needed ? Tensor::empty({n}, xv.options()) : Tensor();
                       Tensor gb = gb_needed ? Tensor::empty({n}, xv.options()) : Tensor();
                       ASC_KERNEL(xv.device(), name, layer_norm_backward, g2, xv, wv, mv, rs.get(), rms, gx, gw, gb);
                       return {gx.defined() ? gx.view(xs) : Tensor(), gw.defined() ? gw.view(ns) : Tensor(),
                               gb.defined() ? gb.view(ns) : Tensor()};
                     });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim, const Tensor& mask) {
  return softmax_impl("softmax", false, x, dim, mask);
}

Tensor log_softmax(const Tensor& x, int64_t dim, const Tensor& mask) {
  return softmax_impl("log_softmax", true, x, dim, mask);
}

// ---- cross_entropy ---------------------------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& logits, const Tensor& target, CrossEntropyOptions opts) {
  const char* name = "cross_entropy";
  check_defined(name, logits, "logits");
  check_defined(name, target, "target");
  check_floating(name, logits);
  check_same_device(name, {&logits, &target});
  ASC_CHECK(target.dtype() == kInt64, "cross_entropy: target must hold int64 class indices, got dtype {}",
            target.dtype());
  ASC_CHECK(logits.dim() >= 1, "cross_entropy: logits must be (C), (N, C) or (N, C, d...), got shape {}",
            logits.shape());
  ASC_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0,
            "cross_entropy: label_smoothing must be in [0, 1], got {}", opts.label_smoothing);
  Shape tshape;  // logits' shape without the class dim
  for (int i = 0; i < logits.dim(); ++i)
    if (i != (logits.dim() == 1 ? 0 : 1)) tshape.push_back(logits.size(i));
  ASC_CHECK(target.shape() == tshape, "cross_entropy: target shape {} does not match logits shape {} (expected {})",
            target.shape(), logits.shape(), tshape);
  const int cdim = logits.dim() == 1 ? 0 : 1;
  const int64_t C = logits.size(cdim);
  const int64_t R = numel_of(tshape);
  ASC_CHECK(C > 0 || R == 0, "cross_entropy: logits of shape {} have no classes", logits.shape());
  // Targets are validated (and counted) before anything is allocated or written.
  Tensor t1 = target.detach().contiguous().reshape({R});
  int64_t count = 0;
  {
    Tensor th = t1.device().is_cpu() ? t1 : t1.cpu();
    const int64_t* tp = th.data_ptr<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = tp[r];
      if (t == opts.ignore_index) continue;
      ASC_CHECK(t >= 0 && t < C,
                "cross_entropy: target value {} is out of range for {} classes (valid: [0, {}) or "
                "ignore_index {})",
                t, C, C, opts.ignore_index);
      ++count;
    }
  }
  // (R, C) with the classes last.
  Tensor x2 = logits.detach();
  if (logits.dim() > 2) {
    Dims order;
    order.push_back(0);
    for (int i = 2; i < logits.dim(); ++i) order.push_back(i);
    order.push_back(1);
    x2 = x2.permute(order);
  }
  x2 = x2.contiguous().reshape({R, C});
  Tensor loss = Tensor::empty({R}, logits.options());
  Tensor stats = Tensor::empty({R, 2}, logits.options());
  ASC_KERNEL(logits.device(), name, cross_entropy_forward, x2, t1, opts.ignore_index, opts.label_smoothing, loss,
             stats);
  Tensor out;
  {
    NoGradGuard ng;
    switch (opts.reduction) {
      case Reduction::None: out = loss.view(tshape); break;
      case Reduction::Sum: out = sum(loss); break;
      case Reduction::Mean:
        out = count > 0 ? div(sum(loss), static_cast<double>(count)) : zeros({}, logits.options());
        break;
    }
  }
  if (autograd::needs_grad(logits)) {
    const Reduction red = opts.reduction;
    const double scale = red == Reduction::Mean ? (count > 0 ? 1.0 / static_cast<double>(count) : 0.0) : 1.0;
    const int64_t ignore = opts.ignore_index;
    const double smoothing = opts.label_smoothing;
    Shape lshape = logits.shape();
    autograd::record(name, {logits}, {out},
                     [=, xs = SavedTensor(x2, name), ts = SavedTensor(t1, name),
                      ss = SavedTensor(stats, name)](const TensorList& g) -> TensorList {
                       Tensor gl = red == Reduction::None ? g[0].reshape({R}) : g[0].reshape({1}).expand({R});
                       const Tensor& xv = xs.get();
                       Tensor gx2 = Tensor::empty({R, C}, xv.options());
                       ASC_KERNEL(xv.device(), name, cross_entropy_backward, gl, scale, xv, ts.get(), ss.get(), ignore,
                                  smoothing, gx2);
                       if (lshape.size() <= 2) return {gx2.view(lshape)};
                       // (N, d..., C) -> (N, C, d...)
                       Shape perm_shape;
                       perm_shape.push_back(lshape[0]);
                       for (int i = 2; i < lshape.size(); ++i) perm_shape.push_back(lshape[i]);
                       perm_shape.push_back(C);
                       Dims inv;
                       inv.push_back(0);
                       inv.push_back(lshape.size() - 1);
                       for (int i = 1; i < lshape.size() - 1; ++i) inv.push_back(i);
                       return {gx2.view(perm_shape).permute(inv).contiguous()};
                     });
  }
  return out;
}

// ---- nll_loss --------------------------------------------------------------------------------------------------

// Composed of gather and elementwise ops (their backwards give the gradient: -weight[t] at each target's place).
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& opts) {
  const char* name = "nll_loss";
  check_defined(name, input, "input");
  check_defined(name, target, "target");
  check_floating(name, input);
  check_same_device(name, {&input, &target});
  ASC_CHECK(target.dtype() == kInt64, "nll_loss: target must hold int64 class indices, got dtype {}", target.dtype());
  ASC_CHECK(input.dim() >= 2, "nll_loss: input must be log-probabilities (N, C) or (N, C, d...), got shape {}",
            input.shape());
  Shape tshape = input.shape();  // input's shape without the class dim
  tshape.erase(1);
  ASC_CHECK(target.shape() == tshape, "nll_loss: target shape {} does not match input shape {} (expected {})",
            target.shape(), input.shape(), tshape);
  const int64_t C = input.size(1);
  if (opts.weight.defined()) {
    ASC_CHECK(is_floating(opts.weight.dtype()) && opts.weight.dim() == 1 && opts.weight.size(0) == C,
              "nll_loss: weight must be a floating (C) = ({}) tensor, got {} {}", C, opts.weight.dtype(),
              opts.weight.shape());
    check_same_device(name, {&input, &opts.weight});
  }
  int64_t counted = 0;
  {  // targets validated before anything is computed
    const std::vector<int64_t> t = target.detach().cpu().contiguous().to_vector<int64_t>();
    for (int64_t v : t) {
      ASC_CHECK(v == opts.ignore_index || (v >= 0 && v < C),
                "nll_loss: target value {} is out of range for {} classes (valid: [0, {}) or ignore_index {})", v, C, C,
                opts.ignore_index);
      counted += v != opts.ignore_index;
    }
  }
  const Tensor valid = ne(target, static_cast<double>(opts.ignore_index));  // (N, d...) bool
  const Tensor t = where(valid, target, zeros({}, {.dtype = kInt64, .device = target.device()}));
  const Tensor picked = gather(input, 1, t.unsqueeze(1)).squeeze(1);  // (N, d...): input[n, t_n, ...]
  const TensorOptions fo{.dtype = input.dtype(), .device = input.device()};
  const Tensor zero = zeros({}, fo);
  const Tensor w = where(valid,
                         opts.weight.defined()
                             ? index_select(opts.weight.detach().to(input.dtype()), 0, t.reshape({-1})).reshape(tshape)
                             : ones(tshape, fo),
                         zero);
  // where(), not w * input: an ignored place may hold -inf (a log-probability of 0), and 0 * -inf is NaN
  const Tensor loss = where(valid, neg(mul(picked, w)), zero);
  if (opts.reduction == Reduction::None) return loss;
  if (opts.reduction == Reduction::Sum) return sum(loss);
  // Mean: divided by the counted targets' weights, as PyTorch does (also when they sum to 0); all ignored: the sum, 0
  return counted > 0 ? div(sum(loss), sum(w)) : sum(loss);
}

// ---- mse_loss --------------------------------------------------------------------------------------------------

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_defined("mse_loss", input, "input");
  check_defined("mse_loss", target, "target");
  check_same_device("mse_loss", {&input, &target});
  ASC_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()),
            "mse_loss: input and target must be floating point, got {} and {}", input.dtype(), target.dtype());
  ASC_CHECK(input.shape() == target.shape(), "mse_loss: input shape {} and target shape {} must be equal",
            input.shape(), target.shape());
  ASC_CHECK(reduction != Reduction::Mean || input.numel() > 0, "mse_loss: reduction {} of an empty input (shape {})",
            reduction_name(reduction), input.shape());
  Tensor d = sub(input, target);
  Tensor sq = mul(d, d);
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    case Reduction::Mean: return mean(sq);
  }
  return sq;
}

// ---- layer_norm / rms_norm -------------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return norm_impl("layer_norm", false, x, normalized_shape, weight, bias, eps);
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  return norm_impl("rms_norm", true, x, normalized_shape, weight, Tensor(), eps);
}

// ---- dropout ---------------------------------------------------------------------------------------------------

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_defined("dropout", x);
  check_floating("dropout", x);
  ASC_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  // keep where u >= p, u ~ U[0, 1) drawn exactly as rand(x.shape()) would: probability 1 - p; p = 1 keeps
  // nothing. One fused pass writes the output and the mask, already scaled by 1 / (1 - p); the backward is g * mask.
  Generator& g = gen ? *gen : default_generator();
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  Tensor mask = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  const uint64_t per = x.dtype() == kFloat64 ? 2 : 4, n = static_cast<uint64_t>(x.numel());
  const Generator::State s = g.draw((n + per - 1) / per);
  ASC_KERNEL(x.device(), "dropout", dropout, xc, out, mask, s.seed, s.offset, p, p < 1.0 ? 1.0 / (1.0 - p) : 0.0);
  if (autograd::needs_grad(x))
    autograd::record("dropout", {x}, {out}, [ms = SavedTensor(mask, "dropout")](const TensorList& gs) -> TensorList {
      return {mul(gs[0], ms.get())};
    });
  return out;
}

// ---- bias_activation_dropout -------------------------------------------------------------------------------------

namespace {
math::Unary unary_of(Activation act) {
  switch (act) {
    case Activation::Relu: return math::Unary::Relu;
    case Activation::Gelu: return math::Unary::Gelu;
    case Activation::GeluTanh: return math::Unary::GeluTanh;
    case Activation::Silu: return math::Unary::Silu;
  }
  ASC_THROW("bias_activation_dropout: unknown activation {}", static_cast<int>(act));
}
Tensor activation(const Tensor& x, Activation act) {
  switch (act) {
    case Activation::Relu: return relu(x);
    case Activation::Gelu: return gelu(x);
    case Activation::GeluTanh: return gelu(x, true);
    case Activation::Silu: return silu(x);
  }
  ASC_THROW("bias_activation_dropout: unknown activation {}", static_cast<int>(act));
}
}  // namespace

Tensor bias_activation_dropout(const Tensor& x, const Tensor& bias, Activation act, double p, bool training,
                               Generator* gen) {
  static constexpr const char* kOp = "bias_activation_dropout";
  check_defined(kOp, x);
  check_floating(kOp, x);
  check_same_device(kOp, {&x, &bias});
  const math::Unary op = unary_of(act);
  ASC_CHECK(p >= 0.0 && p <= 1.0, "{}: probability p must be in [0, 1], got {}", kOp, p);
  ASC_CHECK(x.dim() >= 1, "{}: input must have at least 1 dimension (..., n), got shape {}", kOp, x.shape());
  if (bias.defined()) {
    ASC_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), "{}: bias shape {} must be ({}) for input shape {}", kOp,
              bias.shape(), x.size(-1), x.shape());
    ASC_CHECK(bias.dtype() == x.dtype(), "{}: bias dtype {} differs from input dtype {}", kOp, bias.dtype(), x.dtype());
  }
  // The kernels take float32 and float64, and bfloat16 / float16 on CUDA (computed in float, rounded once); the CPU's
  // 16-bit tensors compose the three ops.
  if (x.dtype() != kFloat32 && x.dtype() != kFloat64 && !x.device().is_cuda())
    return dropout(activation(bias.defined() ? add(x, bias) : x, act), p, training, gen);

  const bool drop = training && p > 0.0;
  const Tensor xc = x.detach().contiguous();
  const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  Tensor keep = drop ? Tensor::empty(x.shape(), {.dtype = kBool, .device = x.device()}) : Tensor();
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  // dropout's draw: the same counters, so the generator ends where dropout(...) would leave it
  Generator::State s{};
  if (drop) {
    Generator& g = gen ? *gen : default_generator();
    const uint64_t per = x.dtype() == kFloat64 ? 2 : 4, n = static_cast<uint64_t>(x.numel());
    s = g.draw((n + per - 1) / per);
  }
  // The backward's factor act'(x + bias), computed in the forward's pass (float32 for 16-bit x, whose backward
  // computes in float): the backward is then one product per element instead of the activation's derivative again
  // from a saved x (GELU's Φ, an erfc and two exponentials per element). It takes x's place among the saved tensors.
  const bool grad = autograd::needs_grad(x, bias);
  Tensor slope;
  if (grad) {
    const DType st = x.dtype() == kFloat32 || x.dtype() == kFloat64 ? x.dtype() : kFloat32;
    slope = Tensor::empty(x.shape(), {.dtype = st, .device = x.device()});
  }
  ASC_KERNEL(x.device(), kOp, bias_act_dropout, op, xc, bc, out, keep, slope, s.seed, s.offset, p, scale);
  if (grad) {
    const bool gb_needed = bias.defined() && bias.requires_grad();
    autograd::record(kOp, {x, bias}, {out},
                     [scale, gb_needed, dtype = x.dtype(), ss = SavedTensor(slope, kOp),
                      ks = drop ? SavedTensor(keep, kOp) : SavedTensor()](const TensorList& g) -> TensorList {
                       const Tensor& sv = ss.get();
                       const Tensor gc = g[0].contiguous();
                       Tensor gx = Tensor::empty(sv.shape(), {.dtype = dtype, .device = sv.device()});
                       ASC_KERNEL(sv.device(), kOp, bias_act_dropout_backward, gc, sv,
                                  ks.defined() ? ks.get() : Tensor(), scale, gx);
                       Tensor gb;
                       if (gb_needed) {  // the bias's gradient: gx summed over every leading dim
                         const int64_t n = sv.size(-1), rows = n > 0 ? sv.numel() / n : 0;
                         gb = n > 0 ? sum(gx.reshape({rows, n}), {0}) : Tensor::empty({0}, gx.options());
                       }
                       return {gx, gb};
                     });
  }
  return out;
}

// ---- linear ----------------------------------------------------------------------------------------------------

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined("linear", x, "input");
  check_defined("linear", weight, "weight");
  check_same_device("linear", {&x, &weight, &bias});
  check_floating("linear", x);
  ASC_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out, in), got shape {}", weight.shape());
  ASC_CHECK(x.dim() >= 1, "linear: input must have at least 1 dimension (..., in), got shape {}", x.shape());
  ASC_CHECK(x.size(-1) == weight.size(1), "linear: input shape {} has {} features but weight shape {} expects {}",
            x.shape(), x.size(-1), weight.shape(), weight.size(1));
  ASC_CHECK(weight.dtype() == x.dtype(), "linear: weight dtype {} differs from input dtype {}", weight.dtype(),
            x.dtype());
  if (bias.defined()) {
    ASC_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
              "linear: bias shape {} must be ({}) for weight shape {}", bias.shape(), weight.size(0), weight.shape());
    ASC_CHECK(bias.dtype() == x.dtype(), "linear: bias dtype {} differs from input dtype {}", bias.dtype(), x.dtype());
  }
  const int64_t in = weight.size(1), out = weight.size(0);
  // One GEMM over all leading dims: (rows, in) @ (in, out).
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out;
  Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, in});
  // under CpuAutocast (core/autocast.h), float32 CPU products in bfloat16, as torch.autocast("cpu") runs linear
  const bool autocast = cpu_autocast_enabled() && x.device().is_cpu() && x.dtype() == kFloat32;
  // with a bias, addmm: the bias added as the product's rows are written
  const Tensor y = autocast ? (bias.defined() ? addmm_bf16(bias, x2, weight.t()) : matmul_bf16(x2, weight.t()))
                            : (bias.defined() ? addmm(bias, x2, weight.t()) : matmul(x2, weight.t()));
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

}  // namespace asc
