// The CUDA emulator's cuBLAS: GEMM in column-major with cuBLAS's argument rules, every operand bounds-checked against
// its device allocation (a wrong leading dimension or batch stride in the caller is an error here, not a silent
// read of a neighbour's memory). See tests/cuda_emu/include/cublas_v2.h.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emulator.h"

struct cublasContext {
  int device = 0;  // current when the handle was created: a cuBLAS handle serves that device only
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

using namespace asc::cuda::emu;

size_t element_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

// float32 -> TF32: 10 fraction bits, round to nearest with ties away from zero (finite values only).
float to_tf32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &u, 4);
  return v;
}

double load(const void* p, cudaDataType_t t, int64_t i, bool tf32) {
  switch (t) {
    case CUDA_R_32F: {
      const float v = static_cast<const float*>(p)[i];
      return tf32 ? to_tf32(v) : v;
    }
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: return static_cast<float>(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return static_cast<float>(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return 0;
  }
}

void store(void* p, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __half(v); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v); break;
    default: break;
  }
}

cublasStatus_t report(cublasStatus_t st, const std::string& why) {
  std::fprintf(stderr, "ascender CUDA emulator: cuBLAS: %s\n", why.c_str());
  return st;
}

// Bytes spanned by `batch` column-major (rows x cols) matrices with leading dimension ld, `stride` elements apart.
size_t span_bytes(int64_t rows, int64_t cols, int64_t ld, long long stride, int batch, size_t esize) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  const int64_t last = static_cast<int64_t>(batch - 1) * stride + (cols - 1) * ld + rows;
  return static_cast<size_t>(last) * esize;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  int device = 0;
  cudaGetDevice(&device);
  *handle = new cublasContext{device};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const unsigned base =
      static_cast<unsigned>(mode) & ~static_cast<unsigned>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  if (base > CUBLAS_TF32_TENSOR_OP_MATH) return report(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: unknown mode");
  handle->math = static_cast<cublasMath_t>(base);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUBLAS_STATUS_INVALID_VALUE;
  *value = type == MAJOR_VERSION ? 13 : 0;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    default: return cublasGetStatusName(status);
  }
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B, cudaDataType_t Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  (void)algo;
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  int device = 0;
  cudaGetDevice(&device);
  if (device != handle->device)
    return report(CUBLAS_STATUS_INVALID_VALUE, "GEMM: the handle was created for device " +
                                                   std::to_string(handle->device) + " but device " +
                                                   std::to_string(device) + " is current");
  auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
  if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0 || !alpha || !beta)
    return report(CUBLAS_STATUS_INVALID_VALUE, "GEMM: bad operation, negative size or null alpha/beta");
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return report(CUBLAS_STATUS_INVALID_VALUE, "GEMM: leading dimension too small (m " + std::to_string(m) + ", n " +
                                                   std::to_string(n) + ", k " + std::to_string(k) + ", lda " +
                                                   std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
                                                   std::to_string(ldc) + ")");
  const size_t es = element_size(Atype);
  if (es == 0 || Btype != Atype || Ctype != Atype) return report(CUBLAS_STATUS_NOT_SUPPORTED, "GEMM: data types");
  const bool f64 = Atype == CUDA_R_64F;
  const bool compute_ok =
      f64 ? computeType == CUBLAS_COMPUTE_64F
          : (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
             computeType == CUBLAS_COMPUTE_32F_FAST_TF32 || computeType == CUBLAS_COMPUTE_32F_FAST_16F ||
             computeType == CUBLAS_COMPUTE_32F_FAST_16BF);
  if (!compute_ok) return report(CUBLAS_STATUS_NOT_SUPPORTED, "GEMM: compute type does not fit the data type");
  const bool tf32 =
      Atype == CUDA_R_32F && (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                              (computeType == CUBLAS_COMPUTE_32F && handle->math == CUBLAS_TF32_TENSOR_OP_MATH));
  const double a_s = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double b_s = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;

  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  std::string why;
  const bool reads_ab = k > 0 && a_s != 0.0;
  if (reads_ab) {
    if (!device_range_ok(A, span_bytes(ta ? k : m, ta ? m : k, lda, strideA, batchCount, es), "GEMM operand A", &why) ||
        !device_range_ok(B, span_bytes(tb ? n : k, tb ? k : n, ldb, strideB, batchCount, es), "GEMM operand B", &why))
      return report(CUBLAS_STATUS_EXECUTION_FAILED, why);
  }
  if (!device_range_ok(C, span_bytes(m, n, ldc, strideC, batchCount, es), "GEMM output C", &why))
    return report(CUBLAS_STATUS_EXECUTION_FAILED, why);

  DeviceAccess access;
  std::vector<double> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);  // op(A) m x k, op(B) k x n
  for (int batch = 0; batch < batchCount; ++batch) {
    const char* Ab = static_cast<const char*>(A) + static_cast<int64_t>(batch) * strideA * static_cast<int64_t>(es);
    const char* Bb = static_cast<const char*>(B) + static_cast<int64_t>(batch) * strideB * static_cast<int64_t>(es);
    char* Cb = static_cast<char*>(C) + static_cast<int64_t>(batch) * strideC * static_cast<int64_t>(es);
    if (reads_ab) {
      for (int l = 0; l < k; ++l)
        for (int i = 0; i < m; ++i)
          a[static_cast<size_t>(l) * m + i] = load(Ab, Atype, ta ? i * int64_t{lda} + l : l * int64_t{lda} + i, tf32);
      for (int j = 0; j < n; ++j)
        for (int l = 0; l < k; ++l)
          b[static_cast<size_t>(j) * k + l] = load(Bb, Btype, tb ? l * int64_t{ldb} + j : j * int64_t{ldb} + l, tf32);
    }
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        double s = 0;
        if (reads_ab)
          for (int l = 0; l < k; ++l) s += a[static_cast<size_t>(l) * m + i] * b[static_cast<size_t>(j) * k + l];
        const int64_t ci = j * int64_t{ldc} + i;
        // beta == 0: C is not read (it may hold NaN), as in cuBLAS.
        store(Cb, Ctype, ci, a_s * s + (b_s != 0.0 ? b_s * load(Cb, Ctype, ci, false) : 0.0));
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                                    Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  return cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C,
                      CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
