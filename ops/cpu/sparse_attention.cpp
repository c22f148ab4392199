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

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")  // see ops/cpu/vec_math.h
#endif

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

  Problem(const Tensor& q_, const Tensor& k_, const Tensor& v_, const SparsePattern& p, const Tensor& kk, double sc)
      : B(q_.size(0)), H(q_.size(1)), Tq(q_.size(2)), S(k_.size(2)), D(q_.size(3)), G(p.groups),
        q(q_.data_ptr<T>()), k(k_.data_ptr<T>()), v(v_.data_ptr<T>()), row_ptr(p.row_ptr.data_ptr<int64_t>()),
        cols(p.cols.data_ptr<int64_t>()), keep(kk.defined() ? kk.data_ptr<bool>() : nullptr),
        scale(static_cast<T>(sc)) {}

  int64_t group(int64_t bh) const { return G == 1 ? 0 : bh; }
  // The raw scores of row i of head bh into s[0 .. len) (−inf on padding keys); returns their max.
  T scores(int64_t bh, int64_t i, T* s) const {
    const int64_t r = group(bh) * Tq + i, e0 = row_ptr[r], len = row_ptr[r + 1] - e0;
    const T* qi = q + (bh * Tq + i) * D;
    const T* kb = k + bh * S * D;
    const bool* kp = keep ? keep + (bh / H) * S : nullptr;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t x = 0; x < len; ++x) {
      const int64_t j = cols[e0 + x];
      s[x] = (kp && !kp[j]) ? -std::numeric_limits<T>::infinity() : scale * dot(qi, kb + j * D, D);
      m = std::max(m, s[x]);
    }
    return m;
  }
};

template <class T>
void forward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePattern& pat, const Tensor& keep,
                  double scale, Tensor& o, Tensor& lse_t) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D;
  o = Tensor::empty({B, H, Tq, D}, qt.options());
  lse_t = Tensor::empty({B, H, Tq}, qt.options());
  T* op = o.data_ptr<T>();
  T* lse = lse_t.data_ptr<T>();
  const int64_t max_row = pat.max_row();
  const int64_t avg_cost = std::max<int64_t>(1, pat.nnz() / std::max<int64_t>(1, pat.groups * Tq)) * D * 2;
  parallel_for(B * H * Tq, avg_cost, [&](int64_t i0, int64_t i1) {
    Scratch<T> s(static_cast<size_t>(std::max<int64_t>(max_row, 1)));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t bh = item / Tq, i = item % Tq;
      const int64_t e0 = p.row_ptr[p.group(bh) * Tq + i], len = p.row_ptr[p.group(bh) * Tq + i + 1] - e0;
      T* oi = op + item * D;
      std::fill(oi, oi + D, T(0));
      const T m = p.scores(bh, i, s.data());
      if (m == -std::numeric_limits<T>::infinity()) {  // no kept key: a zero row
        lse[item] = m;
        continue;
      }
      const T* vb = p.v + bh * S * D;
      T sum = 0;
      for (int64_t x = 0; x < len; ++x) {
        const T e = exp_nonpos(s[x] - m);  // exp(−inf) = 0 for padding keys
        sum += e;
        if (e != T(0)) axpy(e, vb + p.cols[e0 + x] * D, oi, D);
      }
      const T inv = T(1) / sum;
      for (int64_t c = 0; c < D; ++c) oi[c] *= inv;
      lse[item] = m + std::log(sum);
    }
  });
}

template <class T>
void backward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePattern& pat, const Tensor& keep,
                   double scale, const Tensor& ot, const Tensor& gt, const Tensor& lse_t, Tensor& dq, Tensor& dk,
                   Tensor& dv) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D, G = p.G;
  dq = Tensor::empty({B, H, Tq, D}, qt.options());
  dk = Tensor::empty({B, H, S, D}, qt.options());
  dv = Tensor::empty({B, H, S, D}, qt.options());
  const T* o = ot.data_ptr<T>();
  const T* g = gt.data_ptr<T>();
  const T* lse = lse_t.data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  const int64_t* col_ptr = pat.col_ptr.data_ptr<int64_t>();
  const int64_t* col_rows = pat.col_rows.data_ptr<int64_t>();
  const int64_t* col_pos = pat.col_pos.data_ptr<int64_t>();
  // P and dS of one (batch, head): as many pairs as its group has.
  int64_t pairs = 0;
  for (int64_t gr = 0; gr < G; ++gr) pairs = std::max(pairs, p.row_ptr[(gr + 1) * Tq] - p.row_ptr[gr * Tq]);
  Scratch<T> prob(static_cast<size_t>(std::max<int64_t>(pairs, 1))), dsc(prob.size());
  const int64_t avg = std::max<int64_t>(1, pat.nnz() / std::max<int64_t>(1, G * Tq));
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t gr = p.group(bh), base = p.row_ptr[gr * Tq];
    const T *qb = p.q + bh * Tq * D, *kb = p.k + bh * S * D, *vb = p.v + bh * S * D;
    const T *ob = o + bh * Tq * D, *gb = g + bh * Tq * D;
    // Pass 1, per query row: P, dS and dq.
    parallel_for(Tq, avg * D * 3, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t e0 = p.row_ptr[gr * Tq + i], len = p.row_ptr[gr * Tq + i + 1] - e0;
        T* pr = prob.data() + (e0 - base);
        T* dr = dsc.data() + (e0 - base);
        T* dqi = dqp + (bh * Tq + i) * D;
        std::fill(dqi, dqi + D, T(0));
        const T l = lse[bh * Tq + i];
        if (l == -std::numeric_limits<T>::infinity()) {  // an empty row passes no gradient
          std::fill(pr, pr + len, T(0));
          std::fill(dr, dr + len, T(0));
          continue;
        }
        p.scores(bh, i, pr);
        const T* gi = gb + i * D;
        const T delta = dot(gi, ob + i * D, D);
        for (int64_t x = 0; x < len; ++x) {
          const T z = pr[x] - l;  // <= 0 up to rounding
          const T pij = exp_nonpos(z < T(0) ? z : T(0));
          pr[x] = pij;
          if (pij == T(0)) {
            dr[x] = 0;
            continue;
          }
          const int64_t j = p.cols[e0 + x];
          const T ds = p.scale * pij * (dot(gi, vb + j * D, D) - delta);
          dr[x] = ds;
          axpy(ds, kb + j * D, dqi, D);
        }
      }
    });
    // Pass 2, per key: dv and dk from the queries that see it.
    parallel_for(S, avg * D * 2, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        T* dkj = dkp + (bh * S + j) * D;
        T* dvj = dvp + (bh * S + j) * D;
        std::fill(dkj, dkj + D, T(0));
        std::fill(dvj, dvj + D, T(0));
        for (int64_t y = col_ptr[gr * S + j]; y < col_ptr[gr * S + j + 1]; ++y) {
          const int64_t i = col_rows[y], x = col_pos[y] - base;
          if (prob[x] == T(0)) continue;
          axpy(prob[x], gb + i * D, dvj, D);
          axpy(dsc[x], qb + i * D, dkj, D);
        }
      }
    });
  }
}

}  // namespace

void sparse_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                              const Tensor& key_keep, double scale, Tensor& o, Tensor& lse) {
  ASC_DISPATCH_FLOAT(q.dtype(), "sparse_attention",
                     [&] { forward_impl<scalar_t>(q, k, v, pattern, key_keep, scale, o, lse); });
}

void sparse_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                               const Tensor& key_keep, double scale, const Tensor& o, const Tensor& dout,
                               const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv) {
  ASC_DISPATCH_FLOAT(q.dtype(), "sparse_attention backward", [&] {
    backward_impl<scalar_t>(q, k, v, pattern, key_keep, scale, o, dout, lse, dq, dk, dv);
  });
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
