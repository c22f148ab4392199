// to_string(tensor) (core/tensor.h): the values, read on the host, with the shape, dtype, device and autograd node.
#include <functional>
#include <string>

#include "autograd/node.h"
#include "core/format.h"
#include "core/tensor.h"

namespace asc {

std::string to_string(const Tensor& t, int max_per_dim) {
  if (!t.defined()) return "tensor(undefined)";
  std::vector<double> v = t.to_vector<double>();
  std::string s = "tensor(";
  Strides st = contiguous_strides(t.shape());
  const bool fl = is_floating(t.dtype());
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == t.dim()) {
      double x = v[static_cast<size_t>(base)];
      if (t.dtype() == kBool)
        s += x != 0 ? "true" : "false";
      else if (fl)
        s += fmt::format("{:.4f}", x);
      else
        s += fmt::format("{}", static_cast<int64_t>(x));
      return;
    }
    s += "[";
    int64_t n = t.size(d);
    for (int64_t i = 0; i < n; ++i) {
      if (n > max_per_dim && i == max_per_dim / 2) {
        s += "..., ";
        i = n - max_per_dim / 2;
      }
      rec(d + 1, base + i * st[d]);
      if (i + 1 < n) s += d + 1 == t.dim() ? ", " : ",\n" + std::string(static_cast<size_t>(d + 8), ' ');
    }
    s += "]";
  };
  rec(0, 0);
  s += fmt::format(", shape={}, dtype={}", t.shape(), t.dtype());
  if (!t.device().is_cpu()) s += fmt::format(", device={}", t.device());
  if (t.grad_fn())
    s += fmt::format(", grad_fn={}", t.grad_fn()->name());
  else if (t.requires_grad())
    s += ", requires_grad=true";
  return s + ")";
}

}  // namespace asc
