// Pinned host memory: Tensor::pin_memory(), its caching pool (cuda/host_allocator.h) and non_blocking host->device
// copies. Skips, saying so, where no CUDA device is present. Under the CUDA emulator an asynchronous copy from
// pinned memory runs only at the next CUDA call, so a pool that reused a block before its copy completed would
// hand the copy the successor's bytes, and these tests would see them.
#include <algorithm>

#include "ascender.h"
#include "testing.h"

using namespace asc;
using asc::testing::gpu_or_skip;

TEST_CASE("pin_memory: errors without a device or on a CUDA tensor") {
  if (!cuda::is_available()) {
    CHECK_THROWS_WITH_AS(ones({3}).pin_memory(),
                         doctest::Contains("pin_memory: pinned host memory needs a CUDA device"), Error);
    CHECK_FALSE(ones({3}).is_pinned());
    return;
  }
  Tensor g = ones({2, 3}).to(Device::cuda());
  CHECK_THROWS_WITH_AS(g.pin_memory(), doctest::Contains("pin_memory: only CPU tensors can be pinned"), Error);
  CHECK_FALSE(g.is_pinned());
}

TEST_CASE("pin_memory: a detached contiguous copy in pinned memory, equal values") {
  if (!gpu_or_skip()) return;
  Tensor x = arange(0.0, 24.0, 1.0, {.dtype = kFloat64}).reshape({4, 6}).t();  // non-contiguous view
  Tensor p = x.pin_memory();
  CHECK(p.is_pinned());
  CHECK_FALSE(x.is_pinned());
  CHECK(p.is_contiguous());
  CHECK(p.shape() == x.shape());
  CHECK(p.dtype() == kFloat64);
  CHECK(p.to_vector<double>() == x.contiguous().to_vector<double>());
  CHECK(p.pin_memory().shares_storage(p));  // already pinned: itself
  Tensor w = randn({3}, {.requires_grad = true});
  CHECK_FALSE(w.pin_memory().requires_grad());
  // Views of a pinned tensor are pinned (same storage); ops on it produce ordinary CPU tensors.
  CHECK(p.narrow(0, 1, 2).is_pinned());
  CHECK_FALSE((p + 1.0).is_pinned());
}

TEST_CASE("non_blocking host->device copies from pinned memory arrive; views and offsets included") {
  if (!gpu_or_skip()) return;
  Tensor x = randn({64, 33});
  Tensor p = x.pin_memory();
  Tensor d = p.to(Device::cuda(), /*non_blocking=*/true);
  CHECK(d.device().is_cuda());
  CHECK(d.cpu().to_vector<float>() == x.to_vector<float>());
  // A view starting inside the pinned block (the pool finds the block holding an interior pointer).
  Tensor row = p.narrow(0, 5, 7);
  Tensor dr = row.to(Device::cuda(), true);
  CHECK(dr.cpu().to_vector<float>() == x.narrow(0, 5, 7).contiguous().to_vector<float>());
  // From pageable memory non_blocking falls back to a blocking copy.
  Tensor dq = x.to(Device::cuda(), true);
  CHECK(dq.cpu().to_vector<float>() == x.to_vector<float>());
  // Back to the host is always blocking.
  CHECK(d.to(Device::cpu(), true).to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("pinned pool: a freed block is not reused while its copy is queued, then it is reused") {
  if (!gpu_or_skip()) return;
  cuda::synchronize();
  const int64_t n = 3000;  // 12 000 bytes: a 16 KiB block
  Tensor d;
  {
    Tensor p = full({n}, 1.0f).pin_memory();
    d = p.to(Device::cuda(), true);
  }  // p's block is free now, with its copy possibly still queued
  const cuda::PinnedStats before = cuda::pinned_memory_stats();
  // The next block of the same size class, written on the host at once by pin_memory's copy.
  Tensor q = full({n}, 2.0f).pin_memory();
  const cuda::PinnedStats after = cuda::pinned_memory_stats();
  CHECK(after.num_allocs == before.num_allocs + 1);
  CHECK(after.num_recorded_uses == before.num_recorded_uses);
  // Whether or not the block was reused, d must hold the first tensor's values.
  std::vector<float> got = d.cpu().to_vector<float>();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 1.0f; }));
  // Once the copy is done, a freed block of that size comes from the cache without a new cudaHostAlloc.
  cuda::synchronize();
  q = Tensor();
  const cuda::PinnedStats s0 = cuda::pinned_memory_stats();
  for (int i = 0; i < 5; ++i) {
    Tensor r = full({n}, static_cast<float>(i)).pin_memory();
    Tensor dr = r.to(Device::cuda(), true);
    CHECK(dr.cpu().to_vector<float>() == r.to_vector<float>());
  }
  const cuda::PinnedStats s1 = cuda::pinned_memory_stats();
  CHECK(s1.num_host_allocs == s0.num_host_allocs);
  CHECK(s1.num_cache_hits == s0.num_cache_hits + 5);
  CHECK(s1.num_recorded_uses == s0.num_recorded_uses + 5);
  CHECK(s1.allocated == s0.allocated);
}

TEST_CASE("pinned pool: statistics and empty_pinned_cache") {
  if (!gpu_or_skip()) return;
  cuda::synchronize();
  cuda::empty_pinned_cache();
  const cuda::PinnedStats s0 = cuda::pinned_memory_stats();
  {
    Tensor a = zeros({100}).pin_memory();   // 400 B -> 4 KiB (the minimum)
    Tensor b = zeros({5000}).pin_memory();  // 20 000 B -> 32 KiB
    const cuda::PinnedStats s1 = cuda::pinned_memory_stats();
    CHECK(s1.allocated == s0.allocated + 4096 + 32768);
    CHECK(s1.reserved == s0.reserved + 4096 + 32768);
    CHECK(s1.num_host_allocs == s0.num_host_allocs + 2);
  }
  const cuda::PinnedStats s2 = cuda::pinned_memory_stats();
  CHECK(s2.allocated == s0.allocated);
  CHECK(s2.reserved == s0.reserved + 4096 + 32768);  // cached
  cuda::empty_pinned_cache();
  const cuda::PinnedStats s3 = cuda::pinned_memory_stats();
  CHECK(s3.reserved == s0.reserved);
  CHECK(s3.num_host_frees == s2.num_host_frees + 2);
}

TEST_CASE("pinned batches feed a model on the GPU (the data-loading pattern)") {
  if (!gpu_or_skip()) return;
  manual_seed(3);
  nn::Linear lin(nn::LinearOptions(8, 4));
  Tensor w = lin.weight.detach().clone(), b = lin.bias.detach().clone();
  lin.to(Device::cuda());
  for (int step = 0; step < 4; ++step) {
    Tensor batch = randn({16, 8}).pin_memory();
    Tensor y = lin(batch.to(Device::cuda(), true)).cpu();
    Tensor ref = matmul(batch, w.t()) + b;
    CHECK(amax(abs(y - ref)).item<double>() < 1e-5);
  }
}
