// Opens a region of vectorisable row loops like ops/cpu/vec_region_begin.h, with fp-contract=fast written out: the
// x86-64-v3 and x86-64-v4 kernels (ASC_CPU_DISPATCH) fuse a * b + c into one FMA (one rounding instead of two; the
// tests' tolerances hold either way). GCC does that for C++ by default too, so the two regions compile alike today;
// this one says that its kernels (ASCender, sparse attention) rely on it, whatever the build's default becomes. Close
// it with ops/cpu/vec_region_end.h. No include guard.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math", "fp-contract=fast")
#endif
