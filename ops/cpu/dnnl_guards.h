#pragma once
// What every call into oneDNN from the CPU kernels holds for its duration (ops/cpu/matmul.cpp's GEMM, gemm_bf16.cpp's
// bfloat16 products). Only in builds with oneDNN (ASC_HAVE_DNNL).
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <signal.h>

namespace asc::cpu {

// oneDNN's JIT float32 GEMM kernels (AVX2 and AVX-512) before 3.12 point the stack pointer at a heap buffer while they
// run: a signal delivered to the thread then writes its frame into the heap (oneDNN issue 4845, fixed in 3.11's
// patch releases and 3.12). Debian 12 ships 2.6. Seen here as a training run whose weights turned to NaN after a
// SIGINT (train saves a checkpoint on it) and as "free(): invalid next size" with a 20 kHz timer signal. So the
// asynchronous signals are blocked on the calling thread for the call's duration (two rt_sigprocmask calls, ~0.5 us):
// one that arrives meanwhile is delivered when the call returns. The synchronous ones (a fault in the call) stay. The
// bfloat16 matmul primitive's calls (gemm_bf16.cpp) are guarded the same way: not known to need it, and cheap.
#if DNNL_VERSION_MAJOR < 3 || (DNNL_VERSION_MAJOR == 3 && DNNL_VERSION_MINOR < 12)
constexpr bool kDnnlGemmNeedsSignalsBlocked = true;
#else
constexpr bool kDnnlGemmNeedsSignalsBlocked = false;
#endif
struct AsyncSignalsBlocked {
  sigset_t old;
  bool blocked = false;
  AsyncSignalsBlocked() {
    if constexpr (kDnnlGemmNeedsSignalsBlocked) {
      static const sigset_t async = [] {
        sigset_t s;
        sigfillset(&s);
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&s, sig);
        return s;
      }();
      blocked = pthread_sigmask(SIG_BLOCK, &async, &old) == 0;
    }
  }
  ~AsyncSignalsBlocked() {
    if (blocked) pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
};

// oneDNN threads its GEMM with OpenMP, over omp_get_max_threads() of the calling thread. Our callers already run one
// product per thread of the pool (and deterministic mode needs each product computed on one thread, the same way at
// every thread count), so for the call's duration the calling thread's OpenMP setting is 1 (a per-thread value).
struct OneOmpThread {
  int prev = omp_get_max_threads();
  OneOmpThread() {
    if (prev != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (prev != 1) omp_set_num_threads(prev);
  }
};

}  // namespace asc::cpu
