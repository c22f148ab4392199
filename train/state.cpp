// A run's optimization and its checkpoints (train/state.h).
#include "train/state.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/format.h"
#include "nn/safetensors.h"
#include "train/checkpoint.h"

namespace asc::train {

namespace {

std::string hex(double v) { return fmt::format("{:a}", v); }

// The typed reads of a checkpoint's metadata: each names the file and the key it refuses.
struct MetadataReader {
  const std::map<std::string, std::string>& m;
  const std::string& path;
  const std::string& get(const std::string& k) const {
    auto it = m.find(k);
    ASC_CHECK(it != m.end(), "checkpoint {} lacks '{}' (not written by train?)", path, k);
    return it->second;
  }
  int64_t integer(const std::string& k) const {
    const std::string& v = get(k);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    ASC_CHECK(!v.empty() && *end == '\0' && errno == 0, "checkpoint {}: '{}' is not an integer ('{}')", path, k, v);
    return x;
  }
  double real(const std::string& k) const {  // hex floats (exact) or decimal
    const std::string& v = get(k);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    ASC_CHECK(!v.empty() && *end == '\0', "checkpoint {}: '{}' is not a number ('{}')", path, k, v);
    return x;
  }
  std::vector<double> reals(const std::string& k) const {  // "a,b,c" (empty: none)
    std::vector<double> out;
    const std::string& v = get(k);
    size_t start = 0;
    while (start < v.size()) {
      const size_t end = std::min(v.find(',', start), v.size());
      const std::string item = v.substr(start, end - start);
      char* stop = nullptr;
      out.push_back(std::strtod(item.c_str(), &stop));
      ASC_CHECK(!item.empty() && *stop == '\0', "checkpoint {}: '{}' holds '{}', not a number", path, k, item);
      start = end + 1;
    }
    return out;
  }
};

TrainingState parts(Run& r, Optimization& o) {
  return {.model = r.model.get(),
          .optimizer = o.optimizer.get(),
          .scheduler = o.scheduler.get(),
          .generator = &default_generator(),
          .master = o.master.get()};
}

}  // namespace

std::map<std::string, std::string> to_metadata(const LoopState& s) {
  std::string mech;
  for (size_t i = 0; i < s.mech_train.size(); ++i) {
    if (i > 0) mech += ',';
    mech += hex(s.mech_train[i]);
  }
  return {{"format_version", std::to_string(kCheckpointFormatVersion)},
          {"step", std::to_string(s.step)},
          {"best_step", std::to_string(s.best_step)},
          {"best_val", hex(s.best_val)},
          {"wall_s", std::isfinite(s.wall_s) ? fmt::format("{:.10g}", s.wall_s) : "0"},
          {"nonfinite_steps", std::to_string(s.nonfinite_steps)},
          {"acc.loss", hex(s.acc_loss)},
          {"acc.correct", hex(s.acc_correct)},
          {"acc.count", hex(s.acc_count)},
          {"acc.tokens", hex(s.acc_tokens)},
          {"loader.epoch", std::to_string(s.loader.epoch)},
          {"loader.position", std::to_string(s.loader.position)},
          {"loader.seed", std::to_string(s.loader.seed)},
          {"mech.train", mech},
          {"metrics.csv_bytes", std::to_string(s.metrics_csv_bytes)},
          {"metrics.jsonl_bytes", std::to_string(s.metrics_jsonl_bytes)}};
}

LoopState loop_state_from_metadata(const std::map<std::string, std::string>& m, const std::string& path) {
  const MetadataReader in{m, path};
  const int64_t version = m.count("format_version") ? in.integer("format_version") : 1;
  ASC_CHECK(version >= 1 && version <= kCheckpointFormatVersion,
            "checkpoint {}: format version {}; this trainer reads versions 1 to {} (a newer ascender wrote it?)", path,
            version, kCheckpointFormatVersion);
  LoopState s;
  s.step = in.integer("step"), s.best_step = in.integer("best_step");
  s.best_val = in.real("best_val"), s.wall_s = in.real("wall_s");
  s.nonfinite_steps = m.count("nonfinite_steps") ? in.integer("nonfinite_steps") : 0;  // early version 1: none
  s.acc_loss = in.real("acc.loss"), s.acc_correct = in.real("acc.correct"), s.acc_count = in.real("acc.count");
  s.acc_tokens = in.real("acc.tokens");
  s.loader.epoch = in.integer("loader.epoch"), s.loader.position = in.integer("loader.position");
  const std::string& seed = in.get("loader.seed");
  char* end = nullptr;
  errno = 0;
  s.loader.seed = std::strtoull(seed.c_str(), &end, 10);
  ASC_CHECK(!seed.empty() && std::isdigit(static_cast<unsigned char>(seed[0])) && *end == '\0' && errno == 0,
            "checkpoint {}: 'loader.seed' is not a seed ('{}')", path, seed);
  s.mech_train = in.reals("mech.train");
  if (version >= 3)
    s.metrics_csv_bytes = in.integer("metrics.csv_bytes"), s.metrics_jsonl_bytes = in.integer("metrics.jsonl_bytes");
  // The counters as the loop keeps them (the loader's position and the mechanism sums are checked against the run
  // by load_training_state's `accept`).
  ASC_CHECK(
      s.step >= 0 && s.best_step >= -1 && s.best_step <= s.step && s.nonfinite_steps >= 0 &&
          s.nonfinite_steps <= s.step && s.loader.epoch >= 0 && s.loader.position >= 0,
      "checkpoint {}: inconsistent counters (step {} must be >= 0, best_step {} in [-1, step], nonfinite_steps {} "
      "in [0, step], loader epoch {} and position {} >= 0)",
      path, s.step, s.best_step, s.nonfinite_steps, s.loader.epoch, s.loader.position);
  ASC_CHECK(std::isfinite(s.wall_s) && s.wall_s >= 0, "checkpoint {}: wall_s {} is not a time (>= 0)", path, s.wall_s);
  ASC_CHECK(std::isfinite(s.acc_count) && s.acc_count >= 0 && s.acc_correct >= 0 && s.acc_correct <= s.acc_count &&
                std::isfinite(s.acc_tokens) && s.acc_tokens >= 0,
            "checkpoint {}: inconsistent sums of the training batches (count {}, correct {}, tokens {})", path,
            s.acc_count, s.acc_correct, s.acc_tokens);
  // both sizes, or neither (-1: not recorded, a checkpoint saved outside the trainer)
  ASC_CHECK((s.metrics_csv_bytes == -1 && s.metrics_jsonl_bytes == -1) ||
                (s.metrics_csv_bytes >= 0 && s.metrics_jsonl_bytes >= 0),
            "checkpoint {}: metrics file sizes {} and {} (both >= 0, or both -1: not recorded)", path,
            s.metrics_csv_bytes, s.metrics_jsonl_bytes);
  return s;
}

Optimization make_optimization(Run& r, int64_t total_steps) {
  Config c = r.c;
  resolve_defaults(c);
  Optimization o;
  // Rule A is local only (docs/firing.md §5): the first firing layer's parameters sit in a group of their own at
  // learning rate 0 and weight decay 0, so only the rule moves them; backprop trains the layers after it.
  std::vector<Tensor> params, local;
  const std::vector<Tensor> rule_a_params =
      r.firing && c.rule == "A" ? r.firing->hidden->parameters() : std::vector<Tensor>{};
  for (const Tensor& p : r.model->parameters()) {
    const bool is_local =
        std::any_of(rule_a_params.begin(), rule_a_params.end(), [&](const Tensor& h) { return h.is_same(p); });
    (is_local ? local : params).push_back(p);
  }
  // ... and get no gradient at all: a parameter without a .grad is skipped by the optimizer whatever its group's
  // learning rate becomes (a schedule's --min-lr would otherwise move them).
  for (Tensor& p : local) p.set_requires_grad(false);
  // --dtype bfloat16: the optimizer (and the gradient clipping) work on float32 master copies; after each update the
  // masters are rounded into the model (optim/amp.h). bfloat16 has float32's range, so no loss scaling is needed.
  if (r.dtype == kBFloat16) {
    o.master = std::make_unique<optim::MasterWeights>(params);
    params = o.master->parameters();
  }
  std::unique_ptr<optim::Optimizer>& opt = o.optimizer;
  if (c.optimizer == "adamw") {
    auto g = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay});
    if (!local.empty()) g->add_param_group(local, {.lr = 0.0, .weight_decay = 0.0});
    opt = std::move(g);
  } else if (c.optimizer == "adam") {
    auto g = std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = c.lr, .weight_decay = c.weight_decay});
    if (!local.empty()) g->add_param_group(local, {.lr = 0.0, .weight_decay = 0.0});
    opt = std::move(g);
  } else {
    auto g = std::make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
    if (!local.empty()) g->add_param_group(local, {.lr = 0.0, .momentum = 0.0, .weight_decay = 0.0});
    opt = std::move(g);
  }
  if (r.firing && c.rule == "B")
    opt->add_local_rule(optim::rule_b(*r.firing->hidden, {.eta_w = c.eta_w,
                                                          .eta_f = c.eta_f,
                                                          .eta_sp = c.eta_sp,
                                                          .r_target = c.r_target,
                                                          .w_min = c.w_min,
                                                          .w_max = c.w_max,
                                                          .f_min = c.f_min,
                                                          .f_max = c.f_max}));
  if (r.firing && c.rule == "A")
    opt->add_local_rule(optim::rule_a(*r.firing->hidden, {.eta_plus = c.eta_w,
                                                          .eta_minus = c.eta_w,
                                                          .rho_plus = c.eta_f,
                                                          .rho_minus = c.eta_f,
                                                          .eta_sp = c.eta_sp,
                                                          .w_max = c.w_max,
                                                          .f_max = c.f_max,
                                                          .r_target = c.r_target}));
  ASC_CHECK(!(c.rule != "none" && !r.firing), "--rule {} applies to --model firing only", c.rule);
  std::unique_ptr<optim::LRScheduler>& sched = o.scheduler;
  if (c.schedule == "cosine")
    sched = std::make_unique<optim::WarmupCosine>(
        *opt, optim::WarmupCosineOptions{.warmup_steps = std::min(c.warmup, total_steps),
                                         .total_steps = std::max<int64_t>(total_steps, 1),
                                         .min_lr = c.min_lr});
  else
    sched = std::make_unique<optim::LambdaLR>(*opt, [w = c.warmup](int64_t s) {
      return w > 0 && s < w ? static_cast<double>(s + 1) / static_cast<double>(w) : 1.0;
    });
  o.params = std::move(params);
  return o;
}

void save_training_state(const std::string& path, Run& r, Optimization& o, const LoopState& s) {
  save_checkpoint(path, parts(r, o), to_metadata(s));
}

LoopState load_training_state(const std::string& path, Run& r, Optimization& o,
                              const std::function<void(const LoopState&)>& accept) {
  std::map<std::string, std::string> m;
  const StateDict entries = load_safetensors(path, &m);  // a corrupt or truncated file fails here
  LoopState s = loop_state_from_metadata(m, path);       // then the counters, before anything changes
  if (accept) accept(s);
  load_checkpoint(entries, parts(r, o), path);  // all-or-nothing itself
  return s;
}

}  // namespace asc::train
