// CPU kernels of the geometry ops: top-k selection (partial selection per row), its gradient scatter, row L2
// normalisation, masked row standardisation and the surrogate-derivative map.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels.h"

namespace asc::cpu {

namespace {
inline bool selectable(const bool* mrow, int64_t diag, int64_t j) { return (!mrow || mrow[j]) && j != diag; }
}  // namespace

void topk(const Tensor& x, const Tensor& mask, int64_t k, bool largest, int64_t diag_n, Tensor& values,
          Tensor& indices) {
  const int64_t n = x.size(-1);
  const int64_t R = n == 0 ? 0 : x.numel() / n;
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  int64_t* ip = indices.data_ptr<int64_t>();
  ASC_DISPATCH_FLOAT(x.dtype(), "topk", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* vp = values.data_ptr<scalar_t>();
    parallel_for(R, n + 8, [&](int64_t r0, int64_t r1) {
      std::vector<int64_t> cand;
      cand.reserve(static_cast<size_t>(n));
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* row = xp + r * n;
        const bool* mrow = mp ? mp + r * n : nullptr;
        const int64_t diag = diag_n > 0 ? r % diag_n : -1;
        cand.clear();
        for (int64_t j = 0; j < n; ++j)
          if (selectable(mrow, diag, j)) cand.push_back(j);
        // Order: larger (smaller) first, NaN counts as the largest value, ties by the lower index.
        auto better = [&](int64_t a, int64_t b) {
          const scalar_t va = row[a], vb = row[b];
          const bool na = std::isnan(va), nb = std::isnan(vb);
          if (na || nb) return (na && nb) ? a < b : (largest ? na : nb);
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        };
        const auto kk = static_cast<std::ptrdiff_t>(k);
        if (static_cast<int64_t>(cand.size()) > k)
          std::nth_element(cand.begin(), cand.begin() + kk, cand.end(), better);
        std::sort(cand.begin(), cand.begin() + kk, better);
        for (int64_t j = 0; j < k; ++j) {
          ip[r * k + j] = cand[static_cast<size_t>(j)];
          vp[r * k + j] = row[cand[static_cast<size_t>(j)]];
        }
      }
    });
  });
}

void topk_count(const Tensor& mask, int64_t diag_n, Tensor& counts) {
  const int64_t n = mask.size(-1);
  const int64_t R = n == 0 ? 0 : mask.numel() / n;
  const bool* mp = mask.data_ptr<bool>();
  int64_t* cp = counts.data_ptr<int64_t>();
  parallel_for(R, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t diag = diag_n > 0 ? r % diag_n : -1;
      int64_t c = 0;
      for (int64_t j = 0; j < n; ++j) c += selectable(mp + r * n, diag, j);
      cp[r] = c;
    }
  });
}

void topk_backward(const Tensor& g, const Tensor& indices, Tensor& gx) {
  const int64_t k = g.size(-1), n = gx.size(-1);
  const int64_t R = k == 0 ? 0 : g.numel() / k;
  const int64_t* ip = indices.data_ptr<int64_t>();
  ASC_DISPATCH_FLOAT(g.dtype(), "topk_backward", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* op = gx.data_ptr<scalar_t>();
    parallel_for(R, k + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < k; ++j) op[r * n + ip[r * k + j]] += gp[r * k + j];
    });
  });
}

void normalize_rows(const Tensor& x, double eps, Tensor& y, Tensor& norm) {
  const int64_t d = x.size(-1);
  const int64_t R = d == 0 ? 0 : x.numel() / d;
  ASC_DISPATCH_FLOAT(x.dtype(), "normalize_rows", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* np = norm.data_ptr<scalar_t>();
    parallel_for(R, d + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* xr = xp + r * d;
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
        const double nr = std::sqrt(ss);
        const scalar_t inv = static_cast<scalar_t>(1.0 / std::max(nr, eps));
        np[r] = static_cast<scalar_t>(nr);
        scalar_t* yr = yp + r * d;
        for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv;
      }
    });
  });
}

void row_standardize(const Tensor& x, const Tensor& mask, double eps, Tensor& y, Tensor& sd) {
  const int64_t n = x.size(-1);
  const int64_t R = n == 0 ? 0 : x.numel() / n;
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  ASC_DISPATCH_FLOAT(x.dtype(), "row_standardize", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* sp = sd.data_ptr<scalar_t>();
    parallel_for(R, 2 * n + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* xr = xp + r * n;
        const bool* mr = mp ? mp + r * n : nullptr;
        scalar_t* yr = yp + r * n;
        int64_t cnt = 0;
        double s = 0;
        for (int64_t j = 0; j < n; ++j)
          if (!mr || mr[j]) {
            s += xr[j];
            ++cnt;
          }
        if (cnt == 0) {
          for (int64_t j = 0; j < n; ++j) yr[j] = 0;
          sp[r] = 0;
          continue;
        }
        const double mu = s / static_cast<double>(cnt);
        double ss = 0;
        for (int64_t j = 0; j < n; ++j)
          if (!mr || mr[j]) ss += (xr[j] - mu) * (xr[j] - mu);
        const double sdv = std::sqrt(ss / static_cast<double>(cnt));
        const double inv = 1.0 / (sdv + eps);
        sp[r] = static_cast<scalar_t>(sdv);
        for (int64_t j = 0; j < n; ++j)
          yr[j] = (!mr || mr[j]) ? static_cast<scalar_t>((xr[j] - mu) * inv) : scalar_t(0);
      }
    });
  });
}

void apply_surrogate(const GateSpec& gate, const Tensor& u, Tensor& out) {
  const Surrogate& s = gate.surrogate;
  const double width = gate.width;
  const int64_t N = u.numel();
  ASC_DISPATCH_FLOAT(u.dtype(), "hard_gate", [&] {
    const scalar_t* up = u.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    // std::function is not guaranteed to be re-entrant across threads for user callables; run serially.
    for (int64_t i = 0; i < N; ++i) op[i] = static_cast<scalar_t>(s.derivative(static_cast<double>(up[i]), width));
  });
}

}  // namespace asc::cpu
