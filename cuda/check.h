#pragma once
// Error translation for CUDA, cuBLAS (and cuDNN) calls: a failing call throws asc::Error naming the call, the
// status name and its description. For .cu / .cpp files of cuda/ only (includes the CUDA headers).
//
//   ASC_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   ASC_CUBLAS_CHECK(cublasSgemm(handle, ...));
//   my_kernel<<<grid, block, 0, stream>>>(...); ASC_CUDA_CHECK_LAUNCH("my_kernel");
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define ASC_CUDA_CHECK(call)                                                                           \
  do {                                                                                                 \
    cudaError_t asc_err_ = (call);                                                                     \
    ASC_CHECK(asc_err_ == cudaSuccess, "CUDA error in {}: {} ({})", #call, cudaGetErrorName(asc_err_), \
              cudaGetErrorString(asc_err_));                                                           \
  } while (0)

// After a kernel launch: launch-configuration errors surface here; asynchronous faults at the next sync.
#define ASC_CUDA_CHECK_LAUNCH(name)                                                                        \
  do {                                                                                                     \
    cudaError_t asc_err_ = cudaGetLastError();                                                             \
    ASC_CHECK(asc_err_ == cudaSuccess, "CUDA kernel launch {}: {} ({})", name, cudaGetErrorName(asc_err_), \
              cudaGetErrorString(asc_err_));                                                               \
  } while (0)

#define ASC_CUBLAS_CHECK(call)                                                                                      \
  do {                                                                                                              \
    cublasStatus_t asc_st_ = (call);                                                                                \
    ASC_CHECK(asc_st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error in {}: {} ({})", #call, cublasGetStatusName(asc_st_), \
              cublasGetStatusString(asc_st_));                                                                      \
  } while (0)
