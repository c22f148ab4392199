#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
using namespace dnnl;
int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  using dt = memory::data_type;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      long M = 512, K = 2048, N = 128;
      memory::desc a({M, K}, dt::bf16, ta ? memory::dims{1, M} : memory::dims{K, 1});
      memory::desc b({K, N}, dt::bf16, tb ? memory::dims{1, K} : memory::dims{N, 1});
      memory::desc c({M, N}, dt::f32, memory::dims{N, 1});
      matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
      matmul p(pd);
      memory ma(a, eng), mb(b, eng), mc(c, eng);
      memset(ma.get_data_handle(), 0, M * K * 2);
      memset(mb.get_data_handle(), 0, K * N * 2);
      double best = 1e9;
      for (int r = 0; r < 5; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) p.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
        s.wait();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20);
      }
      printf("ta %d tb %d: %s  %.1f GFLOP/s\n", ta, tb, pd.impl_info_str(), 2.0 * M * N * K / best * 1e-9);
    }
}
