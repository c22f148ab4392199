// Placeholders for the CUDA kernel entry points that are not written yet (CUDA backend issue #3, in progress):
// each throws a clear asc::Error naming the op, so a CUDA tensor reaching one fails loudly, and the parity suite
// (tests/test_cuda_parity.cpp) lists what is missing. Whoever writes a kernel deletes its placeholder here.
// matmul is not here: it lives in cuda/matmul.cpp.
#include "core/error.h"
#include "cuda/kernels.h"

#define ASC_CUDA_TODO(name) ASC_THROW("{}: no CUDA kernel yet (issue #3 in progress)", name)

namespace asc::cuda {

// ---- geometry (ops/cpu/geometry_kernels.h) ----
void topk(const Tensor&, const Tensor&, int64_t, bool, int64_t, Tensor&, Tensor&) { ASC_CUDA_TODO("topk"); }
void topk_count(const Tensor&, int64_t, Tensor&) { ASC_CUDA_TODO("topk_count"); }
void topk_backward(const Tensor&, const Tensor&, Tensor&) { ASC_CUDA_TODO("topk_backward"); }
void normalize_rows(const Tensor&, double, Tensor&, Tensor&) { ASC_CUDA_TODO("normalize_rows"); }
void row_standardize(const Tensor&, const Tensor&, double, Tensor&, Tensor&) { ASC_CUDA_TODO("row_standardize"); }
void apply_surrogate(const Surrogate&, double, const Tensor&, Tensor&) { ASC_CUDA_TODO("apply_surrogate"); }

// ---- indexing (ops/cpu/index_kernels.h) ----
void index_minmax(const Tensor&, int64_t&, int64_t&) { ASC_CUDA_TODO("index_minmax"); }
void index_select(const Tensor&, int, const Tensor&, Tensor&) { ASC_CUDA_TODO("index_select"); }
void index_add(Tensor&, int, const Tensor&, const Tensor&, int64_t) { ASC_CUDA_TODO("index_add"); }
void gather(const Tensor&, int, const Tensor&, Tensor&) { ASC_CUDA_TODO("gather"); }
void scatter_add(Tensor&, int, const Tensor&, const Tensor&) { ASC_CUDA_TODO("scatter_add"); }
void one_hot(const Tensor&, Tensor&) { ASC_CUDA_TODO("one_hot"); }

// ---- optimizers (optim/kernels.h) ----
void sgd_update(const optim::SGDKernelArgs&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  ASC_CUDA_TODO("sgd_update");
}
void adam_update(const optim::AdamKernelArgs&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&, const Tensor&) {
  ASC_CUDA_TODO("adam_update");
}
void rmsprop_update(const optim::RMSpropKernelArgs&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&) {
  ASC_CUDA_TODO("rmsprop_update");
}
void clamp_inplace(const Tensor&, double, double) { ASC_CUDA_TODO("clamp_inplace"); }

}  // namespace asc::cuda
