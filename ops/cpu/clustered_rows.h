#pragma once
// The pair tests of the clustered pattern's rows on the CPU (ops/sparse_attention.cpp: clustered_rows, used by
// clustered_pattern and clustered_union): which keys j have a_i · a_j > θ — for one row against every key, or for a
// bucket's member rows four at a time against its members — compiled for the processor's vector level
// (ASC_CPU_DISPATCH).
#include <cstdint>

namespace asc::cpu {

// flags[j] = 1 where Σ_m ai[m] · at[m · ld + j] > theta, else 0, for j < n (at: the group's assignments transposed,
// (c, ld)). The sum runs over m in order, each product and each addition rounded on its own (no FMA) at every vector
// level: the same bits as the bucket walk's scalar sum, so a pair qualifies the same way on every path and processor.
// dots: scratch of n doubles. NaN sums compare false.
void clustered_row_flags(const double* ai, const double* at, int64_t ld, int64_t c, int64_t n, double theta,
                         double* dots, unsigned char* flags);

// The same test for R rows at once (1 <= R <= 4; rows[r]: row r's c assignments) against the n keys of a bucket,
// at: the bucket members' assignments transposed, (c, ld): bit j % 64 of bits[r · words + j / 64] is set where
// Σ_m rows[r][m] · at[m · ld + j] > theta (words >= ceil(n / 64): a row's first ceil(n / 64) words are written whole,
// bits from n on 0). The same sums as clustered_row_flags, bit for bit; each column of at is read once for the R rows.
void clustered_rows_bits(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                         double theta, uint64_t* bits, int64_t words);

}  // namespace asc::cpu
