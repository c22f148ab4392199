// CPU kernels of scaled-dot-product attention with bfloat16 products (what scaled_dot_product_attention runs on
// float32 CPU inputs under CpuAutocast, as torch.autocast("cpu") runs it in bfloat16): the tiles and row passes of
// ops/cpu/attention.cpp (attention_tiles.h), with every product's operands rounded to bfloat16 and multiplied by
// AVX512-BF16's vdpbf16ps with float32 sums (ops/cpu/bf16_pairs.h). Where the operands are rounded is where
// matmul_bf16 would round them in the composed ops — Q, K, V and the probabilities P in the forward; dO, P, V, dS,
// K and Q in the backward —, and everything between the products stays float32: scores, softmax, log-sum-exp,
// delta = rowsum(dO ∘ O) and dS = scale · P ∘ (dP - delta). Outputs and gradients are float32.
//
// Each product's operands as pair words (bf16_pairs.h: pairs along the product's inner dimension):
//   forward   S = Q Kᵀ     Q by columns (rows, ⌈D/2⌉)          Kᵀ (⌈D/2⌉, S) per head
//             O = P V      P by columns (rows, ⌈n/2⌉), packed   V by pairs of keys (⌈S/2⌉, D) per head
//                          as the softmax normalises its row
//   backward  P = Q Kᵀ     as the forward (recomputed from the saved log-sum-exp)
//             dV += Pᵀ dO  P by pairs of rows (⌈rows/2⌉, n),   dO by pairs of rows (⌈rows/2⌉, D)
//                          read as Pᵀ (sai = 1)
//             dP = dO Vᵀ   dO by columns (rows, ⌈D/2⌉)         Vᵀ (⌈D/2⌉, S) per head
//             dQ = dS K    dS by columns (rows, ⌈n/2⌉)         K by pairs of keys (⌈S/2⌉, D) per head
//             dK += dSᵀ Q  dS by pairs of rows, read as dSᵀ    Q by pairs of rows (⌈rows/2⌉, D)
// The kernels (between the target pragmas) are compiled for x86-64-v4 with AVX512-BF16, whatever ASC_CPU_ISA caps the
// float32 kernels to (as the bfloat16 linear products run oneDNN's AVX512-BF16 / AMX kernels); the entry points,
// compiled for the baseline, check the processor first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/kernels.h"

#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"  // inside the region: vec_math.h, transpose_rows
//
#include "ops/cpu/attention_tiles.h"  // Problem and the row passes

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ASC_SDPA_BF16 1
#pragma GCC push_options  // popped after the kernels
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#include "ops/cpu/bf16_pairs.h"  // in the region: compiled for x86-64-v4 with AVX512-BF16
#endif

namespace asc::cpu {

#ifdef ASC_SDPA_BF16
namespace {

using sdpa::kRowBlock;
using sdpa::Problem;
using sdpa::Strides4;
using sdpa::unit_rows;
namespace bp = bf16_pairs;

// One thread's tiles: the float32 scores / probabilities and their gradient (rows, S); per head K and V with
// contiguous columns (copies where theirs are strided), Kᵀ and Vᵀ as pair words (⌈D/2⌉, ldt) and K, V by pairs of
// keys (⌈S/2⌉, D); per block Q and dO by columns and by pairs of rows, P and dS by columns and by pairs of rows.
struct Workspace {
  Scratch<float> prob, dprob, krows, vrows, qrows, grows, orows;
  Scratch<uint32_t> kt, vt, kp, vp, qa, qb, ga, gb, pa, pb, words;
  std::vector<float> delta;
  int64_t head = -1;  // the head whose keys and values are packed (the forward's row blocks of one head share them)
  Workspace(int64_t rows, int64_t S, int64_t D, bool backward)
      : prob(static_cast<size_t>(rows * S)),
        kt(static_cast<size_t>((D + 1) / 2 * transposed_ld(S))),
        qa(static_cast<size_t>(rows * ((D + 1) / 2))),
        pa(static_cast<size_t>(rows * ((S + 1) / 2))) {
    if (!backward) {
      vp.resize(static_cast<size_t>((S + 1) / 2 * D));
      return;
    }
    dprob.resize(prob.size()), vt.resize(kt.size()), kp.resize(static_cast<size_t>((S + 1) / 2 * D));
    const auto pairs_of_rows = static_cast<size_t>((rows + 1) / 2);
    qb.resize(pairs_of_rows * D), ga.resize(qa.size()), gb.resize(qb.size()), pb.resize(pairs_of_rows * S);
    delta.resize(static_cast<size_t>(rows));
  }
};

// Query rows [t0, t0 + rows) of head bh: O = softmax(Q Kᵀ · scale + bias, masked) V and each row's log-sum-exp.
void forward_block(const Problem<float>& p, int64_t bh, int64_t t0, int64_t rows, Workspace& w, float* o,
                   const Strides4& so, float* lse) {
  const int64_t b = bh / p.H, h = bh % p.H, D = p.D, S = p.S, dp = (D + 1) / 2, sp = (S + 1) / 2;
  const int64_t n = p.keys_for(t0, rows), ldt = transposed_ld(S);
  if (w.head != bh) {  // Kᵀ and V by pairs of keys, once per run of the head's row blocks
    int64_t ldk = 0, ldv = 0;
    const float* kr = unit_rows(p.k + p.sk.at(b, h, 0), p.sk.t, p.sk.s, S, D, w.krows, ldk);
    const float* vr = unit_rows(p.v + p.sv.at(b, h, 0), p.sv.t, p.sv.s, S, D, w.vrows, ldv);
    bp::pack_bt(kr, ldk, S, D, w.kt.data(), ldt, w.words);
    bp::pack_b(vr, ldv, S, D, w.vp.data(), D);
    w.head = bh;
  }
  int64_t ldq = 0;
  const float* qr = unit_rows(p.q + p.sq.at(b, h, t0), p.sq.t, p.sq.s, rows, D, w.qrows, ldq);
  bp::pack_a(qr, ldq, rows, D, w.qa.data(), dp);
  float* tile = w.prob.data();  // (rows, n)
  bp::gemm_pairs(rows, n, D, w.qa.data(), dp, 1, w.kt.data(), ldt, tile, n);
  for (int64_t r = 0; r < rows; ++r) {  // each row normalised as it is rounded into P's words
    float* x = tile + r * n;
    const float inv = p.exp_row(b, h, t0 + r, x, n, lse + (bh * p.Tq + t0 + r));
    bp::pack_row(x, n, w.pa.data() + r * sp, inv);
  }
  // O[b, h, t0:t0+rows] (rows, D) = P V[b, h, 0:n]
  float* o0 = o + so.at(b, h, t0);
  if (so.s == 1) {
    bp::gemm_pairs(rows, D, n, w.pa.data(), sp, 1, w.vp.data(), D, o0, so.t);
  } else {
    if (w.orows.size() < static_cast<size_t>(rows * D)) w.orows.resize(static_cast<size_t>(rows * D));
    bp::gemm_pairs(rows, D, n, w.pa.data(), sp, 1, w.vp.data(), D, w.orows.data(), D);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < D; ++c) o0[r * so.t + c * so.s] = w.orows[r * D + c];
  }
}

// Head bh's gradients: dQ of its rows, dK and dV accumulated over its row blocks (from zero).
void backward_head(const Problem<float>& p, int64_t bh, const float* o, const Strides4& so, const float* g,
                   const Strides4& sg, const float* lse, float* dq, float* dk_bh, float* dv_bh, Workspace& w) {
  const int64_t b = bh / p.H, h = bh % p.H, Tq = p.Tq, S = p.S, D = p.D, dp = (D + 1) / 2, sp = (S + 1) / 2;
  const int64_t ldt = transposed_ld(S);
  // The head's keys and values once: Kᵀ, Vᵀ for the products over D, K by pairs of keys for dQ.
  int64_t ldk = 0, ldv = 0;
  const float* kr = unit_rows(p.k + p.sk.at(b, h, 0), p.sk.t, p.sk.s, S, D, w.krows, ldk);
  const float* vr = unit_rows(p.v + p.sv.at(b, h, 0), p.sv.t, p.sv.s, S, D, w.vrows, ldv);
  bp::pack_bt(kr, ldk, S, D, w.kt.data(), ldt, w.words);
  bp::pack_bt(vr, ldv, S, D, w.vt.data(), ldt, w.words);
  bp::pack_b(kr, ldk, S, D, w.kp.data(), D);
  float *prob = w.prob.data(), *dprob = w.dprob.data();
  for (int64_t t0 = 0; t0 < Tq; t0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, Tq - t0), n = p.keys_for(t0, rows);
    int64_t ldq = 0, ldg = 0;
    const float* qr = unit_rows(p.q + p.sq.at(b, h, t0), p.sq.t, p.sq.s, rows, D, w.qrows, ldq);
    const float* g0 = g + sg.at(b, h, t0);
    const float* gr = unit_rows(g0, sg.t, sg.s, rows, D, w.grows, ldg);
    bp::pack_a(qr, ldq, rows, D, w.qa.data(), dp), bp::pack_b(qr, ldq, rows, D, w.qb.data(), D);
    bp::pack_a(gr, ldg, rows, D, w.ga.data(), dp), bp::pack_b(gr, ldg, rows, D, w.gb.data(), D);
    // P (rows, n), recomputed from the saved log-sum-exp; dead rows (lse = -inf) stay 0.
    bp::gemm_pairs(rows, n, D, w.qa.data(), dp, 1, w.kt.data(), ldt, prob, n);
    for (int64_t r = 0; r < rows; ++r) p.probabilities_row(b, h, t0 + r, prob + r * n, n, lse[bh * Tq + t0 + r]);
    sdpa::row_deltas<CpuIsa::x86_64_v4>(g0, sg, o + so.at(b, h, t0), so, rows, D, w.delta.data());
    // dV[0:n] (n, D) += Pᵀ dO
    bp::pack_b(prob, n, rows, n, w.pb.data(), n);
    bp::gemm_pairs(n, D, rows, w.pb.data(), 1, n, w.gb.data(), D, dv_bh, D, true);
    // dP (rows, n) = dO Vᵀ, then dS in its place
    bp::gemm_pairs(rows, n, D, w.ga.data(), dp, 1, w.vt.data(), ldt, dprob, n);
    sdpa::scores_grad(prob, dprob, n, rows, n, w.delta.data(), p.scale);
    // dQ (rows, D) = dS K[0:n];  dK[0:n] (n, D) += dSᵀ Q
    bp::pack_a(dprob, n, rows, n, w.pa.data(), sp);
    bp::gemm_pairs(rows, D, n, w.pa.data(), sp, 1, w.kp.data(), D, dq + (bh * Tq + t0) * D, D);
    bp::pack_b(dprob, n, rows, n, w.pb.data(), n);
    bp::gemm_pairs(n, D, rows, w.pb.data(), 1, n, w.qb.data(), D, dk_bh, D, true);
  }
}

}  // namespace
#pragma GCC pop_options  // the entry points below run on any processor: they check it first
#endif                   // ASC_SDPA_BF16

namespace {
void check_processor(const char* who) {
#ifdef ASC_SDPA_BF16
  // the kernels are compiled for x86-64-v4 with AVX512-BF16 (every processor with AVX512-BF16 has the rest)
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  ASC_CHECK(v4 && __builtin_cpu_supports("avx512bf16"),
            "{}: bfloat16 products need AVX-512 with AVX512-BF16, which this processor lacks", who);
#else
  ASC_CHECK(false, "{}: this build has no bfloat16 attention kernels (x86-64 with GCC only)", who);
#endif
}
}  // namespace

void sdpa_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                       bool causal, double scale, Tensor& o, Tensor& stats) {
  check_processor("scaled_dot_product_attention (bfloat16)");
#ifdef ASC_SDPA_BF16
  const Problem<float> p(q, k, v, keep_mask, bias, causal, scale);
  const int64_t blocks = (p.Tq + kRowBlock - 1) / kRowBlock;
  float* op = o.data_ptr<float>();
  float* lse = stats.data_ptr<float>();
  const Strides4 so(o);
  parallel_for(p.B * p.H * blocks, std::min(p.Tq, kRowBlock) * p.S * p.D, [&](int64_t i0, int64_t i1) {
    Workspace w(std::min(p.Tq, kRowBlock), p.S, p.D, /*backward=*/false);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t0 = (item % blocks) * kRowBlock;
      forward_block(p, item / blocks, t0, std::min(kRowBlock, p.Tq - t0), w, op, so, lse);
    }
  });
#endif
}

void sdpa_backward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                        const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  check_processor("scaled_dot_product_attention backward (bfloat16)");
#ifdef ASC_SDPA_BF16
  const Problem<float> p(q, k, v, keep_mask, bias, causal, scale);
  cpu::fill(dk, 0.0), cpu::fill(dv, 0.0);  // both accumulate over the row blocks
  const float* op = o.data_ptr<float>();
  const float* g = dout.data_ptr<float>();
  const float* lse = stats.data_ptr<float>();
  const Strides4 so(o), sg(dout);
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  const int64_t S = p.S, D = p.D;
  parallel_for(p.B * p.H, p.Tq * S * D, [&](int64_t i0, int64_t i1) {
    Workspace w(std::min(p.Tq, kRowBlock), S, D, /*backward=*/true);
    for (int64_t bh = i0; bh < i1; ++bh)
      backward_head(p, bh, op, so, g, sg, lse, dqp, dkp + bh * S * D, dvp + bh * S * D, w);
  });
#endif
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
