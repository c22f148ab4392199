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
// afterwards is free.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/format.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/kernels.h"

#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"  // inside the region: gemm_narrow, vec_math.h

namespace asc::cpu {
namespace {

constexpr int64_t kRowBlock = 64;  // query rows per tile

// Element offset of [b, h, t, s] in a tensor viewed as (B, H, T, S) with these strides (0 on broadcast dims).
struct Strides4 {
  int64_t b = 0, h = 0, t = 0, s = 0;
  explicit Strides4(const Tensor& x) : b(x.stride(0)), h(x.stride(1)), t(x.stride(2)), s(x.stride(3)) {}
  Strides4() = default;
  int64_t at(int64_t ib, int64_t ih, int64_t it) const { return ib * b + ih * h + it * t; }
};

// The attention problem with raw pointers: q/k/v/o (B, H, T|S, D), mask/bias (B, H, T, S) views (either may be
// absent), per-row log-sum-exp `lse` (B, H, T) contiguous.
template <class T>
struct Problem {
  int64_t B, H, Tq, S, D;
  const T *q, *k, *v;
  Strides4 sq, sk, sv;
  const bool* mask = nullptr;
  Strides4 sm;
  const T* bias = nullptr;
  Strides4 sb;
  bool causal;
  T scale;

  Problem(const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& m, const Tensor& bi, bool c, double sc)
      : B(q_.size(0)),
        H(q_.size(1)),
        Tq(q_.size(2)),
        S(k_.size(2)),
        D(q_.size(3)),
        q(q_.data_ptr<T>()),
        k(k_.data_ptr<T>()),
        v(v_.data_ptr<T>()),
        sq(q_),
        sk(k_),
        sv(v_),
        causal(c),
        scale(static_cast<T>(sc)) {
    if (m.defined()) mask = m.data_ptr<bool>(), sm = Strides4(m);
    if (bi.defined()) bias = bi.data_ptr<T>(), sb = Strides4(bi);
  }

  // Keys a block of query rows [t0, t0 + rows) can see: with `causal`, none past the last row's causal limit, so
  // the tiles (and every GEMM) stop there.
  int64_t keys_for(int64_t t0, int64_t rows) const {
    return causal ? std::clamp<int64_t>(t0 + rows + (S - Tq), 0, S) : S;
  }

  // Row t of a tile of raw scores q·k over keys [0, n) becomes x = score · scale + bias, or -inf where the key is
  // not kept. Returns the row's max (with_max; else -inf: the backward has the log-sum-exp). Each pass is a plain
  // loop over the row (vectorised); the row is in L1.
  ASC_ALWAYS_INLINE T prepare_row(int64_t b, int64_t h, int64_t t, T* x, int64_t n, bool with_max = true) const {
    const T ninf = -std::numeric_limits<T>::infinity();
    const T sc = scale;
    for (int64_t s = 0; s < n; ++s) x[s] *= sc;
    if (bias) {
      const T* brow = bias + sb.at(b, h, t);
      if (sb.s == 1) {
        for (int64_t s = 0; s < n; ++s) x[s] += brow[s];
      } else {
        for (int64_t s = 0; s < n; ++s) x[s] += brow[s * sb.s];
      }
    }
    const int64_t last = causal ? std::clamp<int64_t>(t + (S - Tq) + 1, 0, n) : n;  // keys s < last pass
    for (int64_t s = last; s < n; ++s) x[s] = ninf;
    if (mask) {
      const bool* mrow = mask + sm.at(b, h, t);
      const int64_t ms = sm.s;
      if (ms == 1) {  // a mask row of consecutive keys (key padding, a (T, S) mask): the select vectorises
        const auto* keep = reinterpret_cast<const unsigned char*>(mrow);
        for (int64_t s = 0; s < last; ++s) {
          const T y = x[s];  // both operands read first: a load under the condition keeps the loop scalar
          x[s] = keep[s] ? y : ninf;
        }
      } else {
        for (int64_t s = 0; s < last; ++s) x[s] = mrow[s * ms] ? x[s] : ninf;
      }
    }
    return with_max ? row_max(x, n) : ninf;
  }
};

// Rows [0, n) of a (n, D) operand with contiguous columns: x itself when it has them (ld = its row stride), else a
// packed copy in buf, grown on first use (ld = D).
template <class T>
ASC_ALWAYS_INLINE const T* unit_rows(const T* x, int64_t st, int64_t sd, int64_t n, int64_t D, Scratch<T>& buf,
                                     int64_t& ld) {
  if (sd == 1) {
    ld = st;
    return x;
  }
  if (buf.size() < static_cast<size_t>(n * D)) buf.resize(static_cast<size_t>(n * D));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < D; ++c) buf[j * D + c] = x[j * st + c * sd];
  ld = D;
  return buf.data();
}

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
    const T m = p.prepare_row(b, h, t0 + r, x, n);
    T* l = lse + (bh * p.Tq + t0 + r);
    if (m == -std::numeric_limits<T>::infinity()) {
      // The max skips NaN: a row of NaN scores (a NaN query, say) lands here too and must give NaN, as in
      // PyTorch. prepare_row set every key not kept to -inf, so a NaN left in x is a kept score.
      bool nan = false;
      for (int64_t s = 0; s < n; ++s) nan |= x[s] != x[s];
      if (nan) {
        for (int64_t s = 0; s < n; ++s) x[s] = x[s] != x[s] ? x[s] : T(0);  // P·V then gives NaN
        *l = std::numeric_limits<T>::quiet_NaN();
      } else {  // no key kept (or all -inf): a zero row
        std::fill(x, x + n, T(0));
        *l = m;
      }
      continue;
    }
    for (int64_t s = 0; s < n; ++s) x[s] = exp_nonpos(x[s] - m);
    const T sum = row_sum(x, n);  // a second pass over the row in L1 costs less than a reduction's scalar tail
    const T inv = T(1) / sum;
    for (int64_t s = 0; s < n; ++s) x[s] *= inv;
    *l = m + std::log(sum);
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
  const T ninf = -std::numeric_limits<T>::infinity();
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
    for (int64_t r = 0; r < rows; ++r) {
      T* x = prob + r * ldp;
      p.prepare_row(b, h, t0 + r, x, n, /*with_max=*/false);
      const T l = lse[bh * Tq + t0 + r];
      if (l == ninf) {
        std::fill(x, x + n, T(0));
      } else {
        for (int64_t s = 0; s < n; ++s) {
          const T z = x[s] - l;  // <= 0 up to rounding: lse >= every kept score; NaN stays NaN
          x[s] = exp_nonpos(z > T(0) ? T(0) : z);
        }
      }
    }
    // delta_t = rowsum(dO ∘ O): 16 float rows at a time at x86-64-v4 where both have contiguous columns (one dot per
    // row ends in a chain of scalar adds as long as its vector: a tenth of this kernel's time at D = 32)
    const T* o0 = o + so.at(b, h, t0);
    int64_t r = 0;
    if constexpr (kIsa == CpuIsa::x86_64_v4)
      if (sg.s == 1 && so.s == 1 && D >= 64 / static_cast<int64_t>(sizeof(T)))
        for (constexpr int64_t L = 64 / sizeof(T); r + L <= rows; r += L)
          row_dots_lanes(g0 + r * sg.t, sg.t, o0 + r * so.t, so.t, D, w.delta.data() + r);
    for (; r < rows; ++r) {
      const T* orow = o0 + r * so.t;
      const T* grow = g0 + r * sg.t;
      T d = 0;
      for (int64_t c = 0; c < D; ++c) d += grow[c * sg.s] * orow[c * so.s];
      w.delta[r] = d;
    }
    // dV[0:n] (n, D) += Pᵀ dO   (Pᵀ read through strides: sam = 1, sak = ldp)
    int64_t ldg = 0;
    const T* gr = unit_rows(g0, sg.t, sg.s, rows, D, w.grows, ldg);
    gemm_narrow_blocked<T, kIsa>(n, D, rows, prob, 1, ldp, gr, ldg, dv_bh, D, true);
    // dP (rows, n) = dO Vᵀ
    gemm_narrow_blocked<T, kIsa>(rows, n, D, g0, sg.t, sg.s, w.vt.data(), ldt, dprob, ldp);
    // dS = scale · P ∘ (dP - delta), in place of dP
    for (int64_t r = 0; r < rows; ++r) {
      const T* pr = prob + r * ldp;
      T* dr = dprob + r * ldp;
      const T dl = w.delta[r], sc = p.scale;
      for (int64_t s = 0; s < n; ++s) dr[s] = sc * pr[s] * (dr[s] - dl);
    }
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
  ASC_DISPATCH_FLOAT(q.dtype(), "scaled_dot_product_attention",
                     [&] { forward_impl<scalar_t>(q, k, v, keep_mask, bias, causal, scale, o, stats); });
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                   const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  ASC_DISPATCH_FLOAT(q.dtype(), "scaled_dot_product_attention backward", [&] {
    backward_impl<scalar_t>(q, k, v, keep_mask, bias, o, dout, stats, causal, scale, dq, dk, dv);
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
