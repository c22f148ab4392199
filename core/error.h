#pragma once
// The one framework error type. Every bad input (shape / dtype / device mismatch, out-of-range index, empty
// tensor where one is not allowed, corrupt file, ...) throws asc::Error with a message that names the op and
// the offending shapes or values, e.g.
//
//   add: shapes [2, 3] and [4] are not broadcastable
//
// Ops validate everything before they allocate or write, so nothing is half-modified when one throws.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace asc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace asc

// ASC_CHECK(cond, "op: message {}", args...) throws asc::Error(fmt::format(...)) when cond is false.
#define ASC_CHECK(cond, ...)                          \
  do {                                                \
    if (!(cond)) [[unlikely]] {                       \
      throw ::asc::Error(::fmt::format(__VA_ARGS__)); \
    }                                                 \
  } while (0)

#define ASC_THROW(...) throw ::asc::Error(::fmt::format(__VA_ARGS__))
