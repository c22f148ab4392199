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

// Makes `device` the current device of its backend for a scope and restores the previous one on exit (CPU:
// nothing to do). The dispatcher enters one around every CUDA kernel call (ASC_KERNEL in ops/dispatch.h), so
// kernels, their scratch memory and library calls run on the device that holds the data, whichever device the
// calling thread had current. Defined by the CUDA backend (cuda/context.cpp); in a build without it, entering a
// CUDA device throws.
//   { asc::DeviceScope on(asc::Device::cuda(1)); /* launches here go to cuda:1 */ }
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;  // the CUDA device to restore, or -1
};

}  // namespace asc
