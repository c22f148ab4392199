// firing_output (ops/firing.h): validation, the kernels (ops/kernel_list.inc: firing_*), one graph node.
#include "ops/firing.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "core/overlap.h"
#include "core/storage.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/kernels.h"
#include "ops/linalg.h"         // matmul
#include "ops/nn_functional.h"  // linear
#include "ops/reduce.h"

namespace asc {

namespace {
constexpr const char* kOp = "firing_output";
}  // namespace

FiringOutput firing_output(const Tensor& Z, const Tensor& SP, const Tensor& f, const GateOptions& gate) {
  check_defined(kOp, Z, "Z");
  check_defined(kOp, SP, "SP");
  check_defined(kOp, f, "f");
  check_same_device(kOp, {&Z, &SP, &f});
  check_float(kOp, Z, "Z");
  ASC_CHECK(Z.dim() == 2 && SP.dim() == 1 && f.dim() == 2 && SP.size(0) == Z.size(1) && f.size(0) == Z.size(1),
            "{}: expects Z (N, P), SP (P), f (P, alpha); got Z {}, SP {}, f {}", kOp, Z.shape(), SP.shape(), f.shape());
  ASC_CHECK(SP.dtype() == Z.dtype() && f.dtype() == Z.dtype(), "{}: Z, SP and f must share a dtype; got {}, {}, {}",
            kOp, Z.dtype(), SP.dtype(), f.dtype());
  ASC_CHECK(f.size(1) >= 1, "{}: f must have at least one output per neuron (alpha >= 1), got f {}", kOp, f.shape());
  checked_numel({Z.size(0), Z.size(1), f.size(1)}, kOp);  // Y (N, P, alpha): N P alpha must fit in int64
  const GateSpec spec = gate_spec(kOp, gate, Z.device());
  const Tensor z = Z.contiguous(), sp = SP.contiguous(), fw = f.contiguous();
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  FiringOutput out;
  out.F = Tensor::empty({N, P}, z.options());     // (N, P)
  out.Y = Tensor::empty({N, P, A}, z.options());  // (N, P, alpha)
  ASC_KERNEL(z.device(), kOp, firing_forward, z, sp, fw, out.F, out.Y);
  if (autograd::needs_grad({&Z, &SP, &f})) {
    using autograd::SavedTensor;
    autograd::record(kOp, {z, sp, fw}, {out.Y},
                     [zs = SavedTensor(z, kOp), sps = SavedTensor(sp, kOp), fs = SavedTensor(fw, kOp), F = out.F, A,
                      spec](const TensorList& g) -> TensorList {
                       const int64_t N = F.size(0), P = F.size(1);  // F: (N, P) in Z's dtype, on Z's device
                       Tensor dZ = Tensor::empty({N, P}, F.options()), dSP = Tensor::empty({P}, F.options()),
                              df = Tensor::empty({P, A}, F.options());
                       ASC_KERNEL(g[0].device(), kOp, firing_backward, zs.get(), sps.get(), fs.get(), F,
                                  g[0].contiguous(), spec, dZ, dSP, df);
                       return {dZ, dSP, df};
                     });
  }
  return out;
}

void firing_weight_update_(Tensor& W, const Tensor& keep, const Tensor& coef, const Tensor& X) {
  constexpr const char* op = "firing_weight_update_";
  check_defined(op, W, "W");
  check_defined(op, keep, "keep");
  check_defined(op, coef, "coef");
  check_defined(op, X, "X");
  check_same_device(op, {&W, &keep, &coef, &X});
  ASC_CHECK(W.dim() == 2 && keep.dim() == 1 && coef.dim() == 2 && X.dim() == 2 && keep.size(0) == W.size(0) &&
                coef.size(1) == W.size(0) && X.size(0) == coef.size(0) && X.size(1) == W.size(1),
            "{}: expects W (P, d), keep (P), coef (N, P), X (N, d); got W {}, keep {}, coef {}, X {}", op, W.shape(),
            keep.shape(), coef.shape(), X.shape());
  ASC_CHECK(keep.dtype() == W.dtype() && coef.dtype() == W.dtype() && X.dtype() == W.dtype(),
            "{}: W, keep, coef and X must share a dtype; got {}, {}, {}, {}", op, W.dtype(), keep.dtype(), coef.dtype(),
            X.dtype());
  ASC_CHECK(W.dtype() == kFloat32 || W.dtype() == kFloat64, "{}: needs float32 or float64, got {}", op, W.dtype());
  ASC_CHECK(W.is_contiguous(), "{}: W must be contiguous (it is written in place), got strides {}", op, W.strides());
  // No graph is recorded: refuse rather than return a W whose gradient silently stops here.
  ASC_CHECK(!autograd::needs_grad({&W, &keep, &coef, &X}),
            "{}: is not differentiable and writes W {} in place, but an input requires grad; call it under "
            "NoGradGuard (an optimizer-side update)",
            op, W.shape());
  // The kernel reads keep, coef and X while it writes W: an input that shares W's memory (W itself, a view of it, a
  // partly overlapping view) is read from a copy, so the result is that of the call with unaliased inputs.
  auto read = [&](const Tensor& t) {
    return mem_overlap(t, W) != MemOverlap::None ? t.clone().contiguous() : t.contiguous();
  };
  const Tensor k = read(keep), c = read(coef), x = read(X);
  ASC_KERNEL(W.device(), op, firing_weight_update, W, k, c, x);
  W.impl()->storage->bump_version();
}

FiringBatchSums firing_batch_sums(const Tensor& Z, const Tensor& F, const Tensor& SP) {
  constexpr const char* op = "firing_batch_sums";
  check_defined(op, Z, "Z");
  check_defined(op, F, "F");
  check_defined(op, SP, "SP");
  check_same_device(op, {&Z, &F, &SP});
  ASC_CHECK(Z.dim() == 2 && F.shape() == Z.shape() && SP.dim() == 1 && SP.size(0) == Z.size(1),
            "{}: expects Z (N, P), F (N, P), SP (P); got Z {}, F {}, SP {}", op, Z.shape(), F.shape(), SP.shape());
  ASC_CHECK((Z.dtype() == kFloat32 || Z.dtype() == kFloat64) && F.dtype() == Z.dtype() && SP.dtype() == Z.dtype(),
            "{}: Z, F and SP must share a dtype, float32 or float64; got {}, {}, {}", op, Z.dtype(), F.dtype(),
            SP.dtype());
  ASC_CHECK(!autograd::needs_grad({&Z, &F, &SP}),
            "{}: is not differentiable, but an input requires grad; call it under NoGradGuard", op);
  const int64_t P = Z.size(1);
  FiringBatchSums s{Tensor::empty({P}, Z.options()), Tensor::empty({P}, Z.options()), Tensor::empty({P}, Z.options())};
  ASC_KERNEL(Z.device(), op, firing_batch_sums, Z.contiguous(), F.contiguous(), SP.contiguous(), s.fz2, s.fired,
             s.margin);
  return s;
}

Tensor firing_rule_b_coef(const Tensor& Z, const Tensor& F, double a, const Tensor& dZ, const Tensor& c) {
  constexpr const char* op = "firing_rule_b_coef";
  check_defined(op, Z, "Z");
  check_defined(op, F, "F");
  ASC_CHECK(dZ.defined() == c.defined(), "{}: dZ and c go together (both given, or neither); got dZ {}, c {}", op,
            dZ.defined() ? "given" : "undefined", c.defined() ? "given" : "undefined");
  check_same_device(op, {&Z, &F, &dZ, &c});  // skips the undefined ones
  ASC_CHECK(Z.dim() == 2 && F.shape() == Z.shape() &&
                (!dZ.defined() || (dZ.shape() == Z.shape() && c.dim() == 1 && c.size(0) == Z.size(1))),
            "{}: expects Z (N, P), F (N, P) and optionally dZ (N, P), c (P); got Z {}, F {}, dZ {}, c {}", op,
            Z.shape(), F.shape(), dZ.defined() ? dZ.shape() : Shape{}, c.defined() ? c.shape() : Shape{});
  ASC_CHECK((Z.dtype() == kFloat32 || Z.dtype() == kFloat64) && F.dtype() == Z.dtype() &&
                (!dZ.defined() || (dZ.dtype() == Z.dtype() && c.dtype() == Z.dtype())),
            "{}: Z, F (and dZ, c) must share a dtype, float32 or float64; got {}, {}", op, Z.dtype(), F.dtype());
  ASC_CHECK(!autograd::needs_grad({&Z, &F, &dZ, &c}),
            "{}: is not differentiable, but an input requires grad; call it under NoGradGuard", op);
  ASC_CHECK(std::isfinite(a), "{}: the coefficient a must be finite, got {}", op, a);
  Tensor coef = Tensor::empty(Z.shape(), Z.options());  // (N, P)
  ASC_KERNEL(Z.device(), op, firing_rule_b_coef, Z.contiguous(), F.contiguous(), a,
             dZ.defined() ? dZ.contiguous() : Tensor(), c.defined() ? c.contiguous() : Tensor(), coef);
  return coef;
}

Tensor ssm_scan(const Tensor& a, const Tensor& u, const Tensor& s0_in, bool rms_norm, double eps) {
  constexpr const char* op = "ssm_scan";
  check_defined(op, a, "a");
  check_defined(op, u, "u");
  check_defined(op, s0_in, "s0");
  check_same_device(op, {&a, &u, &s0_in});
  check_float(op, a, "a");
  ASC_CHECK(a.dim() == 3 && u.shape() == a.shape(), "{}: expects a and u (B, T, R) of one shape; got a {}, u {}", op,
            a.shape(), u.shape());
  const int64_t B = a.size(0), R = a.size(2);
  ASC_CHECK((s0_in.dim() == 1 && s0_in.size(0) == R) || (s0_in.dim() == 2 && s0_in.size(0) == B && s0_in.size(1) == R),
            "{}: s0 must be ({}) or ({}, {}); got {}", op, R, B, R, s0_in.shape());
  ASC_CHECK(u.dtype() == a.dtype() && s0_in.dtype() == a.dtype(), "{}: a, u and s0 must share a dtype; got {}, {}, {}",
            op, a.dtype(), u.dtype(), s0_in.dtype());
  ASC_CHECK(std::isfinite(eps) && eps > 0, "{}: eps must be positive and finite, got {}", op, eps);
  // The CUDA kernels keep a row's state in one thread block (cuda/firing_launch.h: kMaxScanChannels); checked here,
  // with the others, before anything runs.
  ASC_CHECK(!a.device().is_cuda() || R <= kSsmScanMaxCudaChannels,
            "{}: {} state channels; the CUDA kernel takes at most {}", op, R, kSsmScanMaxCudaChannels);
  if (a.numel() == 0) {
    // No rows, steps or channels: s is empty and every gradient is zero — without the (B, R) copy of a shared s0,
    // which need not fit in memory (or in int64) when T = 0 and B is huge.
    Tensor s = Tensor::empty(a.shape(), a.options());
    if (autograd::needs_grad({&a, &u, &s0_in}))
      autograd::record(
          op, {a, u, s0_in}, {s},
          [shape = a.shape(), s0_shape = s0_in.shape(), opts = a.options()](const TensorList&) -> TensorList {
            return {zeros(shape, opts), zeros(shape, opts), zeros(s0_shape, opts)};
          });
    return s;
  }
  const Tensor ac = a.contiguous(), uc = u.contiguous();
  const Tensor s0 = s0_in.dim() == 1 ? s0_in.view({1, R}).expand({B, R}).contiguous() : s0_in.contiguous();
  const int64_t T = a.size(1);
  Tensor s = Tensor::empty({B, T, R}, ac.options()), rms = Tensor::empty({B, T}, ac.options());
  ASC_KERNEL(ac.device(), op, ssm_scan_forward, ac, uc, s0, rms_norm, eps, s, rms);
  if (autograd::needs_grad({&a, &u, &s0_in})) {
    using autograd::SavedTensor;
    const Shape s0_shape = s0_in.shape();
    autograd::record(op, {ac, uc, s0_in}, {s},
                     [as = SavedTensor(ac, op), s0s = SavedTensor(s0, op), out = s.detach(), rms, rms_norm,
                      s0_shape](const TensorList& g) -> TensorList {
                       // out: (B, T, R) in a's dtype, on a's device
                       Tensor da = Tensor::empty(out.shape(), out.options()),
                              du = Tensor::empty(out.shape(), out.options()),
                              ds0 = Tensor::empty({out.size(0), out.size(2)}, out.options());  // (B, R)
                       ASC_KERNEL(g[0].device(), "ssm_scan", ssm_scan_backward, as.get(), s0s.get(), out, rms,
                                  g[0].contiguous(), rms_norm, da, du, ds0);
                       return {da, du, s0_shape.size() == 1 ? sum(ds0, {0}) : ds0};
                     });
  }
  return s;
}

Tensor linear_deferred_weight_grad(const Tensor& X, const Tensor& W, const std::shared_ptr<Tensor>& deferred_dZ) {
  constexpr const char* op = "linear_deferred_weight_grad";
  ASC_CHECK(deferred_dZ != nullptr, "{}: no tensor to hold the deferred dL/dZ (null pointer)", op);
  check_defined(op, X, "X");
  check_defined(op, W, "W");
  ASC_CHECK(X.dim() == 2 && W.dim() == 2 && X.size(1) == W.size(1), "{}: expects X (N, d) and W (P, d); got X {}, W {}",
            op, X.shape(), W.shape());
  Tensor Z;  // (N, P)
  {
    NoGradGuard ng;
    Z = linear(X, W);
  }
  if (autograd::needs_grad({&X, &W}))
    autograd::record(op, {X, W}, {Z},
                     [Ws = autograd::SavedTensor(W, op), deferred_dZ,
                      x_grad = X.requires_grad()](const TensorList& g) -> TensorList {
                       *deferred_dZ = deferred_dZ->defined() ? *deferred_dZ + g[0] : g[0].contiguous();
                       return {x_grad ? matmul(g[0], Ws.get()) : Tensor(), Tensor()};
                     });
  return Z;
}

}  // namespace asc
