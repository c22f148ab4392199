// CPU kernels of ops/index.h: index_select / index_add (row copies and row accumulation over an (outer, n, inner)
// view of contiguous data), gather / scatter_add (strided walks over the index's shape), one_hot, and the min/max
// scan the ops use for bounds checks.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels.h"

namespace asc::cpu {
namespace {

// t itself when contiguous, else a contiguous copy (no autograd: kernels never record).
Tensor contiguous_copy(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.options());
  copy(t, c);
  return c;
}

}  // namespace

void index_minmax(const Tensor& index, int64_t& lo, int64_t& hi) {
  const int64_t* p = index.data_ptr<int64_t>();
  int64_t mn = p[0], mx = p[0];
  for_each_strided<1>(
      index.shape(), {index.strides()},
      [&](auto off, int64_t n, auto st) {
        const int64_t* q = p + off[0];
        for (int64_t i = 0; i < n; ++i) {
          int64_t v = q[i * st[0]];
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        }
      },
      /*parallel=*/false);
  lo = mn;
  hi = mx;
}

void index_select(const Tensor& x_in, int dim, const Tensor& index, Tensor& out) {
  if (out.numel() == 0) return;  // (memcpy of 0 bytes from an empty tensor's null pointer is undefined)
  Tensor x = contiguous_copy(x_in);
  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  const int64_t k = static_cast<int64_t>(idx.size());
  const int64_t n = x.dim() == 0 ? 1 : x.size(dim);
  const auto [outer, inner] = split_at(x.shape(), dim);
  ASC_DISPATCH_ALL(x.dtype(), "index_select", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    parallel_for(outer * k, inner, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / k, j = r % k;
        const scalar_t* src = xp + (o * n + idx[static_cast<size_t>(j)]) * inner;
        std::memcpy(op + r * inner, src, static_cast<size_t>(inner) * sizeof(scalar_t));
      }
    });
  });
}

void index_add(Tensor& out, int dim, const Tensor& index, const Tensor& src_in, int64_t skip) {
  Tensor src = contiguous_copy(src_in);
  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  const int64_t k = static_cast<int64_t>(idx.size());
  const int64_t n = out.size(dim);
  const auto [outer, inner] = split_at(out.shape(), dim);
  ASC_DISPATCH_FLOAT(out.dtype(), "index_add", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* sp = src.data_ptr<scalar_t>();
    // Accumulates columns [c0, c1) of every row of the outer block o; different (o, column) ranges never alias,
    // so threads split over outer blocks, or over columns when there is a single block (embedding tables).
    auto block = [&](int64_t o, int64_t c0, int64_t c1) {
      scalar_t* ob = op + o * n * inner;
      const scalar_t* sb = sp + o * k * inner;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t t = idx[static_cast<size_t>(j)];
        if (t == skip) continue;
        scalar_t* dst = ob + t * inner;
        const scalar_t* s = sb + j * inner;
        for (int64_t c = c0; c < c1; ++c) dst[c] += s[c];
      }
    };
    if (outer > 1) {
      parallel_for(outer, k * inner, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) block(o, 0, inner);
      });
    } else if (outer == 1) {
      parallel_for(inner, k, [&](int64_t b, int64_t e) { block(0, b, e); });
    }
  });
}

void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  Strides xs = x.strides();
  const int64_t xstep = xs[dim];
  xs[dim] = 0;  // the index supplies the position along dim
  const int64_t* ip = index.data_ptr<int64_t>();
  ASC_DISPATCH_ALL(x.dtype(), "gather", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    for_each_strided<3>(index.shape(), {out.strides(), index.strides(), xs}, [&](auto off, int64_t n, auto st) {
      scalar_t* o = op + off[0];
      const int64_t* q = ip + off[1];
      const scalar_t* xb = xp + off[2];
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = xb[i * st[2] + q[i * st[1]] * xstep];
    });
  });
}

namespace {
// The walk of scatter and scatter_add: put(out[.., index[i..], ..], src[i..]) for every position of index, serially in
// row-major order (different positions may hit the same output element; along a fibre the later one comes last).
template <class T, class Put>
void scatter_walk(Tensor& out, int dim, const Tensor& index, const Tensor& src, Put put) {
  Strides os = out.strides();
  const int64_t ostep = os[dim];
  os[dim] = 0;
  const int64_t* ip = index.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const T* sp = src.data_ptr<T>();
  for_each_strided<3>(
      index.shape(), {os, index.strides(), src.strides()},
      [&](auto off, int64_t n, auto st) {
        T* ob = op + off[0];
        const int64_t* q = ip + off[1];
        const T* s = sp + off[2];
        for (int64_t i = 0; i < n; ++i) put(ob[i * st[0] + q[i * st[1]] * ostep], s[i * st[2]]);
      },
      /*parallel=*/false);
}
}  // namespace

void scatter_add(Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  ASC_DISPATCH_NUMERIC(out.dtype(), "scatter_add",
                       [&] { scatter_walk<scalar_t>(out, dim, index, src, [](scalar_t& o, scalar_t v) { o += v; }); });
}

void scatter(Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  // along each fibre the later write wins, as the CUDA kernel's fibre loop does
  ASC_DISPATCH_ALL(out.dtype(), "scatter",
                   [&] { scatter_walk<scalar_t>(out, dim, index, src, [](scalar_t& o, scalar_t v) { o = v; }); });
}

void one_hot(const Tensor& index, Tensor& out) {
  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  const int64_t c = out.size(-1);
  ASC_DISPATCH_ALL(out.dtype(), "one_hot", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    for (size_t j = 0; j < idx.size(); ++j) op[static_cast<int64_t>(j) * c + idx[j]] = static_cast<scalar_t>(1);
  });
}

}  // namespace asc::cpu
