#pragma once
// The one way kernels of cuda/ are started:
//
//   ASC_CUDA_TRY(launch_kernel(softmax_fwd_kernel<float>, grid, block, stream, x, mask, log, y, rows, n));
//
// It goes through cudaLaunchKernel (the runtime call behind <<<...>>>), so the same source runs on a GPU and in the
// CPU emulator of tests/cuda_emu, which implements that call. The arguments are converted to the kernel's parameter
// types first, as <<<...>>> would. C++17 and CUDA headers only (included from .cu files).
#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

namespace asc::cuda {

// Blocks for a grid-stride loop over n items, `threads` per block: at least 1, capped at 65535 * 16 (the kernels
// loop, so the cap only bounds the grid).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65535LL * 16 ? 65535LL * 16 : b);
}

// n as a grid dimension for launches with one block per item (no grid-stride loop), or 0 when n exceeds the
// dimension's hardware limit (x: 2^31 - 1; y, z: 65535). A 0 dimension makes the launch fail with
// cudaErrorInvalidConfiguration, which the op reports as asc::Error, instead of n being cut to 32 bits and items
// being silently left undone.
inline constexpr int64_t kMaxGridX = 0x7fffffff, kMaxGridYZ = 65535;
inline unsigned grid_dim(int64_t n, int64_t limit = kMaxGridX) {
  return n >= 0 && n <= limit ? static_cast<unsigned>(n) : 0u;
}

template <class... P, class... A>
cudaError_t launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch_kernel: the argument count differs from the kernel's");
  std::tuple<std::decay_t<P>...> params(static_cast<std::decay_t<P>>(std::forward<A>(args))...);
  return std::apply(
      [&](auto&... p) {
        void* ptrs[] = {static_cast<void*>(&p)..., nullptr};
        return cudaLaunchKernel(kernel, grid, block, ptrs, 0, stream);
      },
      params);
}

}  // namespace asc::cuda
