#pragma once
// asc::stats clustering: k-means and the four scores that say how well a clustering matches the truth (NMI, ARI)
// or how well separated it is (silhouette, Calinski-Harabasz). The same definitions as scikit-learn's
// (sklearn.metrics), which the test suite checks them against — e.g. to ask whether an attention head's rows
// group the tokens the way the data's latent groups do:
//
//   // x: (n, d) row-major points, e.g. the n = T rows of one head's attention matrix A (T, T)
//   auto km = asc::stats::kmeans(x, /*d=*/T, /*k=*/3, {.seed = 0});          // km.labels (n), km.inertia
//   double nmi = asc::stats::normalized_mutual_info(truth, km.labels);        // 1 = the same partition
//   double ari = asc::stats::adjusted_rand_index(truth, km.labels);           // 0 = chance, 1 = the same
//   double sil = asc::stats::silhouette_score(x, T, km.labels);               // in [-1, 1]
//   double ch = asc::stats::calinski_harabasz_score(x, T, km.labels);         // larger = better separated
//
// Labels are any int64 values (only equality matters). Points are rows of a row-major (n, d) array of doubles.
// Bad sizes are an asc::Error; kmeans rejects a non-finite point; the scores of points with a NaN are NaN.
#include <cstdint>
#include <span>
#include <vector>

namespace asc::stats {

struct KMeansOptions {
  int64_t n_init = 10;     // runs from different k-means++ seedings; the one with the least inertia wins
  int64_t max_iter = 300;  // Lloyd iterations per run
  double tol = 1e-4;       // stop when the centres move less than tol * (the mean variance of the features), as
                           // scikit-learn does: squared Frobenius norm of the centre shift
  uint64_t seed = 0;       // run r draws from its own Philox stream (seed, r)
};

struct KMeansResult {
  std::vector<int64_t> labels;  // (n) in [0, k)
  std::vector<double> centres;  // (k, d) row-major
  double inertia = 0;           // sum of squared distances of the points to their centres
  int64_t iterations = 0;       // Lloyd iterations of the winning run
};

// k-means++ seeding (Arthur and Vassilvitskii 2007: each new centre drawn with probability proportional to the
// squared distance to the nearest centre so far), then Lloyd's iterations; a cluster left empty is re-seeded with
// the point farthest from its centre. 1 <= k <= n.
KMeansResult kmeans(std::span<const double> x, int64_t d, int64_t k, const KMeansOptions& options = {});

// Normalised mutual information, I(U; V) / ((H(U) + H(V)) / 2) (natural logs; scikit-learn's default
// "arithmetic" normalisation). 1 when both labelings are a single cluster; 0 when I = 0.
double normalized_mutual_info(std::span<const int64_t> truth, std::span<const int64_t> pred);
// Adjusted Rand index (Hubert and Arabie 1985): the Rand index corrected for chance, in [-0.5, 1]; 1 when the
// two partitions are identical (including both trivial).
double adjusted_rand_index(std::span<const int64_t> truth, std::span<const int64_t> pred);
// The mean silhouette over the points (Euclidean distance): s_i = (b_i - a_i) / max(a_i, b_i), a_i the mean distance
// to the rest of i's cluster, b_i the least mean distance to another cluster; s_i = 0 in a cluster of one.
// Needs 2 <= (number of clusters) <= n - 1. O(n^2 d).
double silhouette_score(std::span<const double> x, int64_t d, std::span<const int64_t> labels);
// Calinski-Harabasz (variance ratio): [tr(B) / (k - 1)] / [tr(W) / (n - k)], B and W the between- and within-
// cluster dispersion; 1 when W = 0 (scikit-learn's convention). Needs 2 <= k <= n - 1.
double calinski_harabasz_score(std::span<const double> x, int64_t d, std::span<const int64_t> labels);

}  // namespace asc::stats
