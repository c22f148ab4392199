// ASCender attention benchmark (not a test): one attention layer, B4, d_model 128, 2 heads of 64, k 16,
// d_z = d_a = 16, float32, forward and forward + backward (gradient of the output's sum), in one run:
//   dense        our MultiHeadAttention (fused scaled-dot-product kernel)
//   reference    AscenderAttention through the composed reference (every (B, H, n, n) intermediate built)
//   fused        AscenderAttention through the fused CPU kernel (ops/cpu/ascender.cpp)
//   windowed     fused, AscenderMode::Windowed (w 128, g 4): each block of rows visits only its window's keys, O(n w)
//   reuse        fused, AscenderMode::Reuse
//   seed-torch   the PyTorch reference head of the method description (tools/ascender_seed_reference.py, a twin of
//                that code with its behaviour; Debian's python3-torch), same sizes, same thread count
// Columns: best-of-reps milliseconds, peak CPU memory of forward + backward above what was live before
// (asc::cpu_memory_stats: tensors and kernel scratch in blocks above 4 KiB), the matrix-product FLOPs of attention (an
// analytic count, below), tokens per second of forward + backward, and each row's time relative to dense.
//   ./build/release/tools/bench_ascender [--n 128,512,1024,2048] [--reps 3] [--csv out.csv] [--json out.json]
//                                        [--no-torch] [--impl dense,reference,fused,windowed,reuse] [--device cpu|cuda]
//                                        [--dtype float32|bfloat16|float16] [--tf32]
// --dtype sets the layer's parameters and input (GPU only for the 16-bit types, which the fused kernels compute in
// float32); --tf32 lets float32 products use TF32 tensor cores on the GPU
// (asc::cuda::set_allow_tf32). The TFLOP/s column divides the forward's analytic FLOPs by the forward + backward time.
// --device cuda (a GPU build on a GPU machine) runs our rows on the GPU: times after a device synchronisation, peak
// memory from the caching allocator's statistics, no seed-torch row (the GPU target is fused ASCender against
// our fused dense attention at n = 4096, e.g. --device cuda --n 1024,4096,16384 --impl dense,fused,windowed).
// With windowed rows at n and 4n (e.g. --n 2048,8192 --impl windowed), it also prints how the windowed time grows.
// The seed twin is found beside an installed binary (<prefix>/share/ascender/) or in the source tree (tools/cli.h:
// twin_path). --help lists the options; a bad value exits 2 (tools/cli.h). Progress on stderr, one step per row.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ascender.h"
#include "tools/bench_util.h"
#include "tools/cli.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace asc;

namespace {

constexpr int64_t kBatch = 4, kDModel = 128, kHeads = 2, kK = 16, kDz = 16;

struct Result {
  std::string impl;
  int64_t n = 0;
  double fwd_ms = -1, fwd_bwd_ms = -1, peak_mb = -1, gflop = 0;
  std::string note;
};

// Matrix-product FLOPs of one layer's attention core (projections excluded), forward: dense 4 n² d per head;
// ASCender adds the affinity (2 n² d_a), the distances (2 n² d_z), the neighbour sum (2 n² d), the alignment
// scores (2 n² d), the centroids (2 n² d_z) and their distances (2 n² d_z). Windowed: n w instead of n².
double attention_gflop(const std::string& impl, int64_t n, int64_t window) {
  const double d = static_cast<double>(kDModel / kHeads), dz = kDz, da = kDz;
  const double pairs = impl == "windowed" ? static_cast<double>(n) * std::min<int64_t>(n, 2 * window) : double(n) * n;
  double per_pair = 4 * d;
  if (impl != "dense") per_pair += 2 * da + 2 * dz + 4 * d + 4 * dz;
  return kBatch * kHeads * pairs * per_pair / 1e9;
}

// TFLOP/s: the forward's analytic FLOPs (the GFLOP column) over the forward + backward time, the rate the GPU
// targets are stated in (a backward's products, about twice the forward's, are not counted).
double tflops(const Result& r) { return r.fwd_bwd_ms > 0 ? r.gflop / r.fwd_bwd_ms : 0.0; }

Device g_device = Device::cpu();
DType g_dtype = kFloat32;

Result run_ours(const std::string& impl, int64_t n, int reps) {
  manual_seed(0);
  std::shared_ptr<nn::Attention> attn;
  if (impl == "dense") {
    attn = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(kDModel, kHeads));
  } else {
    auto o = nn::AscenderAttentionOptions(kDModel, kHeads).k({kK}).d_z(kDz).d_a(kDz);
    if (impl == "windowed") o.mode(nn::AscenderMode::Windowed).window(128).global_tokens(4);
    if (impl == "reuse") o.mode(nn::AscenderMode::Reuse);
    attn = std::make_shared<nn::AscenderAttention>(o);
  }
  attn->eval();  // no dropout, no schedule steps
  attn->to(g_dtype);
  attn->to(g_device);
  set_ascender_backend(impl == "reference" ? AscenderBackend::Reference : AscenderBackend::Auto);
  Tensor x = randn({kBatch, n, kDModel}).to(g_dtype).to(g_device);
  Result r{impl, n};
  r.gflop = attention_gflop(impl, n, 128);
  const bench::FwdBwd t = bench::time_forward_backward(
      g_device, reps, [&] { return attn->attend(x, {}); }, [&] { attn->zero_grad(); });
  r.fwd_ms = t.fwd_ms, r.fwd_bwd_ms = t.fwd_bwd_ms, r.peak_mb = t.peak_mb;
  set_ascender_backend(AscenderBackend::Auto);
  return r;
}

// The seed twin's rows (one JSON object per n), or an empty map when PyTorch cannot run.
std::map<int64_t, Result> run_seed(const std::vector<int64_t>& ns, int reps) {
  std::map<int64_t, Result> out;
  const std::string twin = tools::twin_path("ascender_seed_reference.py");
  if (twin.empty()) return out;
  std::string list;
  for (int64_t n : ns) list += " " + std::to_string(n);
  const std::string cmd = tools::shell_quote(tools::torch_python()) + " " + tools::shell_quote(twin) + " --n" + list +
                          " --batch " + std::to_string(kBatch) + " --d-model " + std::to_string(kDModel) + " --heads " +
                          std::to_string(kHeads) + " --k " + std::to_string(kK) + " --d-z " + std::to_string(kDz) +
                          " --reps " + std::to_string(reps) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[1024];
  while (fgets(buf, sizeof buf, p)) {
    const nlohmann::json j = nlohmann::json::parse(buf, nullptr, /*allow_exceptions=*/false);
    auto number = [&](const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : -1.0; };
    if (!j.is_object() || number("n") < 0) continue;  // not one of the twin's rows
    Result r{"seed-torch", static_cast<int64_t>(number("n"))};
    r.fwd_ms = number("forward_ms"), r.fwd_bwd_ms = number("fwd_bwd_ms");
    r.gflop = attention_gflop("seed-torch", r.n, 0);
    r.note = "PyTorch twin of the method's reference code (self-gather, unbiased std; docs/ascender.md §12.4)";
    out[r.n] = r;
  }
  if (pclose(p) != 0) out.clear();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ns = {128, 512, 1024, 2048};
  int reps = 3;
  bool no_torch = false;
  std::string device = "cpu", dtype = "float32";
  bool tf32 = false;
  tools::Outputs out;
  const std::vector<std::string> known = {"dense", "reference", "fused", "windowed", "reuse"};
  std::vector<std::string> impls = known;
  CLI::App app{
      "bench_ascender: one attention layer, dense against ASCender (reference, fused, windowed, reuse) and "
      "the PyTorch seed twin (tools/ascender_seed_reference.py), forward and forward + backward",
      "bench_ascender"};
  app.option_defaults()->always_capture_default();
  tools::add_int_list(app, "--n", ns, "sequence lengths", 1, 1 << 20);
  app.add_option("--reps", reps, "repetitions per measurement (best counts)")->check(tools::int_range(1, 1000));
  tools::add_name_list(app, "--impl", impls, "rows to run", known);
  app.add_flag("--no-torch", no_torch, "do not run the PyTorch seed twin");
  app.add_option("--device", device, "where our rows run (cuda: a CUDA build on a GPU machine)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype, "the layer's parameters and input")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_flag("--tf32", tf32, "float32 products on TF32 tensor cores (GPU)");
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  bool torch = !no_torch;
  if (device == "cuda") g_device = Device::cuda();
  g_dtype = dtype == "bfloat16" ? kBFloat16 : dtype == "float16" ? kFloat16 : kFloat32;
  tools::ProfileRun profile_run(out.profile);
  return tools::guarded("bench_ascender", [&] {
    if (g_device.is_cuda() && !cuda::is_available()) {
      std::fprintf(stderr, "bench_ascender: --device cuda needs a CUDA build on a machine with a GPU\n");
      return 2;
    }
    if (!g_device.is_cuda() && g_dtype != kFloat32) {
      std::fprintf(stderr, "bench_ascender: --dtype %s needs --device cuda (the CPU backend's products take float32)\n",
                   dtype.c_str());
      return 2;
    }
    if (g_device.is_cuda()) torch = false;   // the seed reference is a CPU row
    if (g_dtype != kFloat32) torch = false;  // the seed twin runs float32
    if (tf32) cuda::set_allow_tf32(true);
    setenv("OMP_NUM_THREADS", "2", 1);  // the PyTorch child gets the same two threads
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif

    std::vector<Result> rows;
    tools::Progress progress(static_cast<int64_t>(ns.size() * impls.size()) + (torch ? 1 : 0), "bench_ascender");
    int64_t done = 0;
    std::map<int64_t, Result> seed = torch ? run_seed(ns, reps) : std::map<int64_t, Result>{};
    if (torch) progress.update(++done, "seed-torch");
    if (torch && seed.empty()) {
      progress.clear();
      tools::print_twin_failure("seed-torch", "ascender_seed_reference.py");
    }
    for (int64_t n : ns) {
      for (const std::string& impl : impls) {
        rows.push_back(run_ours(impl, n, reps));
        progress.update(++done, fmt::format("{} n {}: {:.2f} ms f+b", impl, n, rows.back().fwd_bwd_ms));
      }
      if (seed.count(n)) rows.push_back(seed[n]);
    }
    progress.finish();

    std::printf("\nattention layer, B%lld, d_model %lld, %lld heads, k %lld, d_z = d_a = %lld, %s%s, %s\n",
                (long long)kBatch, (long long)kDModel, (long long)kHeads, (long long)kK, (long long)kDz, dtype.c_str(),
                tf32 ? " (TF32 allowed)" : "", g_device.is_cuda() ? "CUDA device 0" : "2 threads");
    std::printf("%s\n", tools::cpu_line().c_str());
    std::printf("%-11s %6s %10s %10s %9s %9s %9s %11s %9s\n", "impl", "n", "fwd ms", "f+b ms", "peak MB", "GFLOP",
                "TFLOP/s", "tokens/s", "f+b/dense");
    std::map<int64_t, double> dense;
    for (const Result& r : rows)
      if (r.impl == "dense") dense[r.n] = r.fwd_bwd_ms;
    for (const Result& r : rows) {
      const double tps = r.fwd_bwd_ms > 0 ? kBatch * r.n / (r.fwd_bwd_ms / 1e3) : 0;
      std::printf("%-11s %6lld %10.2f %10.2f %9s %9.2f %9.3f %11.0f %9.2f\n", r.impl.c_str(), (long long)r.n, r.fwd_ms,
                  r.fwd_bwd_ms, r.peak_mb >= 0 ? std::to_string(static_cast<int>(r.peak_mb)).c_str() : "-", r.gflop,
                  tflops(r), tps, dense.count(r.n) ? r.fwd_bwd_ms / dense[r.n] : 0.0);
    }
    std::map<int64_t, double> windowed;
    for (const Result& r : rows)
      if (r.impl == "windowed") windowed[r.n] = r.fwd_bwd_ms;
    for (auto [n, ms] : windowed)
      if (windowed.count(4 * n))
        std::printf("windowed f+b, n = %lld vs n = %lld: %.2fx the time for 4x the tokens (linear: 4)\n",
                    (long long)(4 * n), (long long)n, windowed[4 * n] / ms);
    tools::Table table({"impl", "n", "dtype", "forward_ms", "fwd_bwd_ms", "peak_mb", "attention_gflop",
                        "fwd_bwd_tflops", "tokens_per_s", "ratio_to_dense", "note"});
    for (const Result& r : rows)
      table.add({tools::Cell::str(r.impl), tools::Cell::integer(r.n),
                 tools::Cell::str(r.impl == "seed-torch" ? std::string("float32") : dtype),
                 tools::Cell::fixed(r.fwd_ms, 3), tools::Cell::fixed(r.fwd_bwd_ms, 3), tools::Cell::fixed(r.peak_mb, 1),
                 tools::Cell::fixed(r.gflop, 3), tools::Cell::fixed(tflops(r), 4),
                 tools::Cell::fixed(kBatch * r.n / (r.fwd_bwd_ms / 1e3), 0),
                 tools::Cell::fixed(dense.count(r.n) ? r.fwd_bwd_ms / dense[r.n] : 0.0, 3), tools::Cell::str(r.note)});
    auto facts = tools::run_facts("bench_ascender", argc, argv);
    facts["device"] = g_device.is_cuda() ? "cuda" : "cpu";
    facts["threads"] = 2;
    facts["dtype"] = dtype;
    facts["tf32"] = tf32;
    if (!tools::write_results(table, out, facts, /*announce=*/true)) return 1;
    return 0;
  });
}
