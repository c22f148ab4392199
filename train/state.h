#pragma once
// What a run carries from one process to the next (train/trainer.h): the optimizer and scheduler its Config
// describes, and the training state a checkpoint holds — model, optimizer, scheduler, master weights, the default
// generator, and the loop's own counters (LoopState, typed). Resuming from it continues bit-identically.
//
//   asc::train::Optimization o = asc::train::make_optimization(run, total_steps);
//   asc::train::save_training_state("ckpt/last.safetensors", run, o, state);
//   asc::train::LoopState s = asc::train::load_training_state("ckpt/last.safetensors", run, o);
//
// A checkpoint is one safetensors file (train/checkpoint.h: the tensors' parts) whose metadata hold the LoopState
// under fixed keys and `format_version`. Version 3 adds the metrics files' sizes (the resume point of metrics.csv and
// metrics.jsonl); versions 1 (written before the version key existed) and 2 lack them and load; a version newer than
// this library's is refused. The tensors' bytes and the metadata carry CRC-32 checksums (nn/safetensors.h), checked
// on loading. Loading is all-or-nothing: every key is parsed before
// anything changes.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "optim/optim.h"
#include "train/run.h"

namespace asc::train {

inline constexpr int kCheckpointFormatVersion = 3;

// The loop's counters, saved with every checkpoint.
struct LoopState {
  int64_t step = 0;        // optimizer steps taken
  int64_t best_step = -1;  // the step of the best validation score so far (-1: none yet)
  double best_val = -1;    // that score: accuracy, or for a language model minus the loss
  double wall_s = 0;       // wall time of the earlier processes of this run
  int64_t nonfinite_steps = 0;
  // The training batches' sums since the last log row (a log row averages them).
  double acc_loss = 0, acc_correct = 0, acc_count = 0, acc_tokens = 0;
  data::LoaderState loader;
  // metrics.csv's and metrics.jsonl's sizes when the checkpoint was written (-1: not recorded, versions 1 and 2)
  int64_t metrics_csv_bytes = -1, metrics_jsonl_bytes = -1;
  std::vector<double> mech_train;  // MechStats::state() of the training batches since the last log row
};

// The LoopState as checkpoint metadata (exact: hex floats), and back; asc::Error names the key it refuses.
std::map<std::string, std::string> to_metadata(const LoopState& s);
LoopState loop_state_from_metadata(const std::map<std::string, std::string>& m, const std::string& path);

// The optimizer, scheduler and float32 master weights (--dtype bfloat16) a run's Config describes. With rule A, the
// first firing layer's parameters sit in a group of their own at lr 0 without gradients; rule A / B is attached.
struct Optimization {
  std::vector<Tensor> params;                    // what the optimizer updates and the clipping measures
  std::unique_ptr<optim::MasterWeights> master;  // --dtype bfloat16: float32 masters of the model's parameters
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> scheduler;
};
Optimization make_optimization(Run& r, int64_t total_steps);

void save_training_state(const std::string& path, Run& r, Optimization& o, const LoopState& s);
// `accept` sees the parsed counters before anything is loaded: it may refuse them (asc::Error: a loader position or a
// number of mechanism sums this run cannot take), and the model, optimizer and generator are untouched then.
LoopState load_training_state(const std::string& path, Run& r, Optimization& o,
                              const std::function<void(const LoopState&)>& accept = {});

}  // namespace asc::train
