#pragma once
// Raw-device-memory helpers shared by the CUDA emulator's own tests (test_cuda_emulator, test_cudnn_emulator), which
// call the CUDA runtime directly rather than through Tensors.
#include <cuda_runtime.h>

#include <vector>

#include "testing.h"

namespace asc::testing {

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
void to_device(T* d, const std::vector<T>& h) {
  REQUIRE(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

}  // namespace asc::testing
