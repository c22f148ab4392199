// asc::stats (stats/stats.h, stats/cluster.h) on cases whose answers are known by hand. The comparison with an
// independent implementation (scipy, scikit-learn) over random inputs is tests/stats_check.py (ctest: stats_check).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "stats/cluster.h"
#include "stats/stats.h"

namespace st = asc::stats;
using Vec = std::vector<double>;
using Labels = std::vector<int64_t>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST_CASE("describe: mean, sample std, median and interquartile mean of a known sample") {
  const st::Summary s = st::describe(Vec{4, 1, 3, 2});
  CHECK(s.n == 4);
  CHECK(s.mean == doctest::Approx(2.5));
  CHECK(s.std == doctest::Approx(std::sqrt(5.0 / 3.0)));  // squares of deviations 2.25 + .25 + .25 + 2.25 over 3
  CHECK(s.median == doctest::Approx(2.5));
  CHECK(s.min == 1);
  CHECK(s.max == 4);
  CHECK(s.iqm == doctest::Approx(2.5));  // drops 1 and 4
  CHECK(std::isnan(st::describe(Vec{7}).std));
  CHECK(st::describe(Vec{7}).mean == 7);
}

TEST_CASE("interquartile_mean drops floor(n/4) values at each end: one bad seed of five does not move it") {
  CHECK(st::interquartile_mean(Vec{1, 2, 3, 4, 100}) == doctest::Approx(3.0));
  CHECK(st::interquartile_mean(Vec{5, 1, 3}) == doctest::Approx(3.0));  // n < 4: nothing dropped
  CHECK(st::interquartile_mean(Vec{8, 1, 2, 3, 4, 5, 6, 7}) == doctest::Approx(4.5));
}

TEST_CASE("normal_quantile inverts normal_cdf to double precision; known quantiles") {
  CHECK(st::normal_quantile(0.975) == doctest::Approx(1.959963984540054).epsilon(1e-14));
  CHECK(st::normal_quantile(0.8) == doctest::Approx(0.8416212335729143).epsilon(1e-14));
  CHECK(std::fabs(st::normal_quantile(0.5)) < 1e-15);
  CHECK(st::normal_quantile(1e-10) == doctest::Approx(-6.361340902404056).epsilon(1e-12));
  for (double p : {1e-300, 1e-12, 0.01, 0.02425, 0.3, 0.7, 0.97575, 0.999, 1 - 1e-12})
    CHECK(st::normal_cdf(st::normal_quantile(p)) == doctest::Approx(p).epsilon(1e-12));
  CHECK_THROWS_AS(st::normal_quantile(0), asc::Error);
  CHECK_THROWS_AS(st::normal_quantile(1), asc::Error);
  CHECK_THROWS_AS(st::normal_quantile(kNaN), asc::Error);
}

TEST_CASE("minimum_detectable_effect: (z_0.975 + z_0.8) se = 2.80 se; accuracy and seed standard errors") {
  CHECK(st::minimum_detectable_effect(1.0) == doctest::Approx(1.959963984540054 + 0.8416212335729143));
  CHECK(st::minimum_detectable_effect(0.5, 0.01, 0.9) ==
        doctest::Approx(0.5 * (2.5758293035489004 + 1.2815515655446004)));
  // 2k test examples at accuracy 0.37: one accuracy's standard error is 1.08 points, a difference's sqrt(2) times it
  CHECK(st::accuracy_difference_se(0.37, 2000) == doctest::Approx(std::sqrt(2 * 0.37 * 0.63 / 2000)));
  CHECK(st::seed_difference_se(0.01, 5, 5) == doctest::Approx(0.01 * std::sqrt(0.4)));
  CHECK_THROWS_AS(st::minimum_detectable_effect(-1), asc::Error);
  CHECK_THROWS_AS(st::accuracy_difference_se(1.5, 10), asc::Error);
  CHECK_THROWS_AS(st::accuracy_difference_se(0.5, 0), asc::Error);
}

TEST_CASE("cohens_d and cliffs_delta on known groups") {
  CHECK(st::cohens_d(Vec{1, 2, 3}, Vec{3, 4, 5}) == doctest::Approx(-2.0));  // means 2 and 4, pooled sd 1
  CHECK(st::cohens_d(Vec{1, 2, 3, 4}, Vec{2, 4}) ==
        doctest::Approx((2.5 - 3.0) / std::sqrt((3 * 5.0 / 3 + 1 * 2.0) / 4)));
  CHECK(std::isinf(st::cohens_d(Vec{1, 1}, Vec{2, 2})));
  CHECK(std::isnan(st::cohens_d(Vec{1, 1}, Vec{1, 1})));
  CHECK(st::cliffs_delta(Vec{4, 5}, Vec{1, 2, 3}) == 1.0);
  CHECK(st::cliffs_delta(Vec{1, 2, 3}, Vec{4, 5}) == -1.0);
  CHECK(st::cliffs_delta(Vec{1, 2, 3}, Vec{1, 2, 3}) == 0.0);
  CHECK(st::cliffs_delta(Vec{2, 3}, Vec{1, 2}) == doctest::Approx(0.75));  // 3 wins, 1 tie, 0 losses of 4 pairs
  CHECK_THROWS_AS(st::cohens_d(Vec{1}, Vec{1, 2}), asc::Error);
  CHECK_THROWS_AS(st::cliffs_delta(Vec{}, Vec{1}), asc::Error);
}

TEST_CASE("approximate_randomization: exact enumeration gives the known p; no difference gives p = 1") {
  // Ten examples where A is right and B wrong: only the identity and the all-swapped assignment are as extreme.
  const Vec ones(10, 1.0), zeros(10, 0.0);
  const st::PairedTest t = st::approximate_randomization(ones, zeros);
  CHECK(t.exact);
  CHECK(t.resamples == 1024);
  CHECK(t.delta == 1.0);
  CHECK(t.p == doctest::Approx(2.0 / 1024));
  CHECK(st::approximate_randomization(ones, ones).p == 1.0);
  // Random (not exact) mode: p = (1 + count) / (R + 1) >= 1 / (R + 1); 40 one-sided wins are never matched.
  const st::PairedTest r = st::approximate_randomization(Vec(40, 1.0), Vec(40, 0.0), {.resamples = 999});
  CHECK(!r.exact);
  CHECK(r.p == doctest::Approx(1.0 / 1000));
  // Examples where both agree carry no information: adding them changes nothing but delta.
  Vec a = {1, 0, 1, 1, 0, 1}, b = {0, 0, 1, 0, 0, 1};
  const double p6 = st::approximate_randomization(a, b).p;
  a.insert(a.end(), {1, 1, 0}), b.insert(b.end(), {1, 1, 0});
  CHECK(st::approximate_randomization(a, b).p == doctest::Approx(p6));
  CHECK(p6 == doctest::Approx(0.5));  // two informative examples, both for A: half the sign patterns are as extreme
}

TEST_CASE("paired_bootstrap: interval and p of degenerate and clear cases") {
  const Vec ones(100, 1.0), zeros(100, 0.0);
  const st::PairedTest same = st::paired_bootstrap(ones, ones, {.resamples = 500});
  CHECK(same.delta == 0.0);
  CHECK(same.p == 1.0);
  CHECK(same.low == 0.0);
  CHECK(same.high == 0.0);
  const st::PairedTest clear = st::paired_bootstrap(ones, zeros, {.resamples = 500});
  CHECK(clear.delta == 1.0);
  CHECK(clear.p == doctest::Approx(1.0 / 501));
  // A difference of 10 points on 1000 examples with 20 % discordant pairs: SE = sqrt((0.2 - 0.01) / 1000) = 0.0138,
  // so the 95 % interval is about delta +- 0.027 and p is about 2 (1 - Phi(0.1 / 0.0138)) < 1e-3.
  Vec a(1000, 0.0), b(1000, 0.0);
  for (int i = 0; i < 150; ++i) a[i] = 1;    // A right, B wrong
  for (int i = 150; i < 200; ++i) b[i] = 1;  // B right, A wrong
  for (int i = 200; i < 700; ++i) a[i] = b[i] = 1;
  const st::PairedTest t = st::paired_bootstrap(a, b, {.resamples = 4000, .seed = 3});
  CHECK(t.delta == doctest::Approx(0.1));
  const double se = std::sqrt((0.2 - 0.01) / 1000);
  CHECK(t.high - t.low == doctest::Approx(2 * 1.96 * se).epsilon(0.1));
  CHECK(t.p < 2e-3);
}

TEST_CASE("bootstrap intervals: close to mean +- 1.96 sd/sqrt(n) for a large sample; contain the estimate") {
  std::mt19937_64 gen(7);
  std::normal_distribution<double> normal(10.0, 2.0);
  Vec x(2000);
  for (double& v : x) v = normal(gen);
  const st::Summary s = st::describe(x);
  const st::Interval ci = st::bootstrap_mean_ci(x, {.resamples = 4000, .seed = 1});
  const double half = 1.959963984540054 * s.std / std::sqrt(2000.0);
  CHECK(ci.estimate == doctest::Approx(s.mean));
  CHECK(ci.low == doctest::Approx(s.mean - half).epsilon(0.01));
  CHECK(ci.high == doctest::Approx(s.mean + half).epsilon(0.01));
  const Vec a = {0.80, 0.82, 0.81, 0.83, 0.84}, b = {0.78, 0.79, 0.80, 0.78, 0.81};
  const st::Interval d = st::bootstrap_difference_ci(a, b);
  CHECK(d.estimate == doctest::Approx(0.82 - 0.792));
  CHECK(d.low < d.estimate);
  CHECK(d.high > d.estimate);
  const st::Interval narrow = st::bootstrap_mean_ci(a, {.level = 0.5});
  const st::Interval wide = st::bootstrap_mean_ci(a, {.level = 0.99});
  CHECK(narrow.high - narrow.low < wide.high - wide.low);
}

TEST_CASE("resampling is reproducible: same seed, same bits, whatever the thread count; another seed differs") {
  Vec a(300), b(300);
  std::mt19937_64 gen(1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = double(gen() % 2), b[i] = double(gen() % 2);
  const st::BootstrapOptions o{.resamples = 2000, .seed = 11};
  const st::PairedTest t1 = st::paired_bootstrap(a, b, o);
  const st::Interval c1 = st::bootstrap_mean_ci(a, o);
  const double p1 = st::approximate_randomization(a, b, o).p;
#ifdef ASC_HAVE_OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  const st::PairedTest t2 = st::paired_bootstrap(a, b, o);
  const st::Interval c2 = st::bootstrap_mean_ci(a, o);
  const double p2 = st::approximate_randomization(a, b, o).p;
#ifdef ASC_HAVE_OPENMP
  omp_set_num_threads(threads);
#endif
  CHECK(t1.p == t2.p);
  CHECK(t1.low == t2.low);
  CHECK(t1.high == t2.high);
  CHECK(c1.low == c2.low);
  CHECK(p1 == p2);
  Vec x(300);  // continuous values: percentiles of 0/1 data can coincide across seeds
  for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + 0.001 * double(i);
  const st::Interval x1 = st::bootstrap_mean_ci(x, o), x2 = st::bootstrap_mean_ci(x, {.resamples = 2000, .seed = 12});
  CHECK((x1.low != x2.low || x1.high != x2.high));
}

TEST_CASE("statistics of inputs with a NaN are NaN; bad sizes and options are asc::Error") {
  const Vec with_nan = {1, kNaN, 3};
  CHECK(std::isnan(st::describe(with_nan).mean));
  CHECK(std::isnan(st::interquartile_mean(with_nan)));
  CHECK(std::isnan(st::bootstrap_mean_ci(with_nan).low));
  CHECK(std::isnan(st::paired_bootstrap(with_nan, Vec{1, 2, 3}).p));
  CHECK(std::isnan(st::approximate_randomization(with_nan, Vec{1, 2, 3}).p));
  CHECK(std::isnan(st::cohens_d(with_nan, Vec{1, 2})));
  CHECK(std::isnan(st::cliffs_delta(with_nan, Vec{1, 2})));
  CHECK_THROWS_AS(st::describe(Vec{}), asc::Error);
  CHECK_THROWS_AS(st::bootstrap_mean_ci(Vec{1}), asc::Error);
  CHECK_THROWS_AS(st::paired_bootstrap(Vec{1, 2}, Vec{1}), asc::Error);
  CHECK_THROWS_AS(st::paired_bootstrap(Vec{}, Vec{}), asc::Error);
  CHECK_THROWS_AS(st::paired_bootstrap(Vec{1}, Vec{0}, {.resamples = 0}), asc::Error);
  CHECK_THROWS_AS(st::bootstrap_mean_ci(Vec{1, 2}, {.level = 1.0}), asc::Error);
  CHECK_THROWS_AS(st::bootstrap_difference_ci(Vec{1, 2}, Vec{1}), asc::Error);
}

// ---- clustering ------------------------------------------------------------------------------------------------

TEST_CASE("NMI and ARI: identical partitions (relabelled) score 1, independent ones 0 and -0.5") {
  CHECK(st::normalized_mutual_info(Labels{0, 0, 1, 1}, Labels{7, 7, 3, 3}) == doctest::Approx(1.0));
  CHECK(st::adjusted_rand_index(Labels{0, 0, 1, 1}, Labels{7, 7, 3, 3}) == doctest::Approx(1.0));
  CHECK(st::normalized_mutual_info(Labels{0, 0, 1, 1}, Labels{0, 1, 0, 1}) == 0.0);
  // pairs together in both: 0; expected 2 * 2 / 6; maximum 2: (0 - 2/3) / (2 - 2/3) = -1/2
  CHECK(st::adjusted_rand_index(Labels{0, 0, 1, 1}, Labels{0, 1, 0, 1}) == doctest::Approx(-0.5));
  CHECK(st::normalized_mutual_info(Labels{5, 5, 5}, Labels{1, 1, 1}) == 1.0);
  CHECK(st::adjusted_rand_index(Labels{5, 5, 5}, Labels{1, 1, 1}) == 1.0);
  // One split of a single true cluster: MI = 0 -> NMI 0.
  CHECK(st::normalized_mutual_info(Labels{0, 0, 0, 0}, Labels{0, 0, 1, 1}) == 0.0);
  // A hand-computed case: truth {0,0,0,1,1,1}, pred {0,0,1,1,2,2}.
  //   MI = (2/6) ln(6*2/(3*2)) * 2 + (1/6) ln(6/(3*2)) * 2 = (2/3) ln 2; H(U) = ln 2; H(V) = ln 3
  CHECK(st::normalized_mutual_info(Labels{0, 0, 0, 1, 1, 1}, Labels{0, 0, 1, 1, 2, 2}) ==
        doctest::Approx((2.0 / 3 * std::log(2.0)) / ((std::log(2.0) + std::log(3.0)) / 2)));
  //   index = 1 + 1 = 2; sum_a = 3 + 3 = 6; sum_b = 1 + 1 + 1 = 3; total 15; expected 18/15; maximum 4.5
  CHECK(st::adjusted_rand_index(Labels{0, 0, 0, 1, 1, 1}, Labels{0, 0, 1, 1, 2, 2}) ==
        doctest::Approx((2 - 1.2) / (4.5 - 1.2)));
  CHECK_THROWS_AS(st::normalized_mutual_info(Labels{0, 1}, Labels{0}), asc::Error);
  CHECK_THROWS_AS(st::adjusted_rand_index(Labels{}, Labels{}), asc::Error);
}

TEST_CASE("silhouette and Calinski-Harabasz of two clusters on a line, by hand") {
  const Vec x = {0, 1, 10, 11};  // (4, 1)
  const Labels l = {0, 0, 1, 1};
  // a = 1 for each point; b = 10.5, 9.5, 9.5, 10.5
  CHECK(st::silhouette_score(x, 1, l) == doctest::Approx((2 * 9.5 / 10.5 + 2 * 8.5 / 9.5) / 4));
  // between: 2 * 5^2 * 2 = 100; within: 4 * 0.25 = 1; (100 / 1) / (1 / 2) = 200
  CHECK(st::calinski_harabasz_score(x, 1, l) == doctest::Approx(200.0));
  // A cluster of one point has silhouette 0: the mean over (0, s1, s2) = (s1 + s2) / 3
  const Vec y = {0, 10, 11};
  const double s1 = (10.0 - 1.0) / 10.0, s2 = (11.0 - 1.0) / 11.0;  // b = 10 and 11, a = 1
  CHECK(st::silhouette_score(y, 1, Labels{0, 1, 1}) == doctest::Approx((s1 + s2) / 3));
  CHECK(st::calinski_harabasz_score(Vec{0, 0, 5, 5}, 1, l) == 1.0);  // no spread within clusters
  CHECK(std::isnan(st::silhouette_score(Vec{0, kNaN, 10, 11}, 1, l)));
  CHECK_THROWS_AS(st::silhouette_score(x, 1, Labels{0, 0, 0, 0}), asc::Error);  // one cluster
  CHECK_THROWS_AS(st::silhouette_score(x, 1, Labels{0, 1, 2, 3}), asc::Error);  // n clusters
  CHECK_THROWS_AS(st::calinski_harabasz_score(x, 1, Labels{0, 1}), asc::Error);
  CHECK_THROWS_AS(st::silhouette_score(x, 3, l), asc::Error);  // 4 values are not rows of 3
}

TEST_CASE("kmeans recovers well-separated blobs, reaches the obvious optimum at k = 1 and k = n, is reproducible") {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> noise(0.0, 0.3);
  const int64_t per = 30, d = 3;
  Vec x;
  Labels truth;
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t i = 0; i < per; ++i) {
      for (int64_t j = 0; j < d; ++j) x.push_back(10.0 * double(c == j) - 5.0 * double(c == 3) + noise(gen));
      truth.push_back(c);
    }
  const st::KMeansResult km = st::kmeans(x, d, 4, {.seed = 2});
  CHECK(st::adjusted_rand_index(truth, km.labels) == doctest::Approx(1.0));
  CHECK(km.centres.size() == 12);
  const st::KMeansResult again = st::kmeans(x, d, 4, {.seed = 2});
  CHECK(again.labels == km.labels);
  CHECK(again.inertia == km.inertia);
  // k = 1: the centre is the mean; inertia the total sum of squares
  const st::KMeansResult one = st::kmeans(x, d, 1);
  double total = 0;
  for (int64_t j = 0; j < d; ++j) {
    double m = 0;
    for (int64_t i = 0; i < 4 * per; ++i) m += x[i * d + j] / double(4 * per);
    for (int64_t i = 0; i < 4 * per; ++i) total += (x[i * d + j] - m) * (x[i * d + j] - m);
  }
  CHECK(one.inertia == doctest::Approx(total));
  // k = n distinct points: inertia 0
  CHECK(st::kmeans(Vec{0, 1, 5, 9}, 1, 4).inertia == 0.0);
  // fewer distinct points than k: still k labels' worth of centres, no crash, inertia 0
  const st::KMeansResult dup = st::kmeans(Vec{1, 1, 1, 2, 2, 2}, 1, 3);
  CHECK(dup.inertia == 0.0);
  CHECK_THROWS_AS(st::kmeans(Vec{0, 1}, 1, 3), asc::Error);
  CHECK_THROWS_AS(st::kmeans(Vec{0, 1}, 1, 0), asc::Error);
  CHECK_THROWS_AS(st::kmeans(Vec{0, kNaN}, 1, 1), asc::Error);
  CHECK_THROWS_AS(st::kmeans(Vec{0, 1, 2}, 2, 1), asc::Error);
  CHECK_THROWS_AS(st::kmeans(Vec{0, 1}, 1, 1, {.n_init = 0}), asc::Error);
}

TEST_CASE("Student's t: known quantiles, cdf symmetry, the normal as df grows; Welch's test on a known case") {
  // Closed forms: df = 2, t = (2p - 1) / sqrt(2 p (1 - p)); df = 1 (Cauchy), t = tan(pi (p - 1/2)).
  for (double p : {0.01, 0.3, 0.8, 0.975}) {
    CHECK(st::student_t_quantile(p, 2) == doctest::Approx((2 * p - 1) / std::sqrt(2 * p * (1 - p))).epsilon(1e-13));
    CHECK(st::student_t_quantile(p, 1) == doctest::Approx(std::tan(std::numbers::pi * (p - 0.5))).epsilon(1e-12));
  }
  // printed tables (to their digits)
  CHECK(st::student_t_quantile(0.975, 10) == doctest::Approx(2.228138852).epsilon(1e-9));
  CHECK(st::student_t_quantile(0.95, 8) == doctest::Approx(1.859548038).epsilon(1e-9));
  CHECK(st::student_t_cdf(0, 3) == 0.5);
  CHECK(st::student_t_cdf(1.5, 7) + st::student_t_cdf(-1.5, 7) == doctest::Approx(1.0));
  // df = 1 is the Cauchy distribution: cdf(t) = 1/2 + atan(t) / pi
  CHECK(st::student_t_cdf(2.0, 1) == doctest::Approx(0.5 + std::atan(2.0) / std::numbers::pi).epsilon(1e-13));
  CHECK(st::student_t_quantile(0.975, 1e7) == doctest::Approx(1.959963984540054).epsilon(1e-6));
  for (double df : {1.0, 2.5, 9.0, 120.0})
    for (double p : {1e-6, 0.01, 0.3, 0.9})
      CHECK(st::student_t_cdf(st::student_t_quantile(p, df), df) == doctest::Approx(p).epsilon(1e-12));
  // MDE with few seeds: (t_0.975,2 + t_0.8,2) se = (4.303 + 1.061) se
  CHECK(st::minimum_detectable_effect(1.0, 0.05, 0.8, 2) ==
        doctest::Approx(0.95 / std::sqrt(2 * 0.975 * 0.025) + 0.6 / std::sqrt(2 * 0.8 * 0.2)));
  // Welch: a = {1, 2, 3} (var 1), b = {4, 6, 8} (var 4): t = (2 - 6) / sqrt(1/3 + 4/3) = -3.0984;
  // df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 2.9412
  const st::TTest w = st::welch_t_test(std::vector<double>{1, 2, 3}, std::vector<double>{4, 6, 8});
  CHECK(w.t == doctest::Approx(-4.0 / std::sqrt(5.0 / 3.0)));
  CHECK(w.df == doctest::Approx((25.0 / 9.0) / ((1.0 / 9.0) / 2 + (16.0 / 9.0) / 2)));
  CHECK(w.p == doctest::Approx(2 * st::student_t_cdf(w.t, w.df)));
  CHECK(st::welch_t_test(std::vector<double>{1, 1}, std::vector<double>{1, 1}).p == 1.0);
  CHECK(st::welch_t_test(std::vector<double>{1, 1}, std::vector<double>{2, 2}).p == 0.0);
  CHECK_THROWS_AS(st::student_t_quantile(0.5, 0), asc::Error);
  CHECK_THROWS_AS(st::student_t_cdf(1, -1), asc::Error);
  CHECK_THROWS_AS(st::welch_t_test(std::vector<double>{1}, std::vector<double>{1, 2}), asc::Error);
}

TEST_CASE("paired t-test, binomial test, Holm's adjustment and Welch's MDE on hand-computed cases") {
  // paired: d = {1, 2, 3}: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3), df 2
  const st::TTest p = st::paired_t_test(std::vector<double>{2, 4, 6}, std::vector<double>{1, 2, 3});
  CHECK(p.difference == doctest::Approx(2.0));
  CHECK(p.t == doctest::Approx(2 * std::sqrt(3.0)));
  CHECK(p.df == 2.0);
  CHECK(p.low == doctest::Approx(2 - st::student_t_quantile(0.975, 2) / std::sqrt(3.0)));
  CHECK_THROWS_AS(st::paired_t_test(std::vector<double>{1, 2}, std::vector<double>{1, 2, 3}), asc::Error);
  // binomial: P(X >= 2 | n = 2, p = 0.5) = 1/4; P(X >= 9 | 10, 0.5) = 11 / 1024; k = 0: 1; p0 = 0 and k > 0: 0
  CHECK(st::binomial_test_greater(2, 2, 0.5) == doctest::Approx(0.25).epsilon(1e-14));
  CHECK(st::binomial_test_greater(9, 10, 0.5) == doctest::Approx(11.0 / 1024).epsilon(1e-13));
  CHECK(st::binomial_test_greater(0, 10, 0.9) == 1.0);
  CHECK(st::binomial_test_greater(3, 10, 0.0) == 0.0);
  CHECK(st::binomial_test_greater(10, 10, 1.0) == 1.0);
  CHECK(std::isnan(st::binomial_test_greater(3, 10, std::nan(""))));
  CHECK_THROWS_AS(st::binomial_test_greater(11, 10, 0.5), asc::Error);
  CHECK_THROWS_AS(st::binomial_test_greater(1, 10, 1.5), asc::Error);
  // Holm: {0.01, 0.04, 0.03} -> sorted 0.01 x3, 0.03 x2, 0.04 x1 -> {0.03, 0.06, 0.06} (monotone), in the given order
  const std::vector<double> h = st::holm_adjust(std::vector<double>{0.01, 0.04, 0.03, std::nan("")});
  CHECK(h[0] == doctest::Approx(0.03));
  CHECK(h[1] == doctest::Approx(0.06));
  CHECK(h[2] == doctest::Approx(0.06));
  CHECK(std::isnan(h[3]));
  CHECK(st::holm_adjust(std::vector<double>{0.6, 0.5})[0] == 1.0);
  CHECK_THROWS_AS(st::holm_adjust(std::vector<double>{1.2}), asc::Error);
  // Welch's MDE uses Welch's df: unequal spreads give fewer degrees of freedom than n_a + n_b - 2 and a larger MDE
  const std::vector<double> a = {0.331, 0.332, 0.330, 0.333, 0.332}, b = {0.310, 0.330, 0.315, 0.325, 0.323};
  const st::TTest w = st::welch_t_test(a, b);
  CHECK(w.df < 8);
  CHECK(st::welch_minimum_detectable_effect(w) ==
        doctest::Approx((st::student_t_quantile(0.975, w.df) + st::student_t_quantile(0.8, w.df)) * w.se));
  CHECK(st::welch_minimum_detectable_effect(w) > st::minimum_detectable_effect(w.se, 0.05, 0.8, 8));
}

TEST_CASE("claim_verdict: each rule, in its order of precedence") {
  auto evidence = [](double claim, double diff, st::Interval seeds, st::Interval examples, double ps, double pe) {
    st::ClaimEvidence e;
    e.claim = claim;
    e.difference = diff;
    e.seeds = seeds;
    e.examples = examples;
    e.p_seeds = ps;
    e.p_examples = pe;
    e.baseline_learns_p = 1e-6;
    return e;
  };
  // experiment 5's ListOps shape: claimed +0.8, both intervals end below it, nothing significant -> rejected
  st::ClaimEvidence e = evidence(0.8, -0.38, {-0.38, -0.95, 0.19}, {-0.38, -0.85, 0.11}, 0.2, 0.1);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Rejected);
  CHECK_FALSE(st::claim_verdict(e).significant_in_direction);
  // the baseline not above the majority rate comes first, whatever else
  e.baseline_learns_p = 0.3;
  CHECK(st::claim_verdict(e).verdict == st::Verdict::NotTestable);
  // a significant gain smaller than claimed: both intervals exclude the claim -> rejected (precedence), the reason
  // says the gain is significant
  e = evidence(8.3, 1.1, {1.1, 0.5, 1.7}, {1.1, 0.48, 1.71}, 0.01, 0.001);
  const st::ClaimVerdict r = st::claim_verdict(e);
  CHECK(r.verdict == st::Verdict::Rejected);
  CHECK(r.reason.find("significant difference in the claimed direction") != std::string::npos);
  CHECK(r.significant_in_direction);
  // one interval holds the claim, the other excludes it, significant -> smaller than claimed
  e = evidence(1.5, 1.1, {1.1, 0.5, 1.7}, {1.1, 0.6, 1.4}, 0.01, 0.001);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::SmallerThanClaimed);
  // both hold it, significant -> holds; an interval wholly above a claimed gain still holds it (a larger gain)
  e = evidence(1.0, 1.1, {1.1, 0.5, 1.7}, {1.1, 0.6, 1.6}, 0.01, 0.001);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Holds);
  e = evidence(0.2, 1.1, {1.1, 0.5, 1.7}, {1.1, 0.6, 1.6}, 0.01, 0.001);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Holds);
  // significant in one test only (e.g. after Holm's adjustment) -> inconclusive
  e = evidence(1.0, 1.1, {1.1, 0.5, 1.7}, {1.1, 0.6, 1.6}, 0.12, 0.001);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Inconclusive);
  // a claimed loss: the mirror image
  e = evidence(-2.0, -0.1, {-0.1, -0.9, 0.7}, {-0.1, -0.8, 0.6}, 0.7, 0.7);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Rejected);
  e = evidence(-0.5, -0.1, {-0.1, -0.9, 0.7}, {-0.1, -0.8, 0.6}, 0.7, 0.7);
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Inconclusive);
  // a claim of a direction only (claim 0): a significant loss holds "lowers accuracy"; a significant gain rejects it
  e = evidence(0, -1.0, {-1.0, -1.5, -0.5}, {-1.0, -1.4, -0.6}, 0.001, 0.001);
  e.direction = -1;
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Holds);
  e = evidence(0, 1.0, {1.0, 0.5, 1.5}, {1.0, 0.6, 1.4}, 0.001, 0.001);
  e.direction = -1;
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Rejected);
  // no per-example results: the seed interval alone decides
  e = evidence(0.8, -0.38, {-0.38, -0.95, 0.19}, {std::nan(""), std::nan(""), std::nan("")}, 0.2, std::nan(""));
  e.baseline_learns_p = std::nan("");
  CHECK(st::claim_verdict(e).verdict == st::Verdict::Rejected);
  // a missing seed statistic -> not testable
  e.p_seeds = std::nan("");
  CHECK(st::claim_verdict(e).verdict == st::Verdict::NotTestable);
  // bad claims are errors
  e = evidence(0, 1.0, {1.0, 0.5, 1.5}, {1.0, 0.6, 1.4}, 0.001, 0.001);
  CHECK_THROWS_AS(st::claim_verdict(e), asc::Error);  // 0 without a direction
  e.claim = 1.0;
  e.direction = -1;
  CHECK_THROWS_AS(st::claim_verdict(e), asc::Error);  // against its direction
  CHECK(std::string(st::verdict_name(st::Verdict::SmallerThanClaimed)) == "smaller than claimed");
}
