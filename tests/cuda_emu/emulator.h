#pragma once
// Internals shared by the CUDA emulator's runtime (runtime.cpp) and its cuBLAS (cublas.cpp). See
// tests/cuda_emu/include/cuda_runtime.h for what the emulator is and what it checks.
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <string>

namespace asc::cuda::emu {

// Serialises every emulated device operation (launches, copies, GEMMs, allocation).
std::recursive_mutex& device_mutex();

// Device memory is mapped without access while host code runs; this opens every device allocation for the scope
// of one device operation (hold device_mutex()).
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// Runs the deferred asynchronous copies now (hold device_mutex()); DeviceAccess does it too.
void flush_deferred();
// Whether [p, p + bytes) lies inside one pinned host block (cudaHostAlloc / cudaMallocHost).
bool pinned_range(const void* p, size_t bytes);

// Whether [p, p + bytes) lies inside one live device allocation of the current device. `what` describes the
// operand for the message written to `why` when it does not.
bool device_range_ok(const void* p, size_t bytes, const char* what, std::string* why);
// Whether p points into (or just around) a live device allocation of any device.
bool is_device_pointer(const void* p);

// Records `error` as the thread's last error with a detailed description (returned by cudaGetErrorString).
cudaError_t fail(cudaError_t error, const std::string& detail);

}  // namespace asc::cuda::emu
