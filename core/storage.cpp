#include "core/storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace asc {
namespace {

// 64-byte aligned host memory (one cache line; lets the compiler use aligned vector loads).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, rounded);
    ASC_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

CpuAllocator g_cpu_allocator;
Allocator* g_allocators[2] = {&g_cpu_allocator, nullptr};

}  // namespace

Allocator* allocator_for(Device device) {
  Allocator* a = g_allocators[static_cast<int>(device.type)];
  ASC_CHECK(a != nullptr, "device cuda:{}: no CUDA device is available (build without CUDA, or no GPU present)",
            device.index);
  return a;
}

void register_allocator(Device::Type type, Allocator* alloc) { g_allocators[static_cast<int>(type)] = alloc; }

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device), alloc_(allocator_for(device)) {
  data_ = alloc_->allocate(nbytes);
}

Storage::~Storage() {
  if (data_) alloc_->deallocate(data_, nbytes_);
}

}  // namespace asc
