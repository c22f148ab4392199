#pragma once
// Per-device CUDA state for kernels and library calls: the current stream and the cuBLAS handle bound to it.
// For .cu / .cpp files of cuda/ only (exposes CUDA types); the public API is cuda/cuda.h.
//
//   cudaStream_t s = asc::cuda::current_stream();          // of the current device
//   kernel<<<grid, block, 0, s>>>(...);
//   cublasHandle_t h = asc::cuda::cublas_handle();         // already set to current_stream()
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/device.h"
#include "core/dtype.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/float_elem.h"
#include "ops/math.h"  // math::SurrogateKind

namespace asc {
struct GateSpec;  // ops/kernel_types.h
}  // namespace asc

namespace asc::cuda {

// The device every kernel of this thread targets (cudaGetDevice).
int current_device();
// The stream kernels of this thread are queued on, for the current device: the legacy default stream unless
// set_current_stream() chose another one (a stream belongs to one device: each device has its own choice).
// Contract of a non-default stream: a block is reused by the caching allocator in the order of the stream it was
// allocated on, so a tensor allocated on one stream and used on another must be marked with record_stream()
// (cuda/cuda.h) before it is dropped; the ops themselves do not do this (nothing in ascender switches streams yet).
cudaStream_t current_stream();
void set_current_stream(cudaStream_t stream);
// This thread's stream for device `device` (current_stream() of that device).
cudaStream_t stream_of(int device);
// This thread's cuBLAS handle for the current device (created lazily), with its stream set to current_stream() on
// every call, TF32 tensor-op math when cuda::set_allow_tf32(true), and reduced-precision split-K reductions
// disallowed (16-bit GEMMs accumulate in float32 throughout).
cublasHandle_t cublas_handle();

// The launchers' element type of a floating dtype; an asc::Error naming `op` for any other dtype.
FloatElem float_elem_of(const char* op, DType t);
// The built-in surrogate of a gate in Surrogate mode, the kind its device code computes (math::surrogate_derivative);
// an asc::Error naming `op` for a user-registered one, a host function with no device code. gate_spec refuses those
// on CUDA already; this guards a kernel called directly.
math::SurrogateKind surrogate_kind_of(const char* op, const GateSpec& gate);

// ---- the backend's side of the public API of cuda/cuda.h (same meanings), which cuda/backend.cpp registers with the
// CPU library (cuda/runtime_api.h). Code of cuda/ may call these directly. ---------------------------------------
namespace impl {
int device_count();  // cuda/runtime.cu
std::string device_name(int index);
int compute_capability_major(int index);
MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);
void empty_cache();
void record_stream(const void* data, uintptr_t stream);
int current_device_or_none();  // cuda/context.cpp: -1 when no device is usable
void set_device(int index);
void restore_device(int index) noexcept;  // never throws: DeviceScope's destructor calls it
void synchronize();
void set_allow_tf32(bool allow);
bool allow_tf32();
PinnedStats pinned_memory_stats();  // cuda/host_allocator.cpp
void empty_pinned_cache();
}  // namespace impl

// While a profile records (core/profiler.h), the host's time inside this scope is a "device wait" range: put one
// around every call that blocks the host on a device (a stream synchronisation, a copy to the host).
class WaitScope {
 public:
  WaitScope();
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  bool open_ = false;
};
// The profiler's device timer (core/profiler.h: DeviceTimer) on CUDA events; cuda/backend.cpp registers it.
struct DeviceTimerFns {
  static void* mark(int device, bool wait_first);
  static double elapsed_ms(void* from, void* to);
  static void release(void* mark);
};

}  // namespace asc::cuda
