#pragma once
// The data of one query row of fused ASCender attention, which the row's term functions (cuda/ascender_terms.cuh)
// and the kernels (cuda/ascender.cu) share: the row and its head's inputs (QueryRow), its key arrays (RowKeys) and
// small vectors (RowVecs) in shared memory or the workspace, what the forward leaves for the backward (RowState,
// RowStats), and the backward's own arrays and gradients (RowGrads). Plain data and block reductions.
// C++17 and CUDA headers only (included from cuda/ascender.cu, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ascender_launch.h"
#include "cuda/row_kernels.cuh"

namespace asc::cuda::ascender_rows {

using namespace ascender_launch;  // Params, BackwardParams, kMaxDim, kMaxK, kForwardArrays

template <class T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  return rows::row_reduce(v, rows::SumOp{}, red);
}
template <class T>
__device__ __forceinline__ T block_max(T v, T* red) {
  return rows::row_reduce(v, rows::MaxOp{}, red);
}

// An input array of storage type S, read in the compute type (bfloat16 / float16 widen to float32).
template <class S>
struct In {
  const S* p;
  __device__ __forceinline__ auto operator[](int64_t i) const { return rows::to_acc(p[i]); }
};
// Host and device: the launchers build In views for their kernels' arguments too (a __device__-only function called
// from host code compiles, under nvcc, to a stub that exits the program; tools/check_cuda_host_pass.py finds them).
template <class S>
__host__ __device__ __forceinline__ In<S> in(const void* base, int64_t offset) {
  return {static_cast<const S*>(base) + offset};
}

// The row a block works on: query row i of the (batch, head) pair blockIdx.y. The rest is read from the
// parameters where it is used: values held in registers from the forward through to the backward would raise the
// backward kernel's register count.
template <class S>
struct QueryRow {
  using T = rows::acc_t<S>;
  const Params& p;
  int64_t i;
  __device__ __forceinline__ int64_t batch_head() const { return blockIdx.y; }
  __device__ __forceinline__ int64_t batch() const { return batch_head() / p.H; }
  __device__ __forceinline__ int64_t head() const { return batch_head() % p.H; }
  // This head's (T, width) rows of a (B, H, T, width) input: q, k_rot, k, v (width d), z (d_z), e (d_a).
  __device__ __forceinline__ In<S> view(const void* x, int64_t width) const {
    return in<S>(x, batch_head() * p.T * width);
  }
  __device__ __forceinline__ T scal(int s) const { return in<S>(p.scalars, 0)[s * p.H + head()]; }  // row s of (9, H)
  __device__ __forceinline__ bool after() const { return p.after_norm != 0; }  // the gates scale the standardised terms
  __device__ __forceinline__ T om() const { return static_cast<T>(p.omega_scale); }  // ω' = ω omega_scale
};

// A query row's (key) arrays, n entries each: in shared memory for rows up to max_keys, else in this block's slice of
// a global workspace (RowKeys::count arrays of n per block).
template <class T>
struct RowKeys {
  T* s;     // S_base, then S
  T* aff;   // a_ij = ê_i · ê_j
  T* d2;    // |z_i - z_j|²
  T* keep;  // 1 where row i attends to key j
  T* r;     // r_ij = u_i · k̂_j          (raw align = fa r)
  T* rs;    // -f_s w_ij [a_ij - δ]_+      (raw sep)
  T* dc;    // |z_j - c_i|²               (raw coh = fc dc)
  static constexpr int count = kForwardArrays;
  __device__ static RowKeys at(T* base, int64_t n) {
    return {base, base + n, base + 2 * n, base + 3 * n, base + 4 * n, base + 5 * n, base + 6 * n};
  }
};

// The row's small vectors, always in shared memory. No initialisers: a __shared__ variable cannot have a constructor.
template <class T>
struct RowVecs {
  T qi[kMaxDim], ei[kMaxDim], zi[kMaxDim];  // q_i, ê_i, z_i
  T u[kMaxDim];                             // u_i: the neighbourhood's unit heading (alignment)
  T cv[kMaxDim];                            // c_i: the cohesion centroid
  T kinv[kMaxK], topv[kMaxK];               // per neighbour l ∈ N(i): 1 / |k_l|, and its selection score
  int64_t topi[kMaxK];                      // the neighbours' keys, best first
  int top_m;                                // |N(i)|, or -1 when a candidate's score is NaN
  T red[32];                                // the block reductions' slots
};

// The statistics of one raw bias row over its kept entries: β̃_j = scale (x_j - mu), scale = 1 / (σ + eps), or 0 on
// a constant row (σ <= 1e-5 max|x|) and on a row with no kept entry.
template <class T>
struct RowStats {
  T mu, scale;
  double sd, s, count;  // σ, σ + eps, the number of kept entries
  bool constant;
};

// What row_forward leaves besides the shared arrays: the same values in every thread of the block.
template <class T>
struct RowState {
  // alignment
  int m;      // |N(i)|
  T la;       // λ_a γ_align
  T gamma_a;  // γ_align = σ(-α_align (1 - |s / m|²))
  T snorm;    // |s|, s = Σ_{l∈N(i)} k̂_l
  T cdiv;     // m, or 1 over an empty neighbourhood
  T fa;       // raw align = fa r: λ_a γ_align, or 1 after_norm
  // separation
  T ls;        // λ_s η
  T eta, rho;  // η = min(1, ρ / κ), ρ_i = Σ_{kept l≠i} w_il
  // cohesion
  T lc;                    // λ_c γ_coh
  T gamma_c;               // γ_coh = σ(-α_coh Var_i)
  T W, var_c;              // W = Σ_{kept} w' (at least 1e-30), Var_i = Σ w' dc / W
  T fc;                    // raw coh = fc dc: -λ_c γ_coh / τ_coh, or -1 after_norm
  RowStats<T> sa, ss, sc;  // the raw rows' statistics: align, sep, coh
  T mx;                    // max_j S_j / τ over kept keys; -inf: the row keeps no key (A is not set)
};

// What the backward's term functions share: its own row arrays, its small vectors (shared memory) and this head's
// gradients (backward_row forms it after the forward of the row).
template <class S>
struct RowGrads {
  using T = rows::acc_t<S>;
  T* A;                      // (n) the probabilities, row_forward's output
  T* g;                      // (n) the gradient row of the term in hand: A again, which is not read once dS is formed
  T* dS;                     // (n) dL/dS_ij, 0 on masked keys
  T* dd2;                    // (n) dL/d(d²_ij), from separation and cohesion
  T* gyi;                    // (d) dy_i
  T* du;                     // (d) dL/du_i (alignment)
  T* dsv;                    // (d) dL/ds, s = Σ_{l∈N(i)} k̂_l (alignment)
  T* dcv;                    // (dz) dL/dc_i (cohesion)
  In<S> GY;                  // dy (n, d) of this head
  T *dq, *dkr, *dv, *dkhat;  // (n, d) of this head: dq written, the others accumulated
  T *dz, *dehat;             // (n, dz), (n, da), accumulated
  const T *knorm, *enorm;    // |k_j|, |e_j| (n)
  T* dscalars;               // (9, H), accumulated
  int64_t H, h;
  // Adds v — the same in every thread — to the gradient of this head's scalar row s, once per block.
  __device__ __forceinline__ void add_scalar(int s, T v) const {
    if (threadIdx.x == 0) atomicAdd(dscalars + s * H + h, v);
  }

  // A, dS, dd2: the backward's (n) arrays; gyi, du, dsv (d) and dcv (dz): its vectors in shared memory.
  __device__ RowGrads(const BackwardParams& bp, T* A_, T* dS_, T* dd2_, T* gyi_, T* du_, T* dsv_, T* dcv_) {
    A = A_, g = A_, dS = dS_, dd2 = dd2_, gyi = gyi_, du = du_, dsv = dsv_, dcv = dcv_;
    const Params& p = bp.fwd;
    const int64_t n = p.T, d = p.d, bh = blockIdx.y;
    GY = in<S>(bp.gy, bh * n * d);
    dq = static_cast<T*>(bp.dq) + bh * n * d, dkr = static_cast<T*>(bp.dkr) + bh * n * d;
    dv = static_cast<T*>(bp.dv) + bh * n * d, dkhat = static_cast<T*>(bp.dkhat) + bh * n * d;
    dz = static_cast<T*>(bp.dz) + bh * n * p.dz, dehat = static_cast<T*>(bp.dehat) + bh * n * p.da;
    knorm = static_cast<const T*>(bp.knorm) + bh * n, enorm = static_cast<const T*>(bp.enorm) + bh * n;
    dscalars = static_cast<T*>(bp.dscalars), H = p.H, h = bh % H;
  }
};

}  // namespace asc::cuda::ascender_rows
