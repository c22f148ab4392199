// Byte-level fuzzer of the safetensors and checkpoint loaders (issue #15). Mutants of the seed files in
// tests/data/fuzz/ and of tests/data/reference.safetensors (bit flips, edge-value 64-bit words, truncation, junk,
// duplicated / deleted ranges, edits of the JSON header) go through deserialize_safetensors, load_safetensors and,
// for the checkpoint seed, load_checkpoint. Each must load or throw asc::Error: any other exception, or an
// ASan/UBSan report, is a bug. What loads is read in full (so ASan sees a view past its storage) and must survive a
// write / read round trip; a rejected checkpoint must leave model, optimizer, scheduler and generator untouched.
//
// Runs ASC_FUZZ_SECONDS seconds (default 3; the sanitizer build's ctest sets 30) from seed ASC_FUZZ_SEED (default
// 1). A mutant depends only on the seed, its iteration and the corpus, so a failure reported as
// "ASC_FUZZ_SEED=S ASC_FUZZ_ITER=I" replays alone (printing the mutations) with
//   ASC_FUZZ_SEED=S ASC_FUZZ_ITER=I ./test_fuzz_loaders -tc='fuzz:*'
// ASC_FUZZ_WRITE_CORPUS=1 rewrites the seed files from make_corpus() below.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string_view>
#include <typeinfo>

#if defined(ASC_SANITIZE_BUILD)
#include <sanitizer/common_interface_defs.h>
#endif

#include "nn/safetensors.h"
#include "optim/optim.h"
#include "testing.h"
#include "train/checkpoint.h"
using namespace asc;
using namespace asc::testing;

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Meta = std::map<std::string, std::string>;

fs::path data_dir() { return fs::path(__FILE__).parent_path() / "data"; }
fs::path corpus_dir() { return data_dir() / "fuzz"; }

Bytes read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
void write_file(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f.good()) FAIL("cannot write " << p);
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void write_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// 8-byte little-endian length + header, no data: for hand-written regression headers.
Bytes make_file(const std::string& header, size_t data_bytes = 0) {
  Bytes b(8 + header.size() + data_bytes, 0);
  write_le64(b.data(), header.size());
  std::copy(header.begin(), header.end(), b.begin() + 8);
  return b;
}

const char* env_or_null(const char* name) {
  const char* s = std::getenv(name);
  return s && *s ? s : nullptr;
}
uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* s = env_or_null(name);
  if (!s) return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 0);
  REQUIRE_MESSAGE((*end == '\0' && errno == 0), name << "=" << s << " is not an unsigned integer");
  return v;
}
double env_seconds(const char* name, double fallback) {
  const char* s = env_or_null(name);
  if (!s) return fallback;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  REQUIRE_MESSAGE((*end == '\0' && v >= 0), name << "=" << s << " is not a number of seconds");
  return v;
}

// ---- the checkpoint seed's training state ------------------------------------------------------------------

// A float parameter pair and an int64 buffer: the two dtype families Module::load_state_dict distinguishes.
struct Tiny : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor count;
  Tiny() : nn::Module("Tiny") {
    fc = register_module("fc", std::make_shared<nn::Linear>(2, 3));
    count = register_buffer("count", tensor(std::vector<int64_t>{7}, Shape{}));
  }
  Tensor forward(const Tensor& x) override { return (*fc)(x); }
};

struct TinyRun {
  std::shared_ptr<Tiny> model = std::make_shared<Tiny>();
  optim::AdamW opt{model->parameters(), {.lr = 0.1}};
  optim::WarmupCosine sched{opt, {.warmup_steps = 2, .total_steps = 10}};
  Generator gen{42};
  TrainingState state() { return {.model = model.get(), .optimizer = &opt, .scheduler = &sched, .generator = &gen}; }
  // One step, so the optimizer has per-parameter state (step, exp_avg, exp_avg_sq) to save.
  void train_step() {
    opt.zero_grad();
    Tensor out = (*model)(tensor({1.0, -2.0, 0.5, 3.0}, {2, 2}, {.dtype = kFloat32}));
    sum(out * out).backward();
    opt.step();
    sched.step();
  }
  // Everything load_checkpoint may change, copied.
  StateDict snapshot() const {
    StateDict all;
    for (const auto& [n, t] : model->state_dict()) all.set("model." + n, t.detach().clone());
    all.merge(opt.state_dict(), "optim.");
    all.merge(sched.state_dict(), "sched.");
    all.merge(generator_state_dict(gen), "rng.");
    return all;
  }
};

// testing.h's same_bits, minus its memcmp of an empty tensor's null data pointer (UBSan flags that).
bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.numel() == 0) return true;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(a.numel()) * a.element_size()) == 0;
}
bool same_dicts(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
    if (ia->first != ib->first || !same_tensor(ia->second, ib->second)) return false;
  return true;
}

// ---- seed corpus -------------------------------------------------------------------------------------------

Tensor u16_tensor(const std::vector<uint16_t>& bits, const Shape& s, DType dt) {
  Tensor t = empty(s, {.dtype = dt});
  std::memcpy(t.raw_data(), bits.data(), bits.size() * 2);
  return t;
}

// The seed files, by name. Small on purpose: a mutation then hits a header field or a tensor boundary often.
std::map<std::string, Bytes> make_corpus() {
  std::map<std::string, Bytes> c;
  StateDict mixed;  // five dtypes, a 0-d and a 0-element tensor
  mixed.set("w", tensor({0.5, -1.0, 2.0, 0.0, 1e-3, -7.25}, {2, 3}, {.dtype = kFloat32}));
  mixed.set("step", tensor(std::vector<int64_t>{-3}, Shape{}));
  mixed.set("empty", zeros({0, 3}, {.dtype = kFloat64}));
  mixed.set("mask", tensor({1.0, 0.0, 1.0}, {3}, {.dtype = kBool}));
  mixed.set("half", u16_tensor({0x3C00, 0xC100}, {2}, kFloat16));
  c["mixed.safetensors"] = serialize_safetensors(mixed);

  StateDict with_meta;  // metadata with escapes and non-ASCII text
  with_meta.set("emb", u16_tensor({0x3FC0, 0xC000, 0x4050, 0x0000}, {2, 2}, kBFloat16));
  with_meta.set("b", tensor(std::vector<double>{1.0 / 3, -0.0}, {2}));
  c["metadata.safetensors"] = serialize_safetensors(
      with_meta, {{"format", "pt"}, {"note", "\u00fc\u2192\U0001F600 \"q\"\n\\"}, {"", "empty key"}});

  c["no_tensors.safetensors"] = serialize_safetensors({});

  manual_seed(0);  // the Linear's initial weights
  TinyRun run;
  run.train_step();
  fs::path p = fs::temp_directory_path() / fmt::format("asc_fuzz_seed_{}.safetensors", ::getpid());
  save_checkpoint(p.string(), run.state(), {{"step", "1"}});
  c["checkpoint.safetensors"] = read_file(p);
  fs::remove(p);
  return c;
}

// Where a seed's tensors lie in the file, so that a mutation can change a value and keep the file well-formed:
// such mutants get past the safetensors checks into Module / Optimizer / LRScheduler::load_state_dict.
struct Field {
  size_t at, nbytes;
  DType dtype;
};

struct Seed {
  std::string name;
  Bytes bytes;
  bool checkpoint;
  std::vector<Field> fields;
};

// The loader orders tensors by offset and they cover the data exactly, so the layout is their running sizes.
std::vector<Field> layout_of(const Bytes& b) {
  std::vector<Field> out;
  size_t at = 8 + read_le64(b.data());
  for (const auto& [name, t] : deserialize_safetensors(b)) {
    size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (n) out.push_back({at, n, t.dtype()});
    at += n;
  }
  return out;
}

std::vector<Seed> load_corpus() {
  std::vector<Seed> seeds;
  for (const auto& entry : fs::directory_iterator(corpus_dir()))
    if (entry.path().extension() == ".safetensors")
      seeds.push_back({entry.path().filename().string(),
                       read_file(entry.path()),
                       entry.path().filename().string().rfind("checkpoint", 0) == 0,
                       {}});
  // The file written by the real safetensors library (Python) too: its header is laid out differently.
  seeds.push_back({"../reference.safetensors", read_file(data_dir() / "reference.safetensors"), false, {}});
  std::sort(seeds.begin(), seeds.end(), [](const Seed& a, const Seed& b) { return a.name < b.name; });  // stable replay
  for (Seed& s : seeds) s.fields = layout_of(s.bytes);
  return seeds;
}

// ---- mutations ---------------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Mutator {
 public:
  // `log`, when given, receives one line per mutation (for replays).
  Mutator(uint64_t seed, std::string* log) : rng_(seed), log_(log) {}
  void set_fields(const std::vector<Field>* fields) { fields_ = fields; }
  std::mt19937_64& rng() { return rng_; }

  void mutate(Bytes& b) {
    // Mostly 1-3 stacked mutations; now and then a burst, which reaches states one edit cannot (two dims changed).
    int n = below(8) == 0 ? 4 + static_cast<int>(below(5)) : 1 + static_cast<int>(below(3));
    for (int i = 0; i < n; ++i) mutate_once(b);
  }

 private:
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  template <class... A>
  void note(fmt::format_string<A...> f, A&&... a) {
    if (log_) *log_ += fmt::format(f, std::forward<A>(a)...) + "\n";
  }

  // The header as the length field declares it when that fits the file, else all bytes after the field.
  struct Header {
    size_t begin, size;
    bool consistent;
  };
  Header header(const Bytes& b) const {
    if (b.size() < 8) return {b.size(), 0, false};
    uint64_t n = read_le64(b.data());
    size_t avail = b.size() - 8;
    return n <= avail ? Header{8, static_cast<size_t>(n), true} : Header{8, avail, false};
  }

  // Replaces header bytes [pos, pos + len) by `s`; mostly keeps the length field in step, so the edit reaches the
  // JSON parser and the validation instead of failing the length check.
  void splice_header(Bytes& b, const Header& h, size_t pos, size_t len, std::string_view s) {
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos), b.begin() + static_cast<std::ptrdiff_t>(pos + len));
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), s.begin(), s.end());
    if (h.consistent && below(8) != 0) write_le64(b.data(), h.size - len + s.size());
  }

  // Offsets (absolute) of every header byte satisfying `pred`.
  template <class P>
  std::vector<size_t> header_positions(const Bytes& b, const Header& h, P pred) const {
    std::vector<size_t> out;
    for (size_t i = h.begin; i < h.begin + h.size; ++i)
      if (pred(static_cast<char>(b[i]))) out.push_back(i);
    return out;
  }
  // Absolute offsets of every occurrence of `token` in the header.
  std::vector<size_t> find_all(const Bytes& b, const Header& h, std::string_view token) const {
    std::string_view text(reinterpret_cast<const char*>(b.data() + h.begin), h.size);
    std::vector<size_t> out;
    for (size_t at = text.find(token); at != std::string_view::npos; at = text.find(token, at + 1))
      out.push_back(h.begin + at);
    return out;
  }

  // Replaces one occurrence of any of `tokens` in the header by one of `into` (the random choice of cases 10 and
  // 11); `what` names the edit in the replay log. Nothing when no token occurs.
  template <size_t N, size_t M>
  void replace_token(Bytes& b, const Header& h, const char* const (&tokens)[N], const char* const (&into)[M],
                     const char* what) {
    std::vector<std::pair<size_t, size_t>> found;
    for (const char* t : tokens)
      for (size_t at : find_all(b, h, t)) found.emplace_back(at, std::strlen(t));
    if (found.empty()) return;
    auto [at, len] = found[below(found.size())];
    const char* to = into[below(M)];
    splice_header(b, h, at, len, to);
    note("{} at {} = {}", what, at, to);
  }

  // Numbers that sit on a boundary of some check: int64 / uint64 / 2^32 / 2^53 edges, the file size, small values,
  // and malformed ones (leading zero, fraction, exponent).
  std::string edge_number(size_t file_size) {
    static constexpr const char* fixed[] = {"0",
                                            "1",
                                            "2",
                                            "3",
                                            "4",
                                            "8",
                                            "-1",
                                            "-0",
                                            "00",
                                            "01",
                                            "1.5",
                                            "1e3",
                                            "2147483647",
                                            "2147483648",
                                            "4294967295",
                                            "4294967296",
                                            "9007199254740993",
                                            "4611686018427387904",
                                            "4611686018427387903",
                                            "9223372036854775807",
                                            "9223372036854775808",
                                            "-9223372036854775808",
                                            "-9223372036854775809",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "99999999999999999999999"};
    switch (below(4)) {
      case 0: return std::to_string(file_size + below(3) - 1);
      case 1: return std::to_string(below(64));
      default: return fixed[below(std::size(fixed))];
    }
  }

  uint64_t edge_word(const Bytes& b) {
    const uint64_t n = b.size(), hl = b.size() >= 8 ? read_le64(b.data()) : 0;
    const uint64_t v[] = {
        0,     1,     8,     0x7FFFFFFFFFFFFFFFull, ~0ull,       1ull << 32, (1ull << 32) - 1, 1ull << 63, n, n - 1,
        n + 1, n - 8, n - 9, 100'000'000,           100'000'001, hl + 1,     hl - 1,           hl + 8};
    return v[below(std::size(v))];
  }

  // A value on an edge of what the state loaders check (negative steps, 2^53 + 1 and int64 extremes through a
  // double, NaN / inf / huge options, bool bytes other than 0 / 1), in a field's dtype.
  void write_edge_value(uint8_t* p, DType dt) {
    static constexpr int64_t ints[] = {0,
                                       1,
                                       -1,
                                       2,
                                       3,
                                       1000000,
                                       (int64_t{1} << 53) + 1,
                                       int64_t{1} << 62,
                                       INT64_MAX,
                                       INT64_MIN,
                                       INT64_MAX - 1,
                                       int64_t{1} << 32};
    static constexpr double reals[] = {0.0,
                                       -0.0,
                                       1.0,
                                       -1.0,
                                       0.5,
                                       2.0,
                                       1e308,
                                       -1e308,
                                       5e-324,
                                       1e-300,
                                       9.3e18,
                                       -9.3e18,
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(),
                                       std::numeric_limits<double>::quiet_NaN()};
    switch (dt) {
      case DType::Int64: {
        int64_t v = ints[below(std::size(ints))];
        std::memcpy(p, &v, 8);
        note("int64 {}", v);
        return;
      }
      case DType::Float64: {
        double v = reals[below(std::size(reals))];
        std::memcpy(p, &v, 8);
        note("float64 {}", v);
        return;
      }
      case DType::Float32: {
        float v = static_cast<float>(reals[below(std::size(reals))]);
        std::memcpy(p, &v, 4);
        note("float32 {}", v);
        return;
      }
      case DType::Bool: {
        static constexpr uint8_t bytes[] = {0, 1, 2, 0xFF};
        *p = bytes[below(4)];
        note("bool byte {}", *p);
        return;
      }
      default: {  // 16-bit patterns: 0, +inf (F16), NaN, all ones
        static constexpr uint16_t bits[] = {0x0000, 0x7C00, 0x7FC0, 0xFFFF};
        std::memcpy(p, &bits[below(4)], 2);
        note("16-bit pattern");
        return;
      }
    }
  }

  // [begin, end) of every tensor name in the header (a key whose value starts with {"dtype").
  std::vector<std::pair<size_t, size_t>> tensor_names(const Bytes& b, const Header& h) const {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t v : find_all(b, h, "{\"dtype\"")) {
      size_t end = v;  // back over ':' and whitespace to the closing quote of the key
      while (end > h.begin && b[end - 1] != '"') --end;
      if (end <= h.begin + 1) continue;
      size_t begin = end - 1;
      while (begin > h.begin && !(b[begin - 1] == '"' && b[begin - 2] != '\\')) --begin;
      if (begin > h.begin) out.emplace_back(begin, end - 1);
    }
    return out;
  }

  void mutate_once(Bytes& b) {
    const Header h = header(b);
    switch (below(18)) {
      case 14:
      case 15: {  // one element of a tensor to an edge value of its dtype (the file stays well-formed)
        if (!fields_ || fields_->empty()) return;
        const Field& f = (*fields_)[below(fields_->size())];
        size_t es = dtype_size(f.dtype), at = f.at + es * below(f.nbytes / es);
        if (at + es > b.size()) return;
        note("element at {}:", at);
        write_edge_value(b.data() + at, f.dtype);
        return;
      }
      case 16: {  // two tensor names swapped: same layout, each name now on the other's dtype / shape / data
        auto names = tensor_names(b, h);
        if (names.size() < 2) return;
        size_t i = below(names.size()), j = below(names.size());
        if (i == j) return;
        if (i > j) std::swap(i, j);
        auto [bi, ei] = names[i];
        auto [bj, ej] = names[j];
        std::string a(b.begin() + static_cast<std::ptrdiff_t>(bi), b.begin() + static_cast<std::ptrdiff_t>(ei));
        std::string c(b.begin() + static_cast<std::ptrdiff_t>(bj), b.begin() + static_cast<std::ptrdiff_t>(ej));
        splice_header(b, h, bj, ej - bj, a);  // the later one first: the earlier offsets stay valid
        Header h2 = header(b);
        splice_header(b, h2, bi, ei - bi, c);
        note("swap names '{}' and '{}'", a, c);
        return;
      }
      case 17: {  // a tensor name edited: a character dropped or changed, so a prefix or index no longer matches
        auto names = tensor_names(b, h);
        if (names.empty()) return;
        auto [nb, ne] = names[below(names.size())];
        if (nb == ne) return;
        size_t at = nb + below(ne - nb);
        static constexpr std::string_view into[] = {"", ".", "0", "1", "9", "x", ".."};
        std::string_view to = into[below(std::size(into))];
        splice_header(b, h, at, 1, to);
        note("name char at {} = '{}'", at, to);
        return;
      }
      case 0: {  // flip one bit
        if (b.empty()) return;
        size_t at = below(b.size());
        int bit = static_cast<int>(below(8));
        b[at] ^= static_cast<uint8_t>(1u << bit);
        note("flip bit {} of byte {}", bit, at);
        return;
      }
      case 1: {  // a byte to 0x00 / 0xFF / random
        if (b.empty()) return;
        size_t at = below(b.size());
        uint64_t k = below(3);
        // Random bytes are printable ASCII half the time: in the header those get past the UTF-8 check.
        b[at] = k == 0 ? 0x00 : k == 1 ? 0xFF : static_cast<uint8_t>(below(2) ? 0x20 + below(95) : rng_());
        note("byte {} = {:#04x}", at, b[at]);
        return;
      }
      case 2:
      case 3: {  // an 8-byte word to an edge value; the length field a sixth of the time
        if (b.size() < 8) return;
        size_t at = below(6) == 0 ? 0 : below(b.size() - 7);
        uint64_t v = edge_word(b);
        write_le64(b.data() + at, v);
        note("u64 at {} = {}", at, v);
        return;
      }
      case 4: {  // truncate
        size_t len = below(b.size() + 1);
        b.resize(len);
        note("truncate to {}", len);
        return;
      }
      case 5: {  // append junk: random bytes, spaces (header padding) or zeros
        size_t len = 1 + below(64);
        uint64_t k = below(3);
        for (size_t i = 0; i < len; ++i) b.push_back(k == 0 ? static_cast<uint8_t>(rng_()) : k == 1 ? ' ' : 0);
        note("append {} bytes of kind {}", len, k);
        return;
      }
      case 6: {  // duplicate a range somewhere else
        if (b.empty()) return;
        size_t from = below(b.size()), len = 1 + below(std::min<size_t>(64, b.size() - from)), to = below(b.size() + 1);
        Bytes piece(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(from + len));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(to), piece.begin(), piece.end());
        note("copy [{}, {}) to {}", from, from + len, to);
        return;
      }
      case 7: {  // delete a range
        if (b.empty()) return;
        size_t from = below(b.size()), len = 1 + below(std::min<size_t>(64, b.size() - from));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(from + len));
        note("delete [{}, {})", from, from + len);
        return;
      }
      case 8: {  // a number of the header (shape, data_offsets) to an edge value
        std::vector<size_t> starts;
        for (size_t i = h.begin; i < h.begin + h.size; ++i)
          if (std::isdigit(b[i]) && (i == h.begin || !std::isdigit(b[i - 1]))) starts.push_back(i);
        if (starts.empty()) return;
        size_t at = starts[below(starts.size())], end = at;
        while (end < h.begin + h.size && std::isdigit(b[end])) ++end;
        std::string num = edge_number(b.size());
        splice_header(b, h, at, end - at, num);
        note("number at {} = {}", at, num);
        return;
      }
      case 9: {  // an extra number in an array (one more dimension, a third offset)
        std::vector<size_t> at = header_positions(b, h, [](char c) { return c == '[' || c == ','; });
        if (at.empty()) return;
        size_t pos = at[below(at.size())] + 1;
        std::string num = edge_number(b.size()) + ",";
        splice_header(b, h, pos, 0, num);
        note("insert '{}' at {}", num, pos);
        return;
      }
      case 10: {  // a dtype string to another one, supported or not
        static constexpr const char* dtypes[] = {"\"F32\"", "\"F64\"", "\"I64\"", "\"BOOL\"", "\"BF16\"", "\"F16\""};
        static constexpr const char* into[] = {"\"F32\"",  "\"F64\"", "\"I64\"",     "\"BOOL\"", "\"BF16\"", "\"F16\"",
                                               "\"U8\"",   "\"I32\"", "\"F8_E4M3\"", "\"C64\"",  "\"f32\"",  "\"\"",
                                               "\"F32 \"", "32",      "[\"F32\"]",   "null"};
        replace_token(b, h, dtypes, into, "dtype");
        return;
      }
      case 11: {  // a field name to another (missing, duplicate or unknown field)
        static constexpr const char* keys[] = {"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\""};
        static constexpr const char* into[] = {"\"dtype\"", "\"shape\"",       "\"data_offsets\"", "\"__metadata__\"",
                                               "\"extra\"", "\"__metadata_\"", "\"DTYPE\""};
        replace_token(b, h, keys, into, "key");
        return;
      }
      case 12: {  // a structural character deleted, or swapped for another
        std::vector<size_t> at = header_positions(b, h, [](char c) {
          return c == '{' || c == '}' || c == '[' || c == ']' || c == '"' || c == ':' || c == ',' || c == '\\';
        });
        if (at.empty()) return;
        size_t pos = at[below(at.size())];
        static constexpr std::string_view swaps[] = {"", "", "", " ", "{", "}", "[", "]", "\"", ":", ","};
        std::string_view to = swaps[below(std::size(swaps))];
        splice_header(b, h, pos, 1, to);
        note("structural char at {} = '{}'", pos, to);
        return;
      }
      case 13: {  // a snippet inserted: a tensor entry, metadata, deep nesting, escapes, bad UTF-8
        static constexpr std::string_view snippets[] = {
            R"("x":{"dtype":"F32","shape":[],"data_offsets":[0,0]},)",
            R"("x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)",
            R"("x":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},)",
            R"("x":{"dtype":"I64","shape":[0,4611686018427387904,4],"data_offsets":[0,0]},)",
            R"("__metadata__":{"a":"b"},)",
            R"("__metadata__":{"a":1},)",
            R"("__metadata__":[],)",
            R"("\ud83d\ude00":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)",
            R"("\ud800")",
            R"("\udc00")",
            R"("\u00")",
            R"("\x")",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
            "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":"
            "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":"
            "{\"a\":{\"a\":{\"a\":{\"a\":",
            "\xC0\x80",
            "\xED\xA0\x80",
            "\xF4\x90\x80\x80",
            "\xE2\x82",
            std::string_view("\0", 1),
            "\t\r\n ",
        };
        size_t pos = h.size == 0 ? h.begin : h.begin + below(h.size + 1);
        if (below(2) == 0) {  // right after the opening brace, where a new entry parses
          std::vector<size_t> br = header_positions(b, h, [](char c) { return c == '{'; });
          if (!br.empty()) pos = br[0] + 1;
        }
        size_t k = below(std::size(snippets));
        splice_header(b, h, pos, 0, snippets[k]);
        note("insert snippet {} at {}", k, pos);
        return;
      }
    }
  }

  std::mt19937_64 rng_;
  std::string* log_;
  const std::vector<Field>* fields_ = nullptr;
};

// ---- the harness -------------------------------------------------------------------------------------------

// The mutant under test, for the failure paths and the sanitizer death callback: they name it and save it to
// <tmp>/asc_fuzz_failure_<seed>_<iteration>.safetensors.
struct Current {
  uint64_t seed = 0, iter = 0;
  const char* seed_file = "";
  const Bytes* mutant = nullptr;
} g_current;

void write_crash_file() {
  if (!g_current.mutant) return;
  std::string p =
      (fs::temp_directory_path() / fmt::format("asc_fuzz_failure_{}_{}.safetensors", g_current.seed, g_current.iter))
          .string();
  if (FILE* f = std::fopen(p.c_str(), "wb")) {
    std::fwrite(g_current.mutant->data(), 1, g_current.mutant->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz: mutant written to %s\n", p.c_str());
  }
}

#if defined(ASC_SANITIZE_BUILD)
void on_sanitizer_death() {
  std::fprintf(stderr, "\nfuzz: sanitizer report on a mutant of %s; replay: ASC_FUZZ_SEED=%llu ASC_FUZZ_ITER=%llu\n",
               g_current.seed_file, static_cast<unsigned long long>(g_current.seed),
               static_cast<unsigned long long>(g_current.iter));
  write_crash_file();
}
#endif

// Runs `fn`: true when it returns, false on asc::Error; any other exception fails the test (naming the API; the
// surrounding INFO names seed and iteration).
template <class F>
bool loads(const char* api, F&& fn) {
  try {
    fn();
    return true;
  } catch (const asc::Error&) {
    return false;
  } catch (const std::exception& e) {
    write_crash_file();
    FAIL(api << " threw " << typeid(e).name() << " instead of asc::Error: " << e.what());
  } catch (...) {
    write_crash_file();
    FAIL(api << " threw a non-std exception instead of asc::Error");
  }
  return false;
}

#define FUZZ_EXPECT(cond, msg) \
  do {                         \
    if (!(cond)) {             \
      write_crash_file();      \
      FAIL(msg);               \
    }                          \
  } while (0)

volatile double g_sink;  // keeps the reads of loaded data from being optimised away

// Reads every byte of every loaded tensor (ASan flags a view past its storage), converts what the CPU computes
// with, checks the tensors cover the data section, and that the writer re-encodes them to an equal state
// (serialize -> deserialize -> serialize is a fixed point).
void check_loaded(const StateDict& sd, const Meta& meta, const Bytes& file) {
  uint64_t covered = 0, bytesum = 0;
  double valsum = 0;
  for (const auto& [name, t] : sd) {
    FUZZ_EXPECT(t.defined() && t.device().is_cpu() && !t.requires_grad(),
                "tensor '" << name << "' is not a plain CPU tensor");
    FUZZ_EXPECT(t.numel() >= 0 && t.dim() <= kMaxDims,
                "tensor '" << name << "' has shape " << fmt::format("{}", t.shape()));
    const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
    covered += nbytes;
    const auto* p = static_cast<const uint8_t*>(t.raw_data());
    for (size_t i = 0; i < nbytes; ++i) bytesum += p[i];
    if (t.dtype() == kFloat32 || t.dtype() == kFloat64 || t.dtype() == kInt64 || t.dtype() == kBool)
      for (double v : t.to_vector<double>()) valsum += v;
  }
  g_sink = valsum + static_cast<double>(bytesum);
  FUZZ_EXPECT(covered == file.size() - 8 - read_le64(file.data()), "the tensors hold "
                                                                       << covered << " bytes but the data section has "
                                                                       << file.size() - 8 - read_le64(file.data()));

  Bytes again, twice;
  Meta meta2;
  StateDict back;
  bool ok = loads("serialize/deserialize of a loaded state", [&] {
    again = serialize_safetensors(sd, meta);
    back = deserialize_safetensors(again, &meta2);
    twice = serialize_safetensors(back, meta2);
  });
  FUZZ_EXPECT(ok, "a state the loader accepted does not round-trip through the writer");
  FUZZ_EXPECT(same_dicts(sd, back) && meta == meta2 && again == twice, "the round trip changed the loaded state");
}

// A checkpoint that loaded saves back what it held: every entry, bit for bit, with two exceptions. Model entries
// of another dtype than the model's are converted on load; the optimizer's lr is what the scheduler sets from its
// own state. (Optimizer steps are read as int64, exactly: 2^53 + 1 and INT64_MAX - 1 come back unchanged.)
void check_saved_back(const StateDict& file, const TinyRun& run) {
  const StateDict now = run.snapshot();
  FUZZ_EXPECT(now.size() == file.size(),
              "the checkpoint has " << file.size() << " entries, the loaded state saves " << now.size());
  for (const auto& [name, t] : file) {
    const Tensor* mine = now.find(name);
    FUZZ_EXPECT(mine != nullptr, "'" << name << "' loaded but is not saved back");
    if (name.starts_with("model.") && mine->dtype() != t.dtype()) continue;
    if (name.starts_with("optim.groups.") && name.ends_with(".lr")) continue;
    FUZZ_EXPECT(same_tensor(*mine, t), "'" << name << "' is saved back as " << fmt::format("{}", mine->shape()) << " "
                                           << dtype_name(mine->dtype()) << " with other contents");
  }
}

// How many mutants each path accepted: a fuzzer whose mutants all fail the first check tests nothing behind it.
struct Tally {
  uint64_t loaded = 0, checkpoints = 0, checkpoints_loaded = 0;
};

// Feeds one mutant to every loader. `tmp` is this process's scratch file.
void run_mutant(const Seed& seed, const Bytes& m, const fs::path& tmp, bool via_file, Tally& tally) {
  StateDict sd;
  Meta meta;
  const bool ok_mem = loads("deserialize_safetensors", [&] { sd = deserialize_safetensors(m, &meta); });
  if (ok_mem) check_loaded(sd, meta, m), ++tally.loaded;
  if (!via_file) return;

  write_file(tmp, m);
  StateDict fsd;
  Meta fmeta;
  const bool ok_file = loads("load_safetensors", [&] { fsd = load_safetensors(tmp.string(), &fmeta); });
  FUZZ_EXPECT(ok_file == ok_mem, "load_safetensors " << (ok_file ? "accepted" : "rejected")
                                                     << " what deserialize_safetensors "
                                                     << (ok_mem ? "accepted" : "rejected"));
  if (ok_file)
    FUZZ_EXPECT(same_dicts(sd, fsd) && meta == fmeta, "load_safetensors and deserialize_safetensors disagree");
  if (!seed.checkpoint) return;

  TinyRun run;
  const StateDict before = run.snapshot();
  Meta cmeta;
  const bool ok_ckpt = loads("load_checkpoint", [&] { load_checkpoint(tmp.string(), run.state(), &cmeta); });
  FUZZ_EXPECT(!ok_ckpt || ok_file, "load_checkpoint accepted a file load_safetensors rejects");
  if (!ok_ckpt)
    FUZZ_EXPECT(same_dicts(before, run.snapshot()), "a rejected checkpoint changed the training state");
  else
    check_saved_back(fsd, run);
  ++tally.checkpoints;
  tally.checkpoints_loaded += ok_ckpt;
}

}  // namespace

// ---- the corpus --------------------------------------------------------------------------------------------

TEST_CASE("fuzz corpus: the seed files are small and load") {
  if (env_or_null("ASC_FUZZ_WRITE_CORPUS")) {
    fs::create_directories(corpus_dir());
    for (const auto& [name, bytes] : make_corpus()) write_file(corpus_dir() / name, bytes);
    MESSAGE("rewrote the seed files in " << corpus_dir());
  }
  std::vector<Seed> seeds = load_corpus();
  REQUIRE(seeds.size() == 5);
  for (const Seed& s : seeds) {
    CAPTURE(s.name);
    CHECK(s.bytes.size() < 4096);
    Meta meta;
    StateDict sd = deserialize_safetensors(s.bytes, &meta, s.name);
    if (s.name == "mixed.safetensors") {
      CHECK(sd.size() == 5);
      CHECK(sd.at("step").dim() == 0);
      CHECK(sd.at("empty").numel() == 0);
    }
    if (s.name == "metadata.safetensors") CHECK(meta.at("format") == "pt");
    if (s.checkpoint) {
      fs::path p = fs::temp_directory_path() / fmt::format("asc_fuzz_ckpt_{}.safetensors", ::getpid());
      write_file(p, s.bytes);
      TinyRun run;
      load_checkpoint(p.string(), run.state(), &meta);
      CHECK(meta.at("step") == "1");
      CHECK(run.sched.state_dict().at("last_step").item<int64_t>() == 1);
      CHECK(run.opt.state_dict().contains("state.0.0.exp_avg"));
      fs::remove(p);
    }
  }
}

// ---- regressions -------------------------------------------------------------------------------------------

TEST_CASE("fuzz regressions: a 0 dimension does not hide an overflowing shape") {
  // The loader checked numel * element size only, which a 0 dimension makes 0; Tensor::empty then computed the
  // contiguous strides / running element count of [0, 2^62, 4] and overflowed int64 (UBSan: signed integer
  // overflow in contiguous_strides). Now the nonzero dimensions' product must fit in int64.
  const fs::path p = fs::temp_directory_path() / fmt::format("asc_fuzz_regress_{}.safetensors", ::getpid());
  for (std::string shape : {"[0,4611686018427387904,4]", "[4611686018427387904,4,0]", "[3037000500,0,3037000500]"}) {
    CAPTURE(shape);
    Bytes f = make_file(R"({"z":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,0]}})");
    check_error([&] { deserialize_safetensors(f); }, {"'z'", "overflows", "nonzero dimensions"});
    write_file(p, f);
    check_error([&] { load_safetensors(p.string()); }, {"'z'", "overflows"});
  }
  // Elements that fit but bytes that do not: 2^61 float64.
  check_error(
      [] {
        deserialize_safetensors(
            make_file(R"({"z":{"dtype":"F64","shape":[1152921504606846976,2],"data_offsets":[0,0]}})"));
      },
      {"'z'", "overflows", "bytes"});
  // Empty, and every product within int64: a valid (if odd) tensor.
  StateDict sd = deserialize_safetensors(
      make_file(R"({"z":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})"));
  CHECK(sd.at("z").shape() == Shape{0, INT64_MAX});
  CHECK(sd.at("z").numel() == 0);
  check_loaded(sd, {}, make_file(R"({"z":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})"));
  fs::remove(p);
}

TEST_CASE("fuzz regressions: a checkpoint entry outside model. / optim. / sched. / rng. is refused") {
  // One byte dropped from "optim.state.0.0.exp_avg_sq" made an entry no part claimed; load_checkpoint ignored it and
  // the optimizer resumed without that buffer. save_checkpoint writes only the four parts, so anything else is an
  // error, and the training state stays untouched.
  StateDict all = deserialize_safetensors(read_file(corpus_dir() / "checkpoint.safetensors")), renamed;
  for (const auto& [n, t] : all) renamed.set(n == "optim.state.0.0.exp_avg_sq" ? "otim.state.0.0.exp_avg_sq" : n, t);
  const fs::path p = fs::temp_directory_path() / fmt::format("asc_fuzz_regress_{}.safetensors", ::getpid());
  save_safetensors(p.string(), renamed);
  TinyRun run;
  const StateDict before = run.snapshot();
  check_error([&] { load_checkpoint(p.string(), run.state()); },
              {"load_checkpoint", "unexpected entry 'otim.state.0.0.exp_avg_sq'"});
  CHECK(same_dicts(before, run.snapshot()));
  fs::remove(p);
}

// ---- the fuzzer --------------------------------------------------------------------------------------------

TEST_CASE("fuzz: mutated safetensors and checkpoint files load or throw asc::Error") {
  const uint64_t seed = env_u64("ASC_FUZZ_SEED", 1);
  const double seconds = env_seconds("ASC_FUZZ_SECONDS", 3.0);
  const char* replay = env_or_null("ASC_FUZZ_ITER");
  std::vector<Seed> seeds = load_corpus();
  if (const char* only = env_or_null("ASC_FUZZ_FILE"))  // one seed file alone, e.g. checkpoint.safetensors
    std::erase_if(seeds, [&](const Seed& s) { return s.name != only; });
  REQUIRE_MESSAGE(!seeds.empty(), "ASC_FUZZ_FILE names no seed file");
  const fs::path tmp = fs::temp_directory_path() / fmt::format("asc_fuzz_{}.safetensors", ::getpid());
#if defined(ASC_SANITIZE_BUILD)
  __sanitizer_set_death_callback(on_sanitizer_death);
#endif
  MESSAGE("ASC_FUZZ_SEED=" << seed << (replay ? " ASC_FUZZ_ITER=" + std::string(replay) : std::string()));

  uint64_t iter = replay ? env_u64("ASC_FUZZ_ITER", 0) : 0, done = 0;
  Tally tally;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  do {
    std::string log;
    Mutator mut(splitmix64(seed ^ splitmix64(iter)), replay ? &log : nullptr);
    const Seed& s = seeds[mut.rng()() % seeds.size()];
    mut.set_fields(&s.fields);
    Bytes m = s.bytes;
    mut.mutate(m);
    // The file reader on every checkpoint mutant and a quarter of the others: it is the slower path.
    const bool via_file = s.checkpoint || mut.rng()() % 4 == 0;
    g_current = {seed, iter, s.name.c_str(), &m};
    INFO("mutant of " << s.name << ": replay with ASC_FUZZ_SEED=" << seed << " ASC_FUZZ_ITER=" << iter);
    if (replay) MESSAGE("mutant of " << s.name << " (" << m.size() << " bytes):\n" << log);
    run_mutant(s, m, tmp, via_file, tally);
    ++iter, ++done;
  } while (!replay && std::chrono::steady_clock::now() < deadline);
  g_current = {};
  fs::remove(tmp);

  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(
      fmt::format("{} mutants in {:.1f} s ({:.0f} per second): {} loaded; {} checkpoint mutants, {} loaded by "
                  "load_checkpoint",
                  done, elapsed, static_cast<double>(done) / std::max(elapsed, 1e-9), tally.loaded, tally.checkpoints,
                  tally.checkpoints_loaded));
}
