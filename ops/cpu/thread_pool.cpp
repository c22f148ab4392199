// The thread pool behind ops/cpu/thread_pool.h: one job at a time, its chunks claimed from one atomic word per
// thread's share.
#include "ops/cpu/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace asc::cpu::detail {
namespace {

// How long a worker keeps spinning after its last chunk before it sleeps: long enough to span the gap between two
// kernels of a training step, short enough not to take a busy core from other processes for long.
constexpr std::chrono::microseconds kSpinTime{500};
// How many times the caller polls for chunks still running on workers before it yields its core between polls (a
// worker may be waiting for that very core).
constexpr int kCallerSpins = 4000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// A job's chunks are cut into one contiguous segment per thread, as a static OpenMP schedule would give them: thread
// t (the caller is thread 0, worker i is thread i + 1) takes its own segment's chunks from the front, then steals the
// others' from their back. Consecutive kernels over the same data thus give each thread the same part of it (kept in
// its core's cache), while a thread that is late or slowed down leaves its chunks to the others.
//
// A segment is one atomic word, claimed by compare-and-swap; it carries the job's epoch, so a worker that woke for an
// earlier job can never take a chunk of the next one. A claim succeeds only while the job is unfinished, which keeps
// the job's function alive for whoever claimed.
//   segment word: | epoch (24 bits) | front (20 bits) | back (20 bits) |     chunks [front, back) are left
//   job word:     | epoch (24 bits) | threads (8 bits) | chunks (32 bits) |
constexpr uint32_t kEpochMask = (1u << 24) - 1;
constexpr int64_t kMaxChunks = (1 << 20) - 1;
constexpr int kMaxThreads = 255;

struct Segment {
  uint32_t epoch;
  int64_t front, back;
  static Segment unpack(uint64_t w) {
    return {static_cast<uint32_t>(w >> 40), static_cast<int64_t>((w >> 20) & kMaxChunks),
            static_cast<int64_t>(w & kMaxChunks)};
  }
  uint64_t pack() const { return uint64_t{epoch} << 40 | uint64_t(front) << 20 | uint64_t(back); }
};

struct Job {
  uint32_t epoch;
  int threads;
  int64_t chunks;
  static Job unpack(uint64_t w) {
    return {static_cast<uint32_t>(w >> 40), static_cast<int>((w >> 32) & 0xff), static_cast<int64_t>(w & 0xffffffff)};
  }
  uint64_t pack() const { return uint64_t{epoch} << 40 | uint64_t(threads) << 32 | uint64_t(chunks); }
};

// True on the pool's workers, and on a caller while its job runs: a parallel call made from inside a chunk runs
// inline (no nested parallelism, as with OpenMP's default).
thread_local bool t_in_pool = false;

class Pool {
 public:
  // Runs the job on the pool; false when the pool is busy with another caller's job (the caller runs it inline).
  bool run(int64_t chunks, int threads, ChunkFn fn, void* ctx) {
    if (t_in_pool || busy_.exchange(true, std::memory_order_acquire)) return false;
    t_in_pool = true;
    grow(threads - 1);
    fn_ = fn, ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    epoch_ = (epoch_ + 1) & kEpochMask;
    for (int t = 0; t < threads; ++t)
      segments_[t].word.store(Segment{epoch_, t * chunks / threads, (t + 1) * chunks / threads}.pack(),
                              std::memory_order_relaxed);
    job_.store(Job{epoch_, threads, chunks}.pack(), std::memory_order_release);  // publishes the segments and fn_
    // Wake sleeping workers. The seq_cst pair (signal_ store, sleepers_ load here; sleepers_ increment, signal_ load
    // in wait_for_job) guarantees that a worker going to sleep either sees the new epoch or is counted and woken.
    signal_.store(epoch_, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) signal_.notify_all();
    take_chunks(epoch_, 0, threads);
    for (int polls = 0; done_.load(std::memory_order_acquire) < chunks; ++polls) {
      if (polls < kCallerSpins)
        cpu_relax();
      else
        std::this_thread::yield();
    }
    t_in_pool = false;
    busy_.store(false, std::memory_order_release);
    return true;
  }

 private:
  // Claims a chunk of job `epoch` from segment s, from its front (the owner) or its back (a thief); -1 when the
  // segment is empty or the job is no longer current.
  int64_t claim(int s, uint32_t epoch, bool front) {
    std::atomic<uint64_t>& word = segments_[s].word;
    uint64_t w = word.load(std::memory_order_relaxed);
    for (;;) {
      Segment g = Segment::unpack(w);
      if (g.epoch != epoch || g.front >= g.back) return -1;
      const int64_t c = front ? g.front++ : --g.back;
      if (word.compare_exchange_weak(w, g.pack(), std::memory_order_acq_rel, std::memory_order_relaxed)) return c;
    }
  }

  // Thread t of job `epoch`: its own segment, then the others', nearest first, until no chunk is left.
  void take_chunks(uint32_t epoch, int t, int threads) {
    for (int k = 0; k < threads; ++k) {
      const int s = (t + k) % threads;
      for (int64_t c; (c = claim(s, epoch, /*front=*/k == 0)) >= 0;) {
        fn_(ctx_, c);  // the job word's acquire made fn_ and ctx_ visible; the claim keeps them alive
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  // Returns the first job word whose epoch is not `seen`: spinning for kSpinTime (when `spin`), then asleep on
  // signal_.
  uint64_t wait_for_job(uint32_t seen, bool spin) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; spin; ++i) {
      const uint64_t w = job_.load(std::memory_order_acquire);
      if (Job::unpack(w).epoch != seen) return w;
      cpu_relax();
      if (i % 256 == 0 && std::chrono::steady_clock::now() - start > kSpinTime) break;
    }
    for (;;) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      signal_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      const uint64_t w = job_.load(std::memory_order_acquire);
      if (Job::unpack(w).epoch != seen) return w;
    }
  }

  // Worker `index` is thread index + 1 of the jobs that use more than index + 1 threads. One that sat a job out (the
  // pool once grew for more threads than jobs use now) goes back to sleep at once instead of spinning.
  void worker(int index, uint32_t seen) {
    t_in_pool = true;
    bool took_part = true;
    for (;;) {
      const Job j = Job::unpack(wait_for_job(seen, /*spin=*/took_part));
      seen = j.epoch;
      took_part = index + 1 < j.threads;
      if (took_part) take_chunks(seen, index + 1, j.threads);
    }
  }

  // Starts workers until there are n (called by the pool's current owner only). They live as long as the process.
  void grow(int n) {
    for (; workers_ < n; ++workers_) std::thread(&Pool::worker, this, workers_, epoch_).detach();
  }

  struct alignas(64) Slot {  // one cache line per segment: the threads claim from their own without contention
    std::atomic<uint64_t> word{0};
  };
  Slot segments_[kMaxThreads];
  std::atomic<uint64_t> job_{0};
  std::atomic<uint32_t> signal_{0};  // the current epoch, for sleeping workers to wait on
  std::atomic<int> sleepers_{0};
  std::atomic<int64_t> done_{0};  // chunks of the current job finished
  std::atomic<bool> busy_{false};
  // Written by the owner only (before it publishes a job, or between jobs).
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  uint32_t epoch_ = 0;
  int workers_ = 0;
};

Pool* g_pool = nullptr;
Pool* g_abandoned = nullptr;  // the parent's pool in a forked child: its workers did not survive the fork
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool;  // never destroyed: detached workers may still be waiting on it at exit
    pthread_atfork(nullptr, nullptr, [] { g_abandoned = std::exchange(g_pool, new Pool); });
  });
  return *g_pool;
}

}  // namespace

}  // namespace asc::cpu::detail

namespace asc::cpu {

int default_threads() {
  static const int n = [] {
    const char* env = std::getenv("OMP_NUM_THREADS");
    const int from_env = env ? std::atoi(env) : 0;
    return from_env > 0 ? from_env : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

}  // namespace asc::cpu

namespace asc::cpu::detail {

void run_chunks(int64_t chunks, int threads, ChunkFn fn, void* ctx) {
  threads = static_cast<int>(std::min<int64_t>({threads, chunks, kMaxThreads}));
  if (threads > 1) {
    if (chunks <= kMaxChunks) {
      if (pool().run(chunks, threads, fn, ctx)) return;
    } else {  // more chunks than the word counts: run them in kMaxChunks groups of consecutive chunks
      struct Groups {
        int64_t chunks;
        ChunkFn fn;
        void* ctx;
      } g{chunks, fn, ctx};
      auto group = [](void* p, int64_t k) {
        const auto& g = *static_cast<const Groups*>(p);
        const int64_t begin = k * g.chunks / kMaxChunks, end = (k + 1) * g.chunks / kMaxChunks;
        for (int64_t c = begin; c < end; ++c) g.fn(g.ctx, c);
      };
      if (pool().run(kMaxChunks, threads, group, &g)) return;
    }
  }
  for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
}

}  // namespace asc::cpu::detail
