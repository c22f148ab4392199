// CUDA queries in a build without the CUDA backend: nothing is available.
#ifndef ASC_HAVE_CUDA
#include "core/error.h"
#include "cuda/cuda.h"
#include "cuda/cudnn_sdpa.h"

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
std::string cudnn_sdpa_unsupported(const Tensor&, const Tensor&, const Tensor&, bool, bool) {
  return "this build has no CUDA backend";
}
void cudnn_sdpa_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, Tensor&, Tensor&) {
  ASC_THROW("scaled_dot_product_attention: this build has no CUDA backend");
}
void cudnn_sdpa_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         bool, double, Tensor&, Tensor&, Tensor&) {
  ASC_THROW("scaled_dot_product_attention: this build has no CUDA backend");
}
DeviceScope::DeviceScope(int index) { ASC_THROW("cuda:{}: this build has no CUDA backend", index); }
DeviceScope::~DeviceScope() = default;
}  // namespace asc::cuda
#endif
