#include <omp.h>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
using namespace dnnl;
double run(engine& eng, stream& s, memory::dim M, memory::dim N, memory::dim K, memory::data_type dt,
           std::string& impl) {
  memory::desc a({M, K}, dt, memory::format_tag::ab), b({K, N}, dt, memory::format_tag::ab),
      c({M, N}, memory::data_type::f32, memory::format_tag::ab);
  matmul::desc d(a, b, c);
  matmul::primitive_desc pd(d, eng);
  impl = pd.impl_info_str();
  matmul p(pd);
  memory ma(a, eng), mb(b, eng), mc(c, eng);
  // fill with zeros-ish values
  memset(ma.get_data_handle(), 0, a.get_size());
  memset(mb.get_data_handle(), 0, b.get_size());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
  for (int i = 0; i < 3; ++i) p.execute(s, args);
  s.wait();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    int inner = std::max<int>(1, 2e8 / (2.0 * M * N * K));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) p.execute(s, args);
    s.wait();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  return 2.0 * M * N * K / best / 1e9;
}
int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  for (int th : {2, 1}) {
    omp_set_num_threads(th);
    for (auto [M, N, K] : std::vector<std::array<long, 3>>{{2048, 512, 128},
                                                           {2048, 128, 512},
                                                           {128, 512, 2048},
                                                           {2048, 384, 128},
                                                           {512, 512, 512},
                                                           {1024, 1024, 1024}}) {
      std::string i1, i2;
      double f = run(eng, s, M, N, K, memory::data_type::f32, i1),
             h = run(eng, s, M, N, K, memory::data_type::bf16, i2);
      printf("threads %d  %5ld x %4ld x %4ld: f32 %6.1f GFLOP/s (%s)  bf16 %6.1f GFLOP/s (%s)  bf16/f32 time %.2f\n",
             th, M, N, K, f, i1.c_str(), h, i2.c_str(), f / h);
    }
  }
}
