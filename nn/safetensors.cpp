// safetensors reader / writer: a strict little JSON parser for the header, validation of every field against
// the data size before anything is allocated, and an atomic (tmp + fsync + rename) file writer.
#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/format.h"

namespace asc {

static_assert(std::endian::native == std::endian::little, "safetensors: the data is written as host bytes");

namespace {

// The Rust library's limit; it also keeps a corrupt length field from causing a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 32;
constexpr const char* kMetadataKey = "__metadata__";

// ---- UTF-8 -------------------------------------------------------------------------------------------------

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). Returns the offset of the first bad
// byte, or npos.
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
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return i;
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

// ---- JSON (the subset a safetensors header uses: objects, arrays, strings, integers) -------------------------

struct Json {
  enum class Kind { Object, Array, String, Int } kind = Kind::Int;
  std::string str;
  int64_t num = 0;
  std::vector<std::string> keys;  // Object: keys[i] -> items[i], in file order
  std::vector<Json> items;        // Object values or Array elements

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

class JsonParser {
 public:
  JsonParser(std::string_view s, const std::string& ctx) : s_(s), ctx_(ctx) {}

  Json parse_document() {
    Json v = value(0);
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

  Json value(int depth) {
    if (depth > kMaxJsonDepth) fail("nested too deeply");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v;
      v.kind = Json::Kind::String;
      v.str = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return integer();
    fail("expected an object, array, string or integer");
  }

  Json object(int depth) {
    Json v;
    v.kind = Json::Kind::Object;
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

  Json array(int depth) {
    Json v;
    v.kind = Json::Kind::Array;
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
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
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
            if (s_.size() - i_ < 2 || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("unpaired high surrogate in a \\u escape");
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

  Json integer() {
    Json v;
    v.kind = Json::Kind::Int;
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

void write_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) out += fmt::format("\\u{:04x}", c);
    else out += ch;
  }
  out += '"';
}

// ---- dtypes ------------------------------------------------------------------------------------------------

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::Bool: return "BOOL";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
  }
  return nullptr;
}

bool st_dtype_from_name(std::string_view n, DType* out) {
  static constexpr DType all[] = {kFloat32, kFloat64, kInt64, kBool, kBFloat16, kFloat16};
  for (DType t : all)
    if (n == st_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

// ---- header ------------------------------------------------------------------------------------------------

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // relative to the start of the data
};

// Parses and fully validates a header against a data section of `data_len` bytes. Returns the entries ordered
// by their data offsets.
std::vector<Entry> parse_header(std::string_view header, uint64_t data_len, const std::string& ctx,
                                std::map<std::string, std::string>* metadata) {
  size_t bad = invalid_utf8_at(header);
  ASC_CHECK(bad == std::string_view::npos, "{}: header is not valid UTF-8 (byte {})", ctx, bad);
  Json root = JsonParser(header, ctx).parse_document();
  ASC_CHECK(root.kind == Json::Kind::Object, "{}: header must be a JSON object, got {}", ctx,
            Json::kind_name(root.kind));

  std::map<std::string, std::string> meta;
  std::vector<Entry> entries;
  for (size_t k = 0; k < root.keys.size(); ++k) {
    const std::string& name = root.keys[k];
    const Json& v = root.items[k];
    if (name == kMetadataKey) {
      ASC_CHECK(v.kind == Json::Kind::Object, "{}: '__metadata__' must be an object of strings, got {}", ctx,
                Json::kind_name(v.kind));
      for (size_t m = 0; m < v.keys.size(); ++m) {
        ASC_CHECK(v.items[m].kind == Json::Kind::String, "{}: metadata value '{}' must be a string, got {}", ctx,
                  v.keys[m], Json::kind_name(v.items[m].kind));
        meta.emplace(v.keys[m], v.items[m].str);
      }
      continue;
    }
    ASC_CHECK(v.kind == Json::Kind::Object, "{}: tensor '{}' must be an object, got {}", ctx, name,
              Json::kind_name(v.kind));
    const Json *dt = nullptr, *shape = nullptr, *offs = nullptr;
    for (size_t f = 0; f < v.keys.size(); ++f) {
      const std::string& key = v.keys[f];
      if (key == "dtype") dt = &v.items[f];
      else if (key == "shape") shape = &v.items[f];
      else if (key == "data_offsets") offs = &v.items[f];
      else ASC_THROW("{}: tensor '{}' has an unknown field '{}'", ctx, name, key);
    }
    ASC_CHECK(dt && shape && offs, "{}: tensor '{}' lacks '{}'", ctx, name,
              !dt ? "dtype" : !shape ? "shape" : "data_offsets");

    Entry e;
    e.name = name;
    ASC_CHECK(dt->kind == Json::Kind::String, "{}: tensor '{}': dtype must be a string", ctx, name);
    ASC_CHECK(st_dtype_from_name(dt->str, &e.dtype),
              "{}: tensor '{}' has unsupported dtype '{}' (supported: F32 F64 I64 BOOL BF16 F16)", ctx, name, dt->str);

    ASC_CHECK(shape->kind == Json::Kind::Array, "{}: tensor '{}': shape must be an array", ctx, name);
    ASC_CHECK(shape->items.size() <= static_cast<size_t>(kMaxDims),
              "{}: tensor '{}' has {} dimensions, at most {} are supported", ctx, name, shape->items.size(), kMaxDims);
    // numel * element size, overflow-checked; a shape is only plausible if its bytes fit in the data section.
    uint64_t nbytes = dtype_size(e.dtype);
    bool too_big = false;
    for (const Json& d : shape->items) {
      ASC_CHECK(d.kind == Json::Kind::Int, "{}: tensor '{}': shape entries must be integers", ctx, name);
      ASC_CHECK(d.num >= 0, "{}: tensor '{}' has a negative dimension {} in its shape", ctx, name, d.num);
      e.shape.push_back(d.num);
      uint64_t ud = static_cast<uint64_t>(d.num);
      if (ud != 0 && nbytes > std::numeric_limits<uint64_t>::max() / ud) too_big = true;
      else nbytes *= ud;
    }
    // A later zero dimension makes the product 0 even if an earlier step overflowed.
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) too_big = false, nbytes = 0;
    ASC_CHECK(!too_big, "{}: tensor '{}' shape {} overflows", ctx, name, e.shape);

    ASC_CHECK(offs->kind == Json::Kind::Array && offs->items.size() == 2 &&
                  offs->items[0].kind == Json::Kind::Int && offs->items[1].kind == Json::Kind::Int,
              "{}: tensor '{}': data_offsets must be an array of two integers", ctx, name);
    int64_t b = offs->items[0].num, en = offs->items[1].num;
    ASC_CHECK(b >= 0 && en >= b, "{}: tensor '{}' has invalid data_offsets [{}, {}]", ctx, name, b, en);
    e.begin = static_cast<uint64_t>(b);
    e.end = static_cast<uint64_t>(en);
    ASC_CHECK(e.end - e.begin == nbytes,
              "{}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}", ctx, name, dt->str,
              e.shape, nbytes, b, en, e.end - e.begin);
    ASC_CHECK(e.end <= data_len, "{}: tensor '{}' data_offsets [{}, {}] exceed the {} data bytes (truncated file?)",
              ctx, name, b, en, data_len);
    entries.push_back(std::move(e));
  }

  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const Entry& e : entries) {
    ASC_CHECK(e.begin >= expect, "{}: tensor '{}' data_offsets [{}, {}] overlap the previous tensor (ending at {})",
              ctx, e.name, e.begin, e.end, expect);
    ASC_CHECK(e.begin == expect, "{}: hole in the data: bytes [{}, {}) before tensor '{}' belong to no tensor", ctx,
              expect, e.begin, e.name);
    expect = e.end;
  }
  ASC_CHECK(expect == data_len, "{}: the data has {} bytes but the tensors cover only {} (trailing bytes)", ctx,
            data_len, expect);
  if (metadata) *metadata = std::move(meta);
  return entries;
}

// A BOOL tensor's bytes must be 0 or 1 (any other value in a C++ bool is undefined behaviour).
void check_bool_bytes(const Entry& e, const uint8_t* p, const std::string& ctx) {
  for (uint64_t i = 0; i < e.end - e.begin; ++i)
    ASC_CHECK(p[i] <= 1, "{}: BOOL tensor '{}' holds byte value {} at element {} (must be 0 or 1)", ctx, e.name,
              static_cast<int>(p[i]), i);
}

// ---- writing -----------------------------------------------------------------------------------------------

// Copies a CPU tensor's elements in row-major order into `out` (any dtype; works from the strides directly, so
// dtypes without CPU kernels (bf16 / f16) can be packed too).
void gather_bytes(const Tensor& t, uint8_t* out) {
  const size_t es = t.element_size();
  const int64_t n = t.numel();
  if (n == 0) return;
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  if (t.is_contiguous()) {
    std::memcpy(out, base, static_cast<size_t>(n) * es);
    return;
  }
  const int nd = t.dim();
  const Shape& shape = t.shape();
  const Strides& st = t.strides();
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[d] * st[d];
    std::memcpy(out + static_cast<size_t>(i) * es, base + off * static_cast<int64_t>(es), es);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Validates everything, builds the (padded) header, and hands the bytes to `sink` in file order. Nothing is
// passed to `sink` before all validation has passed.
void encode(const char* op, const StateDict& tensors, const std::map<std::string, std::string>& metadata,
            const std::function<void(const void*, size_t)>& sink) {
  for (const auto& [name, t] : tensors) {
    ASC_CHECK(t.defined(), "{}: tensor '{}' is undefined", op, name);
    ASC_CHECK(name != kMetadataKey, "{}: '__metadata__' is reserved and cannot name a tensor", op);
    ASC_CHECK(invalid_utf8_at(name) == std::string_view::npos, "{}: tensor name '{}' is not valid UTF-8", op, name);
    ASC_CHECK(st_dtype_name(t.dtype()) != nullptr, "{}: tensor '{}' has dtype {} which safetensors cannot store",
              op, name, dtype_name(t.dtype()));
  }
  for (const auto& [k, v] : metadata)
    ASC_CHECK(invalid_utf8_at(k) == std::string_view::npos && invalid_utf8_at(v) == std::string_view::npos,
              "{}: metadata entry '{}' is not valid UTF-8", op, k);

  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    write_json_string(h, kMetadataKey);
    h += ":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      write_json_string(h, k);
      h += ':';
      write_json_string(h, v);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (!first) h += ',';
    first = false;
    write_json_string(h, name);
    h += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[", st_dtype_name(t.dtype()));
    for (int d = 0; d < t.dim(); ++d) h += fmt::format("{}{}", d ? "," : "", t.size(d));
    h += fmt::format("],\"data_offsets\":[{},{}]}}", offset, offset + nbytes);
    offset += nbytes;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  ASC_CHECK(h.size() <= kMaxHeaderBytes, "{}: header of {} bytes exceeds the 100 MB limit", op, h.size());

  uint8_t len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  sink(len, 8);
  sink(h.data(), h.size());
  std::vector<uint8_t> buf;
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    Tensor host = t.device().is_cpu() ? t : t.detach().to(Device::cpu());
    if (host.is_contiguous()) {
      sink(host.raw_data(), static_cast<size_t>(host.numel()) * host.element_size());
    } else {
      buf.resize(static_cast<size_t>(host.numel()) * host.element_size());
      gather_bytes(host, buf.data());
      sink(buf.data(), buf.size());
    }
  }
}

// Builds the tensors of `entries` from a data section starting at `data`.
StateDict build_tensors(const std::vector<Entry>& entries, const uint8_t* data, const std::string& ctx) {
  for (const Entry& e : entries)
    if (e.dtype == kBool) check_bool_bytes(e, data + e.begin, ctx);
  StateDict out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, {.dtype = e.dtype});
    if (e.end > e.begin) std::memcpy(t.raw_data(), data + e.begin, e.end - e.begin);
    out.set(e.name, std::move(t));
  }
  return out;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void check_header_length(uint64_t n, uint64_t total, const std::string& ctx) {
  ASC_CHECK(n <= kMaxHeaderBytes, "{}: header length {} exceeds the 100 MB limit (corrupt file?)", ctx, n);
  ASC_CHECK(n <= total - 8, "{}: header length {} is larger than the {} bytes after the length field", ctx, n,
            total - 8);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// ---- public API --------------------------------------------------------------------------------------------

std::vector<uint8_t> serialize_safetensors(const StateDict& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> out;
  encode("serialize_safetensors", tensors, metadata, [&](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

StateDict deserialize_safetensors(std::span<const uint8_t> bytes, std::map<std::string, std::string>* metadata,
                                  const std::string& what) {
  const std::string ctx = fmt::format("deserialize_safetensors: '{}'", what);
  ASC_CHECK(bytes.size() >= 8, "{}: {} bytes is shorter than the 8-byte header length", ctx, bytes.size());
  uint64_t n = read_le64(bytes.data());
  check_header_length(n, bytes.size(), ctx);
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), static_cast<size_t>(n));
  std::map<std::string, std::string> meta;
  std::vector<Entry> entries = parse_header(header, bytes.size() - 8 - n, ctx, &meta);
  StateDict out = build_tensors(entries, bytes.data() + 8 + n, ctx);
  if (metadata) *metadata = std::move(meta);
  return out;
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string tmp = path + ".tmp";
  Fd f;
  bool started = false;
  try {
    encode("save_safetensors", tensors, metadata, [&](const void* p, size_t n) {
      if (!started) {  // first byte: everything is validated, only now create the file
        started = true;
        f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        ASC_CHECK(f.fd >= 0, "save_safetensors: cannot open '{}' for writing: {}", tmp, std::strerror(errno));
      }
      auto* b = static_cast<const uint8_t*>(p);
      while (n > 0) {
        ssize_t w = ::write(f.fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        ASC_CHECK(w > 0, "save_safetensors: writing '{}' failed: {}", tmp, std::strerror(errno));
        b += w;
        n -= static_cast<size_t>(w);
      }
    });
    // fsync before the rename so that after a crash `path` holds either the old or the complete new file.
    ASC_CHECK(::fsync(f.fd) == 0, "save_safetensors: fsync of '{}' failed: {}", tmp, std::strerror(errno));
    int fd = f.fd;
    f.fd = -1;
    ASC_CHECK(::close(fd) == 0, "save_safetensors: closing '{}' failed: {}", tmp, std::strerror(errno));
    ASC_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: renaming '{}' to '{}' failed: {}", tmp,
              path, std::strerror(errno));
  } catch (...) {
    if (started) std::remove(tmp.c_str());
    throw;
  }
}

StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const std::string ctx = fmt::format("load_safetensors: '{}'", path);
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASC_CHECK(f.fd >= 0, "{}: cannot open: {}", ctx, std::strerror(errno));
  struct stat sb;
  ASC_CHECK(::fstat(f.fd, &sb) == 0 && S_ISREG(sb.st_mode), "{}: not a regular file", ctx);
  const uint64_t total = static_cast<uint64_t>(sb.st_size);

  uint64_t pos = 0;
  auto read_exact = [&](void* dst, uint64_t n) {
    auto* b = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(f.fd, b, n, static_cast<off_t>(pos));
      if (r < 0 && errno == EINTR) continue;
      ASC_CHECK(r > 0, "{}: read failed at byte {} (file shrank while reading?)", ctx, pos);
      b += r;
      pos += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
  };

  ASC_CHECK(total >= 8, "{}: {} bytes is shorter than the 8-byte header length", ctx, total);
  uint8_t len[8];
  read_exact(len, 8);
  uint64_t n = read_le64(len);
  check_header_length(n, total, ctx);  // bounds the allocation below by the real file size and 100 MB
  std::string header(static_cast<size_t>(n), '\0');
  read_exact(header.data(), n);
  std::map<std::string, std::string> meta;
  std::vector<Entry> entries = parse_header(header, total - 8 - n, ctx, &meta);

  // Every allocation is now bounded by the file size; read each tensor straight into its storage (entries are
  // in offset order and cover the data exactly, so this is one sequential pass).
  StateDict out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, {.dtype = e.dtype});
    if (e.end > e.begin) {
      read_exact(t.raw_data(), e.end - e.begin);
      if (e.dtype == kBool) check_bool_bytes(e, static_cast<const uint8_t*>(t.raw_data()), ctx);
    }
    out.set(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

StateDict generator_state_dict(const Generator& gen) {
  Generator::State s = gen.state();
  StateDict sd;
  sd.set("seed", tensor(std::vector<int64_t>{std::bit_cast<int64_t>(s.seed)}, Shape{}));
  sd.set("offset", tensor(std::vector<int64_t>{std::bit_cast<int64_t>(s.offset)}, Shape{}));
  return sd;
}

void load_generator_state(Generator& gen, const StateDict& state) {
  for (const auto& [name, t] : state)
    ASC_CHECK(name == "seed" || name == "offset", "load_generator_state: unexpected entry '{}' (expected 'seed' and 'offset')",
              name);
  uint64_t v[2];
  const char* names[2] = {"seed", "offset"};
  for (int i = 0; i < 2; ++i) {
    const Tensor* t = state.find(names[i]);
    ASC_CHECK(t != nullptr && t->defined(), "load_generator_state: missing entry '{}'", names[i]);
    ASC_CHECK(t->dtype() == kInt64 && t->numel() == 1,
              "load_generator_state: '{}' must be a one-element int64 tensor, got {} {}", names[i],
              dtype_name(t->dtype()), t->shape());
    v[i] = std::bit_cast<uint64_t>(t->item<int64_t>());
  }
  gen.set_state({v[0], v[1]});
}

}  // namespace asc
