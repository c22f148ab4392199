#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
// Forward + backward of sparse attention with padding, the same pattern object every call (as AsamAttention's cached
// shared pattern) and a per-call per-head pattern (as its clustered part makes), best of N.
int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 20;
  const int64_t B = 8, H = 4, T = 1024, D = 64;
  Generator g(1);
  Tensor q = randn({B, H, T, D}, {}, &g).set_requires_grad(true),
         k = randn({B, H, T, D}, {}, &g).set_requires_grad(true),
         v = randn({B, H, T, D}, {}, &g).set_requires_grad(true);
  Tensor keep = ones({B, T}, {.dtype = kBool});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = T - 100 * b; j < T; ++j) keep.data_ptr<bool>()[b * T + j] = false;
  SparsePattern shared = pattern_union(
      {local_window_pattern(T, 64, false), global_tokens_pattern(T, 16, false), random_keys_pattern(T, 16, 1, false)});
  double best_shared = 1e9, best_call = 1e9;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    {
      Tensor o = sparse_attention(q, k, v, shared, keep);
      o.sum().backward();
    }
    auto t1 = std::chrono::steady_clock::now();
    SparsePattern per_call = pattern_union({shared, random_keys_pattern(T, 4, 100 + i, false)});  // a fresh pattern
    auto t2 = std::chrono::steady_clock::now();
    {
      Tensor o = sparse_attention(q, k, v, per_call, keep);
      o.sum().backward();
    }
    auto t3 = std::chrono::steady_clock::now();
    best_shared = std::min(best_shared, std::chrono::duration<double>(t1 - t0).count());
    best_call = std::min(best_call, std::chrono::duration<double>(t3 - t2).count());
  }
  printf("padding, B %ld H %ld T %ld: kept pattern f+b %.2f ms, fresh pattern each call f+b %.2f ms\n", B, H, T,
         best_shared * 1e3, best_call * 1e3);
}
