// CPU optimizer kernels (declared in ops/kernel_list.inc; their arguments: ops/optim_kernel_args.h). Each update is
// one loop over contiguous element ranges; masked rows are skipped by splitting the range into runs of consecutive
// unmasked rows, so the masked path runs the same per-element arithmetic as the unmasked one (bit-identical results on
// the rows that move).
// Vectorised, Adam's and RMSprop's runs at the processor's vector width (ASC_CPU_DISPATCH): this file compiles with
// -fno-math-errno, since with GCC's default each sqrt is a guarded libm call that keeps the loop scalar (GCC 12 ignores
// the option as a pragma or function attribute), and with -ffp-contract=off (CMakeLists.txt), so that no level fuses a
// product into an FMA: the vector square roots, quotients, products and sums are IEEE operations lane by lane, the same
// bits at every level and as the scalar loop. The runs take their pointers as arguments of their own (adam_run,
// rmsprop_run): pointers captured by reference in parallel_for's lambda kept the loops scalar too.
#include "ops/kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/dtype.h"
#include "ops/cpu/loops.h"

#include "ops/cpu/vec_region_begin.h"  // the update loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // inside the region: ASC_CPU_DISPATCH

namespace asc::cpu {
namespace {

// Calls body(begin, end) over the element ranges of the rows that may move, in parallel when large.
template <class F>
void for_moving_ranges(int64_t numel, const Tensor& row_mask, F&& body) {
  constexpr int64_t kCostPerElement = 8;  // a handful of flops and 2-5 streams per element
  if (numel == 0) return;
  if (!row_mask.defined()) {
    parallel_for(numel, kCostPerElement, [&](int64_t b, int64_t e) { body(b, e); });
    return;
  }
  const int64_t rows = row_mask.numel();
  const int64_t row_size = numel / rows;
  const bool* m = row_mask.data_ptr<bool>();
  parallel_for(rows, row_size * kCostPerElement, [&](int64_t rb, int64_t re) {
    int64_t r = rb;
    while (r < re) {
      if (!m[r]) {
        ++r;
        continue;
      }
      const int64_t start = r;
      while (r < re && m[r]) ++r;
      body(start * row_size, r * row_size);
    }
  });
}

// Calls f(std::bool_constant<b>{}), turning runtime flags into template arguments so the inner loops have no
// branches.
template <class F>
void with_flag(bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// The square root as the region compiles it (std::sqrt(float) is a function of the standard library's, compiled outside
// the region, which the loops would call instead of vectorising it).
ASC_ALWAYS_INLINE float root(float x) { return __builtin_sqrtf(x); }
ASC_ALWAYS_INLINE double root(double x) { return __builtin_sqrt(x); }

// Adam's per-step constants, in the parameter's type.
template <class T>
struct AdamScalars {
  T b1, b2, one_minus_b1, one_minus_b2, eps, wd, decay, neg_step_size, bc2_sqrt;
};

template <class T, bool kMomentum, bool kNesterov, bool kWd, bool kInit>
void sgd_impl(const optim::SGDKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& buf_t,
              const Tensor& row_mask) {
  T* __restrict p = param.data_ptr<T>();
  const T* __restrict g = grad.data_ptr<T>();
  T* __restrict buf = ptr_or_null<T>(buf_t);
  const T lr = static_cast<T>(a.lr), wd = static_cast<T>(a.weight_decay), mom = static_cast<T>(a.momentum);
  const T one_minus_damp = static_cast<T>(1.0 - a.dampening);
  for_moving_ranges(param.numel(), row_mask, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T d = g[i];
      if constexpr (kWd) d = d + wd * p[i];
      if constexpr (kMomentum) {
        const T nb = kInit ? d : buf[i] * mom + one_minus_damp * d;
        buf[i] = nb;
        d = kNesterov ? d + mom * nb : nb;
      }
      p[i] = p[i] - lr * d;
    }
  });
}

// One contiguous run of Adam's update, its pointers arguments of its own: inside parallel_for's lambda, pointers
// captured by reference kept GCC from vectorising the loop.
template <class T, bool kAmsgrad, bool kDecoupled, bool kWd>
ASC_ALWAYS_INLINE void adam_run(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                                T* __restrict vmax, int64_t n, const AdamScalars<T>& c) {
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i];
    T pi = p[i];
    if constexpr (kWd) {
      if constexpr (kDecoupled)
        pi = pi * c.decay;
      else
        gi = gi + c.wd * pi;
    }
    const T mi = m[i] * c.b1 + c.one_minus_b1 * gi;
    const T vi = v[i] * c.b2 + c.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    T vd = vi;
    if constexpr (kAmsgrad) {
      vd = vmax[i] < vi ? vi : vmax[i];  // std::max's choice, spelled out: a std:: call does not inline here
      vmax[i] = vd;
    }
    const T denom = root(vd) / c.bc2_sqrt + c.eps;
    p[i] = pi + c.neg_step_size * (mi / denom);
  }
}

template <class T, bool kAmsgrad, bool kDecoupled, bool kWd>
void adam_impl(const optim::AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& m_t,
               const Tensor& v_t, const Tensor& vmax_t, const Tensor& row_mask) {
  T* p = param.data_ptr<T>();
  const T* g = grad.data_ptr<T>();
  T* m = m_t.data_ptr<T>();
  T* v = v_t.data_ptr<T>();
  T* vmax = ptr_or_null<T>(vmax_t);
  AdamScalars<T> c;
  c.b1 = static_cast<T>(a.beta1), c.b2 = static_cast<T>(a.beta2);
  c.one_minus_b1 = static_cast<T>(1.0 - a.beta1), c.one_minus_b2 = static_cast<T>(1.0 - a.beta2);
  c.eps = static_cast<T>(a.eps), c.wd = static_cast<T>(a.weight_decay);
  c.decay = static_cast<T>(1.0 - a.lr * a.weight_decay);  // AdamW's p *= 1 - lr wd
  c.neg_step_size = static_cast<T>(-(a.lr / a.bias_correction1));
  c.bc2_sqrt = static_cast<T>(std::sqrt(a.bias_correction2));
  for_moving_ranges(param.numel(), row_mask, [&](int64_t b, int64_t e) {
    T *pb = p + b, *mb = m + b, *vb = v + b, *vmaxb = vmax ? vmax + b : nullptr;
    const T* gb = g + b;
    ASC_CPU_DISPATCH(adam_run<T, kAmsgrad, kDecoupled, kWd>(pb, gb, mb, vb, vmaxb, e - b, c));
  });
}

// One contiguous run of RMSprop's update (its pointers arguments of its own, as adam_run's).
template <class T, bool kCentered, bool kMomentum, bool kWd>
ASC_ALWAYS_INLINE void rmsprop_run(T* __restrict p, const T* __restrict g, T* __restrict sq, T* __restrict buf,
                                   T* __restrict ga, int64_t n, T alpha, T one_minus_alpha, T eps, T wd, T mom, T lr) {
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i];
    if constexpr (kWd) gi = gi + wd * p[i];
    const T si = sq[i] * alpha + one_minus_alpha * gi * gi;
    sq[i] = si;
    T avg;
    if constexpr (kCentered) {
      const T gai = ga[i] * alpha + one_minus_alpha * gi;
      ga[i] = gai;
      avg = root(si - gai * gai) + eps;
    } else {
      avg = root(si) + eps;
    }
    if constexpr (kMomentum) {
      const T nb = buf[i] * mom + gi / avg;
      buf[i] = nb;
      p[i] = p[i] - lr * nb;
    } else {
      p[i] = p[i] - lr * (gi / avg);
    }
  }
}

template <class T, bool kCentered, bool kMomentum, bool kWd>
void rmsprop_impl(const optim::RMSpropKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& sq_t,
                  const Tensor& buf_t, const Tensor& ga_t, const Tensor& row_mask) {
  T* p = param.data_ptr<T>();
  const T* g = grad.data_ptr<T>();
  T* sq = sq_t.data_ptr<T>();
  T* buf = ptr_or_null<T>(buf_t);
  T* ga = ptr_or_null<T>(ga_t);
  const T alpha = static_cast<T>(a.alpha), one_minus_alpha = static_cast<T>(1.0 - a.alpha);
  const T eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay), mom = static_cast<T>(a.momentum);
  const T lr = static_cast<T>(a.lr);
  for_moving_ranges(param.numel(), row_mask, [&](int64_t b, int64_t e) {
    T *pb = p + b, *sqb = sq + b, *bufb = buf ? buf + b : nullptr, *gab = ga ? ga + b : nullptr;
    const T* gb = g + b;
    ASC_CPU_DISPATCH(rmsprop_run<T, kCentered, kMomentum, kWd>(pb, gb, sqb, bufb, gab, e - b, alpha, one_minus_alpha,
                                                               eps, wd, mom, lr));
  });
}

}  // namespace

void sgd_update(const optim::SGDKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                const Tensor& row_mask) {
  ASC_DISPATCH_FLOAT(param.dtype(), "SGD.step", [&] {
    with_flag(a.momentum != 0, [&](auto mom) {
      with_flag(a.nesterov && a.momentum != 0, [&](auto nest) {
        with_flag(a.weight_decay != 0, [&](auto wd) {
          with_flag(a.init_buf, [&](auto init) {
            sgd_impl<scalar_t, mom(), nest(), wd(), init()>(a, param, grad, momentum_buf, row_mask);
          });
        });
      });
    });
  });
}

void adam_update(const optim::AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const Tensor& row_mask) {
  ASC_DISPATCH_FLOAT(param.dtype(), "Adam.step", [&] {
    with_flag(a.amsgrad, [&](auto ams) {
      with_flag(a.decoupled, [&](auto dec) {
        with_flag(a.weight_decay != 0, [&](auto wd) {
          adam_impl<scalar_t, ams(), dec(), wd()>(a, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, row_mask);
        });
      });
    });
  });
}

void rmsprop_update(const optim::RMSpropKernelArgs& a, const Tensor& param, const Tensor& grad,
                    const Tensor& square_avg, const Tensor& momentum_buf, const Tensor& grad_avg,
                    const Tensor& row_mask) {
  ASC_DISPATCH_FLOAT(param.dtype(), "RMSprop.step", [&] {
    with_flag(a.centered, [&](auto cen) {
      with_flag(a.momentum > 0, [&](auto mom) {
        with_flag(a.weight_decay != 0, [&](auto wd) {
          rmsprop_impl<scalar_t, cen(), mom(), wd()>(a, param, grad, square_avg, momentum_buf, grad_avg, row_mask);
        });
      });
    });
  });
}

void clamp_inplace(const Tensor& t, double lo, double hi) {
  ASC_DISPATCH_FLOAT(t.dtype(), "clamp", [&] {
    scalar_t* __restrict x = t.data_ptr<scalar_t>();
    const scalar_t l = static_cast<scalar_t>(lo), h = static_cast<scalar_t>(hi);
    parallel_for(t.numel(), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        scalar_t v = x[i];
        v = v < l ? l : v;  // comparisons with NaN are false: NaN passes through
        x[i] = v > h ? h : v;
      }
    });
  });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
