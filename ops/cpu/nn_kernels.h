#pragma once
// CPU kernels of the nn functional ops (ops/nn_functional.cpp). All of them are fused row-wise loops over a
// contiguous (rows, n) layout: the op moves the reduced dimension last and makes the operands contiguous before
// calling them, so every inner loop is a plain contiguous loop the compiler vectorises. Rows run in parallel.
// Inputs are validated by the op; outputs are preallocated, contiguous, with the shapes given below.
#include <cstdint>

#include "core/tensor.h"

namespace asc::cpu {

// y = softmax (or log_softmax when `log`) of x over its last dim. x, y contiguous, same shape; `mask` undefined or
// a contiguous bool tensor of x's shape (true = keep). Masked entries: 0 (log: -inf). A row with no kept entry,
// or whose kept entries are all -inf, gives all zeros (log: zeros too).
void softmax_forward(const Tensor& x, const Tensor& mask, bool log, Tensor& y);
// gx = d/dx of <g, y> for y from softmax_forward. softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g)
// over kept entries, 0 on masked entries and on dead (fully masked) rows. g, y, mask (optional), gx contiguous.
void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& mask, bool log, Tensor& gx);

// Layer norm (rms = false) or RMS norm (rms = true) over the last dim of contiguous x viewed as (rows, n).
// weight/bias: undefined or contiguous (n) (bias unused for rms). Writes y (x's shape), rstd (rows) and, for
// layer norm, mean (rows; undefined for rms). The statistics have the accumulation dtype: x's own here (float32 /
// float64); the CUDA kernels keep them in float32 for bfloat16 / float16 inputs.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool rms, Tensor& y,
                        Tensor& mean, Tensor& rstd);
// Gradients for layer_norm_forward given g (x's shape, contiguous). Each of gx (x's shape), gw (n), gb (n) is
// written when defined; gw/gb are sums over rows. `weight` may be undefined (treated as ones).
void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, bool rms, Tensor& gx, Tensor& gw, Tensor& gb);

// Cross entropy per row of logits (rows, C) (contiguous) with int64 targets (rows) (contiguous, already checked to
// be in [0, C) or == ignore_index). loss (rows): lse - (1 - s) x_t - (s / C) sum_j x_j, 0 for ignored rows;
// stats (rows, 2): the row's max m and log(sum_j exp(x_j - m)) (so lse = m + that), 0 for ignored rows.
void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                           Tensor& loss, Tensor& stats);
// gx (rows, C) = scale * gloss[r] * (softmax(x_r) - (1 - s) onehot(t_r) - s / C), 0 for ignored rows. gloss is (rows)
// with any stride (0 for a broadcast scalar).
void cross_entropy_backward(const Tensor& gloss, double scale, const Tensor& logits, const Tensor& target,
                            const Tensor& stats, int64_t ignore_index, double smoothing, Tensor& gx);

}  // namespace asc::cpu
