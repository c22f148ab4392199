#pragma once
// The CPU kernels' thread pool. `parallel_for` and `for_each_strided` (ops/cpu/loops.h) cut a job into chunks; the
// calling thread and the pool's workers run them and the call returns when every chunk is done:
//
//   run_chunks(8, threads, f);   // f(0) ... f(7), on up to `threads` threads
//
// Each thread starts on its own contiguous share of the chunks (the caller on the first), as a static OpenMP schedule
// would give it, so consecutive kernels over the same data find it in the same core's cache; a thread that has run
// out takes the chunks left at the end of the others' shares, one at a time.
//
// Why not an OpenMP team: an OpenMP region splits its work among the team in advance and ends at a barrier that
// waits for every thread of the team. On a machine whose other core is busy with another process, the thread that
// shares that core runs half the time, so every region waited for it, often for a whole scheduler time slice before
// it had even started. Here a worker that arrives late finds its share taken by the others and is not waited for;
// the caller waits only for chunks that someone has started.
//
// Results do not depend on who runs which chunk: the chunks are fixed by the job's size and the thread count, never
// by timing, and each chunk writes its own outputs.
//
// Waiting: a worker spins for a short while (kSpinTime) after its last chunk, so back-to-back kernels find it awake,
// then sleeps on a futex (std::atomic::wait) and costs nothing while the cores are taken by others.
//
// One job at a time: a second thread that calls while the pool is busy (user threads running models side by side),
// and any call from inside a chunk, runs its chunks itself, in order.
#include <cstdint>
#include <type_traits>

namespace asc::cpu {

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t chunk);
// Runs fn(ctx, c) for c in [0, chunks) on up to `threads` threads, the caller included; fn must not throw.
void run_chunks(int64_t chunks, int threads, ChunkFn fn, void* ctx);
}  // namespace detail

// The thread count of a build without OpenMP: OMP_NUM_THREADS when it holds a positive number, else the number of
// cores (read once).
int default_threads();

// Runs f(c) for every chunk c in [0, chunks), in parallel when threads > 1; f must not throw (wrap it in FirstError,
// loops.h). Returns when every chunk is done.
template <class F>
void run_chunks(int64_t chunks, int threads, F& f) {
  detail::run_chunks(
      chunks, threads, [](void* ctx, int64_t c) { (*static_cast<F*>(ctx))(c); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace asc::cpu
