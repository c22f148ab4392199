#pragma once
// Where a tensor's storage lives. Every tensor carries one; every op checks its inputs agree.
//   Tensor x = asc::randn({2, 3}, {.device = Device::cpu()});
#include <cstdint>
#include <functional>

namespace asc {

struct Device {
  enum class Type : uint8_t { CPU = 0, CUDA = 1 };
  Type type = Type::CPU;
  int16_t index = 0;

  static constexpr Device cpu() { return {Type::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return {Type::CUDA, static_cast<int16_t>(i)}; }
  constexpr bool is_cpu() const { return type == Type::CPU; }
  constexpr bool is_cuda() const { return type == Type::CUDA; }
  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

}  // namespace asc
