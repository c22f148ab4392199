#pragma once
// What the benchmark binaries of tools/ share (not part of the library): best-of-N timing, the memory counters and
// synchronisation of the device a run uses, one forward / forward + backward measurement (parsing, progress and
// result files: tools/cli.h).
//
//   double ms = asc::bench::best_ms([&] { step(); }, /*reps=*/3);
//   asc::bench::FwdBwd t = asc::bench::time_forward_backward(dev, 3, [&] { return layer->attend(x, {}); },
//                                                            [&] { layer->zero_grad(); });
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "ascender.h"

namespace asc::bench {

// The fastest of `reps` runs of fn, in milliseconds; `before` (if set) runs untimed ahead of each.
inline double best_ms(const std::function<void()>& fn, int reps, const std::function<void()>& before = {}) {
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (before) before();
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return best;
}

// Untimed runs of fn ahead of a measurement: until 50 ms have passed (at least one run, at most 50). One run was not
// always enough for a fast fn: a process's first few calls could all run at half speed (bench_asam's first row,
// chunked dense at n = 1024: 4.6 or 10 ms from one run of the binary to the next) while its threads and clocks came up.
inline void warm_up(const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (int r = 0; r < 50 && (r < 1 || Clock::now() - t0 < std::chrono::milliseconds(50)); ++r) fn();
}

// Bytes live, peak reset, peak bytes and a synchronisation point of a device: the CPU allocator's counters, or the
// CUDA caching allocator's (kernels run asynchronously there, so a timed region ends with sync).
inline size_t live_bytes(Device d) {
  return d.is_cuda() ? cuda::memory_stats().allocated : cpu_memory_stats().allocated;
}
inline void reset_peak(Device d) {
  if (d.is_cuda())
    cuda::reset_peak_memory_stats();
  else
    reset_cpu_peak_memory();
}
inline size_t peak_bytes(Device d) {
  return d.is_cuda() ? cuda::memory_stats().peak_allocated : cpu_memory_stats().peak_allocated;
}
inline void sync(Device d) {
  if (d.is_cuda()) cuda::synchronize();
}

// forward() timed under no-grad, then zero_grad + forward().sum().backward() timed, each after its warm_up, with the
// latter's peak memory above what was live before it. With backward = false only the forward is measured
// (-1 elsewhere).
struct FwdBwd {
  double fwd_ms = -1, fwd_bwd_ms = -1, peak_mb = -1;
};
inline FwdBwd time_forward_backward(Device d, int reps, const std::function<Tensor()>& forward,
                                    const std::function<void()>& zero_grad, bool backward = true) {
  FwdBwd r;
  {
    NoGradGuard ng;
    warm_up([&] {  // caches filled, kernels loaded, allocator blocks
      forward();
      sync(d);
    });
    r.fwd_ms = best_ms(
        [&] {
          forward();
          sync(d);
        },
        reps);
  }
  if (!backward) return r;
  const size_t before = live_bytes(d);
  reset_peak(d);
  // Warm-up, as for the forward: the backward's first run pays what every later step does not (its buffers' first
  // page faults, per-thread scratch, kept plans): timed with one repetition, as bench_asam once did above n = 4096,
  // it was a third of a fast kernel's time.
  warm_up([&] {
    zero_grad();
    forward().sum().backward();
    sync(d);
  });
  r.fwd_bwd_ms = best_ms(
      [&] {
        zero_grad();
        forward().sum().backward();
        sync(d);
      },
      reps);
  r.peak_mb = static_cast<double>(peak_bytes(d) - before) / (1 << 20);
  return r;
}

}  // namespace asc::bench
