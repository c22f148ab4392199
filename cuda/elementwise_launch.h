#pragma once
// Launchers of the CUDA elementwise / copy / fill / random / sum kernels (cuda/elementwise.cu), called by
// cuda/elementwise.cpp. C++17-clean and free of core/ headers (nvcc compiles the .cu side as C++17): arguments
// are plain data — raw pointers, a coalesced strided layout by value, enums, the stream. Every launcher returns
// the cudaError_t of its launch (cudaGetLastError()); the caller turns it into asc::Error.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/math.h"

namespace asc::cuda::launch {

// Mirrors asc::DType value for value (static_assert'ed in cuda/elementwise.cpp).
enum class ScalarType : uint8_t { Float32, Float64, Int64, Bool, BFloat16, Float16 };

inline constexpr int kMaxDims = 8;  // == asc::kMaxDims

// N operands walked over one shape; strides in elements (0 on broadcast dims); offsets from each operand's base
// pointer. Dims are coalesced on the host; ndim >= 1; strides[k][ndim - 1] is the innermost.
template <int N>
struct Layout {
  int ndim = 1;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
};

cudaError_t unary(math::Unary op, const math::UnaryParams& p, ScalarType t, const void* x, void* out,
                  const Layout<2>& L, cudaStream_t stream);
// Operand order of L: gx, g, x, y.
cudaError_t unary_backward(math::Unary op, const math::UnaryParams& p, ScalarType t, const void* g, const void* x,
                           const void* y, void* gx, const Layout<4>& L, cudaStream_t stream);
// a and b have dtype t; out is bool for comparisons / And / Or, else t. Operand order of L: out, a, b.
cudaError_t binary(math::Binary op, ScalarType t, const void* a, const void* b, void* out, const Layout<3>& L,
                   cudaStream_t stream);
// Operand order: out, cond (bool), a, b.
cudaError_t where(ScalarType t, const bool* cond, const void* a, const void* b, void* out, const Layout<4>& L,
                  cudaStream_t stream);
// Operand order: dst, src.
cudaError_t copy(ScalarType src_t, ScalarType dst_t, const void* src, void* dst, const Layout<2>& L,
                 cudaStream_t stream);
cudaError_t fill(ScalarType t, void* dst, double value, const Layout<1>& L, cudaStream_t stream);
// Operand order: out (bool), x.
cudaError_t isnan(ScalarType t, const void* x, bool* out, const Layout<2>& L, cudaStream_t stream);

// Sum of x over the reduced dims into contiguous out (m elements). `kept`: the kept dims of x in out's order
// (one operand: x's strides); `red`: the reduced dims (x's strides). Accumulates in double (int64 for Int64).
// When `partials` is non-null (m * groups accumulators of the accumulation type, from sum_groups()), the reduction
// of each output is split across `groups` blocks and combined in a second, fixed-order pass (deterministic).
struct SumPlan {
  int64_t m = 1, r = 1;  // outputs, reduced elements per output
  int64_t groups = 1;
};
SumPlan sum_plan(int64_t m, int64_t r);
cudaError_t sum(ScalarType t, const void* x, void* out, const Layout<1>& kept, const Layout<1>& red,
                const SumPlan& plan, void* partials, cudaStream_t stream);

// Random fills of a contiguous out of n elements from the Philox stream, exactly as the CPU kernels map elements
// to counters (core/generator.h, ops/cpu/elementwise.cpp).
cudaError_t uniform(ScalarType t, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi,
                    cudaStream_t stream);
// y = x * mask, mask = (u >= p ? scale : 0), u the uniforms of rand(): one pass, x / y / mask contiguous
cudaError_t dropout(ScalarType t, const void* x, void* y, void* mask, int64_t n, uint64_t seed, uint64_t offset,
                    double p, double scale, cudaStream_t stream);
// y = act(x + bias) · (keep ? scale : 0), keep = (u >= p) with dropout's uniforms; keep null: no dropout, bias null:
// none; slope non-null: slope = act'(x + bias) too, in the compute type (float for the 16-bit types, else T). x / y /
// keep / slope contiguous (total elements, rows of n); act Relu, Gelu, GeluTanh or Silu.
cudaError_t bias_act_dropout(math::Unary act, ScalarType t, const void* x, const void* bias, void* y, bool* keep,
                             void* slope, int64_t total, int64_t n, uint64_t seed, uint64_t offset, double p,
                             double scale, cudaStream_t stream);
// gx = (g · (keep ? scale : 0)) · slope (slope in the compute type); keep null as above; all contiguous.
cudaError_t bias_act_dropout_backward(ScalarType t, const void* g, const void* slope, const bool* keep, void* gx,
                                      int64_t total, double scale, cudaStream_t stream);
cudaError_t normal(ScalarType t, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev,
                   cudaStream_t stream);
cudaError_t randint(int64_t* out, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high,
                    cudaStream_t stream);

}  // namespace asc::cuda::launch
