// CUDA entry points of the kernels that build a clustered union's block view (ops/kernel_list.inc:
// clustered_bucket_masks, clustered_blocks_count, clustered_blocks_fill, exclusive_offsets): raw pointers to the
// launchers of cuda/sparse_patterns.cu, a failed launch as an asc::Error. The op (ops/sparse_attention.cpp:
// clustered_union) has validated the sizes and moved the base pattern to the device.
#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/sparse_patterns_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {
constexpr const char* kOp = "clustered_union";

patterns_launch::Blocks blocks_of(const ClusteredBlocksArgs& s, const Tensor& a) {
  const SparsePatternBlocks& p = s.base;
  return {p.rblk_ptr, p.rblk_keys, p.rblk_bits, p.kblk_ptr, p.kblk_rows, p.kblk_bits, s.base_groups,
          s.groups,   s.queries,   s.keys,      a.size(2),  s.theta,     s.causal};
}
}  // namespace

namespace {
const uint64_t* masks_of(const Tensor& masks) { return reinterpret_cast<const uint64_t*>(masks.data_ptr<int64_t>()); }
}  // namespace

void clustered_bucket_masks(const ClusteredBlocksArgs& s, const Tensor& a, Tensor& masks) {
  ASC_CUDA_CHECK(patterns_launch::masks(blocks_of(s, a), a.raw_data(), float_elem_of(kOp, a.dtype()),
                                        reinterpret_cast<uint64_t*>(masks.data_ptr<int64_t>()), current_stream()));
}

void clustered_blocks_count(const ClusteredBlocksArgs& s, const Tensor& a, const Tensor& masks, Tensor& rblk_count,
                            Tensor& kblk_count, Tensor& row_len) {
  ASC_CUDA_CHECK(patterns_launch::count(blocks_of(s, a), a.raw_data(), float_elem_of(kOp, a.dtype()), masks_of(masks),
                                        rblk_count.data_ptr<int64_t>(), kblk_count.data_ptr<int64_t>(),
                                        row_len.data_ptr<int64_t>(), current_stream()));
}

void clustered_blocks_fill(const ClusteredBlocksArgs& s, const Tensor& a, const Tensor& masks, const Tensor& rblk_ptr,
                           const Tensor& kblk_ptr, Tensor& rblk_keys, Tensor& rblk_bits, Tensor& kblk_rows,
                           Tensor& kblk_bits) {
  ASC_CUDA_CHECK(patterns_launch::fill(blocks_of(s, a), a.raw_data(), float_elem_of(kOp, a.dtype()), masks_of(masks),
                                       rblk_ptr.data_ptr<int64_t>(), kblk_ptr.data_ptr<int64_t>(),
                                       rblk_keys.data_ptr<int64_t>(), rblk_bits.data_ptr<int64_t>(),
                                       kblk_rows.data_ptr<int64_t>(), kblk_bits.data_ptr<int64_t>(), current_stream()));
}

void exclusive_offsets(const Tensor& counts, Tensor& ptr) {
  ASC_CUDA_CHECK(patterns_launch::exclusive_offsets(counts.data_ptr<int64_t>(), counts.numel(), ptr.data_ptr<int64_t>(),
                                                    current_stream()));
}

}  // namespace asc::cuda
