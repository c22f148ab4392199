#pragma once
// Shape / strides: a small inline vector of int64 (no heap allocation; at most kMaxDims dimensions), and the
// shape arithmetic every op needs (numel, contiguous strides, broadcasting, axis wrapping).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/error.h"

namespace asc {

inline constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  explicit Dims(std::span<const int64_t> v) { assign(v.begin(), v.end()); }
  Dims(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }  // NOLINT: implicit on purpose
  static Dims filled(int n, int64_t value) {
    Dims d;
    d.resize(n, value);
    return d;
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  const int64_t* data() const { return d_; }
  int64_t back() const { return d_[n_ - 1]; }
  void push_back(int64_t v) {
    ASC_CHECK(n_ < kMaxDims, "tensor: at most {} dimensions are supported", kMaxDims);
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    ASC_CHECK(n_ < kMaxDims, "tensor: at most {} dimensions are supported", kMaxDims);
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }
  void resize(int n, int64_t fill = 0) {
    ASC_CHECK(n >= 0 && n <= kMaxDims, "tensor: at most {} dimensions are supported (got {})", kMaxDims, n);
    for (int i = n_; i < n; ++i) d_[i] = fill;
    n_ = n;
  }
  std::vector<int64_t> vec() const { return {d_, d_ + n_}; }
  friend bool operator==(const Dims& a, const Dims& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

 private:
  template <class It>
  void assign(It b, It e) {
    n_ = 0;
    for (; b != e; ++b) push_back(*b);
  }
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

using Shape = Dims;
using Strides = Dims;

// ---- checked size arithmetic --------------------------------------------------------------------------------
// Every element count, byte count, stride and offset the framework computes from user-given sizes goes through
// these: a product or sum that does not fit in int64 throws asc::Error naming the op, instead of wrapping around to
// a small number that would size a too-small buffer.
[[noreturn]] void throw_size_overflow(const char* op, const char* what, int64_t a, int64_t b);

inline int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw_size_overflow(op, what, a, b);
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    throw_size_overflow(op, what, a, b);
  return r;
}

// The element count of a shape; throws when a dimension is negative or the product of the nonzero dimensions
// overflows int64 (also refused when another dimension is 0: contiguous strides are such products).
int64_t checked_numel(const Dims& s, const char* op);

// Bytes of `numel` elements of `element_size` bytes; throws when that exceeds the largest object size (2^63 - 1).
inline int64_t checked_nbytes(int64_t numel, size_t element_size, const char* op) {
  return checked_mul(numel, static_cast<int64_t>(element_size), op, "byte count");
}

// The element count of a tensor's shape (every tensor's shape passed checked_numel when it was made).
inline int64_t numel_of(const Dims& s) {
  int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

inline Strides contiguous_strides(const Shape& s) {
  Strides st = Dims::filled(s.size(), 1);
  for (int i = s.size() - 2; i >= 0; --i) st[i] = st[i + 1] * std::max<int64_t>(s[i + 1], 1);
  return st;
}

// Wraps a possibly negative axis into [0, ndim). `op` names the caller in the error.
inline int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t lo = -std::max(ndim, 1), hi = std::max(ndim, 1) - 1;
  ASC_CHECK(dim >= lo && dim <= hi, "{}: dimension {} out of range for a tensor of {} dimensions", op, dim, ndim);
  return static_cast<int>(dim < 0 ? dim + std::max(ndim, 1) : dim);
}

// NumPy broadcasting of two shapes; throws when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Strides that read a tensor of shape `s`/strides `st` as if it had shape `target` (0 on broadcast dims).
Strides broadcast_strides(const Shape& s, const Strides& st, const Shape& target);

}  // namespace asc
