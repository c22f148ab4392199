#include <cblas.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
using C = std::chrono::steady_clock;
template <class F>
double best(F f, int reps, int inner) {
  double b = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = C::now();
    for (int i = 0; i < inner; ++i) f();
    b = std::min(b, std::chrono::duration<double>(C::now() - t0).count() / inner);
  }
  return b;
}
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256;
  std::vector<float> A(n * n, 1.f), B(n * n, 0.5f), Cm(n * n);
  auto fl = 2.0 * n * n * n;
  openblas_set_num_threads(2);
  auto ref = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, A.data(), n, B.data(), n, 0, Cm.data(), n);
  };
  ref();
  double t2 = best(ref, 7, 50);
  openblas_set_num_threads(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double t1 = best(ref, 7, 50);
  int h = n / 2;
  auto half_m = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, h, n, n, 1, A.data(), n, B.data(), n, 0, Cm.data(), n);
  };
  auto half_n = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, h, n, 1, A.data(), n, B.data(), n, 0, Cm.data(), n);
  };
  double thm = best(half_m, 7, 50), thn = best(half_n, 7, 50);
  auto par_m = [&] {
#pragma omp parallel num_threads(2)
    {
      int t = omp_get_thread_num();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, h, n, n, 1, A.data() + t * h * n, n, B.data(), n, 0,
                  Cm.data() + t * h * n, n);
    }
  };
  auto par_n = [&] {
#pragma omp parallel num_threads(2)
    {
      int t = omp_get_thread_num();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, h, n, 1, A.data(), n, B.data() + t * h, n, 0,
                  Cm.data() + t * h, n);
    }
  };
  par_m();
  double tpm = best(par_m, 7, 50);
  double tpn = best(par_n, 7, 50);
  printf(
      "n=%d  blas2 %.1f  blas1 %.1f  halfM(1t) %.1f  halfN(1t) %.1f  ompM %.1f  ompN %.1f GFLOP/s(us: %.1f %.1f %.1f "
      "%.1f %.1f %.1f)\n",
      n, fl / t2 * 1e-9, fl / t1 * 1e-9, fl / 2 / thm * 1e-9, fl / 2 / thn * 1e-9, fl / tpm * 1e-9, fl / tpn * 1e-9,
      t2 * 1e6, t1 * 1e6, thm * 1e6, thn * 1e6, tpm * 1e6, tpn * 1e6);
}
