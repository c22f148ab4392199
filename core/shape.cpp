#include "core/shape.h"

#include "core/format.h"

namespace asc {

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
