// CUDA kernels of the indexing ops (see cuda/index_launch.h): min/max scan of an index tensor, index_select (row
// copies in the widest aligned word), index_add (deterministic column loop, or atomics when the output has too
// few columns to keep the GPU busy), gather / scatter_add (strided walks over the index's shape; scatter_add with
// atomicAdd) and one_hot. Copies move raw bytes, so every dtype works without a per-dtype instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/index_launch.h"
#include "cuda/launch_kernel.cuh"

namespace asc::cuda {
namespace {

constexpr int kThreads = 256;

// Element offsets of linear position i of the layout's shape, for the first N operands.
template <int N>
__device__ __forceinline__ void offsets_of(const IdxLayout& L, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t s = L.sizes[d];
    const int64_t c = i % s;
    i /= s;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += c * L.strides[k][d];
  }
}

// ---- index_minmax -----------------------------------------------------------------------------------------------

__global__ void minmax_init(const int64_t* p, int64_t* out) {
  out[0] = p[0];
  out[1] = p[0];
}

__global__ void minmax_kernel(const int64_t* p, IdxLayout L, int64_t numel, int64_t* out) {
  const int64_t first = p[0];
  long long mn = first, mx = first;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1];
    offsets_of<1>(L, i, off);
    const long long v = p[off[0]];
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const long long a = __shfl_xor_sync(0xffffffffu, mn, o), b = __shfl_xor_sync(0xffffffffu, mx, o);
    mn = a < mn ? a : mn;
    mx = b > mx ? b : mx;
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMin(reinterpret_cast<long long*>(out), mn);
    atomicMax(reinterpret_cast<long long*>(out) + 1, mx);
  }
}

// ---- index_select -----------------------------------------------------------------------------------------------

// One 16-byte word.
struct alignas(16) W16 {
  uint64_t a, b;
};

template <class U>
__global__ void index_select_kernel(const U* __restrict__ x, U* __restrict__ out, int64_t n, int64_t inner,
                                    const int64_t* __restrict__ index, int64_t istride, int64_t k, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % inner, r = i / inner;  // r = o * k + j
    const int64_t o = r / k, j = r % k;
    out[i] = x[(o * n + index[j * istride]) * inner + c];
  }
}

template <class U>
void select_as(const void* x, void* out, int64_t n, int64_t inner, const int64_t* index, int64_t istride, int64_t k,
               int64_t total, cudaStream_t s) {
  launch_kernel(index_select_kernel<U>, grid_for(total, kThreads), kThreads, s, static_cast<const U*>(x),
                static_cast<U*>(out), n, inner, index, istride, k, total);
}

// ---- index_add --------------------------------------------------------------------------------------------------

template <class T>
struct Acc {  // arithmetic type of an accumulation step
  using type = T;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};
template <>
struct Acc<__half> {
  using type = float;
};

template <class T>
__device__ __forceinline__ typename Acc<T>::type to_acc(T v) {
  return static_cast<typename Acc<T>::type>(v);
}
template <class T>
__device__ __forceinline__ T from_acc(typename Acc<T>::type v) {
  return static_cast<T>(v);
}

// One thread per (outer block o, column c), looping over j in order: the same summation order as the CPU kernel,
// deterministic.
template <class T>
__global__ void index_add_columns(T* __restrict__ out, const T* __restrict__ src, int64_t n, int64_t inner,
                                  const int64_t* __restrict__ index, int64_t istride, int64_t k, int64_t skip,
                                  int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % inner, o = i / inner;
    T* ob = out + o * n * inner + c;
    const T* sb = src + o * k * inner + c;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = index[j * istride];
      if (t == skip) continue;
      ob[t * inner] = from_acc<T>(to_acc(ob[t * inner]) + to_acc(sb[j * inner]));
    }
  }
}

// One thread per source element, atomicAdd into the output (order of additions unspecified).
template <class T>
__global__ void index_add_atomic(T* __restrict__ out, const T* __restrict__ src, int64_t n, int64_t inner,
                                 const int64_t* __restrict__ index, int64_t istride, int64_t k, int64_t skip,
                                 int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % inner, r = i / inner;
    const int64_t o = r / k, j = r % k;
    const int64_t t = index[j * istride];
    if (t == skip) continue;
    atomicAdd(out + (o * n + t) * inner + c, src[i]);
  }
}

template <class T>
void index_add_as(void* out, const void* src, int64_t outer, int64_t n, int64_t inner, const int64_t* index,
                  int64_t istride, int64_t k, int64_t skip, bool deterministic, cudaStream_t s) {
  // The deterministic column loop runs outer * inner threads of k steps each: used when that is enough threads
  // to fill the GPU or k is short, and always in deterministic mode; otherwise (an embedding table's few columns
  // and many indices) atomics.
  const int64_t cols = outer * inner;
  if (deterministic || cols >= 32768 || k <= 32) {
    launch_kernel(index_add_columns<T>, grid_for(cols, kThreads), kThreads, s, static_cast<T*>(out),
                  static_cast<const T*>(src), n, inner, index, istride, k, skip, cols);
  } else {
    const int64_t total = cols * k;
    launch_kernel(index_add_atomic<T>, grid_for(total, kThreads), kThreads, s, static_cast<T*>(out),
                  static_cast<const T*>(src), n, inner, index, istride, k, skip, total);
  }
}

// ---- gather / scatter_add / one_hot -----------------------------------------------------------------------------

template <class U>
__global__ void gather_kernel(const U* __restrict__ x, const int64_t* __restrict__ index, U* __restrict__ out,
                              IdxLayout L, int64_t numel, int64_t x_step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    offsets_of<3>(L, i, off);
    out[off[0]] = x[off[2] + index[off[1]] * x_step];
  }
}

template <class U>
void gather_as(const void* x, const int64_t* index, void* out, const IdxLayout& L, int64_t numel, int64_t x_step,
               cudaStream_t s) {
  launch_kernel(gather_kernel<U>, grid_for(numel, kThreads), kThreads, s, static_cast<const U*>(x), index,
                static_cast<U*>(out), L, numel, x_step);
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16* p, __nv_bfloat16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__half* p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int64_t* p, int64_t v) {  // two's complement: unsigned add is the same
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

// One thread per fibre of the index along dim (every position but dim's), putting its `len` sources in index order
// into the output fibre no other thread touches: the deterministic scatter_add (AddInOrder) and scatter (Write: the
// last write of a repeated index wins). Layout operands as for scatter_add_kernel, over the index's shape with dim's
// size set to 1.
template <class T, class Put>
__global__ void scatter_fibres_kernel(T* __restrict__ out, const int64_t* __restrict__ index, const T* __restrict__ src,
                                      IdxLayout L, int64_t fibres, int64_t len, int64_t index_step, int64_t src_step,
                                      int64_t out_step, Put put) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < fibres;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    offsets_of<3>(L, i, off);
    for (int64_t j = 0; j < len; ++j)
      put(out[off[0] + index[off[1] + j * index_step] * out_step], src[off[2] + j * src_step]);
  }
}
struct AddInOrder {
  template <class T>
  __device__ void operator()(T& o, T v) const {
    o = from_acc<T>(to_acc(o) + to_acc(v));
  }
};
struct Write {  // raw words: every dtype of the word's size
  template <class U>
  __device__ void operator()(U& o, U v) const {
    o = v;
  }
};

template <class T, class Put>
void scatter_fibres_as(void* out, const int64_t* index, const void* src, const IdxLayout& L, int64_t fibres,
                       int64_t len, int64_t index_step, int64_t src_step, int64_t out_step, cudaStream_t s) {
  launch_kernel(scatter_fibres_kernel<T, Put>, grid_for(fibres, kThreads), kThreads, s, static_cast<T*>(out), index,
                static_cast<const T*>(src), L, fibres, len, index_step, src_step, out_step, Put{});
}

template <class T>
__global__ void scatter_add_kernel(T* __restrict__ out, const int64_t* __restrict__ index, const T* __restrict__ src,
                                   IdxLayout L, int64_t numel, int64_t out_step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    offsets_of<3>(L, i, off);
    atomic_add(out + off[0] + index[off[1]] * out_step, src[off[2]]);
  }
}

template <class T>
void scatter_add_as(void* out, const int64_t* index, const void* src, const IdxLayout& L, int64_t numel,
                    int64_t out_step, cudaStream_t s) {
  launch_kernel(scatter_add_kernel<T>, grid_for(numel, kThreads), kThreads, s, static_cast<T*>(out), index,
                static_cast<const T*>(src), L, numel, out_step);
}

template <class U>
__global__ void one_hot_kernel(const int64_t* __restrict__ index, IdxLayout L, int64_t numel, U* __restrict__ out,
                               int64_t C, U one) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1];
    offsets_of<1>(L, i, off);
    out[i * C + index[off[0]]] = one;
  }
}

template <class U>
void one_hot_as(const int64_t* index, const IdxLayout& L, int64_t numel, void* out, int64_t C, uint64_t one_bits,
                cudaStream_t s) {
  launch_kernel(one_hot_kernel<U>, grid_for(numel, kThreads), kThreads, s, index, L, numel, static_cast<U*>(out), C,
                static_cast<U>(one_bits));
}

}  // namespace

cudaError_t launch_index_minmax(const int64_t* p, const IdxLayout& layout, int64_t numel, int64_t* scratch, int64_t* lo,
                                int64_t* hi, cudaStream_t stream) {
  if (numel <= 0) return cudaErrorInvalidValue;
  launch_kernel(minmax_init, 1, 1, stream, p, scratch);
  launch_kernel(minmax_kernel, std::min(grid_for(numel, kThreads), 1024u), kThreads, stream, p, layout, numel, scratch);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  int64_t host[2] = {0, 0};
  e = cudaMemcpyAsync(host, scratch, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return e;
  *lo = host[0];
  *hi = host[1];
  return cudaSuccess;
}

cudaError_t launch_index_select(const void* x, void* out, size_t elem_size, int64_t outer, int64_t n, int64_t inner,
                                const int64_t* index, int64_t index_stride, int64_t k, cudaStream_t stream) {
  const int64_t total_bytes_per_row = inner * static_cast<int64_t>(elem_size);
  if (outer == 0 || k == 0 || inner == 0) return cudaSuccess;
  // Copy rows in the widest word that divides the row size and both base addresses.
  const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out);
  size_t w = 16;
  while (w > 1 && ((total_bytes_per_row % static_cast<int64_t>(w)) != 0 || (align % w) != 0)) w /= 2;
  const int64_t words = total_bytes_per_row / static_cast<int64_t>(w);
  const int64_t total = outer * k * words;
  switch (w) {
    case 16: select_as<W16>(x, out, n, words, index, index_stride, k, total, stream); break;
    case 8: select_as<uint64_t>(x, out, n, words, index, index_stride, k, total, stream); break;
    case 4: select_as<uint32_t>(x, out, n, words, index, index_stride, k, total, stream); break;
    case 2: select_as<uint16_t>(x, out, n, words, index, index_stride, k, total, stream); break;
    default: select_as<uint8_t>(x, out, n, words, index, index_stride, k, total, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_index_add(void* out, const void* src, IdxDtype dtype, int64_t outer, int64_t n, int64_t inner,
                             const int64_t* index, int64_t index_stride, int64_t k, int64_t skip, bool deterministic,
                             cudaStream_t stream) {
  if (outer == 0 || k == 0 || inner == 0) return cudaSuccess;
  switch (dtype) {
    case IdxDtype::F32:
      index_add_as<float>(out, src, outer, n, inner, index, index_stride, k, skip, deterministic, stream);
      break;
    case IdxDtype::F64:
      index_add_as<double>(out, src, outer, n, inner, index, index_stride, k, skip, deterministic, stream);
      break;
    case IdxDtype::BF16:
      index_add_as<__nv_bfloat16>(out, src, outer, n, inner, index, index_stride, k, skip, deterministic, stream);
      break;
    case IdxDtype::F16:
      index_add_as<__half>(out, src, outer, n, inner, index, index_stride, k, skip, deterministic, stream);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_gather(const void* x, const int64_t* index, void* out, size_t elem_size, const IdxLayout& layout,
                          int64_t numel, int64_t x_step, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  switch (elem_size) {
    case 8: gather_as<uint64_t>(x, index, out, layout, numel, x_step, stream); break;
    case 4: gather_as<uint32_t>(x, index, out, layout, numel, x_step, stream); break;
    case 2: gather_as<uint16_t>(x, index, out, layout, numel, x_step, stream); break;
    case 1: gather_as<uint8_t>(x, index, out, layout, numel, x_step, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_scatter_fibres(void* out, const int64_t* index, const void* src, size_t elem_size,
                                  const IdxLayout& layout, int64_t fibres, int64_t len, int64_t index_step,
                                  int64_t src_step, int64_t out_step, cudaStream_t stream) {
  if (fibres == 0 || len == 0) return cudaSuccess;
  switch (elem_size) {
    case 8:
      scatter_fibres_as<uint64_t, Write>(out, index, src, layout, fibres, len, index_step, src_step, out_step, stream);
      break;
    case 4:
      scatter_fibres_as<uint32_t, Write>(out, index, src, layout, fibres, len, index_step, src_step, out_step, stream);
      break;
    case 2:
      scatter_fibres_as<uint16_t, Write>(out, index, src, layout, fibres, len, index_step, src_step, out_step, stream);
      break;
    case 1:
      scatter_fibres_as<uint8_t, Write>(out, index, src, layout, fibres, len, index_step, src_step, out_step, stream);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_scatter_add(void* out, const int64_t* index, const void* src, IdxDtype dtype,
                               const IdxLayout& layout, int64_t numel, int64_t out_step, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  switch (dtype) {
    case IdxDtype::F32: scatter_add_as<float>(out, index, src, layout, numel, out_step, stream); break;
    case IdxDtype::F64: scatter_add_as<double>(out, index, src, layout, numel, out_step, stream); break;
    case IdxDtype::I64: scatter_add_as<int64_t>(out, index, src, layout, numel, out_step, stream); break;
    case IdxDtype::BF16: scatter_add_as<__nv_bfloat16>(out, index, src, layout, numel, out_step, stream); break;
    case IdxDtype::F16: scatter_add_as<__half>(out, index, src, layout, numel, out_step, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_scatter_add_fibres(void* out, const int64_t* index, const void* src, IdxDtype dtype,
                                      const IdxLayout& layout, int64_t fibres, int64_t len, int64_t index_step,
                                      int64_t src_step, int64_t out_step, cudaStream_t stream) {
  if (fibres == 0 || len == 0) return cudaSuccess;
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    scatter_fibres_as<T, AddInOrder>(out, index, src, layout, fibres, len, index_step, src_step, out_step, stream);
  };
  switch (dtype) {
    case IdxDtype::F32: run(static_cast<float*>(nullptr)); break;
    case IdxDtype::F64: run(static_cast<double*>(nullptr)); break;
    case IdxDtype::BF16: run(static_cast<__nv_bfloat16*>(nullptr)); break;
    case IdxDtype::F16: run(static_cast<__half*>(nullptr)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_one_hot(const int64_t* index, const IdxLayout& layout, int64_t numel, void* out, IdxDtype dtype,
                           int64_t C, cudaStream_t stream) {
  if (numel == 0 || C == 0) return cudaSuccess;
  // The bit pattern of 1 in each dtype.
  switch (dtype) {
    case IdxDtype::F32: one_hot_as<uint32_t>(index, layout, numel, out, C, 0x3F800000u, stream); break;
    case IdxDtype::F64: one_hot_as<uint64_t>(index, layout, numel, out, C, 0x3FF0000000000000ull, stream); break;
    case IdxDtype::I64: one_hot_as<uint64_t>(index, layout, numel, out, C, 1, stream); break;
    case IdxDtype::Bool: one_hot_as<uint8_t>(index, layout, numel, out, C, 1, stream); break;
    case IdxDtype::BF16: one_hot_as<uint16_t>(index, layout, numel, out, C, 0x3F80u, stream); break;
    case IdxDtype::F16: one_hot_as<uint16_t>(index, layout, numel, out, C, 0x3C00u, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace asc::cuda
