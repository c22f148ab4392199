#pragma once
// Whole-training checkpoints in one safetensors file: model parameters and buffers ("model."), optimizer state
// ("optim."), scheduler step ("sched."), generator state ("rng.") and float32 master weights ("master."). Resuming from
// one continues training bit-identically to never having stopped.
//
//   asc::save_checkpoint("run.safetensors", {.model = model.get(), .optimizer = &opt, .scheduler = &sched,
//                                            .generator = &asc::default_generator()});
//   asc::load_checkpoint("run.safetensors", {.model = model.get(), .optimizer = &opt, .scheduler = &sched,
//                                            .generator = &asc::default_generator()});
//
// Loading is all-or-nothing: the file is read and every part validated against what it is loaded into before
// anything changes; a truncated or corrupt file, a missing key or a shape mismatch throws asc::Error and leaves
// model, optimizer, scheduler and generator untouched. Plain weights: asc::save_safetensors(path,
// model->state_dict()) / model->load_state_dict(asc::load_safetensors(path)) (nn/safetensors.h).
#include <map>
#include <string>

#include "core/generator.h"
#include "nn/module.h"

namespace asc {
namespace optim {
class Optimizer;
class LRScheduler;
class MasterWeights;
}  // namespace optim

// The pieces of a training run; null members are neither saved nor loaded. master: the float32 master weights of a
// model trained in a lower precision (optim/amp.h), "master." entries, loaded after the model (they round into it).
struct TrainingState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  Generator* generator = nullptr;
  optim::MasterWeights* master = nullptr;
};

void save_checkpoint(const std::string& path, const TrainingState& state,
                     const std::map<std::string, std::string>& metadata = {});
void load_checkpoint(const std::string& path, const TrainingState& state,
                     std::map<std::string, std::string>* metadata = nullptr);
// The same from a checkpoint's entries already read (load_safetensors), e.g. after checking its metadata first;
// `path` names it in messages.
void load_checkpoint(const StateDict& entries, const TrainingState& state, const std::string& path);

}  // namespace asc
