#pragma once
// ascender's CUDA emulator — the part of the CUDA runtime API that ascender uses, implemented on the CPU.
//
// Built only with -DASC_CUDA_EMULATION=ON (CMake preset `cuda-emu`, `bash tools/run_tests.sh --cuda-emu`). The
// sources of cuda/ are then compiled by the host C++ compiler against the headers of tests/cuda_emu/include
// instead of NVIDIA's, and linked against tests/cuda_emu/*.cpp instead of libcudart / libcublas. Every kernel then
// really runs:
// each CUDA thread is a fibre with its own stack, a block's threads run one after another and switch only where
// CUDA threads synchronise (__syncthreads, warp shuffles), so barriers and shuffles have their real semantics.
// This lets CI (no GPU) run the parity suite over the actual kernel code. It checks more strictly than a GPU:
//   - a __syncthreads() that not every live thread of the block reaches, or that is reached after some thread of
//     the block exited, and a shuffle whose mask names an exited or missing lane: an error naming block and thread
//     instead of a hang or garbage;
//   - device memory is mapped without access while host code runs: a host dereference of a device pointer faults
//     at once; every allocation has guard pages behind it (a kernel running off its end faults); fresh memory is
//     0xFF bytes (NaN in every float type);
//   - a kernel pointer argument that is host memory, a freed block or another device's memory fails the launch;
//   - copies / memsets / GEMMs outside their allocation, and copy directions that contradict the pointers, are
//     errors; launch configurations are checked against the limits of compute capability 9.0;
//   - device memory in a copy, memset, GEMM or cuDNN call must belong to the current device (a stream's work,
//     to the stream's device): CUDA accepts another device's memory there but orders the work only on the
//     current device's stream, so data that device is still producing would be read stale. Between devices,
//     cudaMemcpyPeer.
// What it cannot show: speed, the GPU memory model (threads never run concurrently; a missing barrier shows up
// only when a later thread's write is read by an earlier one — run once more with ASC_CUDA_EMU_ORDER=reverse),
// tensor-core rounding inside cuBLAS, and anything about NVIDIA's compiler.
//
// Environment: ASC_CUDA_EMU_DEVICES (number of devices, default 1), ASC_CUDA_EMU_MEMORY_MB (per device, default
// 4096), ASC_CUDA_EMU_ORDER=forward|reverse (the order a block's threads are run in, default forward).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <math.h>
#include <cmath>

#define ASC_CUDA_EMULATION_RUNTIME 1
#define CUDART_VERSION 13000

// ---- types -------------------------------------------------------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
using cudaError = cudaError_t;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int multiProcessorCount;
  int major;
  int minor;
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMemoryClockRate = 36,
  cudaDevAttrGlobalMemoryBusWidth = 37,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

// library_types.h
enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;
enum libraryPropertyType { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL };

// ---- host API ----------------------------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, size_t size);
template <class T>
inline cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaFree(void* ptr);
// Pinned host memory. An asynchronous copy between pinned host memory and the device is *deferred*: it runs at the
// next CUDA call that could observe it (a launch, copy, memset, GEMM, stream/event query or sync, a free), not at
// the call. Host code that touches the pinned buffer in between (a race on a GPU) sees or leaves stale data, so
// tests can catch code that reuses a pinned buffer before its copy has completed.
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1;
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream = 0);
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
// Device memory (anywhere inside an allocation): type Device and its device; pinned blocks: Host; else Unregistered.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr);
cudaError_t cudaMemcpyPeer(void* dst, int dstDevice, const void* src, int srcDevice, size_t count);
cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                cudaStream_t stream = 0);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// ---- the emulator's engine (tests/cuda_emu/runtime.cpp)
// ---------------------------------------------------------------

namespace asc::cuda::emu {

// What a kernel thread reads as threadIdx / blockIdx / blockDim / gridDim.
struct Builtins {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
extern const Builtins* g_builtins;  // the running fibre's (kernels run one at a time, on the launching thread)

// Runs body(ctx) once per thread of the grid, block by block; returns the launch's error (also the last error).
// pointers[0..count) are the kernel's pointer arguments: each non-null one must point into a live allocation of the
// current device (a host pointer, a freed block or another device's memory is an error before anything runs).
cudaError_t launch_grid(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void (*body)(void*), void* ctx,
                        const void* const* pointers, int count);

// Synchronisation points, called from kernel code.
void block_barrier();                                                // __syncthreads()
void warp_barrier(unsigned mask);                                    // __syncwarp(mask)
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane);  // value of `bits` held by lane src_lane
// Warp-collective all-gather for the warp instructions the emulator models in software (cuda/mma.cuh: mma.sync):
// every lane of `mask` passes `words` (at most kGatherWords) 64-bit words; all[32 * words] receives each lane's,
// lane by lane (zeros for lanes outside the mask).
constexpr int kGatherWords = 4;
void warp_gather(unsigned mask, const uint64_t* mine, int words, uint64_t* all);
int lane_id();

// Test hooks: the order a block's threads run in (the default comes from ASC_CUDA_EMU_ORDER), and what the emulator
// reports for a faulting address (the text its SIGSEGV handler prints; empty outside device memory).
void set_reverse_thread_order(bool reverse);
std::string describe_address(const void* address, bool in_kernel);

// Raw shuffle: the value of `v` held by lane `src` (-1: this lane's own value).
template <class T>
T shuffle(unsigned mask, T v, int src) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "CUDA shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  const uint64_t r = warp_exchange(mask, bits, src);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

}  // namespace asc::cuda::emu

// cudaLaunchKernel with the kernel's own parameter types (the overload NVIDIA's header also offers): args[i] points
// at the i-th argument, already of the parameter's type.
template <class... P>
cudaError_t cudaLaunchKernel(void (*func)(P...), dim3 grid, dim3 block, void** args, size_t shared_bytes = 0,
                             cudaStream_t stream = 0) {
  using Params = std::tuple<std::decay_t<P>...>;
  struct Call {
    void (*func)(P...);
    Params params;
  };
  Call call{func, [&]<size_t... I>(std::index_sequence<I...>){return Params(*static_cast<std::decay_t<P>*>(args[I])...);
}
(std::index_sequence_for<P...>{})
}
;
const void* pointers[sizeof...(P) + 1] = {};
int count = 0;
std::apply(
    [&](const auto&... a) {
      (
          [&](const auto& v) {
            if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>) pointers[count] = v;
            ++count;  // argument position, pointer or not: messages name it
          }(a),
          ...);
    },
    call.params);
return asc::cuda::emu::launch_grid(
    grid, block, shared_bytes, stream,
    [](void* c) {
      Call& k = *static_cast<Call*>(c);
      std::apply([&](const auto&... a) { k.func(a...); }, k.params);  // each thread gets its own copies
    },
    &call, pointers, count);
}

// ---- device side: qualifiers, built-in variables, synchronisation, atomics, intrinsics ----------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// One block runs at a time, so a function-local static is exactly one block's shared array.
#define __shared__ static

#define threadIdx (::asc::cuda::emu::g_builtins->thread_idx)
#define blockIdx (::asc::cuda::emu::g_builtins->block_idx)
#define blockDim (::asc::cuda::emu::g_builtins->block_dim)
#define gridDim (::asc::cuda::emu::g_builtins->grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { asc::cuda::emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { asc::cuda::emu::warp_barrier(mask); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = asc::cuda::emu::lane_id(), base = lane & ~(width - 1);
  return asc::cuda::emu::shuffle(mask, v, base + (src & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = asc::cuda::emu::lane_id(), src = lane ^ lane_mask;
  const bool inside = (src & ~(width - 1)) == (lane & ~(width - 1));
  return asc::cuda::emu::shuffle(mask, v, inside ? src : -1);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = asc::cuda::emu::lane_id(), src = lane + static_cast<int>(delta);
  const bool inside = (src & ~(width - 1)) == (lane & ~(width - 1));
  return asc::cuda::emu::shuffle(mask, v, inside ? src : -1);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = asc::cuda::emu::lane_id(), src = lane - static_cast<int>(delta);
  const bool inside = src >= 0 && (src & ~(width - 1)) == (lane & ~(width - 1));
  return asc::cuda::emu::shuffle(mask, v, inside ? src : -1);
}

// Atomics: threads never run concurrently and never switch inside an atomic, so read-modify-write is atomic.
template <class T>
inline T asc_emu_atomic_add(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) { return asc_emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return asc_emu_atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return asc_emu_atomic_add(p, v); }
inline float atomicAdd(float* p, float v) { return asc_emu_atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return asc_emu_atomic_add(p, v); }
template <class T>
inline T asc_emu_atomic_min(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <class T>
inline T asc_emu_atomic_max(T* p, T v) {
  const T old = *p;
  *p = v > old ? v : old;
  return old;
}
inline int atomicMin(int* p, int v) { return asc_emu_atomic_min(p, v); }
inline long long atomicMin(long long* p, long long v) { return asc_emu_atomic_min(p, v); }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) { return asc_emu_atomic_min(p, v); }
inline int atomicMax(int* p, int v) { return asc_emu_atomic_max(p, v); }
inline long long atomicMax(long long* p, long long v) { return asc_emu_atomic_max(p, v); }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) { return asc_emu_atomic_max(p, v); }
inline int atomicCAS(int* p, int compare, int v) {
  const int old = *p;
  if (old == compare) *p = v;
  return old;
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare, unsigned long long v) {
  const unsigned long long old = *p;
  if (old == compare) *p = v;
  return old;
}

// IEEE round-to-nearest arithmetic (the host build never contracts to FMA: -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// The device-code min / max overloads of CUDA's math headers (any two arithmetic types, usual conversions).
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
