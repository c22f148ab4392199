// CUDA entry points of the firing perceptron's output (ops/firing.h): pass raw pointers to the launchers of
// cuda/firing.cu (and, for the weight update, to cuBLAS), turn a failed launch into an asc::Error. The op has
// validated shapes, dtypes and devices and allocated the outputs; only the launchers' workspaces are allocated here.

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/firing_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

static_assert(kSsmScanMaxCudaChannels == firing_launch::kMaxScanChannels,
              "ops/kernel_types.h states the CUDA scan's channel limit of cuda/firing_launch.h");

void firing_forward(const Tensor& Z, const Tensor& SP, const Tensor& f, Tensor& F, Tensor& Y) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  ASC_CUDA_CHECK(firing_launch::forward(Z.raw_data(), SP.raw_data(), f.raw_data(), N, P, A, F.raw_data(), Y.raw_data(),
                                        float_elem_of("firing_output", Z.dtype()), current_stream()));
}

namespace {
// The launchers' gate: GateBackward's value as its mode (0 exact, 1 straight-through, 2 surrogate) and the built-in
// surrogate's kind.
firing_launch::Gate gate_of(const char* op, const GateSpec& spec) {
  static_assert(static_cast<int>(GateBackward::None) == 0 && static_cast<int>(GateBackward::StraightThrough) == 1 &&
                static_cast<int>(GateBackward::Surrogate) == 2);
  firing_launch::Gate gate{static_cast<int>(spec.mode), math::SurrogateKind{}, spec.width};
  if (spec.mode == GateBackward::Surrogate) gate.kind = surrogate_kind_of(op, spec);
  return gate;
}
}  // namespace

void firing_backward(const Tensor& Z, const Tensor& SP, const Tensor& f, const Tensor& F, const Tensor& dY,
                     const GateSpec& spec, Tensor& dZ, Tensor& dSP, Tensor& df) {
  const firing_launch::Gate gate = gate_of("firing_output", spec);
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  const DType acc = Z.dtype() == kFloat64 ? kFloat64 : kFloat32;  // the kernels' compute type
  const Tensor work = Tensor::empty({firing_launch::backward_workspace(N, P, A)}, {acc, Z.device(), false});
  ASC_CUDA_CHECK(firing_launch::backward(Z.raw_data(), SP.raw_data(), f.raw_data(), F.raw_data(), dY.raw_data(), N, P,
                                         A, gate, dZ.raw_data(), dSP.raw_data(), df.raw_data(), work.raw_data(),
                                         float_elem_of("firing_output", Z.dtype()), current_stream()));
}

// On the GPU the dense product is the fast path at any firing rate: scale the rows (cuda/firing.cu), then one cuBLAS
// GEMM accumulating coefᵀ X into W (beta = 1), as the CPU's dense path does. Silent neurons are not skipped here.
void firing_weight_update(Tensor& W, const Tensor& keep, const Tensor& coef, const Tensor& X) {
  constexpr const char* op = "firing_weight_update_";
  const int64_t P = W.size(0), d = W.size(1), N = coef.size(0);
  ASC_CUDA_CHECK(
      firing_launch::scale_rows(W.raw_data(), keep.raw_data(), P, d, float_elem_of(op, W.dtype()), current_stream()));
  if (P == 0 || d == 0 || N == 0) return;  // no product to add: W = keep ∘ W (as the CPU's GEMM with K = 0)
  ASC_CHECK(std::max({P, d, N}) <= INT32_MAX, "{} (CUDA): dimensions (P {}, d {}, N {}) exceed cuBLAS's int range", op,
            P, d, N);
  // Row-major W (P, d) += coefᵀ X is column-major Wᵀ (d, P) += Xᵀ (d, N) · coef (N, P): X as stored (ld d), coef
  // stored as coefᵀ (P, N; ld P) and transposed — the operands of matmul(coef.t(), X) (cuda/matmul.cpp), no copy.
  const bool f64 = W.dtype() == kFloat64;  // float32 otherwise (checked by the op)
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (impl::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  const double one_d = 1.0;
  const float one_f = 1.0f;
  const void* one = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);  // alpha = beta = 1
  ASC_CUBLAS_CHECK(cublasGemmEx(cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(d), static_cast<int>(P),
                                static_cast<int>(N), one, X.raw_data(), type, static_cast<int>(d), coef.raw_data(),
                                type, static_cast<int>(P), one, W.raw_data(), type, static_cast<int>(d), compute,
                                CUBLAS_GEMM_DEFAULT));
}

void firing_batch_sums(const Tensor& Z, const Tensor& F, const Tensor& SP, Tensor& fz2, Tensor& fired, Tensor& margin) {
  const int64_t N = Z.size(0), P = Z.size(1);
  const Tensor work = Tensor::empty({firing_launch::batch_sums_workspace(N, P)}, Z.options());
  ASC_CUDA_CHECK(firing_launch::batch_sums(Z.raw_data(), F.raw_data(), SP.raw_data(), N, P, fz2.raw_data(),
                                           fired.raw_data(), margin.raw_data(), work.raw_data(),
                                           float_elem_of("firing_batch_sums", Z.dtype()), current_stream()));
}

void firing_rule_b_coef(const Tensor& Z, const Tensor& F, double a, const Tensor& dZ, const Tensor& c, Tensor& coef) {
  const int64_t N = Z.size(0), P = Z.size(1);
  ASC_CUDA_CHECK(firing_launch::rule_b_coef(Z.raw_data(), F.raw_data(), a, dZ.defined() ? dZ.raw_data() : nullptr,
                                            c.defined() ? c.raw_data() : nullptr, N, P, coef.raw_data(),
                                            float_elem_of("firing_rule_b_coef", Z.dtype()), current_stream()));
}

namespace {
// The chunked scan's workspace (cuda/firing_launch.h), in the compute type; undefined when the scan is sequential.
Tensor scan_work(const Tensor& a, bool rms_norm) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  if (!firing_launch::scan_chunked(rms_norm, T)) return {};
  const DType acc = a.dtype() == kFloat64 ? kFloat64 : kFloat32;
  return Tensor::empty({firing_launch::scan_workspace(B, T, R)}, {acc, a.device(), false});
}
}  // namespace

void ssm_scan_forward(const Tensor& a, const Tensor& u, const Tensor& s0, bool rms_norm, double eps, Tensor& s,
                      Tensor& rms) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);  // R <= kMaxScanChannels: checked by the op
  const Tensor work = scan_work(a, rms_norm);
  ASC_CUDA_CHECK(firing_launch::scan_forward(a.raw_data(), u.raw_data(), s0.raw_data(), B, T, R, rms_norm, eps,
                                             s.raw_data(), rms.raw_data(), work.defined() ? work.raw_data() : nullptr,
                                             float_elem_of("ssm_scan", a.dtype()), current_stream()));
}

void ssm_scan_backward(const Tensor& a, const Tensor& s0, const Tensor& s, const Tensor& rms, const Tensor& ds,
                       bool rms_norm, Tensor& da, Tensor& du, Tensor& ds0) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  const Tensor work = scan_work(a, rms_norm);
  ASC_CUDA_CHECK(firing_launch::scan_backward(a.raw_data(), s0.raw_data(), s.raw_data(), rms.raw_data(), ds.raw_data(),
                                              B, T, R, rms_norm, da.raw_data(), du.raw_data(), ds0.raw_data(),
                                              work.defined() ? work.raw_data() : nullptr,
                                              float_elem_of("ssm_scan", a.dtype()), current_stream()));
}

}  // namespace asc::cuda
