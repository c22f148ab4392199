#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
using namespace dnnl;
using dt = memory::data_type;
static uint16_t rb(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0) return (u >> 16) & 0x8000u;
  u += 0x7fff + ((u >> 16) & 1);
  return u >> 16;
}
int main() {
  engine e(engine::kind::cpu, 0);
  stream s(e);
  for (auto [M, N, K] : {std::tuple{2048, 384, 128}, {2048, 512, 128}, {2048, 128, 512}}) {
    memory::desc a({M, K}, dt::f32, memory::dims{K, 1}), b({K, N}, dt::f32, memory::dims{N, 1}),
        c({M, N}, dt::f32, memory::dims{N, 1});
    primitive_attr at;
    at.set_fpmath_mode(fpmath_mode::bf16);
    matmul::primitive_desc pd(matmul::desc(a, b, c), at, e);
    matmul::primitive_desc pd32(matmul::desc(a, b, c), e);
    memory::desc ab({M, K}, dt::bf16, memory::dims{K, 1}), bb({K, N}, dt::bf16, memory::dims{N, 1});
    matmul::primitive_desc pdb(matmul::desc(ab, bb, c), e);
    printf("%d %d %d: fpmath %s | f32 %s | bf16 %s\n", M, N, K, pd.impl_info_str(), pd32.impl_info_str(),
           pdb.impl_info_str());
    std::vector<float> A(M * K), B(K * N), C(M * N), C2(M * N);
    for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(i * 0.37f);
    for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(i * 0.11f);
    std::vector<uint16_t> Ab(M * K), Bb(K * N);
    for (size_t i = 0; i < A.size(); ++i) Ab[i] = rb(A[i]);
    for (size_t i = 0; i < B.size(); ++i) Bb[i] = rb(B[i]);
    memory ma(a, e, A.data()), mb(b, e, B.data()), mc(c, e, C.data()), mab(ab, e, Ab.data()), mbb(bb, e, Bb.data()),
        mc2(c, e, C2.data());
    matmul p(pd), p32(pd32), pb(pdb);
    auto run = [&](matmul& m, memory& x, memory& y, memory& z) {
      auto t = std::chrono::steady_clock::now();
      for (int r = 0; r < 50; ++r) {
        m.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, y}, {DNNL_ARG_DST, z}});
        s.wait();
      }
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / 50;
    };
    for (int k = 0; k < 2; ++k)
      printf("  fpmath %.1f us, f32 %.1f us, bf16 %.1f us\n", run(p, ma, mb, mc), run(p32, ma, mb, mc2),
             run(pb, mab, mbb, mc2));
    run(p, ma, mb, mc);
    run(pb, mab, mbb, mc2);
    double md = 0;
    for (size_t i = 0; i < C.size(); ++i) md = std::fmax(md, std::fabs(C[i] - C2[i]));
    printf("  max |fpmath - explicit bf16| %g\n", md);
  }
}
