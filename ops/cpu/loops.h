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
#include "ops/cpu/thread_pool.h"
#include "ops/layout.h"  // StridedLayout, coalesce

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

namespace asc::cpu {

// An exception must not leave a chunk running on another thread (nothing would catch it there). Every parallel job
// runs its chunks through one FirstError: the first exception thrown on any thread is kept, chunks that start after
// it skip their work, and rethrow() raises it on the calling thread once the job is done (the pool's wait for the
// last chunk orders the write of `first_` before the read). The cost on the normal path is one relaxed load per
// chunk.
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

// Below this many elements a parallel job costs more than it saves.
inline constexpr int64_t kParallelGrain = 32768;
// A parallel job is cut into at most this many chunks per thread: enough that a thread slowed down by another
// process on its core leaves its share to the others (thread_pool.h), few enough that each chunk stays large.
inline constexpr int64_t kChunksPerThread = 4;

// The threads a parallel job may use: OpenMP's setting (OMP_NUM_THREADS, omp_set_num_threads), which the tools and
// users already set; in a build without OpenMP, OMP_NUM_THREADS or else the number of cores (thread_pool.h).
inline int max_threads() {
#ifdef ASC_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return default_threads();
#endif
}

// How many chunks n items of `work` units in all are cut into for `threads` threads: one per kParallelGrain units,
// at least one per thread, at most kChunksPerThread per thread, never more than n.
inline int64_t chunk_count(int64_t n, int64_t work, int threads) {
  return std::min(n, std::clamp<int64_t>(work / kParallelGrain, threads, kChunksPerThread * threads));
}

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

// Runs fn(begin, end) over [0, n) in chunks on the thread pool when n * cost_per_item is large enough, else in one
// call. The chunks depend on n, the cost and the thread count only, so fn must give each item the same result
// whichever range it comes in (every caller writes per-item outputs or per-block partials of fixed blocks).
template <class F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& fn) {
  const int threads = max_threads();
  if (n > 1 && n * cost_per_item >= kParallelGrain && threads > 1) {
    const int64_t chunks = chunk_count(n, n * cost_per_item, threads), per = (n + chunks - 1) / chunks;
    FirstError err;
    auto chunk = [&](int64_t c) {
      const int64_t b = c * per, e = std::min(n, b + per);
      if (b < e) err.run([&] { fn(b, e); });
    };
    run_chunks(chunks, threads, chunk);
    err.rethrow();
    return;
  }
  if (n > 0) fn(int64_t{0}, n);
}

// Serial or parallel over rows (one long run: over pieces of it). `parallel` must be false when operands alias in
// a way that makes rows depend on each other (reductions into a broadcast output).
template <int N, class F>
void for_each_strided(const Shape& shape, const std::array<Strides, N>& strides, F&& inner, bool parallel = true) {
  if (numel_of(shape) == 0) return;
  StridedLayout<N> L = coalesce<N>(shape, strides);
  const int64_t n = L.shape[L.shape.size() - 1];
  const int64_t rows = numel_of(L.shape) / n;
  if (parallel && rows == 1) {  // one long run: split it into pieces
    std::array<int64_t, N> steps;
    for (int k = 0; k < N; ++k) steps[k] = L.strides[k][0];
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      std::array<int64_t, N> off;
      for (int k = 0; k < N; ++k) off[k] = b * steps[k];
      inner(off, e - b, steps);
    });
  } else if (parallel) {
    parallel_for(rows, n, [&](int64_t b, int64_t e) { for_rows<N>(L, b, e, inner); });
  } else {
    for_rows<N>(L, 0, rows, inner);
  }
}

}  // namespace asc::cpu
