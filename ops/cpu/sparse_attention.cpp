// CPU kernels of sparse attention over a CSR pattern (ops/sparse_attention.h). Work is O(attended pairs · D); memory
// per thread is one tile of a block of rows and one head's transposed keys and values — never a (T, S) tile.
//
// Tiles. The query rows go in blocks of 16. A block's plan (plan_block, from the pattern alone) merges its rows'
// keys into intervals (across gaps of a few keys that no row attends): the intervals of at least 8 keys (a window,
// global tokens, a hierarchical block and the summary columns) are the columns of a dense tile, every other key (a
// random key, say) is rare. Scores and products over the tile are small_gemm.h's register-blocked GEMMs straight
// from the head's Kᵀ, Vᵀ, K and V, pairs outside a row's list are set to −inf (P = 0); rare keys go pair by pair
// beside them, in the same softmax, whose passes run over a multiple of 16 columns (no scalar remainder). A call's
// plans are kept in the pattern (its cache): without padding they depend on the pattern alone, made on its first call
// and read by every later one; with padding, the last table made and its key_keep, read by the backward and any call
// with an equal key_keep (plans made for one head width serve another: they decide speed, not values). A block whose
// tile would be too sparse (less than D / (D + 128) full: a third at D = 64, a ninth at D = 16), or whose tile keys
// hold a non-finite k or v (NaN must reach exactly the rows that attend it, and 0 · NaN in a product would spread it),
// goes row by row instead — or, where neighbouring rows share few keys (a clustered pattern), in a row group: rows of
// untiled blocks with the same first key, up to 16, over a tile of their union's keys gathered (plan_groups):
//   s_j = scale · q_i · k_j  (−inf where the key is padding),  m = max s,  p_j = exp(s_j − m),  l = Σ p
//   o_i = Σ p_j v_j / l,  lse_i = m + log l
// Backward: P_ij = exp(s_ij − lse_i), dS_ij = scale · P_ij (dO_i · v_j − dO_i · o_i), dq_i = Σ_j dS_ij k_j,
// dv_j = Σ_i P_ij dO_i, dk_j = Σ_i dS_ij q_i. Heads run in parallel, each head's blocks and groups in order, so dK and
// dV accumulate in place without atomics and the result does not depend on the thread count (tiles where the plan
// allows, and finite q and dO rows; else row by row, scattering into dK and dV; a tile's rare pairs are added key by
// key after the head's blocks, backward_rare_keys). A single (batch, head) runs two
// passes parallel within it instead: rows (P and dS kept per pair), then keys over the pattern's transpose.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "core/format.h"
#include "core/profiler.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/cpu/sparse_attention.h"
#include "ops/kernels.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"  // inside the region: gemm_narrow, vec_math.h

namespace asc::cpu {
namespace {

template <class T>
ASC_ALWAYS_INLINE T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  ASC_SIMD_REDUCE(+, s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// a · x_0 .. a · x_3 at once: four independent accumulation chains instead of one (a single dot of D = 64 is bound
// by the latency of its chain of vector FMAs).
template <class T>
ASC_ALWAYS_INLINE void dot4(const T* a, const T* x0, const T* x1, const T* x2, const T* x3, int64_t n, T* out) {
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

// out[k] = a · base[idx[k] · D] for the L keys k < L at once (L lanes of a kBytes-byte vector: 16 floats at
// x86-64-v4, 8 at v3): a vector of partial sums per key, then their horizontal sums all together (small_gemm.h's
// sum_lanes_round: two-source permutes), which come out in key order in one vector — a quarter of the shuffles that
// one reduction per key takes.
template <int kBytes, class T>
ASC_ALWAYS_INLINE void dot_lanes(const T* a, const T* base, const int64_t* idx, int64_t D, T* out) {
  typedef T V __attribute__((vector_size(kBytes)));
  constexpr int64_t L = kBytes / sizeof(T);
  const int64_t Dv = D / L * L;
  V acc[L], av, xv;
  for (int64_t k = 0; k < L; ++k) acc[k] = V{};
  for (int64_t c = 0; c < Dv; c += L) {
    std::memcpy(&av, a + c, sizeof(V));
    for (int64_t k = 0; k < L; ++k) {
      std::memcpy(&xv, base + idx[k] * D + c, sizeof(V));
      acc[k] += av * xv;
    }
  }
  sum_lanes_round<V, L, L / 2>(acc);
  for (int64_t k = 0; k < L; ++k) {
    T t = 0;  // the last D % L columns
    for (int64_t c = Dv; c < D; ++c) t += a[c] * base[idx[k] * D + c];
    out[k] = acc[0][k] + t;
  }
}

// out[x] = a · base[idx[x] · D] for x < len: L rows at a time (dot_lanes at the level's vector width; below
// x86-64-v3, four at a time). A tail of at least 4 rows is one more dot_lanes over its keys with the last one
// repeated (its row is in the cache), the extra sums dropped: a row's ~15 random keys, which four dot4 and dot calls
// each ending in their own horizontal sums took twice as long; a shorter tail goes one dot at a time.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void gather_dots(const T* a, const T* base, const int64_t* idx, int64_t len, int64_t D, T* out) {
  int64_t x = 0;
  if constexpr (kIsa == CpuIsa::x86_64_v4 || kIsa == CpuIsa::x86_64_v3) {
    constexpr int kBytes = kIsa == CpuIsa::x86_64_v4 ? 64 : 32;
    constexpr int64_t L = kBytes / sizeof(T);
    for (; x + L <= len; x += L) dot_lanes<kBytes>(a, base, idx + x, D, out + x);
    if (len - x >= 4) {
      int64_t pad[L];
      T sums[L];
      for (int64_t k = 0; k < L; ++k) pad[k] = idx[std::min(x + k, len - 1)];
      dot_lanes<kBytes>(a, base, pad, D, sums);
      for (int64_t k = 0; x + k < len; ++k) out[x + k] = sums[k];
      return;
    }
  } else {
    for (; x + 4 <= len; x += 4)
      dot4(a, base + idx[x] * D, base + idx[x + 1] * D, base + idx[x + 2] * D, base + idx[x + 3] * D, D, out + x);
  }
  for (; x < len; ++x) out[x] = dot(a, base + idx[x] * D, D);
}

template <class T>
ASC_ALWAYS_INLINE void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

// y += Σ_x w[x] · base[idx[x] · D] for x < len, in that order, 64 columns (float; 32 double) at a time summed in
// registers: y is read and written once, where a chain of axpy calls into one y waits on its own stores pair after
// pair.
template <class T>
ASC_ALWAYS_INLINE void gather_axpys(const T* w, const T* base, const int64_t* idx, int64_t len, int64_t D, T* y) {
  typedef T V __attribute__((vector_size(64)));  // one 512-bit register at x86-64-v4, two or four below
  constexpr int64_t L = 64 / sizeof(T);
  int64_t c0 = 0;
  for (; c0 + 4 * L <= D; c0 += 4 * L) {
    V a0 = {}, a1 = {}, a2 = {}, a3 = {}, t;
    for (int64_t x = 0; x < len; ++x) {
      const T a = w[x];
      const T* row = base + idx[x] * D + c0;
      std::memcpy(&t, row, sizeof(V)), a0 += a * t;
      std::memcpy(&t, row + L, sizeof(V)), a1 += a * t;
      std::memcpy(&t, row + 2 * L, sizeof(V)), a2 += a * t;
      std::memcpy(&t, row + 3 * L, sizeof(V)), a3 += a * t;
    }
    T* yc = y + c0;
    std::memcpy(&t, yc, sizeof(V)), t += a0, std::memcpy(yc, &t, sizeof(V));
    std::memcpy(&t, yc + L, sizeof(V)), t += a1, std::memcpy(yc + L, &t, sizeof(V));
    std::memcpy(&t, yc + 2 * L, sizeof(V)), t += a2, std::memcpy(yc + 2 * L, &t, sizeof(V));
    std::memcpy(&t, yc + 3 * L, sizeof(V)), t += a3, std::memcpy(yc + 3 * L, &t, sizeof(V));
  }
  if (c0 < D)
    for (int64_t x = 0; x < len; ++x) axpy(w[x], base + idx[x] * D + c0, y + c0, D - c0);
}

// The pattern side of a problem: which keys each (head, query row) attends. (b, h) flattened to bh.
struct PatternRows {
  int64_t B, H, Tq, S, G;
  const int64_t* row_ptr;
  const int64_t* cols;
  const bool* keep;  // (B, S) or nullptr

  int64_t group(int64_t bh) const { return G == 1 ? 0 : bh; }
  // Head bh's row of key_keep (nullptr without padding), taken once per row or block: the division is slow per key.
  const bool* keep_row(int64_t bh) const { return keep ? keep + (bh / H) * S : nullptr; }
  // Whether key j is padding in a head whose key_keep row is kp (never read: its score is −inf and its value is
  // skipped).
  static bool padding(const bool* kp, int64_t j) { return kp && !kp[j]; }
  // Where row i of head bh lies in cols: entries [e0, e0 + len).
  struct Row {
    int64_t e0, len;
  };
  Row row(int64_t bh, int64_t i) const {
    const int64_t r = group(bh) * Tq + i;
    return {row_ptr[r], row_ptr[r + 1] - row_ptr[r]};
  }
};

// y += Σ_x w[x] · base[idx[x] · D] over the keys that are not padding (kp: the head's key_keep row, or nullptr): a
// padding key's row is never read. In registers where nothing is padding.
template <class T>
ASC_ALWAYS_INLINE void gather_axpys_kept(const T* w, const T* base, const int64_t* idx, int64_t len, int64_t D,
                                         const bool* kp, T* y) {
  if (kp == nullptr) return gather_axpys(w, base, idx, len, D, y);
  for (int64_t x = 0; x < len; ++x)
    if (!PatternRows::padding(kp, idx[x])) axpy(w[x], base + idx[x] * D, y, D);
}

// The problem with raw pointers; every tensor contiguous.
template <class T>
struct Problem : PatternRows {
  int64_t D;
  const T *q, *k, *v;
  T scale;
  int64_t avg_row;  // keys per query row on average (parallel_for's cost estimate)

  Problem(const Tensor& q_, const Tensor& k_, const Tensor& v_, const SparsePatternView& p, const Tensor& kk, double sc)
      : PatternRows{.B = q_.size(0),
                    .H = q_.size(1),
                    .Tq = q_.size(2),
                    .S = k_.size(2),
                    .G = p.groups,
                    .row_ptr = p.lists.row_ptr,
                    .cols = p.lists.cols,
                    .keep = kk.defined() ? kk.data_ptr<bool>() : nullptr},
        D(q_.size(3)),
        q(q_.data_ptr<T>()),
        k(k_.data_ptr<T>()),
        v(v_.data_ptr<T>()),
        scale(static_cast<T>(sc)),
        avg_row(std::max<int64_t>(1, p.nnz / std::max<int64_t>(1, p.groups * Tq))) {}

  // parallel_for's cost estimate of an item doing `per_pair` flops per attended pair and column, capped so that the
  // estimate times the item count cannot overflow (it only decides whether to go parallel).
  int64_t cost(int64_t per_pair) const {
    return std::min<int64_t>(avg_row, int64_t{1} << 20) * std::min<int64_t>(D, int64_t{1} << 20) * per_pair;
  }
  // The raw scores of row i of head bh into s[0 .. len) (−inf on padding keys); returns their max, NaN when a kept
  // key's score is NaN (so that the row becomes NaN, as the composed softmax would make it), and counts the row's
  // kept keys into `kept`.
  template <CpuIsa kIsa>
  ASC_ALWAYS_INLINE T scores(int64_t bh, int64_t i, T* s, int64_t& kept) const {
    const auto [e0, len] = row(bh, i);
    const T* qi = q + (bh * Tq + i) * D;
    const T* kb = k + bh * S * D;
    const bool* kp = keep_row(bh);
    gather_dots<kIsa>(qi, kb, cols + e0, len, D, s);
    T m = -std::numeric_limits<T>::infinity();
    int64_t n_kept = 0, n_nan = 0;  // separate reductions: the loop stays vectorisable
    for (int64_t x = 0; x < len; ++x) {
      const bool pad = padding(kp, cols[e0 + x]);
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
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE T forward_row(const Problem<T>& p, int64_t bh, int64_t i, T* s, T* oi) {
  const int64_t D = p.D;
  const auto [e0, len] = p.row(bh, i);
  for (int64_t c = 0; c < D; ++c) oi[c] = 0;
  int64_t kept = 0;
  const T m = p.template scores<kIsa>(bh, i, s, kept);
  if (kept == 0) return -std::numeric_limits<T>::infinity();  // no kept key: a zero row
  // m is NaN when a kept score is (NaN q or k), −inf or +inf only for infinite inputs: then s − m is NaN too, and
  // the row comes out NaN, as the composed softmax gives it.
  const T* vb = p.v + bh * p.S * D;
  T sum = 0;
  ASC_SIMD_REDUCE(+, sum)
  for (int64_t x = 0; x < len; ++x) {
    const T z = s[x] - m;
    const T e = exp_nonpos(z > T(0) ? T(0) : z);  // exp(−inf) = 0 for padding keys; NaN stays NaN
    s[x] = e;
    sum += e;
  }
  // Every kept key's value is read, even at weight 0 (an underflow): 0 · NaN is NaN, as in the composed op. A padding
  // key's never is.
  gather_axpys_kept(s, vb, p.cols + e0, len, D, p.keep_row(bh), oi);
  const T inv = T(1) / sum;
  for (int64_t c = 0; c < D; ++c) oi[c] *= inv;
  return m + std::log(sum);
}

// ---- tiles over blocks of query rows ------------------------------------------------------------------------------

constexpr int64_t kBlockRows = 16;     // query rows per block
constexpr int64_t kMaxRuns = 16;       // tile runs per block
constexpr int64_t kMinRun = 8;         // a shorter stretch of union keys is rare: its pairs go one by one
constexpr int64_t kMaxGap = 4;         // union keys at most this far apart join one run (the keys between: flag 0)
constexpr int64_t kTileRoom = 16;      // columns after a tile row's last: room for the score products' tail tile
constexpr int64_t kRowPad = 16;        // the row passes' width is a multiple of this (16 floats: one 512-bit vector)
constexpr int64_t kChunk = 128;        // keys per chunk of a head's Kᵀ, Vᵀ (HeadTiles) and dK, dV (HeadKeyGrads)
constexpr int64_t kRowPairCost = 128;  // a row-path pair's overhead beside a tile cell's, in head columns (plan_block)

// The plan of one block of query rows, from the pattern alone (a shared pattern without padding has one plan per
// block for every head): the runs of consecutive keys that form the tile's u columns, each row's flags over them,
// and each row's rare keys — the kept keys outside the runs.
struct BlockPlan {
  bool tiled = false;
  int64_t i0 = 0, R = 0;      // the block's query rows: [i0, i0 + R), or `rows` where that is not empty
  std::vector<int64_t> rows;  // a row group's rows (plan_group), or an untiled block's rows no group took
  std::vector<int64_t> keys;  // a row group's tile: these keys, gathered (runs = {(0, u)} over the gathered copies)
  // u: tile columns; w: the row passes' width, u + the most rare keys of a row rounded up to kRowPad (the rare keys'
  // scores follow the tile columns in a row); ld: tile row stride, w + kTileRoom
  int64_t u = 0, w = 0, ld = 0;
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first key, length), in column order
  std::vector<unsigned char> allowed;             // (rows, w): row r attends column x (its rare keys: x >= u)
  std::vector<int64_t> rare, rare_ptr;            // row r's rare keys: rare[rare_ptr[r] .. rare_ptr[r + 1])
  std::vector<int64_t> kept;                      // row r's kept keys: its allowed tile columns and its rare keys
  int64_t rare_base = 0;  // the owner-wide number of rare[0] (PlanTable's rare pairs: see there)
};

// A thread's scratch for planning: `mark` (one stamp per key) is sized where a block first needs it — with padding,
// or a union of many short stretches; col_of: the tile column of each key of the union's range (plan_block); key_col
// and bits: a row group's (plan_group).
struct PlanScratch {
  std::vector<int64_t> mark, keys, stretch_ptr = std::vector<int64_t>(kBlockRows + 1), merged_col, col_of;
  std::vector<std::pair<int64_t, int64_t>> stretches, merged;  // [first key, last key + 1)
  std::vector<int64_t> key_col;                                // plan_group: a union key's tile column
  std::vector<uint64_t> bits;  // plan_group: a bitset of the union's keys over their range
  int64_t stamp = 0;
  void clear_bits(int64_t lo, int64_t hi) { bits.assign(static_cast<size_t>((hi - lo + 63) / 64), 0); }
  void set_bit(int64_t lo, int64_t j) { bits[static_cast<size_t>((j - lo) >> 6)] |= uint64_t{1} << ((j - lo) & 63); }
  void need_marks(int64_t S) {
    if (mark.size() < static_cast<size_t>(S)) mark.assign(static_cast<size_t>(S), -1);
  }
  // Appends to `merged` the maximal runs of keys in [lo, hi) that carry the current stamp, ascending.
  void runs_of_marks(int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi;) {
      if (mark[j] != stamp) {
        ++j;
        continue;
      }
      const int64_t a = j;
      while (j < hi && mark[j] == stamp) ++j;
      merged.push_back({a, j});
    }
  }
};

// Plans rows [i0, i0 + R) of head bh: the union of their kept keys, its runs of at least kMinRun consecutive keys as
// the tile (at most kMaxRuns), every other kept key rare. Not tiled where the tile would be too sparse for its cost.
void plan_block(const PatternRows& p, int64_t D, int64_t bh, int64_t i0, int64_t R, PlanScratch& w, BlockPlan& plan) {
  const bool* kp = p.keep_row(bh);
  plan.tiled = false;
  plan.u = 0;
  plan.runs.clear();
  plan.rare.clear();
  plan.rare_ptr.assign(static_cast<size_t>(R + 1), 0);
  int64_t tile_pairs = 0;
  // The union as its maximal runs of consecutive keys, ascending. Without padding, from each row's stretches of
  // consecutive keys (a window is one, global tokens another, a random key its own): sorted and joined where they
  // overlap or touch — or, where the stretches are many and the union's range short (a clustered part's scattered
  // keys), marked per key and read off by one scan of the range, with no sort. With padding, from marks.
  w.merged.clear();
  bool by_marks = false;  // the union read off its marks over a short range: col_of maps a key to its column
  int64_t lo = p.S, hi = 0;
  int64_t entries = 0;  // the rows' kept keys: at most this many pairs in any tile
  if (p.keep == nullptr) {
    w.stretches.clear();
    w.stretch_ptr[0] = 0;
    for (int64_t r = 0; r < R; ++r) {
      const auto [e0, len] = p.row(bh, i0 + r);
      const int64_t* c = p.cols + e0;
      for (int64_t x0 = 0; x0 < len;) {
        int64_t x1 = x0 + 1;
        while (x1 < len && c[x1] == c[x1 - 1] + 1) ++x1;
        w.stretches.push_back({c[x0], c[x0] + (x1 - x0)});
        x0 = x1;
      }
      if (len > 0) lo = std::min(lo, c[0]), hi = std::max(hi, c[len - 1] + 1);
      entries += len;
      w.stretch_ptr[r + 1] = static_cast<int64_t>(w.stretches.size());
    }
    const int64_t n_str = static_cast<int64_t>(w.stretches.size());
    by_marks = n_str > 2 * R && hi - lo <= 16 * n_str;
    if (by_marks) {
      w.need_marks(p.S);
      ++w.stamp;
      for (const auto& [a, b] : w.stretches)
        for (int64_t j = a; j < b; ++j) w.mark[j] = w.stamp;
      w.runs_of_marks(lo, hi);
    } else {
      w.merged.assign(w.stretches.begin(), w.stretches.end());
      std::sort(w.merged.begin(), w.merged.end());
    }
  } else {
    // Every kept key marked (padding is never read), and the range from each ascending row's first and last kept
    // key. Then the union read off the marks by one scan of a short range (col_of below is then cheap too), or,
    // over a long one, its keys gathered once each and sorted.
    w.need_marks(p.S);
    ++w.stamp;
    for (int64_t r = 0; r < R; ++r) {
      const auto [e0, len] = p.row(bh, i0 + r);
      const int64_t* c = p.cols + e0;
      int64_t first = -1, last = -1;
      for (int64_t x = 0; x < len; ++x) {
        const int64_t j = c[x];
        if (p.padding(kp, j)) continue;
        w.mark[j] = w.stamp, last = j, ++entries;
        if (first < 0) first = j;
      }
      if (first >= 0) lo = std::min(lo, first), hi = std::max(hi, last + 1);
    }
    by_marks = hi - lo <= 4 * entries;
    if (by_marks) {
      w.runs_of_marks(lo, hi);
    } else {
      ++w.stamp;  // a second stamp: each key taken once
      w.keys.clear();
      for (int64_t r = 0; r < R; ++r) {
        const auto [e0, len] = p.row(bh, i0 + r);
        for (int64_t x = 0; x < len; ++x) {
          const int64_t j = p.cols[e0 + x];
          if (p.padding(kp, j) || w.mark[j] == w.stamp) continue;
          w.mark[j] = w.stamp, w.keys.push_back(j);
        }
      }
      std::sort(w.keys.begin(), w.keys.end());
      for (const int64_t j : w.keys) w.merged.push_back({j, j + 1});
    }
  }
  if (w.merged.empty()) return;
  // Maximal runs: intervals that overlap or touch become one (the marks' scan made them so already).
  size_t m = 0;
  for (size_t x = 1; x < w.merged.size(); ++x) {
    if (w.merged[x].first <= w.merged[m].second) {
      w.merged[m].second = std::max(w.merged[m].second, w.merged[x].second);
    } else {
      w.merged[++m] = w.merged[x];
    }
  }
  w.merged.resize(m + 1);
  // Then, left to right, two runs whose gap is short (at most kMaxGap keys and an eighth of the joined span: scattered
  // random keys stay apart) join too; the keys between them are tile columns no row of the block attends (flag 0),
  // never padding (padding is never read). A hierarchical block's summary columns, say, skip the block's own summary:
  // one run instead of two, or instead of a run and rare keys.
  auto bridges = [&](int64_t first, int64_t a, int64_t b, int64_t last) {  // [first, a) + gap [a, b) + [b, last)
    if (b - a > kMaxGap || 8 * (b - a) > last - first) return false;
    for (int64_t j = a; j < b; ++j)
      if (p.padding(kp, j)) return false;
    return true;
  };
  m = 0;
  for (size_t x = 1; x < w.merged.size(); ++x) {
    if (bridges(w.merged[m].first, w.merged[m].second, w.merged[x].first, w.merged[x].second)) {
      w.merged[m].second = w.merged[x].second;
    } else {
      w.merged[++m] = w.merged[x];
    }
  }
  w.merged.resize(m + 1);
  // The long intervals are the tile's runs; merged_col: the tile column of an interval's first key, or -1 (rare).
  w.merged_col.assign(w.merged.size(), -1);
  for (size_t x = 0; x < w.merged.size(); ++x) {
    const auto [a, b] = w.merged[x];
    if (b - a < kMinRun || static_cast<int64_t>(plan.runs.size()) == kMaxRuns) continue;
    w.merged_col[x] = plan.u;
    plan.runs.push_back({a, b - a});
    plan.u += b - a;
  }
  if (plan.u == 0) return;
  // Not tiled (below) even if every kept key of the rows fell in the tile: the rows go one by one, and no flags are
  // needed (scattered keys, a clustered part's, make a long union that few pairs fill).
  if (entries * (D + kRowPairCost) < R * plan.u * D) return;
  plan.allowed.assign(static_cast<size_t>(R * plan.u), 0);
  int64_t most_rare = 0;
  // The tile column of a union key (>= 0), or -1 for a rare one (its interval is not a run). Over a short range
  // (by_marks) a table of the range's keys answers it in one lookup, -2 for a key outside the union (padding: the
  // union leaves it out, and no run bridges it); else a binary search for the interval holding the key.
  if (by_marks) {
    w.col_of.assign(static_cast<size_t>(hi - lo), -2);
    for (size_t x = 0; x < w.merged.size(); ++x) {
      const auto [a, b] = w.merged[x];
      int64_t* col = w.col_of.data() + (a - lo);
      for (int64_t j = 0; j < b - a; ++j) col[j] = w.merged_col[x] >= 0 ? w.merged_col[x] + j : -1;
    }
  }
  auto column_of = [&](int64_t a) {
    if (by_marks) return w.col_of[static_cast<size_t>(a - lo)];
    const size_t x = static_cast<size_t>(
        std::upper_bound(w.merged.begin(), w.merged.end(), std::pair<int64_t, int64_t>{a, INT64_MAX}) -
        w.merged.begin() - 1);
    return w.merged_col[x] >= 0 ? w.merged_col[x] + (a - w.merged[x].first) : int64_t{-1};
  };
  plan.kept.assign(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) {
    unsigned char* ok = plan.allowed.data() + r * plan.u;
    const int64_t pairs_before = tile_pairs;
    if (p.keep == nullptr) {
      for (int64_t e = w.stretch_ptr[r]; e < w.stretch_ptr[r + 1]; ++e) {
        const auto [a, b] = w.stretches[e];  // a stretch lies in one interval, whose columns are consecutive
        const int64_t c0 = column_of(a);
        if (c0 >= 0) {
          std::fill(ok + c0, ok + c0 + (b - a), static_cast<unsigned char>(1));
          tile_pairs += b - a;
        } else {
          for (int64_t j = a; j < b; ++j) plan.rare.push_back(j);
        }
      }
    } else if (by_marks) {  // every kept key lies in [lo, hi): one outside it is padding, as is one marked -2
      const auto [e0, len] = p.row(bh, i0 + r);
      const int64_t* col = w.col_of.data();
      for (int64_t e = 0; e < len; ++e) {
        const int64_t j = p.cols[e0 + e];
        if (j < lo || j >= hi) continue;
        const int64_t c = col[j - lo];
        if (c >= 0) {
          ok[c] = 1, ++tile_pairs;
        } else if (c == -1) {
          plan.rare.push_back(j);
        }
      }
    } else {
      const auto [e0, len] = p.row(bh, i0 + r);
      for (int64_t e = 0; e < len; ++e) {
        const int64_t j = p.cols[e0 + e];
        if (p.padding(kp, j)) continue;
        const int64_t c = column_of(j);
        if (c >= 0) {
          ok[c] = 1, ++tile_pairs;
        } else {
          plan.rare.push_back(j);
        }
      }
    }
    plan.rare_ptr[r + 1] = static_cast<int64_t>(plan.rare.size());
    most_rare = std::max(most_rare, plan.rare_ptr[r + 1] - plan.rare_ptr[r]);
    plan.kept[r] = tile_pairs - pairs_before + plan.rare_ptr[r + 1] - plan.rare_ptr[r];
  }
  // The row passes run over w columns, a multiple of kRowPad, so that no row ends in a scalar remainder loop: the
  // flags widen from (R, u) to (R, w), 1 on each row's rare columns, 0 past them.
  plan.w = (plan.u + most_rare + kRowPad - 1) / kRowPad * kRowPad;
  plan.ld = plan.w + kTileRoom;
  plan.allowed.resize(static_cast<size_t>(R * plan.w));
  for (int64_t r = R - 1; r >= 0; --r) {
    unsigned char* ok = plan.allowed.data() + r * plan.w;
    std::memmove(ok, plan.allowed.data() + r * plan.u, static_cast<size_t>(plan.u));
    const int64_t rare = plan.rare_ptr[r + 1] - plan.rare_ptr[r];
    std::fill(ok + plan.u, ok + plan.u + rare, static_cast<unsigned char>(1));
    std::fill(ok + plan.u + rare, ok + plan.w, static_cast<unsigned char>(0));
  }
  // A tile costs about D per cell, attended or not; a pair on the row path about D + kRowPairCost (the gather, the
  // scalar softmax bookkeeping): the tile pays off from a fill of D / (D + kRowPairCost) on — a third at D = 64,
  // a ninth at D = 16.
  plan.tiled = tile_pairs * (D + kRowPairCost) >= R * plan.u * D;
}

constexpr int64_t kMinGroupRows = 4;  // a row group of fewer rows stays on the row path (plan_groups)

// Plans a row group of head bh — R query rows, not consecutive, whose keys overlap (plan_groups finds them): the
// union of their kept keys, ascending, is the tile, every key a column of copies gathered per call (forward_group),
// so a group has no runs of the head's keys and no rare keys. Tiled by the same cost rule as a block.
void plan_group(const PatternRows& p, int64_t D, int64_t bh, const int64_t* rows, int64_t R, PlanScratch& w,
                BlockPlan& plan) {
  const bool* kp = p.keep_row(bh);
  plan = BlockPlan{};
  plan.R = R;
  plan.rows.assign(rows, rows + R);
  // Rows with the same list (a cluster's, often) have it as their union: no marks, no sort.
  const auto [f0, flen] = p.row(bh, rows[0]);
  bool same = true;
  for (int64_t r = 1; r < R && same; ++r) {
    const auto [e0, len] = p.row(bh, rows[r]);
    same = len == flen && std::equal(p.cols + e0, p.cols + e0 + len, p.cols + f0);
  }
  int64_t entries = 0;
  if (same) {
    for (int64_t x = 0; x < flen; ++x)
      if (!p.padding(kp, p.cols[f0 + x])) plan.keys.push_back(p.cols[f0 + x]);
    entries = R * static_cast<int64_t>(plan.keys.size());
  } else {  // the union off a bitset of the rows' range, read in order a word at a time
    int64_t lo = p.S, hi = 0;
    for (int64_t r = 0; r < R; ++r) {
      const auto [e0, len] = p.row(bh, rows[r]);
      if (len > 0) lo = std::min(lo, p.cols[e0]), hi = std::max(hi, p.cols[e0 + len - 1] + 1);
    }
    w.clear_bits(lo, hi);
    for (int64_t r = 0; r < R; ++r) {
      const auto [e0, len] = p.row(bh, rows[r]);
      for (int64_t x = 0; x < len; ++x) {
        const int64_t j = p.cols[e0 + x];
        if (p.padding(kp, j)) continue;
        ++entries;
        w.set_bit(lo, j);  // keys scattered over the range: rarely two in a row in one word
      }
    }
    for (size_t x = 0; x < w.bits.size(); ++x)
      for (uint64_t word = w.bits[x]; word != 0; word &= word - 1)
        plan.keys.push_back(lo + static_cast<int64_t>(x) * 64 + __builtin_ctzll(word));
  }
  if (w.key_col.size() < static_cast<size_t>(p.S)) w.key_col.resize(static_cast<size_t>(p.S));
  plan.u = static_cast<int64_t>(plan.keys.size());
  if (plan.u == 0 || entries * (D + kRowPairCost) < R * plan.u * D) {
    plan.keys.clear();
    return;
  }
  for (int64_t x = 0; x < plan.u; ++x) w.key_col[plan.keys[x]] = x;
  plan.runs.push_back({0, plan.u});
  plan.w = (plan.u + kRowPad - 1) / kRowPad * kRowPad;
  plan.ld = plan.w + kTileRoom;
  plan.allowed.assign(static_cast<size_t>(R * plan.w), 0);
  plan.rare_ptr.assign(static_cast<size_t>(R + 1), 0);
  plan.kept.assign(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) {
    const auto [e0, len] = p.row(bh, rows[r]);
    unsigned char* ok = plan.allowed.data() + r * plan.w;
    if (same) {
      std::fill(ok, ok + plan.u, static_cast<unsigned char>(1));
      plan.kept[r] = plan.u;
      continue;
    }
    for (int64_t x = 0; x < len; ++x) {
      const int64_t j = p.cols[e0 + x];
      if (p.padding(kp, j)) continue;
      ok[w.key_col[j]] = 1, ++plan.kept[r];
    }
  }
  plan.tiled = true;
}

// The row groups of one owner (a group's rows, or a batch row's / head's with padding): the rows of its untiled
// blocks — whose consecutive rows share too few keys, as in a clustered pattern, where neighbouring tokens fall in
// different clusters — sorted by their first kept key and length, then cut into groups of at most kBlockRows rows,
// a group also ending where the first key changes once it has kMinGroupRows: rows of one cluster start at the same
// key. Appends the tiled groups to `groups` and marks their rows in `taken`.
void plan_groups(const PatternRows& p, int64_t D, int64_t bh, const std::vector<int64_t>& candidates, PlanScratch& w,
                 std::vector<unsigned char>& taken, std::vector<BlockPlan>& groups) {
  const bool* kp = p.keep_row(bh);
  struct Key {
    int64_t first, len, row;
  };
  std::vector<Key> order;
  order.reserve(candidates.size());
  for (const int64_t i : candidates) {
    const auto [e0, len] = p.row(bh, i);
    int64_t first = len > 0 ? p.cols[e0] : -1, kept = len;
    if (kp != nullptr) {
      first = -1, kept = 0;
      for (int64_t x = 0; x < len; ++x) {
        if (p.padding(kp, p.cols[e0 + x])) continue;
        if (first < 0) first = p.cols[e0 + x];
        ++kept;
      }
    }
    if (kept > 0) order.push_back({first, kept, i});
  }
  std::sort(order.begin(), order.end(), [](const Key& a, const Key& b) {
    return std::tie(a.first, a.len, a.row) < std::tie(b.first, b.len, b.row);
  });
  std::vector<int64_t> rows;
  BlockPlan plan;
  auto close = [&] {
    if (static_cast<int64_t>(rows.size()) >= kMinGroupRows) {
      plan_group(p, D, bh, rows.data(), static_cast<int64_t>(rows.size()), w, plan);
      if (plan.tiled) {
        for (const int64_t i : rows) taken[static_cast<size_t>(i)] = 1;
        groups.push_back(std::move(plan));
      }
    }
    rows.clear();
  };
  for (size_t x = 0; x < order.size(); ++x) {
    if (!rows.empty() &&
        ((static_cast<int64_t>(rows.size()) >= kMinGroupRows && order[x].first != order[x - 1].first) ||
         static_cast<int64_t>(rows.size()) == kBlockRows))
      close();
    rows.push_back(order[x].row);
  }
  close();
}

// The plans of a call, for every owner: owner = the group without padding; with padding (key_keep), the batch row b
// when the pattern is shared (its H heads see the same keys) and (b, h) when each head has its own group. An owner's
// units: its blocks of consecutive rows in order (an untiled one keeps only its rows: those no row group took), then
// its row groups.
struct PlanTable {
  std::vector<BlockPlan> plans;   // owner o's units: plans[unit_ptr[o] .. unit_ptr[o + 1])
  std::vector<int64_t> unit_ptr;  // (owners + 1)
  // The rare pairs of owner o's tiled blocks, numbered g = plan.rare_base + e over its units in order, listed by key
  // (then g): rare_by_key[rare_ptr[o] .. rare_ptr[o + 1]). The backward adds their dK and dV rows key by key from
  // this list (backward_rare_keys) instead of scattering pair by pair.
  struct RarePair {
    int32_t key, row;
    int64_t g;
  };
  std::vector<RarePair> rare_by_key;
  std::vector<int64_t> rare_ptr;    // (owners + 1)
  std::vector<unsigned char> keep;  // the key_keep (B, S) they were made for; empty without padding
  int64_t B = 0, H = 0;
};

// Which owner's plans head bh reads.
inline int64_t plan_owner(const PatternRows& p, int64_t bh) {
  if (p.keep == nullptr) return p.group(bh);
  return p.G == 1 ? bh / p.H : bh;
}

// Plans every owner: its blocks (in parallel over all blocks), then the row groups of its untiled blocks' rows (in
// parallel over owners). An untiled plan keeps nothing but its rows.
std::shared_ptr<PlanTable> plan_table(const PatternRows& p, int64_t D, int64_t blocks, int64_t block_cost) {
  const profiler::Range planning("sparse_attention plans");  // host work the profile names (a new pattern's)
  auto t = std::make_shared<PlanTable>();
  const int64_t owners = p.keep != nullptr && p.G == 1 ? p.B : p.G;
  auto head_of = [&](int64_t o) { return p.keep != nullptr && p.G == 1 ? o * p.H : o; };  // reads owner o's plans
  std::vector<BlockPlan> block_plans(static_cast<size_t>(owners * blocks));
  // An owner of many blocks none of whose kSampled sampled blocks is tiled is taken as scattered (a clustered
  // pattern: neighbouring rows share few keys), and its blocks are not planned: their rows go to the row groups.
  // Planning a block costs about as much per pair as the attention does, so this halves a clustered call's planning.
  constexpr int64_t kSampled = 8;
  std::vector<unsigned char> scattered(static_cast<size_t>(owners), 0);
  if (blocks >= 4 * kSampled)
    parallel_for(owners, block_cost * kSampled, [&](int64_t o0, int64_t o1) {
      PlanScratch w;
      BlockPlan probe;
      for (int64_t o = o0; o < o1; ++o) {
        bool tiled = false;
        for (int64_t x = 0; x < kSampled && !tiled; ++x) {
          const int64_t i0 = (2 * x + 1) * blocks / (2 * kSampled) * kBlockRows;
          plan_block(p, D, head_of(o), i0, std::min(kBlockRows, p.Tq - i0), w, probe);
          tiled = probe.tiled;
        }
        scattered[static_cast<size_t>(o)] = !tiled;
      }
    });
  parallel_for(owners * blocks, block_cost, [&](int64_t x0, int64_t x1) {
    PlanScratch w;
    for (int64_t x = x0; x < x1; ++x) {
      const int64_t o = x / blocks, i0 = (x % blocks) * kBlockRows, R = std::min(kBlockRows, p.Tq - i0);
      BlockPlan& plan = block_plans[static_cast<size_t>(x)];
      if (!scattered[static_cast<size_t>(o)]) plan_block(p, D, head_of(o), i0, R, w, plan);
      if (!plan.tiled) plan = BlockPlan{};
      plan.i0 = i0, plan.R = R;
    }
  });
  std::vector<std::vector<BlockPlan>> units(static_cast<size_t>(owners));
  parallel_for(owners, block_cost * blocks, [&](int64_t o0, int64_t o1) {
    PlanScratch w;
    std::vector<int64_t> candidates;
    std::vector<unsigned char> taken;
    std::vector<BlockPlan> groups;
    for (int64_t o = o0; o < o1; ++o) {
      BlockPlan* own = block_plans.data() + o * blocks;
      candidates.clear();
      for (int64_t m = 0; m < blocks; ++m)
        if (!own[m].tiled)
          for (int64_t i = own[m].i0; i < own[m].i0 + own[m].R; ++i) candidates.push_back(i);
      taken.assign(static_cast<size_t>(p.Tq), 0);
      groups.clear();
      if (static_cast<int64_t>(candidates.size()) >= kMinGroupRows)
        plan_groups(p, D, head_of(o), candidates, w, taken, groups);
      std::vector<BlockPlan>& mine = units[static_cast<size_t>(o)];
      for (int64_t m = 0; m < blocks; ++m) {
        BlockPlan& plan = own[m];
        if (!plan.tiled && !groups.empty()) {  // the rows no group took
          for (int64_t i = plan.i0; i < plan.i0 + plan.R; ++i)
            if (!taken[static_cast<size_t>(i)]) plan.rows.push_back(i);
          if (plan.rows.empty()) continue;
          if (static_cast<int64_t>(plan.rows.size()) == plan.R) plan.rows.clear();
        }
        mine.push_back(std::move(plan));
      }
      for (BlockPlan& g : groups) mine.push_back(std::move(g));
    }
  });
  t->unit_ptr.assign(static_cast<size_t>(owners + 1), 0);
  for (int64_t o = 0; o < owners; ++o)
    t->unit_ptr[o + 1] = t->unit_ptr[o] + static_cast<int64_t>(units[static_cast<size_t>(o)].size());
  t->plans.reserve(static_cast<size_t>(t->unit_ptr[owners]));
  for (auto& u : units)
    for (BlockPlan& plan : u) t->plans.push_back(std::move(plan));
  // The rare pairs by key: numbered in unit order, then sorted by key by counting (stable: g ascending per key).
  t->rare_ptr.assign(static_cast<size_t>(owners + 1), 0);
  std::vector<int64_t> at(static_cast<size_t>(p.S + 1));
  for (int64_t o = 0; o < owners; ++o) {
    BlockPlan* first = t->plans.data() + t->unit_ptr[o];
    BlockPlan* last = t->plans.data() + t->unit_ptr[o + 1];
    int64_t count = 0;
    std::fill(at.begin(), at.end(), 0);
    for (BlockPlan* plan = first; plan != last; ++plan) {
      plan->rare_base = count;
      count += static_cast<int64_t>(plan->rare.size());
      for (int64_t j : plan->rare) ++at[static_cast<size_t>(j + 1)];
    }
    for (int64_t j = 0; j < p.S; ++j) at[static_cast<size_t>(j + 1)] += at[static_cast<size_t>(j)];
    const int64_t base = t->rare_ptr[o];
    t->rare_ptr[o + 1] = base + count;
    t->rare_by_key.resize(static_cast<size_t>(base + count));
    for (BlockPlan* plan = first; plan != last; ++plan)
      for (int64_t r = 0; r < static_cast<int64_t>(plan->rare_ptr.size()) - 1; ++r)
        for (int64_t e = plan->rare_ptr[r]; e < plan->rare_ptr[r + 1]; ++e) {
          const int64_t j = plan->rare[e];
          t->rare_by_key[static_cast<size_t>(base + at[static_cast<size_t>(j)]++)] = {
              static_cast<int32_t>(j), static_cast<int32_t>(plan->i0 + r), plan->rare_base + e};
        }
  }
  if (p.keep != nullptr) t->keep.assign(p.keep, p.keep + p.B * p.S), t->B = p.B, t->H = p.H;
  return t;
}

// The plans of a call, kept in the pattern (SparsePatternView::cache) for the calls after it. Without padding they
// depend on the pattern alone: made on its first call, under std::call_once, and read by the backward and every
// later call. With padding they depend on key_keep too: the pattern keeps the last table made with padding and the
// key_keep it was made for, and a call with an equal key_keep (the backward of the same call, an evaluation over the
// same batch) reads it; any other makes a new one.
class Plans {
 public:
  Plans(const PatternRows& p, int64_t D, const SparsePatternView& pat, int64_t blocks, int64_t block_cost) : p_(p) {
    SparsePatternCache* cache = pat.cache;
    if (cache == nullptr) {  // a view without a cache: plans for this call only
      table_ = plan_table(p, D, blocks, block_cost);
    } else if (p.keep == nullptr) {
      std::call_once(cache->cpu_once, [&] { cache->cpu_plans = plan_table(p, D, blocks, block_cost); });
      table_ = std::static_pointer_cast<const PlanTable>(cache->cpu_plans);
    } else {
      {
        std::lock_guard lock(cache->mu);
        table_ = std::static_pointer_cast<const PlanTable>(cache->cpu_padded_plans);
      }
      const bool same = table_ && table_->B == p.B && table_->H == p.H &&
                        std::equal(table_->keep.begin(), table_->keep.end(), p.keep,
                                   [](unsigned char a, bool b) { return (a != 0) == b; });
      if (!same) {
        auto made = plan_table(p, D, blocks, block_cost);
        std::lock_guard lock(cache->mu);
        cache->cpu_padded_plans = made;
        table_ = std::move(made);
      }
    }
  }
  // Head bh's units: [first, last).
  std::pair<const BlockPlan*, const BlockPlan*> units(int64_t bh) const {
    const int64_t o = plan_owner(p_, bh);
    return {table_->plans.data() + table_->unit_ptr[o], table_->plans.data() + table_->unit_ptr[o + 1]};
  }
  int64_t count(int64_t bh) const {
    const int64_t o = plan_owner(p_, bh);
    return table_->unit_ptr[o + 1] - table_->unit_ptr[o];
  }
  // Head bh's rare pairs by key: [first, last).
  std::pair<const PlanTable::RarePair*, const PlanTable::RarePair*> rare_pairs(int64_t bh) const {
    const int64_t o = plan_owner(p_, bh);
    return {table_->rare_by_key.data() + table_->rare_ptr[o], table_->rare_by_key.data() + table_->rare_ptr[o + 1]};
  }

 private:
  const PatternRows& p_;
  std::shared_ptr<const PlanTable> table_;
};

// A thread's view of one head for the tiles: Kᵀ (and Vᵀ for the backward), (D, S) with rows ldt apart, and which keys
// have finite k and v rows, both made kChunk keys at a time when a block first needs them (ensure_keys): a block then
// reads its keys' columns from the cache right after they are written, where a whole head's transposes ahead of its
// blocks (8 MiB at n = 16384) went out to memory and back; keys no tile reads are never transposed. The score tiles.
template <class T>
struct HeadTiles {
  int64_t head = -1, ldt = 0;
  Scratch<T> kt, vt, tile, dtile;
  std::vector<unsigned char> finite, ready;  // per key; per chunk of keys: its columns and flags made
  HeadTiles(int64_t S, int64_t D, bool backward)
      : ldt(transposed_ld(S)),
        kt(static_cast<size_t>(D * ldt)),
        vt(backward ? static_cast<size_t>(D * ldt) : 0),
        finite(static_cast<size_t>(S)),
        ready(static_cast<size_t>((S + kChunk - 1) / kChunk)) {}
};

template <class T>
ASC_ALWAYS_INLINE bool rows_finite(const T* x, int64_t n) {
  T bad = 0;  // x - x is NaN for x = NaN or ±inf, else 0
  ASC_SIMD_REDUCE(+, bad)
  for (int64_t c = 0; c < n; ++c) bad += x[c] - x[c];
  return bad == T(0);
}

// Starts head bh: no chunk made yet; the columns after the last key, which gemm_narrow's tail tiles read, zeroed.
template <class T>
void start_head(const Problem<T>& p, int64_t bh, HeadTiles<T>& h) {
  std::fill(h.ready.begin(), h.ready.end(), static_cast<unsigned char>(0));
  for (Scratch<T>* t : {&h.kt, &h.vt})
    if (!t->empty())
      for (int64_t c = 0; c < p.D; ++c) std::fill(t->data() + c * h.ldt + p.S, t->data() + (c + 1) * h.ldt, T(0));
  h.head = bh;
}

// The chunks of keys [a, b) of the current head (b clamped to S): their Kᵀ (and Vᵀ) columns and finiteness flags.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void ensure_keys(const Problem<T>& p, HeadTiles<T>& h, int64_t a, int64_t b) {
  const int64_t D = p.D, S = p.S;
  const T* kb = p.k + h.head * S * D;
  const T* vb = p.v + h.head * S * D;
  for (int64_t c = a / kChunk; c * kChunk < std::min(b, S); ++c) {
    if (h.ready[c]) continue;
    const int64_t c0 = c * kChunk, c1 = std::min(S, c0 + kChunk);
    transpose_rows<T, kIsa>(kb + c0 * D, D, 1, c1 - c0, D, h.kt.data() + c0, h.ldt, /*zero_room=*/false);
    if (!h.vt.empty())
      transpose_rows<T, kIsa>(vb + c0 * D, D, 1, c1 - c0, D, h.vt.data() + c0, h.ldt, /*zero_room=*/false);
    // 16 keys at a time (one reduction instead of 32), key by key only in a group that holds a non-finite number
    for (int64_t j0 = c0; j0 < c1; j0 += 16) {
      const int64_t j1 = std::min(c1, j0 + 16);
      const bool all = rows_finite(kb + j0 * D, (j1 - j0) * D) && rows_finite(vb + j0 * D, (j1 - j0) * D);
      for (int64_t j = j0; j < j1; ++j) h.finite[j] = all || (rows_finite(kb + j * D, D) && rows_finite(vb + j * D, D));
    }
    h.ready[c] = 1;
  }
}

// Whether a planned tile can run on the current head, its chunks made first: its keys' k and v rows are finite (NaN
// must reach exactly the rows that attend it; 0 · NaN in a product would spread it to the others). The kTileRoom
// keys after each run are made too: the score products' tail tile reads their columns.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE bool tile_keys_ready(const Problem<T>& p, const BlockPlan& plan, HeadTiles<T>& h) {
  bool finite = true;
  for (const auto& [a, len] : plan.runs) {
    ensure_keys<kIsa>(p, h, a, a + len + kTileRoom);
    for (int64_t j = a; j < a + len; ++j) finite = finite && h.finite[j];
  }
  return finite;
}

// A head's dK and dV (S, D), zeroed a chunk of keys at a time just before a block first adds into it, and the rest
// when the head is done (a key no row attends gets 0): the zeros are written into the cache right before they are
// read, where filling the whole head first sent them out to memory and back at long n.
template <class T>
struct HeadKeyGrads {
  T *dk = nullptr, *dv = nullptr;
  int64_t S = 0, D = 0;
  std::vector<unsigned char> zeroed;
  void start(T* dk_bh, T* dv_bh, int64_t keys, int64_t width) {
    dk = dk_bh, dv = dv_bh, S = keys, D = width;
    zeroed.assign(static_cast<size_t>((S + kChunk - 1) / kChunk), 0);
  }
  void need(int64_t a, int64_t b) {  // keys [a, b)
    for (int64_t c = a / kChunk; c * kChunk < std::min(b, S); ++c) {
      if (zeroed[c]) continue;
      const int64_t c0 = c * kChunk * D, c1 = std::min(S, (c + 1) * kChunk) * D;
      std::fill(dk + c0, dk + c1, T(0));
      std::fill(dv + c0, dv + c1, T(0));
      zeroed[c] = 1;
    }
  }
  ASC_ALWAYS_INLINE void need_key(int64_t j) {  // one key: a rare key's or the row path's, a flag test inline
    if (!zeroed[static_cast<size_t>(j / kChunk)]) need(j, j + 1);
  }
  // One pair (i, j) outside the tiles: dv_j += p · dO_i, dk_j += ds · q_i (gi, qi: the rows dO_i, q_i). Skipped where
  // p and ds are both exactly 0 (padding, a row with no kept key, an underflow; NaN passes), as the tiles' products
  // would add nothing.
  ASC_ALWAYS_INLINE void add_pair(int64_t j, T p, T ds, const T* qi, const T* gi) {
    if (p == T(0) && ds == T(0)) return;
    need_key(j);
    axpy(p, gi, dv + j * D, D);
    axpy(ds, qi, dk + j * D, D);
  }
  void finish() { need(0, S); }
};

// tile (R, ld) = the block's raw scores x · k over its tile columns (a product per run, from the transposed keys
// kt) and, after them, each row's rare keys.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void block_products(const BlockPlan& plan, int64_t R, int64_t D, const T* x, const T* kt, int64_t ldt,
                                      const T* keys, T* tile) {
  // Each run may write past its end (gemm_narrow's room: the next run's columns, written after it, or the rare keys'
  // or the padding at the row's end) and read past its last key in kt (zeroed room after the sequence's keys).
  for (size_t r = 0, off = 0; r < plan.runs.size(); off += plan.runs[r].second, ++r) {
    const auto [first, len] = plan.runs[r];
    const int64_t room = std::min<int64_t>(plan.ld - static_cast<int64_t>(off), ldt - first);
    gemm_narrow_blocked<T, kIsa>(R, len, D, x, D, 1, kt + first, ldt, tile + off, plan.ld, false, room);
  }
  for (int64_t r = 0; r < R; ++r)
    gather_dots<kIsa>(x + r * D, keys, plan.rare.data() + plan.rare_ptr[r], plan.rare_ptr[r + 1] - plan.rare_ptr[r], D,
                      tile + r * plan.ld + plan.u);
}

// R query rows x (R, D) through their tile: scores, softmax over each row's own keys, O = P V into o (R, D) and the
// rows' log-sum-exps into lse. kt (D, ·) with rows ldt apart holds the tile's keys transposed (a run's first key at its
// column), vrun their value rows (a run's first key at its row); kb and vb: the head's k and v rows for the rare keys.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void forward_tile(const Problem<T>& p, int64_t R, const BlockPlan& plan, const T* x, const T* kt,
                                    int64_t ldt, const T* kb, const T* vrun, const T* vb, Scratch<T>& tile_buf, T* o,
                                    T* lse) {
  const int64_t D = p.D, u = plan.u, ld = plan.ld, n = plan.w;
  if (tile_buf.size() < static_cast<size_t>(R * ld)) tile_buf.resize(static_cast<size_t>(R * ld));
  T* tile = tile_buf.data();
  block_products<kIsa>(plan, R, D, x, kt, ldt, kb, tile);
  const T ninf = -std::numeric_limits<T>::infinity(), sc = p.scale;
  // Each row over the plan's w columns: its tile columns, its rare keys, then -inf (whatever the products left there).
  // Two passes a row: the scaled, masked scores with their max and NaN count, then exp and its sum. P stays
  // unnormalised; O's rows are divided by their sums after the products (R · D divisions instead of R · w).
  T inv[kBlockRows];
  for (int64_t r = 0; r < R; ++r) {
    T* s = tile + r * ld;
    const unsigned char* ok = plan.allowed.data() + r * n;
    T m = ninf, n_nan = 0;  // n_nan counts in T: an int64 count beside float compares keeps the loop narrow
    const int64_t kept = plan.kept[r];
    // Both operands of the select read first: a load under the condition keeps GCC from vectorising the loop.
    for (int64_t c = 0; c < n; ++c) {
      const T y = sc * s[c];
      s[c] = ok[c] ? y : ninf;
    }
    ASC_SIMD_REDUCE(+, n_nan)
    for (int64_t c = 0; c < n; ++c) n_nan += s[c] != s[c] ? T(1) : T(0);
    ASC_SIMD_REDUCE(max, m)
    for (int64_t c = 0; c < n; ++c) m = s[c] > m ? s[c] : m;
    if (kept == 0) {  // no kept key: a zero row
      std::fill(s, s + n, T(0));
      lse[r] = ninf, inv[r] = T(1);
      continue;
    }
    if (n_nan > T(0)) m = std::numeric_limits<T>::quiet_NaN();  // a NaN score: the row comes out NaN
    T sum = 0;
    ASC_SIMD_REDUCE(+, sum)
    for (int64_t c = 0; c < n; ++c) {
      const T z = s[c] - m;
      const T e = exp_nonpos(z > T(0) ? T(0) : z);  // exp(−inf) = 0 outside the row's keys; NaN stays NaN
      s[c] = e;
      sum += e;
    }
    inv[r] = T(1) / sum;
    lse[r] = m + std::log(sum);
  }
  // O (R, D) = P_tile V_runs, accumulated over the runs, then each row's rare keys (a row with no kept key has none),
  // then each row divided by its sum. Every rare key's value is read, even at weight 0: 0 · NaN is NaN, as in the
  // composed op.
  for (size_t r = 0, off = 0; r < plan.runs.size(); off += plan.runs[r].second, ++r)
    gemm_narrow_blocked<T, kIsa>(R, D, plan.runs[r].second, tile + off, ld, 1, vrun + plan.runs[r].first * D, D, o, D,
                                 r > 0);
  for (int64_t r = 0; r < R; ++r) {
    gather_axpys(tile + r * ld + u, vb, plan.rare.data() + plan.rare_ptr[r], plan.rare_ptr[r + 1] - plan.rare_ptr[r], D,
                 o + r * D);
    const T ir = inv[r];
    for (int64_t c = 0; c < D; ++c) o[r * D + c] *= ir;
  }
}

// Rows [i0, i0 + R) of head bh through their tile of the head's keys.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void forward_block(const Problem<T>& p, int64_t bh, const BlockPlan& plan, HeadTiles<T>& h, T* o,
                                     T* lse) {
  const int64_t at = bh * p.Tq + plan.i0;
  const T* kb = p.k + bh * p.S * p.D;
  const T* vb = p.v + bh * p.S * p.D;
  forward_tile<kIsa>(p, plan.R, plan, p.q + at * p.D, h.kt.data(), h.ldt, kb, vb, vb, h.tile, o + at * p.D, lse + at);
}

// A thread's gathered copies for row groups: the tile's keys K_U, V_U (u, D) and their transposes (D, ldu), kept for
// the next group of the same head with the same keys (the groups of one cluster often are); the group's q (and dO, o)
// rows, its outputs, and dK_U, dV_U.
template <class T>
struct GroupTiles {
  int64_t head = -1, ldu = 0;
  bool finite = false, has_vt = false;
  std::vector<int64_t> keys;
  Scratch<T> k, v, kt, vt, x, g, o, y, lse, dk, dv, tile, dtile;
};

template <class T>
void gather_rows(const T* base, const int64_t* idx, int64_t n, int64_t D, Scratch<T>& out) {
  if (out.size() < static_cast<size_t>(n * D)) out.resize(static_cast<size_t>(n * D));
  for (int64_t x = 0; x < n; ++x)
    std::memcpy(out.data() + x * D, base + idx[x] * D, sizeof(T) * static_cast<size_t>(D));
}

// Gathers the group's keys of head bh (unless the copies hold them), transposing V too for the backward; whether
// every one is finite (else the group's rows go the row path: see the file's head).
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE bool gather_group_keys(const Problem<T>& p, int64_t bh, const BlockPlan& plan, GroupTiles<T>& c,
                                         bool backward) {
  const int64_t D = p.D, u = plan.u;
  if (c.head != bh || c.keys != plan.keys) {
    gather_rows(p.k + bh * p.S * D, plan.keys.data(), u, D, c.k);
    gather_rows(p.v + bh * p.S * D, plan.keys.data(), u, D, c.v);
    c.finite = rows_finite(c.k.data(), u * D) && rows_finite(c.v.data(), u * D);
    c.ldu = transposed_ld(u);
    if (c.kt.size() < static_cast<size_t>(D * c.ldu)) c.kt.resize(static_cast<size_t>(D * c.ldu));
    transpose_rows<T, kIsa>(c.k.data(), D, 1, u, D, c.kt.data(), c.ldu);
    c.head = bh, c.keys = plan.keys, c.has_vt = false;
  }
  if (backward && !c.has_vt) {
    if (c.vt.size() < static_cast<size_t>(D * c.ldu)) c.vt.resize(static_cast<size_t>(D * c.ldu));
    transpose_rows<T, kIsa>(c.v.data(), D, 1, u, D, c.vt.data(), c.ldu);
    c.has_vt = true;
  }
  return c.finite;
}

// A row group of head bh: its q rows and the union's keys gathered, then forward_tile, then the rows' o and lse put in
// place. False (nothing written) where a gathered key is not finite.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE bool forward_group(const Problem<T>& p, int64_t bh, const BlockPlan& plan, GroupTiles<T>& c, T* o,
                                     T* lse) {
  const int64_t D = p.D, R = plan.R;
  if (!gather_group_keys<kIsa>(p, bh, plan, c, /*backward=*/false)) return false;
  gather_rows(p.q + bh * p.Tq * D, plan.rows.data(), R, D, c.x);
  if (c.o.size() < static_cast<size_t>(R * D)) c.o.resize(static_cast<size_t>(R * D));
  if (c.lse.size() < static_cast<size_t>(R)) c.lse.resize(static_cast<size_t>(R));
  forward_tile<kIsa>(p, R, plan, c.x.data(), c.kt.data(), c.ldu, c.k.data(), c.v.data(), c.v.data(), c.tile, c.o.data(),
                     c.lse.data());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t at = bh * p.Tq + plan.rows[r];
    std::memcpy(o + at * D, c.o.data() + r * D, sizeof(T) * static_cast<size_t>(D));
    lse[at] = c.lse[r];
  }
  return true;
}

// Calls f(bh, plan) for the units x in [x0, x1) of a call, numbered head by head (head_ptr[bh]: head bh's first).
template <class F>
void for_units(const Plans& plans, const std::vector<int64_t>& head_ptr, int64_t x0, int64_t x1, F&& f) {
  int64_t bh = static_cast<int64_t>(std::upper_bound(head_ptr.begin(), head_ptr.end(), x0) - head_ptr.begin()) - 1;
  for (int64_t x = x0; x < x1; ++bh) {
    const BlockPlan* first = plans.units(bh).first;
    for (; x < x1 && x < head_ptr[bh + 1]; ++x) f(bh, first[x - head_ptr[bh]]);
  }
}

// A unit's query rows, in order: its `rows`, or [i0, i0 + R).
template <class F>
ASC_ALWAYS_INLINE void for_rows(const BlockPlan& plan, F&& f) {
  if (plan.rows.empty()) {
    for (int64_t i = plan.i0; i < plan.i0 + plan.R; ++i) f(i);
  } else {
    for (const int64_t i : plan.rows) f(i);
  }
}

template <class T>
void forward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePatternView& pat,
                  const Tensor& keep, double scale, Tensor& o, Tensor& lse_t) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, D = p.D;
  T* op = o.data_ptr<T>();
  T* lse = lse_t.data_ptr<T>();
  const int64_t max_row = pat.max_row;
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows;
  const Plans plans(p, p.D, pat, blocks, p.cost(1) * kBlockRows);
  std::vector<int64_t> head_ptr(static_cast<size_t>(B * H + 1), 0);
  for (int64_t bh = 0; bh < B * H; ++bh) head_ptr[bh + 1] = head_ptr[bh] + plans.count(bh);
  parallel_for(head_ptr.back(), p.cost(2) * kBlockRows, [&](int64_t x0, int64_t x1) {
    Scratch<T> s(static_cast<size_t>(std::max<int64_t>(max_row, 1)));
    HeadTiles<T> h(p.S, D, /*backward=*/false);
    GroupTiles<T> c;
    for_units(plans, head_ptr, x0, x1, [&](int64_t bh, const BlockPlan& plan) {
      if (plan.tiled && !plan.keys.empty()) {
        if (ASC_CPU_DISPATCH(forward_group<kIsa>(p, bh, plan, c, op, lse))) return;
      } else if (plan.tiled) {
        if (h.head != bh) start_head(p, bh, h);
        if (ASC_CPU_DISPATCH(tile_keys_ready<kIsa>(p, plan, h))) {
          ASC_CPU_DISPATCH(forward_block<kIsa>(p, bh, plan, h, op, lse));
          return;
        }
      }
      for_rows(plan, [&](int64_t i) {
        lse[bh * Tq + i] = ASC_CPU_DISPATCH(forward_row<kIsa>(p, bh, i, s.data(), op + (bh * Tq + i) * D));
      });
    });
  });
}

// Backward, pass 1, one query row: P and dS of its pairs (into pr, dr) and dq_i.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void backward_row(const Problem<T>& p, int64_t bh, int64_t i, T l, const T* oi, const T* gi, T* pr,
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
  p.template scores<kIsa>(bh, i, pr, kept);
  const T delta = dot(gi, oi, D);
  gather_dots<kIsa>(gi, p.v + bh * p.S * D, p.cols + e0, len, D, dr);  // dP_ij = dO_i · v_j
  const bool* kp = p.keep_row(bh);
  for (int64_t x = 0; x < len; ++x) {
    if (p.padding(kp, p.cols[e0 + x])) {  // a padding key: no probability, no gradient
      pr[x] = dr[x] = 0;
      continue;
    }
    const T z = pr[x] - l;  // <= 0 up to rounding; NaN (a NaN row) stays NaN, so its gradients are NaN too
    const T pij = exp_nonpos(z > T(0) ? T(0) : z);
    pr[x] = pij;
    dr[x] = p.scale * pij * (dr[x] - delta);
  }
  gather_axpys_kept(dr, kb, p.cols + e0, len, D, kp, dqi);  // dq_i = Σ_j dS_ij k_j
}

// Backward, pass 2, one key: dk_j and dv_j from the entries [y0, y1) of the transpose.
template <class T>
ASC_ALWAYS_INLINE void backward_key(const Problem<T>& p, const int64_t* col_rows, const int64_t* col_pos, int64_t y0,
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

// Backward of R query rows through their tile (rows of q, dO, o: qb, gb, ob (R, D); their lse), with the keys as
// forward_tile takes them plus the transposed values vt and the key rows krun (a run's first key at its row):
//   P = exp(S·scale − lse) on each row's keys, 0 elsewhere;  dP = dO Vᵀ;  dS = scale · P ∘ (dP − rowsum(dO ∘ O))
//   dQ = dS K;  dV += Pᵀ dO;  dK += dSᵀ Q   — each a product per run, rare keys pair by pair.
// dQ into dqb (R, D); a run's dK, dV rows added into dkrun, dvrun at the run's first key (run_grads(first, len) is
// called before, to zero them where needed); the rare pairs' P and dS into rare_p, rare_ds at their owner-wide
// numbers (plan.rare_base + e), whose dK and dV rows backward_rare_keys adds key by key once the head's units are done.
// Needs finite Q and dO rows (a 0 · NaN in the transposed products would spread a NaN to keys the row does not
// attend); the caller checks.
template <CpuIsa kIsa, class T, class RunGrads>
ASC_ALWAYS_INLINE void backward_tile(const Problem<T>& p, int64_t R, const BlockPlan& plan, const T* qb, const T* gb,
                                     const T* ob, const T* lse, const T* kt, const T* vt, int64_t ldt, const T* krun,
                                     const T* kb, const T* vb, Scratch<T>& tile_buf, Scratch<T>& dtile_buf, T* dqb,
                                     T* dkrun, T* dvrun, RunGrads&& run_grads, T* rare_p, T* rare_ds) {
  const int64_t D = p.D, u = plan.u, ld = plan.ld, n = plan.w;
  if (tile_buf.size() < static_cast<size_t>(R * ld)) tile_buf.resize(static_cast<size_t>(R * ld));
  if (dtile_buf.size() < static_cast<size_t>(R * ld)) dtile_buf.resize(static_cast<size_t>(R * ld));
  T *pt = tile_buf.data(), *dt = dtile_buf.data();
  block_products<kIsa>(plan, R, D, qb, kt, ldt, kb, pt);  // raw scores
  block_products<kIsa>(plan, R, D, gb, vt, ldt, vb, dt);  // dP
  const T sc = p.scale;
  for (int64_t r = 0; r < R; ++r) {
    T* s = pt + r * ld;
    T* d = dt + r * ld;
    const unsigned char* ok = plan.allowed.data() + r * n;
    const T l = lse[r];
    if (l == -std::numeric_limits<T>::infinity()) {  // a row with no kept key passes no gradient
      std::fill(s, s + n, T(0));
      std::fill(d, d + n, T(0));
      continue;
    }
    const T delta = dot(gb + r * D, ob + r * D, D);
    // P and dS over the plan's w columns (the tile's, the row's rare keys, 0 past them); every operand of a select
    // is read first, so the loop vectorises.
    for (int64_t x = 0; x < n; ++x) {
      const T z = sc * s[x] - l;  // <= 0 up to rounding; NaN (a NaN row) stays NaN
      const T pij = exp_nonpos(z > T(0) ? T(0) : z);
      const T ds = sc * pij * (d[x] - delta);
      s[x] = ok[x] ? pij : T(0);
      d[x] = ok[x] ? ds : T(0);
    }
  }
  // dQ (R, D) = dS K: the runs, then the rare keys
  for (size_t r = 0, off = 0; r < plan.runs.size(); off += plan.runs[r].second, ++r)
    gemm_narrow_blocked<T, kIsa>(R, D, plan.runs[r].second, dt + off, ld, 1, krun + plan.runs[r].first * D, D, dqb, D,
                                 r > 0);
  // dV_run += P_runᵀ dO, dK_run += dS_runᵀ Q   (the tiles read down their columns: sam = 1, sak = ld)
  for (size_t r = 0, off = 0; r < plan.runs.size(); off += plan.runs[r].second, ++r) {
    const int64_t a = plan.runs[r].first, len = plan.runs[r].second;
    run_grads(a, len);
    gemm_narrow_blocked<T, kIsa>(len, D, R, pt + off, 1, ld, gb, D, dvrun + a * D, D, true);
    gemm_narrow_blocked<T, kIsa>(len, D, R, dt + off, 1, ld, qb, D, dkrun + a * D, D, true);
  }
  for (int64_t r = 0; r < R; ++r) {
    const T* s = pt + r * ld + u - plan.rare_ptr[r];
    const T* d = dt + r * ld + u - plan.rare_ptr[r];
    gather_axpys(d + plan.rare_ptr[r], kb, plan.rare.data() + plan.rare_ptr[r], plan.rare_ptr[r + 1] - plan.rare_ptr[r],
                 D, dqb + r * D);
    for (int64_t e = plan.rare_ptr[r]; e < plan.rare_ptr[r + 1]; ++e)
      rare_p[plan.rare_base + e] = s[e], rare_ds[plan.rare_base + e] = d[e];
  }
}

// The rare pairs' dK and dV rows of head bh, key by key (Plans::rare_pairs: ascending keys, each key's pairs in row
// order): dk_j += Σ_i dS_ij q_i, dv_j += Σ_i P_ij dO_i over the P and dS that the head's tiles left in rare_p and
// rare_ds (0 for a pair whose block went row by row: its row scattered it). A rare key lies anywhere in the sequence:
// scattered pair by pair from the rows, each pair read and wrote back two rows of dK and dV from beyond the cache;
// here each key's rows are read and written once, in key order, and only the q and dO rows are read at random, asked
// for kAhead pairs early (the list says which).
template <class T>
void backward_rare_keys(const Problem<T>& p, int64_t bh, const PlanTable::RarePair* first,
                        const PlanTable::RarePair* last, const T* g, const T* rare_p, const T* rare_ds,
                        HeadKeyGrads<T>& kg) {
  const int64_t D = p.D;
  const T* qb = p.q + bh * p.Tq * D;
  const T* gb = g + bh * p.Tq * D;
  constexpr int64_t kAhead = 8;  // pairs: the rows of the pair this far ahead are asked for now (their keys are known)
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  for (const PlanTable::RarePair* x = first; x != last; ++x) {
    if (last - x > kAhead) {
      const int64_t ia = x[kAhead].row;
      for (int64_t c = 0; c < D; c += kLine) __builtin_prefetch(qb + ia * D + c), __builtin_prefetch(gb + ia * D + c);
    }
    kg.add_pair(x->key, rare_p[x->g], rare_ds[x->g], qb + x->row * D, gb + x->row * D);
  }
}

// Backward of rows [i0, i0 + R) of head bh through their tile of the head's keys, its dK and dV accumulating in place
// (heads run one per task, their units in order: deterministic without atomics).
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void backward_block(const Problem<T>& p, int64_t bh, const BlockPlan& plan, HeadTiles<T>& h,
                                      const T* o, const T* g, const T* lse, T* dq, HeadKeyGrads<T>& kg, T* rare_p,
                                      T* rare_ds) {
  const int64_t D = p.D, at = bh * p.Tq + plan.i0;
  const T* kb = p.k + bh * p.S * D;
  const T* vb = p.v + bh * p.S * D;
  backward_tile<kIsa>(
      p, plan.R, plan, p.q + at * D, g + at * D, o + at * D, lse + at, h.kt.data(), h.vt.data(), h.ldt, kb, kb, vb,
      h.tile, h.dtile, dq + at * D, kg.dk, kg.dv, [&](int64_t a, int64_t len) { kg.need(a, a + len); }, rare_p,
      rare_ds);
}

// Backward of a row group of head bh: its rows of q, dO, o and lse gathered (false, nothing written, where one of
// them or a key is not finite: the caller takes the row path), backward_tile into the group's dK_U, dV_U, then dq put
// in place and dK_U, dV_U added into the head's rows of the union's keys.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE bool backward_group(const Problem<T>& p, int64_t bh, const BlockPlan& plan, GroupTiles<T>& c,
                                      const T* o, const T* g, const T* lse, T* dq, HeadKeyGrads<T>& kg) {
  const int64_t D = p.D, R = plan.R, u = plan.u;
  if (!gather_group_keys<kIsa>(p, bh, plan, c, /*backward=*/true)) return false;
  gather_rows(p.q + bh * p.Tq * D, plan.rows.data(), R, D, c.x);
  gather_rows(g + bh * p.Tq * D, plan.rows.data(), R, D, c.g);
  if (!rows_finite(c.x.data(), R * D) || !rows_finite(c.g.data(), R * D)) return false;
  gather_rows(o + bh * p.Tq * D, plan.rows.data(), R, D, c.o);
  if (c.lse.size() < static_cast<size_t>(R)) c.lse.resize(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) c.lse[r] = lse[bh * p.Tq + plan.rows[r]];
  if (c.y.size() < static_cast<size_t>(R * D)) c.y.resize(static_cast<size_t>(R * D));
  for (Scratch<T>* b : {&c.dk, &c.dv})
    if (b->size() < static_cast<size_t>(u * D)) b->resize(static_cast<size_t>(u * D));
  std::fill(c.dk.data(), c.dk.data() + u * D, T(0));
  std::fill(c.dv.data(), c.dv.data() + u * D, T(0));
  backward_tile<kIsa>(
      p, R, plan, c.x.data(), c.g.data(), c.o.data(), c.lse.data(), c.kt.data(), c.vt.data(), c.ldu, c.k.data(),
      c.k.data(), c.v.data(), c.tile, c.dtile, c.y.data(), c.dk.data(), c.dv.data(), [](int64_t, int64_t) {},
      static_cast<T*>(nullptr),
      static_cast<T*>(nullptr));  // a group has no rare keys
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(dq + (bh * p.Tq + plan.rows[r]) * D, c.y.data() + r * D, sizeof(T) * static_cast<size_t>(D));
  for (int64_t x = 0; x < u; ++x) {
    const int64_t j = plan.keys[x];
    kg.need_key(j);
    axpy(T(1), c.dk.data() + x * D, kg.dk + j * D, D);
    axpy(T(1), c.dv.data() + x * D, kg.dv + j * D, D);
  }
  return true;
}

// Backward of one query row pair by pair, scattering into the head's dK and dV (the blocks a tile cannot take).
template <class T>
ASC_ALWAYS_INLINE void backward_row_scatter(const Problem<T>& p, int64_t bh, int64_t i, const T* pr, const T* dr,
                                            const T* qi, const T* gi, HeadKeyGrads<T>& kg) {
  const auto [e0, len] = p.row(bh, i);
  for (int64_t x = 0; x < len; ++x) kg.add_pair(p.cols[e0 + x], pr[x], dr[x], qi, gi);
}

// The backward of a single (batch, head): two passes parallel within the head (rows, then keys over the transpose).
template <class T>
void backward_two_pass(const Problem<T>& p, const SparsePatternView& pat, const Tensor& ot, const Tensor& gt,
                       const Tensor& lse_t, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D, G = p.G;
  const T* o = ot.data_ptr<T>();
  const T* g = gt.data_ptr<T>();
  const T* lse = lse_t.data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  const SparsePatternLists& lists = pat.lists;
  ASC_CHECK(lists.col_ptr != nullptr, "sparse_attention backward: the pattern's transpose was not passed");
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
        ASC_CPU_DISPATCH(backward_row<kIsa>(p, bh, i, lse[bh * Tq + i], ob + i * D, gb + i * D, prob.data() + e0,
                                            dsc.data() + e0, dqp + (bh * Tq + i) * D));
      }
    });
    // Pass 2, per key: dv and dk from the queries that see it.
    parallel_for(S, p.cost(2), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        ASC_CPU_DISPATCH(backward_key(p, col_rows, col_pos, col_ptr[gr * S + j], col_ptr[gr * S + j + 1], base,
                                      prob.data(), dsc.data(), qb, gb, dkp + (bh * S + j) * D, dvp + (bh * S + j) * D));
    });
  }
}

template <class T>
void backward_impl(const Tensor& qt, const Tensor& kt, const Tensor& vt, const SparsePatternView& pat,
                   const Tensor& keep, double scale, const Tensor& ot, const Tensor& gt, const Tensor& lse_t,
                   Tensor& dq, Tensor& dk, Tensor& dv) {
  const Problem<T> p(qt, kt, vt, pat, keep, scale);
  const int64_t B = p.B, H = p.H, Tq = p.Tq, S = p.S, D = p.D;
  if (B * H == 1) return backward_two_pass(p, pat, ot, gt, lse_t, dq, dk, dv);
  // Heads in parallel, each one's blocks in order (its dK, dV accumulate in place): tiles where the plan allows.
  const T* o = ot.data_ptr<T>();
  const T* g = gt.data_ptr<T>();
  const T* lse = lse_t.data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows;
  const Plans plans(p, p.D, pat, blocks, p.cost(1) * kBlockRows);
  parallel_for(B * H, p.cost(5) * Tq, [&](int64_t h0, int64_t h1) {
    Scratch<T> pr(static_cast<size_t>(std::max<int64_t>(pat.max_row, 1))), dr(pr.size());
    HeadTiles<T> h(S, D, /*backward=*/true);
    GroupTiles<T> c;
    HeadKeyGrads<T> kg;
    Scratch<T> rare_p, rare_ds;  // the head's rare pairs' P and dS, by their owner-wide numbers
    for (int64_t bh = h0; bh < h1; ++bh) {
      kg.start(dkp + bh * S * D, dvp + bh * S * D, S, D);
      const auto [first, last] = plans.units(bh);
      const auto [rare_first, rare_last] = plans.rare_pairs(bh);
      const size_t rare_count = static_cast<size_t>(rare_last - rare_first);
      if (rare_p.size() < rare_count) rare_p.resize(rare_count), rare_ds.resize(rare_count);
      std::fill(rare_p.data(), rare_p.data() + rare_count, T(0));
      std::fill(rare_ds.data(), rare_ds.data() + rare_count, T(0));
      for (const BlockPlan* plan = first; plan != last; ++plan) {
        if (plan->tiled && !plan->keys.empty()) {
          if (ASC_CPU_DISPATCH(backward_group<kIsa>(p, bh, *plan, c, o, g, lse, dqp, kg))) continue;
        } else if (plan->tiled) {
          if (h.head != bh) start_head(p, bh, h);
          const int64_t at = (bh * Tq + plan->i0) * D;
          if (ASC_CPU_DISPATCH(tile_keys_ready<kIsa>(p, *plan, h)) && rows_finite(p.q + at, plan->R * D) &&
              rows_finite(g + at, plan->R * D)) {
            ASC_CPU_DISPATCH(backward_block<kIsa>(p, bh, *plan, h, o, g, lse, dqp, kg, rare_p.data(), rare_ds.data()));
            continue;
          }
        }
        for_rows(*plan, [&](int64_t i) {
          const int64_t at = (bh * Tq + i) * D;
          ASC_CPU_DISPATCH(
              backward_row<kIsa>(p, bh, i, lse[bh * Tq + i], o + at, g + at, pr.data(), dr.data(), dqp + at));
          ASC_CPU_DISPATCH(backward_row_scatter(p, bh, i, pr.data(), dr.data(), p.q + at, g + at, kg));
        });
      }
      ASC_CPU_DISPATCH(backward_rare_keys(p, bh, rare_first, rare_last, g, rare_p.data(), rare_ds.data(), kg));
      kg.finish();
    }
  });
}

}  // namespace

SparsePlanSummary sparse_attention_plan_summary(const SparsePatternView& pattern, int64_t head_dim) {
  ASC_CHECK(pattern.lists.row_ptr != nullptr && head_dim >= 1,
            "sparse_attention_plan_summary: needs a pattern with lists on the CPU and head_dim >= 1");
  const int64_t G = pattern.groups, Tq = pattern.queries;
  const PatternRows p{.B = 1,
                      .H = G,
                      .Tq = Tq,
                      .S = pattern.keys,
                      .G = G,
                      .row_ptr = pattern.lists.row_ptr,
                      .cols = pattern.lists.cols,
                      .keep = nullptr};
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows;
  const Plans plans(p, head_dim, pattern, blocks, int64_t{1} << 20);
  SparsePlanSummary s;
  for (int64_t g = 0; g < G; ++g) {
    const auto [first, last] = plans.units(g);
    for (const BlockPlan* plan = first; plan != last; ++plan) {
      const int64_t rows = plan->rows.empty() ? plan->R : static_cast<int64_t>(plan->rows.size());
      if (!plan->tiled) {
        s.row_path_rows += rows;
      } else if (plan->keys.empty()) {
        ++s.tiled_blocks;
      } else {
        ++s.row_groups, s.grouped_rows += rows;
      }
    }
  }
  return s;
}

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
