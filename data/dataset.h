#pragma once
// Datasets: numbered examples a DataLoader (data/loader.h) batches. A task (Fashion-MNIST, ListOps, Pathfinder,
// man-page text, a user's file, the grouping task: data/tasks.h) is three Datasets — train, validation, test —
// plus what a model needs to know about them (vocabulary, classes, length).
//
//   auto task = asc::data::make_task("listops", {.seed = 1});
//   asc::data::Example ex = task.train->get(0);    // ex.input (T) int64 tokens, ex.label in [0, 10)
//
// get() is const and must be safe to call from several threads at once (the loader's prefetch thread calls it
// while the training thread may read the same dataset for evaluation).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace asc::data {

// One example. input: (T) int64 token ids (T may differ between examples; the loader pads) or a float32 tensor of
// a fixed shape (an image, (28, 28)). label: the class, or -1 for an unlabelled example (language modelling reads
// its targets from the tokens). groups: optional (T) int64 side information per token (the grouping task's
// ground-truth cluster of each token); undefined elsewhere.
struct Example {
  Tensor input;
  int64_t label = -1;
  Tensor groups;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size() (anything else is an asc::Error). Thread-safe.
  virtual Example get(int64_t i) const = 0;
};

// A dataset held in memory: examples built once (by a generator or a file reader), returned by value (tensors share
// storage: get() copies no data). The usual base of the tasks in data/tasks.h.
class InMemoryDataset : public Dataset {
 public:
  InMemoryDataset() = default;
  explicit InMemoryDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }
  Example get(int64_t i) const override;
  void push_back(Example e) { examples_.push_back(std::move(e)); }

 private:
  std::vector<Example> examples_;
};

// The examples [begin, end) of another dataset (a validation split cut from a training file).
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Example get(int64_t i) const override;

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

}  // namespace asc::data
