#pragma once
// Storage: one reference-counted buffer on one device. Tensors (and all their views) share it through a
// shared_ptr. The version counter is bumped by every in-place write; autograd compares it with the version it
// saved to detect "a tensor needed for backward was modified in place".
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/allocator.h"

namespace asc {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // nbytes from a given allocator (e.g. pinned_allocator() for a pinned CPU storage).
  Storage(size_t nbytes, Device device, Allocator* alloc);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return alloc_; }
  // Atomic: threads that read one storage (a shared model's weights) while another writes it in place must not race
  // on the counter itself; ordering between the data and the counter is the caller's (as for the data).
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* alloc_ = nullptr;
  std::atomic<uint64_t> version_{0};
};

}  // namespace asc
