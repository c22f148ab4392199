// safetensors checkpoints: a file written by the real safetensors library (tests/data/reference.safetensors,
// see gen_safetensors.py), hand-built bytes, the exact bytes the writer produces, round trips of every dtype and
// of non-contiguous inputs, atomic file writes, every malformed-input error, truncation / byte-flip fuzzing, and
// the generator state. Also writes <tmp>/asc_written.safetensors for tests/data/check_safetensors.py.
#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <zlib.h>

#include "nn/safetensors.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;

namespace {

namespace fs = std::filesystem;
using Meta = std::map<std::string, std::string>;
using Bytes = std::vector<uint8_t>;

fs::path data_dir() { return fs::path(__FILE__).parent_path() / "data"; }

fs::path temp_path(const std::string& name) { return fs::temp_directory_path() / name; }

// IEEE binary16 -> double, written out from the format's definition.
double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  double v;
  if (exp == 0)
    v = std::ldexp(man, -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}
// bfloat16 is the top half of a float32.
double bf16_to_double(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

std::vector<uint16_t> u16_of(const Tensor& t) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw_data(), v.size() * 2);
  return v;
}
Tensor u16_tensor(const std::vector<uint16_t>& bits, const Shape& s, DType dt) {
  Tensor t = empty(s, {.dtype = dt});
  REQUIRE(static_cast<size_t>(t.numel()) == bits.size());
  if (!bits.empty()) std::memcpy(t.raw_data(), bits.data(), bits.size() * 2);
  return t;
}

std::vector<std::string> names_of(const StateDict& sd) {
  std::vector<std::string> n;
  for (const auto& [k, t] : sd) n.push_back(k);
  return n;
}

// 8-byte little-endian length + header + data.
Bytes make_file(const std::string& header, const Bytes& data = {}) {
  Bytes b(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return b;
}
template <class T>
void append(Bytes& b, std::initializer_list<T> vals) {
  for (T v : vals) {
    size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
}
Bytes read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void check_bytes_equal(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  if (a.numel() == 0) return;  // (core's is_contiguous() is false for some empty tensors; nothing to compare)
  REQUIRE(a.is_contiguous());
  REQUIRE(b.is_contiguous());
  CHECK(std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * a.element_size()) == 0);
}

}  // namespace

TEST_CASE("safetensors: file written by the real safetensors library") {
  Meta meta;
  StateDict sd = load_safetensors((data_dir() / "reference.safetensors").string(), &meta);
  // The Python library orders the data by dtype alignment then name; the loader keeps that (data-offset) order.
  CHECK(names_of(sd) ==
        std::vector<std::string>{"i64", "f64", "layer.0.weight", "empty", "f32", "scalar", "brain", "half", "mask"});
  CHECK(meta == Meta{{"format", "np"}, {"producer", "gen_safetensors.py"}, {"unicode", "\u00fc\u2192\U0001F600"}});

  const Tensor& f32 = sd.at("f32");
  CHECK(f32.dtype() == kFloat32);
  CHECK(f32.shape() == Shape{2, 3});
  std::vector<double> e;
  for (int i = 0; i < 6; ++i) e.push_back(0.5 * i - 1.25);
  check_close(f32, e, 0, 0);

  const Tensor& f64 = sd.at("f64");
  CHECK(f64.dtype() == kFloat64);
  CHECK(f64.shape() == Shape{4});
  std::vector<double> fv = f64.to_vector<double>();
  for (int i = 0; i < 4; ++i) CHECK(fv[i] == 1.0 / (i + 1));  // bit-exact

  const Tensor& i64 = sd.at("i64");
  CHECK(i64.dtype() == kInt64);
  CHECK(i64.shape() == Shape{3, 2});
  std::vector<int64_t> iv = i64.to_vector<int64_t>();
  for (int64_t i = 0; i < 6; ++i) CHECK(iv[i] == (i - 3) * (int64_t{1} << 40) + i);

  const Tensor& mask = sd.at("mask");
  CHECK(mask.dtype() == kBool);
  std::vector<bool> mv = mask.to_vector<bool>();
  REQUIRE(mv.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(mv[i] == (i % 2 == 0 || i % 3 == 0));

  const Tensor& half = sd.at("half");
  CHECK(half.dtype() == kFloat16);
  CHECK(u16_of(half) == std::vector<uint16_t>{0x3C00, 0xC100, 0x2E66, 0x7BFF});
  std::vector<double> hv;
  for (uint16_t b : u16_of(half)) hv.push_back(half_to_double(b));
  CHECK(hv[0] == 1.0);
  CHECK(hv[1] == -2.5);
  CHECK(std::abs(hv[2] - 0.1) < 1e-4);  // 0.1 rounded to 11 significant bits
  CHECK(hv[3] == 65504.0);

  const Tensor& brain = sd.at("brain");
  CHECK(brain.dtype() == kBFloat16);
  CHECK(brain.shape() == Shape{2, 2});
  std::vector<double> bv;
  for (uint16_t b : u16_of(brain)) bv.push_back(bf16_to_double(b));
  CHECK(bv == std::vector<double>{1.5, -2.0, 3.25, 0.0});

  CHECK(sd.at("scalar").dim() == 0);
  CHECK(sd.at("scalar").item<double>() == 3.5);
  CHECK(sd.at("empty").shape() == Shape{0, 3});
  CHECK(sd.at("empty").numel() == 0);
  check_close(sd.at("layer.0.weight"), {0.0, 0.25, 0.5, 0.75}, 0, 0);
  for (const auto& [n, t] : sd) {
    CHECK(t.device().is_cpu());
    CHECK_FALSE(t.requires_grad());
  }
}

TEST_CASE("safetensors: hand-built bytes with escapes, whitespace and out-of-order entries") {
  // "b" is listed first but its data comes second; names use \u escapes (incl. a surrogate pair) and \t \".
  std::string header =
      " { \"b\\u00e9\\ud83d\\ude00\" : {\"shape\":[2],\"dtype\":\"F64\",\"data_offsets\":[8, 24]},\n"
      "\t\"a\\t\\\"\\/\\\\\": {\"dtype\": \"F32\", \"shape\": [ 2 ], \"data_offsets\": [0,8]},\r\n"
      "\"__metadata__\":{\"k\\u0041\":\"line\\nnext\"} }   ";
  Bytes data;
  append<float>(data, {1.5f, -0.25f});
  append<double>(data, {1e300, -3.0});
  Meta meta;
  StateDict sd = deserialize_safetensors(make_file(header, data), &meta);
  const std::string a = "a\t\"/\\", b = "b\u00e9\U0001F600";
  CHECK(names_of(sd) == std::vector<std::string>{a, b});
  check_close(sd.at(a), {1.5, -0.25}, 0, 0);
  CHECK(sd.at(a).dtype() == kFloat32);
  CHECK(sd.at(b).to_vector<double>() == std::vector<double>{1e300, -3.0});
  CHECK(meta == Meta{{"kA", "line\nnext"}});
}

TEST_CASE("safetensors: the writer's exact bytes") {
  StateDict sd;
  sd.set("w", tensor(std::vector<float>{1.0f, 2.0f}, {2}));
  sd.set("q\"\n", tensor(std::vector<int64_t>{-1}, Shape{}));
  Bytes got = serialize_safetensors(sd, {{"k", "v"}});
  Bytes data;
  append<float>(data, {1.0f, 2.0f});
  append<int64_t>(data, {-1});
  // The checksums, computed here with zlib: each tensor's bytes; the metadata as "key\0value\0" in key order.
  auto crc = [](const void* p, size_t n) { return fmt::format("{:08x}", crc32_z(0, static_cast<const Bytef*>(p), n)); };
  const std::string crc_w = crc(data.data(), 8), crc_q = crc(data.data() + 8, 8);
  const std::string crc_meta = crc("k\0v\0", 4);  // the checksum entries themselves are not in it
  std::string h = "{\"__metadata__\":{\"crc32\":\"" + crc_meta + "\",\"crc32:q\\\"\\u000a\":\"" + crc_q +
                  "\",\"crc32:w\":\"" + crc_w +
                  "\",\"k\":\"v\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"q\\\"\\u000a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}";
  h.append((8 - h.size() % 8) % 8, ' ');
  Bytes want = make_file(h, data);
  CHECK(std::string(got.begin(), got.end()) == std::string(want.begin(), want.end()));
  CHECK((got.size() - data.size()) % 8 == 0);  // data section 8-byte aligned
  // The checksums are not part of the metadata a reader gets back.
  Meta meta;
  deserialize_safetensors(got, &meta);
  CHECK(meta == Meta{{"k", "v"}});
  // An empty dict is a valid file too.
  CHECK(deserialize_safetensors(serialize_safetensors({})).empty());
}

TEST_CASE("safetensors: checksums find a flipped byte anywhere, and files without them still load") {
  StateDict sd;
  sd.set("model.w", tensor(std::vector<float>{1.0f, 2.0f, 3.0f}, {3}));
  sd.set("model.b", tensor(std::vector<int64_t>{7, 8}, {2}));
  sd.set("empty", Tensor::empty({0, 4}));
  const Bytes good = serialize_safetensors(sd, {{"step", "12"}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | good[static_cast<size_t>(i)];
  const size_t data = 8 + static_cast<size_t>(n);
  // every byte of the data: the error names the tensor it belongs to
  for (size_t i = data; i < good.size(); ++i) {
    Bytes bad = good;
    bad[i] ^= 0x10;
    const char* name = i < data + 12 ? "'model.w'" : "'model.b'";
    check_error([&] { deserialize_safetensors(bad, nullptr, "ckpt"); }, {"ckpt", name, "corrupt", "CRC-32"});
  }
  // a metadata value changed (same length, so the header still parses)
  std::string text(good.begin(), good.end());
  Bytes bad(good);
  const size_t at = text.find("\"12\"");
  REQUIRE(at != std::string::npos);
  bad[at + 1] = '9';
  check_error([&] { deserialize_safetensors(bad, nullptr, "ckpt"); }, {"ckpt", "metadata's checksum"});
  // a tensor's name changed: no checksum for it, and one for a tensor the file does not hold
  Bytes renamed(good);
  const size_t nm = text.find("\"model.b\":{");
  REQUIRE(nm != std::string::npos);
  renamed[nm + 7] = 'c';
  check_error([&] { deserialize_safetensors(renamed, nullptr, "ckpt"); }, {"ckpt", "'model.c'", "no checksum"});
  // a checksum that is not one
  Bytes garbled(good);
  const size_t c = text.find("\"crc32:model.w\":\"") + 17;
  garbled[c] = 'z';
  check_error([&] { deserialize_safetensors(garbled, nullptr, "ckpt"); }, {"ckpt", "'crc32:model.w'", "8 hex digits"});
  // the same through a file, and the loaded values when nothing is wrong
  const fs::path p = fs::temp_directory_path() / fmt::format("asc_st_crc_{}.safetensors", ::getpid());
  save_safetensors(p.string(), sd, {{"step", "12"}});
  Meta meta;
  StateDict back = load_safetensors(p.string(), &meta);
  CHECK(meta == Meta{{"step", "12"}});
  CHECK(back.at("model.w").to_vector<float>() == std::vector<float>{1.0f, 2.0f, 3.0f});
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(data + 4));
    f.put(static_cast<char>(good[data + 4] ^ 1));
  }
  const std::string file = p.string();
  check_error([&] { load_safetensors(file); }, {file.c_str(), "'model.w'", "corrupt"});
  fs::remove(p);
  // a file written without checksums (by another writer) loads; the names are reserved for the writer
  const std::string plain = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  Bytes four;
  append<float>(four, {5.0f});
  CHECK(deserialize_safetensors(make_file(plain + std::string((8 - plain.size() % 8) % 8, ' '), four))
            .at("x")
            .item<float>() == 5.0f);
  check_error([&] { serialize_safetensors(sd, {{"crc32:model.w", "0"}}); }, {"reserved", "checksums"});
  check_error([&] { serialize_safetensors(sd, {{"crc32", "0"}}); }, {"reserved", "checksums"});
}

TEST_CASE("safetensors: round trip of every dtype, 0-d, empty and non-contiguous tensors") {
  const std::vector<double> base = {0.5, -1.25, 3.0, 1e-7, -2.5e10, 7.0, 0.125, -0.0, 42.0, 1.0 / 3, 9.5, -8.0};
  Tensor b32 = tensor(std::vector<float>(base.begin(), base.end()), {4, 3});
  Tensor b64 = tensor(base, {4, 3});
  std::vector<int64_t> ivals;
  for (int64_t i = 0; i < 12; ++i) ivals.push_back((i - 6) * 123456789012LL);
  Tensor i64 = tensor(ivals, {3, 4});
  std::vector<uint16_t> hbits = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x8000, 0x7C00};
  std::vector<uint16_t> bbits = {0x3FC0, 0xC000, 0x4050, 0xFF80, 0x0000, 0x7F7F};

  StateDict sd;
  sd.set("f32", b32);
  sd.set("f64", b64);
  sd.set("i64", i64);
  sd.set("bool", tensor(std::vector<double>{1, 0, 0, 1, 1}, {5}, {.dtype = kBool}));
  sd.set("f16", u16_tensor(hbits, {2, 3}, kFloat16));
  sd.set("bf16", u16_tensor(bbits, {3, 2}, kBFloat16));
  sd.set("scalar", scalar_tensor(-4.5, {.dtype = kFloat64}));
  sd.set("empty", zeros({2, 0, 3}));
  sd.set("f32.T", b32.t());                                            // [3, 4] transposed view
  sd.set("f64.step", b64.slice(0, 1, 4, 2));                           // rows 1 and 3
  sd.set("f64.narrow", b64.narrow(0, 2, 2));                           // contiguous, non-zero storage offset
  sd.set("i64.expand", i64.select(0, 1).unsqueeze(0).expand({2, 4}));  // stride 0
  sd.set("bf16.T", sd.at("bf16").t());  // non-contiguous view of a dtype with no CPU kernels
  sd.set("grad", tensor(std::vector<double>{1, 2}, {2}, {.dtype = kFloat64, .requires_grad = true}));
  Meta meta_in = {{"step", "7"}, {"esc", "\"\\\n\t\x01 \u00fc"}};

  auto verify = [&](const StateDict& back, const Meta& meta) {
    CHECK(names_of(back) == names_of(sd));
    CHECK(meta == meta_in);
    std::vector<double> as_float;
    for (double v : base) as_float.push_back(static_cast<float>(v));
    check_close(back.at("f32"), as_float, 0, 0);
    CHECK(back.at("f64").to_vector<double>() == base);
    CHECK(back.at("i64").to_vector<int64_t>() == ivals);
    CHECK(back.at("bool").to_vector<bool>() == std::vector<bool>{true, false, false, true, true});
    CHECK(back.at("f16").dtype() == kFloat16);
    CHECK(back.at("f16").shape() == Shape{2, 3});
    CHECK(u16_of(back.at("f16")) == hbits);
    CHECK(back.at("bf16").dtype() == kBFloat16);
    CHECK(u16_of(back.at("bf16")) == bbits);
    CHECK(back.at("scalar").dim() == 0);
    CHECK(back.at("scalar").item<double>() == -4.5);
    CHECK(back.at("empty").shape() == Shape{2, 0, 3});
    // Non-contiguous inputs, expected values from index formulas on the plain vectors.
    std::vector<double> tr, step, narrow, bt;
    std::vector<int64_t> ex;
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) tr.push_back(static_cast<float>(base[c * 3 + r]));
    for (int r : {1, 3})
      for (int c = 0; c < 3; ++c) step.push_back(base[r * 3 + c]);
    for (int i = 6; i < 12; ++i) narrow.push_back(base[i]);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 4; ++c) ex.push_back(ivals[4 + c]);
    std::vector<uint16_t> btbits;
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) btbits.push_back(bbits[c * 2 + r]);
    CHECK(back.at("f32.T").shape() == Shape{3, 4});
    check_close(back.at("f32.T"), tr, 0, 0);
    CHECK(back.at("f64.step").to_vector<double>() == step);
    CHECK(back.at("f64.narrow").to_vector<double>() == narrow);
    CHECK(back.at("i64.expand").shape() == Shape{2, 4});
    CHECK(back.at("i64.expand").to_vector<int64_t>() == ex);
    CHECK(back.at("bf16.T").shape() == Shape{2, 3});
    CHECK(u16_of(back.at("bf16.T")) == btbits);
    CHECK_FALSE(back.at("grad").requires_grad());
    CHECK(back.at("grad").to_vector<double>() == std::vector<double>{1, 2});
    for (const auto& [n, t] : back)
      if (t.numel() > 0) CHECK(t.is_contiguous());  // core reports empty [2, 0, 3] as non-contiguous
  };

  SUBCASE("memory") {
    Meta meta;
    StateDict back = deserialize_safetensors(serialize_safetensors(sd, meta_in), &meta);
    verify(back, meta);
  }
  SUBCASE("file") {
    fs::path p = temp_path("asc_roundtrip.safetensors");
    save_safetensors(p.string(), sd, meta_in);
    CHECK_FALSE(fs::exists(p.string() + ".tmp"));
    Meta meta;
    StateDict back = load_safetensors(p.string(), &meta);
    verify(back, meta);
    // The file and the in-memory form are the same bytes.
    CHECK(read_file(p) == serialize_safetensors(sd, meta_in));
    fs::remove(p);
  }
}

TEST_CASE("safetensors: atomic save; a failed save leaves the old file alone") {
  fs::path p = temp_path("asc_atomic.safetensors");
  StateDict a;
  a.set("x", tensor(std::vector<float>{1, 2, 3}, {3}));
  save_safetensors(p.string(), a);
  // Overwrite with new content.
  StateDict b;
  b.set("y", tensor(std::vector<double>{4}, {1}));
  save_safetensors(p.string(), b);
  CHECK(names_of(load_safetensors(p.string())) == std::vector<std::string>{"y"});
  Bytes after = read_file(p);
  // Invalid input: nothing written, old file intact, no tmp file.
  StateDict bad;
  bad.set("ok", tensor(std::vector<float>{1}, {1}));
  bad.set("__metadata__", tensor(std::vector<float>{1}, {1}));
  check_error([&] { save_safetensors(p.string(), bad); }, {"save_safetensors", "__metadata__", "reserved"});
  CHECK(read_file(p) == after);
  CHECK_FALSE(fs::exists(p.string() + ".tmp"));
  StateDict undef;
  undef.set("u", Tensor());
  check_error([&] { save_safetensors(p.string(), undef); }, {"save_safetensors", "'u'", "undefined"});
  StateDict badname;
  badname.set("bad\xff", tensor(std::vector<float>{1}, {1}));
  check_error([&] { save_safetensors(p.string(), badname); }, {"save_safetensors", "UTF-8"});
  check_error([&] { save_safetensors(p.string(), a, {{"k", "\xc0\x80"}}); }, {"save_safetensors", "metadata", "'k'"});
  CHECK(read_file(p) == after);
  // Unwritable destination.
  std::string nodir = (temp_path("asc_no_such_dir") / "x.safetensors").string();
  check_error([&] { save_safetensors(nodir, a); }, {"save_safetensors", "asc_no_such_dir", "cannot open"});
  // Loading files that are not there / not files.
  check_error([&] { load_safetensors(nodir); }, {"load_safetensors", "asc_no_such_dir", "cannot open"});
  check_error([&] { load_safetensors(fs::temp_directory_path().string()); },
              {"load_safetensors", "not a regular file"});
  // A short file on disk names the path.
  fs::path shortf = temp_path("asc_short.safetensors");
  { std::ofstream(shortf, std::ios::binary) << "abc"; }
  check_error([&] { load_safetensors(shortf.string()); }, {"load_safetensors", "asc_short.safetensors", "shorter"});
  fs::remove(shortf);
  fs::remove(p);
}

TEST_CASE("safetensors: malformed input is an asc::Error naming the source and the problem") {
  auto bad = [](const Bytes& b, std::initializer_list<const char*> frags) {
    check_error([&] { deserialize_safetensors(b, nullptr, "bad.st"); }, frags);
  };
  auto bad_header = [&](const std::string& h, std::initializer_list<const char*> frags, const Bytes& data = {}) {
    INFO("header: " << h);
    bad(make_file(h, data), frags);
  };
  const Bytes four(4, 0);

  SUBCASE("lengths") {
    bad({1, 2, 3}, {"bad.st", "shorter than the 8-byte"});
    bad({}, {"bad.st", "shorter"});
    Bytes b = make_file("{}");
    b[0] = 50;  // header length 50 > 2 bytes present
    bad(b, {"bad.st", "header length 50", "larger than"});
    Bytes huge(16, ' ');
    uint64_t n = 200'000'000;
    for (int i = 0; i < 8; ++i) huge[i] = static_cast<uint8_t>(n >> (8 * i));
    bad(huge, {"bad.st", "100 MB"});
    Bytes max(8, 0xFF);
    bad(max, {"bad.st", "100 MB"});
  }
  SUBCASE("JSON syntax") {
    bad_header("", {"bad.st", "invalid JSON", "unexpected end"});
    bad_header("{", {"invalid JSON", "unexpected end"});
    bad_header("{\"a\":{},}", {"expected a string key"});
    bad_header("{\"a\" {}}", {"expected ':'"});
    bad_header("{\"a\":{} \"b\":{}}", {"expected ',' or '}'"});
    bad_header("{\"a\":[1 2]}", {"expected ',' or ']'"});
    bad_header("[]", {"bad.st", "must be a JSON object", "an array"});
    bad_header("{} x", {"trailing"});
    bad_header("{\"a\":1.5}", {"only integers"});
    bad_header("{\"a\":1e3}", {"only integers"});
    bad_header("{\"a\":true}", {"expected an object, array, string or integer"});
    bad_header("{\"a\":01}", {"leading zero"});
    bad_header("{\"a\":-}", {"expected a digit"});
    bad_header("{\"a\":99999999999999999999}", {"out of range"});
    bad_header("{\"a\":\"x\x01\"}", {"control character"});
    bad_header("{\"a\":\"x", {"unterminated string"});
    bad_header("{\"a\":\"\\q\"}", {"unknown escape"});
    bad_header("{\"a\":\"\\u12g4\"}", {"bad hex digit"});
    bad_header("{\"a\":\"\\u12", {"truncated \\u escape"});
    bad_header("{\"a\":\"\\ud800\"}", {"unpaired high surrogate"});
    bad_header("{\"a\":\"\\ud800\\u0041\"}", {"not followed by a low surrogate"});
    bad_header("{\"a\":\"\\udc00\"}", {"unpaired low surrogate"});
    bad_header("{\"a\xff\":{}}", {"bad.st", "not valid UTF-8"});
    bad_header("{\"\xed\xa0\x80\":{}}", {"not valid UTF-8"});  // an encoded surrogate
    bad_header("{\"a\":{},\"a\":{}}", {"duplicate key 'a'"});
    bad_header(std::string(100, '[') + std::string(100, ']'), {"nested too deeply"});
  }
  SUBCASE("entries") {
    auto entry = [](const std::string& body) { return "{\"t\":{" + body + "}}"; };
    bad_header("{\"t\":[]}", {"bad.st", "tensor 't' must be an object"});
    bad_header(entry("\"shape\":[1],\"data_offsets\":[0,4]"), {"'t'", "lacks 'dtype'"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), {"'t'", "lacks 'shape'"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[1]"), {"'t'", "lacks 'data_offsets'"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1"), {"'t'", "unknown field 'x'"},
               four);
    bad_header(entry("\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]"), {"'t'", "unsupported dtype 'I32'"},
               four);
    bad_header(entry("\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]"), {"'t'", "dtype must be a string"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]"), {"'t'", "shape must be an array"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]"), {"'t'", "shape entries"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), {"'t'", "negative dimension -1"},
               four);
    bad_header(entry("\"dtype\":\"BOOL\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]"),
               {"'t'", "9 dimensions"}, {1});
    bad_header(entry("\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]"),
               {"'t'", "overflows"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"),
               {"'t'", "needs 8 bytes", "[0, 4]", "span 4"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]"), {"'t'", "invalid data_offsets [4, 0]"},
               four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"), {"'t'", "invalid data_offsets"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]"), {"'t'", "two integers"}, four);
    bad_header(entry("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"), {"'t'", "exceed the 4 data bytes"},
               four);
    bad_header("{\"__metadata__\":[]}", {"bad.st", "'__metadata__' must be an object"});
    bad_header("{\"__metadata__\":{\"k\":1}}", {"metadata value 'k' must be a string"});
  }
  SUBCASE("coverage of the data") {
    const std::string a = "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":";
    const std::string b = "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":";
    const Bytes eight(8, 0), twelve(12, 0);
    bad_header("{" + a + "[0,4]}," + b + "[2,6]}}", {"bad.st", "'b'", "overlap"}, eight);
    bad_header("{" + a + "[0,4]}," + b + "[0,4]}}", {"'b'", "overlap"}, four);
    bad_header("{" + a + "[0,4]}," + b + "[8,12]}}", {"bad.st", "hole", "[4, 8)", "'b'"}, twelve);
    bad_header("{" + a + "[4,8]}}", {"hole", "[0, 4)"}, eight);
    bad_header("{" + a + "[0,4]}}", {"bad.st", "8 bytes", "cover only 4", "trailing"}, eight);
    bad_header("{}", {"trailing"}, four);
    // Valid: both orders of the same layout, and an empty tensor sharing an offset.
    const std::string e = "\"e\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":";
    CHECK(names_of(deserialize_safetensors(make_file("{" + b + "[4,8]}," + e + "[4,4]}," + a + "[0,4]}}", eight))) ==
          std::vector<std::string>{"a", "e", "b"});
  }
  SUBCASE("BOOL bytes") {
    bad_header("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}}",
               {"bad.st", "'m'", "byte value 2", "element 1"}, {1, 2, 0});
    fs::path p = temp_path("asc_badbool.safetensors");
    {
      Bytes b = make_file("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", {0, 255});
      std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    }
    check_error([&] { load_safetensors(p.string()); }, {"load_safetensors", "asc_badbool", "byte value 255"});
    fs::remove(p);
  }
}

TEST_CASE("safetensors: fuzz — every truncation and random header byte flips") {
  StateDict sd;
  sd.set("w", randn32({3, 5}));
  sd.set("mask", tensor(std::vector<double>{1, 0, 1}, {3}, {.dtype = kBool}));
  sd.set("idx", tensor(std::vector<int64_t>{5, -7}, {2}));
  sd.set("s", scalar_tensor(2.0, {.dtype = kFloat64}));
  Bytes good = serialize_safetensors(sd, {{"note", "fuzz \u00fc"}});
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | good[i];
  const uint64_t data_len = good.size() - 8 - hlen;

  // The data section is fully covered, so dropping any byte must be detected.
  int truncation_errors = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    try {
      deserialize_safetensors(std::span<const uint8_t>(good.data(), len));
      FAIL_CHECK("truncation to " << len << " bytes was accepted");
    } catch (const asc::Error&) {
      ++truncation_errors;
    }
  }
  CHECK(truncation_errors == static_cast<int>(good.size()));

  // Also through the file reader: a few truncations written to disk.
  fs::path p = temp_path("asc_fuzz.safetensors");
  for (size_t len : {size_t{0}, size_t{7}, size_t{8}, size_t{8 + hlen / 2}, size_t{8 + hlen}, good.size() - 1}) {
    {
      std::ofstream f(p, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(good.data()), static_cast<std::streamsize>(len));
    }
    CHECK_THROWS_AS(load_safetensors(p.string()), asc::Error);
  }
  fs::remove(p);

  // Random flips in the length field and the header: an asc::Error or a self-consistent result, never a crash
  // or another exception type (this test runs under ASan/UBSan in CI).
  std::mt19937_64 rng(1234);
  int errors = 0, accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = good;
    int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      size_t pos = rng() % (8 + hlen);
      if (rng() % 2)
        b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
      else
        b[pos] = static_cast<uint8_t>(rng());
    }
    if (rng() % 8 == 0) b[8 + hlen + 15 * 4 + rng() % 3] = static_cast<uint8_t>(rng());  // a mask byte
    try {
      StateDict r = deserialize_safetensors(b);
      ++accepted;
      uint64_t total = 0;
      for (const auto& [n, t] : r) total += static_cast<uint64_t>(t.numel()) * t.element_size();
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
      CHECK(total == b.size() - 8 - n);
      for (const auto& [n, t] : r)
        if (t.dtype() == kBool)
          for (bool v : t.to_vector<bool>()) CHECK((v == true || v == false));
    } catch (const asc::Error&) {
      ++errors;
    }
  }
  MESSAGE("byte flips: " << errors << " rejected, " << accepted << " accepted");
  CHECK(errors > 0);
  CHECK(data_len == 15 * 4 + 3 + 2 * 8 + 8);
}

TEST_CASE("safetensors: generator state") {
  const uint64_t seed = 0xFEEDFACECAFEBEEFull;
  Generator g(seed);
  (void)rand({7}, {}, &g);  // advance the offset
  const uint64_t off = g.offset();
  REQUIRE(off > 0);

  StateDict st = generator_state_dict(g);
  CHECK(names_of(st) == std::vector<std::string>{"seed", "offset"});
  int64_t seed_bits;
  std::memcpy(&seed_bits, &seed, 8);  // the uint64 bit pattern, negative as int64
  CHECK(st.at("seed").dtype() == kInt64);
  CHECK(st.at("seed").dim() == 0);
  CHECK(st.at("seed").item<int64_t>() == seed_bits);
  CHECK(st.at("offset").item<int64_t>() == static_cast<int64_t>(off));

  // Through a checkpoint: a fresh generator continues the same stream.
  StateDict back = deserialize_safetensors(serialize_safetensors(st));
  Generator h(1);
  load_generator_state(h, back);
  CHECK(h.seed() == seed);
  CHECK(h.offset() == off);
  CHECK(rand({9}, {}, &h).to_vector<float>() == rand({9}, {}, &g).to_vector<float>());

  // Bad states: nothing changes.
  Generator k(5);
  (void)rand({3}, {}, &k);
  const auto before = k.state();
  auto unchanged = [&] {
    CHECK(k.seed() == before.seed);
    CHECK(k.offset() == before.offset);
  };
  StateDict missing;
  missing.set("seed", st.at("seed"));
  check_error([&] { load_generator_state(k, missing); }, {"load_generator_state", "missing entry 'offset'"});
  unchanged();
  StateDict wrong_dtype = st;
  wrong_dtype.set("offset", scalar_tensor(3.0));
  check_error([&] { load_generator_state(k, wrong_dtype); }, {"load_generator_state", "'offset'", "int64", "float32"});
  unchanged();
  StateDict two = st;
  two.set("seed", tensor(std::vector<int64_t>{1, 2}, {2}));
  check_error([&] { load_generator_state(k, two); }, {"load_generator_state", "'seed'", "one-element", "[2]"});
  unchanged();
  StateDict extra = st;
  extra.set("junk", st.at("seed"));
  check_error([&] { load_generator_state(k, extra); }, {"load_generator_state", "unexpected entry 'junk'"});
  unchanged();
}

TEST_CASE("safetensors: writes asc_written.safetensors for check_safetensors.py (the real library)") {
  // Contents must match expected() in tests/data/check_safetensors.py.
  std::vector<float> wv;
  for (int i = 0; i < 12; ++i) wv.push_back(0.25f * static_cast<float>(i) - 1.0f);
  std::vector<double> f64;
  for (int i = 0; i < 5; ++i) f64.push_back(1.0 / (i + 3));
  std::vector<int64_t> iv;
  for (int64_t i = 0; i < 6; ++i) iv.push_back((i * i << 33) - 5 * i);
  Generator g(0xFEEDFACECAFEBEEFull);
  g.set_offset(12345);

  StateDict sd;
  sd.set("w.f32", tensor(wv, {4, 3}).t());  // written from a transposed (non-contiguous) view
  sd.set("f64", tensor(f64, {5}));
  sd.set("i64", tensor(iv, {2, 3}));
  sd.set("mask", tensor(std::vector<double>{0, 1, 0, 0}, {4}, {.dtype = kBool}));
  sd.set("half", u16_tensor({0x3C00, 0xC100, 0x7BFF}, {3}, kFloat16));
  sd.set("brain", u16_tensor({0x3FC0, 0xC000}, {2}, kBFloat16));
  sd.set("scalar", scalar_tensor(-7.25, {.dtype = kFloat64}));
  sd.set("empty", zeros({2, 0}, {.dtype = kInt64}));
  sd.merge(generator_state_dict(g), "rng.");
  const Meta meta = {
      {"writer", "test_safetensors"}, {"step", "42"}, {"note", "quote\" backslash\\ newline\n tab\t \u00fc"}};
  fs::path p = temp_path("asc_written.safetensors");
  save_safetensors(p.string(), sd, meta);
  MESSAGE("wrote " << p.string() << "; check it with: python3 tests/data/check_safetensors.py " << p.string());

  Meta back_meta;
  StateDict back = load_safetensors(p.string(), &back_meta);
  CHECK(back_meta == meta);
  CHECK(names_of(back) == names_of(sd));
  for (const auto& [n, t] : sd) check_bytes_equal(back.at(n), t.contiguous());
  Generator h;
  load_generator_state(h, back.sub("rng."));
  CHECK(h.seed() == 0xFEEDFACECAFEBEEFull);
  CHECK(h.offset() == 12345);
}

TEST_CASE("safetensors: CUDA tensors are copied to the host when saved") {
  if (!cuda::is_available()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  Tensor host = tensor(std::vector<double>{1, -2, 3.5, 4}, {2, 2});
  StateDict sd;
  sd.set("x", host.to(Device::cuda()));
  StateDict back = deserialize_safetensors(serialize_safetensors(sd));
  CHECK(back.at("x").device().is_cpu());
  CHECK(back.at("x").to_vector<double>() == std::vector<double>{1, -2, 3.5, 4});
}
