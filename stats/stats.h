#pragma once
// asc::stats — the statistics a comparison of models needs: summaries over seeds, interval estimates, paired tests
// over test examples, effect sizes and the smallest effect a comparison can detect. Plain C++ over doubles (no
// tensors): the inputs are per-seed scores and per-example results read from runs' summary.json / predictions.csv.
//
//   std::vector<double> a = {0.81, 0.83, 0.80, 0.82, 0.84};  // test accuracy of model A, one value per seed
//   std::vector<double> b = {0.79, 0.80, 0.78, 0.81, 0.80};  // model B
//   auto s = asc::stats::describe(a);                         // s.mean, s.std (n - 1 in the denominator), s.n
//   auto ci = asc::stats::bootstrap_mean_ci(a);               // 95 % percentile interval, 10k resamples
//   auto dci = asc::stats::bootstrap_difference_ci(a, b);     // interval of mean(a) - mean(b)
//   double d = asc::stats::cohens_d(a, b), delta = asc::stats::cliffs_delta(a, b);
//   // one value per test example (1 = correct), the same examples in the same order for both models:
//   auto t = asc::stats::paired_bootstrap(correct_a, correct_b);          // t.delta, t.low, t.high, t.p
//   auto r = asc::stats::approximate_randomization(correct_a, correct_b); // r.p
//
// Randomness: every resampling function takes a seed, and resample r draws from its own Philox stream (seed, r),
// so results are the same bits whatever the thread count. Inputs with a NaN give NaN results (no exception);
// empty inputs, mismatched lengths and out-of-range options are an asc::Error.
//
// What each test assumes, in one line each:
//   bootstrap_mean_ci          the seeds are a random sample of training runs; percentile interval (rliable's
//                              recommendation for few runs: say how uncertain a mean is, not only its spread)
//   paired_bootstrap           the test examples are a random sample; resample examples, keep each pair together.
//                              p is two-sided, from the bootstrap distribution shifted to the null (Efron and
//                              Tibshirani 1993, 16.4): p = (1 + #{|delta* - delta| >= |delta|}) / (B + 1)
//   approximate_randomization  under the null the two models' results on an example are exchangeable: swap each
//                              pair with probability 1/2 (Noreen 1989; Riezler and Maxwell 2005). Two-sided,
//                              p = (1 + #{|delta_perm| >= |delta|}) / (R + 1); exact (all 2^n swaps, no +1) when
//                              2^n <= resamples — the same p as scipy.stats.permutation_test.
#include <cstdint>
#include <span>
#include <vector>

namespace asc::stats {

struct Summary {
  int64_t n = 0;
  double mean = 0, std = 0;  // std with n - 1 in the denominator (NaN when n == 1)
  double min = 0, max = 0, median = 0;
  double iqm = 0;  // interquartile mean: the mean of the middle half (rliable), robust to one bad seed
};
Summary describe(std::span<const double> x);

// The interquartile mean as rliable computes it (scipy.stats.trim_mean(x, 0.25)): sort, drop floor(n / 4) values
// at each end, average the rest. n = 5 seeds: the mean of the middle three.
double interquartile_mean(std::span<const double> x);

struct Interval {
  double estimate = 0;  // the statistic on the data as given
  double low = 0, high = 0;
  double level = 0.95;
};

struct BootstrapOptions {
  int64_t resamples = 10000;
  double level = 0.95;  // central interval: percentiles (1 - level) / 2 and (1 + level) / 2
  uint64_t seed = 0;
};

// Percentile bootstrap interval of the mean over x (e.g. one accuracy per seed). n >= 2.
Interval bootstrap_mean_ci(std::span<const double> x, const BootstrapOptions& options = {});
// Percentile bootstrap interval of mean(a) - mean(b), a and b resampled independently (different runs).
Interval bootstrap_difference_ci(std::span<const double> a, std::span<const double> b,
                                 const BootstrapOptions& options = {});

struct PairedTest {
  double delta = 0;          // mean(a) - mean(b) over the examples
  double low = 0, high = 0;  // percentile bootstrap interval of delta (paired_bootstrap only; NaN otherwise)
  double se = 0;             // standard deviation of the bootstrap deltas: delta's standard error (paired_bootstrap)
  double p = 1;              // two-sided p-value of "no difference"
  int64_t resamples = 0;     // resamples (or permutations) used
  bool exact = false;        // approximate_randomization enumerated every swap
};

// a[i], b[i]: the two models' results on test example i (1/0 for correct/wrong, or a loss). Same length >= 1.
PairedTest paired_bootstrap(std::span<const double> a, std::span<const double> b, const BootstrapOptions& options = {});
PairedTest approximate_randomization(std::span<const double> a, std::span<const double> b,
                                     const BootstrapOptions& options = {});

// Cohen's d of two independent groups: (mean(a) - mean(b)) / s_pooled, s_pooled^2 = ((n_a - 1) s_a^2 +
// (n_b - 1) s_b^2) / (n_a + n_b - 2). Sizes >= 2. +-inf when the groups differ without spread, NaN when they
// are identical constants.
double cohens_d(std::span<const double> a, std::span<const double> b);
// Cliff's delta: (#{a_i > b_j} - #{a_i < b_j}) / (n_a n_b), in [-1, 1]; 1 = every a beats every b. Equals
// 2 U / (n_a n_b) - 1 with U the Mann-Whitney statistic of a.
double cliffs_delta(std::span<const double> a, std::span<const double> b);

// Student's t distribution with df > 0 degrees of freedom: cdf (through the regularised incomplete beta function,
// evaluated by its continued fraction) and its inverse (bisection on the cdf to double precision).
double student_t_cdf(double t, double df);
double student_t_quantile(double p, double df);

struct TTest {
  double t = 0, df = 0, p = 1;  // statistic, Welch-Satterthwaite degrees of freedom, two-sided p
};
// Welch's t-test of mean(a) = mean(b), unequal variances (scipy.stats.ttest_ind(a, b, equal_var=False)). Sizes >= 2.
TTest welch_t_test(std::span<const double> a, std::span<const double> b);

// The standard normal: cdf and its inverse (Acklam's rational approximation refined by two Halley steps, relative
// error near 1e-15). normal_quantile(p) for p in (0, 1).
double normal_cdf(double z);
double normal_quantile(double p);

// The smallest true difference a two-sided test at level alpha detects with probability `power`, when the
// estimate of the difference has standard error `se`: (z_{1 - alpha/2} + z_{power}) se (2.80 se at 0.05 / 0.8).
// With df > 0, t quantiles replace z (the usual approximation for a t-test; with few seeds it is much larger:
// 5.36 se at df = 2). df = 0: the normal.
double minimum_detectable_effect(double se, double alpha = 0.05, double power = 0.8, double df = 0);
// The standard error of the difference of two accuracies near p, each measured on n test examples, if the two
// models' errors were independent: sqrt(2 p (1 - p) / n). Correlated errors (same examples, similar models)
// make the paired error smaller; this is the figure to plan with before any run exists.
double accuracy_difference_se(double p, int64_t n);
// The standard error of the difference of two means over n_a and n_b seeds with per-seed standard deviation sd.
double seed_difference_se(double sd, int64_t n_a, int64_t n_b);

}  // namespace asc::stats
