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
//   // a verdict on "A is 0.8 points more accurate" (docs/stats.md): Welch's interval over seeds, the paired one over
//   // examples, their p-values (Holm-adjusted when several tasks test the claim), the baseline's binomial test
//   auto w = asc::stats::welch_t_test(a, b);
//   auto v = asc::stats::claim_verdict({.claim = 0.008, .difference = w.difference,
//                                       .seeds = {w.difference, w.low, w.high}, .examples = {t.delta, t.low, t.high},
//                                       .p_seeds = w.p, .p_examples = t.p});   // v.verdict, v.reason
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
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace asc::stats {

inline constexpr double kNaNValue = std::numeric_limits<double>::quiet_NaN();

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
  double t = 0, df = 0, p = 1;  // statistic, degrees of freedom (Welch-Satterthwaite for Welch's test), two-sided p
  double difference = 0;        // mean(a) - mean(b) (Welch), mean(a - b) (paired)
  double se = 0;                // its standard error: sqrt(s_a^2 / n_a + s_b^2 / n_b), or sd(a - b) / sqrt(n)
  double low = 0, high = 0;     // the t interval difference -+ t_{(1 + level) / 2, df} se: p < 1 - level exactly
  double level = 0.95;          // when 0 lies outside it
};
// Welch's t-test of mean(a) = mean(b), unequal variances (scipy.stats.ttest_ind(a, b, equal_var=False)), with the
// interval of the difference that goes with it. Sizes >= 2.
TTest welch_t_test(std::span<const double> a, std::span<const double> b, double level = 0.95);
// The paired t-test of mean(a - b) = 0 (scipy.stats.ttest_rel(a, b)): a[i] and b[i] share something that moves
// both, e.g. the two models trained with the same seed and the same data order. Same length >= 2.
TTest paired_t_test(std::span<const double> a, std::span<const double> b, double level = 0.95);

// The one-sided exact binomial test of "the success rate is at most p0" against "above p0", after k successes in n
// trials: P(X >= k) for X ~ Binomial(n, p0) (scipy.stats.binomtest(k, n, p0, alternative='greater').pvalue).
// 0 <= k <= n, n >= 1, p0 in [0, 1].
double binomial_test_greater(int64_t k, int64_t n, double p0);

// Holm's step-down adjustment of a family of p-values (Holm 1979): sort ascending, p_(i) -> max over j <= i of
// min(1, (m - j + 1) p_(j)); returned in the order given. Rejecting where the adjusted p < alpha keeps the chance of
// any false rejection in the family below alpha, with more power than Bonferroni. NaN entries stay NaN and do not
// count in m.
std::vector<double> holm_adjust(std::span<const double> p);

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
// The MDE of Welch's t-test over seeds as the test is actually run: its own standard error and its
// Welch-Satterthwaite degrees of freedom (fewer than n_a + n_b - 2 when the spreads differ, so a larger MDE than
// the pooled formula's). minimum_detectable_effect(t.se, alpha, power, t.df).
double welch_minimum_detectable_effect(const TTest& welch, double alpha = 0.05, double power = 0.8);

// ---- verdicts on a claimed difference (docs/stats.md, "Verdicts") ---------------------------------------------
//
// A claim says model A differs from baseline B by `claim` (signed; e.g. +0.008 = "A is 0.8 points more accurate").
// A claim of a direction only ("removing the term lowers accuracy") has claim 0 and direction -1 or +1. The rules,
// the first that applies wins:
//   not testable          the baseline does not learn the task: its accuracy is not above the majority-class rate
//                         by a one-sided binomial test at p < learn_alpha (0.01); or a statistic is missing
//   rejected              the claim lies beyond the far end of every available 95 % interval of the difference
//                         (over seeds, over examples), whatever the MDE: the data exclude it
//   smaller than claimed  a significant difference in the claimed direction, one of whose intervals excludes the claim
//   holds                 a significant difference in the claimed direction whose intervals hold the claim
//   inconclusive          the rest: report the MDE beside it
// "Significant" = every available test (Welch over seeds, paired over examples) at p < alpha, the p-values Holm-
// adjusted across the comparisons of one experiment by the caller. "Beyond the far end": for a claimed gain, above the
// interval's upper end (an interval wholly above the claim means a larger gain than claimed, which the claim covers).
enum class Verdict { NotTestable, Rejected, SmallerThanClaimed, Holds, Inconclusive };
const char* verdict_name(Verdict v);  // "not testable", "rejected", "smaller than claimed", "holds", "inconclusive"

struct ClaimEvidence {
  double claim = 0;               // claimed mean(A) - mean(B), signed; 0 with direction for a claim of direction only
  int direction = 0;              // +1 / -1; 0: the sign of claim
  double difference = kNaNValue;  // measured mean(A) - mean(B)
  Interval seeds{kNaNValue, kNaNValue, kNaNValue};     // interval over seeds (Welch's t interval)
  Interval examples{kNaNValue, kNaNValue, kNaNValue};  // interval over test examples (paired bootstrap); NaN: none
  double p_seeds = kNaNValue;                          // Welch p over seeds (Holm-adjusted across the family)
  double p_examples = kNaNValue;         // paired p over examples (Holm-adjusted); NaN: no per-example results
  double baseline_learns_p = kNaNValue;  // binomial_test_greater of B against the majority rate; NaN: not checked
  double alpha = 0.05, learn_alpha = 0.01;
};
struct ClaimVerdict {
  Verdict verdict = Verdict::Inconclusive;
  std::string reason;                     // one sentence, in the units of the inputs
  bool significant_in_direction = false;  // every available test at p < alpha, the difference the claim's way
};
ClaimVerdict claim_verdict(const ClaimEvidence& e);

}  // namespace asc::stats
