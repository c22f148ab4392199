#include "train/checkpoint.h"

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "nn/safetensors.h"
#include "optim/optim.h"

namespace asc {

namespace {
StateDict clone_all(const StateDict& sd) {
  StateDict out;
  NoGradGuard g;
  for (const auto& [n, t] : sd) out.set(n, t.detach().clone());
  return out;
}
}  // namespace

void save_checkpoint(const std::string& path, const TrainingState& s,
                     const std::map<std::string, std::string>& metadata) {
  ASC_CHECK(s.model || s.optimizer || s.scheduler || s.generator || s.master, "save_checkpoint: '{}': nothing to save",
            path);
  StateDict all;
  if (s.model) all.merge(s.model->state_dict(), "model.");
  if (s.optimizer) all.merge(s.optimizer->state_dict(), "optim.");
  if (s.scheduler) all.merge(s.scheduler->state_dict(), "sched.");
  if (s.generator) all.merge(generator_state_dict(*s.generator), "rng.");
  if (s.master) all.merge(s.master->state_dict(), "master.");
  save_safetensors(path, all, metadata);
}

void load_checkpoint(const std::string& path, const TrainingState& s, std::map<std::string, std::string>* metadata) {
  ASC_CHECK(s.model || s.optimizer || s.scheduler || s.generator || s.master,
            "load_checkpoint: '{}': nothing to load into", path);
  const StateDict all = load_safetensors(path, metadata);  // a corrupt or truncated file fails here, before any change
  load_checkpoint(all, s, path);
}

void load_checkpoint(const StateDict& all, const TrainingState& s, const std::string& path) {
  ASC_CHECK(s.model || s.optimizer || s.scheduler || s.generator || s.master,
            "load_checkpoint: '{}': nothing to load into", path);
  // save_checkpoint writes nothing else: an entry outside the five parts is a corrupt name (found by fuzzing:
  // "optim.state.0.0.exp_avg_sq" with one byte dropped fell through every part and the optimizer silently resumed
  // without that buffer).
  const std::pair<const char*, bool> parts[] = {{"model.", s.model != nullptr},
                                                {"optim.", s.optimizer != nullptr},
                                                {"sched.", s.scheduler != nullptr},
                                                {"rng.", s.generator != nullptr},
                                                {"master.", s.master != nullptr}};
  for (const auto& [name, t] : all) {
    bool known = false;
    for (const auto& [part, wanted] : parts) known = known || name.rfind(part, 0) == 0;
    ASC_CHECK(known,
              "load_checkpoint: '{}': unexpected entry '{}' (checkpoint entries start with model., optim., "
              "sched., rng. or master.)",
              path, name);
  }
  for (const auto& [part, wanted] : parts)
    ASC_CHECK(!wanted || !all.sub(part).empty(), "load_checkpoint: '{}' has no '{}*' entries", path, part);
  // Each part validates before it changes anything; a later part failing rolls the earlier ones back, so the
  // whole load is all-or-nothing. (state_dict() of modules and optimizers returns copies of optimizer state but
  // handles to parameters, hence the clone of the model's.)
  StateDict model_backup, optim_backup, sched_backup, master_backup;
  Generator::State rng_backup{};
  if (s.model) model_backup = clone_all(s.model->state_dict());
  if (s.master) master_backup = clone_all(s.master->state_dict());
  if (s.optimizer) optim_backup = s.optimizer->state_dict();
  if (s.scheduler) sched_backup = s.scheduler->state_dict();
  if (s.generator) rng_backup = s.generator->state();
  bool model_tried = false, optim_tried = false, sched_tried = false, master_tried = false;
  try {
    if (s.model) model_tried = true, s.model->load_state_dict(all.sub("model."));
    if (s.optimizer) optim_tried = true, s.optimizer->load_state_dict(all.sub("optim."));
    if (s.scheduler) sched_tried = true, s.scheduler->load_state_dict(all.sub("sched."));
    if (s.generator) load_generator_state(*s.generator, all.sub("rng."));
    if (s.master) master_tried = true, s.master->load_state_dict(all.sub("master."));
  } catch (const Error& e) {
    // Restore every part that was attempted (the failing one included, in case it failed midway); the masters
    // first, since restoring them rounds them into the model, whose own backup then restores it exactly.
    if (master_tried) s.master->load_state_dict(master_backup);
    if (model_tried) s.model->load_state_dict(model_backup);
    if (optim_tried) s.optimizer->load_state_dict(optim_backup);
    if (sched_tried) s.scheduler->load_state_dict(sched_backup);
    if (s.generator) s.generator->set_state(rng_backup);
    ASC_THROW("load_checkpoint: '{}': {}", path, e.what());
  }
}

}  // namespace asc
