// CPU kernels of the firing perceptron's output (ops/firing.h, docs/firing.md §1-2).
//
// Forward: rows b of Z (N, P) in parallel; a silent neuron writes zeros without forming f·Z. Backward: rows in
// parallel too, each task summing its rows' dSP and df in float64 (merged at the end, in an order that depends on
// scheduling only through float64 additions of a few task totals); with the exact gate a silent (b, p) is skipped
// outright — its dZ is 0 and it adds nothing.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels.h"

namespace asc::cpu {

void firing_forward(const Tensor& Z, const Tensor& SP, const Tensor& f, Tensor& F, Tensor& Y) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  F = Tensor::empty({N, P}, Z.options());
  Y = Tensor::empty({N, P, A}, Z.options());
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_output", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>(), *fw = f.data_ptr<scalar_t>();
    scalar_t *Fp = F.data_ptr<scalar_t>(), *y = Y.data_ptr<scalar_t>();
    parallel_for(N, P * (A + 1), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t p = 0; p < P; ++p) {
          const scalar_t zv = z[b * P + p];
          const bool fires = zv >= sp[p];
          Fp[b * P + p] = fires ? scalar_t(1) : scalar_t(0);
          scalar_t* yo = y + (b * P + p) * A;
          if (!fires) {
            for (int64_t g = 0; g < A; ++g) yo[g] = scalar_t(0);
            continue;
          }
          for (int64_t g = 0; g < A; ++g) yo[g] = fw[p * A + g] * zv;
        }
    });
  });
}

namespace {

// The backward over rows [b0, b1): dZ of those rows, and their contributions to dSP (P) and df (P, A) added into the
// caller's float64 accumulators. kMode: 0 exact gate (a silent (b, p) is skipped), 1 straight-through, 2 surrogate
// (deriv(u) = s'(u)).
template <class T, int kMode, class D>
void backward_rows(const T* z, const T* sp, const T* fw, const T* Fp, const T* dy, int64_t b0, int64_t b1, int64_t P,
                   int64_t A, const D& deriv, T* dz, double* acc_sp, double* acc_f) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t p = 0; p < P; ++p) {
      const int64_t bp = b * P + p;
      const bool fires = Fp[bp] != T(0);
      if (kMode == 0 && !fires) {  // a silent neuron under the exact gate: no gradient at all
        dz[bp] = T(0);
        continue;
      }
      const T* dyo = dy + bp * A;
      const T* fp = fw + p * A;
      double S = 0;  // Σ_g dY f
      for (int64_t g = 0; g < A; ++g) S += double(dyo[g]) * double(fp[g]);
      const double zv = z[bp];
      if (fires)
        for (int64_t g = 0; g < A; ++g) acc_f[p * A + g] += double(dyo[g]) * zv;
      if (kMode == 0) {
        dz[bp] = static_cast<T>(S);
        continue;
      }
      const double d = kMode == 1 ? 1.0 : deriv(zv - double(sp[p]));
      dz[bp] = static_cast<T>(S * ((fires ? 1.0 : 0.0) + zv * d));
      acc_sp[p] -= S * zv * d;
    }
}

}  // namespace

void firing_backward(const Tensor& Z, const Tensor& SP, const Tensor& f, const Tensor& F, const Tensor& dY,
                     GateBackward mode, const Surrogate& s, double width, Tensor& dZ, Tensor& dSP, Tensor& df) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  dZ = Tensor::empty({N, P}, Z.options());
  dSP = Tensor::empty({P}, Z.options());
  df = Tensor::empty({P, A}, Z.options());
  const bool user = mode == GateBackward::Surrogate && !s.builtin;
  auto deriv = [&](double u) {  // s'(u) at u = Z - SP
    return s.builtin ? math::surrogate_derivative(*s.builtin, u, width) : s.derivative(u, width);
  };
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_output backward", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>(), *fw = f.data_ptr<scalar_t>();
    const scalar_t *Fp = F.data_ptr<scalar_t>(), *dy = dY.data_ptr<scalar_t>();
    scalar_t *dz = dZ.data_ptr<scalar_t>();
    // Rows in parallel (contiguous reads); each task sums its rows' dSP and df in float64, merged under a lock.
    std::vector<double> tot_sp(P, 0.0), tot_f(P * A, 0.0);
    std::mutex merge;
    auto rows = [&](int64_t b0, int64_t b1) {
      std::vector<double> acc_sp(P, 0.0), acc_f(P * A, 0.0);
      switch (mode) {
        case GateBackward::None:
          backward_rows<scalar_t, 0>(z, sp, fw, Fp, dy, b0, b1, P, A, deriv, dz, acc_sp.data(), acc_f.data());
          break;
        case GateBackward::StraightThrough:
          backward_rows<scalar_t, 1>(z, sp, fw, Fp, dy, b0, b1, P, A, deriv, dz, acc_sp.data(), acc_f.data());
          break;
        case GateBackward::Surrogate:
          backward_rows<scalar_t, 2>(z, sp, fw, Fp, dy, b0, b1, P, A, deriv, dz, acc_sp.data(), acc_f.data());
          break;
      }
      std::lock_guard lock(merge);
      for (int64_t p = 0; p < P; ++p) tot_sp[p] += acc_sp[p];
      for (int64_t i = 0; i < P * A; ++i) tot_f[i] += acc_f[i];
    };
    // A user-registered surrogate is a std::function that need not be thread-safe: one task then.
    if (user) rows(0, N);
    else parallel_for(N, P * (A + 2), rows);
    scalar_t *dsp = dSP.data_ptr<scalar_t>(), *dfw = df.data_ptr<scalar_t>();
    for (int64_t p = 0; p < P; ++p) dsp[p] = static_cast<scalar_t>(tot_sp[p]);
    for (int64_t i = 0; i < P * A; ++i) dfw[i] = static_cast<scalar_t>(tot_f[i]);
  });
}

// ---- the SSM scan: one batch row per task, sequential over time -------------------------------------------------
void ssm_scan_forward(const Tensor& a, const Tensor& u, const Tensor& s0, bool rms_norm, double eps, Tensor& s,
                      Tensor& rms) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  s = Tensor::empty({B, T, R}, a.options());
  rms = Tensor::empty({B, T}, a.options());
  ASC_DISPATCH_FLOAT(a.dtype(), "ssm_scan", [&] {
    const scalar_t *ap = a.data_ptr<scalar_t>(), *up = u.data_ptr<scalar_t>(), *s0p = s0.data_ptr<scalar_t>();
    scalar_t *sp = s.data_ptr<scalar_t>(), *rp = rms.data_ptr<scalar_t>();
    parallel_for(B, T * R * 4, [&](int64_t b0, int64_t b1) {
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
          const double r = rms_norm ? std::sqrt(ms / double(R) + eps) : 1.0;  // RMS(h_t)
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
  da = Tensor::empty({B, T, R}, a.options());
  du = Tensor::empty({B, T, R}, a.options());
  ds0 = Tensor::empty({B, R}, a.options());
  ASC_DISPATCH_FLOAT(a.dtype(), "ssm_scan backward", [&] {
    const scalar_t *ap = a.data_ptr<scalar_t>(), *s0p = s0.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>();
    const scalar_t *rp = rms.data_ptr<scalar_t>(), *gp = ds.data_ptr<scalar_t>();
    scalar_t *dap = da.data_ptr<scalar_t>(), *dup = du.data_ptr<scalar_t>(), *ds0p = ds0.data_ptr<scalar_t>();
    parallel_for(B, T * R * 6, [&](int64_t b0, int64_t b1) {
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
            dup[o + c] = static_cast<scalar_t>(dh);                      // h = a s_{t-1} + u
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
