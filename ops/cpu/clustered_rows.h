#pragma once
// The dense pass of the clustered pattern's rows on the CPU (ops/sparse_attention.cpp: clustered_rows, used by
// clustered_pattern and clustered_union): for one query row i, which keys j have a_i · a_j > θ, every key at once,
// compiled for the processor's vector level (ASC_CPU_DISPATCH).
#include <cstdint>

namespace asc::cpu {

// flags[j] = 1 where Σ_m ai[m] · at[m · ld + j] > theta, else 0, for j < n (at: the group's assignments transposed,
// (c, ld)). The sum runs over m in order, each product and each addition rounded on its own (no FMA) at every vector
// level: the same bits as the bucket walk's scalar sum, so a pair qualifies the same way on every path and processor.
// dots: scratch of n doubles. NaN sums compare false.
void clustered_row_flags(const double* ai, const double* at, int64_t ld, int64_t c, int64_t n, double theta,
                         double* dots, unsigned char* flags);

}  // namespace asc::cpu
