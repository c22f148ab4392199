#pragma once
// How sum() splits a column sum into blocks of rows (ops/cpu/elementwise.cpp), shared with the kernels that fuse a
// column sum into a pass of their own (round_to_bfloat16's, for a bias gradient), so that theirs has sum()'s bits.
#include <algorithm>
#include <cstdint>

namespace asc::cpu {

// Elements per block of a full reduction.
inline constexpr int64_t kSumBlock = 16384;

// A contiguous (rows, m) tensor summed over its rows, m > 1: this many blocks of ceil(rows / blocks) whole rows, each
// summed in float64 row by row in order, then the blocks' sums added in block order (1: one pass over the rows in
// order). The blocks depend on the shape only: the same bits at any thread count.
inline int64_t column_sum_blocks(int64_t rows, int64_t m) {
  return std::max<int64_t>(1, std::min<int64_t>({rows, 64, rows * m / (4 * kSumBlock)}));
}

}  // namespace asc::cpu
