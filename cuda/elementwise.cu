// CUDA elementwise, copy, fill, isnan, sum and random kernels. The per-element math is ops/math.h's (the same
// functors as the CPU kernels) and the random streams are core/generator.h's Philox, element for element as on
// the CPU. Strided operands: a grid-stride loop over the linear index of a host-coalesced layout (<= 8 dims), each
// operand's offset computed by divmod per dim; a contiguous fast path when every operand is one dense run.
// bfloat16 / float16 compute in float. Compiled as C++17: no core/ headers beyond math.h and generator.h. Longer than
// the project's 600 lines by design: the six families share one strided-layout view and one dtype visit, which
// splitting the file would duplicate or move into a header of their own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/generator.h"
#include "cuda/elementwise_launch.h"
#include "cuda/launch_kernel.cuh"
#include "cuda/stage_rows.cuh"
#include "ops/math.h"

namespace asc::cuda::launch {
namespace {

using math::Binary;
using math::Unary;
using math::UnaryParams;
using bf16 = __nv_bfloat16;
using f16 = __half;

constexpr int kThreads = 256;

template <class T>
constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// The type the math runs in: float for the 16-bit floats, the type itself otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class D, class S>
__device__ __forceinline__ D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (is_half_v<S>) {
    return convert<D>(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, bf16>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2bfloat16(s);
    else
      return __float2bfloat16(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, f16>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2half(s);
    else
      return __float2half(static_cast<float>(s));
  } else {
    return static_cast<D>(s);
  }
}

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b < 1 ? 1 : b) : 65536);
}

template <int N>
bool is_dense(const Layout<N>& L) {
  if (L.ndim != 1) return false;
  for (int k = 0; k < N; ++k)
    if (L.strides[k][0] != 1) return false;
  return true;
}

// Element offsets of linear index i for every operand.
template <int N>
__device__ __forceinline__ void offsets(const Layout<N>& L, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t s = L.shape[d];
    const int64_t q = i / s, idx = i - q * s;
    i = q;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += idx * L.strides[k][d];
  }
}

#define ASC_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

// The dense kernels move 16 bytes of each input per load: one element a thread per load kept too few bytes in flight
// to reach the memory's bandwidth. kVec<T> elements of T make a 16-byte Pack (cuda/stage_rows.cuh); Out<R, V> is V
// results of type R (a comparison writes bools). They need every operand 16-byte aligned (aligned16); the host sends
// others to the strided kernels.
using stage_rows::kVec;
using stage_rows::Pack;
template <class R, int V>
struct alignas(V * sizeof(R)) Out {
  R v[V];
};
inline bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// ---- unary ------------------------------------------------------------------------------------------------------

template <Unary U, class T, bool Dense>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ out, Layout<2> L, UnaryParams p) {
  using C = compute_t<T>;
  if constexpr (Dense) {  // 16-byte packs, then the tail element by element
    constexpr int V = kVec<T>;
    const int64_t packs = L.numel / V;
    ASC_GRID_STRIDE(i, packs) {
      Pack<T> v = reinterpret_cast<const Pack<T>*>(x)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) v.v[k] = convert<T>(math::unary_fwd<U, C>(convert<C>(v.v[k]), p));
      reinterpret_cast<Pack<T>*>(out)[i] = v;
    }
    ASC_GRID_STRIDE(j, L.numel - packs * V) {
      const int64_t i = packs * V + j;
      out[i] = convert<T>(math::unary_fwd<U, C>(convert<C>(x[i]), p));
    }
    return;
  }
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t off[2];
    offsets<2>(L, i, off);
    out[off[0]] = convert<T>(math::unary_fwd<U, C>(convert<C>(x[off[1]]), p));
  }
}

template <Unary U, class T, bool Dense>
__global__ void unary_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ y,
                                      T* __restrict__ gx, Layout<4> L, UnaryParams p) {
  using C = compute_t<T>;
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t o0 = i, o1 = i, o2 = i, o3 = i;
    if constexpr (!Dense) {
      int64_t off[4];
      offsets<4>(L, i, off);
      o0 = off[0], o1 = off[1], o2 = off[2], o3 = off[3];
    }
    // y may be a dummy (undefined on the host side) for ops whose derivative does not read it: read it only when used.
    const C xv = math::unary_grad_uses_x(U) ? convert<C>(x[o2]) : C(0);
    const C yv = math::unary_grad_uses_y(U) ? convert<C>(y[o3]) : C(0);
    gx[o0] = convert<T>(convert<C>(g[o1]) * math::unary_grad<U, C>(xv, yv, p));
  }
}

template <class F>
cudaError_t visit_unary(Unary op, F&& f) {
  switch (op) {
// clang-format off
#define ASC_U(name) \
  case Unary::name: return f(std::integral_constant<Unary, Unary::name>{});
    ASC_U(Neg) ASC_U(Exp) ASC_U(Log) ASC_U(Sqrt) ASC_U(Rsqrt) ASC_U(Abs) ASC_U(Relu) ASC_U(Gelu) ASC_U(GeluTanh)
    ASC_U(Silu) ASC_U(Sigmoid) ASC_U(Tanh) ASC_U(Softplus) ASC_U(Clamp) ASC_U(AddScalar) ASC_U(MulScalar)
    ASC_U(RSubScalar) ASC_U(RDivScalar) ASC_U(PowScalar)
#undef ASC_U
    // clang-format on
  }
  return cudaErrorInvalidValue;
}

// Runs f(T{}) with T the C++ type of a floating ScalarType; cudaErrorNotSupported for the others.
template <class F>
cudaError_t visit_float(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::Float32: return f(float{});
    case ScalarType::Float64: return f(double{});
    case ScalarType::BFloat16: return f(bf16{});
    case ScalarType::Float16: return f(f16{});
    default: return cudaErrorNotSupported;
  }
}

template <class F>
cudaError_t visit_all(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::Float32: return f(float{});
    case ScalarType::Float64: return f(double{});
    case ScalarType::Int64: return f(int64_t{});
    case ScalarType::Bool: return f(bool{});
    case ScalarType::BFloat16: return f(bf16{});
    case ScalarType::Float16: return f(f16{});
  }
  return cudaErrorNotSupported;
}

// ---- binary -----------------------------------------------------------------------------------------------------

template <Binary B, class T>
__device__ __forceinline__ auto binary_value(T a, T b) {
  using C = compute_t<T>;
  if constexpr (B == Binary::Pow && std::is_integral_v<T>) {
    return static_cast<T>(::pow(static_cast<double>(a), static_cast<double>(b)));
  } else {
    return math::binary_fwd<B, C>(convert<C>(a), convert<C>(b));
  }
}

// The element type a binary op writes: bool for comparisons and logic, T otherwise. Spelled out, never deduced from
// binary_value: nvcc's host pass sees a __device__ function as returning void, so a type deduced from one differs
// between the host pass (which takes the kernel's address to launch it) and the device pass (which registers the
// kernels it compiled), and the launch of an instantiation that was never registered fails with
// cudaErrorInvalidResourceHandle. The kernel checks, in the device pass, that the two agree.
template <Binary B, class T>
using binary_out_t = std::conditional_t<math::is_comparison(B), bool, T>;

template <Binary B, class T, class R, bool Dense>
__global__ void binary_kernel(const T* __restrict__ a, const T* __restrict__ b, R* __restrict__ out, Layout<3> L) {
  static_assert(std::is_same_v<R, bool> == std::is_same_v<decltype(binary_value<B, T>(T{}, T{})), bool>,
                "binary_out_t disagrees with binary_value's type");
  if constexpr (Dense) {  // 16-byte packs, then the tail element by element
    constexpr int V = kVec<T>;
    const int64_t packs = L.numel / V;
    ASC_GRID_STRIDE(i, packs) {
      const Pack<T> x = reinterpret_cast<const Pack<T>*>(a)[i], y = reinterpret_cast<const Pack<T>*>(b)[i];
      Out<R, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = convert<R>(binary_value<B, T>(x.v[k], y.v[k]));
      reinterpret_cast<Out<R, V>*>(out)[i] = r;
    }
    ASC_GRID_STRIDE(j, L.numel - packs * V) {
      const int64_t i = packs * V + j;
      out[i] = convert<R>(binary_value<B, T>(a[i], b[i]));
    }
    return;
  }
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t off[3];
    offsets<3>(L, i, off);
    out[off[0]] = convert<R>(binary_value<B, T>(a[off[1]], b[off[2]]));
  }
}

template <class F>
cudaError_t visit_binary(Binary op, F&& f) {
  switch (op) {
// clang-format off
#define ASC_B(name) \
  case Binary::name: return f(std::integral_constant<Binary, Binary::name>{});
    ASC_B(Add) ASC_B(Sub) ASC_B(Mul) ASC_B(Div) ASC_B(Pow) ASC_B(Max) ASC_B(Min) ASC_B(Eq) ASC_B(Ne) ASC_B(Lt) ASC_B(Le)
    ASC_B(Gt) ASC_B(Ge) ASC_B(And) ASC_B(Or)
#undef ASC_B
    // clang-format on
  }
  return cudaErrorInvalidValue;
}

// ---- where / copy / fill / isnan --------------------------------------------------------------------------------

template <class T>
__global__ void where_kernel(const bool* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                             T* __restrict__ out, Layout<4> L) {
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t off[4];
    offsets<4>(L, i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class S, class D, bool Dense>
__global__ void copy_kernel(const S* __restrict__ src, D* __restrict__ dst, Layout<2> L) {
  ASC_GRID_STRIDE(i, L.numel) {
    if constexpr (Dense) {
      dst[i] = convert<D>(src[i]);
    } else {
      int64_t off[2];
      offsets<2>(L, i, off);
      dst[off[0]] = convert<D>(src[off[1]]);
    }
  }
}

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, T v, Layout<1> L) {
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t off[1];
    offsets<1>(L, i, off);
    dst[off[0]] = v;
  }
}

template <class T>
__global__ void isnan_kernel(const T* __restrict__ x, bool* __restrict__ out, Layout<2> L) {
  ASC_GRID_STRIDE(i, L.numel) {
    int64_t off[2];
    offsets<2>(L, i, off);
    const compute_t<T> v = convert<compute_t<T>>(x[off[1]]);
    out[off[0]] = v != v;
  }
}

// ---- sum --------------------------------------------------------------------------------------------------------

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, int64_t>, int64_t, double>;

// One thread per output element, looping over its reduced elements (few reduced elements, many outputs).
template <class T>
__global__ void sum_thread_kernel(const T* __restrict__ x, T* __restrict__ out, Layout<1> kept, Layout<1> red,
                                  int64_t r) {
  using A = acc_t<T>;
  ASC_GRID_STRIDE(j, kept.numel) {
    int64_t base[1];
    offsets<1>(kept, j, base);
    A s = 0;
    for (int64_t e = 0; e < r; ++e) {
      int64_t off[1];
      offsets<1>(red, e, off);
      s += convert<A>(x[base[0] + off[0]]);
    }
    out[j] = convert<T>(s);
  }
}

// Block (j, g) sums output j's reduced elements of group g with a fixed-order shared-memory tree; writes out[j]
// directly (groups == 1) or partials[j * groups + g].
template <class T>
__global__ void sum_block_kernel(const T* __restrict__ x, T* __restrict__ out, acc_t<T>* __restrict__ partials,
                                 Layout<1> kept, Layout<1> red, int64_t r, int64_t groups) {
  using A = acc_t<T>;
  __shared__ A buf[kThreads];
  const int64_t j = blockIdx.x / groups, g = blockIdx.x % groups;
  const int64_t chunk = (r + groups - 1) / groups;
  const int64_t e0 = g * chunk, e1 = e0 + chunk < r ? e0 + chunk : r;
  int64_t base[1];
  offsets<1>(kept, j, base);
  A s = 0;
  if (red.ndim == 1) {
    const int64_t st = red.strides[0][0];
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) s += convert<A>(x[base[0] + e * st]);
  } else {
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
      int64_t off[1];
      offsets<1>(red, e, off);
      s += convert<A>(x[base[0] + off[0]]);
    }
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (groups == 1)
      out[j] = convert<T>(buf[0]);
    else
      partials[j * groups + g] = buf[0];
  }
}

template <class T>
__global__ void sum_finish_kernel(const acc_t<T>* __restrict__ partials, T* __restrict__ out, int64_t m,
                                  int64_t groups) {
  ASC_GRID_STRIDE(j, m) {
    acc_t<T> s = 0;
    for (int64_t g = 0; g < groups; ++g) s += partials[j * groups + g];
    out[j] = convert<T>(s);
  }
}

// ---- random -----------------------------------------------------------------------------------------------------
// Double arithmetic uses explicit round-to-nearest intrinsics: nvcc would otherwise contract a + b * c into an FMA,
// and the CPU build does not, which could change the last bit before the cast to the output type.

template <class T>
__device__ __forceinline__ T affine(double lo, double scale, double u) {
  return convert<T>(__dadd_rn(lo, __dmul_rn(scale, u)));
}

// Elements per Philox block: float (and the 16-bit floats, whose uniforms are float's) use the 4 lanes for 4 elements
// (24-bit), double 2 pairs for 2 elements (53-bit).
template <class T>
constexpr int64_t uniforms_per_block = std::is_same_v<T, double> ? 2 : 4;

// Thread per Philox block: fn(i, u) for its elements, u in [0, 1).
template <class T, class F>
__device__ __forceinline__ void for_block_uniforms(int64_t blk, int64_t n, uint64_t seed, uint64_t offset, F&& fn) {
  constexpr int64_t per = uniforms_per_block<T>;
  const auto r = philox4x32(seed, offset + static_cast<uint64_t>(blk));
  const int64_t i0 = blk * per;
#pragma unroll
  for (int64_t j = 0; j < per; ++j) {
    if (i0 + j >= n) break;
    if constexpr (per == 4)
      fn(i0 + j, static_cast<double>(uint_to_unit_float(r[j])));
    else
      fn(i0 + j, uint_to_unit_double(r[2 * j], r[2 * j + 1]));
  }
}

template <class T>
__global__ void uniform_kernel(T* __restrict__ out, int64_t n, int64_t blocks, uint64_t seed, uint64_t offset,
                               double lo, double scale) {
  ASC_GRID_STRIDE(blk, blocks) {
    for_block_uniforms<T>(blk, n, seed, offset, [&](int64_t i, double u) { out[i] = affine<T>(lo, scale, u); });
  }
}

// The 16-bit floats draw float's uniforms and compare in float; the mask holds the scale rounded to T, and y = x · mask
// (rounded once), so that the backward's g · mask is the derivative of exactly this forward.
template <class T>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ y, T* __restrict__ mask, int64_t n,
                               int64_t blocks, uint64_t seed, uint64_t offset, double p, double scale) {
  using C = compute_t<T>;
  const C keep = convert<C>(convert<T>(scale)), pt = static_cast<C>(p);
  ASC_GRID_STRIDE(blk, blocks) {
    for_block_uniforms<T>(blk, n, seed, offset, [&](int64_t i, double u) {
      const C m = static_cast<C>(u) >= pt ? keep : C(0);
      mask[i] = convert<T>(m);
      y[i] = convert<T>(convert<C>(x[i]) * m);
    });
  }
}

// bias_activation_dropout's pass: y = act(x + bias) · (keep ? scale : 0), keep = u >= p with dropout's uniforms
// (keep null: no dropout); the operations of the three composed ops in their order. bias null: none; n: x's last dim.
// slope non-null: slope = act'(x + bias) in the compute type, the backward's factor.
template <class T, Unary U>
__global__ void bias_act_dropout_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                        bool* __restrict__ keep, compute_t<T>* __restrict__ slope, int64_t total,
                                        int64_t n, int64_t blocks, uint64_t seed, uint64_t offset, double p,
                                        double scale) {
  using C = compute_t<T>;  // the 16-bit floats: x + bias, the activation and the scale in float, rounded once
  const C sc = static_cast<C>(scale), pt = static_cast<C>(p);
  const UnaryParams none{};
  auto act = [&](int64_t i) {
    const C z = bias ? convert<C>(x[i]) + convert<C>(bias[i % n]) : convert<C>(x[i]);
    if (slope) slope[i] = math::unary_grad<U, C>(z, C(0), none);
    return math::unary_fwd<U, C>(z, none);
  };
  if (keep) {
    ASC_GRID_STRIDE(blk, blocks) {
      for_block_uniforms<T>(blk, total, seed, offset, [&](int64_t i, double u) {
        const bool k = static_cast<C>(u) >= pt;
        keep[i] = k;
        y[i] = convert<T>(act(i) * (k ? sc : C(0)));
      });
    }
  } else {
    ASC_GRID_STRIDE(i, total) { y[i] = convert<T>(act(i)); }
  }
}

// Its backward: gx = (g · (keep ? scale : 0)) · slope, in the compute type, rounded once.
template <class T>
__global__ void bias_act_dropout_backward_kernel(const T* __restrict__ g, const compute_t<T>* __restrict__ slope,
                                                 const bool* __restrict__ keep, T* __restrict__ gx, int64_t total,
                                                 double scale) {
  using C = compute_t<T>;
  const C sc = static_cast<C>(scale);
  ASC_GRID_STRIDE(i, total) {
    const C gi = keep ? convert<C>(g[i]) * (keep[i] ? sc : C(0)) : convert<C>(g[i]);
    gx[i] = convert<T>(gi * slope[i]);
  }
}

// Calls f(integral_constant<Unary, U>) for the feed-forward activations; cudaErrorInvalidValue for the others.
template <class F>
cudaError_t visit_activation(Unary op, F&& f) {
  switch (op) {
    case Unary::Relu: return f(std::integral_constant<Unary, Unary::Relu>{});
    case Unary::Gelu: return f(std::integral_constant<Unary, Unary::Gelu>{});
    case Unary::GeluTanh: return f(std::integral_constant<Unary, Unary::GeluTanh>{});
    case Unary::Silu: return f(std::integral_constant<Unary, Unary::Silu>{});
    default: return cudaErrorInvalidValue;
  }
}

// Box-Muller as on the CPU: the pair (2j, 2j + 1) uses block offset + j, lanes (0,1) -> u1 and (2,3) -> u2.
template <class T>
__global__ void normal_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset, double mean,
                              double stddev) {
  const int64_t pairs = (n + 1) / 2;
  ASC_GRID_STRIDE(j, pairs) {
    const auto r = philox4x32(seed, offset + static_cast<uint64_t>(j));
    const double u1 = uint_to_unit_double(r[0], r[1]), u2 = uint_to_unit_double(r[2], r[3]);
    const double rad = ::sqrt(__dmul_rn(-2.0, ::log(__dsub_rn(1.0, u1))));
    const double th = __dmul_rn(2.0 * M_PI, u2);
    out[2 * j] = affine<T>(mean, stddev, __dmul_rn(rad, ::cos(th)));
    if (2 * j + 1 < n) out[2 * j + 1] = affine<T>(mean, stddev, __dmul_rn(rad, ::sin(th)));
  }
}

__global__ void randint_kernel(int64_t* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset, int64_t low,
                               uint64_t range) {
  ASC_GRID_STRIDE(i, n) {
    const auto r = philox4x32(seed, offset + static_cast<uint64_t>(i / 2));
    const int lane = 2 * static_cast<int>(i % 2);
    const uint64_t v = (static_cast<uint64_t>(r[lane]) << 32) | r[lane + 1];
    out[i] = static_cast<int64_t>(static_cast<uint64_t>(low) + v % range);  // modular: no int64 overflow
  }
}

}  // namespace

// ---- launchers --------------------------------------------------------------------------------------------------

cudaError_t unary(Unary op, const UnaryParams& p, ScalarType t, const void* x, void* out, const Layout<2>& L,
                  cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  const bool dense = is_dense(L) && aligned16({x, out});
  return visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    return visit_unary(op, [&](auto u) {
      constexpr Unary U = decltype(u)::value;
      if (dense)
        launch_kernel(unary_kernel<U, T, true>, blocks_for(L.numel), kThreads, stream, static_cast<const T*>(x),
                      static_cast<T*>(out), L, p);
      else
        launch_kernel(unary_kernel<U, T, false>, blocks_for(L.numel), kThreads, stream, static_cast<const T*>(x),
                      static_cast<T*>(out), L, p);
      return cudaGetLastError();
    });
  });
}

cudaError_t unary_backward(Unary op, const UnaryParams& p, ScalarType t, const void* g, const void* x, const void* y,
                           void* gx, const Layout<4>& L, cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  const bool dense = is_dense(L);
  return visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    return visit_unary(op, [&](auto u) {
      constexpr Unary U = decltype(u)::value;
      auto gp = static_cast<const T*>(g), xp = static_cast<const T*>(x), yp = static_cast<const T*>(y);
      if (dense)
        launch_kernel(unary_backward_kernel<U, T, true>, blocks_for(L.numel), kThreads, stream, gp, xp, yp,
                      static_cast<T*>(gx), L, p);
      else
        launch_kernel(unary_backward_kernel<U, T, false>, blocks_for(L.numel), kThreads, stream, gp, xp, yp,
                      static_cast<T*>(gx), L, p);
      return cudaGetLastError();
    });
  });
}

cudaError_t binary(Binary op, ScalarType t, const void* a, const void* b, void* out, const Layout<3>& L,
                   cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  const bool dense = is_dense(L) && aligned16({a, b, out});
  return visit_all(t, [&](auto tag) {
    using T = decltype(tag);
    return visit_binary(op, [&](auto bop) -> cudaError_t {
      constexpr Binary B = decltype(bop)::value;
      if constexpr (std::is_same_v<T, bool> && !math::is_comparison(B) && B != Binary::Max && B != Binary::Min) {
        return cudaErrorNotSupported;  // arithmetic on bools is promoted by the op layer; only logic reaches here
      } else {
        using R = binary_out_t<B, T>;
        auto ap = static_cast<const T*>(a), bp = static_cast<const T*>(b);
        if (dense)
          launch_kernel(binary_kernel<B, T, R, true>, blocks_for(L.numel), kThreads, stream, ap, bp,
                        static_cast<R*>(out), L);
        else
          launch_kernel(binary_kernel<B, T, R, false>, blocks_for(L.numel), kThreads, stream, ap, bp,
                        static_cast<R*>(out), L);
        return cudaGetLastError();
      }
    });
  });
}

cudaError_t where(ScalarType t, const bool* cond, const void* a, const void* b, void* out, const Layout<4>& L,
                  cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  return visit_all(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(where_kernel<T>, blocks_for(L.numel), kThreads, stream, cond, static_cast<const T*>(a),
                  static_cast<const T*>(b), static_cast<T*>(out), L);
    return cudaGetLastError();
  });
}

cudaError_t copy(ScalarType src_t, ScalarType dst_t, const void* src, void* dst, const Layout<2>& L,
                 cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  const bool dense = is_dense(L);
  return visit_all(src_t, [&](auto stag) {
    using S = decltype(stag);
    return visit_all(dst_t, [&](auto dtag) {
      using D = decltype(dtag);
      if constexpr (std::is_same_v<S, D>) {
        if (dense) {
          cudaError_t e =
              cudaMemcpyAsync(dst, src, static_cast<size_t>(L.numel) * sizeof(S), cudaMemcpyDeviceToDevice, stream);
          return e != cudaSuccess ? e : cudaGetLastError();
        }
      }
      if (dense)
        launch_kernel(copy_kernel<S, D, true>, blocks_for(L.numel), kThreads, stream, static_cast<const S*>(src),
                      static_cast<D*>(dst), L);
      else
        launch_kernel(copy_kernel<S, D, false>, blocks_for(L.numel), kThreads, stream, static_cast<const S*>(src),
                      static_cast<D*>(dst), L);
      return cudaGetLastError();
    });
  });
}

cudaError_t fill(ScalarType t, void* dst, double value, const Layout<1>& L, cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  return visit_all(t, [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, bf16>)
      v = __double2bfloat16(value);
    else if constexpr (std::is_same_v<T, f16>)
      v = __double2half(value);
    else
      v = static_cast<T>(value);
    launch_kernel(fill_kernel<T>, blocks_for(L.numel), kThreads, stream, static_cast<T*>(dst), v, L);
    return cudaGetLastError();
  });
}

cudaError_t isnan(ScalarType t, const void* x, bool* out, const Layout<2>& L, cudaStream_t stream) {
  if (L.numel == 0) return cudaSuccess;
  return visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(isnan_kernel<T>, blocks_for(L.numel), kThreads, stream, static_cast<const T*>(x), out, L);
    return cudaGetLastError();
  });
}

SumPlan sum_plan(int64_t m, int64_t r) {
  SumPlan p;
  p.m = m;
  p.r = r;
  // groups == 0: one thread per output (few reduced elements each, or outputs enough to fill the GPU).
  if (r < 256 || m >= 65536) {
    p.groups = 0;
    return p;
  }
  int64_t g = (r + 16383) / 16384;               // ~16K elements per block
  const int64_t cap = m >= 2048 ? 1 : 2048 / m;  // keep the grid to a few thousand blocks
  p.groups = g < 1 ? 1 : (g > cap ? cap : g);
  return p;
}

cudaError_t sum(ScalarType t, const void* x, void* out, const Layout<1>& kept, const Layout<1>& red,
                const SumPlan& plan, void* partials, cudaStream_t stream) {
  if (plan.m == 0) return cudaSuccess;
  auto run = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    auto xp = static_cast<const T*>(x);
    auto op = static_cast<T*>(out);
    if (plan.groups == 0) {
      launch_kernel(sum_thread_kernel<T>, blocks_for(plan.m), kThreads, stream, xp, op, kept, red, plan.r);
      return cudaGetLastError();
    }
    if (plan.groups > 1 && partials == nullptr) return cudaErrorInvalidValue;
    const int64_t nblocks = plan.m * plan.groups;
    if (nblocks > 2147483647) return cudaErrorInvalidConfiguration;
    launch_kernel(sum_block_kernel<T>, static_cast<unsigned>(nblocks), kThreads, stream, xp, op,
                  static_cast<acc_t<T>*>(partials), kept, red, plan.r, plan.groups);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || plan.groups == 1) return e;
    launch_kernel(sum_finish_kernel<T>, blocks_for(plan.m), kThreads, stream, static_cast<const acc_t<T>*>(partials),
                  op, plan.m, plan.groups);
    return cudaGetLastError();
  };
  switch (t) {
    case ScalarType::Float32: return run(float{});
    case ScalarType::Float64: return run(double{});
    case ScalarType::Int64: return run(int64_t{});
    case ScalarType::BFloat16: return run(bf16{});
    case ScalarType::Float16: return run(f16{});
    default: return cudaErrorNotSupported;
  }
}

namespace {
// The random ops' dtypes: every floating type (the 16-bit ones draw float's uniforms).
template <class F>
cudaError_t visit_random_float(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::Float32: return f(float{});
    case ScalarType::Float64: return f(double{});
    case ScalarType::BFloat16: return f(bf16{});
    case ScalarType::Float16: return f(f16{});
    default: return cudaErrorNotSupported;
  }
}
}  // namespace

cudaError_t uniform(ScalarType t, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return visit_random_float(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t per = uniforms_per_block<T>;
    const int64_t blocks = (n + per - 1) / per;
    launch_kernel(uniform_kernel<T>, blocks_for(blocks), kThreads, stream, static_cast<T*>(out), n, blocks, seed,
                  offset, lo, hi - lo);
    return cudaGetLastError();
  });
}

cudaError_t dropout(ScalarType t, const void* x, void* y, void* mask, int64_t n, uint64_t seed, uint64_t offset,
                    double p, double scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return visit_random_float(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t per = uniforms_per_block<T>;
    const int64_t blocks = (n + per - 1) / per;
    launch_kernel(dropout_kernel<T>, blocks_for(blocks), kThreads, stream, static_cast<const T*>(x), static_cast<T*>(y),
                  static_cast<T*>(mask), n, blocks, seed, offset, p, scale);
    return cudaGetLastError();
  });
}

cudaError_t bias_act_dropout(Unary act, ScalarType t, const void* x, const void* bias, void* y, bool* keep, void* slope,
                             int64_t total, int64_t n, uint64_t seed, uint64_t offset, double p, double scale,
                             cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  return visit_random_float(t, [&](auto tag) {
    using T = decltype(tag);
    return visit_activation(act, [&](auto u) {
      constexpr Unary U = decltype(u)::value;
      constexpr int64_t per = uniforms_per_block<T>;
      const int64_t blocks = (total + per - 1) / per;
      launch_kernel(bias_act_dropout_kernel<T, U>, blocks_for(keep ? blocks : total), kThreads, stream,
                    static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y), keep,
                    static_cast<compute_t<T>*>(slope), total, n, blocks, seed, offset, p, scale);
      return cudaGetLastError();
    });
  });
}

cudaError_t bias_act_dropout_backward(ScalarType t, const void* g, const void* slope, const bool* keep, void* gx,
                                      int64_t total, double scale, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  return visit_random_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(bias_act_dropout_backward_kernel<T>, blocks_for(total), kThreads, stream, static_cast<const T*>(g),
                  static_cast<const compute_t<T>*>(slope), keep, static_cast<T*>(gx), total, scale);
    return cudaGetLastError();
  });
}

cudaError_t normal(ScalarType t, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev,
                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return visit_random_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(normal_kernel<T>, blocks_for((n + 1) / 2), kThreads, stream, static_cast<T*>(out), n, seed, offset,
                  mean, stddev);
    return cudaGetLastError();
  });
}

cudaError_t randint(int64_t* out, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch_kernel(randint_kernel, blocks_for(n), kThreads, stream, out, n, seed, offset, low,
                static_cast<uint64_t>(high) - static_cast<uint64_t>(low));
  return cudaGetLastError();
}

}  // namespace asc::cuda::launch
