#pragma once
// How sum() splits a column sum into blocks of rows (ops/cpu/elementwise.cpp), shared with the kernels that fuse a
// column sum into a pass of their own (round_to_bfloat16's, for a bias gradient), so that theirs has sum()'s bits.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cpu/loops.h"

namespace asc::cpu {

// Elements per block of a full reduction.
inline constexpr int64_t kSumBlock = 16384;

// A contiguous (rows, m) tensor summed over its rows, m > 1: this many blocks of ceil(rows / blocks) whole rows, each
// summed in float64 row by row in order, then the blocks' sums added in block order (1: one pass over the rows in
// order). The blocks depend on the shape only: the same bits at any thread count.
inline int64_t column_sum_blocks(int64_t rows, int64_t m) {
  return std::max<int64_t>(1, std::min<int64_t>({rows, 64, rows * m / (4 * kSumBlock)}));
}

// The column sums of a (rows, m) tensor, m > 1, in that order: add_row(acc, r) adds row r into the m sums acc, for the
// rows of each block in order (the blocks on the threads), then the blocks' sums are added in block order. The m sums,
// in acc_t. sum() runs it with a row's plain addition; round_to_bfloat16 rounds each row as it adds it.
template <class acc_t, class AddRow>
std::vector<acc_t> column_sums_by_blocks(int64_t rows, int64_t m, AddRow&& add_row) {
  const int64_t blocks = column_sum_blocks(rows, m), per = (rows + blocks - 1) / blocks;
  std::vector<acc_t> part(static_cast<size_t>(blocks * m), acc_t(0));
  parallel_for(blocks, per * m, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t r = b * per; r < std::min(rows, (b + 1) * per); ++r) add_row(part.data() + b * m, r);
  });
  for (int64_t b = 1; b < blocks; ++b)
    for (int64_t c = 0; c < m; ++c) part[static_cast<size_t>(c)] += part[static_cast<size_t>(b * m + c)];
  part.resize(static_cast<size_t>(m));
  return part;
}

}  // namespace asc::cpu
