// The strict JSON subset parser of nn/json.h: recursive descent with a depth limit, every error naming the byte.
#include "nn/json.h"

#include <limits>
#include <set>

#include "core/error.h"
#include "core/format.h"

namespace asc::json {

size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07;
    else
      return i;
    if (n - i < static_cast<size_t>(len)) return i;
    for (int k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

namespace {

constexpr int kMaxDepth = 32;  // nesting depth: a hostile header cannot exhaust the stack

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  Parser(std::string_view s, const std::string& ctx) : s_(s), ctx_(ctx) {}

  Value parse_document() {
    Value v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* problem) {
    ASC_THROW("{}: invalid JSON header at byte {}: {}", ctx_, i_, problem);
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  char peek() {
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end of header");
    return s_[i_];
  }
  void expect(char c, const char* problem) {
    if (peek() != c) fail(problem);
    ++i_;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Value v;
      v.kind = Value::Kind::String;
      v.str = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return integer();
    fail("expected an object, array, string or integer");
  }

  Value object(int depth) {
    Value v;
    v.kind = Value::Kind::Object;
    ++i_;  // '{'
    std::set<std::string, std::less<>> seen;
    if (peek() == '}') {
      ++i_;
      return v;
    }
    while (true) {
      if (peek() != '"') fail("expected a string key");
      size_t key_at = i_;
      std::string key = string();
      if (!seen.insert(key).second) {
        i_ = key_at;
        ASC_THROW("{}: invalid JSON header at byte {}: duplicate key '{}'", ctx_, key_at, key);
      }
      expect(':', "expected ':' after a key");
      v.items.push_back(value(depth + 1));
      v.keys.push_back(std::move(key));
      char c = peek();
      ++i_;
      if (c == '}') return v;
      if (c != ',') {
        --i_;
        fail("expected ',' or '}' in an object");
      }
    }
  }

  Value array(int depth) {
    Value v;
    v.kind = Value::Kind::Array;
    ++i_;  // '['
    if (peek() == ']') {
      ++i_;
      return v;
    }
    while (true) {
      v.items.push_back(value(depth + 1));
      char c = peek();
      ++i_;
      if (c == ']') return v;
      if (c != ',') {
        --i_;
        fail("expected ',' or ']' in an array");
      }
    }
  }

  uint32_t hex4() {
    if (s_.size() - i_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else {
        --i_;
        fail("bad hex digit in a \\u escape");
      }
    }
    return v;
  }

  std::string string() {
    ++i_;  // '"'
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);  // UTF-8 validity was checked for the whole header up front
        ++i_;
        continue;
      }
      ++i_;
      if (i_ >= s_.size()) fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.size() - i_ < 2 || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              fail("unpaired high surrogate in a \\u escape");
            i_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --i_; fail("unknown escape sequence");
      }
    }
  }

  Value integer() {
    Value v;
    v.kind = Value::Kind::Int;
    bool neg = s_[i_] == '-';
    if (neg) ++i_;
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') fail("expected a digit");
    if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') fail("leading zero in a number");
    // Accumulate as a negative number so INT64_MIN fits; any overflow is an error.
    int64_t acc = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      int d = s_[i_] - '0';
      if (acc < (std::numeric_limits<int64_t>::min() + d) / 10) fail("integer out of range");
      acc = acc * 10 - d;
      ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) fail("only integers are allowed");
    if (!neg) {
      if (acc == std::numeric_limits<int64_t>::min()) fail("integer out of range");
      acc = -acc;
    }
    v.num = acc;
    return v;
  }

  std::string_view s_;
  const std::string& ctx_;
  size_t i_ = 0;
};

}  // namespace

Value parse(std::string_view text, const std::string& ctx) { return Parser(text, ctx).parse_document(); }

void write_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c < 0x20)
      out += fmt::format("\\u{:04x}", c);
    else
      out += ch;
  }
  out += '"';
}

}  // namespace asc::json
