#pragma once
// Launchers of the kernels that build a clustered union's block view (cuda/sparse_patterns.cu), called by
// cuda/sparse_patterns.cpp with plain data: the pattern of ops/kernel_types.h (ClusteredBlocksArgs), a (groups, T, c)
// contiguous of element type `elem`, the int64 outputs of ops/kernel_list.inc (clustered_blocks_*,
// exclusive_offsets). C++17-clean; each launcher returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::patterns_launch {

struct Blocks {
  const int64_t *rblk_ptr, *rblk_keys, *rblk_bits;  // the base pattern's block view
  const int64_t *kblk_ptr, *kblk_rows, *kblk_bits;
  int64_t base_groups, groups, T, S, c;
  double theta;
  bool causal;
};

// masks (groups · T): each token's buckets (ops/clustered_pairs.h), a thread block per group.
cudaError_t masks(const Blocks& b, const void* a, FloatElem elem, uint64_t* masks, cudaStream_t stream);
// rblk_count (groups · ceil(T / 16)), kblk_count (groups · ceil(S / 16)), row_len (groups · T).
cudaError_t count(const Blocks& b, const void* a, FloatElem elem, const uint64_t* masks, int64_t* rblk_count,
                  int64_t* kblk_count, int64_t* row_len, cudaStream_t stream);
// The blocks' entries at the offsets rblk_ptr, kblk_ptr (exclusive sums of the counts).
cudaError_t fill(const Blocks& b, const void* a, FloatElem elem, const uint64_t* masks, const int64_t* rblk_ptr,
                 const int64_t* kblk_ptr, int64_t* rblk_keys, int64_t* rblk_bits, int64_t* kblk_rows,
                 int64_t* kblk_bits, cudaStream_t stream);
// ptr (n + 1) = the exclusive prefix sums of counts (n).
cudaError_t exclusive_offsets(const int64_t* counts, int64_t n, int64_t* ptr, cudaStream_t stream);

}  // namespace asc::cuda::patterns_launch
