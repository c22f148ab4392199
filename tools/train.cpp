// train: trains and evaluates one model on one task, and writes everything a study needs into --out DIR.
//
//   ./build/release/tools/train --task fashion-mnist-seq --image-size 14 --model ascender --steps 300 --out runs/a
//   ./build/release/tools/train --config runs/a/config.json --seed 2 --out runs/a-s2      # flags override the file
//   ./build/release/tools/train --out runs/a --resume                                     # continue (bit-identical)
//   ./build/release/tools/train --out runs/a-eval --eval-only runs/a/best.safetensors     # runs/a/config.json's model
//
// Models: dense / ascender / asam attention classifiers (models::TransformerClassifier); window and window-global:
// ASAM's sparse patterns alone (gate fixed at 1); firing: models::FiringClassifier on image tasks, with rule A / B;
// lm: a byte-level decoder LM (models::DecoderLM) on a token task's sequences, reporting bits per byte.
//
// DIR receives: config.json (every option, the git commit: rerun with --config), metrics.csv and metrics.jsonl (one
// row per log / evaluation: loss, accuracy, lr, tokens/s, time and the mechanisms' statistics), summary.json (the
// best validation checkpoint's validation and test accuracy, wall time, peak memory, throughput, parameters, FLOPs),
// predictions.csv (every test example), best.safetensors (the model selected on validation), ckpt/last.safetensors
// (the whole training state: model, optimizer, scheduler, generator, data order, counters) and dumps/ (ASCender's
// decomposition for --dump-decomposition examples, the ASAM gate per test sample and head, firing rates per neuron).
// SIGINT / SIGTERM finish the step, save ckpt/last.safetensors and exit 130; --resume continues from it.
// Exit codes: 0 done, 1 a runtime error (message on stderr), 2 a bad command line or config file (a value out of its
// range, a wrong type, options that do not fit together: refused before any data is read), 130 interrupted.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tools/cli.h"
#include "train/process_group.h"
#include "train/trainer.h"

using namespace asc;
namespace fs = std::filesystem;

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) {
  if (g_stop) _exit(130);  // a second signal: stop now
  g_stop = 1;
}

// The progress line: redrawn on a terminal, plain lines otherwise (tools/cli.h) — after every step (at most every
// --progress-every seconds when plain), with the last row's figures; and once, after this process's second step, the
// time the run will take when that is more than two minutes.
class ProgressDisplay : public train::Callback {
 public:
  ProgressDisplay(tools::Progress& p) : p_(p) {}
  void on_train_begin(train::Trainer& t) override {
    p_.set_first(t.state().step);
    first_ = t.state().step;
    // A run of a few steps learns next to nothing; the usual cause is one epoch of a small file
    if (t.config().steps == 0 && t.total_steps() < kFewSteps && t.state().step == 0)
      fmt::print(stderr,
                 "train: note: {} optimizer steps in all ({} epoch(s) of {} training examples in batches of {}): too "
                 "few to learn much; --epochs N or --steps N trains longer\n",
                 t.total_steps(), t.run().c.epochs, t.run().task.train->size(), t.config().batch);
  }
  static constexpr int64_t kFewSteps = 100;
  void on_row(train::Trainer& t, const train::Row& r) override {
    // the language model's loss in bits per byte (its summary's unit), a classifier's as the cross-entropy in nats
    const std::string loss =
        t.run().is_lm() ? fmt::format("{:.3f} bits/byte", r.loss / std::log(2.0)) : fmt::format("{:.4f}", r.loss);
    if (r.split == "train")
      fields_ = fmt::format("loss {}  acc {:.1f}%  {:.0f} tok/s  MFU {}", loss, 100 * r.accuracy, r.tokens_per_s,
                            std::isfinite(r.mfu) ? fmt::format("{:.1f}%", 100 * r.mfu) : "n/a");
    else
      fields_ = fmt::format("val loss {}  val acc {:.1f}%  (best at step {})", loss, 100 * r.accuracy, r.best_step);
  }
  void on_step_end(train::Trainer& t) override {
    const int64_t step = t.state().step;
    const auto now = std::chrono::steady_clock::now();
    if (step == first_ + 1) t1_ = now;  // the first step warms up: the estimate uses the second
    if (step == first_ + 2 && step < t.total_steps()) {
      const double per_step = std::chrono::duration<double>(now - t1_).count();
      const double left = per_step * static_cast<double>(t.total_steps() - step);
      if (left > 120) {
        p_.clear();
        fmt::print(stderr, "train: about {} for the {} steps left ({:.2f} s per step here; --steps sets how many)\n",
                   tools::format_duration(left), t.total_steps() - step, per_step);
      }
    }
    p_.update(step, fields_);
  }
  void on_train_end(train::Trainer& t, bool stopped) override {
    p_.finish(stopped ? fmt::format("interrupted at step {}: saved {}", t.state().step,
                                    (t.out() / "ckpt" / "last.safetensors").string())
                      : fmt::format("done: best validation at step {}", t.state().best_step),
              !stopped);
  }

 private:
  tools::Progress& p_;
  std::string fields_;
  int64_t first_ = 0;
  std::chrono::steady_clock::time_point t1_;
};

// Options come from, in order (each overriding the one before): the defaults; with --resume, the run's own
// config.json; with --eval-only, the config.json beside the model file (unless --config is given); --config FILE; the
// flags. A first pass reads only the flags that choose those files (in any of CLI11's spellings, --out=DIR too).
void parse_config_files(CLI::App& app, const train::OptionTable& table, const std::string& default_out, int argc,
                        char** argv) {
  CLI::App pre;
  pre.allow_extras();
  pre.set_help_flag();
  std::string out = default_out, config, eval;
  bool resume = false;
  pre.add_option("--out", out);
  pre.add_option("--config", config);
  pre.add_option("--eval-only", eval);
  pre.add_flag("--resume", resume);
  try {
    pre.parse(argc, argv);
  } catch (const CLI::ParseError&) {
    // the real parse reports it
  }
  std::vector<std::string> files;
  if (resume && fs::exists(fs::path(out) / "config.json")) files.push_back((fs::path(out) / "config.json").string());
  if (!eval.empty() && config.empty()) {
    const fs::path beside = fs::path(eval).parent_path() / "config.json";
    if (!fs::exists(beside))
      tools::usage_error(app, fmt::format("--eval-only {}: no config.json beside it to build the model from; give "
                                          "the run's options with --config FILE",
                                          eval));
    files.push_back(beside.string());
  }
  if (!config.empty()) files.push_back(config);
  for (const std::string& path : files) {
    try {
      table.parse_file(path);
    } catch (const Error& e) {
      tools::usage_error(app, fmt::format("config file '{}': {}", path, e.what()));
    }
  }
}

// The steps of the finished run in `out` (its summary.json), or -1.
int64_t finished_steps(const std::string& out) {
  const fs::path p = fs::path(out) / "summary.json";
  if (!fs::exists(p)) return -1;
  try {
    std::ifstream f(p);
    return nlohmann::json::parse(f).at("steps").get<int64_t>();
  } catch (const std::exception&) {
    return 0;  // unreadable: finished at an unknown step (it is only ever written whole)
  }
}

// The job's process group when a launcher started several processes (`mpirun -np N train ...`), else null.
std::shared_ptr<distributed::ProcessGroup> g_group;

// The run: exit 0 done, 130 stopped (a signal or --stop-after) with a checkpoint to resume from. In a job of several
// processes every rank runs this; rank 0 alone prints and writes.
int run(const train::Config& c, train::TrainerFlags flags, bool params_only) {
#ifdef _OPENMP
  if (c.threads > 0) omp_set_num_threads(static_cast<int>(c.threads));
#endif
  if (params_only) {  // the model's size and cost at the task's length, nothing written
    train::Run r = train::make_run(c);
    fmt::print("{}\n", train::model_size(r).dump());
    return 0;
  }
  std::optional<tools::Progress> progress;
  flags.stop_requested = [] { return g_stop != 0; };
  flags.print = [&progress](const std::string& s) {
    if (progress) progress->clear();
    fmt::print("{}", s);
  };
  // A finished run (summary.json is its last file) is left as it is, unless --steps asks for more than it took.
  if (flags.resume && finished_steps(c.out) >= 0 && !(c.steps > finished_steps(c.out))) {
    if (g_group && g_group->rank() > 0) return 0;
    fmt::print(
        "train: {} holds a finished run (summary.json): nothing to resume; --out another directory to train "
        "again\n",
        c.out);
    return 0;
  }
  const bool eval_only = !flags.eval_only.empty();
  const std::string model_file = flags.eval_only;
  flags.group = g_group;
  train::Trainer t(c, std::move(flags));
  progress.emplace(t.total_steps(), fmt::format("train {} {}", c.model, c.task));
  progress->set_plain_every(c.progress_every);
  if (c.progress != "none" && t.lead()) t.add_callback(std::make_shared<ProgressDisplay>(*progress));
  if (t.lead() && t.world_size() > 1 && t.state().step == 0)
    fmt::print(stderr, "train: {} processes, each reading {} of every step's {} examples\n", t.world_size(),
               c.batch / t.world_size(), c.batch);
  if (!t.fit()) {
    if (t.lead())
      fmt::print(stderr, "train: {} at step {} of {}; saved {} (continue with --resume --out {})\n",
                 g_stop ? "interrupted" : "stopped (--stop-after)", t.state().step, t.total_steps(),
                 (t.out() / "ckpt" / "last.safetensors").string(), c.out);
    return 130;
  }
  if (!t.lead()) return 0;  // the test pass, the analyses and the summary are the lead's
  const train::TestResult r = t.test();
  t.analyses();
  t.write_summary(r);  // last: its existence marks the run finished
  const auto& [val, test, seconds] = r;
  if (eval_only && t.run().is_lm())
    fmt::print("{}: {} scores test {:.4f} bits per byte, validation {:.4f}; wrote {}\n", c.task, model_file,
               test.loss / std::log(2.0), val.loss / std::log(2.0), c.out);
  else if (eval_only)
    fmt::print("{}: {} scores test accuracy {:.2f}%, validation {:.2f}%; wrote {}\n", c.task, model_file,
               100 * test.accuracy, 100 * val.accuracy, c.out);
  else if (t.run().is_lm())
    fmt::print(
        "{}: test {:.4f} bits per byte (next-byte accuracy {:.2f}%; best validation at step {}), {} parameters, "
        "{:.1f} s; wrote {}\n",
        c.task, test.loss / std::log(2.0), 100 * test.accuracy, t.state().best_step, t.model_parameters(), t.elapsed(),
        c.out);
  else
    fmt::print("{}: test accuracy {:.2f}% (best validation {:.2f}% at step {}), {} parameters, {:.1f} s; wrote {}\n",
               c.task, 100 * test.accuracy, 100 * val.accuracy, t.state().best_step, t.model_parameters(), t.elapsed(),
               c.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First thing: a SIGINT during the set-up (data, model, checkpoint, the GEMM peak measurement) stops the run after
  // its first step with a checkpoint, like one during training, instead of killing it without one.
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  train::Config c;
  CLI::App app{
      "train: train and evaluate one model on one task; every output goes to --out DIR (see "
      "docs/train.md)",
      "train"};
  app.set_help_flag("-h,--help", "print this help (every option with its default) and exit");
  const train::OptionTable table(app, c);
  train::TrainerFlags flags;
  std::string config_file;  // read by parse_config_files' first pass
  bool params_only = false;
  app.add_option("--config", config_file, "a config.json of options (flags given here override it)")
      ->group("Run and output");
  app.add_flag("--resume", flags.resume,
               "continue the run in --out from its last checkpoint (its config.json, then these flags)")
      ->group("Run and output");
  app.add_option("--eval-only", flags.eval_only,
                 "evaluate this model file (best.safetensors) on validation and test, no training")
      ->group("Run and output");
  app.add_flag("--params-only", params_only,
               "print the model's parameter count and FLOPs per token at the task's "
               "length as one JSON line, train nothing, write nothing")
      ->group("Run and output");
  parse_config_files(app, table, c.out, argc, argv);
  tools::parse_or_exit(app, argc, argv);  // --help: exit 0; a bad flag or value: one error line, exit 2
  try {
    train::validate_config(c);  // what the options ask together: exit 2 as well, before any data is read
  } catch (const Error& e) {
    tools::usage_error(app, e.what());
  }
  flags.command.clear();
  for (int i = 0; i < argc; ++i) flags.command += (i ? " " : "") + std::string(argv[i]);
  distributed::LaunchInfo launch;
  try {
    // Started by a launcher with several processes: one process group over them (MPI, or NCCL for --device cuda)
    launch = distributed::launch_info();
    if (launch.size > 1 && !params_only) {
      const std::string backend = c.device == "cuda" ? "nccl" : "mpi";
      ASC_CHECK(distributed::backend_available(backend),
                "started as one of {} processes (rank {}), but this build of train has no {} process group{}",
                launch.size, launch.rank, backend,
                backend == "mpi" ? " (MPI was not found when it was configured: apt-get install libopenmpi-dev)"
                                 : " (NCCL and MPI are needed: a CUDA build with libnccl-dev and libopenmpi-dev)");
      g_group = distributed::init_process_group(backend);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 1;
  }
  try {
    return run(c, std::move(flags), params_only);
  } catch (const std::exception& e) {
    if (!g_group || g_group->size() == 1) {
      fmt::print(stderr, "train: {}\n", e.what());
      return 1;
    }
    // One rank's error ends the whole job (the others would wait for it in their next collective)
    fmt::print(stderr, "train: rank {} of {}: {}\n", g_group->rank(), g_group->size(), e.what());
    std::fflush(stderr);
    g_group->abort(1);
  }
}
