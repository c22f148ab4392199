// CPU reduction kernels over the last dimension of a contiguous (rows, n) tensor; see ops/kernel_list.inc.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

// The row loops of max / min, compiled per instruction set level (ASC_CPU_DISPATCH) inside a no-trapping-math region,
// where GCC vectorises their float selects; nothing from std:: is called in it (such calls do not inline there).
#include "ops/cpu/vec_region_begin.h"

#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

// Pass 1 of a row's max / min: the extreme ignoring NaN (an OpenMP simd max / min reduction: lanes of the vector
// each keep one, combined at the end) and the number of NaNs. Only the extreme's value is used, to find its first
// position: which of two equal values (+0 and -0) a lane kept does not matter.
template <class T, bool IsMax>
ASC_ALWAYS_INLINE std::pair<T, bool> extreme_of_row(const T* a, int64_t n) {
  T best = a[0];
  int64_t nans = 0;
  if constexpr (IsMax) {
    ASC_SIMD_SUMS_MAX(best, nans)
    for (int64_t j = 0; j < n; ++j) {
      const T v = a[j];
      nans += v != v ? 1 : 0;
      best = v > best ? v : best;
    }
  } else {
    ASC_SIMD_SUMS_MIN(best, nans)
    for (int64_t j = 0; j < n; ++j) {
      const T v = a[j];
      nans += v != v ? 1 : 0;
      best = v < best ? v : best;
    }
  }
  return {best, nans > 0};
}

// One block of columns [c0, c1) of a (n, inner) slab: the running extreme per column (and its row, where id is
// given), walking the n rows with contiguous inner loops. A NaN, once taken, is never replaced.
template <class T, bool IsMax>
ASC_ALWAYS_INLINE void extreme_of_columns(const T* a, int64_t n, int64_t inner, int64_t c0, int64_t c1, T* v,
                                          int64_t* id) {
  for (int64_t c = c0; c < c1; ++c) v[c] = a[c];
  if (id)
    for (int64_t c = c0; c < c1; ++c) id[c] = 0;
  for (int64_t j = 1; j < n; ++j) {
    const T* row = a + j * inner;
    for (int64_t c = c0; c < c1; ++c) {
      const T u = row[c], b = v[c];
      const bool take = (IsMax ? u > b : u < b) || (u != u && b == b);
      v[c] = take ? u : b;
      if (id) id[c] = take ? j : id[c];
    }
  }
}

}  // namespace
}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"

namespace asc::cpu {
namespace {

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(v);
  else
    return false;
}

template <class T, bool IsMax>
void max_min_impl(const Tensor& x, Tensor& values, Tensor& indices) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();                                            // (rows, n)
  T* vp = values.data_ptr<T>();                                             // (rows,)
  int64_t* ip = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;  // (rows,)
  parallel_for(rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = xp + r * n;
      const auto [best, nan] = ASC_CPU_DISPATCH((extreme_of_row<T, IsMax>(a, n)));
      // Pass 2: the first position holding it (NaN != NaN, so look NaN up by is_nan); its element is the value.
      int64_t bi = 0;
      if (nan) {
        while (!is_nan(a[bi])) ++bi;
      } else {
        while (a[bi] != best) ++bi;
      }
      vp[r] = a[bi];
      if (ip) ip[r] = bi;
    }
  });
}

template <class T, bool IsMax>
void max_min_mid_impl(const Tensor& x, Tensor& values, Tensor& indices) {
  const int64_t outer = x.size(0), n = x.size(1), inner = x.size(2);
  const T* xp = x.data_ptr<T>();                                            // (outer, n, inner)
  T* vp = values.data_ptr<T>();                                             // (outer, inner)
  int64_t* ip = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;  // (outer, inner)
  // Work items: (outer index, block of inner columns), each walked by extreme_of_columns.
  constexpr int64_t kBlock = 256;
  const int64_t nb = (inner + kBlock - 1) / kBlock;
  parallel_for(outer * nb, n * kBlock, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / nb, c0 = (t % nb) * kBlock, c1 = std::min(inner, c0 + kBlock);
      const T* a = xp + o * n * inner;
      T* v = vp + o * inner;
      int64_t* id = ip ? ip + o * inner : nullptr;
      ASC_CPU_DISPATCH((extreme_of_columns<T, IsMax>(a, n, inner, c0, c1, v, id)));
    }
  });
}

template <class T>
void logsumexp_impl(const Tensor& x, Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();  // (rows, n)
  T* op = out.data_ptr<T>();      // (rows,)
  constexpr double kInf = std::numeric_limits<double>::infinity();
  parallel_for(rows, 4 * n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = xp + r * n;
      double m = -kInf;
      bool nan = false;
      for (int64_t j = 0; j < n; ++j) {
        nan |= std::isnan(a[j]);
        m = a[j] > m ? double(a[j]) : m;
      }
      if (nan) {
        op[r] = std::numeric_limits<T>::quiet_NaN();
        continue;
      }
      if (std::isinf(m)) {  // -inf: every element is -inf (or the row is empty); +inf: the sum is +inf
        op[r] = static_cast<T>(m);
        continue;
      }
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(double(a[j]) - m);
      op[r] = static_cast<T>(m + std::log(s));
    }
  });
}

}  // namespace

void max_min_lastdim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices) {
  ASC_DISPATCH_NUMERIC(x.dtype(), is_max ? "max" : "min", [&] {
    if (is_max)
      max_min_impl<scalar_t, true>(x, values, indices);
    else
      max_min_impl<scalar_t, false>(x, values, indices);
  });
}

void max_min_middim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices) {
  ASC_DISPATCH_NUMERIC(x.dtype(), is_max ? "max" : "min", [&] {
    if (is_max)
      max_min_mid_impl<scalar_t, true>(x, values, indices);
    else
      max_min_mid_impl<scalar_t, false>(x, values, indices);
  });
}

void logsumexp_lastdim(const Tensor& x, Tensor& out) {
  ASC_DISPATCH_FLOAT(x.dtype(), "logsumexp", [&] { logsumexp_impl<scalar_t>(x, out); });
}

}  // namespace asc::cpu
