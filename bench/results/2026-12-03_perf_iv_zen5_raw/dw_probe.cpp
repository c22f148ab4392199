#include <omp.h>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
using namespace dnnl;
using dt = memory::data_type;
// dW (N x K) = G^T (N x M) X (M x K), split in 2 threads by output rows (current) or other ways.
int main() {
  engine e(engine::kind::cpu, 0);
  for (auto [N, K] : {std::pair{128, 128}, {384, 128}, {512, 128}, {128, 512}}) {
    const int M = 2048;
    std::vector<uint16_t> G(M * N, 0x3f80), X(M * K, 0x3f80), Gt(N * M, 0x3f80);
    std::vector<float> W(N * K), W2(2 * N * K);
    auto make = [&](int m, int n, int k, bool ta, int lda, int ldb, int ldc) {
      memory::desc a({m, k}, dt::bf16, ta ? memory::dims{1, lda} : memory::dims{lda, 1}),
          b({k, n}, dt::bf16, memory::dims{ldb, 1}), c({m, n}, dt::f32, memory::dims{ldc, 1});
      return std::tuple{matmul(matmul::primitive_desc(matmul::desc(a, b, c), e)), a, b, c};
    };
    auto time = [&](auto&& f) {
      double best = 1e9;
      for (int r = 0; r < 5; ++r) {
        auto t = std::chrono::steady_clock::now();
        for (int i = 0; i < 40; ++i) f();
        best = std::min(best,
                        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 40);
      }
      return best;
    };
    // (1) rows of output split, A transposed view of G
    double t1 = time([&] {
#pragma omp parallel num_threads(2)
      {
        static thread_local stream* s = nullptr;
        int t = omp_get_thread_num();
        int r0 = t * N / 2, r1 = (t + 1) * N / 2;
        static thread_local std::vector<std::tuple<int, matmul, memory::desc, memory::desc, memory::desc>> cache;
        auto [p, a, b, c] = make(r1 - r0, K, M, true, N, K, K);
        if (!s) s = new stream(e);
        memory ma(a, e, G.data() + r0), mb(b, e, X.data()), mc(c, e, W.data() + r0 * K);
        p.execute(*s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
        s->wait();
      }
    });
    // build primitives once for fair timing
    auto P1a = make(N / 2, K, M, true, N, K, K), P2a = make(N / 2, K, M, false, M, K, K),
         P3a = make(N, K, M / 2, true, N, K, K), P4a = make(N, K, M / 2, false, M, K, K);
    auto run = [&](auto& P, const uint16_t* A, const uint16_t* B, float* C) {
      static thread_local stream s(e);
      auto& [p, a, b, c] = P;
      memory ma(a, e, const_cast<uint16_t*>(A)), mb(b, e, const_cast<uint16_t*>(B)), mc(c, e, C);
      p.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
      s.wait();
    };
    double r1 = time([&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        run(P1a, G.data() + t * N / 2, X.data(), W.data() + t * (N / 2) * K);
      }
    });
    double r2 = time([&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        run(P2a, Gt.data() + t * (N / 2) * M, X.data(), W.data() + t * (N / 2) * K);
      }
    });
    double r3 = time([&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        run(P3a, G.data() + t * (M / 2) * N, X.data() + t * (M / 2) * K, W2.data() + t * N * K);
      }
      for (int i = 0; i < N * K; ++i) W[i] = W2[i] + W2[N * K + i];
    });
    double r4 = time([&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        run(P4a, Gt.data() + t * (M / 2), X.data() + t * (M / 2) * K, W2.data() + t * N * K);
      }
      for (int i = 0; i < N * K; ++i) W[i] = W2[i] + W2[N * K + i];
    });
    double fl = 2.0 * N * K * M;
    printf(
        "N%d K%d M%d: rows+Gt-view %.1f us (%.0f GF) | rows+Gt-contig %.1f (%.0f) | ksplit view %.1f (%.0f) | ksplit "
        "contig %.1f (%.0f)  [%g]\n",
        N, K, M, r1, fl / r1 / 1e3, r2, fl / r2 / 1e3, r3, fl / r3 / 1e3, r4, fl / r4 / 1e3, t1);
  }
}
