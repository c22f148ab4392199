#pragma once
// A seeded counter-based random generator (Philox4x32-10, Salmon et al. 2011). A random op of n elements
// reads counters [offset, offset + blocks) and advances offset; element i's value depends only on (seed,
// offset, i), so the CUDA backend can reproduce the CPU stream exactly, thread by thread.
//
//   asc::Generator gen(42);
//   Tensor a = asc::rand({4}, {}, &gen);         // U[0,1)
//   asc::manual_seed(0);                          // reseeds the default generator
#include <array>
#include <cstdint>
#include <mutex>

// philox4x32 and the unit-float conversions run on the host and, compiled by nvcc, on the device (the CUDA random
// kernels call them per element, giving the CPU stream exactly). Same definition as ops/math.h's ASC_HD. This
// header stays C++17-clean for that reason.
#ifndef ASC_HD
#if defined(__CUDACC__)
#define ASC_HD __host__ __device__ __forceinline__
#else
#define ASC_HD inline
#endif
#endif

namespace asc {

// One Philox4x32-10 block: 4 random 32-bit words for (key = seed, counter). Inline: kernels call it per block.
ASC_HD std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t subsequence = 0) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

// 24-bit-mantissa uniform in [0, 1) from one word (float), 53-bit from two words (double).
ASC_HD float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
ASC_HD double uint_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Thread-safe: each method takes the generator's lock, so threads drawing from one generator (the default one,
// e.g. while several threads build models) each get a disjoint range of counters. Which thread gets which range
// depends on their timing; a thread that needs a reproducible stream uses its own Generator.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}
  Generator(const Generator& other) : Generator(other.seed()) { set_state(other.state()); }
  Generator& operator=(const Generator& other) {
    if (this != &other) set_state(other.state());
    return *this;
  }
  void manual_seed(uint64_t seed) { set_state({seed, 0}); }
  uint64_t seed() const { return state().seed; }
  uint64_t offset() const { return state().offset; }
  void set_offset(uint64_t off) {
    std::lock_guard lock(mu_);
    offset_ = off;
  }
  // The full state (seed, offset) for checkpoints and gradient checkpointing.
  struct State {
    uint64_t seed, offset;
  };
  State state() const {
    std::lock_guard lock(mu_);
    return {seed_, offset_};
  }
  void set_state(State s) {
    std::lock_guard lock(mu_);
    seed_ = s.seed;
    offset_ = s.offset;
  }
  // Reserves `blocks` Philox blocks for one op: returns the seed and the first counter of the range, read and advanced
  // together (a seed read separately could come from a manual_seed between the two calls).
  State draw(uint64_t blocks) {
    std::lock_guard lock(mu_);
    const State s{seed_, offset_};
    offset_ += blocks;
    return s;
  }

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// A sequential stream of Philox4x32-10 words for (key, subsequence), counters 0, 1, 2, ...: for code that draws a
// varying number of values per item (one generated example, one bootstrap resample) and must get the same numbers on
// every machine and whatever the thread count. Integers and reals are derived here, not by <random>'s distributions,
// which differ between standard libraries. Not thread-safe: one stream per item.
//
//   asc::PhiloxStream s(/*key=*/seed, /*subsequence=*/example_index);
//   int64_t i = s.below(10);  double u = s.unit();
class PhiloxStream {
 public:
  PhiloxStream(uint64_t key, uint64_t subsequence) : key_(key), subsequence_(subsequence) {}
  uint32_t next() {
    if (pos_ == 4) {
      block_ = philox4x32(key_, counter_++, subsequence_);
      pos_ = 0;
    }
    return block_[pos_++];
  }
  // Uniform in [0, n), n <= 2^32, by multiply-shift (bias below n / 2^32).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<uint64_t>(next()) * static_cast<uint64_t>(n)) >> 32);
  }
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // uniform in [lo, hi]
  double unit() {                                                              // uniform in [0, 1), 53 bits
    const uint32_t hi = next();
    return uint_to_unit_double(hi, next());
  }
  // Approximately N(0, 1): Irwin-Hall, the sum of 12 uniforms minus 6 (mean 0, variance 1, tails cut at +-6); exact
  // IEEE arithmetic, so the same bits everywhere, unlike a libm-based normal.
  double normal() {
    double z = -6.0;
    for (int i = 0; i < 12; ++i) z += unit();
    return z;
  }

 private:
  uint64_t key_, subsequence_, counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int pos_ = 4;
};

// The process-wide default generator (used when an op is given none).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace asc
