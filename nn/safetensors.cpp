// safetensors reader / writer: the header parsed by the strict JSON subset parser (nn/json.h), validation of every
// field against the data size before anything is allocated, and an atomic (tmp + fsync + rename) file writer.
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
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "core/format.h"
#include "nn/json.h"

namespace asc {

static_assert(std::endian::native == std::endian::little, "safetensors: the data is written as host bytes");

namespace {

// The Rust library's limit; it also keeps a corrupt length field from causing a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

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
  size_t bad = json::invalid_utf8_at(header);
  ASC_CHECK(bad == std::string_view::npos, "{}: header is not valid UTF-8 (byte {})", ctx, bad);
  json::Value root = json::parse(header, ctx);
  ASC_CHECK(root.kind == json::Value::Kind::Object, "{}: header must be a JSON object, got {}", ctx,
            json::Value::kind_name(root.kind));

  std::map<std::string, std::string> meta;
  std::vector<Entry> entries;
  for (size_t k = 0; k < root.keys.size(); ++k) {
    const std::string& name = root.keys[k];
    const json::Value& v = root.items[k];
    if (name == kMetadataKey) {
      ASC_CHECK(v.kind == json::Value::Kind::Object, "{}: '__metadata__' must be an object of strings, got {}", ctx,
                json::Value::kind_name(v.kind));
      for (size_t m = 0; m < v.keys.size(); ++m) {
        ASC_CHECK(v.items[m].kind == json::Value::Kind::String, "{}: metadata value '{}' must be a string, got {}", ctx,
                  v.keys[m], json::Value::kind_name(v.items[m].kind));
        meta.emplace(v.keys[m], v.items[m].str);
      }
      continue;
    }
    ASC_CHECK(v.kind == json::Value::Kind::Object, "{}: tensor '{}' must be an object, got {}", ctx, name,
              json::Value::kind_name(v.kind));
    const json::Value *dt = nullptr, *shape = nullptr, *offs = nullptr;
    for (size_t f = 0; f < v.keys.size(); ++f) {
      const std::string& key = v.keys[f];
      if (key == "dtype")
        dt = &v.items[f];
      else if (key == "shape")
        shape = &v.items[f];
      else if (key == "data_offsets")
        offs = &v.items[f];
      else
        ASC_THROW("{}: tensor '{}' has an unknown field '{}'", ctx, name, key);
    }
    ASC_CHECK(dt && shape && offs, "{}: tensor '{}' lacks '{}'", ctx, name,
              !dt      ? "dtype"
              : !shape ? "shape"
                       : "data_offsets");

    Entry e;
    e.name = name;
    ASC_CHECK(dt->kind == json::Value::Kind::String, "{}: tensor '{}': dtype must be a string", ctx, name);
    ASC_CHECK(st_dtype_from_name(dt->str, &e.dtype),
              "{}: tensor '{}' has unsupported dtype '{}' (supported: F32 F64 I64 BOOL BF16 F16)", ctx, name, dt->str);

    ASC_CHECK(shape->kind == json::Value::Kind::Array, "{}: tensor '{}': shape must be an array", ctx, name);
    ASC_CHECK(shape->items.size() <= static_cast<size_t>(kMaxDims),
              "{}: tensor '{}' has {} dimensions, at most {} are supported", ctx, name, shape->items.size(), kMaxDims);
    // Tensor geometry is int64, so the product of the nonzero dimensions must fit in it even when a 0 dimension
    // makes the tensor empty: the contiguous strides and the running element count are such products, and
    // [0, 2^62, 4] would overflow them in Tensor::empty. Then numel * element size, also in int64; a shape is only
    // plausible if its bytes fit in the data section (checked against data_offsets below).
    int64_t nonzero = 1;
    bool has_zero = false, too_big = false;
    for (const json::Value& d : shape->items) {
      ASC_CHECK(d.kind == json::Value::Kind::Int, "{}: tensor '{}': shape entries must be integers", ctx, name);
      ASC_CHECK(d.num >= 0, "{}: tensor '{}' has a negative dimension {} in its shape", ctx, name, d.num);
      e.shape.push_back(d.num);
      if (d.num == 0)
        has_zero = true;
      else
        too_big = too_big || __builtin_mul_overflow(nonzero, d.num, &nonzero);
    }
    ASC_CHECK(!too_big, "{}: tensor '{}' shape {} overflows: its nonzero dimensions multiply past 2^63 - 1", ctx, name,
              e.shape);
    int64_t nbytes_signed = 0;
    ASC_CHECK(has_zero || !__builtin_mul_overflow(nonzero, static_cast<int64_t>(dtype_size(e.dtype)), &nbytes_signed),
              "{}: tensor '{}' shape {} overflows: {} elements of {} bytes exceed 2^63 - 1 bytes", ctx, name, e.shape,
              nonzero, dtype_size(e.dtype));
    const uint64_t nbytes = has_zero ? 0 : static_cast<uint64_t>(nbytes_signed);

    ASC_CHECK(offs->kind == json::Value::Kind::Array && offs->items.size() == 2 &&
                  offs->items[0].kind == json::Value::Kind::Int && offs->items[1].kind == json::Value::Kind::Int,
              "{}: tensor '{}': data_offsets must be an array of two integers", ctx, name);
    int64_t b = offs->items[0].num, en = offs->items[1].num;
    ASC_CHECK(b >= 0 && en >= b, "{}: tensor '{}' has invalid data_offsets [{}, {}]", ctx, name, b, en);
    e.begin = static_cast<uint64_t>(b);
    e.end = static_cast<uint64_t>(en);
    ASC_CHECK(e.end - e.begin == nbytes, "{}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}",
              ctx, name, dt->str, e.shape, nbytes, b, en, e.end - e.begin);
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
    ASC_CHECK(json::invalid_utf8_at(name) == std::string_view::npos, "{}: tensor name '{}' is not valid UTF-8", op,
              name);
    ASC_CHECK(st_dtype_name(t.dtype()) != nullptr, "{}: tensor '{}' has dtype {} which safetensors cannot store", op,
              name, dtype_name(t.dtype()));
  }
  for (const auto& [k, v] : metadata)
    ASC_CHECK(json::invalid_utf8_at(k) == std::string_view::npos && json::invalid_utf8_at(v) == std::string_view::npos,
              "{}: metadata entry '{}' is not valid UTF-8", op, k);

  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    json::write_string(h, kMetadataKey);
    h += ":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      json::write_string(h, k);
      h += ':';
      json::write_string(h, v);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (!first) h += ',';
    first = false;
    json::write_string(h, name);
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

std::vector<uint8_t> serialize_safetensors(const StateDict& tensors,
                                           const std::map<std::string, std::string>& metadata) {
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
    ASC_CHECK(name == "seed" || name == "offset",
              "load_generator_state: unexpected entry '{}' (expected 'seed' and 'offset')", name);
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
