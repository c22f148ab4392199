#pragma once
// Which examples each rank of a data-parallel run reads (train/distributed.h), and the order of every epoch of the
// data loader (data/loader.h), which is this sampler's with one rank:
//
//   asc::distributed::DistributedSampler sampler(dataset_size, *pg);  // or (dataset_size, rank, world_size)
//   sampler.set_epoch(epoch);                                         // a new shuffle, the same on every rank
//   for (int64_t i : sampler.indices()) ...
#include <cstdint>
#include <vector>

namespace asc::distributed {

// Which examples this rank reads: a permutation of [0, dataset_size) (shuffled with seed + epoch, the same on every
// rank), padded by repeating its start to a multiple of the world size (or cut to one, with drop_last), and every
// world-th element from position `rank`.
// Accepted: dataset_size >= 1 (with drop_last >= world_size; without it, dataset_size + world_size - 1 must fit in
// int64), world_size >= 1, 0 <= rank < world_size; any seed and any epoch (seed + epoch wraps modulo 2^64).
// indices() holds this rank's share (8 bytes an index) and, when shuffling, the whole permutation (16 bytes an
// example): more than the machine's memory is an asc::Error. Anything else is an asc::Error naming the value.
struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options = {});
  // A process group's share (train/process_group.h: anything with rank() and size()).
  template <class Group>
  requires requires(const Group& g) { g.rank(), g.size(); }
  DistributedSampler(int64_t dataset_size, const Group& group, SamplerOptions options = {})
      : DistributedSampler(dataset_size, group.rank(), group.size(), options) {}
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t num_samples() const { return num_samples_; }  // per rank, every epoch
  std::vector<int64_t> indices() const;

 private:
  int64_t n_, num_samples_, epoch_ = 0;
  int rank_, world_;
  SamplerOptions options_;
};

}  // namespace asc::distributed
