// The CUDA backend's public API (cuda/cuda.h) in a build without the backend: nothing is available. Compiled
// instead of the rest of cuda/ when nvcc is absent or ASC_WITH_CUDA=OFF (cmake/cuda.cmake). No kernel needs a
// stub: ASC_KERNEL (ops/dispatch.h) never calls a CUDA kernel in such a build.
#include "core/device.h"
#include "core/error.h"
#include "cuda/cuda.h"

namespace asc {
DeviceScope::DeviceScope(Device device) {
  ASC_CHECK(!device.is_cuda(), "cuda:{}: this build has no CUDA backend", device.index);
}
DeviceScope::~DeviceScope() = default;
}  // namespace asc

namespace asc::cuda {
bool is_available() { return false; }
int device_count() { return 0; }
std::string device_name(int index) { ASC_THROW("cuda::device_name: this build has no CUDA backend"); }
void synchronize() { ASC_THROW("cuda::synchronize: this build has no CUDA backend"); }
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
MemoryStats memory_stats(int) { return {}; }
void reset_peak_memory_stats(int) {}
void empty_cache() {}
PinnedStats pinned_memory_stats() { return {}; }
void empty_pinned_cache() {}
void record_stream(const void*, uintptr_t) { ASC_THROW("cuda::record_stream: this build has no CUDA backend"); }
}  // namespace asc::cuda
