#pragma once
// C = A B (or C += A B) where the inner dimension K or the width N is short — the latent widths d_z, d_a of ASCender
// attention, 8 to 32 — and a BLAS GEMM spends more time zeroing C (beta = 0), packing and on edge tiles than
// multiplying: (128 x 512) x 16 runs in about half of OpenBLAS's time, (128 x 16) x 512 in two thirds.
// Register-blocked 4 (8 at x86-64-v4) rows x 2 vectors of C, K summed in registers, C written once; no packing: B is
// read as it lies, K x N row-major (for the (rows, keys) products, a transposed copy of the keys' rows); A is read
// through any strides. gemm_narrow_blocked cuts a long B into blocks that stay in L2 (dense attention over long
// sequences).
//
// Include it inside the caller's `#pragma GCC optimize` region and call it from a kernel that ASC_CPU_DISPATCH runs
// (ops/cpu/vec_math.h): it is forced inline, so each level gets its own copy (GCC vector extensions lower to AVX2 +
// FMA at x86-64-v3, to AVX-512 at x86-64-v4 and to SSE2 on the baseline).
//
//   gemm_narrow<float>(R, n, dz, z_rows, dz, zT, n, zdot, n);  // zdot (R, n) = z_rows (R, dz) · zT (dz, n)
//   gemm_narrow<float>(R, dz, n, w, n, z, dz, c, dz);          // c (R, dz) = w (R, n) · z (n, dz)
//   gemm_dots<float, kIsa>(R, dz, n, w, n, zT, n, c, dz);      // the same c from zT (dz, n): faster when n is long
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ops/cpu/vec_math.h"

namespace asc::cpu {

// Rows i .. i + kRows - 1, columns j .. j + 2 L of C (L lanes of kBytes-byte vectors): K summed in 2 kRows vector
// registers (8 for the 4-row tiles; fewer for the last M % 4 rows, which would otherwise take a scalar loop over N × K:
// a window's 271 keys as the rows of dK += dSᵀ Q). The accumulators are indexed by constants only once the row loops
// unroll, so GCC keeps them in registers. Vectors move through memcpy (unaligned loads and stores) and never cross a
// call: no lambdas here (GCC warns that passing them changes the ABI between the levels).
template <class T, int kBytes, int kRows>
ASC_ALWAYS_INLINE void gemm_narrow_tile(int64_t i, int64_t j, int64_t K, const T* A, int64_t sam, int64_t sak,
                                        const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  typedef T V __attribute__((vector_size(kBytes)));
  constexpr int64_t L = kBytes / sizeof(T);
  V c0[kRows] = {}, c1[kRows] = {};
  for (int64_t c = 0; c < K; ++c) {
    V b0, b1;
    std::memcpy(&b0, B + c * ldb + j, sizeof(V));
    std::memcpy(&b1, B + c * ldb + j + L, sizeof(V));
    for (int r = 0; r < kRows; ++r) {
      const T x = A[(i + r) * sam + c * sak];
      c0[r] += x * b0, c1[r] += x * b1;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    T* cr = C + (i + r) * ldc + j;
    if (accumulate) {
      V t;
      std::memcpy(&t, cr, sizeof(V)), c0[r] += t, std::memcpy(&t, cr + L, sizeof(V)), c1[r] += t;
    }
    std::memcpy(cr, &c0[r], sizeof(V)), std::memcpy(cr + L, &c1[r], sizeof(V));
  }
}

// Rows i .. i + kRows - 1 of gemm_narrow (below), every column: 512-bit tiles at x86-64-v4, 256-bit ones, one more
// 256-bit tile in the room, a 128-bit one (8 float or 4 double columns: d_z = 8 is a whole tile), then scalars.
template <class T, CpuIsa kIsa, int kRows>
ASC_ALWAYS_INLINE void gemm_narrow_rows(int64_t i, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak,
                                        const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate, int64_t room) {
  // columns per 128-bit, 256-bit and 512-bit tile (a tile is two vectors wide)
  constexpr int64_t W1 = 32 / sizeof(T), W = 64 / sizeof(T), W2 = 128 / sizeof(T);
  int64_t j = 0;
  if constexpr (kIsa == CpuIsa::x86_64_v4)
    for (; j + W2 <= N; j += W2) gemm_narrow_tile<T, 64, kRows>(i, j, K, A, sam, sak, B, ldb, C, ldc, accumulate);
  for (; j + W <= N; j += W) gemm_narrow_tile<T, 32, kRows>(i, j, K, A, sam, sak, B, ldb, C, ldc, accumulate);
  if (j < N && j + W <= room) {  // the tail in the room: one vector tile
    gemm_narrow_tile<T, 32, kRows>(i, j, K, A, sam, sak, B, ldb, C, ldc, accumulate);
    j = N;
  }
  // Without it a d_z of 8 went column by column through the scalar loop below: ASCender's cohesion and latent
  // products at d_z = 8 took 10-20x their vector time.
  for (; j + W1 <= N; j += W1) gemm_narrow_tile<T, 16, kRows>(i, j, K, A, sam, sak, B, ldb, C, ldc, accumulate);
  for (; j < N; ++j)  // the last < W1 columns
    for (int64_t r = i; r < i + kRows; ++r) {
      T s = 0;
      for (int64_t c = 0; c < K; ++c) s += A[r * sam + c * sak] * B[c * ldb + j];
      C[r * ldc + j] = accumulate ? C[r * ldc + j] + s : s;
    }
}

// C (M, N) = A (M, K; element (i, c) at A[i * sam + c * sak]) · B (K, N; row stride ldb, columns contiguous), into
// C (row stride ldc); accumulate: C += A B. A is read one scalar at a time (broadcast), so any strides cost the same:
// sam = 1, sak = rows multiplies by a transposed tile without copying it. Tiles of 4 rows by 2 vectors, 8 rows at
// x86-64-v4 (16 accumulators of its 32 vector registers: each load of B feeds twice the FMAs; each element's sum is
// the same sum in the same order, so the same bits). At x86-64-v4 (kIsa, from ASC_CPU_DISPATCH; below it 256-bit
// tiles only) 512-bit vectors where 32 float columns remain (16 doubles), then 256-bit ones (16 floats, 8 doubles: a
// short N such as d_z = 16 keeps its vector tile), then scalars.
//
// room >= N: the columns of B's and C's rows that may be read and written, whatever they hold (a scratch tile whose
// next columns are written later). Where the last < 16 float columns fit in it, they take one more 256-bit tile
// instead of the scalar loop, which costs about as much as 16 vector columns: without it, a 268-key window (8 tiles
// of 32 and 12 scalar columns) spent 40 % of its product's time on those 12. Columns N .. room of C may then hold
// anything (NaN included: B's extra columns are not read as numbers the caller uses).
template <class T, CpuIsa kIsa = CpuIsa::baseline>
ASC_ALWAYS_INLINE void gemm_narrow(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B,
                                   int64_t ldb, T* C, int64_t ldc, bool accumulate = false, int64_t room = 0) {
  int64_t i = 0;
  if constexpr (kIsa == CpuIsa::x86_64_v4)
    for (; i + 8 <= M; i += 8) gemm_narrow_rows<T, kIsa, 8>(i, N, K, A, sam, sak, B, ldb, C, ldc, accumulate, room);
  for (; i + 4 <= M; i += 4) gemm_narrow_rows<T, kIsa, 4>(i, N, K, A, sam, sak, B, ldb, C, ldc, accumulate, room);
  // the last < 4 rows
  if (M - i == 3) gemm_narrow_rows<T, kIsa, 3>(i, N, K, A, sam, sak, B, ldb, C, ldc, accumulate, room);
  if (M - i == 2) gemm_narrow_rows<T, kIsa, 2>(i, N, K, A, sam, sak, B, ldb, C, ldc, accumulate, room);
  if (M - i == 1) gemm_narrow_rows<T, kIsa, 1>(i, N, K, A, sam, sak, B, ldb, C, ldc, accumulate, room);
}

// A row-major (row stride lda).
template <class T, CpuIsa kIsa = CpuIsa::baseline>
ASC_ALWAYS_INLINE void gemm_narrow(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                                   T* C, int64_t ldc, bool accumulate = false) {
  gemm_narrow<T, kIsa>(M, N, K, A, lda, 1, B, ldb, C, ldc, accumulate);
}

// gemm_narrow over blocks of B of at most 256 x 256 (256 KiB of float, within L2): every tile of rows of A reads all of
// the B they multiply, so a long B (the keys of a 4096-token sequence) must be cut, or it streams from L3 per row
// block. The blocks of K accumulate into C in order, so the result does not depend on anything but the shapes.
// room: as gemm_narrow's, for the last block of columns.
template <class T, CpuIsa kIsa = CpuIsa::baseline>
ASC_ALWAYS_INLINE void gemm_narrow_blocked(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak,
                                           const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate = false,
                                           int64_t room = 0) {
  constexpr int64_t kBlock = 256;
  if (K == 0 && !accumulate)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = T(0);
  for (int64_t k0 = 0; k0 < K; k0 += kBlock)
    for (int64_t j0 = 0; j0 < N; j0 += kBlock)
      gemm_narrow<T, kIsa>(M, std::min(kBlock, N - j0), std::min(kBlock, K - k0), A + k0 * sak, sam, sak,
                           B + k0 * ldb + j0, ldb, C + j0, ldc, accumulate || k0 > 0, j0 + kBlock >= N ? room - j0 : 0);
}

// GCC's vector of kBytes bytes of E.
template <class E, size_t kBytes>
struct SimdOf {
  typedef E type __attribute__((vector_size(kBytes)));
};

// The two shuffles that swap the off-diagonal h x h blocks of rows a and b of an L-lane tile: lanes x with x & h set
// come from b. __builtin_shuffle(a, b, lo) = a's lanes with b's in those places, shifted down by h; hi: the rest.
template <class V, int64_t L, int64_t h>
struct SwapMasks {
  using M = typename SimdOf<std::conditional_t<sizeof(V) / L == 4, int32_t, int64_t>, sizeof(V)>::type;
  static constexpr std::pair<M, M> masks = []<int64_t... x>(std::integer_sequence<int64_t, x...>) {
    return std::pair<M, M>{M{((x & h) ? L + x - h : x)...}, M{((x & h) ? L + x : x + h)...}};
  }
  (std::make_integer_sequence<int64_t, L>{});
  static constexpr M lo = masks.first, hi = masks.second;
};

// An L x L tile (L = lanes of V) transposed in registers: log2 L rounds, each swapping the off-diagonal h x h blocks
// of every 2h x 2h block (h = L/2, ..., 1) — rows i and i + h exchange their lanes x with x & h set.
template <class V, int64_t L, int64_t h>
ASC_ALWAYS_INLINE void transpose_round(V* r) {
  using S = SwapMasks<V, L, h>;
  for (int64_t i = 0; i < L; ++i)
    if ((i & h) == 0) {
      const V a = r[i], b = r[i + h];
      r[i] = __builtin_shuffle(a, b, S::lo);
      r[i + h] = __builtin_shuffle(a, b, S::hi);
    }
  if constexpr (h > 1) transpose_round<V, L, h / 2>(r);
}

// The horizontal sums of L vectors r[0 .. L) into r[0], lane k = the sum of r[k]'s lanes: log2 L rounds, each adding
// vectors i and i + h (h = L/2, ..., 1) as the transpose swaps them, so that half the vectors remain.
template <class V, int64_t L, int64_t h>
ASC_ALWAYS_INLINE void sum_lanes_round(V* r) {
  using S = SwapMasks<V, L, h>;
  for (int64_t i = 0; i < h; ++i)
    r[i] = __builtin_shuffle(r[i], r[i + h], S::lo) + __builtin_shuffle(r[i], r[i + h], S::hi);
  if constexpr (h > 1) sum_lanes_round<V, L, h / 2>(r);
}

// Lane x of a vector of L lanes takes lane x + h (mod L): one round of a horizontal fold.
template <class V, int64_t L, int64_t h>
struct FoldMask {
  using M = typename SimdOf<std::conditional_t<sizeof(V) / L == 4, int32_t, int64_t>, sizeof(V)>::type;
  struct Box {  // returned in a struct, as SwapMasks' pair: a bare vector return changes the ABI between levels
    M m;
  };
  static constexpr M mask = []<int64_t... x>(std::integer_sequence<int64_t, x...>) { return Box{M{((x + h) % L)...}}; }
  (std::make_integer_sequence<int64_t, L>{}).m;
};
// v's lanes folded into lane 0 (by reference: a vector passed by value across levels changes the ABI).
template <class V, int64_t L, int64_t h>
ASC_ALWAYS_INLINE void fold_sum(V& v) {
  v += __builtin_shuffle(v, FoldMask<V, L, h>::mask);
  if constexpr (h > 1) fold_sum<V, L, h / 2>(v);
}
template <class V, int64_t L, int64_t h>
ASC_ALWAYS_INLINE void fold_max(V& v) {
  const V w = __builtin_shuffle(v, FoldMask<V, L, h>::mask);
  v = w > v ? w : v;
  if constexpr (h > 1) fold_max<V, L, h / 2>(v);
}

// The sum and the max of a short row (the keys of one attention row), in a 64-byte vector and then log2 L rounds of
// shuffles. Why not `omp simd reduction`: GCC ends it with L - 1 scalar operations in one chain (60 cycles for 16
// floats), which a row of 128 keys (8 vectors) pays as much as its loop. row_max skips NaN (x > m is false), as the
// scalar `m = x > m ? x : m` does; -inf when n = 0. The sum's order is the lanes', not the elements'.
template <class T>
ASC_ALWAYS_INLINE T row_sum(const T* x, int64_t n) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  V acc{}, t;
  int64_t s = 0;
  for (; s + L <= n; s += L) std::memcpy(&t, x + s, sizeof(V)), acc += t;
  fold_sum<V, L, L / 2>(acc);
  T sum = acc[0];
  for (; s < n; ++s) sum += x[s];
  return sum;
}
template <class T>
ASC_ALWAYS_INLINE T row_max(const T* x, int64_t n) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  constexpr T ninf = -__builtin_inf();
  V m, t;
  for (int64_t l = 0; l < L; ++l) m[l] = ninf;
  int64_t s = 0;
  for (; s + L <= n; s += L) std::memcpy(&t, x + s, sizeof(V)), m = t > m ? t : m;
  fold_max<V, L, L / 2>(m);
  T r = m[0];
  for (; s < n; ++s) r = x[s] > r ? x[s] : r;
  return r;
}

// out[r] = a_r · b_r for the L = 16 float (8 double) rows r (a_r at a + r · sa, b_r at b + r · sb, D contiguous
// columns each): a vector of partial sums per row, then all of their horizontal sums at once (sum_lanes_round),
// which come out in row order in one vector.
template <class T>
ASC_ALWAYS_INLINE void row_dots_lanes(const T* a, int64_t sa, const T* b, int64_t sb, int64_t D, T* out) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  const int64_t Dv = D / L * L;
  V acc[L], av, bv;
  for (int64_t r = 0; r < L; ++r) acc[r] = V{};
  for (int64_t c = 0; c < Dv; c += L)
    for (int64_t r = 0; r < L; ++r) {
      std::memcpy(&av, a + r * sa + c, sizeof(V)), std::memcpy(&bv, b + r * sb + c, sizeof(V));
      acc[r] += av * bv;
    }
  sum_lanes_round<V, L, L / 2>(acc);
  for (int64_t r = 0; r < L; ++r) {
    T t = 0;  // the last D % L columns
    for (int64_t c = Dv; c < D; ++c) t += a[r * sa + c] * b[r * sb + c];
    out[r] = acc[0][r] + t;
  }
}

// C (M, N) = A (M, K) · B (K, N) with B given transposed, Bᵀ (N, K) at Bt (row stride ldbt): the products whose inner
// dimension is long (the keys) and whose width N is short (d_z, d_a), such as the centroids Σ_j w_ij z_j — a row of C
// is N dot products of length K. Two rows of A and G = L/2 columns of C at a time (L = lanes of a vector):
// L vectors of partial sums, each load of Bᵀ feeding both rows' full-width FMAs, then all L horizontal sums at once
// (sum_lanes_round: lanes 0..G-1 the first row's, G..L-1 the second's). gemm_narrow's tiles broadcast A one scalar
// at a time into N-wide accumulators (half-width vectors at N = 16 floats) and ran these at about half the rate. The
// sum's order is the lanes', then the last K % L terms in order.
template <class T, CpuIsa kIsa = CpuIsa::baseline>
ASC_ALWAYS_INLINE void gemm_dots(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bt, int64_t ldbt,
                                 T* C, int64_t ldc, bool accumulate = false) {
  // The processor's vector width (kIsa, from ASC_CPU_DISPATCH): the L accumulators and two rows of A fit its
  // registers — 32 of 64 bytes at x86-64-v4, 16 of 32 at x86-64-v3, 16 of 16 below (wider ones spilled at v3).
  constexpr int kBytes = kIsa == CpuIsa::x86_64_v4 ? 64 : kIsa == CpuIsa::x86_64_v3 ? 32 : 16;
  typedef T V __attribute__((vector_size(kBytes)));
  constexpr int64_t L = kBytes / sizeof(T), G = L / 2;
  const int64_t Kv = K / L * L;
  for (int64_t c0 = 0; c0 < N; c0 += G) {
    const int64_t nc = N - c0 < G ? N - c0 : G;
    const T* B0 = Bt + c0 * ldbt;
    for (int64_t i = 0; i < M; i += 2) {
      const T* a0 = A + i * lda;
      const T* a1 = i + 1 < M ? a0 + lda : a0;  // an odd last row: computed twice, stored once
      V acc[L] = {};
      if (nc == G) {
        for (int64_t k = 0; k < Kv; k += L) {
          V x0, x1, bv;
          std::memcpy(&x0, a0 + k, sizeof(V)), std::memcpy(&x1, a1 + k, sizeof(V));
#pragma GCC unroll 16
          for (int64_t c = 0; c < G; ++c)
            std::memcpy(&bv, B0 + c * ldbt + k, sizeof(V)), acc[c] += x0 * bv, acc[G + c] += x1 * bv;
        }
      } else {
        for (int64_t k = 0; k < Kv; k += L) {
          V x0, x1, bv;
          std::memcpy(&x0, a0 + k, sizeof(V)), std::memcpy(&x1, a1 + k, sizeof(V));
          for (int64_t c = 0; c < nc; ++c)
            std::memcpy(&bv, B0 + c * ldbt + k, sizeof(V)), acc[c] += x0 * bv, acc[G + c] += x1 * bv;
        }
      }
      sum_lanes_round<V, L, L / 2>(acc);  // lane r G + c of acc[0]: row i + r, column c0 + c, over the first Kv terms
      for (int64_t r = 0; r < 2 && i + r < M; ++r) {
        const T* a = r == 0 ? a0 : a1;
        T* cr = C + (i + r) * ldc + c0;
        for (int64_t c = 0; c < nc; ++c) {
          T t = acc[0][r * G + c];
          for (int64_t k = Kv; k < K; ++k) t += a[k] * B0[c * ldbt + k];
          cr[c] = accumulate ? cr[c] + t : t;
        }
      }
    }
  }
}

// The B operand of a product over keys: a transposed copy of rows [0, n) of a (n, D) operand with strides (st, sd),
// out (D, n) with rows ld apart (gemm_narrow reads B's rows contiguously). At x86-64-v4 (kIsa) contiguous rows
// (sd = 1) go in tiles of 8 x 8 floats (4 x 4 doubles) transposed in registers (two-source permutes; AVX2 has none,
// and the same code was slower there than the loop); the edges, other levels and other strides in blocks of 16 keys,
// so that each row of `out` gets whole cache lines. ld = transposed_ld(n) pads the rows off powers of two, or rows 4
// KiB apart would all map to one L1 set, and leaves at least 16 columns of room after the last key (zeroed here
// unless zero_room is false: a caller that transposes a long operand a slice at a time) for gemm_narrow's tail tile.
template <class T, CpuIsa kIsa = CpuIsa::baseline>
ASC_ALWAYS_INLINE void transpose_rows(const T* x, int64_t st, int64_t sd, int64_t n, int64_t D, T* out, int64_t ld,
                                      bool zero_room = true) {
  typedef T V __attribute__((vector_size(32)));
  constexpr int64_t L = 32 / sizeof(T), kKeys = 16;
  const int64_t nt = kIsa == CpuIsa::x86_64_v4 && sd == 1 ? n / L * L : 0;  // keys the tiles cover
  const int64_t Dt = D / L * L;                                             // and columns
  for (int64_t j0 = 0; j0 < nt; j0 += L) {
    for (int64_t c0 = 0; c0 < Dt; c0 += L) {
      V r[L];
      for (int64_t i = 0; i < L; ++i) std::memcpy(&r[i], x + (j0 + i) * st + c0, sizeof(V));
      transpose_round<V, L, L / 2>(r);
      for (int64_t i = 0; i < L; ++i) std::memcpy(out + (c0 + i) * ld + j0, &r[i], sizeof(V));
    }
    for (int64_t c = Dt; c < D; ++c)
      for (int64_t j = j0; j < j0 + L; ++j) out[c * ld + j] = x[j * st + c];
  }
  for (int64_t j0 = nt; j0 < n; j0 += kKeys) {
    const int64_t j1 = std::min(n, j0 + kKeys);
    for (int64_t c = 0; c < D; ++c)
      for (int64_t j = j0; j < j1; ++j) out[c * ld + j] = x[j * st + c * sd];
  }
  if (zero_room)
    for (int64_t c = 0; c < D; ++c)
      for (int64_t j = n; j < ld; ++j) out[c * ld + j] = T(0);
}
constexpr int64_t transposed_ld(int64_t n) { return (n + 15) / 16 * 16 + 16; }

}  // namespace asc::cpu
