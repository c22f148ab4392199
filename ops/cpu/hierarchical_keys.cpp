// hierarchical_keys' CPU kernels (ops/cpu/hierarchical_keys.h). One task per (batch, head, block): the block's rows
// are copied and summed in the same pass, so x is read once, while the rows are in the cache.
#include "ops/cpu/hierarchical_keys.h"

#include <algorithm>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/loops.h"

namespace asc::cpu {
namespace {

// Real tokens per (batch, block): the divisor of the block's mean.
std::vector<int64_t> block_counts(const Tensor& keep, int64_t B, int64_t T, int64_t b, int64_t nb) {
  std::vector<int64_t> count(static_cast<size_t>(B * nb));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t m = 0; m < nb; ++m) {
      const int64_t lo = m * b, hi = std::min(T, lo + b);
      int64_t c = hi - lo;
      if (keep.defined()) {
        const bool* k = keep.data_ptr<bool>() + i * T;
        c = 0;
        for (int64_t t = lo; t < hi; ++t) c += k[t];
      }
      count[static_cast<size_t>(i * nb + m)] = c;
    }
  return count;
}

// Task w of B·H·nb: block m of (batch i, head h), its token rows [lo, hi), and batch i's mask row (null: all real).
struct BlockTask {
  int64_t i, h, bh, m, lo, hi;
  const bool* keep;
};
BlockTask block_task(int64_t w, int64_t H, int64_t T, int64_t b, int64_t nb, const Tensor& keep) {
  const int64_t m = w % nb, bh = w / nb, i = bh / H, lo = m * b;
  return {i, bh % H, bh, m, lo, std::min(T, lo + b), keep.defined() ? keep.data_ptr<bool>() + i * T : nullptr};
}

template <class T_>
void forward_impl(const Tensor& x, int64_t b, const Tensor& keep, Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3), nb = out.size(2) - T;
  const std::vector<int64_t> count = block_counts(keep, B, T, b, nb);
  const T_* xp = x.data_ptr<T_>();
  T_* op = out.data_ptr<T_>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1), s2 = x.stride(2);
  parallel_for(B * H * nb, b * d * 2, [&](int64_t w0, int64_t w1) {
    std::vector<double> sum(static_cast<size_t>(d));
    for (int64_t w = w0; w < w1; ++w) {
      const BlockTask tk = block_task(w, H, T, b, nb, keep);
      const T_* xs = xp + tk.i * s0 + tk.h * s1;
      T_* o = op + tk.bh * (T + nb) * d;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t t = tk.lo; t < tk.hi; ++t) {
        const T_* row = xs + t * s2;
        std::copy_n(row, d, o + t * d);
        if (tk.keep && !tk.keep[t]) continue;  // a padding token: copied, not summed (its NaN stays out of the mean)
        for (int64_t c = 0; c < d; ++c) sum[c] += double(row[c]);
      }
      const double inv = 1.0 / double(std::max<int64_t>(count[static_cast<size_t>(tk.i * nb + tk.m)], 1));
      T_* mean = o + (T + tk.m) * d;
      for (int64_t c = 0; c < d; ++c) mean[c] = static_cast<T_>(sum[c] * inv);
    }
  });
}

template <class T_>
void backward_impl(const Tensor& g, int64_t b, const Tensor& keep, Tensor& gx) {
  const int64_t B = gx.size(0), H = gx.size(1), T = gx.size(2), d = gx.size(3), nb = g.size(2) - T;
  const std::vector<int64_t> count = block_counts(keep, B, T, b, nb);
  const T_* gp = g.data_ptr<T_>();
  T_* xp = gx.data_ptr<T_>();
  const int64_t s0 = g.stride(0), s1 = g.stride(1), s2 = g.stride(2);
  parallel_for(B * H * nb, b * d * 2, [&](int64_t w0, int64_t w1) {
    std::vector<T_> share(static_cast<size_t>(d));
    for (int64_t w = w0; w < w1; ++w) {
      const BlockTask tk = block_task(w, H, T, b, nb, keep);
      const T_* gs = gp + tk.i * s0 + tk.h * s1;
      T_* o = xp + tk.bh * T * d;
      // the mean's gradient, divided as the composition's division's backward divides it
      const T_ cnt = static_cast<T_>(std::max<int64_t>(count[static_cast<size_t>(tk.i * nb + tk.m)], 1));
      const T_* gm = gs + (T + tk.m) * s2;
      for (int64_t c = 0; c < d; ++c) share[c] = gm[c] / cnt;
      for (int64_t t = tk.lo; t < tk.hi; ++t) {
        const T_* gr = gs + t * s2;
        T_* dst = o + t * d;
        if (tk.keep && !tk.keep[t]) {
          std::copy_n(gr, d, dst);  // a padding token gets no part of the mean's gradient (not even 0 · NaN)
          continue;
        }
        for (int64_t c = 0; c < d; ++c) dst[c] = gr[c] + share[c];
      }
    }
  });
}

}  // namespace

void hierarchical_keys_forward(const Tensor& x, int64_t b, const Tensor& keep, Tensor& out) {
  ASC_DISPATCH_FLOAT(x.dtype(), "hierarchical_keys", [&] { forward_impl<scalar_t>(x, b, keep, out); });
}

void hierarchical_keys_backward(const Tensor& g, int64_t b, const Tensor& keep, Tensor& gx) {
  ASC_DISPATCH_FLOAT(g.dtype(), "hierarchical_keys backward", [&] { backward_impl<scalar_t>(g, b, keep, gx); });
}

}  // namespace asc::cpu
