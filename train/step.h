#pragma once
// What the trainer computes per batch and per split (train/trainer.h): a batch's loss and accuracy (run_batch), a
// split's evaluation (evaluate), and the mechanisms' statistics (MechStats: ASCender's omegas, ASAM's gate, the
// firing rates and thresholds) that go into every metrics row.
//
//   asc::train::MechStats mech(run);
//   asc::train::EvalResult v = asc::train::evaluate(run, *run.task.val, 0, mech, false);  // v.loss, v.accuracy
#include <array>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "train/run.h"

namespace asc::train {

using json = nlohmann::ordered_json;

// A finite number as JSON, anything else as null (JSON has no NaN).
inline json jnum(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Mechanism statistics of the model now (parameters) and of the batches seen since the last reset (gates, rates).
class MechStats {
 public:
  explicit MechStats(const Run& r) : r_(r) { reset(); }
  // Column names, fixed for the run (the CSV header).
  std::vector<std::string> columns() const {
    std::vector<std::string> cols;
    for (size_t l = 0; l < r_.attention.size(); ++l) {
      if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r_.attention[l]))
        for (const char* w : {"omega_align", "omega_sep", "omega_coh"})
          for (int64_t h = 0; h < a->options.heads(); ++h) cols.push_back(fmt::format("L{}.{}.h{}", l, w, h));
      if (std::dynamic_pointer_cast<nn::AsamAttention>(r_.attention[l]))
        cols.push_back(fmt::format("L{}.asam_gate", l));
    }
    if (r_.firing)
      for (int l = 0; l < 2; ++l) {
        cols.push_back(fmt::format("L{}.firing_rate", l));
        cols.push_back(fmt::format("L{}.firing_threshold", l));
      }
    return cols;
  }
  void reset() { sums_.assign(slots(), 0.0), counts_.assign(slots(), 0.0); }
  // The sums since the last reset, for a checkpoint: {s0, c0, s1, c1, ...}.
  std::vector<double> state() const {
    std::vector<double> out;
    for (size_t i = 0; i < sums_.size(); ++i) out.push_back(sums_[i]), out.push_back(counts_[i]);
    return out;
  }
  void set_state(const std::vector<double>& v) {
    reset();
    ASC_CHECK(v.size() == 2 * sums_.size(), "checkpoint's mechanism sums have {} values, this model needs {}", v.size(),
              2 * sums_.size());
    for (size_t i = 0; i < sums_.size(); ++i) sums_[i] = v[2 * i], counts_[i] = v[2 * i + 1];
  }
  // After a forward: accumulate the gates and firing rates of that batch.
  void observe() {
    if (sums_.empty()) reset();
    size_t s = 0;
    for (auto& a : r_.attention)
      if (auto asam = std::dynamic_pointer_cast<nn::AsamAttention>(a)) {
        Tensor g = asam->last_gate();
        if (g.defined()) sums_[s] += sum(g).item<double>(), counts_[s] += static_cast<double>(g.numel());
        ++s;
      }
    if (r_.firing)
      for (auto* layer : {r_.firing->hidden.get(), r_.firing->second.get()}) {
        Tensor F = layer->last_gate();
        if (F.defined()) sums_[s] += sum(F).item<double>(), counts_[s] += static_cast<double>(F.numel());
        ++s;
      }
  }
  // {"L0.omega_align": [...], "L0.asam_gate": x, ...} for metrics.jsonl, and the flat columns for the CSV.
  void values(json& mech, std::map<std::string, double>& flat) const {
    size_t s = 0;
    for (size_t l = 0; l < r_.attention.size(); ++l) {
      if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r_.attention[l])) {
        const std::pair<const char*, Tensor> ws[] = {
            {"omega_align", a->omega_align}, {"omega_sep", a->omega_sep}, {"omega_coh", a->omega_coh}};
        for (const auto& [name, w] : ws) {
          std::vector<double> v = w.to(Device::cpu()).to(kFloat64).to_vector<double>();
          mech[fmt::format("L{}.{}", l, name)] = v;
          for (size_t h = 0; h < v.size(); ++h) flat[fmt::format("L{}.{}.h{}", l, name, h)] = v[h];
        }
      }
      if (std::dynamic_pointer_cast<nn::AsamAttention>(r_.attention[l])) {
        const double g = mean_of(s++);
        mech[fmt::format("L{}.asam_gate", l)] = jnum(g);
        flat[fmt::format("L{}.asam_gate", l)] = g;
      }
    }
    if (r_.firing) {
      int l = 0;
      for (auto* layer : {r_.firing->hidden.get(), r_.firing->second.get()}) {
        const double rate = mean_of(s++), sp = mean(layer->SP).item<double>();
        mech[fmt::format("L{}.firing_rate", l)] = jnum(rate);
        mech[fmt::format("L{}.firing_threshold", l)] = sp;
        flat[fmt::format("L{}.firing_rate", l)] = rate;
        flat[fmt::format("L{}.firing_threshold", l)] = sp;
        ++l;
      }
    }
  }

 private:
  size_t slots() const {
    size_t n = 0;
    for (auto& a : r_.attention) n += std::dynamic_pointer_cast<nn::AsamAttention>(a) ? 1 : 0;
    return n + (r_.firing ? 2 : 0);
  }
  double mean_of(size_t s) const { return s < counts_.size() && counts_[s] > 0 ? sums_[s] / counts_[s] : std::nan(""); }
  const Run& r_;
  std::vector<double> sums_, counts_;
};

struct BatchResult {
  Tensor loss;               // scalar: the mean task loss (+ auxiliary losses when training)
  Tensor example_loss;       // (B) per-example loss (classifiers) — for predictions
  Tensor prediction;         // (B) classifiers, or (B, T-1) the LM's next-byte guesses
  double task_loss_sum = 0;  // summed over the examples (classifier) or the predicted bytes (LM)
  double correct = 0, count = 0;
  // The three above as (3) float64 on the model's device until read(): a training step reads them once, after its
  // backward is queued, so the host does not wait for the forward before queueing the backward.
  Tensor sums;
  void read() {
    if (!sums.defined()) return;
    const std::vector<double> v = sums.to_vector<double>();
    task_loss_sum = v[0], correct = v[1], count = v[2];
    sums = Tensor();
  }
};

// One batch through the model: the loss (with the auxiliary losses when training) and the figures; a training batch
// reads its figures with read(), after its backward is queued. lm_denominator > 0: the language model's summed loss is
// divided by it instead of by this batch's predicted bytes (a rank of a data-parallel run divides by the whole step's
// bytes over the ranks, so that the ranks' averaged gradients are those of the whole batch's mean).
BatchResult run_batch(Run& r, const data::Batch& b, bool training, double lm_denominator = 0);

// A classifier's logits (B, classes) of a batch's input (on the run's device, in its dtype): the attention
// classifier, the firing network or the MLP, as training computed them.
Tensor classifier_logits(Run& r, const Tensor& input, const Tensor& valid);
// The class probabilities (N, classes), float64 on the CPU, of every example of `inputs` in order (evaluation mode,
// batches of `batch`, padded as the task's); `progress` after each batch with the examples done. A classifier's run
// only (asc::Error for a language model).
Tensor predict_probabilities(Run& r, const data::Dataset& inputs, int64_t batch,
                             const std::function<void(int64_t done)>& progress = {});

struct EvalResult {
  double loss = 0, accuracy = 0, count = 0;
  std::vector<std::array<double, 5>> predictions;  // index, label, prediction, correct, loss
};

// The split in batches of r.c.batch (at most max_batches, 0: all) in evaluation mode, without gradients; the
// model is back in training mode after. mech is reset and observes every batch; after_batch sees each batch.
EvalResult evaluate(Run& r, const data::Dataset& ds, int64_t max_batches, MechStats& mech, bool keep_predictions,
                    const std::function<void(const data::Batch&)>& after_batch = {});

}  // namespace asc::train
