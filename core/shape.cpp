#include "core/shape.h"

#include "core/format.h"

namespace asc {

void throw_size_overflow(const char* op, const char* what, int64_t a, int64_t b) {
  ASC_THROW("{}: {} overflow: {} and {} give a result that does not fit in 64 bits", op, what, a, b);
}

int64_t checked_numel(const Dims& s, const char* op) {
  for (auto v : s) ASC_CHECK(v >= 0, "{}: negative dimension in shape {}", op, s);
  int64_t n = 1;
  bool empty = false;
  for (auto v : s) {
    empty |= v == 0;
    if (v > 1 && __builtin_mul_overflow(n, v, &n)) [[unlikely]]
      ASC_THROW("{}: shape {} has more elements than fit in 64 bits", op, s);
  }
  return empty ? 0 : n;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = std::max(a.size(), b.size());
  Shape out = Dims::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.size() - n + i, ib = b.size() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    ASC_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} are not broadcastable", op, a, b);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Strides broadcast_strides(const Shape& s, const Strides& st, const Shape& target) {
  int n = target.size();
  Strides out = Dims::filled(n, 0);
  for (int i = 0; i < s.size(); ++i) {
    int j = n - s.size() + i;
    out[j] = (s[i] == 1 && target[j] != 1) ? 0 : st[i];
  }
  return out;
}

}  // namespace asc
