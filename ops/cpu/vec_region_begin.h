// Opens a region of vectorisable row loops (ops/cpu/vec_math.h says why): GCC compiles what follows with
// -fno-trapping-math, so it may if-convert the masked float selects of the row loops into vector blends. Include it
// after the file's other headers (a std:: function compiled with other options is not inlined into the region) and
// close the region with ops/cpu/vec_region_end.h. No include guard: each inclusion opens one region.
// ops/cpu/vec_region_fma_begin.h opens the same region with fp-contract as well.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
