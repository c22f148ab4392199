// CUDA runtime basics: device queries and the device allocator registered with core/ (the caching allocator of
// cuda/caching_allocator.h over cudaMalloc, one per device).
// The op kernels live in their own files (cuda/*.cu, registered through ops/kernel_list.inc); this one holds what
// they all stand on.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"
#include "cuda/host_allocator.h"

namespace asc::cuda {
namespace {

// The device side of the caching allocator for one device: cudaMalloc / cudaFree / cudaStreamQuery with that
// device current.
class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {}
  void* malloc(size_t nbytes) override {
    Guard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the caching allocator frees its cache and retries
      return nullptr;
    }
    ASC_CUDA_CHECK(e);
    return p;
  }
  void free(void* ptr) override {
    Guard g(device_);
    ASC_CUDA_CHECK(cudaFree(ptr));
  }
  // cudaStreamQuery answers for all work queued on the stream so far: conservative (later work delays the
  // deferred free too) but never early.
  bool stream_idle(uintptr_t stream) override {
    Guard g(device_);
    cudaError_t e = cudaStreamQuery(reinterpret_cast<cudaStream_t>(stream));
    if (e == cudaErrorNotReady) return false;
    ASC_CUDA_CHECK(e);
    return true;
  }
  void synchronize(uintptr_t stream) override {
    Guard g(device_);
    const WaitScope wait;
    ASC_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  }

 private:
  // Makes the allocator's device current for one call, restoring the caller's device after it.
  struct Guard {
    int prev = -1;
    explicit Guard(int device) {
      if (cudaGetDevice(&prev) == cudaSuccess && prev != device) {
        ASC_CUDA_CHECK(cudaSetDevice(device));
      } else {
        prev = -1;
      }
    }
    ~Guard() {
      if (prev >= 0) cudaSetDevice(prev);
    }
  };
  int device_;
};

int query_count();

// One caching allocator per device, created on first use and never destroyed: tensors may outlive static
// destruction, and returning memory to a driver that is shutting down races it.
const std::vector<CachingAllocator*>& device_allocators() {
  static const std::vector<CachingAllocator*> all = [] {
    std::vector<CachingAllocator*> v;
    const int n = query_count();
    for (int d = 0; d < n; ++d) v.push_back(new CachingAllocator(new CudaDeviceMemory(d), "cuda:" + std::to_string(d)));
    return v;
  }();
  return all;
}

CachingAllocator& allocator_of(int device) {
  const auto& all = device_allocators();
  if (device < 0) device = current_device();
  ASC_CHECK(device < static_cast<int>(all.size()), "cuda: no CUDA device {} ({} available)", device, all.size());
  return *all[static_cast<size_t>(device)];
}

// The core/ Allocator of CUDA storages: blocks of the storage device's caching allocator, on the thread's current
// stream for that device.
class CudaAllocator final : public Allocator {
  // The device whose memory `p` points into (anywhere inside a block: views have offsets); -1 for host memory.
  static int owner(const void* p) {
    cudaPointerAttributes a{};
    ASC_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
  }

 public:
  void* allocate(size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    return allocator_of(device.index).malloc(nbytes, reinterpret_cast<uintptr_t>(stream_of(device.index)));
  }
  // Called from Storage's destructor: must not throw. A pointer no device allocator knows is a bug elsewhere;
  // it is reported, not freed.
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    try {
      const auto& all = device_allocators();
      if (all.size() == 1) return all[0]->free(ptr);  // throws on an unknown pointer
      for (CachingAllocator* a : all) {
        if (a->owns(ptr)) {
          a->free(ptr);
          return;
        }
      }
      std::fprintf(stderr, "ascender: CUDA deallocate of unknown pointer %p (%zu bytes) ignored\n", ptr, nbytes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ascender: CUDA deallocate failed: %s\n", e.what());
    }
  }
  // Blocking host<->device and device<->device copies. Each is queued on the stream of the device that owns the
  // memory (not the caller's current device, whose stream is not ordered with another device's work), after the
  // kernels that produce the source and before those that reuse the destination's block, then waited for.
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (!nbytes) return;
    const WaitScope wait;
    const int ddev = owner(dst), sdev = owner(src);
    if (ddev >= 0 && sdev >= 0 && ddev != sdev) {
      {
        DeviceScope on(Device::cuda(sdev));
        ASC_CUDA_CHECK(cudaStreamSynchronize(stream_of(sdev)));  // the source is complete
      }
      DeviceScope on(Device::cuda(ddev));
      ASC_CUDA_CHECK(cudaMemcpyPeerAsync(dst, ddev, src, sdev, nbytes, stream_of(ddev)));
      ASC_CUDA_CHECK(cudaStreamSynchronize(stream_of(ddev)));
      return;
    }
    const int dev = ddev >= 0 ? ddev : sdev;
    ASC_CHECK(dev >= 0, "cuda: copy between two host buffers {} and {} reached the CUDA allocator", dst, src);
    DeviceScope on(Device::cuda(dev));
    ASC_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_of(dev)));
    ASC_CUDA_CHECK(cudaStreamSynchronize(stream_of(dev)));
  }
  // Host -> device from a pinned block: queued on the destination device's current stream, so the ops that
  // follow on that stream see the data; the block records the copy so that it is not reused before it completes.
  void copy_async(void* dst, const void* src, size_t nbytes) override {
    if (!nbytes) return;
    const int device = owner(dst);
    if (device < 0 || !is_pinned_pointer(src)) return copy(dst, src, nbytes);
    DeviceScope on(Device::cuda(device));
    cudaStream_t stream = stream_of(device);
    ASC_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
    record_pinned_use(src, reinterpret_cast<uintptr_t>(stream));
  }
};

int query_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

// Registers, at start-up, how to get the allocator: at the first CUDA tensor, when a device exists (core/allocator.h
// says why not at start-up).
const bool g_registered = [] {
  register_allocator_provider(Device::Type::CUDA, []() -> Allocator* {
    // Never destroyed: a tensor in a static object may be freed after this function's statics are gone.
    static CudaAllocator* const alloc = new CudaAllocator;
    return impl::device_count() > 0 ? alloc : nullptr;
  });
  return true;
}();

}  // namespace

// ---- the backend's side of the public API (cuda/cuda.h), registered by cuda/backend.cpp ----------------------
namespace impl {

int device_count() {
  static int n = query_count();
  return n;
}

std::string device_name(int index) {
  ASC_CHECK(index >= 0 && index < device_count(), "cuda::device_name: no CUDA device {} ({} available)", index,
            device_count());
  cudaDeviceProp prop{};
  ASC_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

int compute_capability_major(int index) {
  ASC_CHECK(index >= 0 && index < device_count(), "cuda::is_bf16_supported: no CUDA device {} ({} available)", index,
            device_count());
  int major = 0;
  ASC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  return major;
}

MemoryStats memory_stats(int device) {
  if (device_count() == 0) return {};
  return allocator_of(device).stats();
}

void reset_peak_memory_stats(int device) {
  if (device_count() == 0) return;
  allocator_of(device).reset_peak_stats();
}

void empty_cache() {
  for (CachingAllocator* a : device_allocators()) a->empty_cache();
}

void record_stream(const void* data, uintptr_t stream) {
  ASC_CHECK(device_count() > 0, "cuda::record_stream: no CUDA device available");
  for (CachingAllocator* a : device_allocators()) {
    if (a->owns(data)) {
      a->record_stream(data, stream);
      return;
    }
  }
  ASC_THROW("cuda::record_stream: {} is not a live CUDA buffer of this process", data);
}

}  // namespace impl

// Touches cuBLAS so that the link against it is exercised in CI builds.
int cublas_version() {
  int v = 0;
  cublasGetProperty(MAJOR_VERSION, &v);
  return v;
}

}  // namespace asc::cuda
