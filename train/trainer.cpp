// The trainer (train/trainer.h): the set-up, the loop and its callbacks (metrics rows, validation, checkpoints,
// profiling), the test pass, the summary and the analyses.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "core/atomic_file.h"
#include "core/cpu_peak.h"
#include "core/fault.h"
#include "core/profiler.h"
#include "cuda/cuda.h"
#include "nn/safetensors.h"
#include "train/analyses.h"
#include "train/distributed.h"

namespace asc::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// What the loop and the trainer's callbacks share beside the LoopState.
struct Trainer::Internals {
  Internals(const Run& r) : mech(r), train_mech(r) {}
  MechStats mech, train_mech;  // validation's, and the training batches' since the last log row
  std::unique_ptr<MetricsWriter> metrics;
  int64_t eval_every = 1, log_every = 1, ckpt_every = 1, n_params = 0;
  models::FlopCount flops_max;
  double peak = 0;            // MFU's denominator: the CPU's fp32 peak (no GPU peak is known here)
  Clock::time_point t_start;  // elapsed() = s_.wall_s + the time since t_start
  int64_t saved_step = -1;    // the step ckpt/last.safetensors holds (-1: none written by this process)
  double lr_used = 0;         // the lr the last step ran with (the rows report it, not the next one's)
  double peak_mb = 0;         // peak CPU memory of training and the test pass (the summary's; not the analyses')
  // Throughput windows run from one log row to the next, less the time spent validating and checkpointing.
  double tokens_per_s = 0, flops_done = 0, window_t0 = 0, window_tokens = 0, paused = 0;
  double epoch(int64_t step, const data::DataLoader& l) const {
    return static_cast<double>(step) / static_cast<double>(l.batches_per_epoch());
  }
};

namespace {

// ---- the trainer's own callbacks -------------------------------------------------------------------------------

// A train row of metrics.csv every log_every steps (and at the last): the training batches' loss and accuracy since
// the last row, the lr, throughput, MFU and the mechanisms' statistics.
class LogRows : public Callback {
 public:
  explicit LogRows(std::function<void(const Row&)> emit) : emit_(std::move(emit)) {}
  void on_step_end(Trainer& t) override {
    auto& in = t.internals();
    LoopState& s = t.state();
    if (s.step % in.log_every != 0 && s.step != t.total_steps()) return;
    const double now = t.elapsed();
    const double dt = std::max(1e-9, now - in.window_t0 - in.paused);
    in.tokens_per_s = in.window_tokens / dt;
    const double mfu = in.peak > 0 ? in.flops_done / dt / in.peak : std::nan("");
    in.window_t0 = now, in.window_tokens = 0, in.flops_done = 0, in.paused = 0;
    json mj;
    std::map<std::string, double> flat;
    in.train_mech.values(mj, flat);
    in.train_mech.reset();
    const double loss = s.acc_loss / std::max(1.0, s.acc_count), acc = s.acc_correct / std::max(1.0, s.acc_count);
    in.metrics->row(s.step, in.epoch(s.step, t.loader()), "train", loss, acc, in.lr_used, in.tokens_per_s, now, mj,
                    flat);
    s.acc_loss = s.acc_correct = s.acc_count = s.acc_tokens = 0;
    emit_(
        {.step = s.step, .split = "train", .loss = loss, .accuracy = acc, .tokens_per_s = in.tokens_per_s, .mfu = mfu});
  }

 private:
  std::function<void(const Row&)> emit_;
};

// Validation every eval_every steps (and at the last): a val row, and best.safetensors when the score improves
// (accuracy; a language model's minus loss).
class Validation : public Callback {
 public:
  explicit Validation(std::function<void(const Row&)> emit) : emit_(std::move(emit)) {}
  void on_step_end(Trainer& t) override {
    auto& in = t.internals();
    LoopState& s = t.state();
    if (s.step % in.eval_every != 0 && s.step != t.total_steps()) return;
    const double t0 = t.elapsed();
    Run& r = t.run();
    EvalResult v = evaluate(r, *r.task.val, r.c.eval_batches, in.mech, false);
    json mj;
    std::map<std::string, double> flat;
    in.mech.values(mj, flat);
    in.metrics->row(s.step, in.epoch(s.step, t.loader()), "val", v.loss, v.accuracy, in.lr_used, std::nan(""),
                    t.elapsed(), mj, flat);
    const double score = r.is_lm() ? -v.loss : v.accuracy;
    if (s.best_step < 0 || score > s.best_val) {
      s.best_val = score, s.best_step = s.step;
      save_safetensors(
          (t.out() / "best.safetensors").string(), r.model->state_dict(),
          {{"step", std::to_string(s.step)}, {"val_accuracy", num(v.accuracy)}, {"val_loss", num(v.loss)}});
    }
    in.paused += t.elapsed() - t0;
    emit_({.step = s.step, .split = "val", .loss = v.loss, .accuracy = v.accuracy, .best_step = s.best_step});
  }

 private:
  std::function<void(const Row&)> emit_;
};

// ckpt/last.safetensors every ckpt_every steps, at the last, and before stopping: on a stop request (a signal), or
// after stop_after steps of this process (a long run in parts).
class Checkpoints : public Callback {
 public:
  void on_train_begin(Trainer& t) override { first_step_ = t.state().step; }
  void on_step_end(Trainer& t) override {
    auto& in = t.internals();
    const int64_t step = t.state().step, stop_after = t.config().stop_after;
    const bool part_done = stop_after > 0 && step - first_step_ >= stop_after && step < t.total_steps();
    stop_ = t.stop_requested() || part_done;
    if (step % in.ckpt_every == 0 || step == t.total_steps() || stop_) t.checkpoint();
  }
  bool should_stop(Trainer&) override { return stop_; }

 private:
  int64_t first_step_ = 0;
  bool stop_ = false;
};

// --profile N: steps [from, from + N) after this process's first (warm-up) step when the run has room for it; the
// table goes to OUT/profile.txt and the trainer's print, the Chrome trace to OUT/profile_trace.json.
class Profiling : public Callback {
 public:
  void on_train_begin(Trainer& t) override {
    const int64_t first = t.state().step, n = t.config().profile;
    from_ = t.total_steps() - first > n ? first + 1 : first;
  }
  void on_step_begin(Trainer& t) override {
    if (t.config().profile > 0 && t.state().step == from_) prof_.emplace();
    if (prof_) range_.emplace("train_step");
  }
  void on_step_end(Trainer& t) override {
    range_.reset();
    if (prof_ && t.state().step == from_ + t.config().profile) finish(t);
  }
  void on_train_end(Trainer& t, bool) override {
    if (prof_) finish(t);  // the run ended before N steps: what was recorded
  }

 private:
  void finish(Trainer& t) {
    prof_->stop();
    const int64_t steps = std::min(t.state().step, from_ + t.config().profile) - from_;
    const std::string table = fmt::format("train --profile: {} step(s) from step {} ({})\n{}", steps, from_ + 1,
                                          t.out().string(), prof_->table(30));
    write_file_atomic(t.out() / "profile.txt", table);
    prof_->write_chrome_trace((t.out() / "profile_trace.json").string());
    t.print(fmt::format("{}profile: {} and {}\n", table, (t.out() / "profile.txt").string(),
                        (t.out() / "profile_trace.json").string()));
    prof_.reset();
  }
  int64_t from_ = 0;
  std::optional<profiler::Profile> prof_;
  std::optional<profiler::Range> range_;
};

}  // namespace

// ---- set-up -------------------------------------------------------------------------------------------------------

Trainer::Trainer(const Config& c, TrainerFlags flags) : flags_(std::move(flags)), out_(c.out) {
  if (!flags_.print) flags_.print = [](const std::string& s) { fmt::print("{}", s); };
  if (flags_.group) rank_ = flags_.group->rank(), world_ = flags_.group->size();
  // First, before anything is written or built: the device and dtype, then a directory that holds a run is refused
  // without resume.
  check_device_and_dtype(c);
  validate_config(c);  // with the memory a training run needs
  if (world_ > 1) {
    ASC_CHECK(flags_.eval_only.empty(), "--eval-only evaluates in one process, not in a job of {} processes", world_);
    ASC_CHECK(c.batch % world_ == 0,
              "--batch {} is not a multiple of the {} processes (each reads batch / {} examples of every step)",
              c.batch, world_, world_);
    ASC_CHECK(c.rule == "none",
              "--rule {}: a firing rule learns from its own process's batch (its running rates), which the processes "
              "do not average; run it in one process",
              c.rule);
  }
  if (flags_.resume)
    ASC_CHECK(fs::exists(out_ / "config.json"),
              "--resume: {} has no config.json, so no run was started there (a run killed before writing it is started "
              "again without --resume)",
              out_.string());
  else if (lead())  // (the others would race the lead's first write; its refusal ends the job)
    ASC_CHECK(!fs::exists(out_ / "metrics.csv"),
              "{} already holds a run (metrics.csv); continue it with --resume or choose another --out", out_.string());
  // One GPU per process: the one its NCCL communicator uses (the local rank's, process_group_nccl.cpp)
  const int gpus = c.device == "cuda" ? cuda::device_count() : 0;
  r_ = make_run(c, world_ > 1 && gpus > 0 ? distributed::launch_info().local_rank % gpus : 0);
  if (r_.device.is_cuda()) cuda::set_allow_tf32(c.tf32);  // this run's setting, whatever an earlier run set
  in_ = std::make_unique<Internals>(r_);
  check_options();
  // Each process's share of every step's batch: with drop_last the ranks' batches k are one process's batch k
  // (data/loader.h), so the steps are the same whatever the number of processes
  loader_ = std::make_unique<data::DataLoader>(r_.task.train, data::LoaderOptions{.batch_size = c.batch / world_,
                                                                                  .shuffle = true,
                                                                                  .seed = c.seed,
                                                                                  .drop_last = true,
                                                                                  .prefetch = c.prefetch,
                                                                                  .pad_id = r_.task.pad_id,
                                                                                  .rank = rank_,
                                                                                  .world_size = world_});
  total_ = c.steps > 0 ? c.steps : r_.c.epochs * loader_->batches_per_epoch();  // r_.c: the model's default resolved
  in_->eval_every = c.eval_every > 0 ? c.eval_every : std::max<int64_t>(1, total_ / 10);
  in_->log_every = c.log_every > 0 ? c.log_every : std::max<int64_t>(1, std::min(in_->eval_every, total_ / 50));
  in_->ckpt_every = c.ckpt_every > 0 ? c.ckpt_every : in_->eval_every;
  // The ranks' parameter lists compared and rank 0's weights everywhere, before the optimizer copies any of them
  if (world_ > 1) ddp_ = std::make_shared<distributed::DistributedDataParallel>(r_.model, flags_.group);
  o_ = make_optimization(r_, total_);
  for (const Tensor& p : r_.model->parameters()) in_->n_params += p.numel();
  in_->flops_max = models::count_flops(*r_.model, r_.task.max_len);
  in_->peak = r_.device.is_cuda() ? 0.0 : cpu_peak().fp32_flops;
  prepare_outputs();
  // Dropout: each process its own masks, drawn from (seed, rank, step), so that a resumed job draws them again alike
  if (rank_ > 0)
    manual_seed(c.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank_) + static_cast<uint64_t>(s_.step)));
  auto emit = [this](const Row& row) { each_callback([&](Callback& cb) { cb.on_row(*this, row); }); };
  if (lead()) {  // the files and the figures: the lead's alone
    add_callback(std::make_shared<Profiling>());
    add_callback(std::make_shared<LogRows>(emit));
    add_callback(std::make_shared<Validation>(emit));
  }
  add_callback(std::make_shared<Checkpoints>());
}

bool Trainer::stop_requested() const {
  if (world_ > 1) return stop_agreed_;
  return flags_.stop_requested && flags_.stop_requested();
}

Trainer::~Trainer() = default;

// What the options ask of the task and model, checked before any training it would follow.
void Trainer::check_options() const {
  const Config& c = r_.c;
  for (int64_t i : c.dump_decomposition)
    ASC_CHECK(i >= 0 && i < r_.task.test->size(), "--dump-decomposition {}: the test split has {} examples", i,
              r_.task.test->size());
  ASC_CHECK(c.cluster_metrics == 0 ||
                (r_.classifier && c.model != "asam" && c.model != "window" && c.model != "window-global"),
            "--cluster-metrics needs the attention classifier with dense or ASCender attention (--model dense or "
            "ascender)");
  ASC_CHECK(!c.robustness || r_.classifier,
            "--robustness needs an attention classifier (--model dense, ascender, asam, "
            "window or window-global)");
  ASC_CHECK(!c.robustness || (c.robustness_max_len & (c.robustness_max_len - 1)) == 0,
            "--robustness-max-len must be a power of two, got {}", c.robustness_max_len);
  ASC_CHECK(c.cluster_metrics == 0 || r_.task.test->get(0).groups.defined(),
            "--cluster-metrics needs a task whose examples carry their tokens' true groups (--task grouping)");
  ASC_CHECK(
      c.dump_decomposition.empty() ||
          std::any_of(r_.attention.begin(), r_.attention.end(),
                      [](const auto& a) { return std::dynamic_pointer_cast<nn::AscenderAttention>(a) != nullptr; }),
      "--dump-decomposition needs ASCender attention (--model ascender, or --model lm --lm-attention ascender)");
}

// The run directory: a fresh one (refusing one that holds a run), the resumed one (its checkpoint loaded, its
// metrics cut back to it), or with eval_only the model file loaded; config.json written; the clock started.
void Trainer::prepare_outputs() {
  const fs::path last_ckpt = out_ / "ckpt" / "last.safetensors";
  if (!flags_.eval_only.empty()) r_.model->load_state_dict(load_safetensors(flags_.eval_only));
  if (!lead()) {  // another rank of a job: it writes nothing, and resumes from the lead's checkpoint
    if (flags_.resume && fs::exists(last_ckpt))
      s_ = load_training_state(last_ckpt.string(), r_, o_, [this](const LoopState& s) {
        in_->train_mech.set_state(s.mech_train);
        loader_->set_state(s.loader);
      });
    in_->t_start = Clock::now();
    return;
  }
  fs::create_directories(out_ / "ckpt");  // only now: a run refused while it was set up leaves nothing on disk
  // A temporary file is a write a killed process never finished (core/atomic_file.h): the file it would have
  // replaced is intact, and this process writes it again.
  // Only the trainer's own: an --out directory may hold other files.
  for (const char* name : {"config.json", "summary.json", "predictions.csv", "best.safetensors", "cluster_metrics.json",
                           "robustness.json", "profile.txt", "profile_trace.json", "ckpt/last.safetensors"})
    fs::remove(out_ / (std::string(name) + ".tmp"));
  if (fs::is_directory(out_ / "dumps"))
    for (const auto& e : fs::directory_iterator(out_ / "dumps"))
      if (e.is_regular_file() && e.path().string().ends_with(".safetensors.tmp")) fs::remove(e.path());
  bool fresh = flags_.eval_only.empty();
  if (flags_.eval_only.empty() && flags_.resume && fs::exists(last_ckpt)) {
    // the loader's position and the mechanism sums are set (or refused) before the tensors are loaded
    s_ = load_training_state(last_ckpt.string(), r_, o_, [this](const LoopState& s) {
      in_->train_mech.set_state(s.mech_train);
      loader_->set_state(s.loader);
    });
    // A finished run extended (--steps past its end) is unfinished again: its summary goes first, so that a kill
    // from here on leaves a run that resumes rather than one that looks finished.
    if (s_.step < total_ && fs::exists(out_ / "summary.json")) asc::remove_durably((out_ / "summary.json").string());
    if (s_.metrics_csv_bytes >= 0)
      cut_metrics(out_, s_.metrics_csv_bytes, s_.metrics_jsonl_bytes);
    else
      truncate_metrics(out_, s_.step);  // a checkpoint of an older version: by step
    fresh = false;
  }
  // (--resume before the first checkpoint: the run starts again from step 0, its files from the beginning.)
  if (flags_.eval_only.empty()) {
    // A resumed run whose options are unchanged keeps its config.json (and the command that started it).
    const std::string opts = config_json(r_.c);
    bool same = false;
    if (flags_.resume) try {
        std::ifstream f(out_ / "config.json");
        json old = json::parse(f);
        old.erase("git_commit"), old.erase("command");
        same = old.dump(2) + "\n" == opts;
      } catch (const std::exception&) {
        same = false;
      }
    if (!same)
      write_file_atomic(out_ / "config.json",
                        config_json(r_.c, {{"git_commit", git_commit()}, {"command", flags_.command}}));
  }
  in_->metrics = std::make_unique<MetricsWriter>(out_, in_->mech.columns(), r_.is_lm(), fresh);
  in_->t_start = Clock::now();
  const auto& sched = *o_.scheduler;
  in_->lr_used = s_.step > 0 && sched.last_step() > 0 ? sched.lr_at(0, sched.last_step() - 1) : o_.optimizer->lr(0);
  in_->window_t0 = elapsed();
  reset_cpu_peak_memory();
}

void Trainer::checkpoint() {
  if (!lead()) {  // the lead writes the job's checkpoint; the ranks' states are the same but for their data shards
    in_->saved_step = s_.step;
    return;
  }
  const double t0 = elapsed();
  // wall_s in the checkpoint: the time so far, so that a resumed run's clock goes on from it
  s_.wall_s = t0, in_->t_start = Clock::now();
  s_.loader = loader_->state();
  s_.mech_train = in_->train_mech.state();
  in_->metrics->sync();  // the rows up to this step on disk before the checkpoint records where they end
  s_.metrics_csv_bytes = in_->metrics->csv_bytes(), s_.metrics_jsonl_bytes = in_->metrics->jsonl_bytes();
  save_training_state((out_ / "ckpt" / "last.safetensors").string(), r_, o_, s_);
  in_->saved_step = s_.step;
  in_->paused += elapsed() - t0;
}

double Trainer::elapsed() const {
  return s_.wall_s + std::chrono::duration<double>(Clock::now() - in_->t_start).count();
}

void Trainer::print(const std::string& text) const { flags_.print(text); }

int64_t Trainer::model_parameters() const { return in_->n_params; }

// ---- the loop -----------------------------------------------------------------------------------------------------

bool Trainer::fit() {
  if (!flags_.eval_only.empty()) return true;  // nothing to train
  r_.model->train();
  each_callback([this](Callback& cb) { cb.on_train_begin(*this); });
  bool stopped = false;
  while (s_.step < total_ && !stopped) {
    each_callback([this](Callback& cb) { cb.on_step_begin(*this); });
    train_step(loader_->next());
    each_callback([this](Callback& cb) { cb.on_step_end(*this); });
    fault::step_point(rank_, s_.step);  // the crash tests' lost rank (core/fault.h); nothing otherwise
    each_callback([&](Callback& cb) { stopped = cb.should_stop(*this) || stopped; });
    if (world_ > 1) {  // a callback may see what only the lead computes (validation): every rank stops if one does
      const Tensor v = full({1}, stopped ? 1.0 : 0.0, {.dtype = kFloat64, .device = r_.device});
      flags_.group->all_reduce(v, distributed::ReduceOp::Max);
      stopped = v.item<double>() > 0;
    }
  }
  // A callback's stop: the state to resume from, unless the trainer's own checkpoint of this step came last.
  if (stopped && in_->saved_step != s_.step) checkpoint();
  each_callback([&](Callback& cb) { cb.on_train_end(*this, stopped); });
  return !stopped;
}

// One optimizer step: forward, backward, the gradient norm (clipped to --clip when it is set; --clip 0 only measures
// it), the update — or, for a NaN or infinite loss or norm, an error or with --on-nonfinite skip no update, counted —
// the scheduler, and the step's sums for the next log row.
void Trainer::train_step(const data::Batch& b) {
  const Config& c = r_.c;
  optim::Optimizer& opt = *o_.optimizer;
  opt.zero_grad();
  if (o_.master) r_.model->zero_grad();  // the optimizer's parameters are the masters: the model's own .grad too
  double lm_denominator = 0;             // one process: the batch's own predicted bytes
  if (world_ > 1 && r_.is_lm()) {
    // The LM's loss is a mean over the step's predicted bytes, which the ranks' shares hold unequally: each rank
    // divides its sum by (all ranks' bytes / N), and the average of the ranks' gradients is the whole batch's mean's
    const int64_t T = b.input.size(1);
    const double mine = b.valid.defined() ? sum(b.valid.narrow(1, 1, T - 1).to(kFloat64)).item<double>()
                                          : static_cast<double>(b.size() * (T - 1));
    const Tensor n = full({1}, mine, {.dtype = kFloat64, .device = r_.device});
    flags_.group->all_reduce(n);
    lm_denominator = n.item<double>() / world_;
  }
  BatchResult br = run_batch(r_, b, true, lm_denominator);
  in_->train_mech.observe();
  br.loss.backward();  // several processes: DDP's hooks average the gradients as they come
  br.read();           // the step's one read of its figures, with the backward queued
  double tokens = static_cast<double>(b.tokens);
  if (world_ > 1) {
    // The step's figures over every rank (the whole batch's, as one process has them) and the stop request any rank
    // saw: the same loss decides a non-finite step everywhere, and every rank stops after the same step
    const bool stop = flags_.stop_requested && flags_.stop_requested();
    const Tensor v =
        tensor({br.task_loss_sum, br.correct, br.count, tokens, stop ? 1.0 : 0.0}, {.dtype = kFloat64}).to(r_.device);
    flags_.group->all_reduce(v);
    const std::vector<double> all = v.to(Device::cpu()).to_vector<double>();
    br.task_loss_sum = all[0], br.correct = all[1], br.count = all[2], tokens = all[3];
    stop_agreed_ = all[4] > 0;
  }
  if (o_.master) o_.master->copy_grads_to_master();
  const double grad_norm = optim::clip_grad_norm(
      o_.params, c.clip > 0 ? c.clip : std::numeric_limits<double>::infinity(), 2.0, /*error_if_nonfinite=*/false);
  in_->lr_used = opt.lr(0);
  if (std::isfinite(br.task_loss_sum) && std::isfinite(grad_norm)) {
    opt.step();
    if (o_.master) o_.master->copy_master_to_model();
  } else {
    ++s_.nonfinite_steps;
    ASC_CHECK(c.on_nonfinite == "skip",
              "step {}: the loss ({}) or the gradient norm ({}) is not finite; "
              "--on-nonfinite skip skips such steps and counts them",
              s_.step + 1, br.task_loss_sum, grad_norm);
  }
  o_.scheduler->step();
  ++s_.step;
  const int64_t T = b.input.dim() >= 2 ? b.input.size(1) : 1;
  in_->flops_done += models::count_flops(*r_.model, T).training() * static_cast<double>(b.size());
  if (std::isfinite(br.task_loss_sum))  // a skipped non-finite step is counted, not averaged into the loss
    s_.acc_loss += br.task_loss_sum, s_.acc_correct += br.correct, s_.acc_count += br.count;
  s_.acc_tokens += tokens, in_->window_tokens += tokens;
}

// ---- after training -----------------------------------------------------------------------------------------------

TestResult Trainer::test() {
  if (!lead()) return {};  // the lead's alone (the other ranks of a job have nothing to write)
  if (flags_.eval_only.empty() && fs::exists(out_ / "best.safetensors"))
    r_.model->load_state_dict(load_safetensors((out_ / "best.safetensors").string()));
  std::vector<std::vector<Tensor>> asam_gates(r_.attention.size());
  std::vector<Tensor> firing_sum(2);
  double firing_n = 0;
  TestResult t;
  t.val = evaluate(r_, *r_.task.val, 0, in_->mech, false);
  const auto t0 = Clock::now();  // inference latency: the whole test pass, per example
  t.test = evaluate(r_, *r_.task.test, 0, in_->mech, true, [&](const data::Batch& b) {
    for (size_t l = 0; l < r_.attention.size(); ++l)
      if (auto a = std::dynamic_pointer_cast<nn::AsamAttention>(r_.attention[l]))
        asam_gates[l].push_back(a->last_gate().to(Device::cpu()));
    if (r_.firing) {
      int l = 0;
      for (auto* layer : {r_.firing->hidden.get(), r_.firing->second.get()}) {
        Tensor F = layer->last_gate().to(Device::cpu()).to(kFloat32);
        Tensor s = sum(F.reshape({F.size(0), -1}), {0});
        firing_sum[l] = firing_sum[l].defined() ? firing_sum[l] + s : s;
        ++l;
      }
      firing_n += static_cast<double>(b.size());
    }
  });
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  json mj;
  std::map<std::string, double> flat;
  in_->mech.values(mj, flat);
  in_->metrics->row(s_.step, in_->epoch(s_.step, *loader_), "test", t.test.loss, t.test.accuracy, in_->lr_used,
                    std::nan(""), elapsed(), mj, flat);
  std::string p = "index,label,prediction,correct,loss\n";
  for (const auto& row : t.test.predictions)
    p += fmt::format("{},{},{},{},{}\n", static_cast<int64_t>(row[0]), static_cast<int64_t>(row[1]),
                     static_cast<int64_t>(row[2]), static_cast<int64_t>(row[3]), num(row[4]));
  write_file_atomic(out_ / "predictions.csv", p);
  dumps(asam_gates, firing_sum, firing_n);
  in_->peak_mb = static_cast<double>(cpu_memory_stats().peak_allocated) / (1 << 20);
  return t;
}

// dumps/: the ASAM gate per test sample and head, firing rates per neuron, the ASCender decompositions asked for.
void Trainer::dumps(const std::vector<std::vector<Tensor>>& asam_gates, const std::vector<Tensor>& firing_sum,
                    double firing_n) {
  fs::create_directories(out_ / "dumps");
  StateDict g;
  for (size_t l = 0; l < asam_gates.size(); ++l)
    if (!asam_gates[l].empty()) g.set(fmt::format("L{}.gate", l), cat(asam_gates[l], 0).to(kFloat32));
  if (g.size() > 0) save_safetensors((out_ / "dumps" / "asam_gate.safetensors").string(), g);
  StateDict f;
  for (size_t l = 0; l < firing_sum.size(); ++l)
    if (firing_sum[l].defined()) f.set(fmt::format("L{}.rate", l), firing_sum[l] / std::max(1.0, firing_n));
  if (f.size() > 0) save_safetensors((out_ / "dumps" / "firing_rates.safetensors").string(), f);
  for (int64_t i : r_.c.dump_decomposition)
    dump_decomposition(r_, i, (out_ / "dumps" / fmt::format("decomposition_{}.safetensors", i)).string());
}

void Trainer::write_summary(const TestResult& t) {
  if (!lead()) return;
  const Config& c = r_.c;
  const double len = static_cast<double>(r_.task.max_len);
  json s = {{"task", c.task},
            {"model", c.model},
            {"seed", c.seed},
            {"best_step", s_.best_step},
            {"val_accuracy", jnum(t.val.accuracy)},
            {"val_loss", jnum(t.val.loss)},
            {"test_accuracy", jnum(t.test.accuracy)},
            {"test_loss", jnum(t.test.loss)},
            {"steps", s_.step},
            {"wall_s", elapsed()},
            {"peak_mem_mb", in_->peak_mb},
            {"tokens_per_s", jnum(in_->tokens_per_s)},
            {"params", in_->n_params},
            {"flops_per_token", in_->flops_max.forward / len},
            {"attention_flops_per_token", in_->flops_max.attention / len},
            {"fp32_peak_flops", jnum(in_->peak)},
            {"test_examples", t.test.count},
            {"nonfinite_steps", s_.nonfinite_steps},
            // batches of --batch, the loader and the bookkeeping included (what a user of the model waits for)
            {"test_ms_per_example", jnum(1000 * t.seconds / std::max(1.0, t.test.count))}};
  if (r_.is_lm()) s["test_bits_per_byte"] = t.test.loss / std::log(2.0);
  write_json(out_ / "summary.json", s);
}

// After the test pass and before the summary, whose existence marks a finished run (its peak memory is the one
// test() measured): an analysis that fails writes its error into its file and a warning, not a failed run.
void Trainer::analyses() {
  if (!lead()) return;
  auto analysis = [&](const char* file, const std::function<json()>& f) {
    json j;
    try {
      j = f();
    } catch (const std::exception& e) {
      j = {{"error", e.what()}};
      fmt::print(stderr, "train: warning: {} failed: {}\n", file, e.what());
      r_.model->train();
    }
    write_json(out_ / file, j);
  };
  if (r_.c.cluster_metrics > 0)
    analysis("cluster_metrics.json", [&] { return cluster_metrics(r_, r_.c.cluster_metrics); });
  if (r_.c.robustness) analysis("robustness.json", [&] { return robustness(r_); });
}

json model_size(Run& r) {
  int64_t n = 0;
  for (const Tensor& p : r.model->parameters()) n += p.numel();
  const models::FlopCount f = models::count_flops(*r.model, r.task.max_len);
  const double len = static_cast<double>(r.task.max_len);
  return {{"params", n},
          {"max_len", r.task.max_len},
          {"flops_per_token", f.forward / len},
          {"attention_flops_per_token", f.attention / len}};
}

}  // namespace asc::train
