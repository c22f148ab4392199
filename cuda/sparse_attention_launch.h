#pragma once
// Launchers of sparse attention's CUDA kernels (cuda/sparse_attention.cu), called by cuda/sparse_attention.cpp with
// plain data. q (B, H, T, D), k, v (B, H, S, D), o, dO (B, H, T, D) contiguous of element type `elem` (bfloat16 /
// float16 compute in float32); lse (B, H, T) in the compute type; the pattern's CSR arrays as in ops/sparse_attention.h.
// C++17-clean; each launcher returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::sparse_launch {

constexpr int64_t kMaxHeadDim = 256;  // D <= 32 lanes x 8 registers per lane

struct Pattern {
  int64_t groups;           // 1 or B·H
  const int64_t* row_ptr;   // (groups·T + 1)
  const int64_t* cols;      // (nnz)
  const int64_t* col_ptr;   // (groups·S + 1)
  const int64_t* col_rows;  // (nnz)
  const int64_t* col_pos;   // (nnz)
  int64_t nnz;
};

struct Dims {
  int64_t B, H, T, S, D;
};

// A warp per query row, rows grid-strided; an online softmax over the row's keys (scores never stored).
cudaError_t forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                    void* o, void* lse, FloatElem elem, cudaStream_t stream);
// The pair buffers P and dS of the backward: elements of the compute type (float32 / float64).
constexpr int64_t pair_workspace(const Pattern& p, const Dims& d) {
  return 2 * (p.groups == 1 ? d.B * d.H * p.nnz : p.nnz);
}
// A warp per query row (P, dS per pair, dq), then a warp per key (dk, dv over the transpose): no atomics.
cudaError_t backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                     const void* o, const void* dout, const void* lse, void* dq, void* dk, void* dv, void* work,
                     FloatElem elem, cudaStream_t stream);

}  // namespace asc::cuda::sparse_launch
