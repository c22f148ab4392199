// CUDA runtime basics: error translation, device queries and the device allocator registered with core/.
// The op kernels themselves arrive with the CUDA backend issue; this file makes sure the CUDA toolchain,
// the runtime and cuBLAS compile and link in every build where nvcc is present.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>

#include "core/allocator.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/cuda.h"

namespace asc::cuda {
namespace {

std::mutex g_mu;
MemoryStats g_stats;

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    ASC_CUDA_CHECK(cudaMalloc(&p, nbytes));
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.allocated += nbytes;
    g_stats.peak_allocated = std::max(g_stats.peak_allocated, g_stats.allocated);
    ++g_stats.num_device_mallocs;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    cudaFree(ptr);  // never throws from a destructor path
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.allocated -= nbytes;
  }
  // Host<->device and device<->device copies (unified addressing picks the direction).
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) ASC_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
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

// Registers the allocator at start-up when a device exists.
const bool g_registered = [] {
  static CudaAllocator alloc;
  if (query_count() > 0) register_allocator(Device::Type::CUDA, &alloc);
  return true;
}();

}  // namespace

bool is_available() { return device_count() > 0; }
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

MemoryStats memory_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

// Touches cuBLAS so that the link against it is exercised in CI builds.
int cublas_version() {
  int v = 0;
  cublasGetProperty(MAJOR_VERSION, &v);
  return v;
}

}  // namespace asc::cuda
