// asc::stats clustering: k-means, NMI, ARI, silhouette, Calinski-Harabasz (stats/cluster.h).
#include "stats/cluster.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/generator.h"

namespace asc::stats {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Checks that x is (n, d) and returns n.
int64_t rows_of(const char* what, std::span<const double> x, int64_t d) {
  ASC_CHECK(d >= 1, "{}: d must be >= 1, got {}", what, d);
  ASC_CHECK(x.size() % size_t(d) == 0, "{}: {} values are not rows of d = {}", what, x.size(), d);
  return static_cast<int64_t>(x.size()) / d;
}

double squared_distance(const double* a, const double* b, int64_t d) {
  double s = 0;
  for (int64_t j = 0; j < d; ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return s;
}

// Labels renumbered 0..k-1 in order of their values; returns k.
int64_t dense_labels(std::span<const int64_t> labels, std::vector<int64_t>& out) {
  std::map<int64_t, int64_t> ids;
  for (int64_t l : labels) ids.emplace(l, 0);
  int64_t k = 0;
  for (auto& [label, id] : ids) id = k++;
  out.resize(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) out[i] = ids[labels[i]];
  return k;
}

// One k-means run: k-means++ seeding from `stream`, then Lloyd. x (n, d).
KMeansResult kmeans_run(const double* x, int64_t n, int64_t d, int64_t k, const KMeansOptions& o, double tol,
                        PhiloxStream& stream) {
  std::vector<double> centres(static_cast<size_t>(k * d));
  // Seeding: the first centre uniform, each next one with probability proportional to D^2 (its squared distance
  // to the nearest centre chosen so far). A draw that lands on D^2 = 0 everywhere (fewer distinct points than k)
  // takes the first point, which leaves a duplicate centre that Lloyd's empty-cluster rule then handles.
  std::vector<double> nearest(size_t(n), std::numeric_limits<double>::infinity());
  int64_t pick = std::min<int64_t>(static_cast<int64_t>(stream.unit() * double(n)), n - 1);
  for (int64_t c = 0; c < k; ++c) {
    if (c > 0) {
      double total = 0;
      for (int64_t i = 0; i < n; ++i) total += nearest[i];
      double target = stream.unit() * total;
      int64_t last = 0;  // the last point with mass, in case rounding leaves target >= 0 after the loop
      pick = -1;
      for (int64_t i = 0; i < n && pick < 0; ++i) {
        if (nearest[i] <= 0) continue;
        last = i;
        target -= nearest[i];
        if (target < 0) pick = i;
      }
      if (pick < 0) pick = last;
    }
    std::copy(x + pick * d, x + (pick + 1) * d, centres.begin() + c * d);
    for (int64_t i = 0; i < n; ++i) nearest[i] = std::min(nearest[i], squared_distance(x + i * d, &centres[c * d], d));
  }

  KMeansResult r;
  r.labels.assign(size_t(n), 0);
  std::vector<double> dist(static_cast<size_t>(n)), sums(static_cast<size_t>(k * d));
  std::vector<int64_t> counts(static_cast<size_t>(k));
  auto assign = [&] {
    for (int64_t i = 0; i < n; ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < k; ++c) {
        const double s = squared_distance(x + i * d, &centres[c * d], d);
        if (s < best) best = s, r.labels[i] = c;  // ties: the lower centre index
      }
      dist[i] = best;
    }
  };
  for (r.iterations = 1; r.iterations <= o.max_iter; ++r.iterations) {
    assign();
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      ++counts[r.labels[i]];
      for (int64_t j = 0; j < d; ++j) sums[r.labels[i] * d + j] += x[i * d + j];
    }
    double shift = 0;
    for (int64_t c = 0; c < k; ++c) {
      double* centre = &centres[c * d];
      if (counts[c] == 0) {  // empty: move it to the point farthest from its own centre
        const int64_t far = std::max_element(dist.begin(), dist.end()) - dist.begin();
        for (int64_t j = 0; j < d; ++j) shift += (x[far * d + j] - centre[j]) * (x[far * d + j] - centre[j]);
        std::copy(x + far * d, x + (far + 1) * d, centre);
        dist[far] = 0;
        continue;
      }
      for (int64_t j = 0; j < d; ++j) {
        const double m = sums[c * d + j] / double(counts[c]);
        shift += (m - centre[j]) * (m - centre[j]);
        centre[j] = m;
      }
    }
    if (shift <= tol) break;
  }
  r.iterations = std::min(r.iterations, o.max_iter);
  assign();  // labels and inertia of the final centres
  r.inertia = 0;
  for (double v : dist) r.inertia += v;
  r.centres = std::move(centres);
  return r;
}

// The contingency table of two labelings: counts n_ij, row sums a_i, column sums b_j.
struct Contingency {
  std::vector<double> nij, a, b;
  int64_t ku = 0, kv = 0;
  double n = 0;
};
Contingency contingency(const char* what, std::span<const int64_t> truth, std::span<const int64_t> pred) {
  ASC_CHECK(truth.size() == pred.size(), "{}: truth has {} labels and pred has {}", what, truth.size(), pred.size());
  ASC_CHECK(!truth.empty(), "{}: needs at least one label", what);
  std::vector<int64_t> u, v;
  Contingency c;
  c.ku = dense_labels(truth, u);
  c.kv = dense_labels(pred, v);
  c.n = double(truth.size());
  c.nij.assign(size_t(c.ku * c.kv), 0.0);
  c.a.assign(size_t(c.ku), 0.0);
  c.b.assign(size_t(c.kv), 0.0);
  for (size_t i = 0; i < u.size(); ++i) {
    c.nij[u[i] * c.kv + v[i]] += 1;
    c.a[u[i]] += 1;
    c.b[v[i]] += 1;
  }
  return c;
}

double entropy_of(const std::vector<double>& counts, double n) {
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / n * std::log(c / n);
  return h;
}

// Points and labels checked together: returns (n, number of clusters, dense labels); NaN points flagged.
struct Labelled {
  int64_t n = 0, k = 0;
  std::vector<int64_t> labels;
  bool finite = true;
};
Labelled labelled(const char* what, std::span<const double> x, int64_t d, std::span<const int64_t> labels) {
  Labelled l;
  l.n = rows_of(what, x, d);
  ASC_CHECK(int64_t(labels.size()) == l.n, "{}: {} points but {} labels", what, l.n, labels.size());
  l.k = dense_labels(labels, l.labels);
  ASC_CHECK(l.k >= 2 && l.k <= l.n - 1, "{}: needs 2 <= clusters <= n - 1, got {} clusters of {} points", what, l.k,
            l.n);
  l.finite = std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); });
  return l;
}

}  // namespace

KMeansResult kmeans(std::span<const double> x, int64_t d, int64_t k, const KMeansOptions& options) {
  const int64_t n = rows_of("kmeans", x, d);
  ASC_CHECK(k >= 1 && k <= n, "kmeans: k must be in [1, n = {}], got {}", n, k);
  ASC_CHECK(options.n_init >= 1, "kmeans: n_init must be >= 1, got {}", options.n_init);
  ASC_CHECK(options.max_iter >= 1, "kmeans: max_iter must be >= 1, got {}", options.max_iter);
  ASC_CHECK(options.tol >= 0, "kmeans: tol must be >= 0, got {}", options.tol);
  ASC_CHECK(std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); }),
            "kmeans: the points hold a NaN or an infinity");
  // scikit-learn's tolerance: tol times the mean over the features of their variance.
  double mean_variance = 0;
  for (int64_t j = 0; j < d; ++j) {
    double m = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) m += x[i * d + j];
    m /= double(n);
    for (int64_t i = 0; i < n; ++i) ss += (x[i * d + j] - m) * (x[i * d + j] - m);
    mean_variance += ss / double(n);
  }
  const double tol = options.tol * mean_variance / double(d);
  KMeansResult best;
  for (int64_t run = 0; run < options.n_init; ++run) {
    PhiloxStream stream(options.seed, static_cast<uint64_t>(run));
    KMeansResult r = kmeans_run(x.data(), n, d, k, options, tol, stream);
    if (run == 0 || r.inertia < best.inertia) best = std::move(r);
  }
  return best;
}

double normalized_mutual_info(std::span<const int64_t> truth, std::span<const int64_t> pred) {
  const Contingency c = contingency("normalized_mutual_info", truth, pred);
  if (c.ku == 1 && c.kv == 1) return 1.0;  // neither labeling splits the data: a perfect match
  double mi = 0;
  for (int64_t i = 0; i < c.ku; ++i)
    for (int64_t j = 0; j < c.kv; ++j) {
      const double nij = c.nij[i * c.kv + j];
      if (nij > 0) mi += nij / c.n * std::log(c.n * nij / (c.a[i] * c.b[j]));
    }
  mi = std::max(mi, 0.0);  // rounding can leave a tiny negative for independent labelings
  if (mi == 0) return 0.0;
  return mi / ((entropy_of(c.a, c.n) + entropy_of(c.b, c.n)) / 2);
}

double adjusted_rand_index(std::span<const int64_t> truth, std::span<const int64_t> pred) {
  const Contingency c = contingency("adjusted_rand_index", truth, pred);
  auto pairs = [](double m) { return m * (m - 1) / 2; };
  double index = 0, sum_a = 0, sum_b = 0;
  for (double nij : c.nij) index += pairs(nij);
  for (double a : c.a) sum_a += pairs(a);
  for (double b : c.b) sum_b += pairs(b);
  const double total = pairs(c.n);
  const double expected = total > 0 ? sum_a * sum_b / total : 0, maximum = (sum_a + sum_b) / 2;
  if (maximum == expected) return 1.0;  // both trivial (one cluster, or all singletons): identical partitions
  return (index - expected) / (maximum - expected);
}

double silhouette_score(std::span<const double> x, int64_t d, std::span<const int64_t> labels) {
  const Labelled l = labelled("silhouette_score", x, d, labels);
  if (!l.finite) return kNaN;
  std::vector<double> size(size_t(l.k), 0.0);
  for (int64_t c : l.labels) size[c] += 1;
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t i = 0; i < l.n; ++i) {
    std::vector<double> to_cluster(size_t(l.k), 0.0);  // sum of distances from i to each cluster
    for (int64_t j = 0; j < l.n; ++j)
      if (j != i) to_cluster[l.labels[j]] += std::sqrt(squared_distance(&x[i * d], &x[j * d], d));
    const int64_t own = l.labels[i];
    if (size[own] == 1) continue;  // s_i = 0
    const double a = to_cluster[own] / (size[own] - 1);
    double b = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < l.k; ++c)
      if (c != own) b = std::min(b, to_cluster[c] / size[c]);
    const double m = std::max(a, b);
    total += m > 0 ? (b - a) / m : 0.0;
  }
  return total / double(l.n);
}

double calinski_harabasz_score(std::span<const double> x, int64_t d, std::span<const int64_t> labels) {
  const Labelled l = labelled("calinski_harabasz_score", x, d, labels);
  if (!l.finite) return kNaN;
  std::vector<double> mean(size_t(d), 0.0), centre(size_t(l.k * d), 0.0), size(size_t(l.k), 0.0);
  for (int64_t i = 0; i < l.n; ++i) {
    size[l.labels[i]] += 1;
    for (int64_t j = 0; j < d; ++j) {
      mean[j] += x[i * d + j] / double(l.n);
      centre[l.labels[i] * d + j] += x[i * d + j];
    }
  }
  for (int64_t c = 0; c < l.k; ++c)
    for (int64_t j = 0; j < d; ++j) centre[c * d + j] /= size[c];
  double between = 0, within = 0;
  for (int64_t c = 0; c < l.k; ++c) between += size[c] * squared_distance(&centre[c * d], mean.data(), d);
  for (int64_t i = 0; i < l.n; ++i) within += squared_distance(&x[i * d], &centre[l.labels[i] * d], d);
  if (within == 0) return 1.0;
  return between * double(l.n - l.k) / (within * double(l.k - 1));
}

}  // namespace asc::stats
