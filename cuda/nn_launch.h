#pragma once
// Launchers of the CUDA nn functional kernels (cuda/nn.cu), called by cuda/nn.cpp after it has validated the
// tensors. C++17-clean and plain data only (this header is included by a .cu file): raw device pointers of
// contiguous row-major buffers, sizes, the element type and the stream. Layouts and semantics are those of the CPU
// kernels in ops/kernel_list.inc. Each launcher returns cudaGetLastError() after its launches (cudaSuccess when
// there was nothing to do). bfloat16 / float16 data are computed in float32; float32 in float32; float64 in float64.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::nn_launch {

using Elem = FloatElem;

// x, y: (rows, n); mask: (rows, n) bytes (bool, nonzero = keep) or nullptr.
cudaError_t softmax_forward(Elem t, const void* x, const uint8_t* mask, bool log, void* y, int64_t rows, int64_t n,
                            cudaStream_t stream);
// g, y, gx: (rows, n); mask as above.
cudaError_t softmax_backward(Elem t, const void* g, const void* y, const uint8_t* mask, bool log, void* gx,
                             int64_t rows, int64_t n, cudaStream_t stream);

// x, y: (rows, n); weight, bias: (n) or nullptr (bias ignored when rms): of the element type t. mean: (rows) or
// nullptr (rms); rstd: (rows): of the accumulation type (float for bfloat16 / float16, else t).
cudaError_t layer_norm_forward(Elem t, const void* x, const void* weight, const void* bias, double eps, bool rms,
                               void* y, void* mean, void* rstd, int64_t rows, int64_t n, cudaStream_t stream);

// Bytes of device scratch memory layer_norm_backward needs (0 when none): per-chunk partial column sums for gw / gb.
size_t layer_norm_backward_workspace(Elem t, bool rms, bool want_gw, bool want_gb, int64_t rows, int64_t n);
// g, x: (rows, n); weight: (n) or nullptr (ones); mean: (rows) or nullptr (rms), rstd: (rows), both of the accumulation
// type as layer_norm_forward wrote them; gx: (rows, n),
// gw, gb: (n), each nullptr when not wanted. workspace: at least layer_norm_backward_workspace(...) bytes,
// 256-byte aligned (may be nullptr when that is 0).
cudaError_t layer_norm_backward(Elem t, const void* g, const void* x, const void* weight, const void* mean,
                                const void* rstd, bool rms, void* gx, void* gw, void* gb, void* workspace, int64_t rows,
                                int64_t n, cudaStream_t stream);

// logits: (rows, C); target: (rows) int64 in [0, C) or == ignore_index; loss: (rows); stats: (rows, 2).
cudaError_t cross_entropy_forward(Elem t, const void* logits, const int64_t* target, int64_t ignore_index,
                                  double smoothing, void* loss, void* stats, int64_t rows, int64_t C,
                                  cudaStream_t stream);
// gloss: element r at gloss + r * gloss_stride (stride in elements, 0 for a broadcast scalar); gx: (rows, C).
cudaError_t cross_entropy_backward(Elem t, const void* gloss, int64_t gloss_stride, double scale, const void* logits,
                                   const int64_t* target, const void* stats, int64_t ignore_index, double smoothing,
                                   void* gx, int64_t rows, int64_t C, cudaStream_t stream);

}  // namespace asc::cuda::nn_launch
