// CPU kernels of the nn functional ops: fused, numerically stable (max-shifted) row-wise loops over a contiguous
// (rows, n) layout, rows in parallel. Inner loops are written so GCC vectorises them (OpenMP simd reductions and a
// branch-free exp for arguments <= 0, which is all softmax / log-softmax / cross-entropy need).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

// Float comparisons "may trap" under GCC's default -ftrapping-math, which stops if-conversion of the selects in
// exp_nonpos / the masked loops and so their vectorisation. The kernels never read FP exception flags. Functions
// defined outside this region (std::max, std::bit_cast, ...) are not inlined into it (mismatched options), so the
// hot loops use only builtins and plain expressions.
#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // inside the region: exp_nonpos, ASC_SIMD_REDUCE

namespace asc::cpu {
namespace {

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Row count and length of a contiguous tensor reduced over its last dim.
inline void rows_of(const Tensor& x, int64_t& rows, int64_t& n) {
  n = x.dim() == 0 ? 1 : x.size(-1);
  rows = n == 0 ? 0 : x.numel() / n;
}

template <class T>
ASC_ALWAYS_INLINE T row_max(const T* x, int64_t n) {
  T m = kNegInf<T>;
  ASC_SIMD_REDUCE(max, m)
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// Masks are read as bytes (bool is 0/1), and every load is unconditional: a load only on one side of a select
// would need a masked load, which baseline x86-64 lacks, and the loop would stay scalar.
template <class T>
ASC_ALWAYS_INLINE T row_max_masked(const T* x, const uint8_t* keep, int64_t n) {
  T m = kNegInf<T>;
  ASC_SIMD_REDUCE(max, m)
  for (int64_t j = 0; j < n; ++j) {
    const T xv = x[j];
    const T v = keep[j] ? xv : kNegInf<T>;
    m = v > m ? v : m;
  }
  return m;
}

// True when a kept entry of the row is NaN. Only dead rows (max -inf) need the scan: the vectorised max ignores NaN.
template <class T>
bool row_has_nan(const T* x, const uint8_t* keep, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if ((!keep || keep[j]) && x[j] != x[j]) return true;
  return false;
}

// A row whose kept entries hold a NaN (or a +inf, whose exp overflows to inf/inf) gives NaN on every kept entry, as
// in PyTorch; masked entries keep their masked value (0, or -inf for log_softmax).
template <class T>
void fill_nan_row(T* y, const uint8_t* keep, int64_t n, bool log) {
  const T masked = log ? kNegInf<T> : T(0);
  for (int64_t j = 0; j < n; ++j) y[j] = (!keep || keep[j]) ? std::numeric_limits<T>::quiet_NaN() : masked;
}

// Softmax (or log_softmax) of short rows, rows [b, e) of n entries, a block of them at a time: per row loops over
// fewer than 32 entries run mostly their vector loops' scalar remainders (a softmax over 4 entries took 5x longer per
// entry than one over 16; over 17, 3x), so the rows are laid end to end and the exponentials run over the whole block
// at once. softmax_forward_impl sends rows of fewer than 32 entries here, 16 aside (one whole vector).
// Per row: the max over kept entries (NaN never wins), t = x - max (-inf where masked), e = exp(t), Σ e; then
// y = e / Σ e, or t - log Σ e (-inf where masked). Dead rows (max -inf) and rows with a NaN (Σ e NaN) as the long
// rows' kernel gives them.
template <class T>
ASC_ALWAYS_INLINE void softmax_short_rows(const T* xp, const uint8_t* mp, T* yp, int64_t b, int64_t e, int64_t n,
                                          bool log) {
  constexpr int64_t kBlock = 1024;  // entries per block
  alignas(64) T t[kBlock], ex[kBlock];
  T mx[kBlock];  // the block's row maxima (at most kBlock rows)
  const int64_t per = std::max<int64_t>(1, kBlock / n);
  for (int64_t r0 = b; r0 < e; r0 += per) {
    const int64_t r1 = std::min(e, r0 + per), cnt = (r1 - r0) * n;
    const T* x = xp + r0 * n;
    const uint8_t* k = mp ? mp + r0 * n : nullptr;
    T* y = yp + r0 * n;
    for (int64_t r = 0; r < r1 - r0; ++r) {
      T m = kNegInf<T>;
      for (int64_t j = 0; j < n; ++j) {
        const T v = (!k || k[r * n + j]) ? x[r * n + j] : kNegInf<T>;
        m = v > m ? v : m;
      }
      mx[r] = m;
      for (int64_t j = 0; j < n; ++j) t[r * n + j] = (!k || k[r * n + j]) ? x[r * n + j] - m : kNegInf<T>;
    }
    ASC_SIMD
    for (int64_t i = 0; i < cnt; ++i) ex[i] = exp_nonpos(t[i]);
    for (int64_t r = 0; r < r1 - r0; ++r) {
      const T* xr = x + r * n;
      const uint8_t* kr = k ? k + r * n : nullptr;
      T* yr = y + r * n;
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += ex[r * n + j];
      if (mx[r] == kNegInf<T>) {  // nothing kept (or every kept entry is -inf or NaN)
        if (row_has_nan(xr, kr, n))
          fill_nan_row(yr, kr, n, log);
        else
          for (int64_t j = 0; j < n; ++j) yr[j] = T(0);  // a dead row
        continue;
      }
      if (s != s) {  // a NaN entry (or x - m = inf - inf): the whole row is NaN
        fill_nan_row(yr, kr, n, log);
        continue;
      }
      if (!log) {
        const T inv = T(1) / s;
        for (int64_t j = 0; j < n; ++j) yr[j] = ex[r * n + j] * inv;
      } else {
        const T ls = std::log(s);
        for (int64_t j = 0; j < n; ++j) yr[j] = (!kr || kr[j]) ? t[r * n + j] - ls : kNegInf<T>;
      }
    }
  }
}

template <class T>
void softmax_forward_impl(const Tensor& x, const Tensor& mask, bool log, Tensor& y) {
  int64_t rows, n;
  rows_of(x, rows, n);
  const T* xp = x.data_ptr<T>();
  const uint8_t* mp = mask.defined() ? reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()) : nullptr;
  T* yp = y.data_ptr<T>();
  const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = xp + r * n;
      const uint8_t* kr = mp ? mp + r * n : nullptr;
      T* yr = yp + r * n;
      const T m = kr ? row_max_masked(xr, kr, n) : row_max(xr, n);
      if (m == kNegInf<T>) {  // nothing kept (or every kept entry is -inf or NaN)
        if (row_has_nan(xr, kr, n))
          fill_nan_row(yr, kr, n, log);
        else
          std::memset(yr, 0, sizeof(T) * n);  // a dead row: nothing kept, or every kept entry is -inf
        continue;
      }
      T s = 0;
      if (!log) {
        if (kr) {
          ASC_SIMD_REDUCE(+, s)
          for (int64_t j = 0; j < n; ++j) {
            const T xv = xr[j] - m;
            const T v = exp_nonpos(kr[j] ? xv : kNegInf<T>);
            yr[j] = v;
            s += v;
          }
        } else {
          ASC_SIMD_REDUCE(+, s)
          for (int64_t j = 0; j < n; ++j) {
            T v = exp_nonpos(xr[j] - m);
            yr[j] = v;
            s += v;
          }
        }
        if (s != s) {  // a NaN entry (or x - m = inf - inf): the whole row is NaN
          fill_nan_row(yr, kr, n, log);
          continue;
        }
        const T inv = T(1) / s;
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
      } else {
        if (kr) {
          ASC_SIMD_REDUCE(+, s)
          for (int64_t j = 0; j < n; ++j) {
            const T xv = xr[j] - m;
            s += exp_nonpos(kr[j] ? xv : kNegInf<T>);
          }
        } else {
          ASC_SIMD_REDUCE(+, s)
          for (int64_t j = 0; j < n; ++j) s += exp_nonpos(xr[j] - m);
        }
        if (s != s) {
          fill_nan_row(yr, kr, n, log);
          continue;
        }
        const T ls = std::log(s);  // y = (x - m) - log(s): more accurate than x - lse for large |x|
        if (kr) {
          for (int64_t j = 0; j < n; ++j) {
            const T v = (xr[j] - m) - ls;
            yr[j] = kr[j] ? v : kNegInf<T>;
          }
        } else {
          for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) - ls;
        }
      }
    }
  };
  if (n < 32 && n != 16) {
    parallel_for(rows, n * 8,
                 [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(softmax_short_rows<T>(xp, mp, yp, b, e, n, log)); });
    return;
  }
  parallel_for(rows, n * 8, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
}

template <class T>
void softmax_backward_impl(const Tensor& g, const Tensor& y, const Tensor& mask, bool log, Tensor& gx) {
  int64_t rows, n;
  rows_of(y, rows, n);
  const T* gp = g.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  const uint8_t* mp = mask.defined() ? reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()) : nullptr;
  T* op = gx.data_ptr<T>();
  const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA {
    for (int64_t r = b; r < e; ++r) {
      const T* gr = gp + r * n;
      const T* yr = yp + r * n;
      const uint8_t* kr = mp ? mp + r * n : nullptr;
      T* o = op + r * n;
      if (!log) {
        // Masked entries and dead rows have y == 0, so they get 0 without looking at the mask.
        T dot = 0;
        ASC_SIMD_REDUCE(+, dot)
        for (int64_t j = 0; j < n; ++j) dot += gr[j] * yr[j];
        for (int64_t j = 0; j < n; ++j) o[j] = yr[j] * (gr[j] - dot);
        continue;
      }
      // log_softmax: sum g over kept entries. A dead row (forward wrote 0 everywhere) is recognised by having no
      // kept entry, or >= 2 kept entries that are all exactly 0 (their sum is 0: all y <= 0, so no cancellation) --
      // impossible for a live row, whose exp(y) sum to 1. A single kept entry gives g - g = 0 either way.
      T S = 0, ysum = 0;
      int64_t kept = n;
      if (kr) {
        kept = 0;
        for (int64_t j = 0; j < n; ++j) kept += kr[j];
        ASC_SIMD_REDUCE2(+, S, ysum)
        for (int64_t j = 0; j < n; ++j) {
          const T gv = gr[j], yv = yr[j];
          S += kr[j] ? gv : T(0);
          ysum += kr[j] ? yv : T(0);
        }
      } else {
        ASC_SIMD_REDUCE2(+, S, ysum)
        for (int64_t j = 0; j < n; ++j) {
          S += gr[j];
          ysum += yr[j];
        }
      }
      if (kept == 0 || (kept >= 2 && ysum == 0)) {
        std::memset(o, 0, sizeof(T) * n);
        continue;
      }
      if (kr) {
        for (int64_t j = 0; j < n; ++j) {
          const T v = gr[j] - exp_nonpos(yr[j]) * S;
          o[j] = kr[j] ? v : T(0);
        }
      } else {
        for (int64_t j = 0; j < n; ++j) o[j] = gr[j] - exp_nonpos(yr[j]) * S;
      }
    }
  };
  parallel_for(rows, n * 6, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
}

template <class T>
void layer_norm_forward_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool rms, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  int64_t rows, n;
  rows_of(x, rows, n);
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.defined() ? weight.data_ptr<T>() : nullptr;
  const T* bp = (!rms && bias.defined()) ? bias.data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  T* meanp = mean.defined() ? mean.data_ptr<T>() : nullptr;
  T* rstdp = rstd.data_ptr<T>();
  const T inv_n = T(1) / static_cast<T>(n);
  const T teps = static_cast<T>(eps);
  const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = xp + r * n;
      T* yr = yp + r * n;
      T mu = 0, ss = 0;
      if (!rms) {
        ASC_SIMD_REDUCE(+, mu)
        for (int64_t j = 0; j < n; ++j) mu += xr[j];
        mu *= inv_n;
      }
      ASC_SIMD_REDUCE(+, ss)
      for (int64_t j = 0; j < n; ++j) {
        T d = xr[j] - mu;
        ss += d * d;
      }
      const T rs = T(1) / std::sqrt(ss * inv_n + teps);
      if (meanp) meanp[r] = mu;
      rstdp[r] = rs;
      if (wp && bp) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs * wp[j] + bp[j];
      } else if (wp) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs * wp[j];
      } else if (bp) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs + bp[j];
      } else {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs;
      }
    }
  };
  parallel_for(rows, n * 4, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
}

template <class T>
void layer_norm_backward_impl(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool rms, Tensor& gx, Tensor& gw, Tensor& gb) {
  int64_t rows, n;
  rows_of(x, rows, n);
  const T* gp = g.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.defined() ? weight.data_ptr<T>() : nullptr;
  const T* meanp = mean.defined() ? mean.data_ptr<T>() : nullptr;
  const T* rstdp = rstd.data_ptr<T>();
  T* gxp = gx.defined() ? gx.data_ptr<T>() : nullptr;
  const bool want_w = gw.defined(), want_b = gb.defined();
  // dW and dB sum over rows. Rows go in blocks fixed by the row count alone (at most kMaxBlocks of them), each
  // block's partial sums kept apart and added in block order at the end: the bits do not depend on the thread count.
  constexpr int64_t kMaxBlocks = 64;
  const int64_t per = std::max<int64_t>(4, (rows + kMaxBlocks - 1) / kMaxBlocks);
  const int64_t nblocks = rows == 0 ? 0 : (rows + per - 1) / per;
  const size_t width = static_cast<size_t>(n);
  std::vector<T> part_w(want_w ? nblocks * width : 0), part_b(want_b ? nblocks * width : 0);
  const T inv_n = T(1) / static_cast<T>(n);
  const auto rows_kernel = [&](int64_t blk0, int64_t blk1) ASC_INLINE_LAMBDA {
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t b = blk * per, e = std::min(rows, b + per);
      T* lw = want_w ? part_w.data() + blk * width : nullptr;
      T* lb = want_b ? part_b.data() + blk * width : nullptr;
      for (int64_t j = 0; j < (want_w ? n : 0); ++j) lw[j] = T(0);
      for (int64_t j = 0; j < (want_b ? n : 0); ++j) lb[j] = T(0);
      for (int64_t r = b; r < e; ++r) {
        const T* gr = gp + r * n;
        const T* xr = xp + r * n;
        const T mu = meanp ? meanp[r] : T(0);
        const T rs = rstdp[r];
        if (want_w) {
          T* w = lw;
          for (int64_t j = 0; j < n; ++j) w[j] += gr[j] * (xr[j] - mu) * rs;
        }
        if (want_b) {
          T* bb = lb;
          for (int64_t j = 0; j < n; ++j) bb[j] += gr[j];
        }
        if (!gxp) continue;
        // gh = g * w; gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) (rms: without the mean(gh) term).
        T sum_gh = 0, sum_ghx = 0;
        if (wp) {
          ASC_SIMD_REDUCE2(+, sum_gh, sum_ghx)
          for (int64_t j = 0; j < n; ++j) {
            T gh = gr[j] * wp[j];
            sum_gh += gh;
            sum_ghx += gh * (xr[j] - mu) * rs;
          }
        } else {
          ASC_SIMD_REDUCE2(+, sum_gh, sum_ghx)
          for (int64_t j = 0; j < n; ++j) {
            sum_gh += gr[j];
            sum_ghx += gr[j] * (xr[j] - mu) * rs;
          }
        }
        const T a = rms ? T(0) : sum_gh * inv_n, c = sum_ghx * inv_n;
        T* o = gxp + r * n;
        if (wp) {
          for (int64_t j = 0; j < n; ++j) o[j] = rs * (gr[j] * wp[j] - a - (xr[j] - mu) * rs * c);
        } else {
          for (int64_t j = 0; j < n; ++j) o[j] = rs * (gr[j] - a - (xr[j] - mu) * rs * c);
        }
      }
    }
  };
  parallel_for(nblocks, per * n * 8, [&](int64_t blk0, int64_t blk1) { ASC_CPU_DISPATCH(rows_kernel(blk0, blk1)); });
  // The block partials, added in block order in double.
  auto combine = [&](const std::vector<T>& part, Tensor& out) {
    std::vector<double> acc(width, 0.0);
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const T* pb = part.data() + blk * width;
      for (int64_t j = 0; j < n; ++j) acc[j] += pb[j];
    }
    T* o = out.data_ptr<T>();
    for (int64_t j = 0; j < n; ++j) o[j] = static_cast<T>(acc[j]);
  };
  if (want_w) combine(part_w, gw);
  if (want_b) combine(part_b, gb);
}

template <class T>
void cross_entropy_forward_impl(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                                Tensor& loss, Tensor& stats) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  const T* xp = logits.data_ptr<T>();
  const int64_t* tp = target.data_ptr<int64_t>();
  T* lp = loss.data_ptr<T>();
  T* sp = stats.data_ptr<T>();
  const T s = static_cast<T>(smoothing), s_over_c = static_cast<T>(smoothing / static_cast<double>(C));
  const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = tp[r];
      if (t == ignore_index) {
        lp[r] = 0;
        sp[2 * r] = sp[2 * r + 1] = 0;
        continue;
      }
      const T* xr = xp + r * C;
      const T m = row_max(xr, C);
      T sum = 0;
      ASC_SIMD_REDUCE(+, sum)
      for (int64_t j = 0; j < C; ++j) sum += exp_nonpos(xr[j] - m);
      const T ls = std::log(sum);
      // lse - sum_j q_j x_j with sum_j q_j = 1, written with shifted logits (x - m) so large logits lose nothing.
      T out = ls - (T(1) - s) * (xr[t] - m);
      if (smoothing != 0) {
        T sx = 0;
        ASC_SIMD_REDUCE(+, sx)
        for (int64_t j = 0; j < C; ++j) sx += xr[j] - m;
        out -= s_over_c * sx;
      }
      lp[r] = out;
      sp[2 * r] = m;
      sp[2 * r + 1] = ls;
    }
  };
  parallel_for(rows, C * 6, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
}

template <class T>
void cross_entropy_backward_impl(const Tensor& gloss, double scale, const Tensor& logits, const Tensor& target,
                                 const Tensor& stats, int64_t ignore_index, double smoothing, Tensor& gx) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  const T* gp = gloss.data_ptr<T>();
  const int64_t gstride = gloss.dim() == 0 ? 0 : gloss.stride(0);
  const T* xp = logits.data_ptr<T>();
  const int64_t* tp = target.data_ptr<int64_t>();
  const T* sp = stats.data_ptr<T>();
  T* op = gx.data_ptr<T>();
  const T s = static_cast<T>(smoothing), s_over_c = static_cast<T>(smoothing / static_cast<double>(C));
  const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA {
    for (int64_t r = b; r < e; ++r) {
      T* o = op + r * C;
      const int64_t t = tp[r];
      if (t == ignore_index) {
        std::memset(o, 0, sizeof(T) * C);
        continue;
      }
      const T* xr = xp + r * C;
      const T coef = static_cast<T>(scale) * gp[r * gstride];
      const T m = sp[2 * r], ls = sp[2 * r + 1];
      for (int64_t j = 0; j < C; ++j) o[j] = coef * (exp_nonpos((xr[j] - m) - ls) - s_over_c);
      o[t] -= coef * (T(1) - s);
    }
  };
  parallel_for(rows, C * 4, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& mask, bool log, Tensor& y) {
  ASC_DISPATCH_FLOAT(x.dtype(), log ? "log_softmax" : "softmax",
                     [&] { softmax_forward_impl<scalar_t>(x, mask, log, y); });
}

void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& mask, bool log, Tensor& gx) {
  ASC_DISPATCH_FLOAT(y.dtype(), log ? "log_softmax backward" : "softmax backward",
                     [&] { softmax_backward_impl<scalar_t>(g, y, mask, log, gx); });
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool rms, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  ASC_DISPATCH_FLOAT(x.dtype(), rms ? "rms_norm" : "layer_norm",
                     [&] { layer_norm_forward_impl<scalar_t>(x, weight, bias, eps, rms, y, mean, rstd); });
}

void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         bool rms, Tensor& gx, Tensor& gw, Tensor& gb) {
  ASC_DISPATCH_FLOAT(x.dtype(), rms ? "rms_norm backward" : "layer_norm backward",
                     [&] { layer_norm_backward_impl<scalar_t>(g, x, weight, mean, rstd, rms, gx, gw, gb); });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                           Tensor& loss, Tensor& stats) {
  ASC_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    cross_entropy_forward_impl<scalar_t>(logits, target, ignore_index, smoothing, loss, stats);
  });
}

void cross_entropy_backward(const Tensor& gloss, double scale, const Tensor& logits, const Tensor& target,
                            const Tensor& stats, int64_t ignore_index, double smoothing, Tensor& gx) {
  ASC_DISPATCH_FLOAT(logits.dtype(), "cross_entropy backward", [&] {
    cross_entropy_backward_impl<scalar_t>(gloss, scale, logits, target, stats, ignore_index, smoothing, gx);
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
