#pragma once
// What the CPU kernels of scaled-dot-product attention share (ops/cpu/attention.cpp: float32 / float64 products;
// ops/cpu/attention_bf16.cpp: bfloat16 products under CpuAutocast): the problem as raw pointers and strides, and the
// row passes between the products — scores to probabilities (forward, and the backward's recomputation from the
// saved log-sum-exp), each row's delta = rowsum(dO ∘ O), and dS = scale · P ∘ (dP - delta).
//
// Include it inside the including file's vectorisation region (ops/cpu/vec_region_begin.h), after
// ops/cpu/small_gemm.h; its helpers are forced inline into the kernels of each instruction-set level.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/tensor.h"
#include "ops/cpu/scratch.h"

namespace asc::cpu::sdpa {

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

  // The forward's row t of raw scores x over keys [0, n) to unnormalised probabilities exp(x - max) and its
  // log-sum-exp into *lse; returns the factor that normalises the row (1 / its sum). A row with no key kept gives
  // zeros (lse -inf); a row of NaN scores (a NaN query, say) keeps its NaN where keys are kept and gives lse NaN, so
  // that P·V is NaN, as in PyTorch.
  ASC_ALWAYS_INLINE T exp_row(int64_t b, int64_t h, int64_t t, T* x, int64_t n, T* lse) const {
    const T m = prepare_row(b, h, t, x, n);
    if (m == -std::numeric_limits<T>::infinity()) {
      // The max skips NaN, so a NaN row lands here too. prepare_row set every key not kept to -inf, so a NaN left
      // in x is a kept score.
      bool nan = false;
      for (int64_t s = 0; s < n; ++s) nan |= x[s] != x[s];
      if (nan) {
        for (int64_t s = 0; s < n; ++s) x[s] = x[s] != x[s] ? x[s] : T(0);
        *lse = std::numeric_limits<T>::quiet_NaN();
      } else {  // no key kept (or all -inf): a zero row
        std::fill(x, x + n, T(0));
        *lse = m;
      }
      return T(1);
    }
    for (int64_t s = 0; s < n; ++s) x[s] = exp_nonpos(x[s] - m);
    const T sum = row_sum(x, n);  // a second pass over the row in L1 costs less than a reduction's scalar tail
    *lse = m + std::log(sum);
    return T(1) / sum;
  }

  // The backward's row t of raw scores x over keys [0, n) to the probabilities P = exp(x - lse), from the saved
  // log-sum-exp; a dead row (lse = -inf) stays 0.
  ASC_ALWAYS_INLINE void probabilities_row(int64_t b, int64_t h, int64_t t, T* x, int64_t n, T lse) const {
    prepare_row(b, h, t, x, n, /*with_max=*/false);
    if (lse == -std::numeric_limits<T>::infinity()) {
      std::fill(x, x + n, T(0));
      return;
    }
    for (int64_t s = 0; s < n; ++s) {
      const T z = x[s] - lse;  // <= 0 up to rounding: lse >= every kept score; NaN stays NaN
      x[s] = exp_nonpos(z > T(0) ? T(0) : z);
    }
  }
};

// delta[r] = rowsum(dO ∘ O) of rows [0, rows) (g0, o0: their first rows; strides sg, so): 16 float rows at a time at
// x86-64-v4 where both have contiguous columns (one dot per row ends in a chain of scalar adds as long as its vector:
// a tenth of the kernel's time at D = 32).
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void row_deltas(const T* g0, const Strides4& sg, const T* o0, const Strides4& so, int64_t rows,
                                  int64_t D, T* delta) {
  int64_t r = 0;
  if constexpr (kIsa == CpuIsa::x86_64_v4)
    if (sg.s == 1 && so.s == 1 && D >= 64 / static_cast<int64_t>(sizeof(T)))
      for (constexpr int64_t L = 64 / sizeof(T); r + L <= rows; r += L)
        row_dots_lanes(g0 + r * sg.t, sg.t, o0 + r * so.t, so.t, D, delta + r);
  for (; r < rows; ++r) {
    const T* orow = o0 + r * so.t;
    const T* grow = g0 + r * sg.t;
    T d = 0;
    for (int64_t c = 0; c < D; ++c) d += grow[c * sg.s] * orow[c * so.s];
    delta[r] = d;
  }
}

// dS = scale · P ∘ (dP - delta) over a (rows, n) tile, in place of dP (rows ld apart in both).
template <class T>
ASC_ALWAYS_INLINE void scores_grad(const T* prob, T* dprob, int64_t ld, int64_t rows, int64_t n, const T* delta,
                                   T scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = prob + r * ld;
    T* dr = dprob + r * ld;
    const T dl = delta[r];
    for (int64_t s = 0; s < n; ++s) dr[s] = scale * pr[s] * (dr[s] - dl);
  }
}

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

}  // namespace asc::cpu::sdpa

namespace asc::cpu {

// The bfloat16 kernels (ops/cpu/attention_bf16.cpp): float32 q, k, v and outputs, the products in bfloat16 with
// float32 sums (vdpbf16ps), the row passes in float32. sdpa_forward / sdpa_backward run them inside a
// Bf16ProductsScope (scaled_dot_product_attention under CpuAutocast). Throw asc::Error on a processor without
// AVX512-BF16.
void sdpa_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                       bool causal, double scale, Tensor& o, Tensor& stats);
void sdpa_backward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                        const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                        Tensor& dk, Tensor& dv);

}  // namespace asc::cpu
