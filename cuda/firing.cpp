// CUDA entry points of the firing perceptron's output (ops/firing.h): allocate, pass raw pointers to the launchers
// of cuda/firing.cu, turn a failed launch into an asc::Error. The op has validated shapes, dtypes and devices.
#include "ops/firing.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/firing_launch.h"
#include "ops/elementwise.h"
#include "ops/kernels.h"
#include "ops/linalg.h"

namespace asc::cuda {

static_assert(kSsmScanMaxCudaChannels == firing_launch::kMaxScanChannels,
              "ops/firing.h states the CUDA scan's channel limit of cuda/firing_launch.h");

void firing_forward(const Tensor& Z, const Tensor& SP, const Tensor& f, Tensor& F, Tensor& Y) {
  const int64_t N = Z.size(0), P = Z.size(1), A = f.size(1);
  F = Tensor::empty({N, P}, Z.options());
  Y = Tensor::empty({N, P, A}, Z.options());
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
  dZ = Tensor::empty({N, P}, Z.options());
  dSP = Tensor::empty({P}, Z.options());
  df = Tensor::empty({P, A}, Z.options());
  const DType acc = Z.dtype() == kFloat64 ? kFloat64 : kFloat32;  // the kernels' compute type
  const Tensor work = Tensor::empty({firing_launch::backward_workspace(N, P, A)}, {acc, Z.device(), false});
  ASC_CUDA_CHECK(firing_launch::backward(Z.raw_data(), SP.raw_data(), f.raw_data(), F.raw_data(), dY.raw_data(), N, P,
                                         A, gate, dZ.raw_data(), dSP.raw_data(), df.raw_data(), work.raw_data(),
                                         float_elem_of("firing_output", Z.dtype()), current_stream()));
}

// On the GPU the dense product is the fast path at any firing rate: scale the rows, then one cuBLAS GEMM (through
// the matmul op) added in. Silent neurons are not skipped here.
void firing_weight_update(Tensor& W, const Tensor& keep, const Tensor& coef, const Tensor& X) {
  W.copy_(asc::add(asc::mul(W, keep.view({W.size(0), 1})), asc::matmul(coef.t(), X)));
}

void firing_batch_sums(const Tensor& Z, const Tensor& F, const Tensor& SP, Tensor& fz2, Tensor& fired, Tensor& margin) {
  const int64_t N = Z.size(0), P = Z.size(1);
  fz2 = Tensor::empty({P}, Z.options());
  fired = Tensor::empty({P}, Z.options());
  margin = Tensor::empty({P}, Z.options());
  const Tensor work = Tensor::empty({firing_launch::batch_sums_workspace(N, P)}, Z.options());
  ASC_CUDA_CHECK(firing_launch::batch_sums(Z.raw_data(), F.raw_data(), SP.raw_data(), N, P, fz2.raw_data(),
                                           fired.raw_data(), margin.raw_data(), work.raw_data(),
                                           float_elem_of("firing_batch_sums", Z.dtype()), current_stream()));
}

void firing_rule_b_coef(const Tensor& Z, const Tensor& F, double a, const Tensor& dZ, const Tensor& c, Tensor& coef) {
  const int64_t N = Z.size(0), P = Z.size(1);
  coef = Tensor::empty({N, P}, Z.options());
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
  s = Tensor::empty({B, T, R}, a.options());
  rms = Tensor::empty({B, T}, a.options());
  const Tensor work = scan_work(a, rms_norm);
  ASC_CUDA_CHECK(firing_launch::scan_forward(a.raw_data(), u.raw_data(), s0.raw_data(), B, T, R, rms_norm, eps,
                                             s.raw_data(), rms.raw_data(), work.defined() ? work.raw_data() : nullptr,
                                             float_elem_of("ssm_scan", a.dtype()), current_stream()));
}

void ssm_scan_backward(const Tensor& a, const Tensor& s0, const Tensor& s, const Tensor& rms, const Tensor& ds,
                       bool rms_norm, Tensor& da, Tensor& du, Tensor& ds0) {
  const int64_t B = a.size(0), T = a.size(1), R = a.size(2);
  da = Tensor::empty({B, T, R}, a.options());
  du = Tensor::empty({B, T, R}, a.options());
  ds0 = Tensor::empty({B, R}, a.options());
  const Tensor work = scan_work(a, rms_norm);
  ASC_CUDA_CHECK(firing_launch::scan_backward(a.raw_data(), s0.raw_data(), s.raw_data(), rms.raw_data(), ds.raw_data(),
                                              B, T, R, rms_norm, da.raw_data(), du.raw_data(), ds0.raw_data(),
                                              work.defined() ? work.raw_data() : nullptr,
                                              float_elem_of("ssm_scan", a.dtype()), current_stream()));
}

}  // namespace asc::cuda
