// A batch's loss and figures, a split's evaluation (train/step.h).
#include "train/step.h"

#include <optional>

#include "core/autocast.h"
#include "data/loader.h"

namespace asc::train {

Tensor classifier_logits(Run& r, const Tensor& input, const Tensor& valid) {
  ASC_CHECK(!r.is_lm(), "classifier_logits: the run's model is a language model (sample continues its text)");
  return r.firing ? r.firing->forward(input.reshape({input.size(0), -1}))
         : r.mlp  ? r.mlp->forward(input.reshape({input.size(0), -1}))
                  : r.classifier->forward(input, valid);  // (B, classes)
}

Tensor predict_probabilities(Run& r, const data::Dataset& inputs, int64_t batch,
                             const std::function<void(int64_t)>& progress) {
  ASC_CHECK(!r.is_lm(), "predict: the run's model is a language model (sample continues its text)");
  ASC_CHECK(batch >= 1, "predict: batch must be >= 1, got {}", batch);
  NoGradGuard ng;
  std::optional<CpuAutocast> autocast;
  if (r.cpu_autocast) autocast.emplace();
  const bool was_training = r.model->is_training();
  r.model->eval();
  std::vector<Tensor> parts;
  int64_t done = 0;
  try {
    data::for_each_batch(inputs, batch, r.task.pad_id, [&](const data::Batch& b) {
      Tensor input = b.input.to(r.device), valid = b.valid.defined() ? b.valid.to(r.device) : Tensor();
      if (is_floating(input.dtype()) && input.dtype() != r.dtype) input = input.to(r.dtype);
      parts.push_back(softmax(classifier_logits(r, input, valid).to(kFloat64), -1).to(Device::cpu()));
      done += b.size();
      if (progress) progress(done);
    });
  } catch (...) {
    if (was_training) r.model->train();  // the mode as it was
    throw;
  }
  if (was_training) r.model->train();
  ASC_CHECK(!parts.empty(), "predict: no inputs");
  return cat(parts, 0);  // (N, classes)
}

BatchResult run_batch(Run& r, const data::Batch& b, bool training, double lm_denominator) {
  BatchResult out;
  std::optional<CpuAutocast> autocast;  // the products recorded under it keep bfloat16 in the backward too
  if (r.cpu_autocast) autocast.emplace();
  Tensor input = b.input.to(r.device), valid = b.valid.defined() ? b.valid.to(r.device) : Tensor();
  if (is_floating(input.dtype()) && input.dtype() != r.dtype) input = input.to(r.dtype);  // images: --dtype
  if (r.is_lm()) {
    const int64_t T = input.size(1);
    ASC_CHECK(T >= 2, "the LM needs sequences of at least 2 tokens, got a batch of length {}", T);
    Tensor logits = r.lm->forward(input).narrow(1, 0, T - 1);  // (B, T-1, V): predicts tokens 1..T-1
    Tensor target = input.narrow(1, 1, T - 1);                 // (B, T-1)
    if (valid.defined()) target = where(valid.narrow(1, 1, T - 1), target, -100.0).to(kInt64);
    const int64_t V = logits.size(2);
    Tensor flat_t = target.reshape({-1});
    Tensor per = cross_entropy(logits.reshape({-1, V}), flat_t, {.reduction = Reduction::None});  // 0 at ignored
    // the predicted bytes, counted in float32 / float64 (exact; bfloat16 is not past 256), the loss divided there
    const DType acc = per.dtype() == kFloat64 ? kFloat64 : kFloat32;
    const Tensor n = sum(ne(flat_t, -100.0).to(acc));
    const Tensor denominator =
        lm_denominator > 0 ? full({}, lm_denominator, {.dtype = acc, .device = r.device}) : clamp(n, 1.0, std::nullopt);
    out.loss = (sum(per).to(acc) / denominator).to(per.dtype());
    out.prediction = argmax(logits, -1);
    NoGradGuard ng;
    out.sums = cat({sum(per).to(kFloat64).view({1}),
                    sum(eq(out.prediction.reshape({-1}), flat_t).to(kFloat64)).view({1}), n.to(kFloat64).view({1})},
                   0);
  } else {
    Tensor logits = classifier_logits(r, input, valid);  // (B, classes)
    Tensor labels = b.labels.to(r.device);
    out.example_loss = cross_entropy(logits, labels, {.reduction = Reduction::None});  // (B)
    out.loss = mean(out.example_loss);
    if (training && r.classifier) {
      Tensor aux = r.classifier->aux_loss();
      out.loss = out.loss + aux;
    }
    out.prediction = argmax(logits, -1);
    NoGradGuard ng;
    out.sums =
        cat({sum(out.example_loss).to(kFloat64).view({1}), sum(eq(out.prediction, labels).to(kFloat64)).view({1}),
             full({1}, static_cast<double>(b.size()), {.dtype = kFloat64, .device = r.device})},
            0);
  }
  if (!training) out.read();  // evaluation reads at once
  return out;
}

EvalResult evaluate(Run& r, const data::Dataset& ds, int64_t max_batches, MechStats& mech, bool keep_predictions,
                    const std::function<void(const data::Batch&)>& after_batch) {
  NoGradGuard ng;
  r.model->eval();
  mech.reset();
  EvalResult e;
  double loss_sum = 0;
  int64_t batches = 0;
  struct Stop {};
  try {
    data::for_each_batch(ds, r.c.batch, r.task.pad_id, [&](const data::Batch& b) {
      if (max_batches > 0 && batches >= max_batches) throw Stop{};
      BatchResult br = run_batch(r, b, false);
      mech.observe();
      if (after_batch) after_batch(b);
      loss_sum += br.task_loss_sum, e.accuracy += br.correct, e.count += br.count;
      if (keep_predictions && !r.is_lm()) {
        std::vector<int64_t> pred = br.prediction.to(Device::cpu()).to_vector<int64_t>();
        std::vector<double> el = br.example_loss.to(Device::cpu()).to(kFloat64).to_vector<double>();
        std::vector<int64_t> lab = b.labels.to_vector<int64_t>();
        for (size_t i = 0; i < pred.size(); ++i)
          e.predictions.push_back({static_cast<double>(b.indices[i]), static_cast<double>(lab[i]),
                                   static_cast<double>(pred[i]), pred[i] == lab[i] ? 1.0 : 0.0, el[i]});
      }
      ++batches;
    });
  } catch (const Stop&) {
  }
  r.model->train();
  e.loss = loss_sum / std::max(1.0, e.count);
  e.accuracy /= std::max(1.0, e.count);
  return e;
}

}  // namespace asc::train
