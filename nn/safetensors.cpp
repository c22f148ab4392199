// safetensors reader / writer: the header parsed by the strict JSON subset parser (nn/json.h), validation of every
// field against the data size before anything is allocated, CRC-32 checksums of every tensor's bytes and of the
// metadata (written into the metadata, checked on reading), and an atomic (tmp + fsync + rename) file writer.
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
#include <optional>
#include <string_view>

#include <zlib.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/json.h"

namespace asc {

static_assert(std::endian::native == std::endian::little, "safetensors: the data is written as host bytes");

namespace {

// The Rust library's limit; it also keeps a corrupt length field from causing a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
// The checksums ride in the metadata (other readers see two more kinds of string entries and load the file as
// before): "crc32:NAME" is the CRC-32 of tensor NAME's data bytes, "crc32" that of the other metadata entries (each
// key and value followed by a 0 byte, in key order), all as 8 lowercase hex digits.
constexpr std::string_view kCrcPrefix = "crc32:";
constexpr std::string_view kCrcMetadataKey = "crc32";

bool is_checksum_key(std::string_view k) { return k == kCrcMetadataKey || k.starts_with(kCrcPrefix); }

uint32_t crc_of(const void* p, size_t n, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(p), n));
}

std::string crc_hex(uint32_t c) { return fmt::format("{:08x}", c); }

// The checksum of the metadata entries that are not checksums.
uint32_t metadata_crc(const std::map<std::string, std::string>& meta) {
  uint32_t c = 0;
  const char zero = 0;
  for (const auto& [k, v] : meta) {
    if (is_checksum_key(k)) continue;
    c = crc_of(k.data(), k.size(), c), c = crc_of(&zero, 1, c);
    c = crc_of(v.data(), v.size(), c), c = crc_of(&zero, 1, c);
  }
  return c;
}

// What a file's checksums promise: checked per tensor as its bytes arrive, then as a whole.
class ChecksumCheck {
 public:
  // Takes the checksum entries out of `meta` (the caller sees only its own metadata) and checks the metadata's.
  ChecksumCheck(std::map<std::string, std::string>& meta, const std::string& ctx) : ctx_(ctx) {
    for (auto it = meta.begin(); it != meta.end();) {
      if (!is_checksum_key(it->first)) {
        ++it;
        continue;
      }
      uint32_t v = 0;
      const std::string& hex = it->second;
      ASC_CHECK(hex.size() == 8 && hex.find_first_not_of("0123456789abcdef") == std::string::npos,
                "{}: metadata '{}' is not a CRC-32 (8 hex digits): '{}'", ctx, it->first, hex);
      v = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      if (it->first == kCrcMetadataKey)
        has_meta_ = true, meta_crc_ = v;
      else
        tensors_.emplace(it->first.substr(kCrcPrefix.size()), v);
      it = meta.erase(it);
    }
    if (has_meta_) {
      const uint32_t got = metadata_crc(meta);
      ASC_CHECK(got == meta_crc_,
                "{}: the metadata's checksum does not match (stored {}, computed {}): the header is corrupt", ctx,
                crc_hex(meta_crc_), crc_hex(got));
    }
  }
  // One tensor's bytes as read. A file that checksums its metadata checksums every tensor.
  void tensor(const std::string& name, const void* p, size_t n) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      ASC_CHECK(!has_meta_, "{}: tensor '{}' has no checksum, though the file carries them (a corrupt name?)", ctx_,
                name);
      return;
    }
    const uint32_t got = crc_of(p, n);
    ASC_CHECK(got == it->second, "{}: tensor '{}' is corrupt: the CRC-32 of its {} bytes is {}, the file recorded {}",
              ctx_, name, n, crc_hex(got), crc_hex(it->second));
    tensors_.erase(it);
  }
  // After every tensor: a checksum left names a tensor the file does not hold.
  void finish() const {
    ASC_CHECK(tensors_.empty(), "{}: a checksum names tensor '{}', which the file does not hold (a corrupt name?)",
              ctx_, tensors_.empty() ? "" : tensors_.begin()->first);
  }

 private:
  const std::string& ctx_;
  bool has_meta_ = false;
  uint32_t meta_crc_ = 0;
  std::map<std::string, uint32_t> tensors_;
};

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
  for (const auto& [k, v] : metadata) {
    ASC_CHECK(json::invalid_utf8_at(k) == std::string_view::npos && json::invalid_utf8_at(v) == std::string_view::npos,
              "{}: metadata entry '{}' is not valid UTF-8", op, k);
    ASC_CHECK(!is_checksum_key(k), "{}: metadata key '{}' is reserved for the file's checksums", op, k);
  }
  // Every tensor's bytes on the host, contiguous (a CUDA tensor copied once; a strided one packed), and its checksum.
  std::vector<Tensor> hosts;
  std::vector<std::vector<uint8_t>> packed(tensors.size());
  std::vector<std::pair<const void*, size_t>> bytes;
  std::map<std::string, std::string> meta = metadata;
  for (const auto& [name, t] : tensors) {
    Tensor host = t.device().is_cpu() ? t : t.detach().to(Device::cpu());
    const size_t n = static_cast<size_t>(host.numel()) * host.element_size();
    const void* p = n == 0 ? nullptr : host.raw_data();
    if (n > 0 && !host.is_contiguous()) {
      std::vector<uint8_t>& buf = packed[hosts.size()];
      buf.resize(n);
      gather_bytes(host, buf.data());
      p = buf.data();
    }
    hosts.push_back(host);
    bytes.emplace_back(p, n);
    meta[std::string(kCrcPrefix) + name] = crc_hex(crc_of(p, n));
  }
  meta[std::string(kCrcMetadataKey)] = crc_hex(metadata_crc(meta));

  std::string h = "{";
  bool first = true;
  json::write_string(h, kMetadataKey);
  h += ":{";
  for (const auto& [k, v] : meta) {
    if (!first) h += ',';
    first = false;
    json::write_string(h, k);
    h += ':';
    json::write_string(h, v);
  }
  h += '}';
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
  for (const auto& [p, n] : bytes)
    if (n > 0) sink(p, n);
}

// Builds the tensors of `entries` from a data section starting at `data`.
StateDict build_tensors(const std::vector<Entry>& entries, const uint8_t* data, const std::string& ctx,
                        ChecksumCheck& sums) {
  for (const Entry& e : entries) sums.tensor(e.name, data + e.begin, e.end - e.begin);
  sums.finish();
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
  ChecksumCheck sums(meta, ctx);
  StateDict out = build_tensors(entries, bytes.data() + 8 + n, ctx, sums);
  if (metadata) *metadata = std::move(meta);
  return out;
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::optional<AtomicFile> f;  // created at the first byte: after every check has passed
  encode("save_safetensors", tensors, metadata, [&](const void* p, size_t n) {
    try {
      if (!f) f.emplace(path);
      f->write(p, n);
    } catch (const Error& e) {
      ASC_THROW("save_safetensors: {}", e.what());
    }
  });
  try {
    f->commit();  // fsync, then the rename: a crash leaves the old file or the complete new one under `path`
  } catch (const Error& e) {
    ASC_THROW("save_safetensors: {}", e.what());
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
  ChecksumCheck sums(meta, ctx);

  // Every allocation is now bounded by the file size; read each tensor straight into its storage (entries are
  // in offset order and cover the data exactly, so this is one sequential pass).
  StateDict out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, {.dtype = e.dtype});
    if (e.end > e.begin) {
      read_exact(t.raw_data(), e.end - e.begin);
      sums.tensor(e.name, t.raw_data(), e.end - e.begin);  // before the bool check: a flipped byte is corruption
      if (e.dtype == kBool) check_bool_bytes(e, static_cast<const uint8_t*>(t.raw_data()), ctx);
    } else {
      sums.tensor(e.name, nullptr, 0);
    }
    out.set(e.name, std::move(t));
  }
  sums.finish();
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
