// CUDA entry points of the geometry kernels (same signatures and semantics as ops/kernel_list.inc): check
// the tensors, pass raw pointers and sizes to the launchers of cuda/geometry.cu, and turn a failed launch into an
// asc::Error. The ops hand over contiguous inputs and preallocated contiguous outputs.
#include <climits>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/geometry_launch.h"
#include "ops/checks.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {

// t is a contiguous CUDA tensor of a floating dtype (float32/64, bfloat16, float16).
void check_cuda_float(const char* op, const Tensor& t, const char* what) {
  ASC_CHECK(t.defined() && t.device().is_cuda(), "{} (CUDA): {} must be a CUDA tensor", op, what);
  check_floating(op, t);
  ASC_CHECK(t.is_contiguous(), "{} (CUDA): {} must be contiguous", op, what);
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b, const char* what) {
  check_cuda_float(op, b, what);
  ASC_CHECK(a.dtype() == b.dtype(), "{} (CUDA): {} has dtype {}, expected {}", op, what, b.dtype(), a.dtype());
}

// mask undefined, or a contiguous bool CUDA tensor with numel == n.
const bool* mask_ptr(const char* op, const Tensor& mask, int64_t numel) {
  if (!mask.defined()) return nullptr;
  ASC_CHECK(mask.device().is_cuda() && mask.dtype() == kBool && mask.is_contiguous() && mask.numel() == numel,
            "{} (CUDA): mask must be a contiguous bool CUDA tensor with {} elements (got dtype {}, shape {})", op,
            numel, mask.dtype(), mask.shape());
  return static_cast<const bool*>(mask.raw_data());
}

}  // namespace

void topk(const Tensor& x, const Tensor& mask, int64_t k, bool largest, int64_t diag_n, Tensor& values,
          Tensor& indices) {
  check_cuda_float("topk", x, "input");
  check_same_dtype("topk", x, values, "values");
  ASC_CHECK(indices.device().is_cuda() && indices.dtype() == kInt64 && indices.is_contiguous(),
            "topk (CUDA): indices must be a contiguous int64 CUDA tensor");
  const int64_t n = x.size(-1);
  const int64_t R = n == 0 ? 0 : x.numel() / n;
  ASC_CHECK(n < INT_MAX, "topk (CUDA): rows of {} entries exceed the kernel's int32 column index", n);
  ASC_CHECK(R < INT_MAX, "topk (CUDA): {} rows exceed the grid's limit", R);
  ASC_CHECK(values.numel() == R * k && indices.numel() == R * k, "topk (CUDA): outputs must have {} x {} elements", R,
            k);
  const bool* mp = mask_ptr("topk", mask, x.numel());
  ASC_CUDA_CHECK(launch_topk(x.raw_data(), mp, R, n, k, largest, diag_n, values.raw_data(),
                             static_cast<int64_t*>(indices.raw_data()), float_elem_of("topk", x.dtype()),
                             current_stream()));
}

void topk_count(const Tensor& mask, int64_t diag_n, Tensor& counts) {
  const int64_t n = mask.size(-1);
  const int64_t R = n == 0 ? 0 : mask.numel() / n;
  ASC_CHECK(mask.defined(), "topk (CUDA): topk_count needs a mask");
  const bool* mp = mask_ptr("topk", mask, mask.numel());
  ASC_CHECK(counts.device().is_cuda() && counts.dtype() == kInt64 && counts.is_contiguous(),
            "topk (CUDA): counts must be a contiguous int64 CUDA tensor");
  if (n == 0) {  // empty rows: every count is 0
    if (counts.numel() > 0)
      ASC_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.numel() * sizeof(int64_t), current_stream()));
    return;
  }
  ASC_CUDA_CHECK(launch_topk_count(mp, R, n, diag_n, static_cast<int64_t*>(counts.raw_data()), current_stream()));
}

void topk_backward(const Tensor& g, const Tensor& indices, Tensor& gx) {
  check_cuda_float("topk backward", g, "gradient");
  check_same_dtype("topk backward", g, gx, "gx");
  ASC_CHECK(indices.device().is_cuda() && indices.dtype() == kInt64 && indices.is_contiguous(),
            "topk backward (CUDA): indices must be a contiguous int64 CUDA tensor");
  const int64_t k = g.size(-1), n = gx.size(-1);
  const int64_t R = k == 0 ? 0 : g.numel() / k;
  ASC_CUDA_CHECK(launch_topk_backward(g.raw_data(), static_cast<const int64_t*>(indices.raw_data()), R, k, n,
                                      gx.raw_data(), float_elem_of("topk backward", g.dtype()), current_stream()));
}

void normalize_rows(const Tensor& x, double eps, Tensor& y, Tensor& norm) {
  check_cuda_float("normalize_rows", x, "input");
  check_same_dtype("normalize_rows", x, y, "output");
  check_same_dtype("normalize_rows", x, norm, "norm");
  const int64_t d = x.size(-1);
  const int64_t R = d == 0 ? 0 : x.numel() / d;
  ASC_CUDA_CHECK(launch_normalize_rows(x.raw_data(), R, d, eps, y.raw_data(), norm.raw_data(),
                                       float_elem_of("normalize_rows", x.dtype()), current_stream()));
}

void row_standardize(const Tensor& x, const Tensor& mask, double eps, Tensor& y, Tensor& sd) {
  check_cuda_float("row_standardize", x, "input");
  check_same_dtype("row_standardize", x, y, "output");
  check_same_dtype("row_standardize", x, sd, "std");
  const int64_t n = x.size(-1);
  const int64_t R = n == 0 ? 0 : x.numel() / n;
  const bool* mp = mask_ptr("row_standardize", mask, x.numel());
  ASC_CUDA_CHECK(launch_row_standardize(x.raw_data(), mp, R, n, eps, y.raw_data(), sd.raw_data(),
                                        float_elem_of("row_standardize", x.dtype()), current_stream()));
}

void apply_surrogate(const GateSpec& gate, const Tensor& u, Tensor& out) {
  check_cuda_float("hard_gate", u, "u");
  check_same_dtype("hard_gate", u, out, "output");
  const math::SurrogateKind kind = surrogate_kind_of("hard_gate", gate);
  ASC_CUDA_CHECK(launch_apply_surrogate(kind, gate.width, u.raw_data(), u.numel(), out.raw_data(),
                                        float_elem_of("hard_gate", u.dtype()), current_stream()));
}

}  // namespace asc::cuda
