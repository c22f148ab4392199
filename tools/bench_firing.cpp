// Firing-threshold perceptron benchmark (not a test), in one run:
//   - one training step of a firing layer — forward, backward of a given upstream gradient G = dL/dY (Y.backward(G);
//     with --loss, of the loss <G, Y> instead, which adds the product and its backward to both sides), SGD, learning
//     rule B (Oja on W and f, homeostasis, clips) — for B = 256, d = 784, P = 1024, α = 4, float32, at firing rates
//     0.5 .. 0.05 (thresholds set per neuron from the layer's own pre-activations), next to the same step in PyTorch
//     (tools/bench_firing_torch.py, Debian's python3-torch, same thread count); ours twice: SGD then rule B, and
//     rule B with fuse_sgd (W's SGD step folded into the Oja product: two GEMMs a step instead of three);
//   - the SSM scan (ops/firing.h: ssm_scan, forward + backward, with the RMS normalisation) for T = 128 .. 1024,
//     B = 32, rank 64.
// Best-of-reps milliseconds; --csv / --json write the rows.
//   ./build/release/tools/bench_firing [--reps 10] [--rates 0.5,0.25,0.1,0.05] [--csv out.csv] [--json out.json]
//                                      [--no-torch] [--no-scan] [--loss] [--sequential]
// --sequential also times rule B's sequential variant (RuleBOptions::sequential) in the same run. The twin is found
// beside an installed binary (<prefix>/share/ascender/) or in the source tree (tools/cli.h: twin_path). --help lists
// the options; a bad value exits 2 (tools/cli.h). Progress on stderr, one step per measured rate or scan length.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ascender.h"
#include "tools/bench_util.h"
#include "tools/cli.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace asc;

namespace {

constexpr int64_t kBatch = 256, kD = 784, kP = 1024, kA = 4;

// Per neuron, the threshold that the given fraction of the batch reaches.
Tensor thresholds_for(const Tensor& Z, double rate) {
  const std::vector<float> z = Z.to_vector<float>();
  std::vector<float> sp(kP);
  std::vector<float> col(kBatch);
  for (int64_t p = 0; p < kP; ++p) {
    for (int64_t b = 0; b < kBatch; ++b) col[b] = z[b * kP + p];
    const auto k = static_cast<std::ptrdiff_t>(std::clamp<double>((1 - rate) * kBatch, 0, kBatch - 1));
    std::nth_element(col.begin(), col.begin() + k, col.end());
    sp[p] = col[k];
  }
  return tensor(std::vector<double>(sp.begin(), sp.end()), {kP}).to(kFloat32);
}

// Step time of ours per rate.
// Step time of ours per rate; progress ticks once per rate.
std::map<double, double> run_ours(const std::vector<double>& rates, int reps, bool fuse_sgd, bool loss,
                                  tools::Progress& progress, int64_t& done, bool sequential = false) {
  manual_seed(0);
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(kD, kP).fan_out(kA));
  optim::SGD opt(layer->parameters(), {.lr = 1e-3});
  opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 1e-3,
                                            .eta_f = 1e-3,
                                            .eta_sp = 1e-2,
                                            .r_target = 0.1,
                                            .w_min = -1,
                                            .w_max = 1,
                                            .f_min = -1,
                                            .f_max = 1,
                                            .fuse_sgd = fuse_sgd,
                                            .sequential = sequential}));
  Tensor x = randn({kBatch, kD}), G = randn({kBatch, kP, kA});
  std::map<double, double> out;
  for (double rate : rates) {
    Tensor sp0;
    {
      NoGradGuard ng;
      sp0 = thresholds_for(matmul(x, layer->W.t()), rate);
    }
    auto reset = [&] {
      NoGradGuard ng;
      layer->SP.copy_(sp0);
    };
    auto step = [&] {
      layer->zero_grad();
      Tensor y = layer->forward(x);  // (B, P, α)
      if (loss)
        sum(y * G).backward();
      else
        y.backward(G);
      opt.step();
    };
    reset();
    step();  // warm-up
    out[rate] = bench::best_ms(step, reps, reset);
    reset();
    layer->forward(x);
    progress.clear();
    std::printf("  (ours%s: measured firing rate %.3f for target %.3f)\n", fuse_sgd ? ", fuse_sgd" : "",
                mean(layer->last_gate()).item<double>(), rate);
    std::fflush(stdout);
    progress.update(++done, fmt::format("ours{}{} rate {}: {:.2f} ms", fuse_sgd ? " fuse_sgd" : "",
                                        sequential ? " sequential" : "", rate, out[rate]));
  }
  return out;
}

std::map<double, double> run_torch(const std::vector<double>& rates, int reps, bool loss) {
  std::map<double, double> out;
  const std::string twin = tools::twin_path("bench_firing_torch.py");
  if (twin.empty()) return out;
  std::string list;
  for (double r : rates) list += fmt::format(" {}", r);  // shortest round-trip form: the twin's rates are ours exactly
  const std::string cmd = tools::shell_quote(tools::torch_python()) + " " + tools::shell_quote(twin) + " --rates" +
                          list + " --reps " + std::to_string(reps) + " --threads 2" + (loss ? " --loss" : "") +
                          " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) {
    const nlohmann::json j = nlohmann::json::parse(buf, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("rate") && j["rate"].is_number() && j.contains("step_ms") &&
        j["step_ms"].is_number())
      out[j["rate"].get<double>()] = j["step_ms"].get<double>();
  }
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  bool no_torch = false, no_scan = false, loss = false, sequential = false;
  tools::Outputs out;
  std::vector<double> rates = {0.5, 0.25, 0.1, 0.05};
  CLI::App app{
      "bench_firing: a firing layer's training step with rule B next to its PyTorch twin "
      "(tools/bench_firing_torch.py), and the SSM scan",
      "bench_firing"};
  app.option_defaults()->always_capture_default();
  app.add_option("--reps", reps, "repetitions per measurement (best counts)")->check(tools::int_range(1, 10000));
  tools::add_real_list(app, "--rates", rates, "target firing rates (thresholds set per neuron)", 0.01, 1.0);
  app.add_flag("--no-torch", no_torch, "do not run the PyTorch twin");
  app.add_flag("--no-scan", no_scan, "skip the SSM scan rows");
  app.add_flag("--loss", loss, "backward of the loss <G, Y> instead of Y.backward(G)");
  app.add_flag("--sequential", sequential, "also time rule B's sequential variant");
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  const bool torch = !no_torch, scan_rows = !no_scan;
  tools::ProfileRun profile_run(out.profile);
  return tools::guarded("bench_firing", [&] {
    setenv("OMP_NUM_THREADS", "2", 1);
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    const int64_t n_rates = static_cast<int64_t>(rates.size());
    tools::Progress progress((torch ? 1 : 0) + n_rates * (sequential ? 4 : 2) + (scan_rows ? 4 : 0), "bench_firing");
    int64_t done = 0;
    std::map<double, double> theirs = torch ? run_torch(rates, reps, loss) : std::map<double, double>{};
    if (torch) progress.update(++done, "PyTorch twin");
    if (torch && theirs.empty()) {
      progress.clear();
      tools::print_twin_failure("torch twin", "bench_firing_torch.py");
    }
    std::map<double, double> ours = run_ours(rates, reps, false, loss, progress, done),
                             fused = run_ours(rates, reps, true, loss, progress, done);
    if (sequential) {  // rule B's sequential variant (the update order before the simultaneous form), same run
      std::map<double, double> seq = run_ours(rates, reps, false, loss, progress, done, true),
                               seq_fused = run_ours(rates, reps, true, loss, progress, done, true);
      progress.clear();
      std::printf("\nrule B sequential variant: ours ms / fuse_sgd ms (simultaneous above)\n");
      for (double r : rates) std::printf("%-12.2f %10.2f %12.2f\n", r, seq[r], seq_fused[r]);
    }

    progress.clear();
    std::printf(
        "\nfiring layer training step (forward + backward %s + SGD + rule B), B %lld, d %lld, P %lld, "
        "alpha %lld, float32, 2 threads\n",
        loss ? "of <G, Y>" : "of dL/dY = G", (long long)kBatch, (long long)kD, (long long)kP, (long long)kA);
    std::printf("%s\n", tools::cpu_line().c_str());
    std::printf("%-12s %10s %12s %12s %10s %12s\n", "firing rate", "ours ms", "fuse_sgd ms", "PyTorch ms", "speed-up",
                "(fuse_sgd)");
    auto ratio = [](double t, double o) { return t > 0 ? fmt::format("{:.2f}x", t / o) : std::string("-"); };
    for (double r : rates) {
      const double t = theirs.count(r) ? theirs[r] : -1;
      std::printf("%-12.2f %10.2f %12.2f %12s %10s %12s\n", r, ours[r], fused[r],
                  t > 0 ? fmt::format("{:.2f}", t).c_str() : "-", ratio(t, ours[r]).c_str(),
                  ratio(t, fused[r]).c_str());
    }

    // The SSM scan, forward + backward.
    if (scan_rows)
      std::printf("\nssm_scan forward + backward (RMS normalisation), B 32, rank 64, float32\n%-8s %10s %12s\n", "T",
                  "ms", "us / step");
    std::vector<std::pair<int64_t, double>> scan;
    for (int64_t T : scan_rows ? std::vector<int64_t>{128, 256, 512, 1024} : std::vector<int64_t>{}) {
      Tensor a = sigmoid(randn({32, T, 64})), u = randn({32, T, 64}), s0 = zeros({64});
      a = a.detach().set_requires_grad(true), u = u.detach().set_requires_grad(true);
      auto run = [&] {
        a.zero_grad(), u.zero_grad();
        sum(ssm_scan(a, u, s0, true)).backward();
      };
      run();
      const double ms = bench::best_ms(run, reps);
      scan.push_back({T, ms});
      progress.clear();
      std::printf("%-8lld %10.3f %12.2f\n", (long long)T, ms, ms * 1e3 / T);
      std::fflush(stdout);
      progress.update(++done, fmt::format("ssm_scan T {}", T));
    }
    progress.finish();
    tools::Table table({"benchmark", "param", "ours_ms", "ours_fuse_sgd_ms", "torch_ms"});
    for (double r : rates)
      table.add({tools::Cell::str("firing_step"), tools::Cell::str(fmt::format("rate={:.2f}", r)),
                 tools::Cell::fixed(ours[r], 3), tools::Cell::fixed(fused[r], 3),
                 tools::Cell::fixed(theirs.count(r) ? theirs[r] : -1.0, 3)});
    for (auto [T, ms] : scan)
      table.add({tools::Cell::str("ssm_scan"), tools::Cell::str(fmt::format("T={}", T)), tools::Cell::fixed(ms, 3),
                 tools::Cell::blank(), tools::Cell::blank()});
    auto facts = tools::run_facts("bench_firing", argc, argv);
    facts["threads"] = 2;
    facts["loss"] = loss;
    if (!tools::write_results(table, out, facts, /*announce=*/true)) return 1;
    return 0;
  });
}
