// The registry of the CUDA backend's kernel table (ops/kernels.h). A plain pointer, zero-initialised before any
// constructor runs, so the backend library's start-up registration can never run before it exists.
#include "ops/kernels.h"

namespace asc {
namespace {
const KernelTable* g_cuda_kernels = nullptr;
}  // namespace

const KernelTable* cuda_kernels() { return g_cuda_kernels; }
void register_cuda_kernels(const KernelTable* table) { g_cuda_kernels = table; }

}  // namespace asc
