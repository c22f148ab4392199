#pragma once
// fmt formatters for Shape/Dims, DType, Device and Tensor.
//   fmt::print("{}\n", x);          // tensor([[1.0000, 2.0000], ...], shape=[2, 2], dtype=float32)
//   fmt::print("{}\n", x.shape());  // [2, 2]
#include <fmt/format.h>

#include <string>

#include "core/tensor.h"

namespace asc {
std::string to_string(const Tensor& t, int max_per_dim = 6);
}

template <>
struct fmt::formatter<asc::Dims> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const asc::Dims& d, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "[");
    for (int i = 0; i < d.size(); ++i) out = fmt::format_to(out, "{}{}", i ? ", " : "", d[i]);
    return fmt::format_to(out, "]");
  }
};

template <>
struct fmt::formatter<asc::DType> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(asc::DType t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(asc::dtype_name(t), ctx);
  }
};

template <>
struct fmt::formatter<asc::Device> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(asc::Device d, Ctx& ctx) const {
    if (d.is_cpu()) return fmt::format_to(ctx.out(), "cpu");
    return fmt::format_to(ctx.out(), "cuda:{}", d.index);
  }
};

template <>
struct fmt::formatter<asc::Tensor> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const asc::Tensor& t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(asc::to_string(t), ctx);
  }
};
