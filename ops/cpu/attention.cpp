// CPU kernels of scaled-dot-product attention (ops/attention.h), flash-attention style: per (batch, head, block of
// query rows) the scores live in a (rows, S) tile made by one GEMM, are scaled, biased, masked and softmaxed in
// place, and multiplied by V with a second GEMM, so memory is O(rows · S) per thread instead of O(T · S). The
// backward recomputes each tile from the saved log-sum-exp:
//   P = exp(S·scale + bias - lse) on kept keys;   dV += Pᵀ dO;   dP = dO Vᵀ;   dS = P ∘ (dP - rowsum(dO ∘ O))
//   dQ = scale · dS K;                            dK += scale · dSᵀ Q
// Operands keep their strides (a (B, T, H, D) projection viewed as (B, H, T, D) costs no copy); the output is
// allocated heads-last, (B, T, H, D) viewed as (B, H, T, D), so merging the heads afterwards is free.
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

#include "ops/cpu/vec_math.h"

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
  // not kept. Returns the row's max. Each pass is a plain loop over the row (vectorised); the row is in L1.
  T prepare_row(int64_t b, int64_t h, int64_t t, T* x, int64_t n) const {
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
      for (int64_t s = 0; s < last; ++s) x[s] = mrow[s * ms] ? x[s] : ninf;
    }
    T m = ninf;
    ASC_SIMD_REDUCE(max, m)
    for (int64_t s = 0; s < n; ++s) m = x[s] > m ? x[s] : m;
    return m;
  }

  // tile (rows, n) = Q[b, h, t0:t0+rows] Kᵀ[b, h, 0:n]
  void scores(int64_t b, int64_t h, int64_t t0, int64_t rows, int64_t n, T* tile) const {
    gemm<T>(rows, n, D, q + sq.at(b, h, t0), sq.t, sq.s, k + sk.at(b, h, 0), sk.s, sk.t, tile, n);
  }
};

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
    Scratch<T> tile(static_cast<size_t>(std::min(Tq, kRowBlock) * S));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t bh = item / blocks, b = bh / H, h = bh % H;
      const int64_t t0 = (item % blocks) * kRowBlock, rows = std::min(kRowBlock, Tq - t0);
      const int64_t n = p.keys_for(t0, rows);
      p.scores(b, h, t0, rows, n, tile.data());
      for (int64_t r = 0; r < rows; ++r) {
        T* x = tile.data() + r * n;
        const T m = p.prepare_row(b, h, t0 + r, x, n);
        T* l = lse + (bh * Tq + t0 + r);
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
        T sum = 0;
        ASC_SIMD_REDUCE(+, sum)
        for (int64_t s = 0; s < n; ++s) {
          const T e = exp_nonpos(x[s] - m);
          x[s] = e;
          sum += e;
        }
        const T inv = T(1) / sum;
        for (int64_t s = 0; s < n; ++s) x[s] *= inv;
        *l = m + std::log(sum);
      }
      // O[b, h, t0:t0+rows] = P V[b, h, 0:n]
      gemm<T>(rows, D, n, tile.data(), n, 1, p.v + p.sv.at(b, h, 0), p.sv.t, p.sv.s, op + so.at(b, h, t0), so.t);
    }
  });
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
  const T ninf = -std::numeric_limits<T>::infinity();
  // One (batch, head) per task: dK and dV of a head accumulate over all of its row blocks.
  parallel_for(B * H, Tq * S * D, [&](int64_t i0, int64_t i1) {
    const int64_t rows_max = std::min(Tq, kRowBlock);
    Scratch<T> prob(static_cast<size_t>(rows_max * S)), dprob(static_cast<size_t>(rows_max * S));
    std::vector<T> delta(static_cast<size_t>(rows_max));
    for (int64_t bh = i0; bh < i1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      T* dk_bh = dkp + bh * S * D;
      T* dv_bh = dvp + bh * S * D;
      for (int64_t t0 = 0; t0 < Tq; t0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, Tq - t0), n = p.keys_for(t0, rows);
        const T* g0 = g + sg.at(b, h, t0);
        // P (rows, n), recomputed from the saved log-sum-exp; dead rows (lse = -inf) stay 0.
        p.scores(b, h, t0, rows, n, prob.data());
        for (int64_t r = 0; r < rows; ++r) {
          T* x = prob.data() + r * n;
          p.prepare_row(b, h, t0 + r, x, n);
          const T l = lse[bh * Tq + t0 + r];
          if (l == ninf) {
            std::fill(x, x + n, T(0));
          } else {
            for (int64_t s = 0; s < n; ++s) {
              const T z = x[s] - l;  // <= 0 up to rounding: lse >= every kept score; NaN stays NaN
              x[s] = exp_nonpos(z > T(0) ? T(0) : z);
            }
          }
          // delta_t = rowsum(dO ∘ O)
          const T* orow = o + so.at(b, h, t0 + r);
          const T* grow = g0 + r * sg.t;
          T d = 0;
          for (int64_t c = 0; c < D; ++c) d += grow[c * sg.s] * orow[c * so.s];
          delta[r] = d;
        }
        // dV[0:n] (n, D) += Pᵀ dO
        gemm<T>(n, D, rows, prob.data(), 1, n, g0, sg.t, sg.s, dv_bh, D, true);
        // dP (rows, n) = dO Vᵀ
        gemm<T>(rows, n, D, g0, sg.t, sg.s, p.v + p.sv.at(b, h, 0), p.sv.s, p.sv.t, dprob.data(), n);
        // dS = scale · P ∘ (dP - delta), in place of dP
        for (int64_t r = 0; r < rows; ++r) {
          const T* pr = prob.data() + r * n;
          T* dr = dprob.data() + r * n;
          const T dl = delta[r], sc = p.scale;
          for (int64_t s = 0; s < n; ++s) dr[s] = sc * pr[s] * (dr[s] - dl);
        }
        // dQ (rows, D) = dS K[0:n];  dK[0:n] (n, D) += dSᵀ Q
        gemm<T>(rows, D, n, dprob.data(), n, 1, p.k + p.sk.at(b, h, 0), p.sk.t, p.sk.s, dqp + (bh * Tq + t0) * D, D);
        gemm<T>(n, D, rows, dprob.data(), 1, n, p.q + p.sq.at(b, h, t0), p.sq.t, p.sq.s, dk_bh, D, true);
      }
    }
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
