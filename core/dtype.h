#pragma once
// Element types. CPU kernels compute in float32 / float64 (plus int64 and bool where meaningful);
// bfloat16 / float16 are enumerated for the CUDA backend and for checkpoints.
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace asc {

enum class DType : uint8_t { Float32, Float64, Int64, Bool, BFloat16, Float16 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat16 = DType::Float16;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::BFloat16 || t == DType::Float16;
}

// bfloat16 / float16: stored in 16 bits, computed in float32.
constexpr bool is_reduced_float(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
// The dtype kernels accumulate t in, and keep its row statistics in: float32 for the 16-bit floats, t otherwise.
constexpr DType accumulate_dtype(DType t) { return is_reduced_float(t) ? DType::Float32 : t; }

// Type promotion for binary ops: bool < int64 < float16/bfloat16 < float32 < float64.
constexpr int dtype_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::Int64: return 1;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Float32: return 3;
    case DType::Float64: return 4;
  }
  return 0;
}
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  return dtype_rank(a) >= dtype_rank(b) ? a : b;
}

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};

}  // namespace asc

// Kernel dtype dispatch: runs the body with `scalar_t` bound to the C++ type of `dtype`.
//   ASC_DISPATCH_FLOAT(x.dtype(), "exp", [&] { kernel<scalar_t>(...); });
#define ASC_DISPATCH_CASE_(ENUM, TYPE, ...) \
  case ENUM: {                              \
    using scalar_t = TYPE;                  \
    return __VA_ARGS__();                   \
  }

#define ASC_DISPATCH_FLOAT(DT, NAME, ...)                                                                             \
  [&] {                                                                                                               \
    switch (DT) {                                                                                                     \
      ASC_DISPATCH_CASE_(::asc::DType::Float32, float, __VA_ARGS__)                                                   \
      ASC_DISPATCH_CASE_(::asc::DType::Float64, double, __VA_ARGS__)                                                  \
      default: ASC_THROW("{}: dtype {} is not supported on CPU (float32/float64 only)", NAME, ::asc::dtype_name(DT)); \
    }                                                                                                                 \
  }()

#define ASC_DISPATCH_ALL(DT, NAME, ...)                                                        \
  [&] {                                                                                        \
    switch (DT) {                                                                              \
      ASC_DISPATCH_CASE_(::asc::DType::Float32, float, __VA_ARGS__)                            \
      ASC_DISPATCH_CASE_(::asc::DType::Float64, double, __VA_ARGS__)                           \
      ASC_DISPATCH_CASE_(::asc::DType::Int64, int64_t, __VA_ARGS__)                            \
      ASC_DISPATCH_CASE_(::asc::DType::Bool, bool, __VA_ARGS__)                                \
      default: ASC_THROW("{}: dtype {} is not supported on CPU", NAME, ::asc::dtype_name(DT)); \
    }                                                                                          \
  }()

#define ASC_DISPATCH_NUMERIC(DT, NAME, ...)                                                    \
  [&] {                                                                                        \
    switch (DT) {                                                                              \
      ASC_DISPATCH_CASE_(::asc::DType::Float32, float, __VA_ARGS__)                            \
      ASC_DISPATCH_CASE_(::asc::DType::Float64, double, __VA_ARGS__)                           \
      ASC_DISPATCH_CASE_(::asc::DType::Int64, int64_t, __VA_ARGS__)                            \
      default: ASC_THROW("{}: dtype {} is not supported on CPU", NAME, ::asc::dtype_name(DT)); \
    }                                                                                          \
  }()
