#pragma once
// Index lists from a row's flags or values on the CPU, compiled for the processor's vector level: the clustered
// pattern's rows (ops/sparse_attention.cpp: clustered_rows) and ASCender's top-k candidates (ops/cpu/ascender_terms.h:
// neighbourhoods). Both write every j of a row into out and advance only past the kept ones, so out must hold n
// entries and may be written anywhere in out[0, n); nothing past it is touched.
//
//   int64_t len = cpu::compact_flags(flags, n, out);      // out[0, len) = the j with flags[j] != 0, ascending
//   int64_t len = cpu::compact_greater(x, n, thr, out);   // out[0, len) = the j with x[j] > thr, ascending
#include <cstdint>

namespace asc::cpu {

// out[0 .. len) = the j < n with flags[j] != 0, ascending (flags 0 or 1); returns len. At x86-64-v4 eight flags at a
// time, compressed in a register; a branch-free scalar loop below it (the flags are unpredictable to a branch).
int64_t compact_flags(const unsigned char* flags, int64_t n, int64_t* out);

// out[0 .. len) = the j < n with x[j] > thr, ascending (a NaN x[j] or thr compares false, as `>` does); returns len.
// At x86-64-v4 a vector of x at a time (16 floats, 8 doubles), its indices compressed by the comparison's mask.
int64_t compact_greater(const float* x, int64_t n, float thr, int64_t* out);
int64_t compact_greater(const double* x, int64_t n, double thr, int64_t* out);

}  // namespace asc::cpu
