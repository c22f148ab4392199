// The clustered pattern's phases as bench_asam's clustered row runs them (B 1, 4 heads of 64, n / 256 centroids,
// at least 8, θ 0.5), each timed on its own: the assignments (softmax of q · Cᵀ), clustered_union with an empty base,
// the first sparse_attention forward (its plans made), a second forward (plans cached), the backward of the first.
//   ./phases N     (4 calls; the first is a warm-up)
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
static double now() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main(int argc, char** argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 4096;
  manual_seed(0);
  Tensor q = randn({1, 4, n, 64}).set_requires_grad(true), k = randn({1, 4, n, 64}).set_requires_grad(true),
         v = randn({1, 4, n, 64}).set_requires_grad(true);
  const Tensor C = randn({4, std::max<int64_t>(8, n / 256), 64});
  const SparsePattern none = SparsePattern::from_rows(1, n, n, std::vector<std::vector<int64_t>>(n));
  for (int rep = 0; rep < 4; ++rep) {
    double t0 = now();
    const Tensor a = softmax(matmul(q.detach(), C.unsqueeze(0).transpose(-2, -1)), -1);
    double t1 = now();
    SparsePattern p = clustered_union(none, a, 0.5, false);
    double t2 = now();
    Tensor o = sparse_attention(q, k, v, p);
    double t3 = now();
    Tensor o2 = sparse_attention(q, k, v, p);
    double t4 = now();
    o.sum().backward();
    double t5 = now();
    printf("n %ld assign %.2f union %.2f fwd(first, plans) %.2f fwd(again) %.2f bwd %.2f  pairs/head %.0f\n", n,
           t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, double(p.nnz()) / p.groups());
  }
}
