// The public CUDA API (cuda/cuda.h) and asc::DeviceScope, in the CPU library: each call forwards to the CUDA backend
// library when the program links it (it registers a Runtime as it loads, cuda/runtime_api.h), and answers "no CUDA"
// otherwise. This file is plain C++ and links nothing of CUDA: it is what lets a CPU program ask the question.
#include "core/device.h"
#include "core/error.h"
#include "cuda/cuda.h"
#include "cuda/runtime_api.h"

namespace asc::cuda {
namespace {
// Zero-initialised before any constructor runs: the backend's start-up registration cannot precede it.
const Runtime* g_runtime = nullptr;

// The registered backend, for a call that cannot answer without it: an asc::Error naming `who` otherwise.
const Runtime& linked(const char* who) {
  ASC_CHECK(g_runtime, "{}: this program does not link the CUDA backend (ascender::cuda)", who);
  return *g_runtime;
}
}  // namespace

void register_runtime(const Runtime* runtime) { g_runtime = runtime; }

bool is_built() { return g_runtime != nullptr; }
bool is_available() { return device_count() > 0; }
int device_count() { return g_runtime ? g_runtime->device_count() : 0; }
std::string device_name(int index) { return linked("cuda::device_name").device_name(index); }
bool is_bf16_supported(int index) {
  return index >= 0 && index < device_count() && g_runtime->compute_capability_major(index) >= 8;
}
void synchronize() { linked("cuda::synchronize").synchronize(); }
void set_allow_tf32(bool allow) {
  if (g_runtime) g_runtime->set_allow_tf32(allow);
}
bool allow_tf32() { return g_runtime && g_runtime->allow_tf32(); }
MemoryStats memory_stats(int device) { return g_runtime ? g_runtime->memory_stats(device) : MemoryStats{}; }
void reset_peak_memory_stats(int device) {
  if (g_runtime) g_runtime->reset_peak_memory_stats(device);
}
void empty_cache() {
  if (g_runtime) g_runtime->empty_cache();
}
void record_stream(const void* data, uintptr_t stream) { linked("cuda::record_stream").record_stream(data, stream); }
PinnedStats pinned_memory_stats() { return g_runtime ? g_runtime->pinned_memory_stats() : PinnedStats{}; }
void empty_pinned_cache() {
  if (g_runtime) g_runtime->empty_pinned_cache();
}

}  // namespace asc::cuda

namespace asc {

DeviceScope::DeviceScope(Device device) {
  if (!device.is_cuda()) return;
  // Not linked(): the message names the device, and this runs for every CUDA op (formatted only on failure).
  ASC_CHECK(cuda::g_runtime, "cuda:{}: this program does not link the CUDA backend (ascender::cuda)", device.index);
  const cuda::Runtime& rt = *cuda::g_runtime;
  const int cur = rt.current_device_or_none();
  if (cur < 0) return;  // no usable device: the op's own launch reports that, naming the op
  if (cur != device.index) {
    ASC_CHECK(device.index >= 0 && device.index < rt.device_count(), "cuda:{}: no such CUDA device ({} available)",
              device.index, rt.device_count());
    rt.set_device(device.index);
    prev_ = cur;
  }
}

DeviceScope::~DeviceScope() {
  if (prev_ >= 0) cuda::g_runtime->restore_device(prev_);
}

}  // namespace asc
