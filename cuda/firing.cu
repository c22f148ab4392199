// CUDA kernels of the firing perceptron's output (cuda/firing_launch.h; formulas in ops/firing.h, docs/firing.md).
//
// Forward: one thread per (b, p), grid-strided, neurons fastest; a silent neuron writes zeros without forming f·Z.
// Backward: one thread per (b, p) writes dZ and two factors per (b, p); the sums over b of dSP and df then run as
// column sums (a thread per column, consecutive threads on consecutive columns, partial sums per block of rows added
// in a fixed order), in float32 / float64: no atomics, and the result does not depend on scheduling. With the exact
// gate a silent (b, p) contributes nothing and skips the work.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>  // NAN
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

template <class T>
__global__ void firing_forward_kernel(const T* __restrict__ Z, const T* __restrict__ SP, const T* __restrict__ f,
                                      int64_t N, int64_t P, int64_t A, T* __restrict__ F, T* __restrict__ Y) {
  using Acc = acc_t<T>;
  for (int64_t bp = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bp < N * P; bp += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = bp % P;
    const Acc z = to_acc(Z[bp]), sp = to_acc(SP[p]);
    // Fires (Z >= SP), silent (Z < SP), or undefined (Z or SP NaN: the compares are unordered), where F and every
    // output are NaN, as on the CPU (ops/cpu/firing.cpp). z F is z exactly where the neuron fires.
    const bool fires = z >= sp, active = !(z < sp);
    const Acc Fv = fires ? Acc(1) : active ? static_cast<Acc>(NAN) : Acc(0);
    F[bp] = from_acc<T>(Fv);
    const Acc zg = z * Fv;
    for (int64_t g = 0; g < A; ++g) Y[bp * A + g] = from_acc<T>(active ? to_acc(f[p * A + g]) * zg : Acc(0));
  }
}

template <class Acc>
__device__ __forceinline__ Acc gate_derivative(const Gate& gate, Acc u) {
  if (gate.mode == 0) return Acc(0);
  if (gate.mode == 1) return Acc(1);
  return static_cast<Acc>(math::surrogate_derivative(gate.kind, static_cast<double>(u), gate.width));
}

// Backward, pass 1: one thread per (b, p), neurons fastest (coalesced): dZ, and per (b, p) the two factors the
// reductions over b need — c_sp = -S z s' (dSP) and c_f = F z (df[p, g] = Σ_b dY[b, p, g] c_f[b, p]). An undefined
// gate (F NaN) gives NaN in all three, with the exact gate too (F − F: 0 for F in {0, 1}, NaN for NaN), as on the CPU.
template <class T>
__global__ void firing_backward_rows(const T* __restrict__ Z, const T* __restrict__ SP, const T* __restrict__ f,
                                     const T* __restrict__ F, const T* __restrict__ dY, int64_t N, int64_t P, int64_t A,
                                     Gate gate, T* __restrict__ dZ, acc_t<T>* __restrict__ c_sp,
                                     acc_t<T>* __restrict__ c_f) {
  using Acc = acc_t<T>;
  for (int64_t bp = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bp < N * P; bp += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = bp % P;
    const bool fires = to_acc(F[bp]) != Acc(0);
    if (!fires && gate.mode == 0) {  // silent, exact gate: no gradient
      dZ[bp] = from_acc<T>(Acc(0));
      c_sp[bp] = Acc(0), c_f[bp] = Acc(0);
      continue;
    }
    const Acc z = to_acc(Z[bp]), Fv = to_acc(F[bp]);
    Acc S = 0;
    for (int64_t g = 0; g < A; ++g) S += to_acc(dY[bp * A + g]) * to_acc(f[p * A + g]);
    c_f[bp] = fires ? z * Fv : Acc(0);
    if (gate.mode == 0) {  // exact: dZ = S F (not S (F + z·0), which is NaN for an infinite z)
      dZ[bp] = from_acc<T>(S * Fv);
      c_sp[bp] = Fv - Fv;
      continue;
    }
    const Acc zd = z * gate_derivative(gate, z - to_acc(SP[p])) + (Fv - Fv);  // z s'
    dZ[bp] = from_acc<T>(S * (Fv + zd));
    c_sp[bp] = -S * zd;
  }
}

// The values summed over b: c_sp[b, col] for dSP (C = P); dY[b, col] c_f[b, col / A] for df (C = P A).
template <class T>
struct SpValue {
  const acc_t<T>* c_sp;
  __device__ acc_t<T> operator()(int64_t b, int64_t col, int64_t C) const { return c_sp[b * C + col]; }
};
// A silent (b, p) adds exactly nothing to df, even where dY is not finite (not dY · 0): F decides, as on the CPU.
template <class T>
struct FValue {
  const T* dY;
  const acc_t<T>* c_f;
  const T* F;
  int64_t A;
  __device__ acc_t<T> operator()(int64_t b, int64_t col, int64_t C) const {
    const int64_t bp = b * (C / A) + col / A;
    return to_acc(F[bp]) != acc_t<T>(0) ? to_acc(dY[b * C + col]) * c_f[bp] : acc_t<T>(0);
  }
};

// Pass 2: column sums over b of an (N, C) matrix of values, as partial sums of row blocks (grid.y) — a thread per
// column, consecutive threads on consecutive columns — then pass 3 adds the partials in a fixed order: deterministic.
template <class T, class V>
__global__ void column_partials(V value, int64_t N, int64_t C, acc_t<T>* __restrict__ part) {
  const int64_t rows = (N + gridDim.y - 1) / gridDim.y, b0 = int64_t(blockIdx.y) * rows;
  const int64_t b1 = b0 + rows < N ? b0 + rows : N;
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < C; col += int64_t(gridDim.x) * blockDim.x) {
    acc_t<T> s = 0;
    for (int64_t b = b0; b < b1; ++b) s += value(b, col, C);
    part[int64_t(blockIdx.y) * C + col] = s;
  }
}

template <class T>
__global__ void column_finish(const acc_t<T>* __restrict__ part, int64_t parts, int64_t C, T* __restrict__ out) {
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < C; col += int64_t(gridDim.x) * blockDim.x) {
    acc_t<T> s = 0;
    for (int64_t k = 0; k < parts; ++k) s += part[k * C + col];
    out[col] = from_acc<T>(s);
  }
}

// Passes 2 and 3 for one matrix of values: out (C) = Σ_b value(b, col), through `part` (row-block partials).
template <class T, class V>
cudaError_t column_sums(V value, int64_t N, int64_t C, int64_t parts, acc_t<T>* part, T* out, cudaStream_t stream) {
  auto check = [](cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); };
  const unsigned cols = static_cast<unsigned>(std::min<int64_t>((C + kThreads - 1) / kThreads, 65535));
  const cudaError_t e = check(launch_kernel(column_partials<T, V>, dim3(cols, grid_dim(parts, kMaxGridYZ)),
                                            dim3(kThreads), stream, value, N, C, part));
  if (e != cudaSuccess) return e;
  return check(launch_kernel(column_finish<T>, dim3(cols), dim3(kThreads), stream, part, parts, C, out));
}

// ---- rule B's sums and coefficients ---------------------------------------------------------------------------------
// The value column_partials sums for rule B: F Z² (kind 0), F (1), F max(0, Z − SP) (2); a silent (b, p) adds 0,
// an undefined one (F NaN) NaN, and max(0, NaN) is NaN.
template <class T>
struct RuleSumValue {
  const T *Z, *F, *SP;
  int kind;
  __device__ acc_t<T> operator()(int64_t b, int64_t col, int64_t C) const {
    using Acc = acc_t<T>;
    const int64_t i = b * C + col;
    const Acc Fv = to_acc(F[i]);
    if (Fv == Acc(0)) return Acc(0);
    const Acc z = to_acc(Z[i]);
    if (kind == 0) return z * z * Fv;
    if (kind == 1) return Fv;
    const Acc m = z - to_acc(SP[col]);
    return (m <= Acc(0) ? Acc(0) : m) * Fv;
  }
};

template <class T>
__global__ void rule_b_coef_kernel(const T* __restrict__ Z, const T* __restrict__ F, double a, const T* __restrict__ dZ,
                                   const T* __restrict__ c, int64_t N, int64_t P, T* __restrict__ coef) {
  using Acc = acc_t<T>;
  for (int64_t bp = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bp < N * P; bp += int64_t(gridDim.x) * blockDim.x) {
    const Acc Fv = to_acc(F[bp]);
    Acc v = Fv != Acc(0) ? static_cast<Acc>(a) * (to_acc(Z[bp]) * Fv) : Acc(0);
    if (dZ) v -= to_acc(c[bp % P]) * to_acc(dZ[bp]);
    coef[bp] = from_acc<T>(v);
  }
}

// W[p, i] *= keep[p], one thread per element (grid-strided, rows contiguous): the decay of firing_weight_update, as
// the CPU's dense path does it (keep = 0 on a non-finite W gives NaN there too).
template <class T>
__global__ void scale_rows_kernel(T* __restrict__ W, const T* __restrict__ keep, int64_t P, int64_t d) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < P * d; i += int64_t(gridDim.x) * blockDim.x)
    W[i] = from_acc<T>(to_acc(W[i]) * to_acc(keep[i / d]));
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

template <class T>
__global__ void fill_kernel(T* __restrict__ x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_acc<T>(acc_t<T>(1));
}

// ---- the chunked scan of the linear recurrence (no RMS), forward and backward -------------------------------------
// Threads index (b, k, c) with the channel fastest, so the loads of a time step are coalesced. K chunks of kScanChunk.
// Thread idx of a chunked kernel: row b, chunk k (steps [k kScanChunk, t1)), channel c (fastest).
struct Chunk {
  int64_t b, k, c, t1;
};
__device__ __forceinline__ Chunk chunk_of(int64_t idx, int64_t Tn, int64_t R, int64_t K) {
  const int64_t k = (idx / R) % K, end = (k + 1) * kScanChunk;
  return {idx / (R * K), k, idx % R, end < Tn ? end : Tn};
}

template <class T>
__global__ void scan_chunk_summary(const T* __restrict__ a, const T* __restrict__ u, int64_t B, int64_t Tn, int64_t R,
                                   int64_t K, acc_t<T>* __restrict__ hend, acc_t<T>* __restrict__ pend) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * K * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const Chunk ch = chunk_of(idx, Tn, R, K);
    const int64_t c = ch.c, k = ch.k, b = ch.b, t1 = ch.t1;
    Acc h = 0, prod = 1;  // the chunk's end state from a zero start, and Π a over the chunk
    for (int64_t t = k * kScanChunk; t < t1; ++t) {
      const Acc x = to_acc(a[(b * Tn + t) * R + c]);
      h = x * h + to_acc(u[(b * Tn + t) * R + c]);
      prod *= x;
    }
    hend[idx] = h;
    pend[idx] = prod;
  }
}

// One thread per (b, c): the state entering each chunk, cin[k] = pend[k-1] cin[k-1] + hend[k-1], cin[0] = s0.
template <class T>
__global__ void scan_chunk_carry(const T* __restrict__ s0, int64_t B, int64_t R, int64_t K,
                                 const acc_t<T>* __restrict__ hend, const acc_t<T>* __restrict__ pend,
                                 acc_t<T>* __restrict__ cin) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = idx % R, b = idx / R;
    Acc st = to_acc(s0[idx]);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = (b * K + k) * R + c;
      cin[i] = st;
      st = pend[i] * st + hend[i];
    }
  }
}

template <class T>
__global__ void scan_chunk_apply(const T* __restrict__ a, const T* __restrict__ u, int64_t B, int64_t Tn, int64_t R,
                                 int64_t K, const acc_t<T>* __restrict__ cin, T* __restrict__ s) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * K * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const Chunk ch = chunk_of(idx, Tn, R, K);
    const int64_t c = ch.c, k = ch.k, b = ch.b, t1 = ch.t1;
    Acc h = cin[idx];
    for (int64_t t = k * kScanChunk; t < t1; ++t) {
      const int64_t o = (b * Tn + t) * R + c;
      h = to_acc(a[o]) * h + to_acc(u[o]);
      s[o] = from_acc<T>(h);
    }
  }
}

// Backward: g_t = ds_t + e_t g_{t+1} with e_t = a_{t+1} (0 at the last step), scanned from the end; du = g,
// da_t = g_t s_{t-1}, ds0 = a_0 g_0. Per chunk from a zero incoming gradient: its value at the chunk start and
// Π e over the chunk.
template <class T>
__device__ __forceinline__ acc_t<T> next_a(const T* a, int64_t b, int64_t t, int64_t Tn, int64_t R, int64_t c) {
  return t + 1 < Tn ? to_acc(a[(b * Tn + t + 1) * R + c]) : acc_t<T>(0);
}

template <class T>
__global__ void scan_chunk_summary_back(const T* __restrict__ a, const T* __restrict__ ds, int64_t B, int64_t Tn,
                                        int64_t R, int64_t K, acc_t<T>* __restrict__ gstart,
                                        acc_t<T>* __restrict__ qstart) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * K * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const Chunk ch = chunk_of(idx, Tn, R, K);
    const int64_t c = ch.c, k = ch.k, b = ch.b, t1 = ch.t1;
    Acc g = 0, prod = 1;
    for (int64_t t = t1 - 1; t >= k * kScanChunk; --t) {
      const Acc e = next_a(a, b, t, Tn, R, c);
      g = to_acc(ds[(b * Tn + t) * R + c]) + e * g;
      prod *= e;
    }
    gstart[idx] = g;
    qstart[idx] = prod;
  }
}

// One thread per (b, c): the gradient entering each chunk from the later ones, gin[k] = g at the next chunk's start.
template <class T>
__global__ void scan_chunk_carry_back(int64_t B, int64_t R, int64_t K, const acc_t<T>* __restrict__ gstart,
                                      const acc_t<T>* __restrict__ qstart, acc_t<T>* __restrict__ gin) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = idx % R, b = idx / R;
    Acc g = 0;
    for (int64_t k = K - 1; k >= 0; --k) {
      const int64_t i = (b * K + k) * R + c;
      gin[i] = g;
      g = gstart[i] + qstart[i] * g;
    }
  }
}

template <class T>
__global__ void scan_chunk_apply_back(const T* __restrict__ a, const T* __restrict__ s0, const T* __restrict__ s,
                                      const T* __restrict__ ds, int64_t B, int64_t Tn, int64_t R, int64_t K,
                                      const acc_t<T>* __restrict__ gin, T* __restrict__ da, T* __restrict__ du,
                                      T* __restrict__ ds0) {
  using Acc = acc_t<T>;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < B * K * R;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const Chunk ch = chunk_of(idx, Tn, R, K);
    const int64_t c = ch.c, k = ch.k, b = ch.b, t1 = ch.t1;
    Acc g = gin[idx];  // g_{t1}
    for (int64_t t = t1 - 1; t >= k * kScanChunk; --t) {
      const int64_t o = (b * Tn + t) * R + c;
      g = to_acc(ds[o]) + next_a(a, b, t, Tn, R, c) * g;
      const Acc prev = to_acc(t > 0 ? s[o - R] : s0[b * R + c]);
      du[o] = from_acc<T>(g);
      da[o] = from_acc<T>(g * prev);
    }
    if (k == 0) ds0[b * R + c] = from_acc<T>(to_acc(a[(b * Tn) * R + c]) * g);
  }
}

}  // namespace

namespace firing_launch {

cudaError_t forward(const void* Z, const void* SP, const void* f, int64_t N, int64_t P, int64_t A, void* F, void* Y,
                    FloatElem elem, cudaStream_t stream) {
  if (N * P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(firing_forward_kernel<T>, dim3(grid_for(N * P, kThreads)), dim3(kThreads),
                                          stream, static_cast<const T*>(Z), static_cast<const T*>(SP),
                                          static_cast<const T*>(f), N, P, A, static_cast<T*>(F), static_cast<T*>(Y));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t backward(const void* Z, const void* SP, const void* f, const void* F, const void* dY, int64_t N, int64_t P,
                     int64_t A, Gate gate, void* dZ, void* dSP, void* df, void* work, FloatElem elem,
                     cudaStream_t stream) {
  if (P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    using Acc = acc_t<T>;
    auto check = [](cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); };
    const int64_t parts = backward_row_blocks(N);
    Acc *c_sp = static_cast<Acc*>(work), *c_f = c_sp + N * P, *part = c_f + N * P;
    const T* dy = static_cast<const T*>(dY);
    cudaError_t err;
    if (N > 0 && (err = check(launch_kernel(firing_backward_rows<T>, dim3(grid_for(N * P, kThreads)), dim3(kThreads),
                                            stream, static_cast<const T*>(Z), static_cast<const T*>(SP),
                                            static_cast<const T*>(f), static_cast<const T*>(F), dy, N, P, A, gate,
                                            static_cast<T*>(dZ), c_sp, c_f))) != cudaSuccess)
      return err;
    if ((err = column_sums<T>(SpValue<T>{c_sp}, N, P, parts, part, static_cast<T*>(dSP), stream)) != cudaSuccess)
      return err;
    return column_sums<T>(FValue<T>{dy, c_f, static_cast<const T*>(F), A}, N, P * A, parts, part, static_cast<T*>(df),
                          stream);
  });
}

cudaError_t batch_sums(const void* Z, const void* F, const void* SP, int64_t N, int64_t P, void* fz2, void* fired,
                       void* margin, void* work, FloatElem elem, cudaStream_t stream) {
  if (P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    using Acc = acc_t<T>;
    const int64_t parts = backward_row_blocks(N);
    Acc* part = static_cast<Acc*>(work);
    T* outs[3] = {static_cast<T*>(fz2), static_cast<T*>(fired), static_cast<T*>(margin)};
    for (int kind = 0; kind < 3; ++kind) {
      const RuleSumValue<T> value{static_cast<const T*>(Z), static_cast<const T*>(F), static_cast<const T*>(SP), kind};
      const cudaError_t e = column_sums<T>(value, N, P, parts, part, outs[kind], stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

cudaError_t rule_b_coef(const void* Z, const void* F, double a, const void* dZ, const void* c, int64_t N, int64_t P,
                        void* coef, FloatElem elem, cudaStream_t stream) {
  if (N * P == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(
        rule_b_coef_kernel<T>, dim3(grid_for(N * P, kThreads)), dim3(kThreads), stream, static_cast<const T*>(Z),
        static_cast<const T*>(F), a, static_cast<const T*>(dZ), static_cast<const T*>(c), N, P, static_cast<T*>(coef));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t scale_rows(void* W, const void* keep, int64_t P, int64_t d, FloatElem elem, cudaStream_t stream) {
  if (P * d == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(scale_rows_kernel<T>, dim3(grid_for(P * d, kThreads)), dim3(kThreads), stream,
                                          static_cast<T*>(W), static_cast<const T*>(keep), P, d);
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t scan_forward(const void* a, const void* u, const void* s0, int64_t B, int64_t T, int64_t R, bool rms_norm,
                         double eps, void* s, void* rms, void* work, FloatElem elem, cudaStream_t stream) {
  if (B * T * R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using E = decltype(tag);
    using Acc = acc_t<E>;
    auto check = [](cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); };
    const E *ap = static_cast<const E*>(a), *up = static_cast<const E*>(u), *s0p = static_cast<const E*>(s0);
    if (!scan_chunked(rms_norm, T)) {
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(B, 65535LL * 16));
      return check(launch_kernel(ssm_scan_forward_kernel<E>, dim3(blocks), dim3(kThreads), stream, ap, up, s0p, B, T, R,
                                 rms_norm, eps, static_cast<E*>(s), static_cast<E*>(rms)));
    }
    const int64_t K = (T + kScanChunk - 1) / kScanChunk;
    Acc *hend = static_cast<Acc*>(work), *pend = hend + B * K * R, *cin = pend + B * K * R;
    cudaError_t err;
    if ((err = check(launch_kernel(scan_chunk_summary<E>, dim3(grid_for(B * K * R, kThreads)), dim3(kThreads), stream,
                                   ap, up, B, T, R, K, hend, pend))) != cudaSuccess)
      return err;
    if ((err = check(launch_kernel(scan_chunk_carry<E>, dim3(grid_for(B * R, kThreads)), dim3(kThreads), stream, s0p, B,
                                   R, K, hend, pend, cin))) != cudaSuccess)
      return err;
    if ((err = check(launch_kernel(scan_chunk_apply<E>, dim3(grid_for(B * K * R, kThreads)), dim3(kThreads), stream, ap,
                                   up, B, T, R, K, cin, static_cast<E*>(s)))) != cudaSuccess)
      return err;
    return check(launch_kernel(fill_kernel<E>, dim3(grid_for(B * T, kThreads)), dim3(kThreads), stream,
                               static_cast<E*>(rms),
                               B * T));  // RMS "1": no normalisation
  });
}

cudaError_t scan_backward(const void* a, const void* s0, const void* s, const void* rms, const void* ds, int64_t B,
                          int64_t T, int64_t R, bool rms_norm, void* da, void* du, void* ds0, void* work,
                          FloatElem elem, cudaStream_t stream) {
  if (B * R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using E = decltype(tag);
    using Acc = acc_t<E>;
    auto check = [](cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); };
    const E *ap = static_cast<const E*>(a), *s0p = static_cast<const E*>(s0), *sp = static_cast<const E*>(s);
    const E* gp = static_cast<const E*>(ds);
    if (!scan_chunked(rms_norm, T)) {
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(B, 65535LL * 16));
      return check(launch_kernel(ssm_scan_backward_kernel<E>, dim3(blocks), dim3(kThreads), stream, ap, s0p, sp,
                                 static_cast<const E*>(rms), gp, B, T, R, rms_norm, static_cast<E*>(da),
                                 static_cast<E*>(du), static_cast<E*>(ds0)));
    }
    const int64_t K = (T + kScanChunk - 1) / kScanChunk;
    Acc *gstart = static_cast<Acc*>(work), *qstart = gstart + B * K * R, *gin = qstart + B * K * R;
    cudaError_t err;
    if ((err = check(launch_kernel(scan_chunk_summary_back<E>, dim3(grid_for(B * K * R, kThreads)), dim3(kThreads),
                                   stream, ap, gp, B, T, R, K, gstart, qstart))) != cudaSuccess)
      return err;
    if ((err = check(launch_kernel(scan_chunk_carry_back<E>, dim3(grid_for(B * R, kThreads)), dim3(kThreads), stream, B,
                                   R, K, gstart, qstart, gin))) != cudaSuccess)
      return err;
    return check(launch_kernel(scan_chunk_apply_back<E>, dim3(grid_for(B * K * R, kThreads)), dim3(kThreads), stream,
                               ap, s0p, sp, gp, B, T, R, K, gin, static_cast<E*>(da), static_cast<E*>(du),
                               static_cast<E*>(ds0)));
  });
}

}  // namespace firing_launch
}  // namespace asc::cuda
