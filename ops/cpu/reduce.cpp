// CPU reduction kernels over the last dimension of a contiguous (rows, n) tensor; see reduce_kernels.h.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/dtype.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/reduce_kernels.h"

namespace asc::cpu {
namespace {

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

template <class T, bool IsMax>
void max_min_impl(const Tensor& x, Tensor& values, Tensor& indices) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();  // (rows, n)
  T* vp = values.data_ptr<T>();   // (rows,)
  int64_t* ip = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;  // (rows,)
  parallel_for(rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = xp + r * n;
      T best = a[0];
      int64_t bi = 0;
      if (!is_nan(best)) {
        for (int64_t j = 1; j < n; ++j) {
          const T v = a[j];
          if (is_nan(v)) {
            best = v;
            bi = j;
            break;
          }
          if (IsMax ? v > best : v < best) {
            best = v;
            bi = j;
          }
        }
      }
      vp[r] = best;
      if (ip) ip[r] = bi;
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
    if (is_max) max_min_impl<scalar_t, true>(x, values, indices);
    else max_min_impl<scalar_t, false>(x, values, indices);
  });
}

void logsumexp_lastdim(const Tensor& x, Tensor& out) {
  ASC_DISPATCH_FLOAT(x.dtype(), "logsumexp", [&] { logsumexp_impl<scalar_t>(x, out); });
}

}  // namespace asc::cpu
