// CUDA matmul through cuBLAS: one cublasGemmStridedBatchedEx call per product (batch strides may be 0 for a
// broadcast operand). Row-major operands are handed to column-major cuBLAS as the transposed problem
// C^T (N x M) = B^T A^T, so a row-major or transposed view costs no copy; anything else is made contiguous.
// float32 accumulates in float32 (TF32 tensor cores only with cuda::set_allow_tf32(true)); float64 in float64;
// bfloat16 / float16 inputs and outputs accumulate in float32.
#include <cublas_v2.h>

#include <algorithm>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"
#include "ops/kernels.h"
#include "ops/layout.h"

namespace asc::cuda {
namespace {

// cuBLAS's op flag for a GEMM operand (ops/layout.h).
cublasOperation_t op_of(const GemmOperand& o) { return o.trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case kFloat32: return CUDA_R_32F;
    case kFloat64: return CUDA_R_64F;
    case kBFloat16: return CUDA_R_16BF;
    case kFloat16: return CUDA_R_16F;
    default: ASC_THROW("matmul (CUDA): unsupported dtype {}", t);
  }
}

// out = a @ b (+ out where accumulate: cuBLAS's beta = 1).
void gemm_into(const Tensor& a_in, const Tensor& b_in, Tensor& out, bool accumulate) {
  const bool batched = a_in.dim() == 3;
  const int d = batched ? 1 : 0;
  const int64_t Bt = batched ? a_in.size(0) : 1;
  const int64_t M = a_in.size(d), K = a_in.size(d + 1), N = b_in.size(d + 1);
  if (M == 0 || N == 0 || Bt == 0) return;
  if (K == 0) {
    if (!accumulate) out.fill_(0.0);
    return;
  }
  Tensor a = a_in, b = b_in;
  GemmOperand oa = gemm_operand(M, K, a.stride(d), a.stride(d + 1));
  GemmOperand ob = gemm_operand(K, N, b.stride(d), b.stride(d + 1));
  if (!oa.ok) a = a.contiguous(), oa = gemm_operand(M, K, a.stride(d), a.stride(d + 1));
  if (!ob.ok) b = b.contiguous(), ob = gemm_operand(K, N, b.stride(d), b.stride(d + 1));
  const int64_t sa = batched ? a.stride(0) : 0, sb = batched ? b.stride(0) : 0;
  ASC_CHECK(std::max({M, N, K, oa.ld, ob.ld}) <= INT32_MAX,
            "matmul (CUDA): dimensions ({}, {}, {}) exceed cuBLAS's int range", M, N, K);

  const cudaDataType_t type = cuda_type(a.dtype());
  const bool f64 = a.dtype() == kFloat64;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F
          : (a.dtype() == kFloat32 && impl::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = f64 ? static_cast<const void*>(accumulate ? &one_d : &zero_d)
                         : static_cast<const void*>(accumulate ? &one_f : &zero_f);
  // Column-major view: C^T (N x M, ld N) = op(B^T) (N x K) * op(A^T) (K x M).
  ASC_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_handle(), op_of(ob), op_of(oa), static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), alpha,
      b.raw_data(), type, static_cast<int>(ob.ld), sb, a.raw_data(), type, static_cast<int>(oa.ld), sa, beta,
      out.raw_data(), type, static_cast<int>(N), M * N, static_cast<int>(Bt), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// a: (M, K) or (Bt, M, K); b: (K, N) or (Bt, K, N) (batch stride may be 0); out: contiguous (.., M, N).
void matmul(const Tensor& a, const Tensor& b, Tensor& out) { gemm_into(a, b, out, false); }

// a: (M, K), b: (K, N), bias: (N); out: contiguous (M, N) = the bias in every row, then += a @ b (beta = 1).
void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
  out.copy_(bias.expand(out.shape()));
  gemm_into(a, b, out, true);
}

}  // namespace asc::cuda
