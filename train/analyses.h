#pragma once
// Analyses of a trained model (train/trainer.h runs them after the test pass, when asked), as functions of a Run:
//
//   cluster_metrics    do the attention heads (and ASCender's latent z) group tokens as the data's true groups do?
//   robustness         outputs under input noise and one FGSM step; the first attention layer's float32 vs float64
//                      output and its forward + backward over a sweep of lengths
//   dump_decomposition ASCender's score decomposition (S_base, align, sep, coh, S, A) of one test example
//
//   asc::train::Run r = asc::train::load_run("runs/grouping-ascender");
//   asc::train::json m = asc::train::cluster_metrics(r, 200);   // m["spaces"]["A"]["mean_over_heads"]["nmi"]
#include <string>

#include "train/step.h"

namespace asc::train {

// For the first n test examples of a task with true groups (grouping): per layer and head, k-means (k = the number of
// groups in the example) on the rows of the attention matrix A (T, T) and, for ASCender, on the latent z (T, d_z);
// NMI and ARI of those clusters against the true groups, their silhouette and Calinski-Harabasz in that space. Means
// over the examples; a score that is undefined for an example (k-means found one cluster) is left out of its mean and
// counted in "undefined". Needs the attention classifier.
json cluster_metrics(Run& r, int64_t n);

// How the trained classifier's outputs respond to perturbed inputs, and its attention to precision and length (the
// measures are defined in docs/train.md); r.c.robustness_examples and r.c.robustness_max_len size them.
json robustness(Run& r);

// Test example i's ASCender decomposition per ASCender layer, written to `path` (safetensors: L<l>.<part> and the
// tokens; metadata: the example's index and label).
void dump_decomposition(Run& r, int64_t i, const std::string& path);

}  // namespace asc::train
