#include "core/storage.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"

namespace asc {
namespace {

// cpu_memory_stats(): live bytes in blocks above the cache's 4 KiB, and their peak.
std::atomic<size_t> g_cpu_live{0}, g_cpu_peak{0};
std::atomic<size_t> g_cpu_high{0};    // the peak since the process started (reset_cpu_peak_memory leaves it)
thread_local size_t t_allocated = 0;  // thread_allocated_bytes()

void count_alloc(size_t bytes) {
  const size_t now = g_cpu_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  size_t high = g_cpu_high.load(std::memory_order_relaxed);
  while (now > high && !g_cpu_high.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
}

// The machine's physical memory in bytes (SIZE_MAX when the system does not say).
size_t physical_memory() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
  }();
  return bytes;
}

class LargeBlockCache;
LargeBlockCache& large_blocks();

// Blocks above 4 KiB: page-aligned blocks from mmap, rounded up to a size class and kept after free in a
// process-wide cache by class (up to cap() bytes, about the process's peak of live tensor memory), so that the next
// block of that class is memory already mapped and touched. Why not glibc's heap: a training step frees and
// re-allocates the same multi-MiB outputs every step, and any small long-lived allocation made in between (a profiler
// event, a log line, the user's own objects) can be carved out of a freed tensor block, so the next block of that size
// no longer fits the hole and the heap grows instead: fresh pages, a page fault for each 4 KiB of every output (an
// observed 13x more faults and 3-6x slower element-wise ops under the profiler). The same cure as PyTorch's CUDA
// caching allocator; on the CPU PyTorch leaves it to jemalloc or tcmalloc. Blocks of 2 MiB and more ask for transparent
// huge pages (MADV_HUGEPAGE): one fault and one TLB entry per 2 MiB where the kernel grants them.
class LargeBlockCache {
 public:
  static constexpr size_t kPage = 4096, kHuge = size_t{2} << 20;

  // fork() while another thread holds the lock would leave it held forever in the child (a forked child runs
  // models too: tests/test_threads.cpp): the lock is taken around the fork and released on both sides.
  LargeBlockCache() {
    pthread_atfork([] { large_blocks().mu_.lock(); }, [] { large_blocks().mu_.unlock(); },
                   [] { large_blocks().mu_.unlock(); });
  }

  // The class of an n-byte request: whole pages up to 64 KiB, then four classes per power of two (a block is at
  // most 25 % larger than asked).
  static size_t class_bytes(size_t n) {
    size_t c = (n + kPage - 1) & ~(kPage - 1);
    if (c <= 16 * kPage) return c;
    size_t p = size_t{1} << (63 - __builtin_clzll(c));  // the highest power of two <= c
    size_t step = p / 4;
    return (c + step - 1) & ~(step - 1);
  }

  void* get(size_t cls) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_.fetch_sub(cls, std::memory_order_relaxed);
        return p;
      }
    }
    void* p = mmap(nullptr, cls, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      release_all();  // the cache's other classes may be what stands in the way
      p = mmap(nullptr, cls, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
    }
#ifdef MADV_HUGEPAGE
    if (cls >= kHuge) madvise(p, cls, MADV_HUGEPAGE);
#endif
    return p;
  }

  // Keeps the block for the next request of its class; past the cap, the largest blocks of other classes go back
  // to the system first (the workload has moved on from them), then this one.
  void put(void* p, size_t cls) {
    if (cls > cap()) {  // larger than the cache may ever hold: the others stay
      munmap(p, cls);
      return;
    }
    std::vector<std::pair<void*, size_t>> unmap;
    {
      std::lock_guard lock(mu_);
      const size_t most = cap();
      size_t held = cached_.load(std::memory_order_relaxed);
      for (auto it = free_.rbegin(); held + cls > most && it != free_.rend(); ++it) {
        if (it->first == cls) continue;
        while (!it->second.empty() && held + cls > most) {
          unmap.emplace_back(it->second.back(), it->first);
          it->second.pop_back();
          held -= it->first;
        }
      }
      if (held + cls <= most) {
        free_[cls].push_back(p);
        held += cls;
      } else {
        unmap.emplace_back(p, cls);
      }
      cached_.store(held, std::memory_order_relaxed);
    }
    for (auto [q, n] : unmap) munmap(q, n);
  }

  void release_all() {
    std::map<size_t, std::vector<void*>> blocks;
    {
      std::lock_guard lock(mu_);
      blocks.swap(free_);
      cached_.store(0, std::memory_order_relaxed);
    }
    for (auto& [cls, ps] : blocks)
      for (void* q : ps) munmap(q, cls);
  }

  // Without the lock: cpu_memory_stats() is read at every profiler event.
  size_t cached() const { return cached_.load(std::memory_order_relaxed); }

 private:
  // The cache holds at most as much as the process's peak of live tensor memory (at least 256 MiB, at most an
  // eighth of the machine's memory): what a training step frees and allocates again, without letting a run of
  // ever-new sizes pile up unused blocks beyond that.
  static size_t cap() {
    static const size_t most = physical_memory() / 8;
    return std::min(most, std::max(size_t{256} << 20, g_cpu_high.load(std::memory_order_relaxed)));
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // class -> free blocks, most recently freed last
  std::atomic<size_t> cached_{0};              // bytes in free_; written under mu_
};

// Leaked on purpose: tensors held by static objects may be freed after every other static has been destroyed.
LargeBlockCache& large_blocks() {
  static LargeBlockCache* cache = new LargeBlockCache;
  return *cache;
}

// 64-byte aligned host memory (one cache line; lets the compiler use aligned vector loads). Blocks up to 4 KiB
// are recycled through a small per-thread cache: small temporaries are created and freed at a high rate
// (autograd, per-op outputs) and malloc/free dominate their cost; larger ones through LargeBlockCache. Sanitizer
// builds skip both caches (glibc's malloc directly) so that use-after-free stays detectable.
class CpuAllocator final : public Allocator {
  static constexpr size_t kLine = 64, kMaxCached = 4096, kClasses = kMaxCached / kLine, kPerClass = 16;
  struct Cache {
    void* blocks[kClasses][kPerClass];
    int count[kClasses] = {};
    ~Cache() {
      for (size_t c = 0; c < kClasses; ++c)
        for (int i = 0; i < count[c]; ++i) std::free(blocks[c][i]);
    }
  };
  static Cache& cache() {
    thread_local Cache c;
    return c;
  }
#if defined(ASC_SANITIZE_BUILD)
  static constexpr bool kUseCache = false;
#else
  static constexpr bool kUseCache = true;
#endif

 public:
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    // A request beyond this machine's memory is refused before the system allocator sees it: its answer would be a
    // pointer the kernel kills the process for later (overcommit) or, under AddressSanitizer, an abort.
    ASC_CHECK(nbytes <= physical_memory(),
              "cpu allocator: out of memory: {} bytes requested, more than this "
              "machine's {} bytes of memory",
              nbytes, physical_memory());
    size_t rounded = (nbytes + kLine - 1) & ~(kLine - 1);
    void* p = nullptr;
    if (kUseCache && rounded <= kMaxCached) {
      Cache& c = cache();
      size_t cls = rounded / kLine - 1;
      if (c.count[cls] > 0) return c.blocks[cls][--c.count[cls]];
      p = std::aligned_alloc(kLine, rounded);
    } else if (kUseCache) {
      p = large_blocks().get(LargeBlockCache::class_bytes(rounded));
    } else {
      p = std::aligned_alloc(kLine, rounded);
    }
    ASC_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes", nbytes);
    if (rounded > kMaxCached) count_alloc(rounded);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    size_t rounded = (nbytes + kLine - 1) & ~(kLine - 1);
    if (kUseCache && rounded <= kMaxCached) {
      Cache& c = cache();
      size_t cls = rounded / kLine - 1;
      if (c.count[cls] < static_cast<int>(kPerClass)) {
        c.blocks[cls][c.count[cls]++] = ptr;
        return;
      }
      std::free(ptr);
      return;
    }
    if (rounded > kMaxCached) g_cpu_live.fetch_sub(rounded, std::memory_order_relaxed);  // counted as allocate did
    if (kUseCache && rounded > kMaxCached) {
      large_blocks().put(ptr, LargeBlockCache::class_bytes(rounded));
    } else {
      std::free(ptr);
    }
  }
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

CpuAllocator g_cpu_allocator;

// The rest of the process's large blocks (the GEMM library's packing buffers, std::vectors; tensors in sanitizer
// builds): glibc serves blocks above 128 KiB (adaptive up to 32 MiB) with mmap and returns them with munmap, so a
// loop that asks for the same multi-MiB buffer every step pays a page fault per 4 KiB page each time. Keeping
// blocks up to 256 MiB in the heap lets them be reused.
const bool g_malloc_tuned = [] {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  return true;
}();
Allocator* g_allocators[2] = {&g_cpu_allocator, nullptr};
Allocator* g_pinned_allocator = nullptr;
AllocatorProvider g_providers[2] = {nullptr, nullptr};
AllocatorProvider g_pinned_provider = nullptr;
std::once_flag g_provided[2], g_pinned_provided;

}  // namespace

CpuMemoryStats cpu_memory_stats() {
  return {g_cpu_live.load(std::memory_order_relaxed), g_cpu_peak.load(std::memory_order_relaxed),
          large_blocks().cached()};
}
void empty_cpu_cache() { large_blocks().release_all(); }
void reset_cpu_peak_memory() { g_cpu_peak.store(g_cpu_live.load(std::memory_order_relaxed)); }
size_t thread_allocated_bytes() { return t_allocated; }

namespace {
// The allocator installed for device type t; the first call asks the backend's provider (once; later calls cost one
// atomic load).
Allocator* installed(int t) {
  if (g_providers[t]) std::call_once(g_provided[t], [t] { g_allocators[t] = g_providers[t](); });
  return g_allocators[t];
}
}  // namespace

Allocator* allocator_for(Device device) {
  Allocator* a = installed(static_cast<int>(device.type));
  ASC_CHECK(a != nullptr,
            "device cuda:{}: no CUDA device is available (the program does not link the CUDA backend, "
            "ascender::cuda, or no GPU is present)",
            device.index);
  return a;
}

void register_allocator(Device::Type type, Allocator* alloc) {
  installed(static_cast<int>(type));  // the provider has had its turn: it never overwrites `alloc` later
  g_allocators[static_cast<int>(type)] = alloc;
}

Allocator* pinned_allocator() {
  if (g_pinned_provider) std::call_once(g_pinned_provided, [] { g_pinned_allocator = g_pinned_provider(); });
  return g_pinned_allocator;
}

void register_allocator_provider(Device::Type type, AllocatorProvider provider) {
  g_providers[static_cast<int>(type)] = provider;
}
void register_pinned_allocator_provider(AllocatorProvider provider) { g_pinned_provider = provider; }

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device), alloc_(allocator_for(device)) {
  data_ = alloc_->allocate(nbytes, device);
  t_allocated += nbytes;
}

Storage::Storage(size_t nbytes, Device device, Allocator* alloc) : nbytes_(nbytes), device_(device), alloc_(alloc) {
  data_ = alloc_->allocate(nbytes, device);
  t_allocated += nbytes;
}

Storage::~Storage() {
  if (data_) alloc_->deallocate(data_, nbytes_);
}

}  // namespace asc
