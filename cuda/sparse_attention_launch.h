#pragma once
// Launchers of sparse attention's CUDA kernels (cuda/sparse_attention.cu), called by cuda/sparse_attention.cpp with
// plain data. q (B, H, T, D), k, v (B, H, S, D), o, dO (B, H, T, D) contiguous of element type `elem` (bfloat16 /
// float16 compute in float32); lse and delta (B, H, T) in the compute type; the pattern's block view as
// ops/sparse_attention.h describes it (SparsePattern::rblk_* and kblk_*). C++17-clean; each launcher returns the
// launch's cudaError_t.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::sparse_launch {

// The block sizes of the pattern's block view (SparsePattern::kRowBlock / kKeyBlock; checked where both are seen).
constexpr int64_t kRowBlock = 16, kKeyBlock = 16;

struct Pattern {
  int64_t groups;                                   // 1 or B·H
  const int64_t *rblk_ptr, *rblk_keys, *rblk_bits;  // query blocks: their union of keys, a bit per row of the block
  const int64_t *kblk_ptr, *kblk_rows, *kblk_bits;  // key blocks: their union of queries, a bit per key of the block
};

struct Dims {
  int64_t B, H, T, S, D;
};

// The largest head dim: a block's tiles (its rows, 32 keys and values) stay under 48 KiB of static shared memory.
constexpr int64_t max_head_dim(FloatElem e) { return e == FloatElem::F64 ? 64 : 128; }

// o = softmax over each row's keys of q kᵀ · scale, times v; lse the rows' log-sum-exp (-inf and o = 0 for a row
// without a kept key). A block per query block, key tiles of the block's union in shared memory, online softmax.
cudaError_t forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                    void* o, void* lse, FloatElem elem, cudaStream_t stream);
// dq (a block per half query block), then dk, dv (a block per half key block, query tiles of its union): P recomputed
// from lse, no atomics. delta: (B, H, T) workspace in the compute type for the rows' dO · o.
cudaError_t backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                     const void* o, const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                     FloatElem elem, cudaStream_t stream);

// The same on tensor cores (cuda/sparse_mma.cu), for bfloat16 / float16 and, when allow_tf32, float32 as TF32, head
// dims up to 64: a warp per block of the view; lse and delta in float32. mma_takes says whether they take a problem.
bool mma_takes(Dims d, FloatElem elem, bool allow_tf32);
cudaError_t mma_forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                        void* o, void* lse, FloatElem elem, cudaStream_t stream);
cudaError_t mma_backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                         const void* o, const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                         FloatElem elem, cudaStream_t stream);

}  // namespace asc::cuda::sparse_launch
