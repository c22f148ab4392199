#include <algorithm>
#include <chrono>
#include <cstdio>
#include "ascender.h"
using namespace asc;
using Clk = std::chrono::steady_clock;
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256;
  int iters = argc > 2 ? atoi(argv[2]) : 20000;
  Generator g(1);
  Tensor a = randn({n, n}, {}, &g), b = randn({n, n}, {}, &g);
  Tensor c;
  double fl = 2.0 * n * n * n, bestt = 1e30;
  for (int r = 0; r < iters / 20; ++r) {
    auto t0 = Clk::now();
    for (int i = 0; i < 20; ++i) c = matmul(a, b);
    bestt = std::min(bestt, std::chrono::duration<double>(Clk::now() - t0).count() / 20);
  }
  printf("n=%d ours %.1f GFLOP/s %.1f us\n", n, fl / bestt * 1e-9, bestt * 1e6);
}
