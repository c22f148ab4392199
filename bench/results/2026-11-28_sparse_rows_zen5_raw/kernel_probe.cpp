#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "ascender.h"
using namespace asc;
// Sparse kernel alone: forward (mode f) or forward + backward (mode b) of one pattern, best of iters.
int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "hier";
  const char mode = argc > 2 ? argv[2][0] : 'f';
  const int iters = argc > 3 ? atoi(argv[3]) : 20;
  const int64_t n = argc > 4 ? atoll(argv[4]) : 4096;
  const int64_t H = 4, D = 64;
  Generator g(1);
  Tensor q = randn({1, H, n, D}, {}, &g), k = randn({1, H, n, D}, {}, &g), v = randn({1, H, n, D}, {}, &g);
  SparsePattern p;
  if (!strcmp(which, "hier")) {
    const int64_t b = std::llround(std::sqrt(double(n)));
    p = hierarchical_pattern(n, b, false);
    k = cat({k, hierarchical_summaries(k, b).means}, 2).contiguous();
    v = cat({v, hierarchical_summaries(v, b).means}, 2).contiguous();
  } else if (!strcmp(which, "wgr")) {
    p = pattern_union({local_window_pattern(n, 256, false), global_tokens_pattern(n, 16, false),
                       random_keys_pattern(n, 16, 1, false)});
  } else if (!strcmp(which, "wg")) {
    p = pattern_union({local_window_pattern(n, 256, false), global_tokens_pattern(n, 16, false)});
  } else if (!strcmp(which, "wr")) {
    p = pattern_union({local_window_pattern(n, 256, false), random_keys_pattern(n, 16, 1, false)});
  } else if (!strcmp(which, "window")) {
    p = local_window_pattern(n, 256, false);
  } else {
    p = SparsePattern();
  }
  if (mode == 'b') q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
  double best = 1e9;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (p.defined()) {
      Tensor o = sparse_attention(q, k, v, p);
      if (mode == 'b') o.sum().backward();
    } else {
      Tensor o = scaled_dot_product_attention(q, k, v, SdpaOptions{});
      if (mode == 'b') o.sum().backward();
    }
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  const double pairs = p.defined() ? double(p.nnz()) / p.groups() : double(n) * n;
  printf("%s %c n %ld: %.3f ms, pairs/head %.0f, %.2f ns/pair/head (rate %.3f TF/s %s)\n", which, mode, n, best * 1e3,
         pairs, best * 1e9 / (pairs * H), 4.0 * D * pairs * H / best / 1e12, mode == 'b' ? "f+b" : "fwd");
}
