// CUDA entry points of sparse attention (ops/sparse_attention.h): allocate, pass raw pointers to the launchers of
// cuda/sparse_attention.cu (CUDA cores) or cuda/sparse_mma.cu (tensor cores: bfloat16, float16, and float32 when
// TF32 is allowed; head dims up to 64), turn a failed launch into an asc::Error. The op has validated shapes, dtypes,
// devices and moved the pattern to the inputs' device.
#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/sparse_attention_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {
constexpr const char* kOp = "sparse_attention";
static_assert(sparse_launch::kRowBlock == SparsePatternView::kRowBlock &&
                  sparse_launch::kKeyBlock == SparsePatternView::kKeyBlock,
              "the kernels tile by the pattern's block view");

sparse_launch::Pattern pattern_of(const SparsePatternView& p) {
  ASC_CHECK(p.has_blocks(), "{} (CUDA): the pattern has no block view (move it with SparsePattern::to)", kOp);
  const SparsePatternBlocks& b = p.blocks;
  return {p.groups, b.rblk_ptr, b.rblk_keys, b.rblk_bits, b.kblk_ptr, b.kblk_rows, b.kblk_bits};
}

sparse_launch::Dims dims_of(const Tensor& q, const Tensor& k) {
  const int64_t limit = sparse_launch::max_head_dim(float_elem_of(kOp, q.dtype()));
  ASC_CHECK(q.size(3) <= limit, "{} (CUDA): head dimension {} exceeds the kernels' {} for {}", kOp, q.size(3), limit,
            q.dtype());
  // The heads go on the grid's y axis (cuda/sparse_attention.cu).
  ASC_CHECK(q.size(0) * q.size(1) <= 65535, "{} (CUDA): B·H = {} exceeds the kernels' 65535 (batch, head) pairs", kOp,
            q.size(0) * q.size(1));
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
}

const bool* keep_of(const Tensor& key_keep) { return key_keep.defined() ? key_keep.data_ptr<bool>() : nullptr; }
DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }  // the kernels' compute type
}  // namespace

void sparse_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePatternView& pattern,
                              const Tensor& key_keep, double scale, Tensor& o, Tensor& lse) {
  const sparse_launch::Dims d = dims_of(q, k);
  const sparse_launch::Pattern p = pattern_of(pattern);
  const FloatElem elem = float_elem_of(kOp, q.dtype());
  const auto launch =
      sparse_launch::mma_takes(d, elem, allow_tf32()) ? sparse_launch::mma_forward : sparse_launch::forward;
  ASC_CUDA_CHECK(launch(q.raw_data(), k.raw_data(), v.raw_data(), p, keep_of(key_keep), d, scale, o.raw_data(),
                        lse.raw_data(), elem, current_stream()));
}

void sparse_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePatternView& pattern,
                               const Tensor& key_keep, double scale, const Tensor& o, const Tensor& dout,
                               const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv) {
  const sparse_launch::Dims d = dims_of(q, k);
  const sparse_launch::Pattern p = pattern_of(pattern);
  const Tensor delta = Tensor::empty({d.B, d.H, d.T}, {acc_of(q.dtype()), q.device(), false});  // the rows' dO · o
  const FloatElem elem = float_elem_of(kOp, q.dtype());
  const auto launch =
      sparse_launch::mma_takes(d, elem, allow_tf32()) ? sparse_launch::mma_backward : sparse_launch::backward;
  ASC_CUDA_CHECK(launch(q.raw_data(), k.raw_data(), v.raw_data(), p, keep_of(key_keep), d, scale, o.raw_data(),
                        dout.raw_data(), lse.raw_data(), delta.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data(),
                        elem, current_stream()));
}

}  // namespace asc::cuda
