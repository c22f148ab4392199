// The kernels that build a clustered union's block view on the device (cuda/sparse_patterns_launch.h): the walk of
// ops/cpu/sparse_patterns.cpp, with a thread block per block of the view and its threads over the candidates.
//
// Query block m of group g (rows 16 m ..): the keys j < S in chunks of 128, a thread per key; its bits are the base
// pattern's for that key in the block (a binary search of the base's union) | bit r where row 16 m + r joins j
// (ops/clustered_pairs.h; causal: j <= i; tested only where the two share a bucket, by the masks a first kernel makes
// per group). Key block m likewise over the queries. The count pass adds up the keys with
// bits (and each row's keys); the fill pass writes them in ascending order at the block's offset, each chunk's
// positions from a scan over the block's threads — so the lists come out as the CPU kernels make them, entry for
// entry. No atomics on the outputs: counts are summed in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/sparse_patterns_launch.h"
#include "ops/clustered_pairs.h"

namespace asc::cuda {
namespace {

using patterns_launch::Blocks;

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int64_t kBlock = 16;  // rows of a query block, keys of a key block (SparsePattern::kRowBlock, kKeyBlock)

__host__ __device__ int64_t blocks_of(int64_t n) { return n / kBlock + (n % kBlock != 0); }

// kRows: a query block (candidates: keys, lanes: its rows), else a key block (candidates: queries, lanes: its keys).
// kFill: write the entries at out_ptr's offsets; else count them (and, for query blocks, each row's keys).
template <class A, bool kRows, bool kFill>
__global__ void __launch_bounds__(kThreads)
    blocks_kernel(Blocks b, const A* a, const uint64_t* masks, int64_t* count, int64_t* row_len, const int64_t* out_ptr,
                  int64_t* out_items, int64_t* out_bits) {
  const int64_t m = blockIdx.x, g = blockIdx.y;
  const int64_t n_items = kRows ? b.S : b.T, n_blocks = blocks_of(kRows ? b.T : b.S);
  const int64_t lane_end = (kRows ? b.T : b.S) - kBlock * m;
  const int lanes = static_cast<int>(lane_end < kBlock ? lane_end : kBlock);
  const int64_t* const bptr = kRows ? b.rblk_ptr : b.kblk_ptr;
  const int64_t* const bitems = kRows ? b.rblk_keys : b.kblk_rows;
  const int64_t* const bbits = kRows ? b.rblk_bits : b.kblk_bits;
  const int64_t xb = (b.base_groups == 1 ? 0 : g) * n_blocks + m, x = g * n_blocks + m;
  const int64_t e0 = bptr[xb], e1 = bptr[xb + 1];
  const A* const ag = a + g * b.T * b.c;
  const uint64_t* const mg = masks + g * b.T;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  auto at = [](A v) { return static_cast<double>(rows::to_acc(v)); };
  uint64_t lane_or = 0;  // the buckets of the block's own tokens: a candidate that meets none joins no lane
  for (int r = 0; r < lanes && kBlock * m + r < b.T; ++r) lane_or |= mg[kBlock * m + r];

  __shared__ int64_t s_warp[kWarps];
  __shared__ int64_t s_done;  // fill: the block's entries written so far
  __shared__ unsigned long long s_n, s_len[kBlock];
  if (tid == 0) {
    s_done = 0, s_n = 0;
    for (int r = 0; r < kBlock; ++r) s_len[r] = 0;
  }
  __syncthreads();
  int n = 0, len[kBlock] = {};
  for (int64_t t0 = 0; t0 < n_items; t0 += kThreads) {
    const int64_t t = t0 + tid;
    int64_t bits = 0;
    if (t < n_items) {
      int64_t lo = e0, hi = e1;  // the first base entry >= t
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (bitems[mid] < t)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (lo < e1 && bitems[lo] == t) bits = bbits[lo];
      const bool own = t >= kBlock * m && t < kBlock * m + lanes;  // a lane's own token (a non-finite row joins it)
      if (t < b.T && (own || (mg[t] & lane_or) != 0))
        for (int r = 0; r < lanes; ++r) {
          const int64_t i = kRows ? kBlock * m + r : t, j = kRows ? t : kBlock * m + r;
          if (j < b.T && (!b.causal || j <= i) &&
              clustered::joins(ag + i * b.c, ag + j * b.c, b.c, mg[i], mg[j], i == j, b.theta, at))
            bits |= int64_t{1} << r;
        }
    }
    if constexpr (kFill) {
      const int flag = bits != 0;
      int incl = flag;  // the warp's inclusive scan of the flags
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      if (lane == 31) s_warp[warp] = incl;
      __syncthreads();
      int64_t before = s_done;
      for (int w = 0; w < warp; ++w) before += s_warp[w];
      if (flag) {
        const int64_t e = out_ptr[x] + before + incl - 1;
        out_items[e] = t, out_bits[e] = bits;
      }
      __syncthreads();                                  // every thread has read s_done
      if (tid == kThreads - 1) s_done = before + incl;  // the last thread's inclusive count is the chunk's end
      __syncthreads();
    } else {
      n += bits != 0;
      if (kRows)
#pragma unroll
        for (int r = 0; r < kBlock; ++r) len[r] += static_cast<int>(bits >> r & 1);  // unrolled: len in registers
    }
  }
  if constexpr (!kFill) {
    atomicAdd(&s_n, static_cast<unsigned long long>(n));
    if (kRows)
#pragma unroll
      for (int r = 0; r < kBlock; ++r) atomicAdd(&s_len[r], static_cast<unsigned long long>(len[r]));
    __syncthreads();
    if (tid == 0) {
      count[x] = static_cast<int64_t>(s_n);
      if (kRows)
        for (int r = 0; r < lanes; ++r) row_len[g * b.T + kBlock * m + r] = static_cast<int64_t>(s_len[r]);
    }
  }
}

// The bucket masks of group blockIdx.x: the largest sum of its finite rows and whether an entry is negative (reduced
// over the threads), then each row's.
template <class A>
__global__ void __launch_bounds__(kThreads) masks_kernel(Blocks b, const A* a, uint64_t* masks) {
  const int64_t g = blockIdx.x;
  const A* const ag = a + g * b.T * b.c;
  auto at = [](A v) { return static_cast<double>(rows::to_acc(v)); };
  __shared__ double s_max[kThreads];
  __shared__ int s_neg[kThreads];
  double largest = 0.0;
  int negative = 0;
  for (int64_t i = threadIdx.x; i < b.T; i += kThreads) {
    negative |= clustered::has_negative(ag + i * b.c, b.c, at) ? 1 : 0;
    if (clustered::finite_row(ag + i * b.c, b.c, at)) {
      const double s = clustered::row_sum(ag + i * b.c, b.c, at);
      largest = s > largest ? s : largest;
    }
  }
  s_max[threadIdx.x] = largest, s_neg[threadIdx.x] = negative;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      if (s_max[threadIdx.x + o] > s_max[threadIdx.x]) s_max[threadIdx.x] = s_max[threadIdx.x + o];
      s_neg[threadIdx.x] |= s_neg[threadIdx.x + o];
    }
    __syncthreads();
  }
  const double bmin = clustered::bucket_min(b.theta, s_max[0]);
  for (int64_t i = threadIdx.x; i < b.T; i += kThreads)
    masks[g * b.T + i] = clustered::bucket_mask(ag + i * b.c, b.c, bmin, s_neg[0] != 0, at);
}

// ptr (n + 1): a thread block of 256 threads, each summing a contiguous slice, the slices' sums scanned by one thread.
__global__ void __launch_bounds__(256) offsets_kernel(const int64_t* counts, int64_t n, int64_t* ptr) {
  const int64_t per = (n + 255) / 256, lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
  __shared__ int64_t sums[256];
  int64_t s = 0;
  for (int64_t x = lo; x < hi; ++x) s += counts[x];
  sums[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int t = 0; t < 256; ++t) {
      const int64_t v = sums[t];
      sums[t] = run, run += v;
    }
    ptr[n] = run;
  }
  __syncthreads();
  int64_t run = sums[threadIdx.x];
  for (int64_t x = lo; x < hi; ++x) ptr[x] = run, run += counts[x];
}

cudaError_t checked(cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); }

// One side's outputs of blocks_kernel: counts (and row lengths), or the offsets and the lists to fill.
struct Side {
  int64_t *count, *row_len;
  const int64_t* ptr;
  int64_t *items, *bits;
};

// blocks_kernel over the query blocks, then over the key blocks.
template <bool kFill>
cudaError_t both_sides(const Blocks& b, const void* a, FloatElem elem, const uint64_t* masks, Side rows, Side keys,
                       cudaStream_t stream) {
  if (b.groups == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) -> cudaError_t {
    using A = decltype(tag);
    const A* ap = static_cast<const A*>(a);
    const unsigned gy = grid_dim(b.groups, kMaxGridYZ);
    cudaError_t e =
        checked(launch_kernel(blocks_kernel<A, true, kFill>, dim3(grid_dim(blocks_of(b.T)), gy), dim3(kThreads), stream,
                              b, ap, masks, rows.count, rows.row_len, rows.ptr, rows.items, rows.bits));
    if (e != cudaSuccess) return e;
    return checked(launch_kernel(blocks_kernel<A, false, kFill>, dim3(grid_dim(blocks_of(b.S)), gy), dim3(kThreads),
                                 stream, b, ap, masks, keys.count, keys.row_len, keys.ptr, keys.items, keys.bits));
  });
}

}  // namespace

namespace patterns_launch {

cudaError_t masks(const Blocks& b, const void* a, FloatElem elem, uint64_t* masks, cudaStream_t stream) {
  if (b.groups == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) -> cudaError_t {
    using A = decltype(tag);
    return checked(launch_kernel(masks_kernel<A>, dim3(grid_dim(b.groups)), dim3(kThreads), stream, b,
                                 static_cast<const A*>(a), masks));
  });
}

cudaError_t count(const Blocks& b, const void* a, FloatElem elem, const uint64_t* masks, int64_t* rblk_count,
                  int64_t* kblk_count, int64_t* row_len, cudaStream_t stream) {
  return both_sides<false>(b, a, elem, masks, {rblk_count, row_len, nullptr, nullptr, nullptr},
                           {kblk_count, nullptr, nullptr, nullptr, nullptr}, stream);
}

cudaError_t fill(const Blocks& b, const void* a, FloatElem elem, const uint64_t* masks, const int64_t* rblk_ptr,
                 const int64_t* kblk_ptr, int64_t* rblk_keys, int64_t* rblk_bits, int64_t* kblk_rows,
                 int64_t* kblk_bits, cudaStream_t stream) {
  return both_sides<true>(b, a, elem, masks, {nullptr, nullptr, rblk_ptr, rblk_keys, rblk_bits},
                          {nullptr, nullptr, kblk_ptr, kblk_rows, kblk_bits}, stream);
}

cudaError_t exclusive_offsets(const int64_t* counts, int64_t n, int64_t* ptr, cudaStream_t stream) {
  return checked(launch_kernel(offsets_kernel, dim3(1), dim3(256), stream, counts, n, ptr));
}

}  // namespace patterns_launch
}  // namespace asc::cuda
