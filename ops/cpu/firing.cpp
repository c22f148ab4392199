// CPU kernels of the firing perceptron's output (ops/firing.h, docs/firing.md §1-2).
//
// Forward: rows b of Z (N, P) in parallel; a silent neuron's outputs are exact zeros, an undefined one's (Z or SP NaN)
// NaN. Backward: tasks of (row chunk, neuron range), each summing its dSP and df in the layer's dtype over blocks of
// 64 rows and then in float64 per chunk, the chunks added in a fixed order: the result does not depend on the thread
// count; with the exact gate a silent (b, p) gets dZ = 0 and adds nothing, and in rows where few neurons fire it is
// skipped outright. Then rule B's weight update (firing_weight_update), which skips zero coefficients, its per-neuron
// sums and coefficients (firing_batch_sums, firing_rule_b_coef), and the SSM scan. Every kernel splits its work by a
// plan that fixes the order of every floating-point sum independently of the thread count — the weight update's dense
// GEMMs only with use_deterministic_algorithms (by default one GEMM per thread, see firing_weight_update).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/determinism.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

// No trapping math in the kernels (as in ops/cpu/nn.cpp): GCC then if-converts the float selects of exp_nonpos and of
// the surrogate derivatives, so their loops vectorise. Functions defined outside this region are not inlined into it,
// so the loops use builtins (__builtin_fabs, __builtin_bit_cast) and plain expressions.
#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // inside the region: exp_nonpos

namespace asc::cpu {

namespace {

// v where `on`, else +0 exactly (not f·0, which is -0 or NaN for a negative or infinite f), without a branch: a
// firing pattern near rate 0.5 defeats the branch predictor, and GCC turns `on ? v : 0` into a jump here.
template <class T>
ASC_ALWAYS_INLINE T keep_if(T v, bool on) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  return __builtin_bit_cast(T, __builtin_bit_cast(U, v) & (U(0) - U(on)));
}

// A task's cost for parallel_for, saturated at the grain (beyond it the split is the same): parallel_for multiplies it
// by the task count, and a product of sizes must not overflow (an empty tensor may have one huge dimension).
inline int64_t capped_cost(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) || r > kParallelGrain ? kParallelGrain : r;
}

// Calls fn(std::integral_constant<int, kA>) with kA = α for the common fan-outs 1, 2, 4, so the kernels' g loops
// unroll, and kA = 0 (α read at run time) for any other.
template <class F>
decltype(auto) with_fan_out(int64_t A, F&& fn) {
  switch (A) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// The forward over rows [b0, b1); kA as in with_fan_out.
template <class T, int kA>
ASC_ALWAYS_INLINE void forward_rows(const T* z, const T* sp, const T* fw, T* Fp, T* y, int64_t b0, int64_t b1,
                                    int64_t P, int64_t A_) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr U kOne = __builtin_bit_cast(U, T(1)), kQNaN = __builtin_bit_cast(U, std::numeric_limits<T>::quiet_NaN());
  const int64_t A = kA > 0 ? kA : A_;
  for (int64_t b = b0; b < b1; ++b) {
    const T* zr = z + b * P;
    T* Fr = Fp + b * P;
    T* yr = y + b * P * A;
    for (int64_t p = 0; p < P; ++p) {
      // Fires (Z >= SP), silent, or undefined (Z or SP NaN: the compare is unordered), where F and every output are
      // NaN — NaN stays visible, as F f Z gives in IEEE arithmetic. The undefined case ORs quiet-NaN bits into F and
      // Y (any bits | a quiet NaN's is a NaN): one more compare and two ORs a neuron, no branch, no multiply.
      const T zv = zr[p];
      const bool fires = zv >= sp[p];
      const U nan = kQNaN & (U(0) - U(__builtin_isunordered(zv, sp[p])));
      Fr[p] = __builtin_bit_cast(T, (kOne & (U(0) - U(fires))) | nan);
      for (int64_t g = 0; g < A; ++g)
        yr[p * A + g] = __builtin_bit_cast(T, __builtin_bit_cast(U, keep_if(fw[p * A + g] * zv, fires)) | nan);
    }
  }
}

}  // namespace

void firing_forward(const Tensor& Z, const Tensor& SP, const Tensor& f, Tensor& F, Tensor& Y) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  if (N == 0 || P == 0) return;  // nothing to do (and no row loop over a huge empty N)
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_output", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>(), *fw = f.data_ptr<scalar_t>();
    scalar_t *Fp = F.data_ptr<scalar_t>(), *y = Y.data_ptr<scalar_t>();
    parallel_for(N, capped_cost(P, A + 1), [&](int64_t b0, int64_t b1) {
      with_fan_out(A, [&](auto kA) {
        constexpr int a = decltype(kA)::value;
        ASC_CPU_DISPATCH(forward_rows<scalar_t, a>(z, sp, fw, Fp, y, b0, b1, P, A));
      });
    });
  });
}

namespace {

// s'(u) at u = Z − SP for one row, in float64: 1 for straight-through (kind < 0), a built-in surrogate's
// derivative (math::surrogate_derivative's formulas as loops that vectorise: the sigmoid's exp is exp_nonpos), or a
// user-registered one (a call per neuron).
constexpr int kStraightThrough = -1, kUserSurrogate = -2;
template <math::SurrogateKind K, class T>
ASC_ALWAYS_INLINE void row_builtin(double w, const T* zr, const T* sp, int64_t P, double* d) {
  const auto ex = [](double x) __attribute__((always_inline)) { return exp_nonpos(x); };
  for (int64_t p = 0; p < P; ++p) d[p] = math::surrogate_derivative_of<K>(double(zr[p]) - double(sp[p]), w, ex);
}
template <class T>
ASC_ALWAYS_INLINE void row_derivative(int kind, const Surrogate& s, double w, const T* zr, const T* sp, int64_t P,
                                      double* d) {
  using K = math::SurrogateKind;
  switch (kind) {
    case kStraightThrough:
      for (int64_t p = 0; p < P; ++p) d[p] = 1.0;
      return;
    case kUserSurrogate:
      for (int64_t p = 0; p < P; ++p) d[p] = s.derivative(double(zr[p]) - double(sp[p]), w);
      return;
    case int(K::Sigmoid): return row_builtin<K::Sigmoid>(w, zr, sp, P, d);
    case int(K::Rectangular): return row_builtin<K::Rectangular>(w, zr, sp, P, d);
    case int(K::Triangular): return row_builtin<K::Triangular>(w, zr, sp, P, d);
    case int(K::Atan): return row_builtin<K::Atan>(w, zr, sp, P, d);
  }
}

// The backward over rows [b0, b1) and neurons [p0, p1): dZ = S (F + Z s'), and the block's contributions to dSP
// (−S Z s') and df (dY F Z) added into the caller's float64 accumulators (indexed by neuron: acc_sp[p], acc_f[p α +
// g]), with S = Σ_g dY f. kind as in row_derivative; kA as in with_fan_out. A silent (b, p) adds nothing to df, even
// where dY is not finite; an undefined one (F NaN: Z or SP was NaN) makes dZ, dSP and df NaN — with the exact gate
// too, where dSP is otherwise 0 (F − F is 0 for F ∈ {0, 1}, NaN for NaN; Z F is Z exactly where the neuron fires).
// Per row, branch-free loops over the block's neurons that vectorise (keep_if zeroes what a silent neuron must not
// contribute): s' (float64), df's partial sums, then S, dZ and dSP's partial sums. The partial sums are kept in T
// over blocks of kFlushRows rows counted from b0 (a float32 sum of at most 64 terms), then added into the float64
// accumulators: about twice as fast as a float64 loop per neuron (bench_firing; bench/results). With the exact gate a
// row where fewer than a quarter of the block's
// neurons fire visits only those. The caller gives the scratch: pf (n α) and psp (n) zeroed, zdp (n), d (n) — the
// block allocates nothing.
constexpr int64_t kFlushRows = 64;
template <class T, int kA, bool kExact>
ASC_ALWAYS_INLINE void backward_block_body(const T* z, const T* sp, const T* fw, const T* Fp, const T* dy, int64_t b0,
                                           int64_t b1, int64_t p0, int64_t p1, int64_t P, int64_t A_, int kind,
                                           const Surrogate& s, double w, T* dz, double* acc_sp, double* acc_f, T* pf,
                                           T* psp, T* zdp, double* d) {
  const int64_t A = kA > 0 ? kA : A_, n = p1 - p0;
  sp += p0, fw += p0 * A, acc_sp += p0, acc_f += p0 * A;
  auto flush = [&] {
    for (int64_t i = 0; i < n * A; ++i) {
      acc_f[i] += double(pf[i]);
      pf[i] = T(0);
    }
    for (int64_t p = 0; p < n; ++p) {
      acc_sp[p] += double(psp[p]);
      psp[p] = T(0);
    }
  };
  for (int64_t b = b0; b < b1; ++b) {
    if ((b - b0) % kFlushRows == 0 && b > b0) flush();
    const T *zr = z + b * P + p0, *Fr = Fp + b * P + p0, *dyr = dy + (b * P + p0) * A;
    T* dzr = dz + b * P + p0;
    if constexpr (kExact) {
      int64_t firing = 0;
      for (int64_t p = 0; p < n; ++p) firing += Fr[p] != T(0);
      if (4 * firing < n) {  // a quiet row: only its firing (or undefined) neurons
        for (int64_t p = 0; p < n; ++p) {
          if (Fr[p] == T(0)) {
            dzr[p] = T(0);
            continue;
          }
          const T Fv = Fr[p], zf = zr[p] * Fv;
          T S = 0;
          for (int64_t g = 0; g < A; ++g) {
            S += dyr[p * A + g] * fw[p * A + g];
            pf[p * A + g] += dyr[p * A + g] * zf;
          }
          dzr[p] = S * Fv;
          psp[p] += Fv - Fv;
        }
        continue;
      }
    } else {
      row_derivative(kind, s, w, zr, sp, n, d);
      for (int64_t p = 0; p < n; ++p) zdp[p] = static_cast<T>(double(zr[p]) * d[p]) + (Fr[p] - Fr[p]);
    }
    for (int64_t p = 0; p < n; ++p)  // + dY F Z
      for (int64_t g = 0; g < A; ++g) pf[p * A + g] += keep_if(dyr[p * A + g] * (zr[p] * Fr[p]), Fr[p] != T(0));
    for (int64_t p = 0; p < n; ++p) {
      T S = 0;  // Σ_g dY f
      for (int64_t g = 0; g < A; ++g) S += dyr[p * A + g] * fw[p * A + g];
      if constexpr (kExact) {
        dzr[p] = keep_if(S * Fr[p], Fr[p] != T(0));
        psp[p] += Fr[p] - Fr[p];
      } else {
        dzr[p] = S * (Fr[p] + zdp[p]);
        psp[p] -= S * zdp[p];
      }
    }
  }
  flush();
}

// The block with a user-registered surrogate (a std::function, called per element: nothing to vectorise) runs on the
// baseline alone; the built-in gates run vectorised for the CPU at hand (ASC_CPU_DISPATCH in firing_backward).
template <class T>
void backward_block_plain(const T* z, const T* sp, const T* fw, const T* Fp, const T* dy, int64_t b0, int64_t b1,
                          int64_t p0, int64_t p1, int64_t P, int64_t A, int kind, const Surrogate& s, double w, T* dz,
                          double* acc_sp, double* acc_f, T* pf, T* psp, T* zdp, double* d) {
  backward_block_body<T, 0, false>(z, sp, fw, Fp, dy, b0, b1, p0, p1, P, A, kind, s, w, dz, acc_sp, acc_f, pf, psp, zdp,
                                   d);
}

}  // namespace

// The sums over b of dSP and df follow a fixed plan that depends on N and P α only, never on the thread count:
// chunks of whole kFlushRows-row blocks, each summed into its own float64 accumulators, then the chunks added in
// order. Tasks are (chunk, range of neurons) pairs — a neuron's sum does not depend on how the neurons are split,
// so the neuron split may follow the thread count. Same inputs, same bits, with 1, 2 or 64 threads.
void firing_backward(const Tensor& Z, const Tensor& SP, const Tensor& f, const Tensor& F, const Tensor& dY,
                     const GateSpec& gate, Tensor& dZ, Tensor& dSP, Tensor& df) {
  const GateBackward mode = gate.mode;
  const Surrogate& s = gate.surrogate;
  const double width = gate.width;
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  const bool user = mode == GateBackward::Surrogate && !s.builtin;
  const int kind = mode == GateBackward::StraightThrough ? kStraightThrough
                   : user                                ? kUserSurrogate
                   : mode == GateBackward::Surrogate     ? int(*s.builtin)
                                                         : 0;
  // The plan: at most kMaxChunks chunks, and at most about kAccBudget float64 accumulators in all.
  constexpr int64_t kMaxChunks = 64, kAccBudget = int64_t(1) << 21;
  const int64_t blocks = N == 0 ? 0 : (N - 1) / kFlushRows + 1;
  const int64_t max_chunks = std::clamp<int64_t>(kAccBudget / std::max<int64_t>(P * A + P, 1), 1, kMaxChunks);
  const int64_t chunk_rows = blocks == 0 ? kFlushRows : ((blocks - 1) / max_chunks + 1) * kFlushRows;
  const int64_t chunks = N == 0 || P == 0 ? 0 : (N - 1) / chunk_rows + 1;
  // Neuron ranges: enough tasks for every thread; one task per chunk for a user-registered surrogate (a
  // std::function that need not be thread-safe: those tasks then run one after another).
  const int64_t threads = max_threads();
  const int64_t ranges = user || chunks == 0 ? 1 : std::clamp<int64_t>((threads + chunks - 1) / chunks, 1, P);
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_output backward", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>(), *fw = f.data_ptr<scalar_t>();
    const scalar_t *Fp = F.data_ptr<scalar_t>(), *dy = dY.data_ptr<scalar_t>();
    scalar_t *dz = dZ.data_ptr<scalar_t>(), *dsp = dSP.data_ptr<scalar_t>(), *dfw = df.data_ptr<scalar_t>();
    std::vector<double> acc_sp(static_cast<size_t>(chunks * P), 0.0), acc_f(static_cast<size_t>(chunks * P * A), 0.0);
    auto tasks = [&](int64_t t0, int64_t t1) {
      const int64_t n_max = P / ranges + 1;  // the most neurons of a range
      std::vector<scalar_t> part_f(static_cast<size_t>(n_max * A)), part_sp(static_cast<size_t>(n_max)),
          zd(static_cast<size_t>(n_max));
      std::vector<double> d(static_cast<size_t>(n_max));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c = t / ranges, r = t % ranges;
        const int64_t b0 = c * chunk_rows, b1 = std::min(N, b0 + chunk_rows);
        const int64_t p0 = P * r / ranges, p1 = P * (r + 1) / ranges;
        double *asp = acc_sp.data() + c * P, *af = acc_f.data() + c * P * A;
        std::fill(part_f.begin(), part_f.end(), scalar_t(0));
        std::fill(part_sp.begin(), part_sp.end(), scalar_t(0));
        scalar_t *pf = part_f.data(), *psp = part_sp.data(), *zdp = zd.data();
        if (user) {
          backward_block_plain<scalar_t>(z, sp, fw, Fp, dy, b0, b1, p0, p1, P, A, kind, s, width, dz, asp, af, pf, psp,
                                         zdp, d.data());
          continue;
        }
        with_fan_out(A, [&](auto kA) {
          constexpr int a = decltype(kA)::value;
          if (mode == GateBackward::None)
            ASC_CPU_DISPATCH(backward_block_body<scalar_t, a, true>(z, sp, fw, Fp, dy, b0, b1, p0, p1, P, A, kind, s,
                                                                    width, dz, asp, af, pf, psp, zdp, d.data()));
          else
            ASC_CPU_DISPATCH(backward_block_body<scalar_t, a, false>(z, sp, fw, Fp, dy, b0, b1, p0, p1, P, A, kind, s,
                                                                     width, dz, asp, af, pf, psp, zdp, d.data()));
        });
      }
    };
    if (user)
      tasks(0, chunks);
    else
      parallel_for(chunks * ranges, capped_cost(chunk_rows / ranges + 1, P * (A + 2)), tasks);
    // The chunks in order, for each (neuron, output): float64 additions in a fixed order.
    for (int64_t p = 0; p < P; ++p) {
      double t = 0;
      for (int64_t c = 0; c < chunks; ++c) t += acc_sp[c * P + p];
      dsp[p] = static_cast<scalar_t>(t);
    }
    for (int64_t i = 0; i < P * A; ++i) {
      double t = 0;
      for (int64_t c = 0; c < chunks; ++c) t += acc_f[c * P * A + i];
      dfw[i] = static_cast<scalar_t>(t);
    }
  });
}

// ---- rule B's weight update: W <- keep ∘ W + coefᵀ X ----------------------------------------------------------
namespace {

// Neurons [p0, p1) of the sparse path. The coefficients of 16 neurons are gathered in one sweep over the batch (a
// column of coef is P elements apart: reading it neuron by neuron would reload each cache line 16 times), then each
// neuron adds its nonzero rows' inputs four at a time, so W's row is loaded and stored once per four inputs.
// rows and vals: the caller's scratch of kSparseBlock N entries each.
constexpr int64_t kSparseBlock = 16;
template <class T>
ASC_ALWAYS_INLINE void weight_update_sparse(T* W, const T* keep, const T* coef, const T* X, int64_t p0, int64_t p1,
                                            int64_t N, int64_t P, int64_t d, int64_t* rows, T* vals) {
  constexpr int64_t kBlock = kSparseBlock;
  int64_t count[kBlock];
  for (int64_t pb = p0; pb < p1; pb += kBlock) {
    const int64_t nb = std::min(kBlock, p1 - pb);
    for (int64_t j = 0; j < nb; ++j) count[j] = 0;
    for (int64_t b = 0; b < N; ++b)
      for (int64_t j = 0; j < nb; ++j) {
        const T v = coef[b * P + pb + j];
        if (v != T(0)) {
          rows[j * N + count[j]] = b;
          vals[j * N + count[j]++] = v;
        }
      }
    for (int64_t j = 0; j < nb; ++j) {
      T* w = W + (pb + j) * d;
      const T k = keep[pb + j];
      for (int64_t i = 0; i < d; ++i) w[i] *= k;
      const int64_t* r = rows + j * N;
      const T* v = vals + j * N;
      int64_t m = 0;
      for (; m + 4 <= count[j]; m += 4) {
        const T *x0 = X + r[m] * d, *x1 = X + r[m + 1] * d, *x2 = X + r[m + 2] * d, *x3 = X + r[m + 3] * d;
        const T v0 = v[m], v1 = v[m + 1], v2 = v[m + 2], v3 = v[m + 3];
        for (int64_t i = 0; i < d; ++i) w[i] += v0 * x0[i] + v1 * x1[i] + v2 * x2[i] + v3 * x3[i];
      }
      for (; m < count[j]; ++m) {
        const T* x0 = X + r[m] * d;
        const T v0 = v[m];
        for (int64_t i = 0; i < d; ++i) w[i] += v0 * x0[i];
      }
    }
  }
}

}  // namespace

void firing_weight_update(Tensor& W, const Tensor& keep, const Tensor& coef, const Tensor& X) {
  const int64_t P = W.size(0), d = W.size(1), N = coef.size(0);
  if (P == 0 || d == 0) return;  // W is empty
  ASC_DISPATCH_FLOAT(W.dtype(), "firing_weight_update_", [&] {
    scalar_t* w = W.data_ptr<scalar_t>();
    const scalar_t *k = keep.data_ptr<scalar_t>(), *c = coef.data_ptr<scalar_t>(), *x = X.data_ptr<scalar_t>();
    int64_t nnz = 0;
    for (int64_t i = 0; i < N * P; ++i) nnz += c[i] != scalar_t(0);
    // The sparse path's cost grows with the density of non-zero coefficients, the GEMM's does not: bench_firing puts
    // the crossover near a density of 1/3 (bench/results).
    if (3 * nnz < N * P) {
      parallel_for(P, capped_cost(nnz / std::max<int64_t>(P, 1) + 1, d), [&](int64_t p0, int64_t p1) {
        std::vector<int64_t> rows(static_cast<size_t>(kSparseBlock * N));
        std::vector<scalar_t> vals(static_cast<size_t>(kSparseBlock * N));
        ASC_CPU_DISPATCH(weight_update_sparse(w, k, c, x, p0, p1, N, P, d, rows.data(), vals.data()));
      });
      return;
    }
    // Dense: scale the rows, then GEMMs accumulating into W (coefᵀ is coef read with strides (1, P): no copy). A BLAS
    // sums a product differently for a different number of rows, so the row split decides W's last bits: by default
    // one GEMM per thread's rows (the fastest; the bits then depend on the thread count), and with
    // use_deterministic_algorithms one per fixed block of kGemmRows neurons, whatever the thread count (a little
    // slower: bench/results/2026-11-26_kernel_tuning_figures.md).
    constexpr int64_t kGemmRows = 64;
    const bool fixed = deterministic_algorithms_enabled();
    const int64_t rows = fixed ? kGemmRows : std::max<int64_t>(1, (P + max_threads() - 1) / max_threads());
    const int64_t blocks = (P + rows - 1) / rows;
    parallel_for(blocks, capped_cost(rows, capped_cost(N, d)), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t p0 = j * rows, p1 = std::min(P, p0 + rows);
        for (int64_t p = p0; p < p1; ++p)
          for (int64_t i = 0; i < d; ++i) w[p * d + i] *= k[p];
        gemm<scalar_t>(p1 - p0, d, N, c + p0, 1, P, x, d, 1, w + p0 * d, d, /*accumulate=*/true);
      }
    });
  });
}

// ---- rule B's sums and coefficients -----------------------------------------------------------------------------
namespace {

// Neurons [p0, p1) of firing_batch_sums, in blocks of kCols: rows in order into float64 accumulators, so the sums do
// not depend on the thread count; a silent (b, p) adds exactly nothing (keep_if: not 0 · Z, which is NaN for an
// infinite Z). Each term carries its factor F (exact for F = 1), so an undefined gate (F NaN) makes the sums NaN,
// and max(0, NaN) is NaN, as in PyTorch's clamp.
template <class T>
ASC_ALWAYS_INLINE void batch_sums_cols(const T* z, const T* Fp, const T* sp, int64_t N, int64_t P, int64_t p0,
                                       int64_t p1, T* fz2, T* fired, T* margin) {
  constexpr int64_t kCols = 64;
  double s_fz2[kCols], s_fired[kCols], s_margin[kCols];
  for (int64_t c0 = p0; c0 < p1; c0 += kCols) {
    const int64_t nc = std::min(kCols, p1 - c0);
    for (int64_t j = 0; j < nc; ++j) s_fz2[j] = s_fired[j] = s_margin[j] = 0;
    for (int64_t b = 0; b < N; ++b) {
      const T *zr = z + b * P + c0, *Fr = Fp + b * P + c0, *spr = sp + c0;
      for (int64_t j = 0; j < nc; ++j) {
        const bool fires = Fr[j] != T(0);
        const double zv = zr[j], Fv = Fr[j];
        s_fz2[j] += keep_if(zv * zv * Fv, fires);
        s_fired[j] += keep_if(Fv, fires);
        const double m = zv - double(spr[j]);
        s_margin[j] += keep_if((m <= 0.0 ? 0.0 : m) * Fv, fires);
      }
    }
    for (int64_t j = 0; j < nc; ++j) {
      fz2[c0 + j] = static_cast<T>(s_fz2[j]);
      fired[c0 + j] = static_cast<T>(s_fired[j]);
      margin[c0 + j] = static_cast<T>(s_margin[j]);
    }
  }
}

// Rows [b0, b1) of firing_rule_b_coef: coef = a F Z − c dZ (dz null: a F Z); a silent (b, p) has F Z = +0 exactly
// (keep_if), an undefined one (F NaN) NaN.
template <class T>
ASC_ALWAYS_INLINE void rule_b_coef_rows(const T* z, const T* Fp, T a, const T* dz, const T* c, int64_t b0, int64_t b1,
                                        int64_t P, T* coef) {
  for (int64_t b = b0; b < b1; ++b) {
    const T *zr = z + b * P, *Fr = Fp + b * P;
    T* out = coef + b * P;
    if (dz) {
      const T* dzr = dz + b * P;
      for (int64_t p = 0; p < P; ++p) out[p] = a * keep_if(zr[p] * Fr[p], Fr[p] != T(0)) - c[p] * dzr[p];
    } else {
      for (int64_t p = 0; p < P; ++p) out[p] = a * keep_if(zr[p] * Fr[p], Fr[p] != T(0));
    }
  }
}

}  // namespace

void firing_batch_sums(const Tensor& Z, const Tensor& F, const Tensor& SP, Tensor& fz2, Tensor& fired, Tensor& margin) {
  const int64_t N = Z.size(0), P = Z.size(1);
  if (P == 0) return;
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_batch_sums", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *Fp = F.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>();
    scalar_t *o1 = fz2.data_ptr<scalar_t>(), *o2 = fired.data_ptr<scalar_t>(), *o3 = margin.data_ptr<scalar_t>();
    parallel_for(P, capped_cost(N, 4), [&](int64_t p0, int64_t p1) {
      ASC_CPU_DISPATCH(batch_sums_cols(z, Fp, sp, N, P, p0, p1, o1, o2, o3));
    });
  });
}

void firing_rule_b_coef(const Tensor& Z, const Tensor& F, double a, const Tensor& dZ, const Tensor& c, Tensor& coef) {
  const int64_t N = Z.size(0), P = Z.size(1);
  if (N == 0 || P == 0) return;
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_rule_b_coef", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *Fp = F.data_ptr<scalar_t>();
    const scalar_t* dz = dZ.defined() ? dZ.data_ptr<scalar_t>() : nullptr;
    const scalar_t* cp = c.defined() ? c.data_ptr<scalar_t>() : nullptr;
    scalar_t* out = coef.data_ptr<scalar_t>();
    const auto as = static_cast<scalar_t>(a);
    parallel_for(N, capped_cost(P, 3), [&](int64_t b0, int64_t b1) {
      ASC_CPU_DISPATCH(rule_b_coef_rows(z, Fp, as, dz, cp, b0, b1, P, out));
    });
  });
}

// ---- the SSM scan: one batch row per task, sequential over time -------------------------------------------------
void ssm_scan_forward(const Tensor& a, const Tensor& u, const Tensor& s0, bool rms_norm, double eps, Tensor& s,
                      Tensor& rms) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  if (B == 0 || T == 0) return;  // no steps (and no row loop over a huge empty B)
  ASC_DISPATCH_FLOAT(a.dtype(), "ssm_scan", [&] {
    const scalar_t *ap = a.data_ptr<scalar_t>(), *up = u.data_ptr<scalar_t>(), *s0p = s0.data_ptr<scalar_t>();
    scalar_t *sp = s.data_ptr<scalar_t>(), *rp = rms.data_ptr<scalar_t>();
    parallel_for(B, capped_cost(T, capped_cost(R, 4)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const scalar_t* prev = s0p + b * R;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t o = (b * T + t) * R;
          double ms = 0;
          for (int64_t c = 0; c < R; ++c) {
            const scalar_t h = ap[o + c] * prev[c] + up[o + c];  // h_t = a_t s_{t-1} + u_t
            sp[o + c] = h;
            ms += double(h) * double(h);
          }
          const double r = rms_norm && R > 0 ? std::sqrt(ms / double(R) + eps) : 1.0;  // RMS(h_t)
          rp[b * T + t] = static_cast<scalar_t>(r);
          if (rms_norm)
            for (int64_t c = 0; c < R; ++c) sp[o + c] = static_cast<scalar_t>(sp[o + c] / r);
          prev = sp + o;
        }
      }
    });
  });
}

void ssm_scan_backward(const Tensor& a, const Tensor& s0, const Tensor& s, const Tensor& rms, const Tensor& ds,
                       bool rms_norm, Tensor& da, Tensor& du, Tensor& ds0) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  if (B == 0 || R == 0) return;  // nothing to write (and no row loop over a huge empty B)
  ASC_DISPATCH_FLOAT(a.dtype(), "ssm_scan backward", [&] {
    const scalar_t *ap = a.data_ptr<scalar_t>(), *s0p = s0.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>();
    const scalar_t *rp = rms.data_ptr<scalar_t>(), *gp = ds.data_ptr<scalar_t>();
    scalar_t *dap = da.data_ptr<scalar_t>(), *dup = du.data_ptr<scalar_t>(), *ds0p = ds0.data_ptr<scalar_t>();
    parallel_for(B, capped_cost(std::max<int64_t>(T, 1), capped_cost(R, 6)), [&](int64_t b0, int64_t b1) {
      std::vector<double> carry(R), gs(R);
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(carry.begin(), carry.end(), 0.0);  // dL/ds_t from later steps
        for (int64_t t = T - 1; t >= 0; --t) {
          const int64_t o = (b * T + t) * R;
          double dot = 0;
          for (int64_t c = 0; c < R; ++c) {
            gs[c] = double(gp[o + c]) + carry[c];
            dot += gs[c] * double(sp[o + c]);
          }
          // s = h / ρ:  dh = (gs - s mean(gs s)) / ρ;  without the norm dh = gs.
          const double r = rp[b * T + t], mean_gs = dot / double(R);
          const scalar_t* prev = t > 0 ? sp + o - R : s0p + b * R;
          for (int64_t c = 0; c < R; ++c) {
            const double dh = rms_norm ? (gs[c] - double(sp[o + c]) * mean_gs) / r : gs[c];
            dup[o + c] = static_cast<scalar_t>(dh);  // h = a s_{t-1} + u
            dap[o + c] = static_cast<scalar_t>(dh * double(prev[c]));
            carry[c] = dh * double(ap[o + c]);
          }
        }
        for (int64_t c = 0; c < R; ++c) ds0p[b * R + c] = static_cast<scalar_t>(carry[c]);
      }
    });
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
