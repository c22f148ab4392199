// The CUDA caching allocator's policy, run on the CPU: a mock DeviceMemory hands out host memory, counts calls,
// can enforce a byte budget (out-of-memory path) and marks streams busy/idle (deferred cross-stream frees).
// Expected sizes and layouts are worked out by hand from the documented policy (512 B rounding, 2 MiB small
// segments, large segments rounded to 2 MiB, split thresholds 512 B / > 1 MiB).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ascender.h"
#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda.h"

using asc::cuda::CachingAllocator;
using asc::cuda::MemoryStats;
using State = CachingAllocator::BlockState;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

class MockMemory final : public asc::cuda::DeviceMemory {
 public:
  explicit MockMemory(size_t budget = SIZE_MAX) : budget_(budget) {}
  ~MockMemory() override {
    for (auto& [p, n] : live) std::free(p);
  }
  void* malloc(size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++malloc_calls;
    if (n > budget_ - used) {
      ++failed_mallocs;
      return nullptr;
    }
    void* p = std::aligned_alloc(4096, n);  // pages are not touched unless a test writes to them
    live[p] = n;
    used += n;
    return p;
  }
  void free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live.find(p);
    if (it == live.end()) {
      ++bad_frees;
      return;
    }
    used -= it->second;
    live.erase(it);
    freed.push_back(p);
    std::free(p);
  }
  bool stream_idle(uintptr_t s) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++idle_queries;
    return busy.count(s) == 0;
  }
  void synchronize(uintptr_t s) override {
    std::lock_guard<std::mutex> lock(mu_);
    synced.push_back(s);
    busy.erase(s);
  }

  std::map<void*, size_t> live;
  std::vector<void*> freed;
  std::set<uintptr_t> busy;
  std::vector<uintptr_t> synced;
  size_t used = 0;
  int malloc_calls = 0, failed_mallocs = 0, bad_frees = 0, idle_queries = 0;

 private:
  size_t budget_;
  std::mutex mu_;
};

char* cp(void* p) { return static_cast<char*>(p); }

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const asc::Error& e) {
    return e.what();
  }
  return "<no asc::Error thrown>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct B {
  size_t offset, size;
  State state;
  bool operator==(const B&) const = default;
};
std::vector<B> blocks_of(const CachingAllocator::SegmentInfo& s) {
  std::vector<B> v;
  for (auto& b : s.blocks) v.push_back({b.offset, b.size, b.state});
  return v;
}

}  // namespace

TEST_CASE("caching allocator: rounding and segment sizes") {
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::round_size(1 * MiB) == 1 * MiB);
  CHECK(CachingAllocator::round_size(1 * MiB + 1) == 1 * MiB + 512);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(1 * MiB) == 2 * MiB);        // largest small request
  CHECK(CachingAllocator::segment_size(1 * MiB + 512) == 2 * MiB);  // smallest large request
  CHECK(CachingAllocator::segment_size(2 * MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(2 * MiB + 512) == 4 * MiB);
  CHECK(CachingAllocator::segment_size(5 * MiB + 512) == 6 * MiB);

  MockMemory mem;
  CachingAllocator a(&mem);
  CHECK(a.malloc(0, 0) == nullptr);
  a.free(nullptr);
  CHECK(mem.malloc_calls == 0);

  void* p1 = a.malloc(1, 0);
  MemoryStats s = a.stats();
  CHECK(s.allocated == 512);
  CHECK(s.reserved == 2 * MiB);
  CHECK(s.num_device_mallocs == 1);
  CHECK(s.num_cache_hits == 0);
  auto snap = a.snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].small);
  CHECK(snap[0].size == 2 * MiB);
  CHECK(blocks_of(snap[0]) == std::vector<B>{{0, 512, State::Live}, {512, 2 * MiB - 512, State::Free}});

  void* p2 = a.malloc(513, 0);  // carved from the same segment, right after p1
  CHECK(cp(p2) == cp(p1) + 512);
  s = a.stats();
  CHECK(s.allocated == 512 + 1024);
  CHECK(s.num_device_mallocs == 1);
  CHECK(s.num_cache_hits == 1);

  // A large request gets its own 2 MiB segment; the 1 MiB - 512 remainder is not worth splitting off, so the
  // whole segment is the block (and counts as allocated).
  void* p3 = a.malloc(1 * MiB + 1, 0);
  s = a.stats();
  CHECK(s.num_device_mallocs == 2);
  CHECK(s.reserved == 4 * MiB);
  CHECK(s.allocated == 1536 + 2 * MiB);
  snap = a.snapshot();
  REQUIRE(snap.size() == 2);
  auto& large = snap[0].small ? snap[1] : snap[0];
  CHECK_FALSE(large.small);
  CHECK(blocks_of(large) == std::vector<B>{{0, 2 * MiB, State::Live}});
  CHECK(mem.live.at(reinterpret_cast<void*>(large.base)) == 2 * MiB);

  a.free(p1);
  a.free(p2);
  a.free(p3);
  s = a.stats();
  CHECK(s.allocated == 0);
  CHECK(s.num_allocs == 3);
  CHECK(s.num_frees == 3);
  CHECK(s.reserved == 4 * MiB);  // cached, not returned
  CHECK(mem.freed.empty());
}

TEST_CASE("caching allocator: splitting, best fit and coalescing") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* x = a.malloc(1024, 0);
  void* y = a.malloc(1024, 0);
  void* z = a.malloc(1024, 0);
  CHECK(cp(y) == cp(x) + 1024);
  CHECK(cp(z) == cp(x) + 2048);

  a.free(y);
  auto snap = a.snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(blocks_of(snap[0]) == std::vector<B>{{0, 1024, State::Live},
                                             {1024, 1024, State::Free},
                                             {2048, 1024, State::Live},
                                             {3072, 2 * MiB - 3072, State::Free}});
  a.free(x);  // merges with the free block after it
  CHECK(blocks_of(a.snapshot()[0]) ==
        std::vector<B>{{0, 2048, State::Free}, {2048, 1024, State::Live}, {3072, 2 * MiB - 3072, State::Free}});
  void* w = a.malloc(2048, 0);  // best fit: the 2048 hole, not the big tail
  CHECK(w == x);
  a.free(w);
  a.free(z);  // merges with both neighbours: the segment is one free block again
  CHECK(blocks_of(a.snapshot()[0]) == std::vector<B>{{0, 2 * MiB, State::Free}});

  // Best fit between two holes: 1500 B (1536 rounded) goes to the 2048 hole, split into 1536 + 512.
  void* h1 = a.malloc(4096, 0);
  void* s1 = a.malloc(512, 0);
  void* h2 = a.malloc(2048, 0);
  void* s2 = a.malloc(512, 0);
  a.free(h1);
  a.free(h2);
  void* m = a.malloc(1500, 0);
  CHECK(m == h2);
  CHECK(blocks_of(a.snapshot()[0]) == std::vector<B>{{0, 4096, State::Free},
                                                     {4096, 512, State::Live},
                                                     {4608, 1536, State::Live},
                                                     {6144, 512, State::Free},
                                                     {6656, 512, State::Live},
                                                     {7168, 2 * MiB - 7168, State::Free}});
  a.free(m);
  a.free(s1);
  a.free(s2);
  CHECK(blocks_of(a.snapshot()[0]) == std::vector<B>{{0, 2 * MiB, State::Free}});
  CHECK(a.stats().num_device_mallocs == 1);
  a.empty_cache();
  CHECK(a.snapshot().empty());
  CHECK(mem.live.empty());
  CHECK(a.stats().num_device_frees == 1);
  CHECK(a.stats().reserved == 0);
}

TEST_CASE("caching allocator: large pool reuse and split, small and large pools kept apart") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* p = a.malloc(5 * MiB + 1, 0);  // 6 MiB segment, 1 MiB - 512 remainder kept in the block
  CHECK(a.stats().allocated == 6 * MiB);
  a.free(p);
  void* q = a.malloc(3 * MiB, 0);  // reuses the 6 MiB block, splitting off 3 MiB (> 1 MiB)
  CHECK(q == p);
  CHECK(a.stats().num_device_mallocs == 1);
  CHECK(a.stats().allocated == 3 * MiB);
  CHECK(blocks_of(a.snapshot()[0]) == std::vector<B>{{0, 3 * MiB, State::Live}, {3 * MiB, 3 * MiB, State::Free}});
  void* r = a.malloc(4 * MiB, 0);  // the 3 MiB hole is too small: new 4 MiB segment
  CHECK(a.stats().num_device_mallocs == 2);
  void* t = a.malloc(2 * MiB + 1, 0);  // fits the 3 MiB hole; remainder 1 MiB - 512 stays in the block
  CHECK(cp(t) == cp(p) + 3 * MiB);
  CHECK(a.stats().allocated == 3 * MiB + 4 * MiB + 3 * MiB);
  a.free(t);
  void* small = a.malloc(4096, 0);  // never carved from the large pool's free 3 MiB
  CHECK(a.stats().num_device_mallocs == 3);
  CHECK(a.stats().reserved == 6 * MiB + 4 * MiB + 2 * MiB);
  a.free(q);
  a.free(r);
  a.free(small);
  a.empty_cache();
  CHECK(mem.live.empty());
  CHECK(a.stats().num_device_frees == 3);
}

TEST_CASE("caching allocator: exact statistics, peaks and reset") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* s = a.malloc(1 * MiB, 0);  // small pool: a 1 MiB block in a 2 MiB segment
  void* l = a.malloc(4 * MiB, 0);  // large: its own 4 MiB segment
  MemoryStats st = a.stats();
  CHECK(st.allocated == 5 * MiB);
  CHECK(st.reserved == 6 * MiB);
  CHECK(st.peak_allocated == 5 * MiB);
  CHECK(st.peak_reserved == 6 * MiB);
  a.free(l);
  st = a.stats();
  CHECK(st.allocated == 1 * MiB);
  CHECK(st.peak_allocated == 5 * MiB);
  CHECK(st.reserved == 6 * MiB);
  a.reset_peak_stats();
  st = a.stats();
  CHECK(st.peak_allocated == 1 * MiB);
  CHECK(st.peak_reserved == 6 * MiB);
  a.empty_cache();  // only the 4 MiB segment is fully free
  st = a.stats();
  CHECK(st.reserved == 2 * MiB);
  CHECK(st.peak_reserved == 6 * MiB);
  CHECK(st.num_device_frees == 1);
  CHECK(mem.freed == std::vector<void*>{l});
  a.reset_peak_stats();
  CHECK(a.stats().peak_reserved == 2 * MiB);
  void* l2 = a.malloc(4 * MiB, 0);
  st = a.stats();
  CHECK(st.num_device_mallocs == 3);
  CHECK(st.num_allocs == 3);
  CHECK(st.num_frees == 1);
  CHECK(st.num_cache_hits == 0);
  CHECK(st.peak_allocated == 5 * MiB);
  CHECK(st.peak_reserved == 6 * MiB);
  CHECK(st.num_oom_retries == 0);
  CHECK(st.num_deferred_frees == 0);
  a.free(s);
  a.free(l2);
}

TEST_CASE("caching allocator: empty_cache returns exactly the fully free segments") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* live_small = a.malloc(4096, 0);     // segment A (stream 0, small): stays partly used
  void* freed_small = a.malloc(4096, 5);    // segment B (stream 5, small): becomes fully free
  void* large0 = a.malloc(3 * MiB, 0);      // segment C (stream 0, large 4 MiB): freed
  void* large7 = a.malloc(8 * MiB, 7);      // segment D (stream 7, large 8 MiB): freed
  void* large_live = a.malloc(2 * MiB, 0);  // segment E (stream 0, large 2 MiB): stays live
  void* tmp = a.malloc(8192, 0);            // second block of segment A, freed
  CHECK(mem.live.size() == 5);
  a.free(freed_small);
  a.free(large0);
  a.free(large7);
  a.free(tmp);
  a.empty_cache();
  std::set<void*> freed(mem.freed.begin(), mem.freed.end());
  CHECK(freed == std::set<void*>{freed_small, large0, large7});
  MemoryStats st = a.stats();
  CHECK(st.num_device_frees == 3);
  CHECK(st.reserved == 2 * MiB + 2 * MiB);
  CHECK(st.allocated == 4096 + 2 * MiB);
  auto snap = a.snapshot();
  REQUIRE(snap.size() == 2);
  a.empty_cache();  // nothing more to return
  CHECK(a.stats().num_device_frees == 3);
  a.free(live_small);
  a.free(large_live);
  a.empty_cache();
  CHECK(mem.live.empty());
  CHECK(a.stats().reserved == 0);
  CHECK(a.stats().num_device_frees == 5);
  CHECK(mem.bad_frees == 0);
}

// A training-step pattern: parameters live across steps; each step allocates activations (kept for backward)
// interleaved with short-lived temporaries, then a backward pass allocating gradients and releasing
// activations in reverse order, then optimizer temporaries. After the first step the cache must serve
// everything: zero device mallocs.
TEST_CASE("caching allocator: a steady training loop makes no device malloc after the first step") {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    CAPTURE(seed);
    MockMemory mem;
    CachingAllocator a(&mem);
    std::mt19937 rng(seed);
    auto draw = [&] {
      int kind = static_cast<int>(rng() % 10);
      if (kind < 4) return size_t{64} + rng() % (64 * KiB);          // biases, norms, small temporaries
      if (kind < 8) return size_t{100 * KiB} + rng() % (900 * KiB);  // medium activations
      return size_t{1 * MiB} + rng() % (24 * MiB);                   // big activations / weights
    };
    std::vector<size_t> params(8), acts(20), temps(10), grads(12);
    for (auto* v : {&params, &acts, &temps, &grads})
      for (size_t& n : *v) n = draw();
    REQUIRE(acts.size() + temps.size() + grads.size() + 8 == 50);  // 50 tensors per step (8 optimizer temps)

    std::vector<void*> param_ptrs;
    for (size_t n : params) param_ptrs.push_back(a.malloc(n, 0));
    const size_t base_allocated = a.stats().allocated;

    std::map<char*, size_t> live;  // for the overlap check
    auto alloc = [&](size_t n) {
      void* p = a.malloc(n, 0);
      auto it = live.lower_bound(cp(p));
      if (it != live.end()) CHECK(cp(p) + n <= it->first);
      if (it != live.begin()) CHECK(std::prev(it)->first + std::prev(it)->second <= cp(p));
      live[cp(p)] = n;
      return p;
    };
    auto release = [&](void* p) {
      live.erase(cp(p));
      a.free(p);
    };
    uint64_t mallocs_after_first = 0;
    for (int step = 0; step < 100; ++step) {
      std::vector<void*> act_ptrs;
      for (size_t i = 0; i < acts.size(); ++i) {
        act_ptrs.push_back(alloc(acts[i]));
        if (i % 2 == 1) {
          void* t = alloc(temps[i / 2]);  // a temporary that dies right away
          release(t);
        }
      }
      std::vector<void*> grad_ptrs;
      for (size_t i = 0; i < grads.size(); ++i) {
        grad_ptrs.push_back(alloc(grads[i]));
        release(act_ptrs.back());
        act_ptrs.pop_back();
      }
      while (!act_ptrs.empty()) {
        release(act_ptrs.back());
        act_ptrs.pop_back();
      }
      for (size_t i = 0; i < 8; ++i) {  // optimizer: one temporary per parameter, then its gradient goes
        void* t = alloc(params[i]);
        release(t);
        if (i < grad_ptrs.size() && i % 2 == 0) {
          release(grad_ptrs[i]);
          grad_ptrs[i] = nullptr;
        }
      }
      for (void* g : grad_ptrs)
        if (g) release(g);
      CHECK(live.empty());
      CHECK(a.stats().allocated == base_allocated);
      if (step == 0) mallocs_after_first = a.stats().num_device_mallocs;
    }
    MemoryStats st = a.stats();
    CHECK(st.num_device_mallocs == mallocs_after_first);
    CHECK(st.num_device_frees == 0);
    CHECK(st.num_allocs == 8 + 100 * 50);
    CHECK(st.num_cache_hits == st.num_allocs - st.num_device_mallocs);
    for (void* p : param_ptrs) a.free(p);
    a.empty_cache();
    CHECK(mem.live.empty());
  }
}

TEST_CASE("caching allocator: out of memory empties the cache, retries once, then errors clearly") {
  MockMemory mem(4 * MiB);
  CachingAllocator a(&mem, "cuda:0");
  void* p = a.malloc(3 * MiB / 2, 0);  // large: 2 MiB segment
  a.free(p);                           // cached
  void* q = a.malloc(3 * MiB, 0);      // needs a 4 MiB segment: fails, frees the cached 2 MiB, retries
  CHECK(q != nullptr);
  MemoryStats st = a.stats();
  CHECK(mem.failed_mallocs == 1);
  CHECK(st.num_oom_retries == 1);
  CHECK(st.num_device_mallocs == 2);
  CHECK(st.num_device_frees == 1);
  CHECK(st.reserved == 4 * MiB);
  CHECK(st.allocated == 4 * MiB);

  // Nothing cached to release: the retry fails too and the error names the size and the statistics.
  std::string msg = error_of([&] { a.malloc(1000, 0); });
  CHECK(contains(msg, "cuda:0: out of memory"));
  CHECK(contains(msg, "cannot allocate 1000 B"));
  CHECK(contains(msg, "rounded to 1.00 KiB (1024 bytes)"));
  CHECK(contains(msg, "new segment of 2.00 MiB"));
  CHECK(contains(msg, "allocated 4.00 MiB (4194304 bytes)"));
  CHECK(contains(msg, "reserved 4.00 MiB"));
  CHECK(contains(msg, "device mallocs 2"));
  CHECK(mem.failed_mallocs == 3);
  st = a.stats();
  CHECK(st.num_oom_retries == 2);
  CHECK(st.num_allocs == 2);  // the failed request is not counted
  CHECK(st.allocated == 4 * MiB);

  // The allocator is intact: after freeing q, the same small request succeeds through the recovery path.
  a.free(q);
  void* r = a.malloc(1000, 0);
  CHECK(r != nullptr);
  CHECK(a.stats().reserved == 2 * MiB);
  CHECK(a.stats().num_oom_retries == 3);
  a.free(r);

  // Requests no device can hold error out without overflowing the rounding.
  CHECK(contains(error_of([&] { a.malloc(SIZE_MAX, 0); }), "out of memory"));
  CHECK(contains(error_of([&] { a.malloc(SIZE_MAX - 100, 0); }), "out of memory"));
}

TEST_CASE("caching allocator: out of memory completes deferred frees by synchronizing their streams") {
  MockMemory mem(2 * MiB);
  CachingAllocator a(&mem);
  void* p = a.malloc(3 * MiB / 2, 1);
  a.record_stream(p, 2);
  mem.busy.insert(2);
  a.free(p);  // deferred: stream 2 is busy
  CHECK(a.stats().num_deferred_frees == 1);
  void* q = a.malloc(3 * MiB / 2, 3);  // OOM -> synchronize stream 2 -> p's segment returned -> retry
  CHECK(q != nullptr);
  CHECK(mem.synced == std::vector<uintptr_t>{2});
  CHECK(a.stats().num_device_frees == 1);
  CHECK(a.stats().reserved == 2 * MiB);
  a.free(q);
}

TEST_CASE("caching allocator: a block freed on one stream is never handed to another") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* p = a.malloc(4096, 1);
  a.free(p);
  void* q = a.malloc(4096, 2);
  CHECK(q != p);
  CHECK(a.stats().num_device_mallocs == 2);
  void* r = a.malloc(4096, 1);
  CHECK(r == p);
  CHECK(a.stats().num_cache_hits == 1);
  void* big1 = a.malloc(4 * MiB, 1);
  a.free(big1);
  void* big2 = a.malloc(4 * MiB, 2);
  CHECK(big2 != big1);
  auto snap = a.snapshot();
  REQUIRE(snap.size() == 4);
  std::multiset<uintptr_t> streams;
  for (auto& s : snap) streams.insert(s.stream);
  CHECK(streams == std::multiset<uintptr_t>{1, 1, 2, 2});
  a.free(q);
  a.free(r);
  a.free(big2);
}

TEST_CASE("caching allocator: record_stream defers the free until the other stream is idle") {
  MockMemory mem;
  CachingAllocator a(&mem);
  void* p = a.malloc(4096, 1);
  a.record_stream(p, 1);  // its own stream: nothing to do
  a.record_stream(p, 2);
  a.record_stream(p, 2);  // recorded once
  mem.busy.insert(2);
  a.free(p);
  MemoryStats st = a.stats();
  CHECK(st.allocated == 0);
  CHECK(st.num_deferred_frees == 1);
  CHECK(a.snapshot()[0].blocks[0].state == State::PendingFree);
  CHECK_FALSE(a.owns(p));
  CHECK(contains(error_of([&] { a.free(p); }), "double free"));

  void* q = a.malloc(4096, 1);  // stream 2 still busy: p cannot be reused
  CHECK(q != p);
  CHECK(cp(q) == cp(p) + 4096);
  CHECK(mem.idle_queries == 1);

  mem.busy.clear();
  void* r = a.malloc(4096, 1);  // stream 2 idle now: the deferred free completes and p is reused
  CHECK(r == p);
  CHECK(a.snapshot()[0].blocks[0].state == State::Live);
  CHECK(contains(error_of([&] { a.record_stream(cp(q) + 8, 3); }), "not at its start"));
  a.free(q);
  CHECK(contains(error_of([&] { a.record_stream(q, 3); }), "not live"));  // freed already
  a.free(r);

  // empty_cache also completes deferred frees whose streams are idle (and keeps the others).
  void* s = a.malloc(8 * MiB, 4);
  void* t = a.malloc(8 * MiB, 4);
  a.record_stream(s, 5);
  a.record_stream(t, 6);
  mem.busy = {6};
  a.free(s);
  a.free(t);
  a.empty_cache();
  std::set<void*> freed(mem.freed.begin(), mem.freed.end());
  CHECK(freed.count(s) == 1);
  CHECK(freed.count(t) == 0);
  mem.busy.clear();
  a.empty_cache();
  CHECK(mem.live.empty());
}

TEST_CASE("caching allocator: bad frees are errors, never undefined behaviour") {
  MockMemory mem;
  CachingAllocator a(&mem, "cuda:1");
  int local = 0;
  std::string msg = error_of([&] { a.free(&local); });
  CHECK(contains(msg, "cuda:1: pointer"));
  CHECK(contains(msg, "was not allocated by this allocator"));
  void* p = a.malloc(4096, 0);
  msg = error_of([&] { a.free(cp(p) + 512); });
  CHECK(contains(msg, "points 512 bytes into a block of 4096"));
  a.free(p);
  msg = error_of([&] { a.free(p); });
  CHECK(contains(msg, "double free"));
  msg = error_of([&] { a.free(cp(p) + 100000); });  // inside the segment's free tail
  CHECK(contains(msg, "points"));
  CHECK(contains(error_of([&] { a.record_stream(&local, 1); }), "record_stream"));
  MemoryStats st = a.stats();
  CHECK(st.num_frees == 1);
  CHECK(st.allocated == 0);
  void* q = a.malloc(4096, 0);  // still healthy
  CHECK(q == p);
  a.free(q);
}

TEST_CASE("caching allocator: concurrent allocations from several threads") {
  MockMemory mem;
  CachingAllocator a(&mem);
  constexpr int kThreads = 4, kIters = 3000;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      const uintptr_t stream = static_cast<uintptr_t>(t % 2);  // two threads share each stream
      std::vector<std::pair<unsigned char*, size_t>> mine;
      for (int i = 0; i < kIters; ++i) {
        if (mine.size() < 8 && (mine.empty() || rng() % 2)) {
          size_t n = rng() % 8 == 0 ? 1 * MiB + rng() % (2 * MiB) : 1 + rng() % (300 * KiB);
          auto* p = static_cast<unsigned char*>(a.malloc(n, stream));
          std::memset(p, 0x40 + t, n);
          mine.emplace_back(p, n);
        } else {
          size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          for (size_t j = 0; j < n; j += 97)
            if (p[j] != 0x40 + t) {
              ++corrupt;
              break;
            }
          if (p[n - 1] != 0x40 + t) ++corrupt;
          a.free(p);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto [p, n] : mine) a.free(p);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(corrupt.load() == 0);
  MemoryStats st = a.stats();
  CHECK(st.allocated == 0);
  CHECK(st.num_allocs == st.num_frees);
  CHECK(st.num_cache_hits + st.num_device_mallocs == st.num_allocs);
  a.empty_cache();
  CHECK(mem.live.empty());
  CHECK(a.stats().reserved == 0);
}

// The real thing: CUDA storages come from the caching allocator. Runs only where a GPU is present.
TEST_CASE("cuda caching allocator: tensors reuse cached device memory (GPU)") {
  if (!asc::cuda::is_available()) {
    MESSAGE(
        "skipped: no CUDA device available (this build or machine has none); the policy tests above ran on "
        "the mock backend");
    MemoryStats st = asc::cuda::memory_stats();
    CHECK(st.allocated == 0);
    CHECK(st.num_device_mallocs == 0);
    asc::cuda::empty_cache();  // no-op without a device
    asc::cuda::reset_peak_memory_stats();
    return;
  }
  asc::cuda::synchronize();
  asc::cuda::empty_cache();
  const MemoryStats before = asc::cuda::memory_stats();
  const asc::Tensor host = asc::ones({1024, 1024});  // 4 MiB of float32
  {
    asc::Tensor d = host.to(asc::Device::cuda());
    MemoryStats st = asc::cuda::memory_stats();
    CHECK(st.allocated == before.allocated + 4 * MiB);
    CHECK(st.num_device_mallocs == before.num_device_mallocs + 1);
    CHECK(d.to(asc::Device::cpu()).to_vector<float>() == host.to_vector<float>());
  }
  const MemoryStats mid = asc::cuda::memory_stats();
  CHECK(mid.allocated == before.allocated);
  CHECK(mid.reserved == before.reserved + 4 * MiB);  // cached, not returned
  for (int i = 0; i < 10; ++i) {
    asc::Tensor d = host.to(asc::Device::cuda());
    CHECK(d.to(asc::Device::cpu()).to_vector<float>()[12345] == 1.0f);
  }
  MemoryStats st = asc::cuda::memory_stats();
  CHECK(st.num_device_mallocs == mid.num_device_mallocs);
  CHECK(st.num_cache_hits >= mid.num_cache_hits + 10);
  CHECK(st.peak_allocated >= before.allocated + 4 * MiB);
  asc::cuda::empty_cache();
  st = asc::cuda::memory_stats();
  CHECK(st.reserved == before.reserved);
  CHECK(st.num_device_frees >= mid.num_device_frees + 1);
  asc::cuda::reset_peak_memory_stats();
  CHECK(asc::cuda::memory_stats().peak_allocated == asc::cuda::memory_stats().allocated);
  int local = 0;
  CHECK_THROWS_AS(asc::cuda::record_stream(&local, 0), asc::Error);
}
