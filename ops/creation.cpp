// The creation functions declared in core/tensor.h: empty, full / zeros / ones (and *_like), arange, eye, rand, randn,
// randint and tensor(values). Filled by the fill / random kernels, or on the host and copied to the device.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/format.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace asc {

// ---- creation ---------------------------------------------------------------------------------------------------

Tensor empty(const Shape& shape, TensorOptions opts) { return Tensor::empty(shape, opts); }

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = Tensor::empty(shape, opts);
  ASC_KERNEL(opts.device, "full", fill, t, value);
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, t.options()); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

namespace {
// A tensor of `shape` whose elements fill(p) writes on the host (p: the element type's pointer, row-major), then
// moved to opts.device: how creation ops with computed contents (arange, eye, tensor(values)) are made.
template <class Fill>
Tensor host_filled(const char* op, const Shape& shape, TensorOptions opts, Fill fill) {
  // The 16-bit floats have no host arithmetic type: filled in float32 and rounded once (a bfloat16 model on CUDA asks
  // for eye and arange in its dtype).
  const DType fill_dtype = is_reduced_float(opts.dtype) ? kFloat32 : opts.dtype;
  Tensor host = Tensor::empty(shape, {fill_dtype, Device::cpu()});
  ASC_DISPATCH_ALL(fill_dtype, op, [&] { fill(host.data_ptr<scalar_t>()); });
  if (fill_dtype != opts.dtype) host = host.to(opts.dtype);
  Tensor t = host.to(opts.device);
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor arange(double start, double end, double step, TensorOptions opts) {
  ASC_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
            "arange: invalid range [{}, {}) step {}", start, end, step);
  const double count = std::ceil((end - start) / step);
  // 2^53: beyond it consecutive values are no longer distinct doubles (and the cast to int64 below would overflow).
  ASC_CHECK(std::isfinite(count) && count <= 9007199254740992.0,
            "arange: range [{}, {}) step {} has {} elements, more than 2^53", start, end, step, count);
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  return host_filled("arange", {n}, opts, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
}
Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

Tensor eye(int64_t n, TensorOptions opts) {
  ASC_CHECK(n >= 0, "eye: negative size {}", n);
  checked_nbytes(checked_numel({n, n}, "eye"), dtype_size(opts.dtype), "eye");  // n * n, named as eye's
  return host_filled("eye", {n, n}, opts, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::fill(p, p + n * n, T(0));
    for (int64_t i = 0; i < n; ++i) p[i * n + i] = T(1);
  });
}

Tensor eye(int64_t n, int64_t m, TensorOptions opts) {
  ASC_CHECK(n >= 0 && m >= 0, "eye: negative size ({}, {})", n, m);
  checked_nbytes(checked_numel({n, m}, "eye"), dtype_size(opts.dtype), "eye");
  return host_filled("eye", {n, m}, opts, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::fill(p, p + n * m, T(0));
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = T(1);
  });
}

namespace {
template <class Fill>
Tensor random_tensor(const Shape& shape, TensorOptions opts, Generator* gen, uint64_t per_block, Fill fill) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = Tensor::empty(shape, opts);
  Generator& g = gen ? *gen : default_generator();
  uint64_t n = static_cast<uint64_t>(t.numel());
  const Generator::State s = g.draw((n + per_block - 1) / per_block);
  fill(t, s.seed, s.offset);
  if (rg) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(is_floating(opts.dtype), "rand: expected a floating-point dtype, got {}", opts.dtype);
  uint64_t per = opts.dtype == kFloat64 ? 2 : 4;
  return random_tensor(shape, opts, gen, per, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "rand", uniform, t, seed, off, 0.0, 1.0);
  });
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(is_floating(opts.dtype), "randn: expected a floating-point dtype, got {}", opts.dtype);
  return random_tensor(shape, opts, gen, 2, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "randn", normal, t, seed, off, 0.0, 1.0);
  });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(low < high, "randint: empty range [{}, {})", low, high);
  ASC_CHECK(opts.dtype == kInt64, "randint: dtype must be int64, got {}", opts.dtype);
  return random_tensor(shape, opts, gen, 2, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "randint", randint, t, seed, off, low, high);
  });
}

Tensor rand_like(const Tensor& t, Generator* gen) {
  ASC_CHECK(t.defined(), "rand_like: undefined tensor");
  return rand(t.shape(), {.dtype = t.dtype(), .device = t.device()}, gen);
}
Tensor randn_like(const Tensor& t, Generator* gen) {
  ASC_CHECK(t.defined(), "randn_like: undefined tensor");
  return randn(t.shape(), {.dtype = t.dtype(), .device = t.device()}, gen);
}

// Inverse-CDF draws on the host from float64 uniforms of `gen`: one uniform per sample. Without replacement each
// draw zeroes the chosen weight and searches the rest (num_samples x C per row: sampling a few tokens from a
// vocabulary, as sampling does, not a permutation of a large one).
Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement, Generator* gen) {
  ASC_CHECK(weights.defined() && (weights.dim() == 1 || weights.dim() == 2) && is_floating(weights.dtype()),
            "multinomial: expected floating-point weights (C) or (N, C), got {} {}",
            weights.defined() ? dtype_name(weights.dtype()) : "undefined",
            weights.defined() ? weights.shape() : Shape{});
  const int64_t C = weights.size(-1), N = weights.dim() == 2 ? weights.size(0) : 1;
  ASC_CHECK(C > 0, "multinomial: no categories (the last dim is 0)");
  ASC_CHECK(num_samples > 0, "multinomial: num_samples must be > 0, got {}", num_samples);
  ASC_CHECK(replacement || num_samples <= C,
            "multinomial: {} samples without replacement from {} categories (set replacement)", num_samples, C);
  const std::vector<double> w = weights.detach().to(kFloat64).cpu().contiguous().to_vector<double>();
  for (int64_t r = 0; r < N; ++r) {
    int64_t nonzero = 0;
    double total = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double v = w[static_cast<size_t>(r * C + j)];
      ASC_CHECK(std::isfinite(v) && v >= 0, "multinomial: weights must be finite and >= 0, got {} (row {}, column {})",
                v, r, j);
      nonzero += v > 0, total += v;
    }
    ASC_CHECK(total > 0, "multinomial: row {} has no non-zero weight", r);
    ASC_CHECK(replacement || num_samples <= nonzero,
              "multinomial: {} samples without replacement, but row {} has only {} non-zero weights", num_samples, r,
              nonzero);
  }
  const std::vector<double> u = rand({N, num_samples}, {.dtype = kFloat64}, gen).to_vector<double>();
  std::vector<int64_t> out(static_cast<size_t>(N * num_samples));
  std::vector<double> row(static_cast<size_t>(C));
  for (int64_t r = 0; r < N; ++r) {
    std::copy(w.begin() + r * C, w.begin() + (r + 1) * C, row.begin());
    for (int64_t s = 0; s < num_samples; ++s) {
      double total = 0;
      for (double v : row) total += v;
      const double target = u[static_cast<size_t>(r * num_samples + s)] * total;
      int64_t pick = -1;  // the first category whose running sum passes the target; never one of weight 0
      double acc = 0;
      for (int64_t j = 0; j < C && pick < 0; ++j) {
        acc += row[static_cast<size_t>(j)];
        if (row[static_cast<size_t>(j)] > 0 && acc > target) pick = j;
      }
      if (pick < 0)  // rounding left the target at the total: the last category of non-zero weight
        for (int64_t j = C - 1; j >= 0 && pick < 0; --j)
          if (row[static_cast<size_t>(j)] > 0) pick = j;
      out[static_cast<size_t>(r * num_samples + s)] = pick;
      if (!replacement) row[static_cast<size_t>(pick)] = 0;
    }
  }
  Shape shape = weights.dim() == 2 ? Shape{N, num_samples} : Shape{num_samples};
  return tensor(out, shape, {.dtype = kInt64, .device = weights.device()});
}

namespace {
template <class T>
Tensor from_host(const T* data, size_t n, const Shape& shape, TensorOptions opts) {
  const int64_t numel = checked_numel(shape, "tensor");  // numel_of would overflow for a hostile shape
  ASC_CHECK(static_cast<int64_t>(n) == numel, "tensor: {} values given for shape {} ({} elements)", n, shape, numel);
  return host_filled("tensor", shape, opts, [&](auto* p) {
    using E = std::remove_pointer_t<decltype(p)>;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<E>(data[i]);
  });
}
}  // namespace

Tensor tensor(std::span<const double> values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(std::initializer_list<double> values, const Shape& shape, TensorOptions opts) {
  return from_host(values.begin(), values.size(), shape, opts);
}
Tensor tensor(std::initializer_list<double> values, TensorOptions opts) {
  return from_host(values.begin(), values.size(), {static_cast<int64_t>(values.size())}, opts);
}
Tensor tensor(const std::vector<float>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}

}  // namespace asc
