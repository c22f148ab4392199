// The CUDA backend registers itself with the CPU library as its library loads (cuda/runtime_api.h, ops/kernels.h):
// the public API's Runtime and the table of every kernel of ops/kernel_list.inc. Nothing in the CPU library names a
// symbol of this library, so a linker keeps it only when told to: ascender::cuda links the static library
// whole-archive and the shared one with --no-as-needed (cmake/cuda.cmake).
#include "core/profiler.h"
#include "cuda/context.h"
#include "cuda/runtime_api.h"
#include "ops/kernels.h"

namespace asc::cuda {
namespace {

const Runtime g_runtime{
    .device_count = impl::device_count,
    .device_name = impl::device_name,
    .compute_capability_major = impl::compute_capability_major,
    .current_device_or_none = impl::current_device_or_none,
    .set_device = impl::set_device,
    .restore_device = impl::restore_device,
    .synchronize = impl::synchronize,
    .set_allow_tf32 = impl::set_allow_tf32,
    .allow_tf32 = impl::allow_tf32,
    .memory_stats = impl::memory_stats,
    .reset_peak_memory_stats = impl::reset_peak_memory_stats,
    .empty_cache = impl::empty_cache,
    .record_stream = impl::record_stream,
    .pinned_memory_stats = impl::pinned_memory_stats,
    .empty_pinned_cache = impl::empty_pinned_cache,
};

KernelTable make_kernel_table() {
  KernelTable t;
#define ASC_DECLARE_KERNEL(NAME, PARAMS) t.NAME = &::asc::cuda::NAME;
#include "ops/kernel_list.inc"
#undef ASC_DECLARE_KERNEL
  return t;
}
const KernelTable g_kernels = make_kernel_table();

const profiler::detail::DeviceTimer g_timer{DeviceTimerFns::mark, DeviceTimerFns::elapsed_ms, DeviceTimerFns::release};

const bool g_registered = [] {
  register_runtime(&g_runtime);
  profiler::detail::register_device_timer(&g_timer);
  register_cuda_kernels(&g_kernels);
  return true;
}();

}  // namespace
}  // namespace asc::cuda
