// The caching device allocator: see cuda/caching_allocator.h for the policy. Plain C++20, no CUDA headers.
#include "cuda/caching_allocator.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace asc::cuda {
namespace caching_detail {  // named (not anonymous): CachingAllocator::Impl has members of these types

using BlockState = CachingAllocator::BlockState;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  uintptr_t stream = 0;
  bool small = false;
  BlockState state = BlockState::Free;
  Block* prev = nullptr;  // neighbours in the same segment (address order)
  Block* next = nullptr;
  std::vector<uintptr_t> uses;  // other streams recorded with record_stream
};

// Best fit: ordered by size, then address (so the order is deterministic).
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : std::less<const char*>()(a->ptr, b->ptr);
  }
};
using FreeSet = std::set<Block*, BySize>;

}  // namespace caching_detail

namespace {

std::string bytes_str(size_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (size_t{1} << 20)) return fmt::format("{:.2f} KiB ({} bytes)", n / 1024.0, n);
  if (n < (size_t{1} << 30)) return fmt::format("{:.2f} MiB ({} bytes)", n / 1048576.0, n);
  return fmt::format("{:.2f} GiB ({} bytes)", n / 1073741824.0, n);
}

}  // namespace

struct CachingAllocator::Impl {
  using Block = caching_detail::Block;
  using FreeSet = caching_detail::FreeSet;
  DeviceMemory* backend;
  std::string name;
  mutable std::mutex mu;
  std::map<std::pair<uintptr_t, bool>, FreeSet> pools;  // (stream, small) -> free blocks
  std::unordered_map<const void*, Block*> live;
  std::vector<Block*> pending;             // freed, waiting for recorded streams
  std::map<const char*, Block*> segments;  // segment base -> its first block (stable for its lifetime)
  MemoryStats st;

  FreeSet& pool_of(const Block* b) { return pools[{b->stream, b->small}]; }

  Block* take_free(uintptr_t stream, bool small, size_t size) {
    auto it = pools.find({stream, small});
    if (it == pools.end()) return nullptr;
    Block key;
    key.size = size;
    key.ptr = nullptr;
    auto bi = it->second.lower_bound(&key);
    if (bi == it->second.end()) return nullptr;
    Block* b = *bi;
    it->second.erase(bi);
    return b;
  }

  // Cuts b down to `size` when the remainder is worth keeping; the remainder becomes a free block.
  void split(Block* b, size_t size) {
    const size_t rem = b->size - size;
    const bool worth = b->small ? rem >= kMinBlock : rem > kSmallSize;
    if (!worth) return;
    auto* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rem;
    r->stream = b->stream;
    r->small = b->small;
    r->state = BlockState::Free;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool_of(r).insert(r);
  }

  // Returns a no-longer-used block to its stream's pool, merged with free neighbours.
  void free_block(Block* b) {
    b->state = BlockState::Free;
    b->uses.clear();
    if (Block* p = b->prev; p && p->state == BlockState::Free) {
      pool_of(p).erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      delete b;
      b = p;
    }
    if (Block* n = b->next; n && n->state == BlockState::Free) {
      pool_of(n).erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
    pool_of(b).insert(b);
  }

  // Completes deferred frees whose recorded streams are all idle.
  void process_pending() {
    if (pending.empty()) return;
    std::vector<std::pair<uintptr_t, bool>> idle;  // memo of this pass
    auto is_idle = [&](uintptr_t s) {
      for (auto& [k, v] : idle)
        if (k == s) return v;
      bool v = backend->stream_idle(s);
      idle.emplace_back(s, v);
      return v;
    };
    for (size_t i = 0; i < pending.size();) {
      Block* b = pending[i];
      if (std::all_of(b->uses.begin(), b->uses.end(), is_idle)) {
        pending[i] = pending.back();
        pending.pop_back();
        free_block(b);
      } else {
        ++i;
      }
    }
  }

  // Returns every cached, fully free segment to the backend.
  void release_cached() {
    for (auto pit = pools.begin(); pit != pools.end();) {
      FreeSet& set = pit->second;
      for (auto it = set.begin(); it != set.end();) {
        Block* b = *it;
        if (b->prev || b->next) {
          ++it;
          continue;
        }
        backend->free(b->ptr);  // may throw: nothing changed yet for this block
        it = set.erase(it);
        segments.erase(b->ptr);
        st.reserved -= b->size;
        ++st.num_device_frees;
        delete b;
      }
      pit = set.empty() ? pools.erase(pit) : std::next(pit);
    }
  }

  // Out-of-memory recovery before the single retry: deferred frees are completed (synchronizing their streams)
  // and every fully free segment is returned.
  void recover() {
    process_pending();
    if (!pending.empty()) {
      std::vector<uintptr_t> streams;
      for (Block* b : pending)
        for (uintptr_t s : b->uses)
          if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
      for (uintptr_t s : streams) backend->synchronize(s);
      process_pending();
    }
    release_cached();
  }

  size_t cached_free_bytes() const {
    size_t n = 0;
    for (auto& [k, set] : pools)
      for (Block* b : set) n += b->size;
    return n;
  }

  // Explains why `ptr` is not a live block (`freeing`: for free(), else for another use).
  std::string bad_pointer(const void* ptr, bool freeing) const {
    const char* p = static_cast<const char*>(ptr);
    auto it = segments.upper_bound(p);
    if (it != segments.begin()) {
      --it;
      for (const Block* b = it->second; b; b = b->next) {
        if (p < b->ptr || p >= b->ptr + b->size) continue;
        if (p == b->ptr && b->state != BlockState::Live)
          return fmt::format("{}: {} {} (its block of {} is already {})", name,
                             freeing ? "double free of" : "not live:", ptr, b->size,
                             b->state == BlockState::Free ? "free" : "freed, waiting for its recorded streams");
        return fmt::format("{}: {} points {} bytes into a block of {}, not at its start", name, ptr, p - b->ptr,
                           b->size);
      }
    }
    return fmt::format("{}: pointer {} was not allocated by this allocator", name, ptr);
  }

  std::string stats_str() const {
    return fmt::format("allocated {}, reserved {} (cached free {}), peak allocated {}, device mallocs {}",
                       bytes_str(st.allocated), bytes_str(st.reserved), bytes_str(cached_free_bytes()),
                       bytes_str(st.peak_allocated), st.num_device_mallocs);
  }
};

using caching_detail::Block;

CachingAllocator::CachingAllocator(DeviceMemory* backend, std::string name) : impl_(std::make_unique<Impl>()) {
  ASC_CHECK(backend != nullptr, "CachingAllocator: null backend");
  impl_->backend = backend;
  impl_->name = std::move(name);
}

CachingAllocator::~CachingAllocator() {
  for (auto& [base, head] : impl_->segments) {
    for (Block* b = head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    try {
      impl_->backend->free(const_cast<char*>(base));
    } catch (...) {  // a destructor must not throw; the memory is lost at worst
    }
  }
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) return kMinBlock;
  return (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::malloc(size_t nbytes, uintptr_t stream) {
  if (nbytes == 0) return nullptr;
  Impl& m = *impl_;
  // Beyond this the rounding arithmetic would overflow; no device has that much memory anyway.
  ASC_CHECK(nbytes <= (size_t{1} << 62), "{}: out of memory: cannot allocate {}", m.name, bytes_str(nbytes));
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  std::lock_guard<std::mutex> lock(m.mu);
  m.process_pending();
  Block* b = m.take_free(stream, small, size);
  if (b) {
    ++m.st.num_cache_hits;
  } else {
    const size_t seg = segment_size(size);
    void* p = m.backend->malloc(seg);
    if (!p) {
      m.recover();
      ++m.st.num_oom_retries;
      p = m.backend->malloc(seg);
    }
    ASC_CHECK(p != nullptr,
              "{}: out of memory: cannot allocate {} (rounded to {}, in a new segment of {}) on stream {:#x}, even "
              "after returning the cached free segments and retrying; {}",
              m.name, bytes_str(nbytes), bytes_str(size), bytes_str(seg), stream, m.stats_str());
    b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->stream = stream;
    b->small = small;
    m.segments.emplace(b->ptr, b);
    ++m.st.num_device_mallocs;
    m.st.reserved += seg;
    m.st.peak_reserved = std::max(m.st.peak_reserved, m.st.reserved);
  }
  m.split(b, size);
  b->state = BlockState::Live;
  m.live.emplace(b->ptr, b);
  m.st.allocated += b->size;
  m.st.peak_allocated = std::max(m.st.peak_allocated, m.st.allocated);
  ++m.st.num_allocs;
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.live.find(ptr);
  if (it == m.live.end()) ASC_THROW("{}", m.bad_pointer(ptr, true));
  Block* b = it->second;
  m.live.erase(it);
  m.st.allocated -= b->size;
  ++m.st.num_frees;
  if (!b->uses.empty()) {
    b->state = BlockState::PendingFree;
    m.pending.push_back(b);
    ++m.st.num_deferred_frees;
  } else {
    m.free_block(b);
  }
}

void CachingAllocator::record_stream(const void* ptr, uintptr_t stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.live.find(ptr);
  if (it == m.live.end()) ASC_THROW("record_stream: {}", m.bad_pointer(ptr, false));
  Block* b = it->second;
  if (stream == b->stream || std::find(b->uses.begin(), b->uses.end(), stream) != b->uses.end()) return;
  b->uses.push_back(stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->process_pending();
  impl_->release_cached();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->st;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->st.peak_allocated = impl_->st.allocated;
  impl_->st.peak_reserved = impl_->st.reserved;
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->live.count(ptr) != 0;
}

std::vector<CachingAllocator::SegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<SegmentInfo> out;
  for (auto& [base, head] : impl_->segments) {
    SegmentInfo s{reinterpret_cast<uintptr_t>(base), 0, head->stream, head->small, {}};
    for (const Block* b = head; b; b = b->next) {
      s.blocks.push_back({static_cast<size_t>(b->ptr - base), b->size, b->state});
      s.size += b->size;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace asc::cuda
