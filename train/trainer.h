#pragma once
// The trainer library: trains and evaluates one model on one task and writes everything a study needs into a run
// directory — what the `train` tool (tools/train.cpp, docs/train.md) runs, usable from C++ as well:
//
//   asc::train::Config c;                       // or asc::train::read_config("runs/a/config.json")
//   c.task = "fashion-mnist-seq", c.image_size = 14, c.model = "ascender", c.steps = 300, c.out = "runs/a";
//   asc::train::Trainer t(c);                   // the task, the model, the optimizer, the run directory
//   t.add_callback(std::make_shared<MyCallback>());
//   t.fit();                                    // training with validation and checkpoints
//   asc::train::TestResult r = t.test();        // best.safetensors on the test split; predictions, dumps
//   t.analyses();                               // cluster_metrics.json / robustness.json when asked for
//   t.write_summary(r);                         // summary.json, last: its existence marks the run finished
//
// The run directory: config.json (every option, the git commit), metrics.csv and metrics.jsonl (one row per log,
// validation and test), summary.json, predictions.csv, best.safetensors (the model selected on validation),
// ckpt/last.safetensors (the whole training state, train/state.h) and dumps/. A run resumed from its checkpoint
// (TrainerFlags::resume) continues bit-identically.
//
// The loop (Trainer::fit) is a handful of lines; what happens around each step — the metrics rows, validation and the
// best model, checkpoints (and stopping on a signal or after --stop-after steps), profiling — is done by callbacks,
// and a program adds its own (a progress display, early stopping) through the same interface.
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/loader.h"
#include "models/flops.h"
#include "train/metrics.h"
#include "train/state.h"

namespace asc::distributed {
class ProcessGroup;
class DistributedDataParallel;
}  // namespace asc::distributed

namespace asc::train {

class Trainer;

// A metrics row just written (a log row of the training batches, or a validation).
struct Row {
  int64_t step = 0;
  std::string split;  // "train" | "val"
  double loss = 0, accuracy = 0;
  double tokens_per_s = std::nan("");  // train rows
  double mfu = std::nan("");           // train rows: model FLOPs ÷ time ÷ the CPU's fp32 peak (NaN: unknown)
  int64_t best_step = -1;              // val rows: the best validation so far
};

// Hooks into the loop; every method has a default that does nothing.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(Trainer&) {}
  virtual void on_step_begin(Trainer&) {}
  // After the step's update and bookkeeping (Trainer::state().step counts it).
  virtual void on_step_end(Trainer&) {}
  virtual void on_row(Trainer&, const Row&) {}
  // Asked after every step's on_step_end: true ends fit(), after a checkpoint of that step.
  virtual bool should_stop(Trainer&) { return false; }
  virtual void on_train_end(Trainer&, bool stopped) {}
};

struct TrainerFlags {
  bool resume = false;    // continue the run in c.out from ckpt/last.safetensors
  std::string eval_only;  // a model file to evaluate on validation and test; no training
  std::string command;    // written to config.json beside the options
  // A stop request (a signal): the step in progress finishes, a checkpoint is written, fit() returns false.
  std::function<bool()> stop_requested;
  // Where the trainer prints (the profile's table); default stdout.
  std::function<void(const std::string&)> print;
  // A job of several processes (`mpirun -np N train ...`): this process's group. Every rank builds the same Trainer
  // and reads its share of every step's batch (batch / N examples: batch must be a multiple of N), the gradients are
  // averaged over the ranks (distributed::DistributedDataParallel), and rank 0 alone validates, tests and writes the
  // run directory; the other ranks read the checkpoint to resume. The steps are those of one process reading the
  // whole batch (docs/train.md, "Several processes"). Null, or a group of one: one process.
  std::shared_ptr<distributed::ProcessGroup> group;
};

struct TestResult {
  EvalResult val, test;
  double seconds = 0;  // the test pass, the loader and the bookkeeping included
};

class Trainer {
 public:
  explicit Trainer(const Config& c, TrainerFlags flags = {});
  ~Trainer();

  void add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }
  // Trains to total_steps() (from the checkpoint with resume); false when a callback stopped it early (the state is
  // in ckpt/last.safetensors: continue with resume).
  bool fit();
  // The best validation model (or the eval_only file) on validation and test: the test row of metrics.csv,
  // predictions.csv, and dumps/ (ASAM gates, firing rates, ASCender decompositions).
  TestResult test();
  // cluster_metrics.json / robustness.json when the Config asks for them; a failed analysis writes its error there.
  void analyses();
  // summary.json: written last (after the analyses), since `train --resume` takes it for a finished run.
  void write_summary(const TestResult& t);
  // ckpt/last.safetensors now; the trainer's checkpoint callback calls it every ckpt_every steps, at the last, and
  // before a stop.
  void checkpoint();

  Run& run() { return r_; }
  Optimization& optimization() { return o_; }
  const Config& config() const { return r_.c; }
  // This process's place in a job of several (TrainerFlags::group): rank 0 of 1 for one process. Only the lead
  // (rank 0) writes files and runs validation, the test pass, the analyses and the summary.
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool lead() const { return rank_ == 0; }
  // Whether the run stops after this step at a stop request (TrainerFlags::stop_requested): with several processes, a
  // request seen by any rank, agreed over all of them at the end of the step (so that every rank stops at the same
  // step).
  bool stop_requested() const;
  // The loop's counters; callbacks may change them (the trainer's own keep the best step and the log sums here).
  LoopState& state() { return s_; }
  const LoopState& state() const { return s_; }
  const data::DataLoader& loader() const { return *loader_; }
  const std::filesystem::path& out() const { return out_; }
  int64_t total_steps() const { return total_; }
  int64_t model_parameters() const;
  double elapsed() const;  // wall seconds of the whole run so far (earlier processes included)
  void print(const std::string& text) const;

  // For the trainer's own callbacks (train/trainer.cpp).
  struct Internals;
  Internals& internals() { return *in_; }

 private:
  // f(cb) for every callback, by index: a hook may add callbacks, which join from the next event on.
  template <class F>
  void each_callback(const F& f) {
    for (size_t i = 0; i < callbacks_.size(); ++i) f(*callbacks_[i]);
  }
  void check_options() const;
  void prepare_outputs();
  void train_step(const data::Batch& b);
  void dumps(const std::vector<std::vector<Tensor>>& asam_gates, const std::vector<Tensor>& firing_sum,
             double firing_n);

  Run r_;
  Optimization o_;
  TrainerFlags flags_;
  std::filesystem::path out_;
  std::unique_ptr<data::DataLoader> loader_;
  LoopState s_;
  int64_t total_ = 0;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::unique_ptr<Internals> in_;
  int rank_ = 0, world_ = 1;
  std::shared_ptr<distributed::DistributedDataParallel> ddp_;  // several processes: the gradient averaging
  bool stop_agreed_ = false;                                   // several processes: the step's agreed stop request
};

// The model's size and cost at the task's length, as JSON: params, max_len, flops_per_token,
// attention_flops_per_token (the `train --params-only` line).
json model_size(Run& r);

}  // namespace asc::train
