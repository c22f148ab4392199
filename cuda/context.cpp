#include "cuda/context.h"

#include <mutex>
#include <vector>

#include "core/format.h"
#include "core/profiler.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "ops/kernel_types.h"

namespace asc::cuda {
namespace {
constexpr int kMaxDevices = 64;
thread_local cudaStream_t t_streams[kMaxDevices] = {};  // per device; nullptr: the legacy default stream
bool g_allow_tf32 = false;

// cuBLAS handles: one per (thread, device), because a handle's stream and math mode are set before each call and
// cuBLAS forbids sharing one handle between threads that do that. A thread that ends returns its handles to a
// per-device pool for the next thread; handles are never destroyed (cuBLAS teardown at exit races the driver).
struct HandlePool {
  std::mutex mu;
  std::vector<std::vector<cublasHandle_t>> free;  // per device
};
HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool;  // outlives every thread's ThreadHandles
  return *pool;
}
struct ThreadHandles {
  std::vector<cublasHandle_t> of_device;
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (size_t d = 0; d < of_device.size(); ++d) {
      if (!of_device[d]) continue;
      if (pool.free.size() <= d) pool.free.resize(d + 1);
      pool.free[d].push_back(of_device[d]);
    }
  }
};
thread_local ThreadHandles t_handles;
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

math::SurrogateKind surrogate_kind_of(const char* op, const GateSpec& gate) {
  ASC_CHECK(gate.surrogate.builtin.has_value(),
            "{} (CUDA): surrogate '{}' is a user-registered host function and has no CUDA kernel; use a built-in "
            "surrogate (sigmoid, rectangular, triangular, atan) on CUDA, or run the op on the CPU",
            op, gate.surrogate.name);
  return *gate.surrogate.builtin;
}

}  // namespace asc::cuda

namespace asc::cuda {

namespace impl {

int current_device_or_none() {
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) {  // no usable device
    cudaGetLastError();                      // clear the sticky error
    return -1;
  }
  return cur;
}
void set_device(int index) { ASC_CUDA_CHECK(cudaSetDevice(index)); }
void restore_device(int index) noexcept { cudaSetDevice(index); }

void synchronize() {
  ASC_CHECK(device_count() > 0, "cuda::synchronize: no CUDA device available");
  const WaitScope wait;
  ASC_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

}  // namespace impl

cublasHandle_t cublas_handle() {
  const auto dev = static_cast<size_t>(current_device());
  std::vector<cublasHandle_t>& mine = t_handles.of_device;
  if (mine.size() <= dev) mine.resize(dev + 1, nullptr);
  if (!mine[dev]) {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.free.size() > dev && !pool.free[dev].empty()) {
      mine[dev] = pool.free[dev].back();
      pool.free[dev].pop_back();
    } else {
      ASC_CUBLAS_CHECK(cublasCreate(&mine[dev]));
    }
  }
  cublasHandle_t h = mine[dev];
  ASC_CUBLAS_CHECK(cublasSetStream(h, current_stream()));
  // 16-bit GEMMs: no split-K partial sums rounded to 16 bits (cuBLAS may otherwise reduce in the output type);
  // every accumulation stays float32, as on the CPU and in the emulator.
  const int mode = (g_allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  ASC_CUBLAS_CHECK(cublasSetMathMode(h, static_cast<cublasMath_t>(mode)));
  return h;
}

WaitScope::WaitScope() {
  if (profiler::detail::recording()) [[unlikely]]
    open_ = profiler::detail::begin(profiler::EventKind::Range, profiler::kDeviceWait);
}
WaitScope::~WaitScope() {
  if (open_) [[unlikely]]
    profiler::detail::end(-1);
}

// The profiler's marks are CUDA events on the device's current stream. Failures answer null / -1 (the profile then
// lacks that device time) and clear CUDA's last error, which the next launch check would otherwise report.
void* DeviceTimerFns::mark(int device, bool wait_first) {
  const int prev = impl::current_device_or_none();
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const cudaStream_t stream = current_stream();
  cudaEvent_t e = nullptr;
  bool ok = true;
  if (wait_first) {
    const WaitScope wait;  // the profile's one wait for an idle device
    ok = cudaStreamSynchronize(stream) == cudaSuccess;
  }
  ok = ok && cudaEventCreate(&e) == cudaSuccess;
  ok = ok && cudaEventRecord(e, stream) == cudaSuccess;
  if (!ok) {
    if (e) cudaEventDestroy(e);
    cudaGetLastError();
    e = nullptr;
  }
  if (prev >= 0) impl::restore_device(prev);
  return e;
}
double DeviceTimerFns::elapsed_ms(void* from, void* to) {
  float ms = 0;
  if (cudaEventSynchronize(static_cast<cudaEvent_t>(to)) != cudaSuccess ||
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return ms;
}
void DeviceTimerFns::release(void* mark) { cudaEventDestroy(static_cast<cudaEvent_t>(mark)); }

}  // namespace asc::cuda
