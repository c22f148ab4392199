// asc::stats: summaries, bootstrap intervals, paired tests, effect sizes (stats/stats.h says what each assumes).
#include "stats/stats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "core/generator.h"

namespace asc::stats {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool has_nan(std::span<const double> x) {
  return std::any_of(x.begin(), x.end(), [](double v) { return std::isnan(v); });
}

double mean_of(std::span<const double> x) { return std::accumulate(x.begin(), x.end(), 0.0) / double(x.size()); }

// Sample variance, n - 1 in the denominator, two passes (no cancellation for values far from 0).
double variance_of(std::span<const double> x) {
  if (x.size() < 2) return kNaN;
  const double m = mean_of(x);
  double ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  return ss / double(x.size() - 1);
}

// numpy's default percentile ("linear"): position q (n - 1) in the sorted values, interpolated.
double percentile_sorted(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}

void check_options(const char* what, const BootstrapOptions& o) {
  ASC_CHECK(o.resamples >= 1 && o.resamples <= (int64_t(1) << 32), "{}: resamples must be in [1, 2^32], got {}", what,
            o.resamples);
  ASC_CHECK(o.level > 0 && o.level < 1, "{}: level must be in (0, 1), got {}", what, o.level);
}

void check_size(const char* what, std::span<const double> x, size_t min_n) {
  ASC_CHECK(x.size() >= min_n, "{}: needs at least {} value{}, got {}", what, min_n, min_n == 1 ? "" : "s", x.size());
  ASC_CHECK(x.size() <= (size_t(1) << 32), "{}: at most 2^32 values, got {}", what, x.size());
}

// The mean of one bootstrap resample of x drawn from `stream`.
double resampled_mean(std::span<const double> x, PhiloxStream& stream) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[static_cast<size_t>(stream.below(static_cast<int64_t>(x.size())))];
  return s / double(x.size());
}

Interval interval_from(std::vector<double>& stats, double estimate, double level) {
  std::sort(stats.begin(), stats.end());
  return {estimate, percentile_sorted(stats, (1 - level) / 2), percentile_sorted(stats, (1 + level) / 2), level};
}

Interval nan_interval(double level) { return {kNaN, kNaN, kNaN, level}; }

}  // namespace

Summary describe(std::span<const double> x) {
  check_size("describe", x, 1);
  Summary s;
  s.n = static_cast<int64_t>(x.size());
  if (has_nan(x)) {
    s.mean = s.std = s.min = s.max = s.median = s.iqm = kNaN;
    return s;
  }
  std::vector<double> sorted(x.begin(), x.end());
  std::sort(sorted.begin(), sorted.end());
  s.mean = mean_of(x);
  s.std = std::sqrt(variance_of(x));  // NaN for n == 1
  s.min = sorted.front();
  s.max = sorted.back();
  s.median = percentile_sorted(sorted, 0.5);
  s.iqm = interquartile_mean(x);
  return s;
}

double interquartile_mean(std::span<const double> x) {
  check_size("interquartile_mean", x, 1);
  if (has_nan(x)) return kNaN;
  std::vector<double> sorted(x.begin(), x.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t cut = sorted.size() / 4;  // scipy.stats.trim_mean: int(0.25 n) from each end
  return mean_of(std::span<const double>(sorted).subspan(cut, sorted.size() - 2 * cut));
}

Interval bootstrap_mean_ci(std::span<const double> x, const BootstrapOptions& options) {
  check_size("bootstrap_mean_ci", x, 2);
  check_options("bootstrap_mean_ci", options);
  if (has_nan(x)) return nan_interval(options.level);
  std::vector<double> means(static_cast<size_t>(options.resamples));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < options.resamples; ++r) {
    PhiloxStream stream(options.seed, static_cast<uint64_t>(r));
    means[r] = resampled_mean(x, stream);
  }
  return interval_from(means, mean_of(x), options.level);
}

Interval bootstrap_difference_ci(std::span<const double> a, std::span<const double> b,
                                 const BootstrapOptions& options) {
  check_size("bootstrap_difference_ci", a, 2);
  check_size("bootstrap_difference_ci", b, 2);
  check_options("bootstrap_difference_ci", options);
  if (has_nan(a) || has_nan(b)) return nan_interval(options.level);
  std::vector<double> diffs(static_cast<size_t>(options.resamples));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < options.resamples; ++r) {
    PhiloxStream stream(options.seed, static_cast<uint64_t>(r));  // a's draws, then b's, from one stream
    const double ma = resampled_mean(a, stream);
    diffs[r] = ma - resampled_mean(b, stream);
  }
  return interval_from(diffs, mean_of(a) - mean_of(b), options.level);
}

namespace {

std::vector<double> paired_differences(const char* what, std::span<const double> a, std::span<const double> b) {
  ASC_CHECK(a.size() == b.size(), "{}: a has {} values and b has {}; a paired test needs one pair per example", what,
            a.size(), b.size());
  check_size(what, a, 1);
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Ties decide p-values of 0/1 data: a resampled statistic equal to the observed one counts as "at least as
// extreme". Sums of the same values in another order differ by rounding, so equality is up to this tolerance.
double tie_tolerance(const std::vector<double>& d) {
  double scale = 0;
  for (double v : d) scale += std::fabs(v);
  return 1e-12 * std::max(scale, 1.0);
}

}  // namespace

PairedTest paired_bootstrap(std::span<const double> a, std::span<const double> b, const BootstrapOptions& options) {
  const std::vector<double> d = paired_differences("paired_bootstrap", a, b);
  check_options("paired_bootstrap", options);
  PairedTest t;
  t.resamples = options.resamples;
  if (has_nan(d)) {
    t.delta = t.low = t.high = t.p = t.se = kNaN;
    return t;
  }
  const double n = double(d.size());
  const double sum = std::accumulate(d.begin(), d.end(), 0.0);
  t.delta = sum / n;
  std::vector<double> sums(static_cast<size_t>(options.resamples));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < options.resamples; ++r) {
    PhiloxStream stream(options.seed, static_cast<uint64_t>(r));
    sums[r] = resampled_mean(d, stream) * n;
  }
  // Shifted to the null: how often does the resampled delta stray from delta by at least |delta|?
  const double tol = tie_tolerance(d);
  int64_t extreme = 0;
  for (double s : sums) extreme += std::fabs(s - sum) >= std::fabs(sum) - tol;
  t.p = double(1 + extreme) / double(1 + options.resamples);
  for (double& s : sums) s /= n;
  double m = 0, ss = 0;
  for (double s : sums) m += s / double(sums.size());
  for (double s : sums) ss += (s - m) * (s - m);
  t.se = sums.size() > 1 ? std::sqrt(ss / double(sums.size() - 1)) : 0.0;
  const Interval ci = interval_from(sums, t.delta, options.level);
  t.low = ci.low;
  t.high = ci.high;
  return t;
}

PairedTest approximate_randomization(std::span<const double> a, std::span<const double> b,
                                     const BootstrapOptions& options) {
  const std::vector<double> d = paired_differences("approximate_randomization", a, b);
  check_options("approximate_randomization", options);
  PairedTest t;
  t.low = t.high = t.se = kNaN;
  if (has_nan(d)) {
    t.delta = t.p = kNaN;
    return t;
  }
  const size_t n = d.size();
  const double sum = std::accumulate(d.begin(), d.end(), 0.0);
  t.delta = sum / double(n);
  const double tol = tie_tolerance(d), observed = std::fabs(sum) - tol;
  // Swapping a and b on example i flips the sign of d_i: the null distribution is that of sum_i s_i d_i, s = +-1.
  t.exact = n < 63 && (uint64_t(1) << n) <= uint64_t(options.resamples);
  if (t.exact) {
    const int64_t total = int64_t(1) << n;
    int64_t extreme = 0;
#pragma omp parallel for reduction(+ : extreme) schedule(static)
    for (int64_t mask = 0; mask < total; ++mask) {
      double s = 0;
      for (size_t i = 0; i < n; ++i) s += (mask >> i) & 1 ? -d[i] : d[i];
      extreme += std::fabs(s) >= observed;
    }
    t.resamples = total;
    t.p = double(extreme) / double(total);
    return t;
  }
  int64_t extreme = 0;
#pragma omp parallel for reduction(+ : extreme) schedule(static)
  for (int64_t r = 0; r < options.resamples; ++r) {
    PhiloxStream stream(options.seed, static_cast<uint64_t>(r));
    double s = 0;
    uint32_t bits = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i % 32 == 0) bits = stream.next();
      s += (bits >> (i % 32)) & 1 ? -d[i] : d[i];
    }
    extreme += std::fabs(s) >= observed;
  }
  t.resamples = options.resamples;
  t.p = double(1 + extreme) / double(1 + options.resamples);
  return t;
}

double cohens_d(std::span<const double> a, std::span<const double> b) {
  check_size("cohens_d", a, 2);
  check_size("cohens_d", b, 2);
  if (has_nan(a) || has_nan(b)) return kNaN;
  const double na = double(a.size()), nb = double(b.size());
  const double pooled = ((na - 1) * variance_of(a) + (nb - 1) * variance_of(b)) / (na + nb - 2);
  return (mean_of(a) - mean_of(b)) / std::sqrt(pooled);
}

double cliffs_delta(std::span<const double> a, std::span<const double> b) {
  check_size("cliffs_delta", a, 1);
  check_size("cliffs_delta", b, 1);
  if (has_nan(a) || has_nan(b)) return kNaN;
  // Sort b once; for each a_i, count b below and above it by binary search: O((n_a + n_b) log n_b).
  std::vector<double> sb(b.begin(), b.end());
  std::sort(sb.begin(), sb.end());
  int64_t more = 0, less = 0;
  for (double v : a) {
    more += std::lower_bound(sb.begin(), sb.end(), v) - sb.begin();  // b_j < a_i
    less += sb.end() - std::upper_bound(sb.begin(), sb.end(), v);    // b_j > a_i
  }
  return double(more - less) / (double(a.size()) * double(b.size()));
}

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

double normal_quantile(double p) {
  ASC_CHECK(p > 0 && p < 1, "normal_quantile: p must be in (0, 1), got {}", p);
  // The upper half by symmetry: 1 - p is exact for p >= 0.5 (Sterbenz), while cdf(x) - p near 1 would cancel.
  if (p > 0.5) return -normal_quantile(1 - p);
  // Acklam's rational approximation (relative error 1.15e-9) ...
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double p_low = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  };
  double x;
  if (p < p_low) {
    x = tail(std::sqrt(-2 * std::log(p)));
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  // ... then Halley's method on cdf(x) - p, which converges cubically: two steps reach double precision.
  for (int step = 0; step < 2; ++step) {
    const double e = normal_cdf(x) - p;
    const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
    x -= u / (1 + x * u / 2);
  }
  return x;
}

double minimum_detectable_effect(double se, double alpha, double power, double df) {
  ASC_CHECK(se >= 0 || std::isnan(se), "minimum_detectable_effect: se must be >= 0, got {}", se);
  ASC_CHECK(alpha > 0 && alpha < 1, "minimum_detectable_effect: alpha must be in (0, 1), got {}", alpha);
  ASC_CHECK(power > 0 && power < 1, "minimum_detectable_effect: power must be in (0, 1), got {}", power);
  ASC_CHECK(df >= 0, "minimum_detectable_effect: df must be >= 0 (0: the normal), got {}", df);
  if (df > 0) return (student_t_quantile(1 - alpha / 2, df) + student_t_quantile(power, df)) * se;
  return (normal_quantile(1 - alpha / 2) + normal_quantile(power)) * se;
}

namespace {

// The continued fraction of the incomplete beta function, evaluated by the modified Lentz method.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double tiny = 1e-300, eps = 1e-16;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  d = 1 / (std::fabs(d) < tiny ? tiny : d);
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    for (const double term : {m * (b - m) * x / ((a + m2 - 1) * (a + m2)),                // even step
                              -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))}) {  // odd step
      d = 1 + term * d;
      d = 1 / (std::fabs(d) < tiny ? tiny : d);
      c = 1 + term / c;
      c = std::fabs(c) < tiny ? tiny : c;
      h *= d * c;
    }
    if (std::fabs(d * c - 1) < eps) break;
  }
  return h;
}

// The regularised incomplete beta function I_x(a, b), 0 <= x <= 1, given x and y = 1 - x each computed without
// cancellation by the caller (for the t distribution x = df / (df + t²), y = t² / (df + t²)).
double incomplete_beta(double a, double b, double x, double y) {
  if (x <= 0) return 0;
  if (y <= 0) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log(y));
  // The fraction converges fast for x < (a + 1) / (a + b + 2); the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) otherwise.
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, y) / b;
}

}  // namespace

double student_t_cdf(double t, double df) {
  ASC_CHECK(df > 0, "student_t_cdf: df must be > 0, got {}", df);
  if (std::isnan(t)) return kNaN;
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t));  // P(T > |t|)
  return t > 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
  ASC_CHECK(p > 0 && p < 1, "student_t_quantile: p must be in (0, 1), got {}", p);
  ASC_CHECK(df > 0, "student_t_quantile: df must be > 0, got {}", df);
  if (p > 0.5) return -student_t_quantile(1 - p, df);  // symmetry; 1 - p is exact for p >= 0.5
  if (p == 0.5) return 0;
  // Bracket [lo, hi] with cdf(lo) <= p < cdf(hi) = 0.5, then bisect to the last bit.
  double lo = -1, hi = 0;
  while (student_t_cdf(lo, df) > p) lo *= 2;
  for (int i = 0; i < 2000 && hi - lo > 1e-15 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    (student_t_cdf(mid, df) > p ? hi : lo) = mid;
  }
  return lo + (hi - lo) / 2;
}

namespace {

// The t interval of a difference with standard error se at df degrees of freedom, and its two-sided p.
void finish_t_test(TTest& r, double level) {
  r.level = level;
  if (r.se == 0) {  // no spread at all: the means are equal (p = 1) or differ for certain (p = 0)
    r.t = r.difference == 0 ? 0.0 : std::copysign(std::numeric_limits<double>::infinity(), r.difference);
    r.p = r.difference == 0 ? 1.0 : 0.0;
    r.low = r.high = r.difference;
    return;
  }
  r.t = r.difference / r.se;
  r.p = 2 * student_t_cdf(-std::fabs(r.t), r.df);
  const double half = student_t_quantile((1 + level) / 2, r.df) * r.se;
  r.low = r.difference - half;
  r.high = r.difference + half;
}

TTest nan_t_test(double level) {
  TTest r;
  r.t = r.df = r.p = r.difference = r.se = r.low = r.high = kNaN;
  r.level = level;
  return r;
}

}  // namespace

TTest welch_t_test(std::span<const double> a, std::span<const double> b, double level) {
  check_size("welch_t_test", a, 2);
  check_size("welch_t_test", b, 2);
  ASC_CHECK(level > 0 && level < 1, "welch_t_test: level must be in (0, 1), got {}", level);
  if (has_nan(a) || has_nan(b)) return nan_t_test(level);
  TTest r;
  const double va = variance_of(a) / double(a.size()), vb = variance_of(b) / double(b.size());
  r.difference = mean_of(a) - mean_of(b);
  r.se = std::sqrt(va + vb);
  // Welch-Satterthwaite; without any spread the pooled count (the interval is then a point anyway)
  r.df = va + vb == 0 ? double(a.size() + b.size() - 2)
                      : (va + vb) * (va + vb) / (va * va / double(a.size() - 1) + vb * vb / double(b.size() - 1));
  finish_t_test(r, level);
  return r;
}

TTest paired_t_test(std::span<const double> a, std::span<const double> b, double level) {
  check_size("paired_t_test", a, 2);
  ASC_CHECK(a.size() == b.size(), "paired_t_test: a has {} values, b {} (pairs must match)", a.size(), b.size());
  ASC_CHECK(level > 0 && level < 1, "paired_t_test: level must be in (0, 1), got {}", level);
  if (has_nan(a) || has_nan(b)) return nan_t_test(level);
  std::vector<double> d(a.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = a[i] - b[i];
  TTest r;
  r.difference = mean_of(d);
  r.se = std::sqrt(variance_of(d) / double(d.size()));
  r.df = double(d.size() - 1);
  finish_t_test(r, level);
  return r;
}

double binomial_test_greater(int64_t k, int64_t n, double p0) {
  ASC_CHECK(n >= 1, "binomial_test_greater: n must be >= 1, got {}", n);
  ASC_CHECK(k >= 0 && k <= n, "binomial_test_greater: k must be in [0, n = {}], got {}", n, k);
  if (std::isnan(p0)) return kNaN;
  ASC_CHECK(p0 >= 0 && p0 <= 1, "binomial_test_greater: p0 must be in [0, 1], got {}", p0);
  if (k == 0) return 1.0;
  // P(X >= k) = I_{p0}(k, n - k + 1), the regularised incomplete beta function
  return incomplete_beta(double(k), double(n - k + 1), p0, 1 - p0);
}

std::vector<double> holm_adjust(std::span<const double> p) {
  for (double v : p)
    ASC_CHECK(std::isnan(v) || (v >= 0 && v <= 1), "holm_adjust: p-values must be in [0, 1], got {}", v);
  std::vector<size_t> order;
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isnan(p[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> out(p.begin(), p.end());
  const size_t m = order.size();
  double running = 0;  // step-down: an adjusted p never falls below the one before it
  for (size_t j = 0; j < m; ++j) {
    running = std::max(running, std::min(1.0, double(m - j) * p[order[j]]));
    out[order[j]] = running;
  }
  return out;
}

double accuracy_difference_se(double p, int64_t n) {
  ASC_CHECK(p >= 0 && p <= 1, "accuracy_difference_se: p must be in [0, 1], got {}", p);
  ASC_CHECK(n >= 1, "accuracy_difference_se: n must be >= 1, got {}", n);
  return std::sqrt(2 * p * (1 - p) / double(n));
}

double seed_difference_se(double sd, int64_t n_a, int64_t n_b) {
  ASC_CHECK(sd >= 0 || std::isnan(sd), "seed_difference_se: sd must be >= 0, got {}", sd);
  ASC_CHECK(n_a >= 1 && n_b >= 1, "seed_difference_se: seed counts must be >= 1, got {} and {}", n_a, n_b);
  return sd * std::sqrt(1.0 / double(n_a) + 1.0 / double(n_b));
}

double welch_minimum_detectable_effect(const TTest& welch, double alpha, double power) {
  if (std::isnan(welch.se) || std::isnan(welch.df)) return kNaN;
  return minimum_detectable_effect(welch.se, alpha, power, welch.df);
}

// ---- verdicts --------------------------------------------------------------------------------------------------

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::NotTestable: return "not testable";
    case Verdict::Rejected: return "rejected";
    case Verdict::SmallerThanClaimed: return "smaller than claimed";
    case Verdict::Holds: return "holds";
    case Verdict::Inconclusive: return "inconclusive";
  }
  return "?";
}

namespace {

bool interval_present(const Interval& i) { return !std::isnan(i.low) && !std::isnan(i.high); }

// The claim lies beyond the interval's far end, seen from the claimed direction: for a claimed gain (dir +1),
// above its upper end; for a claimed loss, below its lower end.
bool excludes_claim(const Interval& i, double claim, int dir) { return dir > 0 ? i.high < claim : i.low > claim; }

std::string g(double v) { return fmt::format("{:.4g}", v); }

}  // namespace

ClaimVerdict claim_verdict(const ClaimEvidence& e) {
  ASC_CHECK(!std::isnan(e.claim), "claim_verdict: the claim is NaN");
  ASC_CHECK(e.direction == 0 || e.direction == 1 || e.direction == -1,
            "claim_verdict: direction must be -1, 0 (the claim's sign) or +1, got {}", e.direction);
  const int dir = e.direction != 0 ? e.direction : (e.claim > 0) - (e.claim < 0);
  ASC_CHECK(dir != 0, "claim_verdict: a claim of 0 needs a direction (+1 or -1)");
  ASC_CHECK(e.claim * dir >= 0, "claim_verdict: the claim {} points against its direction {:+d}", e.claim, dir);
  ASC_CHECK(e.alpha > 0 && e.alpha < 1 && e.learn_alpha > 0 && e.learn_alpha < 1,
            "claim_verdict: alpha and learn_alpha must be in (0, 1), got {} and {}", e.alpha, e.learn_alpha);
  for (double p : {e.p_seeds, e.p_examples, e.baseline_learns_p})
    ASC_CHECK(std::isnan(p) || (p >= 0 && p <= 1), "claim_verdict: p-values must be in [0, 1], got {}", p);

  if (!std::isnan(e.baseline_learns_p) && e.baseline_learns_p >= e.learn_alpha)
    return {Verdict::NotTestable,
            fmt::format("the baseline does not learn the task: its accuracy is not above the majority-class rate "
                        "(binomial p {} >= {})",
                        g(e.baseline_learns_p), g(e.learn_alpha))};
  if (std::isnan(e.difference) || !interval_present(e.seeds) || std::isnan(e.p_seeds))
    return {Verdict::NotTestable, "a statistic is missing (fewer than 2 seeds per arm, or a NaN result)"};
  std::vector<const Interval*> intervals = {&e.seeds};
  std::vector<double> ps = {e.p_seeds};
  if (interval_present(e.examples) && !std::isnan(e.p_examples)) {
    intervals.push_back(&e.examples);
    ps.push_back(e.p_examples);
  }
  const auto excludes = [&](const Interval* i) { return excludes_claim(*i, e.claim, dir); };
  const bool all_exclude = std::all_of(intervals.begin(), intervals.end(), excludes);
  const bool any_exclude = std::any_of(intervals.begin(), intervals.end(), excludes);
  const bool significant = std::all_of(ps.begin(), ps.end(), [&](double p) { return p < e.alpha; });
  const bool sig_dir = significant && e.difference * dir > 0;
  const char* which = intervals.size() == 2 ? "both 95 % intervals (seeds, examples)" : "the 95 % interval over seeds";
  if (all_exclude)
    return {Verdict::Rejected,
            fmt::format("the claimed {} lies beyond {}{}", g(e.claim), which,
                        sig_dir       ? ": a significant difference in the claimed direction, smaller"
                        : significant ? ": a significant difference the other way"
                                      : ""),
            sig_dir};
  if (sig_dir && any_exclude)
    return {Verdict::SmallerThanClaimed,
            fmt::format("a significant difference of {} in the claimed direction; one interval excludes the claimed {}",
                        g(e.difference), g(e.claim)),
            sig_dir};
  if (sig_dir)
    return {
        Verdict::Holds,
        fmt::format("a significant difference of {} whose intervals hold the claimed {}", g(e.difference), g(e.claim)),
        sig_dir};
  return {Verdict::Inconclusive,
          fmt::format("{}: the data neither exclude the claimed {} nor show a significant difference in its direction",
                      g(e.difference), g(e.claim)),
          sig_dir};
}

}  // namespace asc::stats
