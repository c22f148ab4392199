#pragma once
// The CPU kernels of hierarchical_keys (ops/sparse_attention.h): a hierarchical pattern's keys or values — x, then one
// mean per block of b tokens — in one pass over x, and their backward in one pass over the gradient, instead of the
// composition's where / sum / div / clamp / cat and their backwards (two passes over x and a third for the copy).
// CPU only: the op composes them on other devices.
#include <cstdint>

#include "core/tensor.h"

namespace asc::cpu {

// x (B, H, T, d) float32 / float64 with unit stride along d; keep (B, T) contiguous bool, or undefined (every token
// real). out (B, H, T + nb, d) contiguous, nb = ceil(T / b): rows [0, T) = x, row T + m = the mean of block m's real
// tokens (a padding token's value, NaN included, never read; 0 for a block with none), summed in float64.
void hierarchical_keys_forward(const Tensor& x, int64_t b, const Tensor& keep, Tensor& out);
// g (B, H, T + nb, d) with unit stride along d; gx (B, H, T, d) contiguous:
// gx[t] = g[t] + (keep[t] ? g[T + t / b] / max(count of real tokens of t's block, 1) : 0).
void hierarchical_keys_backward(const Tensor& g, int64_t b, const Tensor& keep, Tensor& gx);

}  // namespace asc::cpu
