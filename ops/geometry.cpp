// The geometry ops of ASCender's swarm attention (docs/ops.md): top-k neighbourhoods, pairwise squared
// distances, cosine matrices, row L2 normalisation, masked row standardisation, and the hard gate with its
// selectable backward (none, straight-through, or a surrogate from the registry). Each op validates its inputs,
// runs its forward (a kernel through ASC_KERNEL, or a composite of other ops with grad mode off), and records one
// graph node whose backward sits right beside it.
#include "ops/geometry.h"

#include <cmath>
#include <map>
#include <mutex>
#include <numbers>

#include "autograd/node.h"
#include "core/format.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/kernels.h"
#include "ops/linalg.h"

namespace asc {

using autograd::SavedTensor;

namespace {

// A bool mask broadcast to `shape`, materialised contiguous (the kernels read it row by row).
Tensor prepare_mask(const char* op, const Tensor& mask, const Tensor& x) {
  ASC_CHECK(mask.dtype() == kBool, "{}: mask must be a bool tensor, got {}", op, mask.dtype());
  check_same_device(op, {&x, &mask});
  bool ok = mask.dim() <= x.dim();
  for (int i = 0; ok && i < mask.dim(); ++i) {
    int64_t ms = mask.size(mask.dim() - 1 - i), xs = x.size(x.dim() - 1 - i);
    ok = ms == xs || ms == 1;
  }
  ASC_CHECK(ok, "{}: mask of shape {} does not broadcast to the input shape {}", op, mask.shape(), x.shape());
  return mask.expand(x.shape()).contiguous();
}

// The (.., 1) shape of a per-row statistic of x.
Shape row_stat_shape(const Shape& s) {
  Shape r = s;
  r[r.size() - 1] = 1;
  return r;
}

}  // namespace

// ---- topk -------------------------------------------------------------------------------------------------------

ValuesIndices topk(const Tensor& x, int64_t k, const TopkOptions& opts) {
  check_defined("topk", x);
  check_float("topk", x, "input");
  ASC_CHECK(x.dim() >= 1, "topk: expected an input with at least 1 dimension, got shape {}", x.shape());
  const int64_t n = x.size(-1);
  if (opts.exclude_diagonal)
    ASC_CHECK(x.dim() >= 2 && x.size(-2) == n, "topk: exclude_diagonal needs a square (.., n, n) input, got shape {}",
              x.shape());
  ASC_CHECK(k >= 1, "topk: k must be at least 1, got k = {} (input shape {})", k, x.shape());
  const int64_t diag_n = opts.exclude_diagonal ? n : 0;
  Tensor mask;
  if (opts.mask.defined()) mask = prepare_mask("topk", opts.mask, x);
  {
    if (!mask.defined()) {
      const int64_t sel = n - (opts.exclude_diagonal ? 1 : 0);
      ASC_CHECK(k <= sel, "topk: k = {} exceeds the {} selectable entries per row (row length {}{}, input shape {})", k,
                sel, n, opts.exclude_diagonal ? ", diagonal excluded" : "", x.shape());
    } else {
      Shape cs = x.shape();
      cs.erase(cs.size() - 1);
      Tensor counts = Tensor::empty(cs, {kInt64, x.device()});
      ASC_KERNEL(x.device(), "topk", topk_count, mask, diag_n, counts);
      std::vector<int64_t> c = counts.to_vector<int64_t>();
      for (size_t r = 0; r < c.size(); ++r)
        ASC_CHECK(k <= c[r],
                  "topk: k = {} exceeds the {} selectable entries of row {} (row length {}, mask{}, input shape {})", k,
                  c[r], r, n, opts.exclude_diagonal ? " and diagonal excluded" : " applied", x.shape());
    }
  }
  Tensor xc = x.contiguous();
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = k;
  Tensor values = Tensor::empty(out_shape, x.options());
  Tensor indices = Tensor::empty(out_shape, {kInt64, x.device()});
  if (x.numel() > 0) ASC_KERNEL(x.device(), "topk", topk, xc, mask, k, opts.largest, diag_n, values, indices);
  if (autograd::needs_grad(x)) {
    Shape in_shape = x.shape();
    autograd::record("topk", {x}, {values, indices},
                     [in_shape, is = SavedTensor(indices, "topk")](const TensorList& g) -> TensorList {
                       Tensor gx = zeros(in_shape, g[0].options());
                       Tensor gc = g[0].contiguous();
                       if (gx.numel() > 0) ASC_KERNEL(gc.device(), "topk", topk_backward, gc, is.get(), gx);
                       return {gx};
                     });
  }
  return {values, indices};
}

// ---- distances and similarities ---------------------------------------------------------------------------------

namespace {
void check_point_sets(const char* op, const Tensor& X, const Tensor& Y) {
  check_defined(op, X, "X");
  check_defined(op, Y, "Y");
  check_same_device(op, {&X, &Y});
  check_float(op, X, "X");
  ASC_CHECK(X.dtype() == Y.dtype(), "{}: X and Y must share a dtype, got {} and {}", op, X.dtype(), Y.dtype());
  ASC_CHECK(X.dim() >= 2 && Y.dim() >= 2, "{}: X and Y must have shape (.., n, d) and (.., m, d), got {} and {}", op,
            X.shape(), Y.shape());
  ASC_CHECK(X.size(-1) == Y.size(-1), "{}: feature sizes differ: X {} has d = {}, Y {} has d = {}", op, X.shape(),
            X.size(-1), Y.shape(), Y.size(-1));
  Shape bx(std::span<const int64_t>(X.shape().data(), X.dim() - 2));
  Shape by(std::span<const int64_t>(Y.shape().data(), Y.dim() - 2));
  broadcast_shapes(bx, by, op);  // throws naming the op when the batch dims do not broadcast
}
}  // namespace

Tensor pairwise_sqdist(const Tensor& X, const Tensor& Y) {
  check_point_sets("pairwise_sqdist", X, Y);
  Tensor out;
  {
    NoGradGuard ng;
    Tensor xx = sum(mul(X, X), {-1}, /*keepdim=*/true);                    // (.., n, 1)
    Tensor yy = sum(mul(Y, Y), {-1}, /*keepdim=*/true).transpose(-1, -2);  // (.., 1, m)
    Tensor xy = matmul(X, Y.transpose(-1, -2));                            // (.., n, m)
    out = clamp(add(add(mul(xy, -2.0), xx), yy), 0.0, std::nullopt);
  }
  if (autograd::needs_grad(X, Y)) {
    const bool gx = X.requires_grad(), gy = Y.requires_grad();
    Shape sx = X.shape(), sy = Y.shape();
    // ||x - y||^2 is smooth; the clamp only removes rounding below 0, so the gradient is the unclamped one:
    // dX = 2 (rowsum(G) X - G Y), dY = 2 (colsum(G)^T Y - G^T X).
    autograd::record(
        "pairwise_sqdist", {X, Y}, {out},
        [=, xs = SavedTensor(X, "pairwise_sqdist"),
         ys = SavedTensor(Y, "pairwise_sqdist")](const TensorList& g) -> TensorList {
          const Tensor &G = g[0], &Xv = xs.get(), &Yv = ys.get();
          Tensor dX, dY;
          if (gx) dX = sum_to(mul(sub(mul(sum(G, {-1}, true), Xv), matmul(G, Yv)), 2.0), sx);
          if (gy)
            dY = sum_to(mul(sub(mul(sum(G, {-2}, true).transpose(-1, -2), Yv), matmul(G.transpose(-1, -2), Xv)), 2.0),
                        sy);
          return {dX, dY};
        });
  }
  return out;
}

Tensor cosine_similarity_matrix(const Tensor& X, const Tensor& Y, double eps) {
  check_point_sets("cosine_similarity_matrix", X, Y);
  ASC_CHECK(eps > 0, "cosine_similarity_matrix: eps must be positive, got {}", eps);
  return matmul(normalize_rows(X, eps), normalize_rows(Y, eps).transpose(-1, -2));
}

Tensor normalize_rows(const Tensor& x, double eps) {
  check_defined("normalize_rows", x);
  check_float("normalize_rows", x, "input");
  ASC_CHECK(x.dim() >= 1, "normalize_rows: expected an input with at least 1 dimension, got shape {}", x.shape());
  ASC_CHECK(eps > 0, "normalize_rows: eps must be positive, got {}", eps);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.options());
  Tensor norm = Tensor::empty(row_stat_shape(x.shape()), x.options());
  if (x.numel() > 0) ASC_KERNEL(x.device(), "normalize_rows", normalize_rows, xc, eps, y, norm);
  if (autograd::needs_grad(x)) {
    // y = x / r, r = max(||x||, eps): dx = (g - y (g . y)) / r where ||x|| > eps, else g / eps.
    autograd::record("normalize_rows", {x}, {y},
                     [eps, ys = SavedTensor(y, "normalize_rows"),
                      ns = SavedTensor(norm, "normalize_rows")](const TensorList& g) -> TensorList {
                       const Tensor &yv = ys.get(), &nv = ns.get();
                       Tensor proj = mul(yv, sum(mul(g[0], yv), {-1}, true));
                       Tensor live = gt(nv, eps);
                       Tensor r = maximum(nv, full_like(nv, eps));
                       return {div(sub(g[0], where(live, proj, 0.0)), r)};
                     });
  }
  return y;
}

Tensor row_standardize(const Tensor& x, const Tensor& mask_in, double eps) {
  check_defined("row_standardize", x);
  check_float("row_standardize", x, "input");
  ASC_CHECK(x.dim() >= 1, "row_standardize: expected an input with at least 1 dimension, got shape {}", x.shape());
  ASC_CHECK(eps > 0, "row_standardize: eps must be positive, got {}", eps);
  Tensor mask;
  if (mask_in.defined()) mask = prepare_mask("row_standardize", mask_in, x);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.options());
  Tensor sd = Tensor::empty(row_stat_shape(x.shape()), x.options());
  if (x.numel() > 0) ASC_KERNEL(x.device(), "row_standardize", row_standardize, xc, mask, eps, y, sd);
  if (autograd::needs_grad(x)) {
    const int64_t n = x.size(-1);
    // With s = sd + eps, xc = x - mean (0 on invalid entries), N = #valid, means over the valid entries:
    //   dx = valid * (g - mean(g) - xc * mean(g xc) / (sd s)) / s;  the last term is 0 where sd == 0.
    autograd::record("row_standardize", {x}, {y},
                     [eps, n, ys = SavedTensor(y, "row_standardize"), ss = SavedTensor(sd, "row_standardize"),
                      ms = mask.defined() ? SavedTensor(mask, "row_standardize")
                                          : SavedTensor()](const TensorList& g) -> TensorList {
                       const Tensor &yv = ys.get(), &sdv = ss.get();
                       Tensor s = add(sdv, eps);
                       Tensor xcv = mul(yv, s);
                       Tensor gv = g[0], cnt;
                       Tensor vm;
                       if (ms.defined()) {
                         vm = ms.get().to(yv.dtype());
                         gv = mul(gv, vm);
                         cnt = maximum(sum(vm, {-1}, true), ones_like(sdv));
                       } else {
                         cnt = full_like(sdv, static_cast<double>(n));
                       }
                       Tensor mg = div(sum(gv, {-1}, true), cnt);
                       Tensor mgx = div(sum(mul(gv, xcv), {-1}, true), cnt);
                       Tensor live = gt(sdv, 0.0);
                       Tensor coef = where(live, div(mgx, mul(where(live, sdv, 1.0), s)), 0.0);
                       // Masked before the division by s: an invalid entry (or a row with one valid entry) would
                       // otherwise divide a nonzero by s = eps, which overflows float16 before being zeroed.
                       Tensor num = sub(sub(gv, mg), mul(xcv, coef));
                       if (vm.defined()) num = mul(num, vm);
                       return {div(num, s)};
                     });
  }
  return y;
}

// ---- surrogate registry and the hard gate -----------------------------------------------------------------------

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, Surrogate> entries;  // node-based: references handed out stay valid
  Registry() {
    using math::SurrogateKind;
    builtin("sigmoid", SurrogateKind::Sigmoid);
    builtin("rectangular", SurrogateKind::Rectangular);
    builtin("triangular", SurrogateKind::Triangular);
    builtin("atan", SurrogateKind::Atan);
  }
  void add(Surrogate s) { entries.emplace(s.name, std::move(s)); }
  void builtin(const char* name, math::SurrogateKind kind) {
    add({name, [kind](double u, double w) { return math::surrogate_derivative(kind, u, w); }, kind});
  }
  std::string names() {
    std::string r;
    for (auto& [k, v] : entries) r += (r.empty() ? "" : ", ") + k;
    return r;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

const Surrogate& find_surrogate(const std::string& name, const char* op) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  auto it = reg.entries.find(name);
  ASC_CHECK(it != reg.entries.end(), "{}: unknown surrogate '{}' (known: {})", op, name, reg.names());
  return it->second;
}

}  // namespace

const Surrogate& surrogate(const std::string& name) { return find_surrogate(name, "surrogate"); }

GateSpec gate_spec(const char* op, const GateOptions& opts, Device device) {
  ASC_CHECK(opts.mode == GateBackward::None || opts.mode == GateBackward::StraightThrough ||
                opts.mode == GateBackward::Surrogate,
            "{}: unknown gate backward mode {} (None, StraightThrough or Surrogate)", op, static_cast<int>(opts.mode));
  ASC_CHECK(std::isfinite(opts.width) && opts.width > 0, "{}: the surrogate width must be positive and finite, got {}",
            op, opts.width);
  GateSpec spec{.mode = opts.mode, .width = opts.width, .surrogate = {}};
  if (opts.mode == GateBackward::Surrogate) {
    spec.surrogate = find_surrogate(opts.surrogate, op);
    ASC_CHECK(!device.is_cuda() || spec.surrogate.builtin.has_value(),
              "{}: surrogate '{}' is a user-registered host function and has no CUDA kernel; use a built-in one "
              "(sigmoid, rectangular, triangular, atan) on CUDA, or run on the CPU",
              op, opts.surrogate);
  }
  return spec;
}

std::vector<std::string> surrogate_names() {
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  std::vector<std::string> r;
  for (auto& [k, v] : reg.entries) r.push_back(k);
  return r;
}

void register_surrogate(Surrogate s) {
  ASC_CHECK(!s.name.empty(), "register_surrogate: the surrogate needs a name");
  ASC_CHECK(static_cast<bool>(s.derivative), "register_surrogate: surrogate '{}' has no derivative function", s.name);
  s.builtin.reset();  // a user entry is a host function: only the registry's own formulas have CUDA code
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  ASC_CHECK(!reg.entries.contains(s.name),
            "register_surrogate: a surrogate named '{}' is already registered (known: {})", s.name, reg.names());
  reg.add(std::move(s));
}

Tensor hard_gate(const Tensor& z, const Tensor& theta_in, const GateOptions& opts) {
  check_defined("hard_gate", z, "z");
  check_defined("hard_gate", theta_in, "theta");
  check_same_device("hard_gate", {&z, &theta_in});
  check_float("hard_gate", z, "z");
  check_float("hard_gate", theta_in, "theta");
  bool ok = theta_in.dim() <= z.dim();
  for (int i = 0; ok && i < theta_in.dim(); ++i) {
    int64_t ts = theta_in.size(theta_in.dim() - 1 - i), zs = z.size(z.dim() - 1 - i);
    ok = ts == zs || ts == 1;
  }
  ASC_CHECK(ok, "hard_gate: theta of shape {} does not broadcast to z's shape {}", theta_in.shape(), z.shape());
  const GateSpec spec = gate_spec("hard_gate", opts, z.device());
  Tensor theta = theta_in.dtype() == z.dtype() ? theta_in : theta_in.to(z.dtype());
  Tensor F;
  {
    NoGradGuard ng;
    F = ge(z, theta).to(z.dtype());
  }
  if (autograd::needs_grad(z, theta)) {
    const bool gz = z.requires_grad(), gt_ = theta.requires_grad();
    Shape zs = z.shape(), ts = theta.shape();
    autograd::record("hard_gate", {z, theta}, {F},
                     [=, zsv = SavedTensor(z, "hard_gate"),
                      tsv = SavedTensor(theta, "hard_gate")](const TensorList& g) -> TensorList {
                       Tensor dz;
                       switch (spec.mode) {
                         case GateBackward::None: dz = zeros(zs, g[0].options()); break;
                         case GateBackward::StraightThrough: dz = g[0]; break;
                         case GateBackward::Surrogate: {
                           Tensor u = sub(zsv.get(), tsv.get()).contiguous();
                           Tensor sp = Tensor::empty(u.shape(), u.options());
                           ASC_KERNEL(u.device(), "hard_gate", apply_surrogate, spec, u, sp);
                           dz = mul(g[0], sp);
                           break;
                         }
                       }
                       return {gz ? dz : Tensor(), gt_ ? neg(sum_to(dz, ts)) : Tensor()};
                     });
  }
  return F;
}

}  // namespace asc
