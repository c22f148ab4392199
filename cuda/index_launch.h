#pragma once
// Launchers of the CUDA indexing kernels (cuda/index.cu), called by cuda/index.cpp with plain data: device
// pointers (already offset to the first element), sizes, element strides and the stream. C++17-clean (no fmt, no
// core/tensor.h) so that nvcc can compile the .cu side. Every launcher returns the launch's cudaError_t
// (cudaGetLastError()); the caller turns it into an asc::Error.
#include <cuda_runtime.h>

#include <cstdint>

namespace asc::cuda {

// Element kinds the indexing kernels tell apart (mirrors asc::DType; converted in cuda/index.cpp).
enum class IdxDtype : uint8_t { F32, F64, I64, Bool, BF16, F16 };

// A strided walk over a shape: up to 8 dimensions (asc::kMaxDims) and up to 3 operands' element strides.
struct IdxLayout {
  static constexpr int kMaxDims = 8;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};
};

// lo/hi = min/max of the int64 values at p (layout operand 0), numel >= 1. `scratch` is 2 int64 of device
// memory; the result is copied to the host and the stream synchronised before returning.
cudaError_t launch_index_minmax(const int64_t* p, const IdxLayout& layout, int64_t numel, int64_t* scratch, int64_t* lo,
                                int64_t* hi, cudaStream_t stream);

// out (outer, k, inner) = x (outer, n, inner)[:, index[j], :]; x and out contiguous, elements of elem_size
// bytes; index[j] = index_ptr[j * index_stride].
cudaError_t launch_index_select(const void* x, void* out, size_t elem_size, int64_t outer, int64_t n, int64_t inner,
                                const int64_t* index, int64_t index_stride, int64_t k, cudaStream_t stream);

// out (outer, n, inner) [:, index[j], :] += src (outer, k, inner) [:, j, :], skipping index == skip; both
// contiguous; dtype F32 / F64 / BF16 / F16. deterministic: never atomicAdd (a fixed order of additions).
cudaError_t launch_index_add(void* out, const void* src, IdxDtype dtype, int64_t outer, int64_t n, int64_t inner,
                             const int64_t* index, int64_t index_stride, int64_t k, int64_t skip, bool deterministic,
                             cudaStream_t stream);

// For every position of the index's shape (layout operands: 0 = out (contiguous), 1 = index, 2 = x with its
// stride along dim set to 0): out = x[.., index, ..] with x_step = x's stride along dim.
cudaError_t launch_gather(const void* x, const int64_t* index, void* out, size_t elem_size, const IdxLayout& layout,
                          int64_t numel, int64_t x_step, cudaStream_t stream);

// For every position of the index's shape (layout operands: 0 = out with its stride along dim set to 0,
// 1 = index, 2 = src): out[.., index, ..] += src (atomicAdd); dtype F32 / F64 / I64 / BF16 / F16.
cudaError_t launch_scatter_add(void* out, const int64_t* index, const void* src, IdxDtype dtype,
                               const IdxLayout& layout, int64_t numel, int64_t out_step, cudaStream_t stream);

// The same sum in a fixed order (deterministic mode): the layout is over the index's shape with dim's size set to
// 1 (`fibres` positions); each fibre adds its `len` sources (strides index_step / src_step along dim) in order.
// Floating dtypes.
cudaError_t launch_scatter_add_fibres(void* out, const int64_t* index, const void* src, IdxDtype dtype,
                                      const IdxLayout& layout, int64_t fibres, int64_t len, int64_t index_step,
                                      int64_t src_step, int64_t out_step, cudaStream_t stream);

// out[.., index, ..] = src, one thread per fibre of the index along dim writing its `len` sources in order (the last
// write of a repeated index wins; no other thread touches the fibre's outputs). Layout as launch_scatter_add_fibres;
// any element of elem_size bytes.
cudaError_t launch_scatter_fibres(void* out, const int64_t* index, const void* src, size_t elem_size,
                                  const IdxLayout& layout, int64_t fibres, int64_t len, int64_t index_step,
                                  int64_t src_step, int64_t out_step, cudaStream_t stream);

// out (numel, C) contiguous and already zero; out[i, index[i]] = 1 (layout operand 0 = index strides).
cudaError_t launch_one_hot(const int64_t* index, const IdxLayout& layout, int64_t numel, void* out, IdxDtype dtype,
                           int64_t C, cudaStream_t stream);

}  // namespace asc::cuda
