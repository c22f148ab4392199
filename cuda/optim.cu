// Fused CUDA optimizer kernels (see cuda/optim_launch.h and ops/kernel_list.inc): one grid-stride pass over the
// parameter, its gradient and state, in place. The arithmetic is the CPU kernels' (ops/cpu/optim.cpp), step
// for step in the parameter's dtype, written with the IEEE round-to-nearest intrinsics (__fmul_rn, __fadd_rn,
// __fdiv_rn, __fsqrt_rn and the double versions): nvcc never contracts those into FMAs, so a step gives the same
// bits as the CPU kernels (which the generic x86-64 build compiles without FMA contraction).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/launch_kernel.cuh"
#include "cuda/optim_launch.h"

namespace asc::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// Whether element i belongs to a row that moves.
__device__ __forceinline__ bool moves(const RowMask& m, int64_t i) { return !m.mask || m.mask[i / m.row_size]; }

#define ASC_GRID_STRIDE(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Hyper-parameters converted to T on the host exactly as the CPU kernels convert them.
template <class T>
struct SgdConsts {
  T lr, wd, mom, one_minus_damp;
  bool momentum, nesterov, weight_decay, init;
};

template <class T>
__global__ void sgd_kernel(SgdConsts<T> c, T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                           int64_t numel, RowMask mask) {
  ASC_GRID_STRIDE(i, numel) {
    if (!moves(mask, i)) continue;
    T d = g[i];
    if (c.weight_decay) d = add(d, mul(c.wd, p[i]));
    if (c.momentum) {
      const T nb = c.init ? d : add(mul(buf[i], c.mom), mul(c.one_minus_damp, d));
      buf[i] = nb;
      d = c.nesterov ? add(d, mul(c.mom, nb)) : nb;
    }
    p[i] = sub(p[i], mul(c.lr, d));
  }
}

template <class T>
struct AdamConsts {
  T b1, b2, one_minus_b1, one_minus_b2, eps, wd, decay, neg_step_size, bc2_sqrt;
  bool amsgrad, decoupled, weight_decay;
};

template <class T>
__global__ void adam_kernel(AdamConsts<T> c, T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                            T* __restrict__ v, T* __restrict__ vmax, int64_t numel, RowMask mask) {
  ASC_GRID_STRIDE(i, numel) {
    if (!moves(mask, i)) continue;
    T gi = g[i];
    T pi = p[i];
    if (c.weight_decay) {
      if (c.decoupled)
        pi = mul(pi, c.decay);
      else
        gi = add(gi, mul(c.wd, pi));
    }
    const T mi = add(mul(m[i], c.b1), mul(c.one_minus_b1, gi));
    const T vi = add(mul(v[i], c.b2), mul(mul(c.one_minus_b2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    T vd = vi;
    if (c.amsgrad) {
      const T old = vmax[i];
      vd = old < vi ? vi : old;  // std::max(vmax, v)
      vmax[i] = vd;
    }
    const T denom = add(div(sqrt_rn(vd), c.bc2_sqrt), c.eps);
    p[i] = add(pi, mul(c.neg_step_size, div(mi, denom)));
  }
}

template <class T>
struct RmspropConsts {
  T alpha, one_minus_alpha, eps, wd, mom, lr;
  bool centered, momentum, weight_decay;
};

template <class T>
__global__ void rmsprop_kernel(RmspropConsts<T> c, T* __restrict__ p, const T* __restrict__ g, T* __restrict__ sq,
                               T* __restrict__ buf, T* __restrict__ ga, int64_t numel, RowMask mask) {
  ASC_GRID_STRIDE(i, numel) {
    if (!moves(mask, i)) continue;
    T gi = g[i];
    if (c.weight_decay) gi = add(gi, mul(c.wd, p[i]));
    const T si = add(mul(sq[i], c.alpha), mul(mul(c.one_minus_alpha, gi), gi));
    sq[i] = si;
    T avg;
    if (c.centered) {
      const T gai = add(mul(ga[i], c.alpha), mul(c.one_minus_alpha, gi));
      ga[i] = gai;
      avg = add(sqrt_rn(sub(si, mul(gai, gai))), c.eps);
    } else {
      avg = add(sqrt_rn(si), c.eps);
    }
    if (c.momentum) {
      const T nb = add(mul(buf[i], c.mom), div(gi, avg));
      buf[i] = nb;
      p[i] = sub(p[i], mul(c.lr, nb));
    } else {
      p[i] = sub(p[i], mul(c.lr, div(gi, avg)));
    }
  }
}

template <class T>
__global__ void clamp_kernel(T* __restrict__ x, int64_t numel, T lo, T hi) {
  ASC_GRID_STRIDE(i, numel) {
    T v = x[i];
    v = v < lo ? lo : v;  // comparisons with NaN are false: NaN passes through
    x[i] = v > hi ? hi : v;
  }
}

template <class T>
void sgd_as(const SGDKernelArgs& a, void* param, const void* grad, void* buf, int64_t numel, RowMask mask,
            cudaStream_t s) {
  SgdConsts<T> c;
  c.lr = static_cast<T>(a.lr);
  c.wd = static_cast<T>(a.weight_decay);
  c.mom = static_cast<T>(a.momentum);
  c.one_minus_damp = static_cast<T>(1.0 - a.dampening);
  c.momentum = a.momentum != 0;
  c.nesterov = a.nesterov && a.momentum != 0;
  c.weight_decay = a.weight_decay != 0;
  c.init = a.init_buf;
  launch_kernel(sgd_kernel<T>, grid_for(numel, kThreads), kThreads, s, c, static_cast<T*>(param),
                static_cast<const T*>(grad), static_cast<T*>(buf), numel, mask);
}

template <class T>
void adam_as(const AdamKernelArgs& a, void* param, const void* grad, void* m, void* v, void* vmax, int64_t numel,
             RowMask mask, cudaStream_t s) {
  AdamConsts<T> c;
  c.b1 = static_cast<T>(a.beta1);
  c.b2 = static_cast<T>(a.beta2);
  c.one_minus_b1 = static_cast<T>(1.0 - a.beta1);
  c.one_minus_b2 = static_cast<T>(1.0 - a.beta2);
  c.eps = static_cast<T>(a.eps);
  c.wd = static_cast<T>(a.weight_decay);
  c.decay = static_cast<T>(1.0 - a.lr * a.weight_decay);
  c.neg_step_size = static_cast<T>(-(a.lr / a.bias_correction1));
  c.bc2_sqrt = static_cast<T>(std::sqrt(a.bias_correction2));
  c.amsgrad = a.amsgrad;
  c.decoupled = a.decoupled;
  c.weight_decay = a.weight_decay != 0;
  launch_kernel(adam_kernel<T>, grid_for(numel, kThreads), kThreads, s, c, static_cast<T*>(param),
                static_cast<const T*>(grad), static_cast<T*>(m), static_cast<T*>(v), static_cast<T*>(vmax), numel,
                mask);
}

template <class T>
void rmsprop_as(const RMSpropKernelArgs& a, void* param, const void* grad, void* sq, void* buf, void* ga, int64_t numel,
                RowMask mask, cudaStream_t s) {
  RmspropConsts<T> c;
  c.alpha = static_cast<T>(a.alpha);
  c.one_minus_alpha = static_cast<T>(1.0 - a.alpha);
  c.eps = static_cast<T>(a.eps);
  c.wd = static_cast<T>(a.weight_decay);
  c.mom = static_cast<T>(a.momentum);
  c.lr = static_cast<T>(a.lr);
  c.centered = a.centered;
  c.momentum = a.momentum > 0;
  c.weight_decay = a.weight_decay != 0;
  launch_kernel(rmsprop_kernel<T>, grid_for(numel, kThreads), kThreads, s, c, static_cast<T*>(param),
                static_cast<const T*>(grad), static_cast<T*>(sq), static_cast<T*>(buf), static_cast<T*>(ga), numel,
                mask);
}

}  // namespace

cudaError_t launch_sgd_update(const SGDKernelArgs& a, void* param, const void* grad, void* buf, int64_t numel,
                              RowMask mask, bool f64, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (f64)
    sgd_as<double>(a, param, grad, buf, numel, mask, stream);
  else
    sgd_as<float>(a, param, grad, buf, numel, mask, stream);
  return cudaGetLastError();
}

cudaError_t launch_adam_update(const AdamKernelArgs& a, void* param, const void* grad, void* m, void* v, void* vmax,
                               int64_t numel, RowMask mask, bool f64, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (f64)
    adam_as<double>(a, param, grad, m, v, vmax, numel, mask, stream);
  else
    adam_as<float>(a, param, grad, m, v, vmax, numel, mask, stream);
  return cudaGetLastError();
}

cudaError_t launch_rmsprop_update(const RMSpropKernelArgs& a, void* param, const void* grad, void* square_avg,
                                  void* buf, void* grad_avg, int64_t numel, RowMask mask, bool f64,
                                  cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (f64)
    rmsprop_as<double>(a, param, grad, square_avg, buf, grad_avg, numel, mask, stream);
  else
    rmsprop_as<float>(a, param, grad, square_avg, buf, grad_avg, numel, mask, stream);
  return cudaGetLastError();
}

cudaError_t launch_clamp_inplace(void* t, int64_t numel, double lo, double hi, bool f64, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (f64)
    launch_kernel(clamp_kernel<double>, grid_for(numel, kThreads), kThreads, stream, static_cast<double*>(t), numel, lo,
                  hi);
  else
    launch_kernel(clamp_kernel<float>, grid_for(numel, kThreads), kThreads, stream, static_cast<float*>(t), numel,
                  static_cast<float>(lo), static_cast<float>(hi));
  return cudaGetLastError();
}

}  // namespace asc::cuda
