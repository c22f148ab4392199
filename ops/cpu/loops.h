#pragma once
// Strided iteration for CPU kernels. `for_each_strided<N>` walks a shape with N operands, each with its own
// element strides (0 on broadcast dims), after merging dimensions that are contiguous for every operand. The
// callback handles one innermost run:
//
//   inner(ptrs, n, steps)   // ptrs[k]: element offset of operand k at the run's start; steps[k]: its stride
//
// When every step is 1 the callback can use a plain contiguous loop the compiler vectorises; that is the
// common case (contiguous tensors collapse to one run of numel elements).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>

#include "core/shape.h"
#include "ops/layout.h"  // StridedLayout, coalesce

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

namespace asc::cpu {

// An exception must not leave an OpenMP region: the runtime calls std::terminate. Every parallel region runs its
// work through one FirstError: the first exception thrown on any thread is kept, threads that start after it skip
// their work, and rethrow() raises it on the calling thread once the region has joined (its implicit barrier
// orders the write of `first_` before the read). The cost on the normal path is one relaxed load per thread.
class FirstError {
 public:
  template <class F>
  void run(F&& f) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      f();
    } catch (...) {
      if (!failed_.exchange(true)) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::exception_ptr first_;
};

// Below this many elements a parallel region costs more than it saves.
inline constexpr int64_t kParallelGrain = 32768;

// Calls inner(offsets, n, steps) over the rows [row_begin, row_end) of the coalesced layout, where a "row" is one
// run of the innermost dimension.
template <int N, class F>
void for_rows(const StridedLayout<N>& L, int64_t row_begin, int64_t row_end, F& inner) {
  const int nd = L.shape.size();
  const int64_t n = L.shape[nd - 1];
  std::array<int64_t, N> steps;
  for (int k = 0; k < N; ++k) steps[k] = L.strides[k][nd - 1];
  // Decompose row_begin into an index over the outer dims.
  int64_t idx[kMaxDims] = {};
  int64_t r = row_begin;
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = r % L.shape[d];
    r /= L.shape[d];
  }
  std::array<int64_t, N> off{};
  for (int k = 0; k < N; ++k)
    for (int d = 0; d < nd - 1; ++d) off[k] += idx[d] * L.strides[k][d];
  for (int64_t row = row_begin; row < row_end; ++row) {
    inner(off, n, steps);
    // Odometer increment over the outer dims.
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < L.shape[d]) {
        for (int k = 0; k < N; ++k) off[k] += L.strides[k][d];
        break;
      }
      idx[d] = 0;
      for (int k = 0; k < N; ++k) off[k] -= (L.shape[d] - 1) * L.strides[k][d];
    }
  }
}

// Serial or OpenMP-parallel over rows. `parallel` must be false when operands alias in a way that makes rows
// depend on each other (reductions into a broadcast output).
template <int N, class F>
void for_each_strided(const Shape& shape, const std::array<Strides, N>& strides, F&& inner, bool parallel = true) {
  if (numel_of(shape) == 0) return;
  StridedLayout<N> L = coalesce<N>(shape, strides);
  const int64_t n = L.shape[L.shape.size() - 1];
  const int64_t rows = numel_of(L.shape) / n;
#ifdef ASC_HAVE_OPENMP
  if (parallel && rows * n >= kParallelGrain && omp_get_max_threads() > 1) {
    if (rows == 1) {  // one long run: split it into chunks
      const int64_t chunks = omp_get_max_threads();
      const int64_t len = (n + chunks - 1) / chunks;
      std::array<int64_t, N> steps;
      for (int k = 0; k < N; ++k) steps[k] = L.strides[k][0];
      FirstError err;
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        int64_t b = c * len, e = std::min(n, b + len);
        if (b >= e) continue;
        err.run([&] {
          std::array<int64_t, N> off;
          for (int k = 0; k < N; ++k) off[k] = b * steps[k];
          inner(off, e - b, steps);
        });
      }
      err.rethrow();
      return;
    }
    FirstError err;
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t per = (rows + nt - 1) / nt;
      int64_t b = t * per, e = std::min(rows, b + per);
      if (b < e) err.run([&] { for_rows<N>(L, b, e, inner); });
    }
    err.rethrow();
    return;
  }
#endif
  for_rows<N>(L, 0, rows, inner);
}

// Runs fn(begin, end) over [0, n) split across threads when n * cost_per_item is large enough.
template <class F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& fn) {
#ifdef ASC_HAVE_OPENMP
  if (n > 1 && n * cost_per_item >= kParallelGrain && omp_get_max_threads() > 1) {
    FirstError err;
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t per = (n + nt - 1) / nt;
      int64_t b = t * per, e = std::min(n, b + per);
      if (b < e) err.run([&] { fn(b, e); });
    }
    err.rethrow();
    return;
  }
#endif
  if (n > 0) fn(int64_t{0}, n);
}

}  // namespace asc::cpu
