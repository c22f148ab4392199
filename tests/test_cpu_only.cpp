// A program that links only ascender::ascender (the CPU library; this test is built without ascender::cuda in every
// build, tests/CMakeLists.txt): CUDA is absent, clearly. The public CUDA API answers "no", creating a CUDA tensor is an
// asc::Error, and an op that meets a CUDA tensor anyway (a stand-in allocator makes one) is refused by the dispatch
// with a message naming the library to link. tools/check_package.sh checks the other half: such a program loads no
// CUDA library (ldd, and the loader's own trace).
#include "ascender.h"
#include "cuda/cuda.h"
#include "testing.h"

using namespace asc;

TEST_CASE("without the CUDA backend library the CUDA API says so and answers no") {
  CHECK_FALSE(cuda::is_built());
  CHECK_FALSE(cuda::is_available());
  CHECK(cuda::device_count() == 0);
  CHECK(cuda::memory_stats().allocated == 0);
  CHECK(cuda::pinned_memory_stats().num_host_allocs == 0);
  CHECK_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);  // a setting with nothing to set: ignored, as on a machine without a GPU
  CHECK_FALSE(cuda::allow_tf32());
  cuda::empty_cache();
  cuda::empty_pinned_cache();
  testing::check_error([] { cuda::synchronize(); }, {"cuda::synchronize", "does not link the CUDA backend"});
  testing::check_error([] { (void)cuda::device_name(0); }, {"does not link the CUDA backend"});
  int dummy = 0;
  testing::check_error([&] { cuda::record_stream(&dummy, 0); }, {"does not link the CUDA backend"});
  testing::check_error([] { const DeviceScope scope(Device::cuda()); }, {"cuda:0", "ascender::cuda"});
  const DeviceScope on_cpu(Device::cpu());  // a CPU scope is a no-op
}

TEST_CASE("without the CUDA backend library no CUDA tensor is made, and ops refuse one") {
  testing::check_error(
      [] {
        (void)Tensor::empty({2, 3}, {.device = Device::cuda()});
      },
      {"no CUDA device", "ascender::cuda"});
  testing::check_error([] { (void)ones({2}).to(Device::cuda()); }, {"no CUDA device"});

  const testing::HostMemoryAsCuda fake;
  Tensor x = ones({2, 3}).to(Device::cuda());
  REQUIRE(x.device() == Device::cuda());
  testing::check_error([&] { (void)exp(x); }, {"no kernel for device cuda:0", "ascender::cuda"});
  testing::check_error([&] { (void)add(x, x); }, {"no kernel for device", "ascender::cuda"});
  testing::check_error([&] { (void)matmul(x, x.t()); }, {"no kernel for device"});
  CHECK(ones({2, 3}).sum().item<float>() == 6.0f);  // the CPU path is untouched
}
