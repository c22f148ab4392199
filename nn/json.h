#pragma once
// A strict parser and writer for the JSON subset that safetensors headers use: objects (duplicate keys refused,
// file order kept), arrays, strings (all escapes, surrogate pairs in u-escapes) and int64 integers (no floats, no
// leading zeros); nesting at most 32 deep. Every error is an asc::Error naming the context and the byte offset.
//
//   asc::json::Value root = asc::json::parse(R"({"a": [1, 2]})", "model.safetensors");
//   // root.kind == Value::Kind::Object, root.keys[0] == "a", root.items[0].items[1].num == 2
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace asc::json {

struct Value {
  enum class Kind { Object, Array, String, Int } kind = Kind::Int;
  std::string str;
  int64_t num = 0;
  std::vector<std::string> keys;  // Object: keys[i] -> items[i], in file order
  std::vector<Value> items;       // Object values or Array elements

  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::Object: return "an object";
      case Kind::Array: return "an array";
      case Kind::String: return "a string";
      case Kind::Int: return "an integer";
    }
    return "?";
  }
};

// Parses one JSON document (the whole of `text`, surrounding whitespace allowed). `ctx` prefixes error messages.
Value parse(std::string_view text, const std::string& ctx);
// Appends s as a JSON string literal (quotes, backslashes and control characters escaped).
void write_string(std::string& out, std::string_view s);
// Strict UTF-8 check (no overlong forms, no surrogates, nothing above U+10FFFF): the offset of the first bad byte,
// or std::string_view::npos when s is valid. parse() assumes a text that passed it.
size_t invalid_utf8_at(std::string_view s);

}  // namespace asc::json
