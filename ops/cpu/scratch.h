#pragma once
// Scratch memory for CPU kernels: std::vector storage drawn from the CPU allocator (core/allocator.h), so that a
// kernel's per-thread tiles count in asc::cpu_memory_stats() like tensors do and a benchmark's peak-memory column
// includes them.
//   asc::cpu::Scratch<float> tile(rows * n);   // a std::vector<float> whose bytes the allocator counts
#include <cstddef>
#include <vector>

#include "core/allocator.h"

namespace asc::cpu {

template <class T>
struct ScratchAllocator {
  using value_type = T;
  ScratchAllocator() = default;
  template <class U>
  ScratchAllocator(const ScratchAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(allocator_for(Device::cpu())->allocate(n * sizeof(T), Device::cpu()));
  }
  void deallocate(T* p, size_t n) { allocator_for(Device::cpu())->deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const ScratchAllocator<U>&) const {
    return true;
  }
};

template <class T>
using Scratch = std::vector<T, ScratchAllocator<T>>;

}  // namespace asc::cpu
