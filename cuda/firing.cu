// CUDA kernels of the firing perceptron's output (cuda/firing_launch.h; formulas in ops/firing.h, docs/firing.md).
//
// Forward: one thread per (b, p), grid-strided; a silent neuron writes zeros without forming f·Z. Backward: one
// thread block per neuron p, its threads striding over the rows b: each writes dZ[b, p] and the block reduces
// dSP_p and df[p, ·] (in chunks of kChunk outputs, accumulated in float32 / float64), so no atomics are needed and
// the result does not depend on scheduling. With the exact gate a silent (b, p) contributes nothing and is skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/firing_launch.h"
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda {
namespace {

using namespace firing_launch;
using rows::acc_t;
using rows::from_acc;
using rows::to_acc;

constexpr int kThreads = 128;
constexpr int kChunk = 8;  // outputs g reduced per pass of the backward

template <class T>
__global__ void firing_forward_kernel(const T* __restrict__ Z, const T* __restrict__ SP, const T* __restrict__ f,
                                      int64_t N, int64_t P, int64_t A, T* __restrict__ F, T* __restrict__ Y) {
  using Acc = acc_t<T>;
  for (int64_t bp = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bp < N * P; bp += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = bp % P;
    const Acc z = to_acc(Z[bp]);
    const bool fires = z >= to_acc(SP[p]);
    F[bp] = from_acc<T>(fires ? Acc(1) : Acc(0));
    for (int64_t g = 0; g < A; ++g) Y[bp * A + g] = from_acc<T>(fires ? to_acc(f[p * A + g]) * z : Acc(0));
  }
}

template <class Acc>
__device__ __forceinline__ Acc gate_derivative(const Gate& gate, Acc u) {
  if (gate.mode == 0) return Acc(0);
  if (gate.mode == 1) return Acc(1);
  return static_cast<Acc>(math::surrogate_derivative(gate.kind, static_cast<double>(u), gate.width));
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    firing_backward_kernel(const T* __restrict__ Z, const T* __restrict__ SP, const T* __restrict__ f,
                           const T* __restrict__ F, const T* __restrict__ dY, int64_t N, int64_t P, int64_t A, Gate gate,
                           T* __restrict__ dZ, T* __restrict__ dSP, T* __restrict__ df) {
  using Acc = acc_t<T>;
  __shared__ Acc red[32];
  for (int64_t p = blockIdx.x; p < P; p += gridDim.x) {
    const Acc sp = to_acc(SP[p]);
    // Pass 0 also writes dZ and reduces dSP; every pass reduces df for outputs [g0, g0 + kChunk).
    for (int64_t g0 = 0; g0 < A; g0 += kChunk) {
      const int64_t gn = A - g0 < kChunk ? A - g0 : kChunk;
      Acc part[kChunk];
      for (int c = 0; c < kChunk; ++c) part[c] = Acc(0);
      Acc dsp = 0;
      for (int64_t b = threadIdx.x; b < N; b += blockDim.x) {
        const int64_t bp = b * P + p;
        const bool fires = to_acc(F[bp]) != Acc(0);
        if (!fires && gate.mode == 0) {  // silent, exact gate: no gradient
          if (g0 == 0) dZ[bp] = from_acc<T>(Acc(0));
          continue;
        }
        const Acc z = to_acc(Z[bp]);
        if (fires)
          for (int c = 0; c < gn; ++c) part[c] += to_acc(dY[bp * A + g0 + c]) * z;
        if (g0 == 0) {
          Acc S = 0;
          for (int64_t g = 0; g < A; ++g) S += to_acc(dY[bp * A + g]) * to_acc(f[p * A + g]);
          const Acc d = gate_derivative(gate, z - sp);
          dZ[bp] = from_acc<T>(S * ((fires ? Acc(1) : Acc(0)) + z * d));
          dsp -= S * z * d;
        }
      }
      for (int c = 0; c < gn; ++c) {
        const Acc v = rows::row_reduce(part[c], rows::SumOp{}, red);
        if (threadIdx.x == 0) df[p * A + g0 + c] = from_acc<T>(v);
      }
      if (g0 == 0) {
        const Acc v = rows::row_reduce(dsp, rows::SumOp{}, red);
        if (threadIdx.x == 0) dSP[p] = from_acc<T>(v);
      }
    }
  }
}

// ---- the SSM scan: a block per batch row, threads over channels, sequential in time --------------------------------
// Each thread owns channels c = tid + k blockDim (k < kScanPer) and keeps their state (forward) or carried gradient
// (backward) in registers, in the compute type; a channel's recurrence reads only itself, so the one cross-thread
// step is the RMS of h_t (a block reduction).
constexpr int kScanPer = 8;  // channels per thread
static_assert(kScanPer * kThreads >= kMaxScanChannels, "a block must hold every channel of the state");

template <class T>
__global__ void __launch_bounds__(kThreads)
    ssm_scan_forward_kernel(const T* __restrict__ a, const T* __restrict__ u, const T* __restrict__ s0, int64_t B,
                            int64_t Tn, int64_t R, bool rms_norm, double eps, T* __restrict__ s, T* __restrict__ rms) {
  using Acc = acc_t<T>;
  __shared__ Acc red[32];
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    Acc st[kScanPer];  // s_{t-1} of this thread's channels
    for (int k = 0; k < kScanPer; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      st[k] = c < R ? to_acc(s0[b * R + c]) : Acc(0);
    }
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t o = (b * Tn + t) * R;
      Acc ms = 0;
      for (int k = 0; k < kScanPer; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= R) break;
        st[k] = to_acc(a[o + c]) * st[k] + to_acc(u[o + c]);  // h_t = a_t s_{t-1} + u_t
        ms += st[k] * st[k];
      }
      Acc r = 1;
      if (rms_norm) {
        ms = rows::row_reduce(ms, rows::SumOp{}, red);
        r = static_cast<Acc>(sqrt(static_cast<double>(ms) / double(R) + eps));
      }
      for (int k = 0; k < kScanPer; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= R) break;
        if (rms_norm) st[k] /= r;
        s[o + c] = from_acc<T>(st[k]);
      }
      if (threadIdx.x == 0) rms[b * Tn + t] = from_acc<T>(r);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ssm_scan_backward_kernel(const T* __restrict__ a, const T* __restrict__ s0, const T* __restrict__ s,
                             const T* __restrict__ rms, const T* __restrict__ ds, int64_t B, int64_t Tn, int64_t R,
                             bool rms_norm, T* __restrict__ da, T* __restrict__ du, T* __restrict__ ds0) {
  using Acc = acc_t<T>;
  __shared__ Acc red[32];
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    Acc carry[kScanPer];  // dL/ds_t from later steps, per channel
    for (int k = 0; k < kScanPer; ++k) carry[k] = Acc(0);
    for (int64_t t = Tn - 1; t >= 0; --t) {
      const int64_t o = (b * Tn + t) * R;
      Acc dot = 0;
      for (int k = 0; k < kScanPer; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= R) break;
        carry[k] += to_acc(ds[o + c]);  // now the whole dL/ds_t
        dot += carry[k] * to_acc(s[o + c]);
      }
      if (rms_norm) dot = rows::row_reduce(dot, rows::SumOp{}, red);
      const Acc r = to_acc(rms[b * Tn + t]), mean_gs = dot / Acc(R);
      for (int k = 0; k < kScanPer; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= R) break;
        const Acc dh = rms_norm ? (carry[k] - to_acc(s[o + c]) * mean_gs) / r : carry[k];  // s = h / ρ
        const Acc prev = to_acc(t > 0 ? s[o - R + c] : s0[b * R + c]);
        du[o + c] = from_acc<T>(dh);  // h = a s_{t-1} + u
        da[o + c] = from_acc<T>(dh * prev);
        carry[k] = dh * to_acc(a[o + c]);
      }
    }
    for (int k = 0; k < kScanPer; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      if (c < R) ds0[b * R + c] = from_acc<T>(carry[k]);
    }
  }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((n + kThreads - 1) / kThreads, 1), 65535LL * 16));
}

}  // namespace

namespace firing_launch {

cudaError_t forward(const void* Z, const void* SP, const void* f, int64_t N, int64_t P, int64_t A, void* F, void* Y,
                    FloatElem elem, cudaStream_t stream) {
  if (N * P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(firing_forward_kernel<T>, dim3(blocks_for(N * P)), dim3(kThreads), stream,
                                          static_cast<const T*>(Z), static_cast<const T*>(SP),
                                          static_cast<const T*>(f), N, P, A, static_cast<T*>(F), static_cast<T*>(Y));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t backward(const void* Z, const void* SP, const void* f, const void* F, const void* dY, int64_t N, int64_t P,
                     int64_t A, Gate gate, void* dZ, void* dSP, void* df, FloatElem elem, cudaStream_t stream) {
  if (P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(P, 65535LL * 16));
    const cudaError_t err = launch_kernel(
        firing_backward_kernel<T>, dim3(blocks), dim3(kThreads), stream, static_cast<const T*>(Z),
        static_cast<const T*>(SP), static_cast<const T*>(f), static_cast<const T*>(F), static_cast<const T*>(dY), N,
        P, A, gate, static_cast<T*>(dZ), static_cast<T*>(dSP), static_cast<T*>(df));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t scan_forward(const void* a, const void* u, const void* s0, int64_t B, int64_t T, int64_t R, bool rms_norm,
                         double eps, void* s, void* rms, FloatElem elem, cudaStream_t stream) {
  if (B * T * R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using E = decltype(tag);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(B, 65535LL * 16));
    const cudaError_t err = launch_kernel(ssm_scan_forward_kernel<E>, dim3(blocks), dim3(kThreads), stream,
                                          static_cast<const E*>(a), static_cast<const E*>(u),
                                          static_cast<const E*>(s0), B, T, R, rms_norm, eps, static_cast<E*>(s),
                                          static_cast<E*>(rms));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t scan_backward(const void* a, const void* s0, const void* s, const void* rms, const void* ds, int64_t B,
                          int64_t T, int64_t R, bool rms_norm, void* da, void* du, void* ds0, FloatElem elem,
                          cudaStream_t stream) {
  if (B * R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using E = decltype(tag);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(B, 65535LL * 16));
    const cudaError_t err = launch_kernel(
        ssm_scan_backward_kernel<E>, dim3(blocks), dim3(kThreads), stream, static_cast<const E*>(a),
        static_cast<const E*>(s0), static_cast<const E*>(s), static_cast<const E*>(rms), static_cast<const E*>(ds), B,
        T, R, rms_norm, static_cast<E*>(da), static_cast<E*>(du), static_cast<E*>(ds0));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

}  // namespace firing_launch
}  // namespace asc::cuda
