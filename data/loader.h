#pragma once
// DataLoader: an endless stream of padded batches from a Dataset (data/dataset.h), shuffled per epoch, built ahead
// on a background thread, and resumable from a three-number checkpoint state. docs/data.md tells the whole story.
//
//   asc::data::DataLoader loader(task.train, {.batch_size = 32, .seed = 1, .pad_id = task.pad_id});
//   for (int64_t step = 0; step < steps; ++step) {
//     asc::data::Batch b = loader.next();                    // b.input (B, T) int64, b.valid (B, T) bool
//     Tensor loss = asc::cross_entropy(model->forward(b.input, b.valid), b.labels);
//     ...
//   }
//   asc::data::LoaderState s = loader.state();                // save with the model; later: loader.set_state(s)
//
// Evaluation reads a dataset once, in order, on the caller's thread:
//   asc::data::for_each_batch(*task.val, 64, task.pad_id, [&](const asc::data::Batch& b) { ... });
//
// The order of epoch e is the permutation DistributedSampler (data/sampler.h) draws from seed + e: a pure function
// of (seed, e), so resuming needs only (epoch, position, seed). With world_size > 1 each rank reads its share of that
// permutation (every world_size-th element from position rank), which the sampler pads (by repeating its start) to a
// multiple of world_size: every rank then has the same number of batches per epoch, and the first
// (world_size - size % world_size) % world_size examples of the permutation are read twice per epoch across the ranks.
// With drop_last the tail is dropped instead (no example twice), and the ranks' batch k of an epoch together hold
// exactly the examples of batch k of one loader of batch_size x world_size: how `train` under mpirun reproduces one
// process's global batches.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"

namespace asc::data {

// Accepted: batch_size >= 1; prefetch in [0, 64]; world_size >= 1 and 0 <= rank < world_size; with drop_last, at least
// one full batch per rank. Any seed and pad_id. Anything else is an asc::Error at construction.
struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;     // false: every epoch reads the examples in index order
  uint64_t seed = 0;       // epoch e is shuffled with seed + e
  bool drop_last = false;  // drop each epoch's last batch when it is smaller than batch_size
  int64_t prefetch = 2;    // batches built ahead on a background thread; 0 = built on the caller's thread in next()
  int64_t pad_id = 0;      // the token padded sequences are filled with
  int rank = 0;            // world_size > 1: this rank's share of every epoch, through DistributedSampler
  int world_size = 1;
};

// A batch of B examples.
struct Batch {
  // (B, T) int64 token ids padded with pad_id to the batch's longest sequence, or (B, ...) float32 for fixed-shape
  // float examples (images), stacked.
  Tensor input;
  // (B, T) bool, true = a real token, false = padding: the key-padding mask that TransformerClassifier::forward(tokens,
  // valid) and the attention layers take. Undefined for float inputs.
  Tensor valid;
  Tensor labels;  // (B) int64; -1 for unlabelled examples
  // (B, T) int64, each token's group, -1 at padding. Defined only when the examples carry groups.
  Tensor groups;
  std::vector<int64_t> indices;  // the dataset index of each row (for per-example predictions)
  int64_t tokens = 0;            // real tokens in the batch (float inputs: every value, B * values per example)
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

// Stacks examples into one batch: one allocation per tensor, filled by plain loops. All examples must be of one kind:
// (T) int64 token sequences (any lengths T >= 0, padded with pad_id; groups, if any, on every example and of its
// length), or float32 tensors of one shape (no groups). Labels must be >= -1. Anything else (an empty list, mixed
// kinds or shapes, an undefined or non-CPU input) is an asc::Error naming the example and the two shapes. Tensors of
// the batch are new plain data (no autograd history). `indices` is left empty: the caller knows where the examples
// came from (the loader and for_each_batch fill it).
Batch collate(const std::vector<Example>& examples, int64_t pad_id);

// The checkpointable position of a loader: the next batch is batch `position` of epoch `epoch` (0 <= position <
// batches_per_epoch) in the order drawn from `seed`.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t seed = 0;
};

class DataLoader {
 public:
  // Starts the prefetch thread (prefetch > 0), which begins building batches at once.
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options = {});
  // Stops the prefetch thread, also while it waits on a full queue: never blocks on a batch nobody reads.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch. After an epoch's last batch the next epoch begins, in a new order. An exception thrown while
  // building a batch (by Dataset::get or collate, also on the prefetch thread) is rethrown here when that batch is
  // due, after the batches before it; the loader stays at that batch, so calling next() again retries it.
  Batch next();

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples_per_epoch() const { return samples_; }  // this rank's examples per epoch (before drop_last)
  int64_t epoch() const { return epoch_; }                // the epoch the next batch belongs to
  int64_t position() const { return position_; }          // batches of that epoch handed out so far
  const LoaderOptions& options() const { return options_; }

  LoaderState state() const { return {epoch_, position_, options_.seed}; }
  // Continues from `s` (epoch >= 0, 0 <= position < batches_per_epoch(); any seed, which replaces options().seed):
  // the next batches are exactly those the loader that saved `s` would have returned. Prefetched batches are
  // discarded and the queue refilled from there. A bad state is an asc::Error and changes nothing.
  void set_state(const LoaderState& s);

 private:
  struct Item {  // one queue entry: a batch, or the error that building it raised
    Batch batch;
    std::exception_ptr error;
  };
  std::vector<int64_t> epoch_order(int64_t epoch, uint64_t seed) const;    // this rank's dataset indices
  Batch build(const std::vector<int64_t>& order, int64_t position) const;  // batch `position` of an epoch
  void advance(int64_t& epoch, int64_t& position) const;                   // to the following batch
  void produce(int64_t epoch, int64_t position, uint64_t seed);            // the prefetch thread's body
  void start();                                                            // prefetch thread from (epoch_, position_)
  void stop();                                                             // joins it, empties the queue

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  int64_t samples_ = 0, batches_per_epoch_ = 0;
  int64_t epoch_ = 0, position_ = 0;  // the consumer's place: the next batch next() returns

  // prefetch == 0: the current epoch's order, computed on the caller's thread.
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_order_;

  // prefetch > 0: the bounded queue between the prefetch thread (producer) and next() (consumer).
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<Item> queue_;  // at most options_.prefetch items
  bool stop_ = false;       // asks the producer to return
  std::thread thread_;      // touched only by the consumer's thread
};

// Reads `dataset` once, in index order, in batches of batch_size (the last one may be smaller), on the caller's
// thread, and calls fn with each: the evaluation loop. batch_size >= 1 and a non-empty dataset, else an asc::Error.
void for_each_batch(const Dataset& dataset, int64_t batch_size, int64_t pad_id,
                    const std::function<void(const Batch&)>& fn);

}  // namespace asc::data
