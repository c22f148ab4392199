#include "cuda/context.h"

#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/cuda.h"

namespace asc::cuda {
namespace {
thread_local cudaStream_t t_stream = nullptr;  // nullptr: the legacy default stream
bool g_allow_tf32 = false;
std::mutex g_handles_mu;
std::vector<cublasHandle_t> g_handles;  // per device; never destroyed (cuBLAS teardown at exit races the driver)
}  // namespace

int current_device() {
  int d = 0;
  ASC_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

cudaStream_t current_stream() { return t_stream; }
void set_current_stream(cudaStream_t stream) { t_stream = stream; }

void synchronize() {
  ASC_CHECK(is_available(), "cuda::synchronize: no CUDA device available");
  ASC_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

cublasHandle_t cublas_handle() {
  const int dev = current_device();
  cublasHandle_t h;
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (g_handles.size() <= static_cast<size_t>(dev)) g_handles.resize(static_cast<size_t>(dev) + 1, nullptr);
    if (!g_handles[static_cast<size_t>(dev)]) ASC_CUBLAS_CHECK(cublasCreate(&g_handles[static_cast<size_t>(dev)]));
    h = g_handles[static_cast<size_t>(dev)];
  }
  ASC_CUBLAS_CHECK(cublasSetStream(h, current_stream()));
  ASC_CUBLAS_CHECK(cublasSetMathMode(h, g_allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return h;
}

}  // namespace asc::cuda
