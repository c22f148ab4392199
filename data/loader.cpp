// collate, DataLoader and for_each_batch (data/loader.h).
//
// Threads. With prefetch > 0 one background thread (the producer) builds batches in order into a queue of at most
// `prefetch` batches; next() (the consumer) takes them out. Both wait on condition variables, never spin. The
// producer only creates plain tensors (empty() + memcpy / loops: no autograd graph, and grad mode is per thread), reads
// the dataset through its const, thread-safe get(), and touches no member the consumer writes while it runs: set_state
// and the destructor stop and join it before they change anything. CPU storage is safe to allocate on one thread and
// free on another (core/storage.cpp: per-thread block caches over malloc).
#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "data/sampler.h"

namespace asc::data {

// ---- collate ----------------------------------------------------------------------------------------------------

namespace {

enum class Kind { Tokens, Floats };

std::string describe(const Tensor& t) { return fmt::format("{} {}", t.dtype(), t.shape()); }

Kind kind_of(const Example& e, size_t k) {
  ASC_CHECK(e.input.defined(), "collate: example {} has no input (undefined tensor)", k);
  ASC_CHECK(e.input.device().is_cpu(), "collate: example {} input is on {}; datasets hold CPU tensors", k,
            e.input.device());
  if (e.input.dtype() == kInt64) {
    ASC_CHECK(e.input.dim() == 1, "collate: example {} input is {}; int64 inputs are (T) token sequences", k,
              describe(e.input));
    return Kind::Tokens;
  }
  ASC_CHECK(e.input.dtype() == kFloat32,
            "collate: example {} input is {}; accepted are (T) int64 token sequences and float32 tensors", k,
            describe(e.input));
  return Kind::Floats;
}

// The tensor's contiguous data; `keep` holds a contiguous copy when `t` is a strided view.
template <class T>
const T* contiguous_data(const Tensor& t, Tensor& keep) {
  keep = t.is_contiguous() ? t : t.detach().contiguous();
  return keep.data_ptr<T>();
}

}  // namespace

Batch collate(const std::vector<Example>& examples, int64_t pad_id) {
  ASC_CHECK(!examples.empty(), "collate: no examples (a batch holds at least one)");
  const int64_t B = static_cast<int64_t>(examples.size());
  // 1. Validate everything: one kind, one shape for floats, groups on all token examples or on none.
  const Kind kind = kind_of(examples[0], 0);
  const bool has_groups = examples[0].groups.defined();
  int64_t T = 0;  // tokens: the longest sequence
  for (size_t k = 0; k < examples.size(); ++k) {
    const Example& e = examples[k];
    const Kind ek = kind_of(e, k);
    ASC_CHECK(ek == kind && (kind == Kind::Tokens || e.input.shape() == examples[0].input.shape()),
              "collate: example {} input is {} but example 0 is {}; one batch holds one kind and, for float inputs, "
              "one shape",
              k, describe(e.input), describe(examples[0].input));
    ASC_CHECK(e.label >= -1, "collate: example {} has label {}; labels are classes >= 0, or -1 (unlabelled)", k,
              e.label);
    ASC_CHECK(e.groups.defined() == has_groups,
              "collate: example {} {} groups but example 0 {}; all or none carry them", k,
              e.groups.defined() ? "has" : "has no", has_groups ? "has" : "has none");
    if (has_groups) {
      ASC_CHECK(kind == Kind::Tokens, "collate: example {} has groups with a float input {}; groups are per token", k,
                describe(e.input));
      ASC_CHECK(e.groups.device().is_cpu() && e.groups.dtype() == kInt64 && e.groups.shape() == e.input.shape(),
                "collate: example {} groups are {} on {}; they must be int64 {} on the CPU, like its input", k,
                describe(e.groups), e.groups.device(), e.input.shape());
    }
    if (kind == Kind::Tokens) T = std::max(T, e.input.size(0));
  }

  // 2. Allocate each tensor once and fill it.
  Batch batch;
  batch.labels = empty({B}, {.dtype = kInt64});  // (B)
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) labels[b] = examples[static_cast<size_t>(b)].label;

  if (kind == Kind::Floats) {
    Shape shape{B};
    for (int64_t s : examples[0].input.shape()) shape.push_back(s);
    batch.input = empty(shape, {.dtype = kFloat32});  // (B, ...)
    const int64_t per = examples[0].input.numel();
    float* out = batch.input.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      Tensor keep;
      const float* src = contiguous_data<float>(examples[static_cast<size_t>(b)].input, keep);
      if (per > 0) std::memcpy(out + b * per, src, static_cast<size_t>(per) * sizeof(float));
    }
    batch.tokens = B * per;
    return batch;
  }

  batch.input = empty({B, T}, {.dtype = kInt64});                   // (B, T)
  batch.valid = empty({B, T}, {.dtype = kBool});                    // (B, T)
  if (has_groups) batch.groups = empty({B, T}, {.dtype = kInt64});  // (B, T)
  int64_t* in = batch.input.data_ptr<int64_t>();
  bool* valid = batch.valid.data_ptr<bool>();
  int64_t* groups = has_groups ? batch.groups.data_ptr<int64_t>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    const Example& e = examples[static_cast<size_t>(b)];
    const int64_t len = e.input.size(0);
    Tensor keep;
    const int64_t* src = contiguous_data<int64_t>(e.input, keep);
    int64_t* row = in + b * T;
    if (len > 0) std::memcpy(row, src, static_cast<size_t>(len) * sizeof(int64_t));
    std::fill(row + len, row + T, pad_id);
    std::fill(valid + b * T, valid + b * T + len, true);
    std::fill(valid + b * T + len, valid + (b + 1) * T, false);
    if (groups) {
      Tensor keep_groups;
      const int64_t* g = contiguous_data<int64_t>(e.groups, keep_groups);
      int64_t* grow = groups + b * T;
      if (len > 0) std::memcpy(grow, g, static_cast<size_t>(len) * sizeof(int64_t));
      std::fill(grow + len, grow + T, int64_t{-1});
    }
    batch.tokens += len;
  }
  return batch;
}

// ---- DataLoader -------------------------------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  ASC_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  const int64_t n = dataset_->size();
  ASC_CHECK(n >= 1, "DataLoader: the dataset is empty (size {})", n);
  ASC_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got {}", options_.batch_size);
  ASC_CHECK(options_.prefetch >= 0 && options_.prefetch <= 64,
            "DataLoader: prefetch must be in [0, 64] batches (0: build on the caller's thread), got {}",
            options_.prefetch);
  ASC_CHECK(options_.world_size >= 1, "DataLoader: world_size must be >= 1, got {}", options_.world_size);
  ASC_CHECK(options_.rank >= 0 && options_.rank < options_.world_size,
            "DataLoader: rank {} is not in a world of size {} (0 <= rank < {})", options_.rank, options_.world_size,
            options_.world_size);
  // The sampler validates the rest of (size, rank, world) and gives this rank's share: ceil(n / world) examples, or
  // with drop_last floor(n / world) — the tail no rank reads is dropped rather than padded with repeats, so that the
  // ranks' batches k together are the batch k of one process reading batch_size x world_size (the global batches
  // of one process and of any number of ranks are the same examples).
  samples_ = distributed::DistributedSampler(n, options_.rank, options_.world_size,
                                             {.shuffle = options_.shuffle, .drop_last = options_.drop_last})
                 .num_samples();
  ASC_CHECK(!options_.drop_last || samples_ >= options_.batch_size,
            "DataLoader: drop_last with batch_size {} but only {} examples per epoch{} leaves no batch",
            options_.batch_size, samples_,
            options_.world_size > 1 ? fmt::format(" on rank {} of {}", options_.rank, options_.world_size) : "");
  batches_per_epoch_ = options_.drop_last ? samples_ / options_.batch_size
                                          : samples_ / options_.batch_size + (samples_ % options_.batch_size != 0);
  if (options_.prefetch > 0) start();
}

DataLoader::~DataLoader() { stop(); }

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch, uint64_t seed) const {
  // The sampler shuffles with seed + epoch: the same permutation for the same (seed, epoch) on every rank and run.
  distributed::DistributedSampler sampler(dataset_->size(), options_.rank, options_.world_size,
                                          {.shuffle = options_.shuffle, .seed = seed, .drop_last = options_.drop_last});
  sampler.set_epoch(epoch);
  return sampler.indices();
}

Batch DataLoader::build(const std::vector<int64_t>& order, int64_t position) const {
  const int64_t begin = position * options_.batch_size;
  const int64_t end = std::min(begin + options_.batch_size, samples_);
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(end - begin));
  for (int64_t k = begin; k < end; ++k) examples.push_back(dataset_->get(order[static_cast<size_t>(k)]));
  Batch batch = collate(examples, options_.pad_id);
  batch.indices.assign(order.begin() + begin, order.begin() + end);
  return batch;
}

void DataLoader::advance(int64_t& epoch, int64_t& position) const {
  if (++position < batches_per_epoch_) return;
  ASC_CHECK(epoch < std::numeric_limits<int64_t>::max(), "DataLoader: the epoch counter reached its maximum {}", epoch);
  ++epoch;
  position = 0;
}

void DataLoader::produce(int64_t epoch, int64_t position, uint64_t seed) {
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  for (;;) {
    {  // wait for room first, so that at most `prefetch` batches are ever built ahead
      std::unique_lock lock(mu_);
      not_full_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    Item item;
    try {
      if (order_epoch != epoch) {
        order = epoch_order(epoch, seed);
        order_epoch = epoch;
      }
      item.batch = build(order, position);
      advance(epoch, position);
    } catch (...) {
      item.error = std::current_exception();  // delivered in order; this thread ends with it
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      queue_.push_back(std::move(item));
    }
    not_empty_.notify_one();
    if (failed) return;
  }
}

void DataLoader::start() {
  stop_ = false;  // no producer runs here: no lock needed
  thread_ = std::thread(&DataLoader::produce, this, epoch_, position_, options_.seed);
}

void DataLoader::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  not_full_.notify_all();
  if (thread_.joinable()) thread_.join();
  queue_.clear();
}

Batch DataLoader::next() {
  if (options_.prefetch == 0) {
    if (cached_epoch_ != epoch_) {
      cached_order_ = epoch_order(epoch_, options_.seed);
      cached_epoch_ = epoch_;
    }
    Batch batch = build(cached_order_, position_);
    advance(epoch_, position_);
    return batch;
  }
  if (!thread_.joinable()) start();  // after an error the producer ended: retry from the failed batch
  Item item;
  {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  not_full_.notify_one();
  if (item.error) {
    thread_.join();  // the producer returns right after queueing its error; the queue is now empty
    std::rethrow_exception(item.error);
  }
  advance(epoch_, position_);
  return std::move(item.batch);
}

void DataLoader::set_state(const LoaderState& s) {
  ASC_CHECK(s.epoch >= 0, "DataLoader.set_state: epoch must be >= 0, got {}", s.epoch);
  ASC_CHECK(s.position >= 0 && s.position < batches_per_epoch_,
            "DataLoader.set_state: position {} is not a batch of an epoch of {} batches (0 <= position < {})",
            s.position, batches_per_epoch_, batches_per_epoch_);
  stop();
  epoch_ = s.epoch;
  position_ = s.position;
  options_.seed = s.seed;
  cached_epoch_ = -1;
  if (options_.prefetch > 0) start();
}

// ---- for_each_batch ---------------------------------------------------------------------------------------------

void for_each_batch(const Dataset& dataset, int64_t batch_size, int64_t pad_id,
                    const std::function<void(const Batch&)>& fn) {
  ASC_CHECK(batch_size >= 1, "for_each_batch: batch_size must be >= 1, got {}", batch_size);
  const int64_t n = dataset.size();
  ASC_CHECK(n >= 1, "for_each_batch: the dataset is empty (size {})", n);
  ASC_CHECK(static_cast<bool>(fn), "for_each_batch: the callback is empty");
  std::vector<Example> examples;
  for (int64_t begin = 0; begin < n; begin += std::min(batch_size, n - begin)) {
    const int64_t end = begin + std::min(batch_size, n - begin);
    examples.clear();
    for (int64_t i = begin; i < end; ++i) examples.push_back(dataset.get(i));
    Batch batch = collate(examples, pad_id);
    batch.indices.resize(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) batch.indices[static_cast<size_t>(i - begin)] = i;
    fn(batch);
  }
}

}  // namespace asc::data
