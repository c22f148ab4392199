#pragma once
// The ops ASCender's swarm attention is built from (docs/ops.md): top-k neighbourhoods, pairwise distances,
// cosine matrices, row normalisations, and the hard firing gate with a selectable backward.
//
//   auto nb = asc::topk(affinity, k, {.exclude_diagonal = true});  // (B, n, k) values + int64 indices
//   Tensor d2 = asc::pairwise_sqdist(Z, Z);                          // (B, n, n)
//   Tensor F = asc::hard_gate(Z, SP, {.mode = asc::GateBackward::Surrogate, .surrogate = "sigmoid", .width = 4});
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_types.h"
#include "ops/math.h"
#include "ops/reduce.h"

namespace asc {

struct TopkOptions {
  bool largest = true;            // false: the k smallest
  bool exclude_diagonal = false;  // skip j == i (row i of the last two dims; needs a square (.., n, n) input)
  Tensor mask;                    // optional bool, broadcastable to x; false entries are never selected
};
// Per row (last dim): the k largest (or smallest) values, sorted, and their int64 indices. Error when k exceeds
// the number of selectable entries of a row (row length, minus the diagonal, minus masked entries) or k < 1.
// Ties are broken by the lower index. Gradient flows to the selected entries.
ValuesIndices topk(const Tensor& x, int64_t k, const TopkOptions& opts = {});

// X (.., n, d), Y (.., m, d) -> (.., n, m) with out[.., i, j] = ||x_i - y_j||^2 (clamped at 0). Batch dims
// broadcast.
Tensor pairwise_sqdist(const Tensor& X, const Tensor& Y);
// X (.., n, d), Y (.., m, d) -> (.., n, m) with out[.., i, j] = x_i . y_j / (max(||x_i||, eps) max(||y_j||, eps)).
Tensor cosine_similarity_matrix(const Tensor& X, const Tensor& Y, double eps = 1e-8);
// x / max(||x||_2, eps) over the last dim.
Tensor normalize_rows(const Tensor& x, double eps = 1e-12);
// (x - mean_j) / (std_j + eps) over the last dim, population std. With `mask` (bool, broadcastable to x; true =
// valid) mean and std use only the valid entries and invalid entries of the result are 0. A row with no valid
// entry gives zeros.
Tensor row_standardize(const Tensor& x, const Tensor& mask = {}, double eps = 1e-6);

// ---- the hard gate F = 1[z >= theta] ----------------------------------------------------------------------------
// GateBackward (the backward's mode) and Surrogate (a surrogate derivative) are kernel arguments: ops/kernel_types.h.
struct GateOptions {
  GateBackward mode = GateBackward::None;
  std::string surrogate = "sigmoid";  // a name registered in the surrogate registry
  double width = 1.0;                 // the surrogate's scale parameter (> 0)
};

// The registry: "sigmoid" (alpha * sigma(alpha u) (1 - sigma(alpha u)), alpha = width),
// "rectangular" (1/width on |u| < width/2), "triangular" (max(0, 1 - |u|/width) / width),
// "atan" (width / (2 (1 + (pi/2 width u)^2))). Unknown names are an error listing the known ones.
const Surrogate& surrogate(const std::string& name);
std::vector<std::string> surrogate_names();
void register_surrogate(Surrogate s);

// GateOptions checked and resolved for `op` on `device` — the one place every gated op (hard_gate, firing_output)
// checks them: an unknown mode, a width that is not finite and > 0, an unknown surrogate name (the error lists the
// known ones) or, on CUDA, a user-registered surrogate (a host function, no device code) is an asc::Error naming op.
GateSpec gate_spec(const char* op, const GateOptions& opts, Device device);

// z (..), theta broadcastable to z -> F in {0, 1} of z's dtype.
Tensor hard_gate(const Tensor& z, const Tensor& theta, const GateOptions& opts = {});

}  // namespace asc
