// CPU kernels of sparse attention over a CSR pattern (ops/sparse_attention.h). Work is O(attended pairs · D) and the
// only per-pair memory is one row of scores per thread in the forward and two floats per pair of one (batch, head)
// in the backward — never a (T, S) tile.
//
// Forward, a task per (batch, head, query row) range: for row i with key list P(i)
//   s_j = scale · q_i · k_j  (−inf where the key is padding),  m = max s,  p_j = exp(s_j − m),  l = Σ p
//   o_i = Σ p_j v_j / l,  lse_i = m + log l
// Backward, per (batch, head), two deterministic passes (no atomics):
//   rows:  P_ij = exp(s_ij − lse_i),  dS_ij = scale · P_ij (dO_i · v_j − dO_i · o_i),  dq_i = Σ_j dS_ij k_j
//          (P and dS are kept per pair of the head)
//   keys:  dv_j = Σ_i P_ij dO_i,  dk_j = Σ_i dS_ij q_i   over the pattern's transpose (the queries that see key j)
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/format.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/kernels.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

template <class T>
inline T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  ASC_SIMD_REDUCE(+, s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// a · x_0 .. a · x_3 at once: four independent accumulation chains instead of one (a single dot of D = 64 is bound
// by the latency of its chain of vector FMAs).
template <class T>
inline void dot4(const T* a, const T* x0, const T* x1, const T* x2, const T* x3, int64_t n, T* out) {
  T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#if defined(ASC_HAVE_OPENMP)
#pragma omp simd reduction(+ : s0, s1, s2, s3)
#endif
  for (int64_t c = 0; c < n; ++c) {
    s0 += a[c] * x0[c];
    s1 += a[c] * x1[c];
    s2 += a[c] * x2[c];
    s3 += a[c] * x3[c];
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

// out[x] = a · base[idx[x] · D] for x < len, four rows at a time.
template <class T>
inline void gather_dots(const T* a, const T* base, const int64_t* idx, int64_t len, int64_t D, T* out) {
  int64_t x = 0;
  for (; x + 4 <= len; x += 4)
    dot4(a, base + idx[x] * D, base + idx[x + 1] * D, base + idx[x + 2] * D, base + idx[x + 3] * D, D, out + x);
  for (; x < len; ++x) out[x] = dot(a, base + idx[x] * D, D);
}

template <class T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

// The problem with raw pointers; every tensor contiguous, (b, h) flattened to bh.
template <class T>
struct Problem {
  int64_t B, H, Tq, S, D, G;
  const T *q, *k, *v;
  const int64_t* row_ptr;
  const int64_t* cols;
  const bool* keep;  // (B, S) or nullptr
  T scale;
  int64_t avg_row;  // keys per query row on average (parallel_for's cost estimate)

  Problem(const Tensor& q_, const Tensor& k_, const Tensor& v_, const SparsePatternView& p, const Tensor& kk, double sc)
      : B(q_.size(0)),
        H(q_.size(1)),
        Tq(q_.size(2)),
        S(k_.size(2)),
        D(q_.size(3)),
        G(p.groups),
        q(q_.data_ptr<T>()),
        k(k_.data_ptr<T>()),
        v(v_.data_ptr<T>()),
        row_ptr(p.lists.row_ptr),
        cols(p.lists.cols),
        keep(kk.defined() ? kk.data_ptr<bool>() : nullptr),
        scale(static_cast<T>(sc)),
        avg_row(std::max<int64_t>(1, p.nnz / std::max<int64_t>(1, p.groups * Tq))) {}

  int64_t group(int64_t bh) const { return G == 1 ? 0 : bh; }
  // parallel_for's cost estimate of an item doing `per_pair` flops per attended pair and column, capped so that the
  // estimate times the item count cannot overflow (it only decides whether to go parallel).
  int64_t cost(int64_t per_pair) const {
    return std::min<int64_t>(avg_row, int64_t{1} << 20) * std::min<int64_t>(D, int64_t{1} << 20) * per_pair;
  }
  // Whether key j of head bh is padding (never read: its score is −inf and its value is skipped).
  bool masked(int64_t bh, int64_t j) const { return keep && !keep[(bh / H) * S + j]; }
  // Where row i of head bh lies in cols: entries [e0, e0 + len).
  struct Row {
    int64_t e0, len;
  };
  Row row(int64_t bh, int64_t i) const {
    const int64_t r = group(bh) * Tq + i;
    return {row_ptr[r], row_ptr[r + 1] - row_ptr[r]};
  }
  // The raw scores of row i of head bh into s[0 .. len) (−inf on padding keys); returns their max, NaN when a kept
  // key's score is NaN (so that the row becomes NaN, as the composed softmax would make it), and counts the row's
  // kept keys into `kept`.
  T scores(int64_t bh, int64_t i, T* s, int64_t& kept) const {
    const auto [e0, len] = row(bh, i);
    const T* qi = q + (bh * Tq + i) * D;
    const T* kb = k + bh * S * D;
    const bool* kp = keep ? keep + (bh / H) * S : nullptr;
    gather_dots(qi, kb, cols + e0, len, D, s);
    T m = -std::numeric_limits<T>::infinity();
    int64_t n_kept = 0, n_nan = 0;  // separate reductions: the loop stays vectorisable
    for (int64_t x = 0; x < len; ++x) {
      const bool pad = kp && !kp[cols[e0 + x]];
      n_kept += !pad;
      s[x] = pad ? -std::numeric_limits<T>::infinity() : scale * s[x];
      n_nan += s[x] != s[x];
      m = s[x] > m ? s[x] : m;  // not std::max: compiled outside this region, it would not inline
    }
    kept = n_kept;
    return n_nan ? std::numeric_limits<T>::quiet_NaN() : m;
  }
};

// One query row of the forward: o_i and its log-sum-exp. s: scratch for the row's scores.
template <class T>
ASC_CPU_CLONES T forward_row(const Problem<T>& p, int64_t bh, int64_t i, T* s, T* oi) {
  const int64_t D = p.D;
  const auto [e0, len] = p.row(bh, i);
  for (int64_t c = 0; c < D; ++c) oi[c] = 0;
  int64_t kept = 0;
  const T m = p.scores(bh, i, s, kept);
  if (kept == 0) return -std::numeric_limits<T>::infinity();  // no kept key: a zero row
  // m is NaN when a kept score is (NaN q or k), −inf or +inf only for infinite inputs: then s − m is NaN too, and
  // the row comes out NaN, as the composed softmax gives it.
  const T* vb = p.v + bh * p.S * D;
  T sum = 0;
  for (int64_t x = 0; x < len; ++x) {
    const T z = s[x] - m;
    const T e = exp_nonpos(z > T(0) ? T(0) : z);  // exp(−inf) = 0 for padding keys; NaN stays NaN
    sum += e;
    // Every kept key's value is read, even at weight 0 (an underflow): 0 · NaN is NaN, as in the composed op.
    if (!p.masked(bh, p.cols[e0 + x])) axpy(e, vb + p.cols[e0 + x] * D, oi, D);
  }
  const T inv = T(1) / sum;
  for (int64_t c = 0; c < D; ++c) oi[c] *= inv;
  return m + std::log(sum);
}

template <class T>
void forward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePatternView& pat,
                  const Tensor& keep, double scale, Tensor& o, Tensor& lse_t) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, D = p.D;
  T* op = o.data_ptr<T>();
  T* lse = lse_t.data_ptr<T>();
  const int64_t max_row = pat.max_row;
  parallel_for(B * H * Tq, p.cost(2), [&](int64_t i0, int64_t i1) {
    Scratch<T> s(static_cast<size_t>(std::max<int64_t>(max_row, 1)));
    for (int64_t item = i0; item < i1; ++item)
      lse[item] = forward_row(p, item / Tq, item % Tq, s.data(), op + item * D);
  });
}

// Backward, pass 1, one query row: P and dS of its pairs (into pr, dr) and dq_i.
template <class T>
ASC_CPU_CLONES void backward_row(const Problem<T>& p, int64_t bh, int64_t i, T l, const T* oi, const T* gi, T* pr,
                                 T* dr, T* dqi) {
  const int64_t D = p.D;
  const auto [e0, len] = p.row(bh, i);
  for (int64_t c = 0; c < D; ++c) dqi[c] = 0;
  if (l == -std::numeric_limits<T>::infinity()) {  // a row with no kept key (its lse) passes no gradient
    for (int64_t x = 0; x < len; ++x) pr[x] = dr[x] = 0;
    return;
  }
  const T* kb = p.k + bh * p.S * D;
  int64_t kept = 0;
  p.scores(bh, i, pr, kept);
  const T delta = dot(gi, oi, D);
  gather_dots(gi, p.v + bh * p.S * D, p.cols + e0, len, D, dr);  // dP_ij = dO_i · v_j
  for (int64_t x = 0; x < len; ++x) {
    if (p.masked(bh, p.cols[e0 + x])) {  // a padding key: no probability, no gradient
      pr[x] = dr[x] = 0;
      continue;
    }
    const T z = pr[x] - l;  // <= 0 up to rounding; NaN (a NaN row) stays NaN, so its gradients are NaN too
    const T pij = exp_nonpos(z > T(0) ? T(0) : z);
    pr[x] = pij;
    const T ds = p.scale * pij * (dr[x] - delta);
    dr[x] = ds;
    axpy(ds, kb + p.cols[e0 + x] * D, dqi, D);
  }
}

// Backward, pass 2, one key: dk_j and dv_j from the entries [y0, y1) of the transpose.
template <class T>
ASC_CPU_CLONES void backward_key(const Problem<T>& p, const int64_t* col_rows, const int64_t* col_pos, int64_t y0,
                                 int64_t y1, int64_t base, const T* prob, const T* dsc, const T* qb, const T* gb,
                                 T* dkj, T* dvj) {
  const int64_t D = p.D;
  for (int64_t c = 0; c < D; ++c) dkj[c] = 0, dvj[c] = 0;
  for (int64_t y = y0; y < y1; ++y) {
    const int64_t i = col_rows[y], x = col_pos[y] - base;
    if (prob[x] == T(0) && dsc[x] == T(0)) continue;  // padding, an empty row, or an exact zero (NaN passes)
    axpy(prob[x], gb + i * D, dvj, D);
    axpy(dsc[x], qb + i * D, dkj, D);
  }
}

template <class T>
void backward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePatternView& pat,
                   const Tensor& keep, double scale, const Tensor& ot, const Tensor& gt, const Tensor& lse_t,
                   Tensor& dq, Tensor& dk, Tensor& dv) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D, G = p.G;
  const T* o = ot.data_ptr<T>();
  const T* g = gt.data_ptr<T>();
  const T* lse = lse_t.data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  const SparsePatternLists& lists = pat.lists;
  const int64_t *col_ptr = lists.col_ptr, *col_rows = lists.col_rows, *col_pos = lists.col_pos;
  // P and dS of one (batch, head): as many pairs as its group has.
  int64_t pairs = 0;
  for (int64_t gr = 0; gr < G; ++gr) pairs = std::max(pairs, p.row_ptr[(gr + 1) * Tq] - p.row_ptr[gr * Tq]);
  Scratch<T> prob(static_cast<size_t>(std::max<int64_t>(pairs, 1))), dsc(prob.size());
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t gr = p.group(bh), base = p.row_ptr[gr * Tq];
    const T* qb = p.q + bh * Tq * D;
    const T *ob = o + bh * Tq * D, *gb = g + bh * Tq * D;
    // Pass 1, per query row: P, dS and dq.
    parallel_for(Tq, p.cost(3), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t e0 = p.row(bh, i).e0 - base;
        backward_row(p, bh, i, lse[bh * Tq + i], ob + i * D, gb + i * D, prob.data() + e0, dsc.data() + e0,
                     dqp + (bh * Tq + i) * D);
      }
    });
    // Pass 2, per key: dv and dk from the queries that see it.
    parallel_for(S, p.cost(2), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        backward_key(p, col_rows, col_pos, col_ptr[gr * S + j], col_ptr[gr * S + j + 1], base, prob.data(), dsc.data(),
                     qb, gb, dkp + (bh * S + j) * D, dvp + (bh * S + j) * D);
    });
  }
}

}  // namespace

void sparse_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePatternView& pattern,
                              const Tensor& key_keep, double scale, Tensor& o, Tensor& lse) {
  ASC_DISPATCH_FLOAT(q.dtype(), "sparse_attention",
                     [&] { forward_impl<scalar_t>(q, k, v, pattern, key_keep, scale, o, lse); });
}

void sparse_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePatternView& pattern,
                               const Tensor& key_keep, double scale, const Tensor& o, const Tensor& dout,
                               const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv) {
  ASC_DISPATCH_FLOAT(q.dtype(), "sparse_attention backward",
                     [&] { backward_impl<scalar_t>(q, k, v, pattern, key_keep, scale, o, dout, lse, dq, dk, dv); });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
