#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <signal.h>
#include <sys/time.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
volatile sig_atomic_t hits = 0;
extern "C" void on_sig(int) { hits = hits + 1; }
int main(int argc, char** argv) {
  int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
  if (argc > 4) dnnl_set_max_cpu_isa(argv[4][0] == '2' ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_avx512_core);
  struct sigaction sa {};
  sa.sa_handler = on_sig;
  if (argc > 5) sa.sa_flags = SA_ONSTACK;
  if (argc > 5) {
    static char alt[1 << 16];
    stack_t ss{alt, 0, sizeof alt};
    sigaltstack(&ss, nullptr);
  }
  sigaction(SIGALRM, &sa, nullptr);
  itimerval it{{0, 50}, {0, 50}};
  setitimer(ITIMER_REAL, &it, nullptr);
  omp_set_num_threads(1);
  std::vector<float> A(M * K, 1), B(K * N, 1), C(M * N);
  int bad = 0;
  long iters = 2e9 / (2.0 * M * N * K) + 10;
  for (long t = 0; t < iters; ++t) {
    dnnl_sgemm('N', 'N', M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
    for (float c : C)
      if (c != K) {
        ++bad;
        break;
      }
  }
  printf("%d %d %d: bad %d / %ld, signals %d\n", M, N, K, bad, iters, (int)hits);
}
