#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "new.inc"
#include "new2.inc"
#include "new3.inc"
#include "old.inc"
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int main() {
  alignas(64) static float a[1024 * 64], b[1024 * 64];
  philox_old(123, (1ull << 32) - 100, 1024, a);
  philox_new(123, (1ull << 32) - 100, 1024, b);
  philox_new2(123, (1ull << 32) - 100, 1024, a);
  std::printf("equal2 %d\n", std::memcmp(a, b, sizeof a) == 0);
  philox_new3(123, (1ull << 32) - 100, 1024, a);
  std::printf("equal3 %d\n", std::memcmp(a, b, sizeof a) == 0);
  std::printf("equal %d\n", std::memcmp(a, b, sizeof a) == 0);
  for (int r = 0; r < 3; ++r) {
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    for (int k = 0; k < 20; ++k) {
      double t = now();
      for (int i = 0; i < 10; ++i) philox_old(123, i * 65536, 1024, a);
      best[0] = std::min(best[0], now() - t);
      t = now();
      for (int i = 0; i < 10; ++i) philox_new(123, i * 65536, 1024, b);
      best[1] = std::min(best[1], now() - t);
      t = now();
      for (int i = 0; i < 10; ++i) philox_new2(123, i * 65536, 1024, b);
      best[2] = std::min(best[2], now() - t);
      t = now();
      for (int i = 0; i < 10; ++i) philox_new3(123, i * 65536, 1024, b);
      best[3] = std::min(best[3], now() - t);
    }
    std::printf("cycles/uniform @3.5GHz: old %.2f new %.2f new2 %.2f new3 %.2f\n", best[0] * 3.5e9 / (10 * 65536.),
                best[1] * 3.5e9 / (10 * 65536.), best[2] * 3.5e9 / (10 * 65536.), best[3] * 3.5e9 / (10 * 65536.));
  }
}
