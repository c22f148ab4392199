// CPU kernels of scaled-dot-product attention (ops/attention.h), flash-attention style: per (batch, head, block of
// query rows) the scores live in a (rows, S) tile made by one GEMM, are scaled, biased, masked and softmaxed in
// place, and multiplied by V with a second GEMM, so memory is O(rows · S) per thread instead of O(T · S). The
// backward recomputes each tile from the saved log-sum-exp:
//   P = exp(S·scale + bias - lse) on kept keys;   dV += Pᵀ dO;   dP = dO Vᵀ;   dS = P ∘ (dP - rowsum(dO ∘ O))
//   dQ = scale · dS K;                            dK += scale · dSᵀ Q
// Q and dO are read through their strides (a (B, T, H, D) projection viewed as (B, H, T, D) costs no copy); K and V
// are copied transposed, (D, S) per head, so that the products over keys read contiguous columns. Every product
// is small_gemm.h's register-blocked kernel: with D the short dimension (32-64) OpenBLAS spends more time packing
// than multiplying. The output is allocated heads-last, (B, T, H, D) viewed as (B, H, T, D), so merging the heads
// afterwards is free. Under CpuAutocast (a Bf16ProductsScope around the kernel call) float32 attention runs the
// bfloat16 kernels of ops/cpu/attention_bf16.cpp instead: the same tiles and row passes, the products in bfloat16.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/format.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/kernels.h"

#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"  // inside the region: gemm_narrow, vec_math.h
//
#include "ops/cpu/attention_tiles.h"  // Problem and the row passes, shared with the bfloat16 kernels

namespace asc::cpu {
namespace {

using sdpa::kRowBlock;
using sdpa::Problem;
using sdpa::Strides4;
using sdpa::unit_rows;

// One thread's tiles: scores / probabilities and their gradient (rows, S), Kᵀ and Vᵀ (D, S), and packed rows for
// operands whose columns are not contiguous (K, V: (S, D); a block of Q, dO or O: (rows, D); empty until needed).
template <class T>
struct Workspace {
  Scratch<T> prob, dprob, kt, vt, krows, vrows, qrows, grows, orows;
  std::vector<T> delta;
  int64_t kt_head = -1;  // the head whose Kᵀ is in kt (the forward's row blocks of one head share it)
  Workspace(int64_t rows, int64_t S, int64_t D, bool backward)
      : prob(static_cast<size_t>(rows * (backward ? transposed_ld(S) : S))),
        kt(static_cast<size_t>(D * transposed_ld(S))) {
    if (!backward) return;
    dprob.resize(prob.size()), vt.resize(kt.size()), delta.resize(static_cast<size_t>(rows));
  }
};

// Query rows [t0, t0 + rows) of head bh: O = softmax(Q Kᵀ · scale + bias, masked) V and each row's log-sum-exp.
// Every product is gemm_narrow's (D is the short dimension; OpenBLAS spends more on packing these than multiplying).
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void forward_block(const Problem<T>& p, int64_t bh, int64_t t0, int64_t rows, Workspace<T>& w, T* o,
                                     const Strides4& so, T* lse) {
  const int64_t b = bh / p.H, h = bh % p.H, D = p.D;
  const int64_t n = p.keys_for(t0, rows);
  T* tile = w.prob.data();  // (rows, n)
  const int64_t ldk = transposed_ld(p.S);
  if (w.kt_head != bh) {  // Kᵀ (D, S) of this head, once per run of its row blocks
    transpose_rows<T, kIsa>(p.k + p.sk.at(b, h, 0), p.sk.t, p.sk.s, p.S, D, w.kt.data(), ldk);
    w.kt_head = bh;
  }
  gemm_narrow_blocked<T, kIsa>(rows, n, D, p.q + p.sq.at(b, h, t0), p.sq.t, p.sq.s, w.kt.data(), ldk, tile, n);
  for (int64_t r = 0; r < rows; ++r) {
    T* x = tile + r * n;
    const T inv = p.exp_row(b, h, t0 + r, x, n, lse + (bh * p.Tq + t0 + r));
    for (int64_t s = 0; s < n; ++s) x[s] *= inv;
  }
  // O[b, h, t0:t0+rows] (rows, D) = P V[b, h, 0:n]
  int64_t ldv = 0;
  const T* vr = unit_rows(p.v + p.sv.at(b, h, 0), p.sv.t, p.sv.s, n, D, w.vrows, ldv);
  T* o0 = o + so.at(b, h, t0);
  if (so.s == 1) {
    gemm_narrow_blocked<T, kIsa>(rows, D, n, tile, n, 1, vr, ldv, o0, so.t);
  } else {
    if (w.orows.size() < static_cast<size_t>(rows * D)) w.orows.resize(static_cast<size_t>(rows * D));
    gemm_narrow_blocked<T, kIsa>(rows, D, n, tile, n, 1, vr, ldv, w.orows.data(), D);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < D; ++c) o0[r * so.t + c * so.s] = w.orows[r * D + c];
  }
}

template <class T>
void forward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& mask, const Tensor& bias,
                  bool causal, double scale, Tensor& o, Tensor& stats) {
  const Problem<T> p(qt, kt, vt, mask, bias, causal, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D;
  T* op = o.data_ptr<T>();
  T* lse = stats.data_ptr<T>();
  const Strides4 so(o);
  const int64_t blocks = (Tq + kRowBlock - 1) / kRowBlock;
  parallel_for(B * H * blocks, std::min(Tq, kRowBlock) * S * D, [&](int64_t i0, int64_t i1) {
    Workspace<T> w(std::min(Tq, kRowBlock), S, D, /*backward=*/false);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t0 = (item % blocks) * kRowBlock;
      ASC_CPU_DISPATCH(forward_block<kIsa>(p, item / blocks, t0, std::min(kRowBlock, Tq - t0), w, op, so, lse));
    }
  });
}

// Head bh's gradients: dQ of its rows, dK and dV accumulated over its row blocks (from zero).
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void backward_head(const Problem<T>& p, int64_t bh, const T* o, const Strides4& so, const T* g,
                                     const Strides4& sg, const T* lse, T* dq, T* dk_bh, T* dv_bh, Workspace<T>& w) {
  const int64_t b = bh / p.H, h = bh % p.H, Tq = p.Tq, S = p.S, D = p.D;
  const T* kh = p.k + p.sk.at(b, h, 0);
  // The head's keys and values once: Kᵀ, Vᵀ (D, S) for the products over keys, K with contiguous columns for dQ.
  const int64_t ldt = transposed_ld(S);
  transpose_rows<T, kIsa>(kh, p.sk.t, p.sk.s, S, D, w.kt.data(), ldt);
  transpose_rows<T, kIsa>(p.v + p.sv.at(b, h, 0), p.sv.t, p.sv.s, S, D, w.vt.data(), ldt);
  int64_t ldk = 0;
  const T* kr = unit_rows(kh, p.sk.t, p.sk.s, S, D, w.krows, ldk);
  T *prob = w.prob.data(), *dprob = w.dprob.data();
  for (int64_t t0 = 0; t0 < Tq; t0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, Tq - t0), n = p.keys_for(t0, rows);
    // P and dS are read down their columns too (Pᵀ dO, dSᵀ Q): rows ldp apart, off powers of two (transposed_ld)
    const int64_t ldp = transposed_ld(n);
    const T* q0 = p.q + p.sq.at(b, h, t0);
    const T* g0 = g + sg.at(b, h, t0);
    // P (rows, n), recomputed from the saved log-sum-exp; dead rows (lse = -inf) stay 0.
    gemm_narrow_blocked<T, kIsa>(rows, n, D, q0, p.sq.t, p.sq.s, w.kt.data(), ldt, prob, ldp);
    for (int64_t r = 0; r < rows; ++r) p.probabilities_row(b, h, t0 + r, prob + r * ldp, n, lse[bh * Tq + t0 + r]);
    sdpa::row_deltas<kIsa>(g0, sg, o + so.at(b, h, t0), so, rows, D, w.delta.data());
    // dV[0:n] (n, D) += Pᵀ dO   (Pᵀ read through strides: sam = 1, sak = ldp)
    int64_t ldg = 0;
    const T* gr = unit_rows(g0, sg.t, sg.s, rows, D, w.grows, ldg);
    gemm_narrow_blocked<T, kIsa>(n, D, rows, prob, 1, ldp, gr, ldg, dv_bh, D, true);
    // dP (rows, n) = dO Vᵀ
    gemm_narrow_blocked<T, kIsa>(rows, n, D, g0, sg.t, sg.s, w.vt.data(), ldt, dprob, ldp);
    sdpa::scores_grad(prob, dprob, ldp, rows, n, w.delta.data(), p.scale);  // dS in place of dP
    // dQ (rows, D) = dS K[0:n];  dK[0:n] (n, D) += dSᵀ Q
    gemm_narrow_blocked<T, kIsa>(rows, D, n, dprob, ldp, 1, kr, ldk, dq + (bh * Tq + t0) * D, D);
    int64_t ldq = 0;
    const T* qr = unit_rows(q0, p.sq.t, p.sq.s, rows, D, w.qrows, ldq);
    gemm_narrow_blocked<T, kIsa>(n, D, rows, dprob, 1, ldp, qr, ldq, dk_bh, D, true);
  }
}

template <class T>
void backward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& mask, const Tensor& bias,
                   const Tensor& ot, const Tensor& gt, const Tensor& stats, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  const Problem<T> p(qt, kt, vt, mask, bias, causal, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D;
  cpu::fill(dk, 0.0), cpu::fill(dv, 0.0);  // both accumulate over the row blocks (this backend's fill kernel)
  const T* o = ot.data_ptr<T>();
  const T* g = gt.data_ptr<T>();
  const T* lse = stats.data_ptr<T>();
  const Strides4 so(ot), sg(gt);
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  // One (batch, head) per task: dK and dV of a head accumulate over all of its row blocks.
  parallel_for(B * H, Tq * S * D, [&](int64_t i0, int64_t i1) {
    Workspace<T> w(std::min(Tq, kRowBlock), S, D, /*backward=*/true);
    for (int64_t bh = i0; bh < i1; ++bh)
      ASC_CPU_DISPATCH(backward_head<kIsa>(p, bh, o, so, g, sg, lse, dqp, dkp + bh * S * D, dvp + bh * S * D, w));
  });
}

}  // namespace

void sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                      bool causal, bool needs_backward, std::string& why, std::string& engine) {
  why.clear();
  engine = "CPU";
  if (q.dtype() != kFloat32 && q.dtype() != kFloat64)
    why = fmt::format("dtype {} (the CPU kernel computes in float32 / float64)", q.dtype());
}

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                  bool causal, bool /*needs_backward*/, double scale, Tensor& o, Tensor& stats) {
  if (bf16_products() && q.dtype() == kFloat32)  // under CpuAutocast (ops/attention.cpp)
    return sdpa_forward_bf16(q, k, v, keep_mask, bias, causal, scale, o, stats);
  ASC_DISPATCH_FLOAT(q.dtype(), "scaled_dot_product_attention",
                     [&] { forward_impl<scalar_t>(q, k, v, keep_mask, bias, causal, scale, o, stats); });
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                   const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  if (bf16_products() && q.dtype() == kFloat32)
    return sdpa_backward_bf16(q, k, v, keep_mask, bias, o, dout, stats, causal, scale, dq, dk, dv);
  ASC_DISPATCH_FLOAT(q.dtype(), "scaled_dot_product_attention backward", [&] {
    backward_impl<scalar_t>(q, k, v, keep_mask, bias, o, dout, stats, causal, scale, dq, dk, dv);
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
