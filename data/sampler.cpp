// DistributedSampler (data/sampler.h).
#include "data/sampler.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <new>
#include <numeric>
#include <stdexcept>

#include "core/error.h"
#include "core/generator.h"
#include "ops/ops.h"

namespace asc::distributed {

// ---- DistributedSampler ----------------------------------------------------------------------------------------

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options)
    : n_(dataset_size), rank_(rank), world_(world_size), options_(options) {
  ASC_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got {}", world_size);
  ASC_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank {} is not in a world of size {} (0 <= rank < {})",
            rank, world_size, world_size);
  ASC_CHECK(dataset_size >= 1, "DistributedSampler: the dataset is empty (size {})", dataset_size);
  ASC_CHECK(!options.drop_last || dataset_size >= world_size,
            "DistributedSampler: drop_last with {} examples for {} ranks leaves none", dataset_size, world_size);
  // Without drop_last the padded length num_samples * world_size (< dataset_size + world_size) must fit in int64.
  ASC_CHECK(options.drop_last || dataset_size <= std::numeric_limits<int64_t>::max() - (world_size - 1),
            "DistributedSampler: dataset_size {} padded to a multiple of {} ranks overflows int64", dataset_size,
            world_size);
  num_samples_ = dataset_size / world_size + (!options.drop_last && dataset_size % world_size != 0 ? 1 : 0);
}

std::vector<int64_t> DistributedSampler::indices() const {
  // Memory: this rank's num_samples indices, plus, when shuffling, the whole permutation and its random keys
  // (16 bytes per example). Refused with an asc::Error rather than std::bad_alloc / std::length_error, or an
  // out-of-memory kill, when that is more than the machine has.
  const double bytes =
      8.0 * static_cast<double>(num_samples_) + (options_.shuffle ? 16.0 * static_cast<double>(n_) : 0.0);
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  ASC_CHECK(physical <= 0 || bytes <= physical,
            "DistributedSampler.indices: {} examples{} need {:.3g} GiB, more than this machine's {:.3g} GiB", n_,
            options_.shuffle ? " shuffled" : "", bytes / (1 << 30), physical / (1 << 30));
  try {
    // Position p of the padded order is the permutation's element p mod n (the padding repeats its start); this
    // rank reads positions rank, rank + world, ...: no position reaches num_samples * world, which fits in int64.
    std::vector<int64_t> order;
    if (options_.shuffle) {  // sort by random keys: the same permutation on every rank for (seed, epoch)
      order.resize(static_cast<size_t>(n_));
      std::iota(order.begin(), order.end(), 0);
      Generator g(options_.seed + static_cast<uint64_t>(epoch_));  // wraps for any epoch: still one seed per epoch
      const auto keys = rand({n_}, {.dtype = kFloat64}, &g).to_vector<double>();
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    }
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>(num_samples_));
    for (int64_t k = 0; k < num_samples_; ++k) {
      const int64_t p = (rank_ + k * world_) % n_;
      mine.push_back(options_.shuffle ? order[static_cast<size_t>(p)] : p);
    }
    return mine;
  } catch (const std::bad_alloc&) {
    ASC_THROW("DistributedSampler.indices: out of memory for {} examples ({} per rank)", n_, num_samples_);
  } catch (const std::length_error&) {
    ASC_THROW("DistributedSampler.indices: out of memory for {} examples ({} per rank)", n_, num_samples_);
  }
}

}  // namespace asc::distributed
