#include "cuda/context.h"

#include <mutex>
#include <vector>

#include "core/format.h"
#include "cuda/check.h"
#include "cuda/cuda.h"

namespace asc::cuda {
namespace {
constexpr int kMaxDevices = 64;
thread_local cudaStream_t t_streams[kMaxDevices] = {};  // per device; nullptr: the legacy default stream
bool g_allow_tf32 = false;
std::mutex g_handles_mu;
std::vector<cublasHandle_t> g_handles;  // per device; never destroyed (cuBLAS teardown at exit races the driver)
}  // namespace

int current_device() {
  int d = 0;
  ASC_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

cudaStream_t stream_of(int device) {
  ASC_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index {} out of range", device);
  return t_streams[device];
}
cudaStream_t current_stream() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {  // no usable device: the launch that follows reports it, naming its op
    cudaGetLastError();
    return nullptr;
  }
  return stream_of(d);
}
void set_current_stream(cudaStream_t stream) { t_streams[current_device()] = stream; }

FloatElem float_elem_of(const char* op, DType t) {
  switch (t) {
    case kFloat32: return FloatElem::F32;
    case kFloat64: return FloatElem::F64;
    case kBFloat16: return FloatElem::BF16;
    case kFloat16: return FloatElem::F16;
    default: ASC_THROW("{}: dtype {} is not supported on CUDA (float32/float64/bfloat16/float16 only)", op, t);
  }
}

DeviceScope::DeviceScope(int index) {
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) {  // no usable device: the op's own launch reports that, naming the op
    cudaGetLastError();
    return;
  }
  if (cur != index) {
    ASC_CHECK(index >= 0 && index < device_count(), "cuda:{}: no such CUDA device ({} available)", index,
              device_count());
    ASC_CUDA_CHECK(cudaSetDevice(index));
    prev_ = cur;
  }
}
DeviceScope::~DeviceScope() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

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
