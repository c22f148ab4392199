// Indexing, joining and splitting: validation (index dtype, ranks, sizes, and every index value bounds-checked
// before anything is allocated or written), the kernel call through the device dispatch, and each op's backward
// right beside its forward.
#include "ops/index.h"

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/format.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/kernels.h"

namespace asc {

using autograd::SavedTensor;

namespace {

void check_index_dtype(const char* op, const Tensor& index) {
  check_defined(op, index, "index");
  ASC_CHECK(index.dtype() == kInt64, "{}: index must be an int64 tensor, got dtype {} (shape {})", op, index.dtype(),
            index.shape());
}

// Throws unless every value of `index` lies in [0, size). `what` describes the range, e.g. "dimension 1 of size 5".
template <class... Args>
void check_bounds(const char* op, const Tensor& index, int64_t size, fmt::format_string<Args...> what, Args&&... args) {
  if (index.numel() == 0) return;
  int64_t lo = 0, hi = 0;
  ASC_KERNEL(index.device(), op, index_minmax, index, lo, hi);
  if (lo < 0 || hi >= size) {
    const int64_t bad = lo < 0 ? lo : hi;
    ASC_THROW("{}: index {} is out of range for {} (valid indices are 0..{}{})", op, bad,
              fmt::format(what, std::forward<Args>(args)...), size - 1,
              bad < 0 ? "; negative indices are not allowed" : "");
  }
}

// A geometry-only view of `t` as shape [1] (for 0-d inputs of gather / scatter_add); no autograd.
Tensor as_1d(const Tensor& t) { return t.dim() == 0 ? make_view(t, {1}, {1}, t.offset()) : t; }

// gather / scatter_add shape rules: same rank, index sizes <= x sizes on every dim other than `dim`.
void check_gather_shapes(const char* op, const Tensor& x, int dim, const Tensor& index) {
  ASC_CHECK(index.dim() == x.dim(),
            "{}: index has {} dimensions (shape {}) but x has {} (shape {}); they must have the same rank", op,
            index.dim(), index.shape(), x.dim(), x.shape());
  for (int d = 0; d < x.dim(); ++d)
    if (d != dim)
      ASC_CHECK(index.size(d) <= x.size(d),
                "{}: index shape {} is larger than x shape {} at dimension {} ({} > {}); only dimension {} may be "
                "larger",
                op, index.shape(), x.shape(), d, index.size(d), x.size(d), dim);
}

}  // namespace

// ---- index_select -----------------------------------------------------------------------------------------------

namespace {

// zeros(shape) with the slices of src added at `index` along dim (indices equal to `skip` left out): the backward
// of index_select and embedding. 16-bit sums accumulate in float32 and are rounded once: a row that thousands of
// indices hit (a frequent token's embedding gradient) would otherwise stop growing once the 16-bit spacing of its
// sum exceeds each addend (bfloat16 sums of 0.01 stall at 4).
Tensor index_add_zeros(const char* op, const Shape& shape, int dim, const Tensor& index, const Tensor& src,
                       int64_t skip) {
  const DType acc = accumulate_dtype(src.dtype());
  Tensor out = zeros(shape, {acc, src.device()});
  ASC_KERNEL(out.device(), op, index_add, out, dim, index, src.to(acc), skip);
  return out.to(src.dtype());
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined("index_select", x);
  check_index_dtype("index_select", index);
  check_same_device("index_select", {&x, &index});
  ASC_CHECK(x.dim() >= 1, "index_select: x must have at least 1 dimension, got shape {}", x.shape());
  ASC_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got shape {}", index.shape());
  const int d = wrap_dim(dim, x.dim(), "index_select");
  check_bounds("index_select", index, x.size(d), "dimension {} of size {} (x shape {})", d, x.size(d), x.shape());
  Shape os = x.shape();
  os[d] = index.numel();
  Tensor out = Tensor::empty(os, x.options());
  ASC_KERNEL(x.device(), "index_select", index_select, x, d, index, out);
  if (autograd::needs_grad(x)) {
    Shape xs = x.shape();
    autograd::record("index_select", {x}, {out},
                     [d, xs, is = SavedTensor(index, "index_select")](const TensorList& g) -> TensorList {
                       return {index_add_zeros("index_select backward", xs, d, is.get(), g[0], -1)};
                     });
  }
  return out;
}

// ---- gather / scatter_add ---------------------------------------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined("gather", x);
  check_index_dtype("gather", index);
  check_same_device("gather", {&x, &index});
  const int d = wrap_dim(dim, x.dim(), "gather");
  check_gather_shapes("gather", x, d, index);
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  check_bounds("gather", index, n, "dimension {} of size {} (x shape {})", d, n, x.shape());
  Tensor out = Tensor::empty(index.shape(), x.options());
  Tensor out1 = as_1d(out);
  ASC_KERNEL(x.device(), "gather", gather, as_1d(x), d, as_1d(index), out1);
  if (autograd::needs_grad(x)) {
    Shape xs = x.shape();
    autograd::record("gather", {x}, {out},
                     [d, xs, is = SavedTensor(index, "gather")](const TensorList& g) -> TensorList {
                       return {scatter_add(zeros(xs, g[0].options()), d, is.get(), g[0])};
                     });
  }
  return out;
}

namespace {
// scatter / scatter_add: x, src and index defined, alike in device and dtype, src of index's shape, the shapes as
// gather's, every index in range along dim; returns dim wrapped.
int check_scatter_args(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(op, x);
  check_defined(op, src, "src");
  check_index_dtype(op, index);
  check_same_device(op, {&x, &index, &src});
  ASC_CHECK(src.dtype() == x.dtype(), "{}: src has dtype {} but x has dtype {}", op, src.dtype(), x.dtype());
  const int d = wrap_dim(dim, x.dim(), op);
  check_gather_shapes(op, x, d, index);
  ASC_CHECK(src.shape() == index.shape(), "{}: src shape {} must equal index shape {}", op, src.shape(), index.shape());
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  check_bounds(op, index, n, "dimension {} of size {} (x shape {})", d, n, x.shape());
  return d;
}
}  // namespace

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const int d = check_scatter_args("scatter_add", x, dim, index, src);
  ASC_CHECK(x.dtype() != kBool, "scatter_add: dtype bool is not supported");
  // 16-bit sums accumulate in float32 and are rounded once (see index_add_zeros).
  const DType acc = accumulate_dtype(x.dtype());
  Tensor out = Tensor::empty(x.shape(), {acc, x.device()});
  ASC_KERNEL(x.device(), "scatter_add", copy, x, out);
  {
    NoGradGuard no_grad;  // the conversions are internal: the node below differentiates the whole op
    Tensor out1 = as_1d(out);
    ASC_KERNEL(x.device(), "scatter_add", scatter_add, out1, d, as_1d(index), as_1d(src.to(acc)));
    if (acc != x.dtype()) out = out.to(x.dtype());
  }
  if (autograd::needs_grad(x, src)) {
    const bool gx = x.requires_grad(), gs = src.requires_grad();
    autograd::record("scatter_add", {x, src}, {out},
                     [d, gx, gs, is = SavedTensor(index, "scatter_add")](const TensorList& g) -> TensorList {
                       return {gx ? g[0] : Tensor(), gs ? gather(g[0], d, is.get()) : Tensor()};
                     });
  }
  return out;
}

// ---- scatter -----------------------------------------------------------------------------------------------------

namespace {
// x with src written at index along d (the kernel's write order: the last along each fibre wins); no autograd.
Tensor scatter_into(const Tensor& x, int d, const Tensor& index, const Tensor& src) {
  NoGradGuard no_grad;
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  ASC_KERNEL(x.device(), "scatter", copy, x, out);
  Tensor out1 = as_1d(out);
  ASC_KERNEL(x.device(), "scatter", scatter, out1, d, as_1d(index), as_1d(src));
  return out;
}
}  // namespace

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const int d = check_scatter_args("scatter", x, dim, index, src);
  Tensor out = scatter_into(x, d, index, src);
  if (autograd::needs_grad(x, src)) {
    const bool gx = x.requires_grad(), gs = src.requires_grad();
    autograd::record(
        "scatter", {x, src}, {out}, [d, gx, gs, is = SavedTensor(index, "scatter")](const TensorList& g) -> TensorList {
          const Tensor index = is.get();
          const Device dev = g[0].device();
          const TensorOptions i64{.dtype = kInt64, .device = dev}, b{.dtype = kBool, .device = dev};
          const Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = dev});
          Tensor gxv, gsv;
          if (gx) {  // x's gradient, zero where something was written
            const Tensor written = scatter_into(zeros(g[0].shape(), b), d, index, ones(index.shape(), b));
            gxv = where(written, zero, g[0]);
          }
          if (gs) {      // src's gradient at the winning writes: each target records the position along d
                         // of the write that stayed, and a source whose own position it is won
            Shape line;  // (1, .., len along d, .., 1)
            for (int k = 0; k < index.dim(); ++k) line.push_back(k == d ? index.size(d) : 1);
            const Tensor pos = arange(index.dim() > 0 ? index.size(d) : 1, i64).reshape(line).expand(index.shape());
            const Tensor winner = scatter_into(full(g[0].shape(), -1.0, i64), d, index, pos);
            const Tensor won = eq(gather(winner, d, index), pos);
            gsv = where(won, gather(g[0], d, index), zero);
          }
          return {gxv, gsv};
        });
  }
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, double value) {
  check_defined("scatter", x);
  check_defined("scatter", index, "index");
  return scatter(x, dim, index, full(index.shape(), value, {.dtype = x.dtype(), .device = x.device()}));
}

// ---- cat / stack ------------------------------------------------------------------------------------------------

namespace {

// Common checks of cat/stack: non-empty, defined, same dtype/device/rank; returns nothing, throws on a mismatch.
void check_join_list(const char* op, const TensorList& xs) {
  ASC_CHECK(!xs.empty(), "{}: expected a non-empty list of tensors", op);
  for (size_t i = 0; i < xs.size(); ++i) ASC_CHECK(xs[i].defined(), "{}: tensor at position {} is undefined", op, i);
  const Tensor& a = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    const Tensor& b = xs[i];
    ASC_CHECK(b.dtype() == a.dtype(), "{}: tensor at position {} has dtype {} but tensor 0 has dtype {}", op, i,
              b.dtype(), a.dtype());
    ASC_CHECK(b.device() == a.device(), "{}: tensor at position {} is on {} but tensor 0 is on {}", op, i, b.device(),
              a.device());
    ASC_CHECK(b.dim() == a.dim(),
              "{}: tensor at position {} has {} dimensions (shape {}) but tensor 0 has {} (shape {})", op, i, b.dim(),
              b.shape(), a.dim(), a.shape());
  }
}

}  // namespace

Tensor cat(const TensorList& xs, int64_t dim) {
  check_join_list("cat", xs);
  ASC_CHECK(xs[0].dim() >= 1, "cat: zero-dimensional tensors cannot be concatenated (tensor 0 has shape {})",
            xs[0].shape());
  const int d = wrap_dim(dim, xs[0].dim(), "cat");
  Shape os = xs[0].shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    for (int k = 0; k < os.size(); ++k)
      ASC_CHECK(k == d || xs[i].size(k) == os[k],
                "cat: tensor at position {} has shape {} but tensor 0 has shape {}; sizes must match except in "
                "dimension {}",
                i, xs[i].shape(), xs[0].shape(), d);
    total = checked_add(total, xs[i].size(d), "cat");
  }
  os[d] = total;
  checked_numel(os, "cat");
  Tensor out = Tensor::empty(os, xs[0].options());
  const Strides ost = out.strides();
  int64_t start = 0;
  for (const Tensor& x : xs) {
    if (x.numel() == 0) continue;  // nothing to copy (and start * stride need not fit for an empty output)
    Tensor dst = make_view(out, x.shape(), ost, start * ost[d]);
    ASC_KERNEL(out.device(), "cat", copy, x, dst);
    start += x.size(d);
  }
  if (autograd::needs_grad(xs)) {
    std::vector<int64_t> sizes;
    std::vector<bool> want;
    for (const Tensor& x : xs) {
      sizes.push_back(x.size(d));
      want.push_back(x.requires_grad());
    }
    autograd::record("cat", xs, {out}, [d, sizes, want](const TensorList& g) -> TensorList {
      TensorList gs;
      int64_t s = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        gs.push_back(want[i] ? g[0].narrow(d, s, sizes[i]) : Tensor());
        s += sizes[i];
      }
      return gs;
    });
  }
  return out;
}

Tensor stack(const TensorList& xs, int64_t dim) {
  check_join_list("stack", xs);
  const int d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  for (size_t i = 1; i < xs.size(); ++i)
    ASC_CHECK(xs[i].shape() == xs[0].shape(),
              "stack: tensor at position {} has shape {} but tensor 0 has shape {}; all shapes must be equal", i,
              xs[i].shape(), xs[0].shape());
  Shape os = xs[0].shape();
  os.insert(d, static_cast<int64_t>(xs.size()));
  checked_numel(os, "stack");
  Tensor out = Tensor::empty(os, xs[0].options());
  Strides st = out.strides();
  const int64_t step = st[d];
  st.erase(d);
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor dst = make_view(out, xs[i].shape(), st, static_cast<int64_t>(i) * step);
    ASC_KERNEL(out.device(), "stack", copy, xs[i], dst);
  }
  if (autograd::needs_grad(xs)) {
    std::vector<bool> want;
    for (const Tensor& x : xs) want.push_back(x.requires_grad());
    autograd::record("stack", xs, {out}, [d, want](const TensorList& g) -> TensorList {
      TensorList gs;
      for (size_t i = 0; i < want.size(); ++i)
        gs.push_back(want[i] ? g[0].select(d, static_cast<int64_t>(i)) : Tensor());
      return gs;
    });
  }
  return out;
}

// ---- split / chunk ----------------------------------------------------------------------------------------------

namespace {

// The pieces [start, start + size) of x along d as views recorded as one node whose backward is one cat of their
// gradients (the engine fills zeros for a piece that got none): a narrow per piece would give each its own node,
// each building an x-sized zero tensor in the backward, and the engine would add those up.
TensorList split_views(const Tensor& x, int d, const std::vector<int64_t>& sizes) {
  TensorList out;
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (int64_t size : sizes) out.push_back(x.narrow(d, start, size)), start += size;
  }
  if (autograd::needs_grad(x))
    autograd::record("split", {x}, out, [d](const TensorList& g) -> TensorList { return {cat(g, d)}; });
  return out;
}

}  // namespace

TensorList split(const Tensor& x, int64_t size, int64_t dim) {
  check_defined("split", x);
  ASC_CHECK(x.dim() >= 1, "split: x must have at least 1 dimension, got shape {}", x.shape());
  ASC_CHECK(size > 0, "split: split size must be positive, got {}", size);
  const int d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(d);
  if (n == 0) return {x.narrow(d, 0, 0)};
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < n; s += size) sizes.push_back(std::min(size, n - s));
  return split_views(x, d, sizes);
}

TensorList split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  constexpr const char* kOp = "split_with_sizes";
  check_defined(kOp, x);
  ASC_CHECK(x.dim() >= 1, "{}: x must have at least 1 dimension, got shape {}", kOp, x.shape());
  ASC_CHECK(!sizes.empty(), "{}: no sizes given", kOp);
  const int d = wrap_dim(dim, x.dim(), kOp);
  const int64_t n = x.size(d);
  int64_t total = 0;
  for (int64_t size : sizes) {
    ASC_CHECK(size >= 0, "{}: sizes must be non-negative, got {}", kOp, fmt::join(sizes, ", "));
    ASC_CHECK(size <= n - total, "{}: sizes {} add up to more than dim {} of shape {} ({})", kOp,
              fmt::join(sizes, ", "), dim, x.shape(), n);  // checked before the sum, which could overflow
    total += size;
  }
  ASC_CHECK(total == n, "{}: sizes {} add up to {}, but dim {} of shape {} has {}", kOp, fmt::join(sizes, ", "), total,
            dim, x.shape(), n);
  return split_views(x, d, sizes);
}

TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  check_defined("chunk", x);
  ASC_CHECK(x.dim() >= 1, "chunk: x must have at least 1 dimension, got shape {}", x.shape());
  ASC_CHECK(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  const int d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(d);
  if (n == 0) {  // as in PyTorch: `chunks` empty pieces
    TensorList out;
    for (int64_t i = 0; i < chunks; ++i) out.push_back(x.narrow(d, 0, 0));
    return out;
  }
  return split(x, (n + chunks - 1) / chunks, d);
}

// ---- one_hot / embedding ----------------------------------------------------------------------------------------

Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype) {
  check_index_dtype("one_hot", index);
  ASC_CHECK(num_classes >= 1, "one_hot: num_classes must be at least 1, got {}", num_classes);
  check_bounds("one_hot", index, num_classes, "num_classes {}", num_classes);
  Shape os = index.shape();
  os.push_back(num_classes);
  checked_nbytes(checked_numel(os, "one_hot"), dtype_size(dtype), "one_hot");  // index.numel() * num_classes
  Tensor out = zeros(os, {.dtype = dtype, .device = index.device()});
  ASC_KERNEL(index.device(), "one_hot", one_hot, index, out);
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx) {
  check_defined("embedding", weight, "weight");
  check_index_dtype("embedding", index);
  check_same_device("embedding", {&weight, &index});
  ASC_CHECK(weight.dim() == 2, "embedding: weight must be 2-D (num_embeddings, dim), got shape {}", weight.shape());
  const int64_t V = weight.size(0), D = weight.size(1);
  ASC_CHECK(padding_idx >= -1 && padding_idx < V,
            "embedding: padding_idx {} must be -1 (none) or in [0, {}) for weight shape {}", padding_idx, V,
            weight.shape());
  check_bounds("embedding", index, V, "{} embeddings (weight shape {})", V, weight.shape());
  const int64_t N = index.numel();
  Shape os = index.shape();
  os.push_back(D);
  Tensor out = Tensor::empty(os, weight.options());
  const Tensor index_c = index.contiguous();
  const Tensor flat = make_view(index_c, {N}, {1}, index_c.offset());  // index values in row-major order
  Tensor out2 = make_view(out, {N, D}, {D, 1}, 0);
  ASC_KERNEL(weight.device(), "embedding", index_select, weight, 0, flat, out2);
  if (autograd::needs_grad(weight)) {
    autograd::record("embedding", {weight}, {out},
                     [V, D, N, padding_idx, fs = SavedTensor(flat, "embedding")](const TensorList& g) -> TensorList {
                       Tensor g2 = g[0].contiguous();
                       g2 = make_view(g2, {N, D}, {D, 1}, g2.offset());
                       return {index_add_zeros("embedding backward", {V, D}, 0, fs.get(), g2, padding_idx)};
                     });
  }
  return out;
}

}  // namespace asc
