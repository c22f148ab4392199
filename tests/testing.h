#pragma once
// Shared test helpers: random inputs, naive reference comparisons, gradcheck wrappers, error expectations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ascender.h"
#include "core/allocator.h"

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

namespace asc::testing {

// Sets the OpenMP thread count for a scope and restores it after (thread-count determinism tests); without OpenMP
// it does nothing.
struct ThreadCount {
  int saved = 1;
  explicit ThreadCount(int n) {
#ifdef ASC_HAVE_OPENMP
    saved = omp_get_max_threads();
    omp_set_num_threads(n);
#else
    (void)n;
#endif
  }
  ~ThreadCount() {
#ifdef ASC_HAVE_OPENMP
    omp_set_num_threads(saved);
#endif
  }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
};

// GPU test cases start with `if (!gpu_or_skip()) return;`: without a CUDA device they pass, saying so — unless
// ASC_REQUIRE_GPU=1 (the GPU machine's scripts), where a missing device fails them.
// TF32 tensor cores for float32 (asc::cuda::set_allow_tf32) while the scope lives; the previous setting after.
struct Tf32Scope {
  bool saved = cuda::allow_tf32();
  explicit Tf32Scope(bool on) { cuda::set_allow_tf32(on); }
  ~Tf32Scope() { cuda::set_allow_tf32(saved); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;
};

// scaled_dot_product_attention's process-wide backend (asc::set_sdpa_backend) while the scope lives; the previous one
// after.
struct SdpaBackendScope {
  SdpaBackend saved = sdpa_backend();
  explicit SdpaBackendScope(SdpaBackend backend) { set_sdpa_backend(backend); }
  ~SdpaBackendScope() { set_sdpa_backend(saved); }
  SdpaBackendScope(const SdpaBackendScope&) = delete;
  SdpaBackendScope& operator=(const SdpaBackendScope&) = delete;
};

inline bool gpu_or_skip() {
  if (cuda::is_available()) return true;
  const char* require = std::getenv("ASC_REQUIRE_GPU");
  if (require && std::string(require) == "1") FAIL("ASC_REQUIRE_GPU=1 but no CUDA device is available");
  MESSAGE("no CUDA device: skipped");
  return false;
}

// A pattern of T queries over 8 T keys: a window of ±5 keys and i % 21 keys scattered over the 8 T. Blocks of 16 rows
// tile the window and each row holds 0 to 20 rare keys (outside the tile's runs), so that the CPU kernel's rare-key
// dot products end in every tail (a full vector of keys, a padded one of 4 or more, single dots).
inline SparsePattern scattered_rare_keys_pattern(int64_t T) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    auto& row = rows[static_cast<size_t>(i)];
    for (int64_t j = std::max<int64_t>(0, i - 5); j <= std::min<int64_t>(T - 1, i + 5); ++j) row.push_back(j);
    for (int64_t t = 0; t < i % 21; ++t) row.push_back((i * 37 + 353 * t + 11) % (8 * T));
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
  }
  return SparsePattern::from_rows(1, T, 8 * T, std::move(rows));
}

inline Tensor randn64(const Shape& s, bool requires_grad = false, uint64_t seed = 7) {
  Generator g(seed);
  Tensor t = randn(s, {.dtype = kFloat64}, &g);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

inline Tensor randn32(const Shape& s, uint64_t seed = 7) {
  Generator g(seed);
  return randn(s, {.dtype = kFloat32}, &g);
}

// Element-wise |a - b| <= atol + rtol |b| over row-major contents; reports the first mismatch.
inline void check_close(const Tensor& actual, const std::vector<double>& expected, double atol = 1e-6,
                        double rtol = 1e-5) {
  std::vector<double> a = actual.to_vector<double>();
  REQUIRE(a.size() == expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok = (std::isnan(a[i]) && std::isnan(expected[i])) || (std::isinf(a[i]) && a[i] == expected[i]) ||
              std::abs(a[i] - expected[i]) <= atol + rtol * std::abs(expected[i]);
    if (!ok) {
      FAIL_CHECK("element " << i << ": got " << a[i] << ", expected " << expected[i]);
      return;
    }
  }
}

inline void check_close(const Tensor& actual, const Tensor& expected, double atol = 1e-6, double rtol = 1e-5) {
  REQUIRE_MESSAGE(actual.shape() == expected.shape(),
                  fmt::format("shape {} vs expected {}", actual.shape(), expected.shape()));
  check_close(actual, expected.to_vector<double>(), atol, rtol);
}

// gradcheck with a doctest failure message naming the mismatch.
inline void check_grad(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                       autograd::GradcheckOptions opts = {}) {
  auto r = autograd::gradcheck(fn, inputs, opts);
  CHECK_MESSAGE(r.ok, r.message);
}

// Runs `fn`, expects asc::Error whose message contains every fragment.
template <class F>
void check_error(F&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    FAIL_CHECK("expected asc::Error containing '" << *fragments.begin() << "', nothing was thrown");
  } catch (const asc::Error& e) {
    std::string msg = e.what();
    for (const char* f : fragments)
      CHECK_MESSAGE(msg.find(f) != std::string::npos, "message: " << msg << " lacks: " << std::string(f));
  }
}

// Bit-for-bit equality (shape, dtype and every byte of the contents); both undefined counts as equal.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.numel() == 0) return true;  // no bytes to compare (and raw_data() may be null)
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(a.numel()) * a.element_size()) == 0;
}

// While it lives, host memory stands in as "CUDA" storage (it is the registered CUDA allocator), so that a CUDA-device
// tensor can exist in a process without a GPU: the op layer then dispatches to the CUDA entry points (or refuses,
// without the CUDA backend), which must fail with asc::Error, never crash. Only where no real CUDA allocator is
// registered (no GPU); declare it before the tensors it makes. The allocator it replaces comes back when it goes.
class HostMemoryAsCuda final : public Allocator {
 public:
  HostMemoryAsCuda() : previous_(installed()) { register_allocator(Device::Type::CUDA, this); }
  ~HostMemoryAsCuda() override { register_allocator(Device::Type::CUDA, previous_); }
  HostMemoryAsCuda(const HostMemoryAsCuda&) = delete;
  HostMemoryAsCuda& operator=(const HostMemoryAsCuda&) = delete;
  void* allocate(size_t n, Device) override { return n ? std::malloc(n) : nullptr; }
  void deallocate(void* p, size_t) override { std::free(p); }
  void copy(void* d, const void* s, size_t n) override {
    if (n) std::memcpy(d, s, n);
  }

 private:
  static Allocator* installed() {
    try {
      return allocator_for(Device::cuda());
    } catch (const Error&) {
      return nullptr;  // no CUDA allocator: none comes back
    }
  }
  Allocator* previous_;
};

// Row-major multi-index helpers for naive reference loops.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(static_cast<size_t>(s.size()));
  for (int d = s.size() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}
inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t f = 0;
  for (int d = 0; d < s.size(); ++d) f = f * s[d] + idx[static_cast<size_t>(d)];
  return f;
}

}  // namespace asc::testing
