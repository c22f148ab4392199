// ASAM benchmark (not a test): attention on projected heads, B1 (--batch), 4 heads of 64, float32, forward and forward
// + backward (gradient of the output's sum), peak memory, in one run per n:
//   naive        dense attention through the composed ops: the (B, H, n, n) scores and probabilities materialised
//                (the seed's "standard attention"); skipped where its buffers would not fit in --naive-gb
//   chunked      our fused dense kernel (ops/cpu/attention.cpp: a (64, n) tile per block of query rows)
//   window       sparse attention, local window w 256 (ops/sparse_attention.h)
//   strided      stride 64 (n / 64 keys per query)
//   random       32 random keys per query
//   global       16 global tokens
//   clustered    n / 256 centroids per head (at least 8), θ 0.5, τ 1: buckets of about 256 tokens; the pattern is
//                built from q on every call, as the layer builds it (clustered_union: the bucket walk on the CPU,
//                kernels on CUDA; the assignments and the construction are included in the time)
//   hierarchical blocks of round(√n) tokens plus one mean-pooled summary per other block (pooling included)
//   hier-kernel  the same pattern with the summaries pooled once beforehand: the sparse kernel alone
//   hier-composed  hierarchical with the summaries made by the composition hierarchical_keys replaces (cat of x and
//                hierarchical_summaries' means), for the side-by-side comparison
//   w+g+r        window 256 + 16 global + 16 random
//   asam         the gated AsamAttention layer (d_model 256; window + global + random; projections, gate and both
//                branches), training mode
//   asam-skip    the same layer in eval mode with skip_dense_above 0.01: every (sample, head) skips the dense branch
//                (forward only: skipping is an inference option)
//   mha          our MultiHeadAttention layer (d_model 256, 4 heads), for the layer rows' comparison
// Columns: best-of-reps milliseconds, peak CPU memory of forward + backward above what was live before
// (asc::cpu_memory_stats: tensors and kernel scratch in blocks above 4 KiB), attended (query, key) pairs per head, and
// each row's forward + backward time relative to chunked dense at the same n. Then the seed's claimed speedups beside
// ours, and the performance targets (window ≥ 10× chunked at n = 16384; window time and memory at 16384 ≤ 4.6× 4096;
// each pattern's rate per attended pair, forward and forward + backward, ≥ 70 % of chunked's at the same n).
//   ./build/release/tools/bench_asam [--n 512,1024,2048,4096,8192,16384] [--reps 3] [--csv out.csv] [--json out.json]
//                                    [--impl naive,chunked,window,...] [--naive-gb 6] [--device cpu|cuda]
//                                    [--dtype float32|bfloat16|float16] [--tf32] [--batch 1]
// --device cuda (a GPU build on a GPU machine) runs every row on the GPU, in bfloat16 unless --dtype says otherwise
// (the fused dense path is then cuDNN's, which takes bf16/f16; sparse attention runs on tensor cores for bf16 / f16,
// and for float32 with --tf32); --batch B sets the batch (B·H = 32 at --batch 8): times after a device synchronisation,
// peak memory from the caching allocator, and a TFLOP/s column counted on attended pairs (4 D FLOPs per pair forward)
// for the GPU target: window attention at n = 16384 at >= 70% of the dense kernel's rate, e.g. --device cuda
// --n 4096,16384 --impl chunked,window.
// --help lists the options; a bad value exits 2 (tools/cli.h). Progress on stderr, one step per row.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

constexpr int64_t kHeads = 4, kDHead = 64, kWindow = 256;

int64_t g_batch = 1;  // --batch

Device g_device = Device::cpu();
DType g_dtype = kFloat32;

// A random leaf tensor of the run's device and dtype.
Tensor leaf(const Shape& s, bool grad = true) {
  Tensor t = randn(s).to(g_device).to(g_dtype).detach();
  if (grad) t.set_requires_grad(true);
  return t;
}

struct Result {
  std::string impl;
  int64_t n = 0;
  double fwd_ms = -1, fwd_bwd_ms = -1, peak_mb = -1, pairs = 0;
  std::string note;
};

// Times fwd as a forward under no-grad and as forward + backward, with the peak memory of the latter.
Result measure(const std::string& impl, int64_t n, int reps, const std::function<Tensor()>& fwd,
               const std::function<void()>& zero_grad, bool backward = true) {
  const bench::FwdBwd t = bench::time_forward_backward(g_device, reps, fwd, zero_grad, backward);
  Result r{impl, n};
  r.fwd_ms = t.fwd_ms, r.fwd_bwd_ms = t.fwd_bwd_ms, r.peak_mb = t.peak_mb;
  return r;
}

Result run(const std::string& impl, int64_t n, int reps, double naive_gb) {
  manual_seed(0);
  const int64_t D = kHeads * kDHead;
  if (impl == "asam" || impl == "asam-skip" || impl == "mha") {
    std::shared_ptr<nn::Attention> layer;
    if (impl == "mha") {
      layer = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(D, kHeads));
    } else {
      auto o = nn::AsamAttentionOptions(D, kHeads)
                   .patterns({"window", "global", "random"})
                   .window(kWindow)
                   .global_tokens(16)
                   .random_keys(16);
      if (impl == "asam-skip") o.skip_dense_above(0.01);
      layer = std::make_shared<nn::AsamAttention>(o);
    }
    if (impl == "asam-skip") layer->eval();
    layer->to(g_device);
    layer->to(g_dtype);
    Tensor x = leaf({g_batch, n, D}, false);
    Result r = measure(
        impl, n, reps, [&] { return layer->attend(x, {}); }, [&] { layer->zero_grad(); }, impl != "asam-skip");
    if (auto a = std::dynamic_pointer_cast<nn::AsamAttention>(layer))
      r.pairs = static_cast<double>(a->pattern(n, false).nnz());
    if (impl == "asam") r.note = "both branches";
    if (impl == "asam-skip")
      r.note = fmt::format("skipped dense in {}/{} (sample, head)",
                           std::dynamic_pointer_cast<nn::AsamAttention>(layer)->dense_skipped(),
                           std::dynamic_pointer_cast<nn::AsamAttention>(layer)->dense_considered());
    return r;
  }
  Tensor q = leaf({g_batch, kHeads, n, kDHead}), k = leaf({g_batch, kHeads, n, kDHead}),
         v = leaf({g_batch, kHeads, n, kDHead});
  auto zero = [&] {
    for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  };
  if (impl == "naive" || impl == "chunked") {
    const double need_gb = 5.0 * g_batch * kHeads * double(n) * n * 4 / 1e9;  // scores, probs, and their gradients
    if (impl == "naive" && need_gb > naive_gb) {
      Result r{impl, n};
      r.note = fmt::format("skipped: needs about {:.0f} GB of (n, n) buffers (--naive-gb {})", need_gb, naive_gb);
      return r;
    }
    set_sdpa_backend(impl == "naive" ? SdpaBackend::Math : SdpaBackend::Fused);
    Result r = measure(
        impl, n, reps, [&] { return scaled_dot_product_attention(q, k, v, SdpaOptions{}); }, zero);
    set_sdpa_backend(SdpaBackend::Auto);
    r.pairs = double(n) * n;
    return r;
  }
  SparsePattern p;
  std::function<Tensor()> fwd;
  if (impl == "window") p = local_window_pattern(n, kWindow, false);
  if (impl == "strided") p = strided_pattern(n, 64, false);
  if (impl == "random") p = random_keys_pattern(n, 32, 1, false);
  if (impl == "global") p = global_tokens_pattern(n, 16, false);
  if (impl == "w+g+r")
    p = pattern_union({local_window_pattern(n, kWindow, false), global_tokens_pattern(n, 16, false),
                       random_keys_pattern(n, 16, 1, false)});
  if (p.defined()) {
    fwd = [&] { return sparse_attention(q, k, v, p); };
  } else if (impl == "clustered") {
    const Tensor C = randn({kHeads, std::max<int64_t>(8, n / 256), kDHead}).to(g_device).to(g_dtype);
    // As the layer builds it: united with a (here empty) shared pattern by clustered_union, on CUDA by kernels.
    const SparsePattern none =
        SparsePattern::from_rows(1, n, n, std::vector<std::vector<int64_t>>(n)).to(g_device);  // moved once
    fwd = [&, C, none] {
      const Tensor a = softmax(matmul(q.detach(), C.unsqueeze(0).transpose(-2, -1)), -1);
      p = clustered_union(none, a, 0.5, false);
      return sparse_attention(q, k, v, p);
    };
  } else if (impl == "hierarchical" || impl == "hier-kernel" || impl == "hier-composed") {
    const int64_t b = std::llround(std::sqrt(double(n)));
    p = hierarchical_pattern(n, b, false);
    auto with_summaries = [b](const Tensor& x) { return hierarchical_keys(x, b); };
    if (impl == "hier-composed") {
      fwd = [&, b] {
        return sparse_attention(q, cat({k, hierarchical_summaries(k, b).means}, 2),
                                cat({v, hierarchical_summaries(v, b).means}, 2), p);
      };
    } else if (impl == "hier-kernel") {  // pooled once, outside the timing: the kernel alone
      k = with_summaries(k).detach().set_requires_grad(true);
      v = with_summaries(v).detach().set_requires_grad(true);
      fwd = [&] { return sparse_attention(q, k, v, p); };
    } else {
      fwd = [&, with_summaries] { return sparse_attention(q, with_summaries(k), with_summaries(v), p); };
    }
  } else {
    ASC_THROW("bench_asam: unknown --impl '{}'", impl);
  }
  Result r = measure(impl, n, reps, fwd, zero);
  r.pairs = static_cast<double>(p.nnz()) / static_cast<double>(p.groups());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ns = {512, 1024, 2048, 4096, 8192, 16384};
  const std::vector<std::string> known = {"naive",  "chunked",   "window",       "strided",     "random",
                                          "global", "clustered", "hierarchical", "hier-kernel", "hier-composed",
                                          "w+g+r",  "asam",      "asam-skip",    "mha"};
  std::vector<std::string> impls = known;
  int reps = 3;
  double naive_gb = 6;
  std::string device = "cpu";
  tools::Outputs out;
  CLI::App app{
      "bench_asam: dense attention (naive, chunked) against the sparse patterns and the ASAM layer, "
      "forward and forward + backward, peak memory",
      "bench_asam"};
  app.option_defaults()->always_capture_default();
  tools::add_int_list(app, "--n", ns, "sequence lengths", 1, 1 << 20);
  tools::add_name_list(app, "--impl", impls, "rows to run", known);
  app.add_option("--reps", reps, "repetitions per measurement after a warm-up, best counts")
      ->check(tools::int_range(1, 1000));
  app.add_option("--naive-gb", naive_gb, "skip naive where its (n, n) buffers would need more GB")
      ->check(tools::real_range(0, 1e6));
  app.add_option("--device", device, "where the rows run (cuda: a CUDA build on a GPU machine)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  std::string dtype;
  bool tf32 = false;
  app.add_option("--dtype", dtype, "the heads' dtype (default: float32 on the CPU, bfloat16 on CUDA)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_flag("--tf32", tf32, "CUDA float32: products on TF32 tensor cores (asc::cuda::set_allow_tf32)");
  app.add_option("--batch", g_batch, "batch size B (heads: 4 of 64)")->check(tools::int_range(1, 4096));
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  if (device == "cuda") {
    if (!cuda::is_available()) {
      std::fprintf(stderr, "bench_asam: --device cuda needs a CUDA build and a GPU\n");
      return 2;
    }
    g_device = Device::cuda(), g_dtype = dtype == "float32" ? kFloat32 : dtype == "float16" ? kFloat16 : kBFloat16;
    cuda::set_allow_tf32(tf32);
  } else if ((!dtype.empty() && dtype != "float32") || tf32) {
    tools::usage_error(app, "--dtype other than float32 and --tf32 need --device cuda");
  }
  tools::ProfileRun profile_run(out.profile);
  return tools::guarded("bench_asam", [&] {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    std::printf("bench_asam: B%lld, %lld heads of %lld, %s%s, %s, %d threads, best of %d\n", (long long)g_batch,
                (long long)kHeads, (long long)kDHead, std::string(dtype_name(g_dtype)).c_str(),
                tf32 ? " (TF32 allowed)" : "", g_device.is_cuda() ? "CUDA" : "CPU", threads, reps);
    std::printf("%s\n", tools::cpu_line().c_str());
    std::printf("%-12s %6s %10s %10s %9s %12s %9s %8s  %s\n", "impl", "n", "fwd ms", "f+b ms", "peak MB", "pairs/head",
                "vs chunk", "fwd TF/s", "note");
    std::vector<Result> all;
    std::map<int64_t, double> chunked_ms;
    tools::Progress progress(static_cast<int64_t>(ns.size() * impls.size()), "bench_asam");
    for (int64_t n : ns)
      for (const std::string& impl : impls) {
        progress.update(static_cast<int64_t>(all.size()), fmt::format("{} n {}", impl, n));
        Result r = run(impl, n, reps, naive_gb);
        progress.clear();
        if (impl == "chunked") chunked_ms[n] = r.fwd_bwd_ms;
        all.push_back(r);
        const double c = chunked_ms.count(n) ? chunked_ms[n] : -1;
        const std::string ratio = (c > 0 && r.fwd_bwd_ms > 0) ? fmt::format("{:.2f}x", c / r.fwd_bwd_ms) : "-";
        // FLOPs counted on attended pairs: q·k and p·v, 2 D each, per pair and head.
        const double tflops = r.fwd_ms > 0 ? g_batch * kHeads * r.pairs * 4.0 * kDHead / (r.fwd_ms * 1e-3) / 1e12 : 0;
        std::printf("%-12s %6lld %10s %10s %9s %12.0f %9s %8.3f  %s\n", impl.c_str(), (long long)n,
                    r.fwd_ms >= 0 ? fmt::format("{:.2f}", r.fwd_ms).c_str() : "-",
                    r.fwd_bwd_ms >= 0 ? fmt::format("{:.2f}", r.fwd_bwd_ms).c_str() : "-",
                    r.peak_mb >= 0 ? fmt::format("{:.0f}", r.peak_mb).c_str() : "-", r.pairs, ratio.c_str(), tflops,
                    r.note.c_str());
        std::fflush(stdout);
      }
    progress.finish();
    auto find = [&](const std::string& impl, int64_t n) -> const Result* {
      for (const Result& r : all)
        if (r.impl == impl && r.n == n) return &r;
      return nullptr;
    };
    // The seed's claim: ASAM vs standard attention, 1.52x at 512, 2.48x at 1024, 4.23x at 2048 (A100, batch 2, width
    // 512). Ours: the asam layer against the naive dense core plus the same projections (mha's time minus chunked's
    // core would be a guess, so the two layer rows are compared: asam vs mha), and the skip row's forward.
    const std::map<int64_t, double> claim = {{512, 1.52}, {1024, 2.48}, {2048, 4.23}};
    std::printf("\nseed claim beside ours (speed-up of ASAM over standard attention; > 1 = ASAM faster)\n");
    std::printf("%6s %8s %18s %18s %22s %22s\n", "n", "claimed", "asam/mha f+b", "asam/mha fwd", "asam-skip/mha fwd",
                "w+g+r/naive f+b");
    for (int64_t n : ns) {
      const Result *a = find("asam", n), *s = find("asam-skip", n), *m = find("mha", n), *w = find("w+g+r", n),
                   *nv = find("naive", n);
      auto ratio = [](const Result* x, const Result* y, bool fb) -> std::string {
        if (!x || !y) return "-";
        const double a = fb ? x->fwd_bwd_ms : x->fwd_ms, b = fb ? y->fwd_bwd_ms : y->fwd_ms;
        return a > 0 && b > 0 ? fmt::format("{:.2f}x", b / a) : "-";
      };
      std::printf("%6lld %8s %18s %18s %22s %22s\n", (long long)n,
                  claim.count(n) ? fmt::format("{:.2f}x", claim.at(n)).c_str() : "-", ratio(a, m, true).c_str(),
                  ratio(a, m, false).c_str(), ratio(s, m, false).c_str(), ratio(w, nv, true).c_str());
    }
    // The performance targets, where this run measured what they compare.
    const Result *w16 = find("window", 16384), *c16 = find("chunked", 16384), *w4 = find("window", 4096);
    const bool speed = w16 && c16 && w16->fwd_bwd_ms > 0 && c16->fwd_bwd_ms > 0,
               growth = w16 && w4 && w4->fwd_bwd_ms > 0;
    std::printf("\ntargets%s\n",
                speed || growth ? "" : ": not measured (window and chunked dense at n = 4096 and 16384)");
    if (speed)
      std::printf("  window (w 256) f+b vs chunked dense at n = 16384: %.1fx faster (target >= 10x): %s\n",
                  c16->fwd_bwd_ms / w16->fwd_bwd_ms, c16->fwd_bwd_ms / w16->fwd_bwd_ms >= 10 ? "met" : "NOT met");
    if (growth)
      std::printf("  window growth 4096 -> 16384: time %.2fx, peak memory %.2fx (target <= 4.6x each): %s\n",
                  w16->fwd_bwd_ms / w4->fwd_bwd_ms, w16->peak_mb / w4->peak_mb,
                  (w16->fwd_bwd_ms / w4->fwd_bwd_ms <= 4.6 && w16->peak_mb / w4->peak_mb <= 4.6) ? "met" : "NOT met");
    // Sparse attention at dense efficiency: a pattern's rate per attended pair over chunked's, where both ran.
    bool shares = false;
    for (const Result& r : all) {
      const Result* c = find("chunked", r.n);
      if (r.impl == "chunked" || r.impl == "naive" || r.pairs <= 0 || !c || c->fwd_ms <= 0 || r.fwd_ms <= 0) continue;
      if (r.impl == "asam" || r.impl == "asam-skip" || r.impl == "mha") continue;  // layers, not kernels
      if (!shares)
        std::printf(
            "\nrate per attended pair as a share of chunked dense's at the same n (target >= 70 %%), fwd / f+b\n");
      shares = true;
      const double per_pair = c->pairs;  // chunked: n x n pairs per head
      const double fwd = (c->fwd_ms / per_pair) / (r.fwd_ms / r.pairs);
      const double fb =
          r.fwd_bwd_ms > 0 && c->fwd_bwd_ms > 0 ? (c->fwd_bwd_ms / per_pair) / (r.fwd_bwd_ms / r.pairs) : -1;
      // three significant digits: a share far below the target (0.14 %) still reads as a number
      std::printf("  %-12s n %6lld: %.3g %% / %s\n", r.impl.c_str(), (long long)r.n, 100 * fwd,
                  fb >= 0 ? fmt::format("{:.3g} %", 100 * fb).c_str() : "-");
    }
    tools::Table table(
        {"impl", "n", "forward_ms", "fwd_bwd_ms", "peak_mb", "pairs_per_head", "speedup_vs_chunked", "note"});
    for (const Result& r : all) {
      const double c = chunked_ms.count(r.n) ? chunked_ms[r.n] : -1;
      table.add({tools::Cell::str(r.impl), tools::Cell::integer(r.n), tools::Cell::fixed(r.fwd_ms, 3),
                 tools::Cell::fixed(r.fwd_bwd_ms, 3), tools::Cell::fixed(r.peak_mb, 1), tools::Cell::fixed(r.pairs, 0),
                 tools::Cell::fixed(c > 0 && r.fwd_bwd_ms > 0 ? c / r.fwd_bwd_ms : -1.0, 3), tools::Cell::str(r.note)});
    }
    auto facts = tools::run_facts("bench_asam", argc, argv);
    facts["device"] = g_device.is_cuda() ? "cuda" : "cpu";
    facts["dtype"] = std::string(dtype_name(g_dtype));
    facts["tf32"] = tf32;
    facts["batch"] = g_batch;
    facts["threads"] = threads;
    if (!tools::write_results(table, out, facts, /*announce=*/true)) return 1;
    return 0;
  });
}
