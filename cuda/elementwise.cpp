// CUDA entry points of the elementwise / copy / fill / isnan / sum / random kernels (declared in ops/kernel_list.inc,
// reached through ASC_KERNEL). Host side: dtype checks with the CPU kernels' errors, broadcasting and dimension
// coalescing (ops/layout.h, as on the CPU), then a plain-data launcher of cuda/elementwise.cu on the current stream.
#include <array>

#include "core/dtype.h"
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/elementwise_launch.h"
#include "ops/checks.h"
#include "ops/kernels.h"
#include "ops/layout.h"

namespace asc::cuda {
namespace {

namespace L = launch;

static_assert(static_cast<int>(L::ScalarType::Float32) == static_cast<int>(DType::Float32));
static_assert(static_cast<int>(L::ScalarType::Float64) == static_cast<int>(DType::Float64));
static_assert(static_cast<int>(L::ScalarType::Int64) == static_cast<int>(DType::Int64));
static_assert(static_cast<int>(L::ScalarType::Bool) == static_cast<int>(DType::Bool));
static_assert(static_cast<int>(L::ScalarType::BFloat16) == static_cast<int>(DType::BFloat16));
static_assert(static_cast<int>(L::ScalarType::Float16) == static_cast<int>(DType::Float16));
static_assert(L::kMaxDims == kMaxDims);

L::ScalarType st(DType t) { return static_cast<L::ScalarType>(t); }

// Coalesced layout of N operands over `shape` (strides already broadcast to it).
template <int N>
L::Layout<N> make_layout(const Shape& shape, const std::array<Strides, N>& strides) {
  L::Layout<N> out;
  out.numel = numel_of(shape);
  if (out.numel == 0) return out;
  StridedLayout<N> c = coalesce<N>(shape, strides);
  out.ndim = c.shape.size();
  for (int d = 0; d < out.ndim; ++d) {
    out.shape[d] = c.shape[d];
    for (int k = 0; k < N; ++k) out.strides[k][d] = c.strides[k][d];
  }
  return out;
}

void check_contiguous(const char* name, const Tensor& t) {
  ASC_CHECK(t.is_contiguous(), "{}: the CUDA kernel expects a contiguous output (shape {})", name, t.shape());
}

#define ASC_LAUNCH(name, call)                                                                                   \
  do {                                                                                                           \
    cudaError_t asc_e_ = (call);                                                                                 \
    ASC_CHECK(asc_e_ == cudaSuccess, "{} (CUDA): kernel launch failed: {} ({})", name, cudaGetErrorName(asc_e_), \
              cudaGetErrorString(asc_e_));                                                                       \
  } while (0)

}  // namespace

void unary(math::Unary op, const math::UnaryParams& p, const Tensor& x, Tensor& out) {
  check_floating("unary (CUDA)", x);
  auto lay = make_layout<2>(x.shape(), {out.strides(), x.strides()});
  ASC_LAUNCH("unary", L::unary(op, p, st(x.dtype()), x.raw_data(), out.raw_data(), lay, current_stream()));
}

void unary_backward(math::Unary op, const math::UnaryParams& p, const Tensor& g, const Tensor& x, const Tensor& y,
                    Tensor& gx) {
  check_floating("unary_backward (CUDA)", g);
  // x / y are always defined by the op (it passes g in place of the one the derivative does not read).
  const Tensor& xv = x.defined() ? x : g;
  const Tensor& yv = y.defined() ? y : g;
  auto lay = make_layout<4>(gx.shape(), {gx.strides(), g.strides(), xv.strides(), yv.strides()});
  ASC_LAUNCH("unary_backward", L::unary_backward(op, p, st(g.dtype()), g.raw_data(), xv.raw_data(), yv.raw_data(),
                                                 gx.raw_data(), lay, current_stream()));
}

void binary(math::Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.dtype() == kBool && !math::is_comparison(op) && op != math::Binary::Max && op != math::Binary::Min)
    ASC_THROW("binary: op not defined for bool tensors");
  const Shape& shape = out.shape();
  auto lay = make_layout<3>(shape, {out.strides(), broadcast_strides(a.shape(), a.strides(), shape),
                                    broadcast_strides(b.shape(), b.strides(), shape)});
  ASC_LAUNCH("binary", L::binary(op, st(a.dtype()), a.raw_data(), b.raw_data(), out.raw_data(), lay, current_stream()));
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const Shape& shape = out.shape();
  auto lay = make_layout<4>(
      shape, {out.strides(), broadcast_strides(cond.shape(), cond.strides(), shape),
              broadcast_strides(a.shape(), a.strides(), shape), broadcast_strides(b.shape(), b.strides(), shape)});
  ASC_LAUNCH("where", L::where(st(out.dtype()), static_cast<const bool*>(cond.raw_data()), a.raw_data(), b.raw_data(),
                               out.raw_data(), lay, current_stream()));
}

void copy(const Tensor& src, Tensor& dst) {
  ASC_CHECK(src.device() == dst.device(), "copy: tensors are on different devices ({} and {})", src.device(),
            dst.device());
  auto lay = make_layout<2>(dst.shape(), {dst.strides(), broadcast_strides(src.shape(), src.strides(), dst.shape())});
  ASC_LAUNCH("copy", L::copy(st(src.dtype()), st(dst.dtype()), src.raw_data(), dst.raw_data(), lay, current_stream()));
}

void fill(Tensor& dst, double value) {
  auto lay = make_layout<1>(dst.shape(), {dst.strides()});
  ASC_LAUNCH("fill", L::fill(st(dst.dtype()), dst.raw_data(), value, lay, current_stream()));
}

void isnan(const Tensor& x, Tensor& out) {
  check_floating("isnan (CUDA)", x);
  auto lay = make_layout<2>(x.shape(), {out.strides(), x.strides()});
  ASC_LAUNCH("isnan", L::isnan(st(x.dtype()), x.raw_data(), static_cast<bool*>(out.raw_data()), lay, current_stream()));
}

void sum(const Tensor& x, Tensor& out) {
  ASC_CHECK(x.dtype() != kBool, "sum: dtype {} is not supported on CUDA", dtype_name(x.dtype()));
  check_contiguous("sum", out);
  // As on the CPU: out's shape broadcasts to x's; the dims where it broadcasts (stride 0 over a size > 1) are
  // summed. The kept dims, in order, index out's contiguous elements.
  Strides so = broadcast_strides(out.shape(), contiguous_strides(out.shape()), x.shape());
  Shape kshape, rshape;
  Strides kstr, rstr;
  for (int d = 0; d < x.dim(); ++d) {
    if (x.shape()[d] == 1) continue;
    if (so[d] == 0) {
      rshape.push_back(x.shape()[d]);
      rstr.push_back(x.strides()[d]);
    } else {
      kshape.push_back(x.shape()[d]);
      kstr.push_back(x.strides()[d]);
    }
  }
  const int64_t m = out.numel(), r = numel_of(rshape);
  ASC_CHECK(numel_of(kshape) == m || x.numel() == 0, "sum: output shape {} does not match input shape {}", out.shape(),
            x.shape());
  L::Layout<1> kept = make_layout<1>(kshape, {kstr}), red = make_layout<1>(rshape, {rstr});
  kept.numel = m;  // also when x is empty (then r == 0 and every output is 0)
  red.numel = r;
  if (m == 0) return;
  L::SumPlan plan = L::sum_plan(m, r);
  Tensor partials;
  if (plan.groups > 1)
    partials = Tensor::empty({m * plan.groups}, {x.dtype() == kInt64 ? kInt64 : kFloat64, x.device()});
  ASC_LAUNCH("sum", L::sum(st(x.dtype()), x.raw_data(), out.raw_data(), kept, red, plan,
                           partials.defined() ? partials.raw_data() : nullptr, current_stream()));
  // `partials` is freed here, before the kernels ran: safe with the stream-ordered reuse of the allocator (the
  // memory is only handed to work queued later on the same stream).
}

void uniform(Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  check_floating("rand (CUDA)", out);
  check_contiguous("rand", out);
  ASC_LAUNCH("rand", L::uniform(st(out.dtype()), out.raw_data(), out.numel(), seed, offset, lo, hi, current_stream()));
}

void dropout(const Tensor& x, Tensor& out, Tensor& mask, uint64_t seed, uint64_t offset, double p, double scale) {
  check_floating("dropout (CUDA)", x);
  check_contiguous("dropout", x), check_contiguous("dropout", out), check_contiguous("dropout", mask);
  ASC_LAUNCH("dropout", L::dropout(st(x.dtype()), x.raw_data(), out.raw_data(), mask.raw_data(), x.numel(), seed,
                                   offset, p, scale, current_stream()));
}

void bias_act_dropout(math::Unary act, const Tensor& x, const Tensor& bias, Tensor& out, Tensor& keep, Tensor& slope,
                      uint64_t seed, uint64_t offset, double p, double scale) {
  check_floating("bias_act_dropout (CUDA)", x);
  check_contiguous("bias_act_dropout", x), check_contiguous("bias_act_dropout", out);
  if (bias.defined()) check_contiguous("bias_act_dropout", bias);
  if (keep.defined()) check_contiguous("bias_act_dropout", keep);
  if (slope.defined()) check_contiguous("bias_act_dropout", slope);
  ASC_LAUNCH("bias_act_dropout",
             L::bias_act_dropout(act, st(x.dtype()), x.raw_data(), bias.defined() ? bias.raw_data() : nullptr,
                                 out.raw_data(), keep.defined() ? static_cast<bool*>(keep.raw_data()) : nullptr,
                                 slope.defined() ? slope.raw_data() : nullptr, x.numel(), x.size(-1), seed, offset, p,
                                 scale, current_stream()));
}

void bias_act_dropout_backward(const Tensor& g, const Tensor& slope, const Tensor& keep, double scale, Tensor& gx) {
  check_floating("bias_act_dropout_backward (CUDA)", g);
  check_contiguous("bias_act_dropout_backward", g), check_contiguous("bias_act_dropout_backward", slope);
  check_contiguous("bias_act_dropout_backward", gx);
  ASC_LAUNCH("bias_act_dropout_backward",
             L::bias_act_dropout_backward(st(g.dtype()), g.raw_data(), slope.raw_data(),
                                          keep.defined() ? static_cast<const bool*>(keep.raw_data()) : nullptr,
                                          gx.raw_data(), g.numel(), scale, current_stream()));
}

void normal(Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  check_floating("randn (CUDA)", out);
  check_contiguous("randn", out);
  ASC_LAUNCH("randn",
             L::normal(st(out.dtype()), out.raw_data(), out.numel(), seed, offset, mean, stddev, current_stream()));
}

void randint(Tensor& out, uint64_t seed, uint64_t offset, int64_t low, int64_t high) {
  ASC_CHECK(out.dtype() == kInt64, "randint: dtype must be int64, got {}", dtype_name(out.dtype()));
  check_contiguous("randint", out);
  ASC_LAUNCH("randint",
             L::randint(static_cast<int64_t*>(out.raw_data()), out.numel(), seed, offset, low, high, current_stream()));
}

}  // namespace asc::cuda
