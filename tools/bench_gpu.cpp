// GPU benchmark (not a test), run by tools/gpu_check.sh on a machine with an NVIDIA GPU:
//   ./build/release/tools/bench_gpu [--quick] [--csv out.csv] [--json out.json]
// Rows:
//   GEMM fp32 / TF32 / bf16 at 4096^3: TFLOP/s of asc::matmul next to a direct cublasGemmEx on the same buffers
//     (same run, interleaved, best of each) and their ratio (target >= 0.95);
//   elementwise add (float32, 2^26 elements) and softmax (float32, (65536, 1024)): GB/s against the device's
//     theoretical memory bandwidth (target >= 70%);
//   allocator: device mallocs during 100 steady-state training steps of a small MLP (target 0);
//   host->device copy of 256 MiB: GB/s from pinned memory (Tensor::pin_memory, non_blocking) next to the same copy
//     from pageable memory, and pinned-pool host allocations during 20 steady-state pin+copy steps (target 0).
// --quick: smaller sizes, 2 repetitions instead of 5. Without a GPU it says so and exits 0. --help lists the options
// (with or without a GPU); a bad value exits 2 (tools/cli.h). Progress on stderr, one step per row.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ascender.h"
#include "tools/cli.h"

#ifdef ASC_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/context.h"
#endif

using namespace asc;

namespace {

struct Row {
  std::string name, metric;
  double ours, reference, ratio;
  std::string note;
};

#ifdef ASC_HAVE_CUDA
// Seconds per call: best over `reps` batches of `inner` calls, each batch timed with CUDA events.
double gpu_time(const std::function<void()>& fn, int reps, int inner) {
  cudaEvent_t e0, e1;
  ASC_CUDA_CHECK(cudaEventCreate(&e0));
  ASC_CUDA_CHECK(cudaEventCreate(&e1));
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    ASC_CUDA_CHECK(cudaEventRecord(e0, cuda::current_stream()));
    for (int i = 0; i < inner; ++i) fn();
    ASC_CUDA_CHECK(cudaEventRecord(e1, cuda::current_stream()));
    ASC_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    ASC_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms / 1e3 / inner);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

double peak_bandwidth_gbs() {
  int dev = cuda::current_device(), clock_khz = 0, bus_bits = 0;
  ASC_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
  ASC_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
}

void gemm_rows(std::vector<Row>& rows, int64_t n, int reps) {
  struct Variant {
    const char* name;
    DType dtype;
    bool tf32;
    cudaDataType_t type;
    cublasComputeType_t compute;
  };
  for (Variant v : {Variant{"fp32", kFloat32, false, CUDA_R_32F, CUBLAS_COMPUTE_32F},
                    Variant{"tf32", kFloat32, true, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
                    Variant{"bf16", kBFloat16, false, CUDA_R_16BF, CUBLAS_COMPUTE_32F}}) {
    Generator g(1);
    Tensor a = randn({n, n}, {}, &g).to(Device::cuda()).to(v.dtype);
    Tensor b = randn({n, n}, {}, &g).to(Device::cuda()).to(v.dtype);
    Tensor c = empty({n, n}, {v.dtype, Device::cuda()});
    cuda::set_allow_tf32(v.tf32);
    auto ours = [&] { c = matmul(a, b); };
    const float one = 1, zero = 0;
    auto ref = [&] {  // C^T = B^T A^T in column-major, as asc::matmul does
      ASC_CUBLAS_CHECK(cublasGemmEx(cuda::cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.raw_data(),
                                    v.type, n, a.raw_data(), v.type, n, &zero, c.raw_data(), v.type, n, v.compute,
                                    CUBLAS_GEMM_DEFAULT));
    };
    double t_ours = 1e30, t_ref = 1e30;
    for (int r = 0; r < reps; ++r) {
      t_ours = std::min(t_ours, gpu_time(ours, 1, 10));
      t_ref = std::min(t_ref, gpu_time(ref, 1, 10));
    }
    cuda::set_allow_tf32(false);
    const double tflop = 2.0 * n * n * n / 1e12;
    rows.push_back({fmt::format("GEMM {} {}^3", v.name, n), "TFLOP/s", tflop / t_ours, tflop / t_ref, t_ref / t_ours,
                    "ref: direct cublasGemmEx; target ratio >= 0.95"});
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  tools::Outputs out;
  CLI::App app{
      "bench_gpu: GEMM against cuBLAS, memory-bound kernels against the bandwidth, allocator and pinned-copy "
      "counters, attention paths (needs an NVIDIA GPU)",
      "bench_gpu"};
  app.add_flag("--quick", quick, "smaller sizes, 2 repetitions instead of 5");
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  tools::ProfileRun profile_run(out.profile);
  return tools::guarded("bench_gpu", [&] {
    if (!cuda::is_available()) {
      std::printf("bench_gpu: no CUDA device available (this build %s CUDA); nothing to measure\n",
#ifdef ASC_HAVE_CUDA
                  "has"
#else
                  "lacks"
#endif
      );
      return 0;
    }
#ifdef ASC_HAVE_CUDA
    const int reps = quick ? 2 : 5;
    std::vector<Row> rows;
    const double bw = peak_bandwidth_gbs();
    std::printf("device: %s, theoretical memory bandwidth %.0f GB/s\n", cuda::device_name().c_str(), bw);
    std::fflush(stdout);
    tools::Progress progress(10, "bench_gpu");  // 3 GEMM, add, softmax, allocator, 2 attention, 2 transfer rows
    auto tick = [&] { progress.update(static_cast<int64_t>(rows.size()), rows.back().name); };

    gemm_rows(rows, quick ? 2048 : 4096, reps);
    tick();

    {  // elementwise add: 2 reads + 1 write
      const int64_t n = int64_t{1} << (quick ? 24 : 26);
      Tensor x = rand({n}, {.device = Device::cuda()}), y = rand({n}, {.device = Device::cuda()});
      Tensor z;
      double t = gpu_time([&] { z = add(x, y); }, reps, 10);
      double gbs = 3.0 * n * 4 / t / 1e9;
      rows.push_back(
          {"add fp32 (contiguous)", "GB/s", gbs, bw, gbs / bw, "ref: theoretical bandwidth; target >= 0.70"});
    }
    tick();
    {  // softmax over the last dim: 1 read + 1 write
      const int64_t r = quick ? 16384 : 65536, c = 1024;
      Tensor x = randn({r, c}, {.device = Device::cuda()});
      Tensor y;
      double t = gpu_time([&] { y = softmax(x, -1); }, reps, 10);
      double gbs = 2.0 * r * c * 4 / t / 1e9;
      rows.push_back(
          {"softmax fp32 (65536, 1024)", "GB/s", gbs, bw, gbs / bw, "ref: theoretical bandwidth; target >= 0.70"});
    }
    tick();
    {  // allocator: device mallocs in steady-state training
      manual_seed(0);
      auto mlp = std::make_shared<nn::MLP>(nn::MLPOptions({256, 1024, 1024, 10}));
      mlp->to(Device::cuda());
      optim::AdamW opt(mlp->parameters(), {.lr = 1e-3});
      Tensor x = randn({512, 256}, {.device = Device::cuda()});
      Tensor y = randint(0, 10, {512}, {.dtype = kInt64, .device = Device::cuda()});
      auto step = [&] {
        opt.zero_grad();
        cross_entropy((*mlp)(x), y).backward();
        opt.step();
      };
      for (int i = 0; i < 5; ++i) step();  // warm-up fills the cache
      cuda::synchronize();
      uint64_t before = cuda::memory_stats().num_device_mallocs;
      for (int i = 0; i < 100; ++i) step();
      cuda::synchronize();
      uint64_t mallocs = cuda::memory_stats().num_device_mallocs - before;
      rows.push_back({"allocator: device mallocs in 100 steps", "count", static_cast<double>(mallocs), 0, 0,
                      "MLP 256-1024-1024-10, AdamW; target 0"});
    }
    tick();

    {  // attention: cuDNN flash attention vs the composed ops, bf16, forward + backward
      const int64_t B = 8, H = 16, T = quick ? 512 : 1024, D = 64;
      auto make = [&] {
        Tensor t = randn({B, T, H, D}, {.device = Device::cuda()}).to(kBFloat16).permute({0, 2, 1, 3});
        t.set_requires_grad(true);
        return t;
      };
      Tensor q = make(), k = make(), v = make();
      auto step = [&] { nn::scaled_dot_product_attention(q, k, v, {.causal = true}).sum().backward(); };
      const std::string choice = nn::sdpa_choice(q, k, v, {.causal = true});
      const double fused = gpu_time(step, reps, 3);
      nn::set_sdpa_backend(nn::SdpaBackend::Math);
      const double math = gpu_time(step, reps, 3);
      nn::set_sdpa_backend(nn::SdpaBackend::Auto);
      rows.push_back({fmt::format("attention bf16 causal fwd+bwd T={}", T), "ms", fused * 1e3, math * 1e3, math / fused,
                      "ref: composed ops (Math backend); auto path: " + choice});
    }
    tick();

    {  // attention: our flash kernel (cuda/flash_attention.cu) vs the composed ops, float32, forward + backward
      const int64_t B = 4, H = 8, T = quick ? 1024 : 2048, D = 64;
      auto make = [&] {
        Tensor t = randn({B, T, H, D}, {.device = Device::cuda()}).permute({0, 2, 1, 3});
        t.set_requires_grad(true);
        return t;
      };
      Tensor q = make(), k = make(), v = make();
      auto step = [&] { nn::scaled_dot_product_attention(q, k, v, {.causal = true}).sum().backward(); };
      const std::string choice = nn::sdpa_choice(q, k, v, {.causal = true});
      const double fused = gpu_time(step, reps, 3);
      nn::set_sdpa_backend(nn::SdpaBackend::Math);
      const double math = gpu_time(step, reps, 3);
      nn::set_sdpa_backend(nn::SdpaBackend::Auto);
      rows.push_back({fmt::format("attention float32 causal fwd+bwd T={}", T), "ms", fused * 1e3, math * 1e3,
                      math / fused, "ref: composed ops (Math backend); auto path: " + choice});
    }
    tick();

    {  // host->device transfers: pageable vs pinned, wall time of the whole copy (the host waits for both)
      const int64_t n = int64_t{1} << (quick ? 24 : 26);  // float32: 64 / 256 MiB
      Tensor host = rand({n});
      Tensor pinned = host.pin_memory();
      auto wall = [&](const Tensor& src, bool non_blocking) {
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          cuda::synchronize();
          auto t0 = std::chrono::steady_clock::now();
          Tensor d = src.to(Device::cuda(), non_blocking);
          cuda::synchronize();
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return best;
      };
      const double pageable = n * 4.0 / wall(host, false) / 1e9, pin = n * 4.0 / wall(pinned, true) / 1e9;
      rows.push_back({fmt::format("H2D copy fp32 {} MiB, pinned", n * 4 >> 20), "GB/s", pin, pageable, pin / pageable,
                      "ref: the same copy from pageable memory"});
      auto step = [&] { Tensor d = host.narrow(0, 0, n / 4).pin_memory().to(Device::cuda(), true); };
      for (int i = 0; i < 3; ++i) step();  // warm-up: the pool's blocks of this size (one may still be in a copy)
      cuda::synchronize();
      const uint64_t before = cuda::pinned_memory_stats().num_host_allocs;
      for (int i = 0; i < 20; ++i) step();
      cuda::synchronize();
      rows.push_back({"pinned pool: host allocs in 20 steps", "count",
                      static_cast<double>(cuda::pinned_memory_stats().num_host_allocs - before), 0, 0,
                      "pin_memory + non_blocking copy per step; target 0"});
    }
    tick();

    progress.finish();
    std::printf("\n%-40s %-8s %12s %12s %8s  %s\n", "benchmark", "metric", "ascender", "reference", "ratio", "notes");
    for (const Row& r : rows)
      std::printf("%-40s %-8s %12.3f %12.3f %8.3f  %s\n", r.name.c_str(), r.metric.c_str(), r.ours, r.reference,
                  r.ratio, r.note.c_str());
    tools::Table table({"benchmark", "metric", "ascender", "reference", "ratio", "notes"});
    for (const Row& r : rows)
      table.add({tools::Cell::str(r.name), tools::Cell::str(r.metric), tools::Cell::general(r.ours, 6),
                 tools::Cell::general(r.reference, 6), tools::Cell::general(r.ratio, 6), tools::Cell::str(r.note)});
    auto facts = tools::run_facts("bench_gpu", argc, argv);
    facts["device"] = cuda::device_name();
    facts["quick"] = quick;
    if (!tools::write_results(table, out, facts, /*announce=*/false)) return 1;
#endif
    return 0;
  });
}
