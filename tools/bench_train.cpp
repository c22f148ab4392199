// Training-step benchmark (not a test): one AdamW step of the Transformer classifier (models/) on CPU, next to
// the same model in PyTorch (tools/bench_train_torch.py, Debian's python3-torch) run from this binary, in
// alternating rounds, so the ratio is measured side by side.
//   ./build/release/tools/bench_train [--csv out.csv] [--json out.json] [--steps 20] [--rounds 2] [--threads 2]
//        [--no-torch] [--batch 16 --length 128 --width 128 --layers 2 --heads 4 --ffn 512]
// Prints ms/step (median of `steps` timed steps after 3 warm-up steps; best median over rounds) and the split
// into forward / backward / optimizer for ascender. --busy N starts N spinning processes for every measurement
// (both frameworks: the machine shared with another job), --torch-compile times the twin under torch.compile too,
// --memory measures each framework's peak resident set in a fresh process running only the steps. The twin is found
// beside an installed binary
// (<prefix>/share/ascender/) or in the source tree (tools/cli.h: twin_path). --help lists the options; a bad value
// exits 2 (tools/cli.h). Progress on stderr, one step per round of each framework. --bf16 also times both with their
// linear layers' and attention's products in bfloat16 (ours under CpuAutocast, core/autocast.h; PyTorch under
// torch.autocast("cpu"), which runs both the same way).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ascender.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#include "models/flops.h"
#include "models/transformer_classifier.h"
#include "optim/optim.h"
#include "tools/cli.h"

using namespace asc;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int64_t batch = 16, length = 128, width = 128, layers = 2, heads = 4, ffn = 512, vocab = 64, classes = 2;
  double dropout = 0.1;
  int steps = 20, rounds = 2, threads = 2, busy = 0;
  bool torch = true, torch_compile = false, memory = false, rss_child = false, bf16 = false;
  tools::Outputs out;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double step, fwd, bwd, opt;
  double flops = 0;  // one training step's FLOPs by models/flops.h (forward + backward of the batch)
  // One step's CPU matrix products, from profiled steps after the timed ones (profiler::Profile::cpu_gemm): their
  // FLOPs and the time inside their kernels. 0 when another profile was recording (--profile).
  double gemm_flops = 0, gemm_ms = 0;
};

Timing run_ours(const Config& c, bool bf16 = false) {
  std::optional<CpuAutocast> autocast;  // linear and attention products in bfloat16, forward and backward
  if (bf16) autocast.emplace();
  manual_seed(0);
  auto model =
      std::make_shared<models::TransformerClassifier>(models::TransformerClassifierOptions(c.vocab, c.length, c.classes)
                                                          .d_model(c.width)
                                                          .heads(c.heads)
                                                          .layers(c.layers)
                                                          .ffn(c.ffn)
                                                          .dropout(c.dropout));
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  Generator g(1);
  Tensor tokens = randint(0, c.vocab, {c.batch, c.length}, {.dtype = kInt64}, &g);
  Tensor labels = randint(0, c.classes, {c.batch}, {.dtype = kInt64}, &g);
  std::vector<double> step, fwd, bwd, upd;
  for (int i = 0; i < 3 + c.steps; ++i) {
    auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(tokens), labels);
    double f = ms_since(t0);
    loss.backward();
    double b = ms_since(t0);
    opt.step();
    double s = ms_since(t0);
    if (i < 3) continue;
    step.push_back(s), fwd.push_back(f), bwd.push_back(b - f), upd.push_back(s - b);
  }
  Timing t{median(step), median(fwd), median(bwd), median(upd),
           models::count_flops(*model, c.length).training() * c.batch};
  if (!profiler::detail::recording()) {  // the GEMMs' share: more steps, each under a profile of its own
    // The median step's GEMM time: one slow step (this machine's noise) moved the mean of three past the whole
    // step's median.
    constexpr int kProfiled = 7;
    std::vector<double> gemm_ms;
    for (int i = 0; i < kProfiled; ++i) {
      profiler::Profile prof;
      opt.zero_grad();
      cross_entropy(model->forward(tokens), labels).backward();
      opt.step();
      prof.stop();
      const profiler::GemmTime g = prof.cpu_gemm(bf16 ? "matmul_bf16" : "matmul");
      t.gemm_flops = g.flops;  // the same products every step
      gemm_ms.push_back(static_cast<double>(g.ns) * 1e-6);
    }
    t.gemm_ms = median(gemm_ms);
  }
  return t;
}

// N processes that spin on a core each while alive (killed with the parent, too): the contention of a shared machine.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) asm volatile("");
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Spinners() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;

 private:
  std::vector<pid_t> pids_;
};

// The model's flags, for the twin and for the fresh process that measures our peak memory.
std::string model_flags(const Config& c) {
  return " --batch " + std::to_string(c.batch) + " --length " + std::to_string(c.length) + " --width " +
         std::to_string(c.width) + " --layers " + std::to_string(c.layers) + " --heads " + std::to_string(c.heads) +
         " --ffn " + std::to_string(c.ffn) + " --steps " + std::to_string(c.steps) + " --threads " +
         std::to_string(c.threads);
}

// The one JSON line a child process printed (the twin, or --rss-child); an empty object when it printed none.
nlohmann::json json_line(const std::string& out) {
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

// Our peak resident set in a fresh process that runs only the steps (this binary with --rss-child), in MB; < 0 when
// it cannot run.
double our_peak_rss_mb(const Config& c) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();  // this binary
  if (ec) return -1;
  const nlohmann::json j =
      json_line(tools::run_command(tools::shell_quote(self) + " --rss-child" + model_flags(c) + " 2>/dev/null"));
  return j.value("peak_rss_mb", -1.0);
}

struct TorchResult {
  double ms = -1, peak_rss_mb = -1;
};

// Runs the PyTorch twin; ms < 0 when it cannot run.
TorchResult run_torch(const Config& c, std::string& version, bool compiled, bool autocast = false) {
  const std::string twin = tools::twin_path("bench_train_torch.py");
  if (twin.empty()) return {};
  const nlohmann::json j = json_line(tools::run_command(
      tools::shell_quote(tools::torch_python()) + " " + tools::shell_quote(twin) + model_flags(c) + " --vocab " +
      std::to_string(c.vocab) + " --classes " + std::to_string(c.classes) + " --dropout " + std::to_string(c.dropout) +
      (compiled ? " --compile" : "") + (autocast ? " --autocast" : "") + " 2>/dev/null"));
  version = j.value("version", std::string());
  return {j.value("ms_median", -1.0), j.value("peak_rss_mb", -1.0)};
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{
      "bench_train: one AdamW training step of the Transformer classifier, ascender next to its PyTorch "
      "twin (tools/bench_train_torch.py) in alternating rounds",
      "bench_train"};
  app.option_defaults()->always_capture_default();
  app.add_option("--steps", c.steps, "timed steps per round (after 3 warm-up steps)")
      ->check(tools::int_range(1, 100000));
  app.add_option("--rounds", c.rounds, "alternating rounds; the best median counts")->check(tools::int_range(1, 1000));
  app.add_option("--threads", c.threads, "threads of both frameworks")->check(tools::int_range(1, 1024));
  bool no_torch = false;
  app.add_flag("--no-torch", no_torch, "ascender only: do not run the PyTorch twin");
  app.add_option("--batch", c.batch, "sequences per step")->check(tools::int_range(1, int64_t{1} << 16));
  app.add_option("--length", c.length, "tokens per sequence")->check(tools::int_range(1, int64_t{1} << 16));
  app.add_option("--width", c.width, "model width d_model")->check(tools::int_range(1, int64_t{1} << 14));
  app.add_option("--layers", c.layers, "encoder blocks")->check(tools::int_range(1, 1024));
  app.add_option("--heads", c.heads, "attention heads (must divide --width)")
      ->check(tools::int_range(1, int64_t{1} << 14));
  app.add_option("--ffn", c.ffn, "feed-forward width")->check(tools::int_range(1, int64_t{1} << 16));
  app.add_option("--busy", c.busy,
                 "spinning processes running during every measurement (1 on a 2-core machine: one core taken)")
      ->check(tools::int_range(0, 1024));
  app.add_flag("--torch-compile", c.torch_compile, "also time the PyTorch twin under torch.compile");
  app.add_flag("--bf16", c.bf16,
               "also time both frameworks with the linear layers' and attention's products in bfloat16 (CPU "
               "autocast; needs AVX512-BF16 or AMX-BF16)");
  app.add_flag("--memory", c.memory,
               "also measure each framework's peak resident set (getrusage) in a fresh process running only the "
               "steps");
  app.add_flag("--rss-child", c.rss_child, "internal: run the steps and print this process's peak resident set")
      ->group("");
  tools::add_output_options(app, c.out);
  tools::parse_or_exit(app, argc, argv);
  c.torch = !no_torch;
  if (c.width % c.heads != 0)
    tools::usage_error(app, fmt::format("--heads {} does not divide --width {}", c.heads, c.width));
  if (c.bf16 && !cpu_bf16_supported())
    tools::usage_error(
        app, fmt::format("--bf16: this processor or build has no bfloat16 products (GEMM: {})", cpu_gemm_kernel()));
  tools::ProfileRun profile_run(c.out.profile);
  return tools::guarded("bench_train", [&] {
    // Both frameworks get the same thread count (OpenMP loops and OpenBLAS read these at start-up).
    std::string threads = std::to_string(c.threads);
    setenv("OMP_NUM_THREADS", threads.c_str(), 1);  // for the PyTorch child process
    setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
#ifdef _OPENMP
    omp_set_num_threads(c.threads);  // libgomp read the environment at load time: set ours directly
#endif

    if (c.rss_child) {  // the fresh process of --memory: the steps, then the peak resident set
      run_ours(c);
      rusage ru{};
      getrusage(RUSAGE_SELF, &ru);
      std::printf("{\"peak_rss_mb\": %.1f}\n", static_cast<double>(ru.ru_maxrss) / 1024);
      return 0;
    }
    Timing best{1e30, 0, 0, 0}, best_bf16{1e30, 0, 0, 0};
    double torch_ms = 1e30, compiled_ms = 1e30, torch_rss = -1, torch_bf16_ms = 1e30;
    std::string torch_version;
    tools::Progress progress(c.rounds * (1 + c.bf16) * (1 + (c.torch ? 1 + c.torch_compile : 0)), "bench_train");
    int64_t done = 0;
    auto twin_failed = [&] {
      progress.clear();
      tools::print_twin_failure("PyTorch twin", "bench_train_torch.py");
      c.torch = false;
    };
    for (int r = 0; r < c.rounds; ++r) {
      Timing t;
      {
        Spinners busy(c.busy);
        t = run_ours(c);
      }
      if (t.step < best.step) best = t;
      progress.update(++done, fmt::format("round {} ascender {:.2f} ms/step", r + 1, t.step));
      if (c.bf16) {
        {
          Spinners busy(c.busy);
          t = run_ours(c, /*bf16=*/true);
        }
        if (t.step < best_bf16.step) best_bf16 = t;
        progress.update(++done, fmt::format("round {} ascender bf16 {:.2f} ms/step", r + 1, t.step));
      }
      for (bool compiled : {false, true}) {
        if (!c.torch || (compiled && !c.torch_compile)) continue;
        TorchResult tr;
        {
          Spinners busy(c.busy);
          tr = run_torch(c, torch_version, compiled);
        }
        progress.update(++done, tr.ms < 0 ? fmt::format("round {} pytorch failed", r + 1)
                                          : fmt::format("round {} pytorch{} {:.2f} ms/step", r + 1,
                                                        compiled ? " (compiled)" : "", tr.ms));
        if (tr.ms < 0) {
          twin_failed();
        } else if (compiled) {
          compiled_ms = std::min(compiled_ms, tr.ms);
        } else {
          torch_ms = std::min(torch_ms, tr.ms), torch_rss = tr.peak_rss_mb;
        }
        if (c.bf16 && !compiled && c.torch) {
          {
            Spinners busy(c.busy);
            tr = run_torch(c, torch_version, false, /*autocast=*/true);
          }
          progress.update(++done, tr.ms < 0 ? fmt::format("round {} pytorch bf16 failed", r + 1)
                                            : fmt::format("round {} pytorch bf16 {:.2f} ms/step", r + 1, tr.ms));
          if (tr.ms < 0)
            twin_failed();
          else
            torch_bf16_ms = std::min(torch_bf16_ms, tr.ms);
        }
      }
    }
    const double our_rss = c.memory ? our_peak_rss_mb(c) : -1;
    // The roofline: the step's FLOPs at the processor's fp32 peak (its clock, vector width and FMA units, measured
    // now: core/cpu_peak.h), and the GEMMs' efficiency against that peak.
    const CpuPeak& peak = cpu_peak();
    // (no peak off x86-64: cpu_peak() measures nothing there, and both read -1)
    const double roofline_ms = peak.fp32_flops > 0 ? best.flops / peak.fp32_flops * 1e3 : -1;
    const double gemm_eff =
        best.gemm_ms > 0 && peak.fp32_flops > 0 ? best.gemm_flops / (best.gemm_ms * 1e-3) / peak.fp32_flops : -1;
    progress.finish();

    std::printf(
        "Transformer classifier training step (AdamW), batch %lld, length %lld, width %lld, %lld layers, "
        "%lld heads, FFN %lld, dropout %.2f, %d threads%s\n",
        (long long)c.batch, (long long)c.length, (long long)c.width, (long long)c.layers, (long long)c.heads,
        (long long)c.ffn, c.dropout, c.threads,
        c.busy > 0 ? fmt::format(", {} busy process(es) spinning", c.busy).c_str() : "");
    std::printf("%s\n", tools::cpu_line().c_str());
    std::printf("%-28s %12s\n", "", "ms/step");
    std::printf("%-28s %12.2f   (forward %.2f, backward %.2f, optimizer %.2f)\n", "ascender", best.step, best.fwd,
                best.bwd, best.opt);
    if (c.torch) {
      std::printf("%-28s %12.2f   (torch %s)\n", "pytorch", torch_ms, torch_version.c_str());
      if (c.torch_compile) std::printf("%-28s %12.2f\n", "pytorch, torch.compile", compiled_ms);
      std::printf("%-28s %12.3f   (target <= 0.30)\n", "ratio ascender / pytorch", best.step / torch_ms);
    }
    std::printf("%-28s %s\n", "processor", peak.describe().c_str());
    std::printf("%-28s %12.2f   (%.3f GFLOP per step at the fp32 peak: the step at %.0f %% of it)\n", "roofline",
                roofline_ms, best.flops / 1e9, 100 * roofline_ms / best.step);
    if (gemm_eff >= 0)
      std::printf(
          "%-28s %12.2f   (%.3f GFLOP of matmul kernels per step in %.2f ms: %.1f GFLOP/s, %.0f %% of the fp32 "
          "peak, target >= 60 %%; GEMM %s)\n",
          "GEMM time", best.gemm_ms, best.gemm_flops / 1e9, best.gemm_ms, best.gemm_flops / best.gemm_ms * 1e-6,
          100 * gemm_eff, cpu_gemm_kernel().c_str());
    if (c.bf16) {
      std::printf(
          "%-28s %12.2f   (forward %.2f, backward %.2f, optimizer %.2f; linear and attention products in bfloat16)\n",
          "ascender bf16", best_bf16.step, best_bf16.fwd, best_bf16.bwd, best_bf16.opt);
      if (c.torch) {
        std::printf("%-28s %12.2f   (torch.autocast cpu bfloat16)\n", "pytorch bf16", torch_bf16_ms);
        std::printf("%-28s %12.3f\n", "ratio bf16 ascender/pytorch", best_bf16.step / torch_bf16_ms);
      }
      std::printf("%-28s %12.3f   (target <= 0.75; pytorch %.3f)\n", "ratio bf16 / fp32 step",
                  best_bf16.step / best.step, c.torch ? torch_bf16_ms / torch_ms : -1.0);
      if (best_bf16.gemm_ms > 0)
        std::printf(
            "%-28s %12.2f   (%.3f GFLOP of bfloat16 products per step: %.1f GFLOP/s, %.0f %% of the bf16 "
            "peak, %s)\n",
            "bf16 GEMM time", best_bf16.gemm_ms, best_bf16.gemm_flops / 1e9,
            best_bf16.gemm_flops / best_bf16.gemm_ms * 1e-6,
            100 * best_bf16.gemm_flops / (best_bf16.gemm_ms * 1e-3) / cpu_peak().bf16_flops,
            cpu_bf16_amx() ? "AMX" : "AVX512-BF16");
    }
    if (c.memory)
      std::printf("%-28s %12.1f MB (pytorch %.1f MB)\n", "peak resident set", our_rss, c.torch ? torch_rss : -1.0);
    tools::Table table({"framework", "ms_per_step", "forward_ms", "backward_ms", "optimizer_ms", "peak_rss_mb"});
    auto rss_cell = [&](double mb) { return mb >= 0 ? tools::Cell::fixed(mb, 1) : tools::Cell::blank(); };
    table.add({tools::Cell::str("ascender"), tools::Cell::fixed(best.step, 3), tools::Cell::fixed(best.fwd, 3),
               tools::Cell::fixed(best.bwd, 3), tools::Cell::fixed(best.opt, 3), rss_cell(our_rss)});
    if (c.bf16)
      table.add({tools::Cell::str("ascender_bf16"), tools::Cell::fixed(best_bf16.step, 3),
                 tools::Cell::fixed(best_bf16.fwd, 3), tools::Cell::fixed(best_bf16.bwd, 3),
                 tools::Cell::fixed(best_bf16.opt, 3), tools::Cell::blank()});
    if (c.torch && c.bf16)
      table.add({tools::Cell::str("pytorch_bf16"), tools::Cell::fixed(torch_bf16_ms, 3), tools::Cell::blank(),
                 tools::Cell::blank(), tools::Cell::blank(), tools::Cell::blank()});
    if (c.torch) {
      table.add({tools::Cell::str("pytorch"), tools::Cell::fixed(torch_ms, 3), tools::Cell::blank(),
                 tools::Cell::blank(), tools::Cell::blank(), rss_cell(c.memory ? torch_rss : -1)});
      if (c.torch_compile)
        table.add({tools::Cell::str("pytorch_compiled"), tools::Cell::fixed(compiled_ms, 3), tools::Cell::blank(),
                   tools::Cell::blank(), tools::Cell::blank(), tools::Cell::blank()});
    }
    auto facts = tools::run_facts("bench_train", argc, argv);
    facts["threads"] = c.threads;
    facts["busy_processes"] = c.busy;
    facts["step_gflop"] = best.flops / 1e9;
    facts["fp32_peak_gflops"] = peak.fp32_flops / 1e9;
    facts["bf16_peak_gflops"] = peak.bf16_flops / 1e9;
    facts["peak"] = peak.describe();
    facts["roofline_ms"] = roofline_ms;
    facts["gemm_ms_per_step"] = best.gemm_ms;
    facts["gemm_gflop_per_step"] = best.gemm_flops / 1e9;
    facts["gemm_efficiency"] = gemm_eff;
    if (c.torch) facts["torch_version"] = torch_version;
    if (c.bf16) {
      facts["bf16_amx"] = cpu_bf16_amx();
      facts["bf16_gemm_ms_per_step"] = best_bf16.gemm_ms;
    }
    if (!tools::write_results(table, c.out, facts, /*announce=*/false)) return 1;
    return 0;
  });
}
