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

// The random stream of one example: Philox4x32-10 blocks for key `key`, subsequence `index`, counters 0, 1, 2, ...
// Integers and reals are derived here (not by <random>'s distributions, which differ between standard libraries),
// so the same (key, index) gives the same numbers on every machine.
class Stream {
 public:
  Stream(uint64_t key, uint64_t index) : key_(key), index_(index) {}
  uint32_t next() {
    if (pos_ == 4) {
      block_ = philox4x32(key_, counter_++, index_);
      pos_ = 0;
    }
    return block_[pos_++];
  }
  // Uniform in [0, n), n <= 2^32, by multiply-shift (bias below n / 2^32: negligible for the n used here).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<uint64_t>(next()) * static_cast<uint64_t>(n)) >> 32);
  }
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // uniform in [lo, hi]
  double unit() {                                                              // uniform in [0, 1), 53 bits
    const uint32_t hi = next();
    return uint_to_unit_double(hi, next());
  }
  // Approximately N(0, 1): Irwin-Hall, the sum of 12 uniforms minus 6 (mean 0, variance 1, tails cut at +-6).
  double normal() {
    double z = -6.0;
    for (int i = 0; i < 12; ++i) z += unit();
    return z;
  }

 private:
  uint64_t key_, index_, counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int pos_ = 4;
};

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
