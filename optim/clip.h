#pragma once
// Gradient clipping with torch.nn.utils semantics. Parameters without a .grad are skipped; gradients are scaled
// in place (no grad).
//
//   loss.backward();
//   double norm = asc::optim::clip_grad_norm(model->parameters(), 1.0);   // total L2 norm before clipping
//   asc::optim::clip_grad_value(model->parameters(), 5.0);                // every grad element into [-5, 5]
//   opt.step();
#include <vector>

#include "core/tensor.h"

namespace asc::optim {

// The total norm of all gradients together, (sum_i ||g_i||_p^p)^(1/p) (norm_type = INFINITY: max |g|), computed
// in float64 and returned before clipping. When total > max_norm every gradient is multiplied by
// max_norm / (total + 1e-6). A non-finite total throws asc::Error (gradients untouched) unless
// error_if_nonfinite is false, in which case the gradients are scaled as torch does (NaN / inf propagate).
// No gradients at all: returns 0.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = true);

// Clamps every gradient element to [-clip, clip] (clip >= 0).
void clip_grad_value(const std::vector<Tensor>& params, double clip);

}  // namespace asc::optim
