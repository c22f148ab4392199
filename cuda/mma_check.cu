// Tensor-core check kernels (cuda/mma_check_launch.h): the plainest uses of cuda/mma.cuh, one warp per output tile
// with fragments loaded straight from global memory, so that a test can compare them with float64 products — on the
// CPU emulator in CI, and on a GPU (tools/gpu_check.sh), where they confirm that the emulator's fragment layouts are
// the hardware's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/launch_kernel.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_check_launch.h"

namespace asc::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block, one output tile each

// c (M, N) = a (M, K) B; warp w of block b owns the (16 × 8) tile number b·kWarps + w, row-major over the tiles.
template <class T, bool kBnk>
__global__ void __launch_bounds__(32 * kWarps)
    mma_product_kernel(const T* a, const T* b, float* c, int64_t M, int64_t N, int64_t K) {
  constexpr mma::Kind kind = mma::kind_of<T>();
  const int64_t tile = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, tiles_n = N / 8;
  if (tile >= (M / 16) * tiles_n) return;  // a whole warp leaves together
  const int64_t m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 8;
  mma::FragC acc{};
  for (int64_t k0 = 0; k0 < K; k0 += mma::kK<kind>) {
    mma::FragA fa;
    mma::FragB fb;
    mma::load_a<kind>(fa, a + m0 * K + k0, K);
    if constexpr (kBnk)
      mma::load_b_nk<kind>(fb, b + n0 * K + k0, K);
    else
      mma::load_b_kn<kind>(fb, b + k0 * N + n0, N);
    mma::mma<kind>(acc, fa, fb);
  }
  const int g = mma::lane_g(), t = mma::lane_t();
  for (int i = 0; i < 4; ++i) c[(m0 + g + (i >= 2 ? 8 : 0)) * N + n0 + 2 * t + (i & 1)] = acc.x[i];
}

// d (M, P) = (a bᵀ) w; warp w of block b owns rows 16·(b·kWarps + w) .. +15 and all P columns (P ≤ 64).
constexpr int kMaxP = 64;
template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    mma_chain_kernel(const T* a, const T* b, const T* w, float* d, int64_t M, int64_t N, int64_t K, int64_t P) {
  constexpr mma::Kind kind = mma::kind_of<T>();
  const int64_t m0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * 16;
  if (m0 >= M) return;
  mma::FragC out[kMaxP / 8] = {};
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    mma::FragC s[2] = {};  // (a bᵀ) rows m0.., columns n0 .. n0 + 15, as two (16 × 8) accumulator tiles
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      mma::FragA fa;
      mma::load_a<kind>(fa, a + m0 * K + k0, K);
      for (int h = 0; h < 2; ++h) {
        mma::FragB fb;
        mma::load_b_nk<kind>(fb, b + (n0 + 8 * h) * K + k0, K);
        mma::mma<kind>(s[h], fa, fb);
      }
    }
    const mma::FragA sa = mma::a_from_c<kind>(s[0], s[1]);
#pragma unroll
    for (int j = 0; j < kMaxP / 8; ++j) {  // unrolled with constant indices: the accumulators stay in registers
      if (8 * j >= P) break;
      mma::FragB fw;
      mma::load_b_kn<kind>(fw, w + n0 * P + 8 * j, P);
      mma::mma<kind>(out[j], sa, fw);
    }
  }
  const int g = mma::lane_g(), t = mma::lane_t();
#pragma unroll
  for (int j = 0; j < kMaxP / 8; ++j) {
    if (8 * j >= P) break;
    for (int i = 0; i < 4; ++i) d[(m0 + g + (i >= 2 ? 8 : 0)) * P + 8 * j + 2 * t + (i & 1)] = out[j].x[i];
  }
}

cudaError_t checked(cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); }

}  // namespace

namespace mma_check_launch {

cudaError_t product(FloatElem elem, bool b_nk, int64_t M, int64_t N, int64_t K, const void* a, const void* b, float* c,
                    cudaStream_t stream) {
  if (M % 16 || N % 8 || K % 16 || M <= 0 || N <= 0 || K <= 0) return cudaErrorInvalidValue;
  const unsigned blocks = grid_dim((M / 16 * (N / 8) + kWarps - 1) / kWarps);
  auto go = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    const T *pa = static_cast<const T*>(a), *pb = static_cast<const T*>(b);
    return checked(
        b_nk
            ? launch_kernel(mma_product_kernel<T, true>, dim3(blocks), dim3(32 * kWarps), stream, pa, pb, c, M, N, K)
            : launch_kernel(mma_product_kernel<T, false>, dim3(blocks), dim3(32 * kWarps), stream, pa, pb, c, M, N, K));
  };
  return visit_mma_elem(elem, go);
}

cudaError_t chain(FloatElem elem, int64_t M, int64_t N, int64_t K, int64_t P, const void* a, const void* b,
                  const void* w, float* d, cudaStream_t stream) {
  if (M % 16 || N % 16 || K % 16 || P % 8 || M <= 0 || N <= 0 || K <= 0 || P <= 0 || P > kMaxP)
    return cudaErrorInvalidValue;
  const unsigned blocks = grid_dim((M / 16 + kWarps - 1) / kWarps);
  auto go = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    return checked(launch_kernel(mma_chain_kernel<T>, dim3(blocks), dim3(32 * kWarps), stream, static_cast<const T*>(a),
                                 static_cast<const T*>(b), static_cast<const T*>(w), d, M, N, K, P));
  };
  switch (elem) {
    case FloatElem::BF16: return go(__nv_bfloat16{});
    case FloatElem::F16: return go(__half{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace mma_check_launch
}  // namespace asc::cuda
