#pragma once
// How the CPU kernels of sparse attention (ops/cpu/sparse_attention.cpp) cut a pattern's query rows into work, for
// tests and benchmarks: blocks of 16 consecutive rows over a tile of their keys, row groups (rows that share keys
// without being neighbours, as a cluster's tokens, over a tile of their keys gathered), and rows left to the row path.
//   const auto s = asc::cpu::sparse_attention_plan_summary(pattern.view(), /*head_dim=*/64);
//   // s.grouped_rows: how many query rows (over all groups) run on gathered tiles
#include <cstdint>

#include "ops/kernel_types.h"

namespace asc::cpu {

struct SparsePlanSummary {
  int64_t tiled_blocks = 0;   // blocks of consecutive rows on tiles of the head's keys
  int64_t row_groups = 0;     // row groups on gathered tiles
  int64_t grouped_rows = 0;   // the rows of those groups
  int64_t row_path_rows = 0;  // rows that go one by one
};

// The plans the kernels use for a pattern without padding and heads of head_dim columns: those the pattern keeps,
// made now if it has none yet (the kernels' next call then reads them). Counts over every group of the pattern.
SparsePlanSummary sparse_attention_plan_summary(const SparsePatternView& pattern, int64_t head_dim);

}  // namespace asc::cpu
