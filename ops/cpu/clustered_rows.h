#pragma once
// The pair tests of the clustered pattern's rows on the CPU (ops/sparse_attention.cpp: clustered_rows, used by
// clustered_pattern and clustered_union): which keys j have a_i · a_j > θ, for up to four rows at once — rows that
// test every key of their group, or a bucket's member rows against its members — compiled for the processor's vector
// level (ASC_CPU_DISPATCH).
//   const double* rows[4] = {a + i0 * c, ...};   // each row's c assignments
//   cpu::clustered_rows_flags(rows, 4, at, T, c, n, theta, flags, T);   // flags[r · T + j] for j < n
#include <cstdint>

namespace asc::cpu {

// R rows at once (1 <= R <= 4; rows[r]: row r's c assignments) against n keys, at: the keys' assignments transposed,
// (c, ld): flags[r · ld_flags + j] = 1 where Σ_m rows[r][m] · at[m · ld + j] > theta, else 0, for j < n. The sum runs
// over m in order, each product and each addition rounded on its own (no FMA) at every vector level: the same bits as
// the bucket walk's scalar sum, so a pair qualifies the same way on every path and processor. NaN sums compare false.
// Each column of at is read once for the R rows.
void clustered_rows_flags(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                          double theta, unsigned char* flags, int64_t ld_flags);

// The same test as bits: bit j % 64 of bits[r · words + j / 64] (words >= ceil(n / 64); a row's first ceil(n / 64)
// words are written whole, bits from n on 0).
void clustered_rows_bits(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                         double theta, uint64_t* bits, int64_t words);

}  // namespace asc::cpu
