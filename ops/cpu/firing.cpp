// CPU kernels of the firing perceptron's output (ops/firing.h, docs/firing.md §1-2).
//
// Forward: rows b of Z (N, P) in parallel; a silent neuron writes zeros without forming f·Z. Backward: neurons p
// in parallel (each thread owns a range of columns, so the reductions over b for dSP and df need no atomics and
// run in float64); with the exact gate a silent (b, p) is skipped outright — its dZ is 0 and it adds nothing.
#include <algorithm>
#include <cmath>
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

void firing_backward(const Tensor& Z, const Tensor& SP, const Tensor& f, const Tensor& F, const Tensor& dY,
                     GateBackward mode, const Surrogate& s, double width, Tensor& dZ, Tensor& dSP, Tensor& df) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  dZ = Tensor::empty({N, P}, Z.options());
  dSP = Tensor::empty({P}, Z.options());
  df = Tensor::empty({P, A}, Z.options());
  // s'(u) at u = Z - SP: 0 (exact), 1 (straight-through) or the surrogate's derivative.
  const bool user = mode == GateBackward::Surrogate && !s.builtin;
  auto deriv = [&](double u) {
    if (mode == GateBackward::None) return 0.0;
    if (mode == GateBackward::StraightThrough) return 1.0;
    return s.builtin ? math::surrogate_derivative(*s.builtin, u, width) : s.derivative(u, width);
  };
  ASC_DISPATCH_FLOAT(Z.dtype(), "firing_output backward", [&] {
    const scalar_t *z = Z.data_ptr<scalar_t>(), *sp = SP.data_ptr<scalar_t>(), *fw = f.data_ptr<scalar_t>();
    const scalar_t *Fp = F.data_ptr<scalar_t>(), *dy = dY.data_ptr<scalar_t>();
    scalar_t *dz = dZ.data_ptr<scalar_t>(), *dsp = dSP.data_ptr<scalar_t>(), *dfw = df.data_ptr<scalar_t>();
    auto columns = [&](int64_t p0, int64_t p1) {
      std::vector<double> acc_sp(p1 - p0, 0.0), acc_f((p1 - p0) * A, 0.0);
      for (int64_t b = 0; b < N; ++b)
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t bp = b * P + p;
          const bool fires = Fp[bp] != scalar_t(0);
          if (!fires && mode == GateBackward::None) {  // a silent neuron under the exact gate: no gradient at all
            dz[bp] = scalar_t(0);
            continue;
          }
          const scalar_t* dyo = dy + bp * A;
          const scalar_t* fp = fw + p * A;
          double S = 0;  // Σ_g dY f
          for (int64_t g = 0; g < A; ++g) S += double(dyo[g]) * double(fp[g]);
          const double zv = z[bp], d = deriv(zv - double(sp[p]));
          dz[bp] = static_cast<scalar_t>(S * ((fires ? 1.0 : 0.0) + zv * d));
          acc_sp[p - p0] -= S * zv * d;
          if (fires)
            for (int64_t g = 0; g < A; ++g) acc_f[(p - p0) * A + g] += double(dyo[g]) * zv;
        }
      for (int64_t p = p0; p < p1; ++p) {
        dsp[p] = static_cast<scalar_t>(acc_sp[p - p0]);
        for (int64_t g = 0; g < A; ++g) dfw[p * A + g] = static_cast<scalar_t>(acc_f[(p - p0) * A + g]);
      }
    };
    // A user-registered surrogate is a std::function that need not be thread-safe: one thread then.
    if (user) columns(0, P);
    else parallel_for(P, N * (A + 2), columns);
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
