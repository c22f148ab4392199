// Closes the region ops/cpu/vec_region_begin.h or vec_region_fma_begin.h opened. No include guard.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
