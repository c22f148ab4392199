#include <dnnl.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
  struct S {
    int M, N, K;
    const char* name;
  };
  std::vector<S> shapes = {
      {2048, 384, 128, "qkv"}, {2048, 128, 128, "proj"}, {2048, 128, 512, "ffn2"}, {2048, 512, 128, "ffn1"}};
  for (auto sh : shapes) {
    int M = sh.M, N = sh.N, K = sh.K;
    std::vector<float> X((size_t)M * K), W((size_t)N * K), C((size_t)M * N), C2((size_t)M * N), bias(N);
    for (size_t i = 0; i < X.size(); ++i) X[i] = (i % 7) * 0.1f;
    for (size_t i = 0; i < W.size(); ++i) W[i] = (i % 5) * 0.1f;
    for (int i = 0; i < N; ++i) bias[i] = i * 0.01f;
    // per thread: half the rows
    auto plain = [&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        int m0 = t * M / 2, m = M / 2;
        omp_set_num_threads(1);
        dnnl_sgemm('N', 'T', m, N, K, 1.f, X.data() + (size_t)m0 * K, K, W.data(), K, 0.f, C.data() + (size_t)m0 * N,
                   N);
      }
    };
    auto plain_add = [&] {
      plain();
#pragma omp parallel for num_threads(2)
      for (int r = 0; r < M; ++r)
        for (int j = 0; j < N; ++j) C2[(size_t)r * N + j] = C[(size_t)r * N + j] + bias[j];
    };
    auto prefill = [&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        int m0 = t * M / 2, m = M / 2;
        omp_set_num_threads(1);
        for (int r = m0; r < m0 + m; ++r) std::memcpy(C.data() + (size_t)r * N, bias.data(), N * 4);
        dnnl_sgemm('N', 'T', m, N, K, 1.f, X.data() + (size_t)m0 * K, K, W.data(), K, 1.f, C.data() + (size_t)m0 * N,
                   N);
      }
    };
    auto post = [&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        int m0 = t * M / 2, m = M / 2;
        omp_set_num_threads(1);
        for (int r0 = m0; r0 < m0 + m; r0 += 64) {
          dnnl_sgemm('N', 'T', 64, N, K, 1.f, X.data() + (size_t)r0 * K, K, W.data(), K, 0.f, C.data() + (size_t)r0 * N,
                     N);
          for (int r = r0; r < r0 + 64; ++r)
            for (int j = 0; j < N; ++j) C[(size_t)r * N + j] += bias[j];
        }
      }
    };
    auto post_whole = [&] {
#pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        int m0 = t * M / 2, m = M / 2;
        omp_set_num_threads(1);
        dnnl_sgemm('N', 'T', m, N, K, 1.f, X.data() + (size_t)m0 * K, K, W.data(), K, 0.f, C.data() + (size_t)m0 * N,
                   N);
        for (int r = m0; r < m0 + m; ++r)
          for (int j = 0; j < N; ++j) C[(size_t)r * N + j] += bias[j];
      }
    };
    auto t = [&](auto f) {
      for (int i = 0; i < 5; ++i) f();
      std::vector<double> v;
      for (int r = 0; r < 40; ++r) {
        double t0 = now();
        f();
        v.push_back(now() - t0);
      }
      std::sort(v.begin(), v.end());
      return v[v.size() / 2] * 1e6;
    };
    for (int round = 0; round < 2; ++round)
      std::printf(
          "%-5s plain %6.0f  plain+add %6.0f  prefill+beta1 %6.0f  gemm64+add %6.0f  gemm+inplace add %6.0f us\n",
          sh.name, t(plain), t(plain_add), t(prefill), t(post), t(post_whole));
  }
}
