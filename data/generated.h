#pragma once
// What the generated tasks (data/listops.cpp, data/pathfinder.cpp, data/grouping.cpp) share: one Philox stream per
// example, and a dataset that makes example i on demand. Not part of the public API.
#include <array>
#include <cstdint>
#include <functional>

#include "core/error.h"
#include "core/generator.h"
#include "data/dataset.h"

namespace asc::data::detail {

// SplitMix64's finaliser: turns (seed, task, split) into a Philox key so nearby seeds give unrelated streams.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The random stream of one example: key = the (seed, task, split) mix, subsequence = the example's index.
using Stream = PhiloxStream;

// A Dataset whose example i is make(i), computed on demand (make is a pure function, so get() is thread-safe).
class GeneratedDataset : public Dataset {
 public:
  GeneratedDataset(int64_t n, std::function<Example(int64_t)> make) : n_(n), make_(std::move(make)) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    ASC_CHECK(i >= 0 && i < n_, "dataset: index {} out of range [0, {})", i, n_);
    return make_(i);
  }

 private:
  int64_t n_;
  std::function<Example(int64_t)> make_;
};

}  // namespace asc::data::detail
