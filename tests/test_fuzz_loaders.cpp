// Byte-level fuzzer of the file loaders: the safetensors and checkpoint loaders, config files and every
// data reader.
//
// Safetensors / checkpoints. Mutants of the seed files in
// tests/data/fuzz/ and of tests/data/reference.safetensors (bit flips, edge-value 64-bit words, truncation, junk,
// duplicated / deleted ranges, edits of the JSON header) go through deserialize_safetensors, load_safetensors and,
// for the checkpoint seed, load_checkpoint. Each must load or throw asc::Error: any other exception, or an
// ASan/UBSan report, is a bug. What loads is read in full (so ASan sees a view past its storage) and must survive a
// write / read round trip; a rejected checkpoint must leave model, optimizer, scheduler and generator untouched.
//
// Config files (where the trainer library is built): mutants of config_json(Config{}) and of hand-written configs
// (lists, booleans, escapes, nesting) through OptionTable::args_from_json + the flags' parser, OptionTable::parse_file
// and read_config (which must agree), then validate_config; what loads must survive config_json -> read_config.
// Data readers: read_idx on mutants of small IDX files (plain, gzip of the mutant, mutant of the gzip; a plain
// mutant loads exactly when it is a well-formed IDX file, checked against a reference reader), read_file_maybe_gzip
// and CompressedReader on mutants of one- and two-member gzip files (a cut stream, or trailing bytes that are no
// member, must throw), make_task("file:PATH") on mutants of small TSV / CSV / token-id files, and make_task of
// listops / pathfinder / grouping with hostile option values (negative, 0, 2^62, INT64_MAX ...).
// Each must load or throw asc::Error; what loads is checked (shapes, ranges, every example read).
//
// Runs ASC_FUZZ_SECONDS seconds in all (default 3; the sanitizer build's ctest sets 30), shared between the fuzz
// cases (kShare* below), from seed ASC_FUZZ_SEED (default 1). A mutant depends only on the seed, its iteration and
// the corpus, so a failure reported as "ASC_FUZZ_SEED=S ASC_FUZZ_ITER=I" replays alone (printing the mutations) with
//   ASC_FUZZ_SEED=S ASC_FUZZ_ITER=I ./test_fuzz_loaders -tc='fuzz: mutated safetensors*'
// (each fuzz case's message names its own -tc). ASC_FUZZ_WRITE_CORPUS=1 rewrites the seed files from make_corpus().
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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
#include <optional>
#include <random>
#include <string_view>
#include <typeinfo>

#if defined(ASC_SANITIZE_BUILD)
#include <sanitizer/common_interface_defs.h>
#endif

#include "data/fashion_mnist.h"
#include "data/gzip.h"
#include "data/tasks.h"
#include "data/text.h"
#include "nn/safetensors.h"
#include "optim/optim.h"
#include "testing.h"
#include "train/checkpoint.h"
#if defined(ASC_FUZZ_TRAIN)  // the trainer library is built (CLI11, nlohmann-json): config files too
#include <CLI/CLI.hpp>

#include "train/options.h"
#endif
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
// A new file each time, not the old one truncated: on ext4 that waits for the old blocks' writeback and discard, which
// made a fuzz iteration several times slower.
void write_file(const fs::path& p, const Bytes& b) {
  fs::remove(p);
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

// The shares of ASC_FUZZ_SECONDS each fuzz case runs (the whole binary stays within the budget).
constexpr double kShareSafetensors = 0.35, kShareConfig = 0.15, kShareIdx = 0.1, kShareGzip = 0.1,
                 kShareFileTask = 0.15, kShareGenerated = 0.15;
static_assert(kShareSafetensors + kShareConfig + kShareIdx + kShareGzip + kShareFileTask + kShareGenerated <= 1.0001);
double fuzz_seconds(double share) { return env_seconds("ASC_FUZZ_SECONDS", 3.0) * share; }

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
  const char* ext = ".safetensors";          // of the failure file
  const char* target = "safetensors files";  // the fuzz case
} g_current;

void write_crash_file() {
  if (!g_current.mutant) return;
  std::string p = (fs::temp_directory_path() /
                   fmt::format("asc_fuzz_failure_{}_{}{}", g_current.seed, g_current.iter, g_current.ext))
                      .string();
  if (FILE* f = std::fopen(p.c_str(), "wb")) {
    std::fwrite(g_current.mutant->data(), 1, g_current.mutant->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz: mutant written to %s\n", p.c_str());
  }
}

#if defined(ASC_SANITIZE_BUILD)
void on_sanitizer_death() {
  std::fprintf(stderr,
               "\nfuzz: sanitizer report on a mutant of %s (%s); replay: ASC_FUZZ_SEED=%llu ASC_FUZZ_ITER=%llu\n",
               g_current.seed_file, g_current.target, static_cast<unsigned long long>(g_current.seed),
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
  const double seconds = fuzz_seconds(kShareSafetensors);
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

// ==== config files and the data readers ====================================================================

namespace {

// ---- a format-agnostic mutator -----------------------------------------------------------------------------

// Byte-level mutations for text and binary formats alike: bit flips, bytes set, truncation, junk and the format's
// own tokens inserted, ranges duplicated or deleted, numbers swapped for edge values, a token for another, two lines
// swapped, and (for binary headers) big-endian 32-bit words set to edge values.
class ByteMutator {
 public:
  struct Format {
    std::vector<std::string> tokens;  // the format's own words and punctuation, inserted or swapped for one another
    size_t be32_words = 0;            // leading big-endian 32-bit words set to edge values (IDX: magic and sizes)
  };
  ByteMutator(uint64_t seed, std::string* log, const Format& format) : rng_(seed), log_(log), format_(format) {}
  std::mt19937_64& rng() { return rng_; }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void mutate(Bytes& b) {
    int n = below(8) == 0 ? 4 + static_cast<int>(below(5)) : 1 + static_cast<int>(below(3));
    for (int i = 0; i < n; ++i) mutate_once(b);
  }

  // Numbers on a boundary of some check (int32 / int64 / uint64 / 2^53 / 2^24 edges), malformed ones and words.
  std::string edge_number() {
    static constexpr const char* fixed[] = {"0",
                                            "1",
                                            "-1",
                                            "-0",
                                            "00",
                                            "01",
                                            "+1",
                                            "1.5",
                                            "1e3",
                                            "1e400",
                                            "-1e400",
                                            "1e-320",
                                            "0x10",
                                            "NaN",
                                            "inf",
                                            "2147483647",
                                            "2147483648",
                                            "4294967295",
                                            "4294967296",
                                            "9007199254740993",
                                            "16777215",
                                            "16777216",
                                            "99999",
                                            "100000",
                                            "1000000000",
                                            "1000000001",
                                            "1000000000000",
                                            "4611686018427387904",
                                            "9223372036854775807",
                                            "9223372036854775808",
                                            "-9223372036854775808",
                                            "-9223372036854775809",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "99999999999999999999999"};
    return below(3) == 0 ? std::to_string(below(64)) : fixed[below(std::size(fixed))];
  }

 private:
  template <class... A>
  void note(fmt::format_string<A...> f, A&&... a) {
    if (log_) *log_ += fmt::format(f, std::forward<A>(a)...) + "\n";
  }
  void insert(Bytes& b, size_t at, std::string_view s) {
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), s.begin(), s.end());
  }
  void splice(Bytes& b, size_t at, size_t len, std::string_view s) {
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + len));
    insert(b, at, s);
  }
  std::string junk() {
    static constexpr std::string_view fixed[] = {"\"",       "[",       "]",
                                                 "{",        "}",       "\t",
                                                 "\n",       ",",       "\r\n",
                                                 "\r",       "\\",      " ",
                                                 ":",        "-",       ".",
                                                 "e",        "\"\"",    "\\u",
                                                 "\\\"",     "\\ud800", "\xEF\xBB\xBF",
                                                 "\xC0\x80", "\xFF",    std::string_view("\0", 1),
                                                 "\n\n",     "\t\t",    ",,",
                                                 "\"\n\""};
    switch (below(4)) {
      case 0: {  // random bytes
        std::string s(1 + below(16), '\0');
        for (char& c : s) c = static_cast<char>(rng_());
        return s;
      }
      case 1: {  // a run of digits
        std::string s(1 + below(24), '0');
        for (char& c : s) c = static_cast<char>('0' + below(10));
        return s;
      }
      default: return std::string(fixed[below(std::size(fixed))]);
    }
  }
  // Absolute offsets of every occurrence of `token` in b.
  std::vector<size_t> find_all(const Bytes& b, std::string_view token) const {
    std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
    std::vector<size_t> out;
    if (token.empty()) return out;
    for (size_t at = text.find(token); at != std::string_view::npos; at = text.find(token, at + 1)) out.push_back(at);
    return out;
  }
  // Start of the line holding b[at], and the end of that line (its '\n' or the end).
  std::pair<size_t, size_t> line_of(const Bytes& b, size_t at) const {
    size_t s = at, e = at;
    while (s > 0 && b[s - 1] != '\n') --s;
    while (e < b.size() && b[e] != '\n') ++e;
    return {s, e};
  }

  void mutate_once(Bytes& b) {
    switch (below(13)) {
      case 0: {  // flip one bit
        if (b.empty()) return;
        size_t at = below(b.size());
        int bit = static_cast<int>(below(8));
        b[at] ^= static_cast<uint8_t>(1u << bit);
        note("flip bit {} of byte {}", bit, at);
        return;
      }
      case 1: {  // a byte to 0x00 / 0xFF / printable / random
        if (b.empty()) return;
        size_t at = below(b.size());
        uint64_t k = below(4);
        b[at] = k == 0   ? 0x00
                : k == 1 ? 0xFF
                : k == 2 ? static_cast<uint8_t>(0x20 + below(95))
                         : static_cast<uint8_t>(rng_());
        note("byte {} = {:#04x}", at, b[at]);
        return;
      }
      case 2: {  // truncate
        size_t len = below(b.size() + 1);
        b.resize(len);
        note("truncate to {}", len);
        return;
      }
      case 3:
      case 4: {  // junk inserted
        size_t at = below(b.size() + 1);
        std::string j = junk();
        insert(b, at, j);
        note("insert {} junk bytes at {}", j.size(), at);
        return;
      }
      case 5: {  // duplicate a range somewhere else
        if (b.empty()) return;
        size_t from = below(b.size()), len = 1 + below(std::min<size_t>(64, b.size() - from)), to = below(b.size() + 1);
        Bytes piece(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(from + len));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(to), piece.begin(), piece.end());
        note("copy [{}, {}) to {}", from, from + len, to);
        return;
      }
      case 6: {  // delete a range
        if (b.empty()) return;
        size_t from = below(b.size()), len = 1 + below(std::min<size_t>(32, b.size() - from));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(from + len));
        note("delete [{}, {})", from, from + len);
        return;
      }
      case 7: {  // a number to an edge value
        std::vector<size_t> starts;
        for (size_t i = 0; i < b.size(); ++i)
          if (std::isdigit(b[i]) && (i == 0 || !std::isdigit(b[i - 1]))) starts.push_back(i);
        if (starts.empty()) return;
        size_t at = starts[below(starts.size())], end = at;
        while (end < b.size() && std::isdigit(b[end])) ++end;
        std::string num = edge_number();
        splice(b, at, end - at, num);
        note("number at {} = {}", at, num);
        return;
      }
      case 8: {  // one of the format's tokens replaced by another (or dropped)
        if (format_.tokens.empty()) return;
        const std::string& from = format_.tokens[below(format_.tokens.size())];
        std::vector<size_t> at = find_all(b, from);
        if (at.empty()) return;
        size_t pos = at[below(at.size())];
        std::string to = below(6) == 0 ? std::string() : format_.tokens[below(format_.tokens.size())];
        splice(b, pos, from.size(), to);
        note("token at {} '{}' -> '{}'", pos, from, to);
        return;
      }
      case 9: {  // one of the format's tokens inserted, anywhere or at a line start
        if (format_.tokens.empty()) return;
        size_t at = below(b.size() + 1);
        if (below(2) == 0 && at < b.size()) at = line_of(b, at).first;
        const std::string& t = format_.tokens[below(format_.tokens.size())];
        insert(b, at, t);
        note("insert token '{}' at {}", t, at);
        return;
      }
      case 10: {  // two lines swapped (or one line duplicated)
        if (b.empty()) return;
        auto [s1, e1] = line_of(b, below(b.size()));
        auto [s2, e2] = line_of(b, below(b.size()));
        if (s1 > s2) std::swap(s1, s2), std::swap(e1, e2);
        std::string l1(b.begin() + static_cast<std::ptrdiff_t>(s1), b.begin() + static_cast<std::ptrdiff_t>(e1));
        std::string l2(b.begin() + static_cast<std::ptrdiff_t>(s2), b.begin() + static_cast<std::ptrdiff_t>(e2));
        if (s1 == s2) {
          insert(b, s1, l1 + "\n");
          note("duplicate line at {}", s1);
        } else {
          splice(b, s2, e2 - s2, l1);  // the later one first: the earlier offsets stay valid
          splice(b, s1, e1 - s1, l2);
          note("swap lines at {} and {}", s1, s2);
        }
        return;
      }
      case 11: {  // a leading big-endian word to an edge value (binary headers); else a byte duplicated in place
        if (format_.be32_words == 0 || b.size() < 4) {
          if (b.empty()) return;
          size_t at = below(b.size());
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), b[at]);
          note("double byte {}", at);
          return;
        }
        const uint32_t n = static_cast<uint32_t>(b.size());
        const uint32_t v[] = {0,     1,        2,     3,      4,       8,          16,         0x800,         0x801,
                              0x803, 0x804,    0x8FF, 0xD01,  0x10801, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,    65535,
                              65536, 1u << 24, n,     n - 16, n - 12,  n + 1,      1u << 31,   (1u << 16) + 1};
        size_t word = below(std::min(format_.be32_words, b.size() / 4));
        uint32_t x = v[below(std::size(v))];
        for (int i = 0; i < 4; ++i) b[4 * word + static_cast<size_t>(i)] = static_cast<uint8_t>(x >> (24 - 8 * i));
        note("be32 word {} = {:#x}", word, x);
        return;
      }
      case 12: {  // junk appended
        std::string j = junk();
        insert(b, b.size(), j);
        note("append {} junk bytes", j.size());
        return;
      }
    }
  }

  std::mt19937_64 rng_;
  std::string* log_;
  const Format& format_;
};

// ---- the harness shared by the fuzz cases below ------------------------------------------------------------

Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// gzip of `data` (one member; zlib's deflate). `name` / `comment` / `extra` set the optional header fields (then the
// header has its CRC-16 too); level 0 stores the data.
Bytes gzip_bytes(const Bytes& data, int level = Z_DEFAULT_COMPRESSION, const char* name = nullptr,
                 const char* comment = nullptr, const char* extra = nullptr) {
  z_stream s{};
  REQUIRE(deflateInit2(&s, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  gz_header h{};
  std::string nm = name ? name : "", cm = comment ? comment : "", ex = extra ? extra : "";
  if (name || comment || extra) {
    h.name = name ? reinterpret_cast<Bytef*>(nm.data()) : Z_NULL;
    h.comment = comment ? reinterpret_cast<Bytef*>(cm.data()) : Z_NULL;
    h.extra = extra ? reinterpret_cast<Bytef*>(ex.data()) : Z_NULL;
    h.extra_len = static_cast<uInt>(ex.size());
    h.hcrc = 1;
    h.os = 3;
    REQUIRE(deflateSetHeader(&s, &h) == Z_OK);
  }
  Bytes out(deflateBound(&s, static_cast<uLong>(data.size())) + 64 + nm.size() + cm.size() + ex.size());
  s.next_in = const_cast<Bytef*>(data.data());
  s.avail_in = static_cast<uInt>(data.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&s, Z_FINISH) == Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

// What gzopen / gzwrite make of `data` (as tests/test_data_files.cpp writes its gzip files).
void write_gz(const fs::path& p, const Bytes& data) {
  fs::remove(p);  // as write_file
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!data.empty())
    REQUIRE(gzwrite(f, data.data(), static_cast<unsigned>(data.size())) == static_cast<int>(data.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// A scratch directory of this process, removed with it.
struct Scratch {
  fs::path dir;
  explicit Scratch(const char* what) {
    dir = fs::temp_directory_path() / fmt::format("asc_fuzz_{}_{}", what, ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path operator/(const std::string& name) const { return dir / name; }
};

long max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// One fuzz case's loop: ASC_FUZZ_SECONDS x `share` seconds of iterations (one, ASC_FUZZ_ITER, in a replay). `body`
// gets each iteration's mutator seed and, in a replay, the log its mutations are noted in; it sets g_current's
// mutant and calls replay_note once the mutant is made. `salt` keeps the cases' streams apart.
struct LoopInfo {
  uint64_t seed = 0;
  std::string* log = nullptr;  // non-null in a replay
};
template <class Body>
void fuzz_loop(const char* what, const char* tc, uint64_t salt, double share, Body&& body) {
  const uint64_t seed = env_u64("ASC_FUZZ_SEED", 1);
  const double seconds = fuzz_seconds(share);
  const char* replay = env_or_null("ASC_FUZZ_ITER");
#if defined(ASC_SANITIZE_BUILD)
  __sanitizer_set_death_callback(on_sanitizer_death);
#endif
  MESSAGE("ASC_FUZZ_SEED=" << seed << (replay ? " ASC_FUZZ_ITER=" + std::string(replay) : std::string()) << " "
                           << std::string(what));
  uint64_t iter = replay ? env_u64("ASC_FUZZ_ITER", 0) : 0, done = 0;
  const long rss0 = max_rss_mib();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  do {
    std::string log;
    g_current = {seed, iter, what, nullptr, ".bin", what};
    INFO(std::string(what) << ": replay with ASC_FUZZ_SEED=" << seed << " ASC_FUZZ_ITER=" << iter
                           << " ./test_fuzz_loaders -tc='" << std::string(tc) << "'");
    body(LoopInfo{splitmix64(seed ^ splitmix64(iter ^ salt)), replay ? &log : nullptr});
    ++iter, ++done;
  } while (!replay && std::chrono::steady_clock::now() < deadline);
  g_current = {};
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(fmt::format("{}: {} iterations in {:.2f} s ({:.0f} per second); peak RSS {} -> {} MiB", what, done, elapsed,
                      static_cast<double>(done) / std::max(elapsed, 1e-9), rss0, max_rss_mib()));
}

void replay_note(const LoopInfo& li, const std::string& what) {
  if (li.log) MESSAGE(what << ":\n" << *li.log);
}

// Runs fn, which must return or throw asc::Error (loads() above), and fails when it ran longer than `limit` s.
template <class F>
bool loads_in(const char* api, double limit, F&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = loads(api, std::forward<F>(fn));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FUZZ_EXPECT(s < limit, api << " took " << s << " s (more than " << limit << " s)");
  return ok;
}

#if defined(ASC_SANITIZE_BUILD)
constexpr double kSlow = 20;  // seconds one call may take before it counts as a hang
#else
constexpr double kSlow = 5;
#endif

}  // namespace

// ---- config files ------------------------------------------------------------------------------------------

#if defined(ASC_FUZZ_TRAIN)
namespace {

struct TextSeed {
  std::string name, text;
};

std::vector<TextSeed> config_seeds() {
  return {
      {"default.json", train::config_json(train::Config{}, {{"git_commit", "0123abc"}, {"command", "train --x 1"}})},
      {"lists.json", R"({
  "task": "grouping", "heads": 2, "d_model": 32, "k": [4, 8],
  "tau_sep": [0.5, 2.0], "tau_coh": 1, "alpha_align": [1e-1, 1E+1],
  "asam_patterns": ["window", "random"], "mlp_hidden": [64, 32], "dump_decomposition": [],
  "use_sep": false, "norm_first": true, "robustness": false,
  "seed": 18446744073709551615, "data_seed": 0, "lr": 3e-4, "dropout": 0.0,
  "out": "runs/fuzz \"quoted\" \\ tab\t \u00e9 \ud83d\ude00", "data_dir": "",
  "max_len": 64, "min_len": 64
})"},
      {"nested.json",
       R"({"git_commit": {"a": [1, [2, [3, {"b": null}]], "x\"y"], "c": {}}, "command": ["train", {"d": [[[[]]]]}],)"
       R"( "model": "firing", "rule": "B", "firing_hidden": 16, "fan_out": 2, "eta_w": -1, "w_min": -2, "w_max": 2,)"
       R"( "optimizer": "sgd", "schedule": "constant", "tf32": true, "on_nonfinite": "skip", "task": "file:a,b.tsv"})"},
      {"strings.json",
       R"({"out": "--help", "data_dir": "'d' \"q\" ,a", "task": "file:-h", "progress": "none", "dtype": "bfloat16"})"},
  };
}

ByteMutator::Format config_format(const std::vector<TextSeed>& seeds) {
  ByteMutator::Format f;
  // every quoted string of the seeds (the option names, the choices), and JSON's words
  for (const TextSeed& s : seeds)
    for (size_t at = s.text.find('"'); at != std::string::npos;) {
      size_t end = s.text.find('"', at + 1);
      if (end == std::string::npos) break;
      if (end - at < 40) f.tokens.push_back(s.text.substr(at, end - at + 1));
      at = s.text.find('"', end + 1);
    }
  std::sort(f.tokens.begin(), f.tokens.end());
  f.tokens.erase(std::unique(f.tokens.begin(), f.tokens.end()), f.tokens.end());
  for (const char* t : {"true",
                        "false",
                        "null",
                        "[]",
                        "{}",
                        "[1, 2]",
                        "[[1]]",
                        "{\"a\": 1}",
                        "\"\"",
                        "1e400",
                        "-1",
                        "0.5",
                        "\"file:x.tsv\"",
                        "\"\\u0000\"",
                        "\"\\ud800\"",
                        "\"a,b\"",
                        "\"--help\"",
                        "\"-h\"",
                        "\"'x'\"",
                        "\"\\\"x\\\"\"",
                        "\"file:\"",
                        ",",
                        ":",
                        "[",
                        "]",
                        "{",
                        "}"})
    f.tokens.push_back(t);
  return f;
}

// The config a loaded file holds, as text (Config has no ==).
std::string config_text(const train::Config& c) { return train::config_json(c); }

// One config text through every reader; true when it loaded. `tmp` is this process's scratch file.
bool run_config_mutant(const std::string& text, const fs::path& tmp) {
  // 1. In memory: args_from_json, then the flags' parser (CLI::ParseError is how it refuses, as parse_file wraps it).
  train::Config cm;
  bool ok_mem = false;
  {
    CLI::App app;
    train::OptionTable table(app, cm);
    std::vector<std::string> args;
    if (loads_in("OptionTable::args_from_json", kSlow, [&] { args = table.args_from_json(text); })) {
      std::reverse(args.begin(), args.end());
      try {
        app.parse(args);
        ok_mem = true;
      } catch (const CLI::ParseError&) {
      } catch (const std::exception& e) {
        write_crash_file();
        FAIL("CLI::App::parse of args_from_json's arguments threw " << typeid(e).name() << ": " << e.what());
      }
    }
  }
  // 2. The file readers: parse_file and read_config agree with each other and with the above.
  write_file(tmp, to_bytes(text));
  train::Config cf, cr;
  bool ok_file = false;
  {
    CLI::App app;
    train::OptionTable table(app, cf);
    ok_file = loads_in("OptionTable::parse_file", kSlow, [&] { table.parse_file(tmp.string()); });
  }
  const bool ok_read = loads_in("read_config", kSlow, [&] { cr = train::read_config(tmp.string()); });
  FUZZ_EXPECT(ok_file == ok_read && ok_file == ok_mem, "parse_file " << ok_file << ", read_config " << ok_read
                                                                     << " and args_from_json + parse " << ok_mem
                                                                     << " disagree (1: loaded)");
  if (!ok_read) return false;
  const std::string t = config_text(cr);
  FUZZ_EXPECT(t == config_text(cf) && t == config_text(cm), "the readers loaded different configs");
  // 3. What loads is validated (or refused with asc::Error) and reads back from the file a run would write.
  loads_in("validate_config", kSlow, [&] { train::validate_config(cr); });
  write_file(tmp, to_bytes(t));
  train::Config back;
  const bool ok_back = loads("read_config of config_json", [&] { back = train::read_config(tmp.string()); });
  FUZZ_EXPECT(ok_back, "config_json of a loaded config does not read back");
  FUZZ_EXPECT(config_text(back) == t, "config_json -> read_config changed the config:\n"
                                          << t << "\nread back as\n"
                                          << config_text(back));
  return true;
}

}  // namespace

TEST_CASE("fuzz corpus: the config seeds load and validate") {
  Scratch dir("config_corpus");
  for (const TextSeed& s : config_seeds()) {
    CAPTURE(s.name);
    write_file(dir / s.name, to_bytes(s.text));
    train::Config c = train::read_config((dir / s.name).string());
    train::validate_config(c);
    CHECK(run_config_mutant(s.text, dir / "tmp.json"));
  }
}

TEST_CASE("fuzz regressions: deep JSON, a directory, a FIFO and a missing file are refused as config files") {
  Scratch dir("config_regress");
  train::Config c;
  CLI::App app;
  train::OptionTable table(app, c);
  // 100000 levels: refused before nlohmann's parser sees it (no recursion that deep anywhere).
  for (const std::string& deep : {std::string(100000, '[') + std::string(100000, ']'),
                                  [] {
                                    std::string s;
                                    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
                                    return s + "1" + std::string(100000, '}');
                                  }(),
                                  "{\"git_commit\":" + std::string(100000, '[') + std::string(100000, ']') + "}"}) {
    check_error([&] { table.args_from_json(deep); }, {"nested deeper than"});
    write_file(dir / "deep.json", to_bytes(deep));
    check_error([&] { train::read_config((dir / "deep.json").string()); }, {"read_config", "nested deeper than"});
  }
  // Closers first take the count below zero, so that the openers after them pass the bound: the parser refuses the
  // first ']' before it reaches them.
  check_error([&] { table.args_from_json(std::string(100000, ']') + std::string(100000, '[')); }, {"not valid JSON"});
  // The bound: 32 levels are a config file (the options object and 31 arrays in a provenance key), 33 are not.
  CHECK_NOTHROW(table.args_from_json("{\"git_commit\":" + std::string(31, '[') + std::string(31, ']') + "}"));
  check_error([&] { table.args_from_json("{\"git_commit\":" + std::string(32, '[') + std::string(32, ']') + "}"); },
              {"nested deeper than 32"});
  // Not a regular file.
  check_error([&] { train::read_config(dir.dir.string()); }, {"read_config", "a directory"});
  check_error([&] { table.parse_file(dir.dir.string()); }, {"a directory"});
  check_error([&] { train::read_config((dir / "missing.json").string()); }, {"read_config", "no such file"});
  const fs::path fifo = dir / "fifo.json";
  if (::mkfifo(fifo.c_str(), 0600) == 0)  // opening it to read would block: refused before that
    check_error([&] { train::read_config(fifo.string()); }, {"read_config", "not a regular file"});
}

TEST_CASE("fuzz: mutated config files load or throw asc::Error") {
  const std::vector<TextSeed> seeds = config_seeds();
  const ByteMutator::Format format = config_format(seeds);
  Scratch dir("config");
  uint64_t loaded = 0;
  fuzz_loop("config files", "fuzz: mutated config*", 0xC0F1, kShareConfig, [&](const LoopInfo& li) {
    ByteMutator mut(li.seed, li.log, format);
    const TextSeed& s = seeds[mut.below(seeds.size())];
    Bytes m = to_bytes(s.text);
    mut.mutate(m);
    g_current.seed_file = s.name.c_str(), g_current.mutant = &m, g_current.ext = ".json";
    replay_note(li, "mutant of " + s.name + ":\n" + to_string(m));
    loaded += run_config_mutant(to_string(m), dir / "config.json");
  });
  MESSAGE(loaded << " config mutants loaded");
}
#endif  // ASC_FUZZ_TRAIN

// ---- data readers: IDX, gzip, TSV / CSV files, generated tasks ---------------------------------------------

namespace {

struct BinSeed {
  std::string name;
  Bytes plain, gz;             // the file's bytes, and their gzip
  std::vector<size_t> ends{};  // gzip seeds: where each member of gz ends
};

Bytes idx_file(const std::vector<uint32_t>& dims, uint8_t first) {
  Bytes b;
  auto be = [&](uint32_t v) {
    for (int i = 3; i >= 0; --i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  be(0x800u | static_cast<uint32_t>(dims.size()));
  size_t n = 1;
  for (uint32_t d : dims) be(d), n *= d;
  for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(first + 37 * i));
  return b;
}

std::vector<BinSeed> idx_seeds() {
  std::vector<BinSeed> s = {{"labels-idx1", idx_file({5}, 1), {}},
                            {"images-idx3", idx_file({2, 3, 4}, 200), {}},
                            {"one-idx2", idx_file({1, 1}, 0), {}}};
  for (BinSeed& b : s) b.gz = gzip_bytes(b.plain);
  return s;
}

// What a well-formed IDX file of bytes `b` holds (data/fashion_mnist.h's format, kMaxIdxBytes' bound), else nothing.
std::optional<data::IdxArray> idx_reference(const Bytes& b) {
  auto be32 = [&](size_t at) {
    return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | uint32_t{b[at + 3]};
  };
  if (b.size() < 4) return std::nullopt;
  const uint32_t magic = be32(0);
  if ((magic >> 16) != 0 || ((magic >> 8) & 0xFF) != 0x08 || (magic & 0xFF) == 0) return std::nullopt;
  const size_t nd = magic & 0xFF, head = 4 + 4 * nd;
  if (b.size() < head) return std::nullopt;
  data::IdxArray out;
  int64_t total = 1;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t size = be32(4 + 4 * d);
    if (size == 0 || total > data::kMaxIdxBytes / size) return std::nullopt;
    total *= size;
    out.dims.push_back(size);
  }
  if (static_cast<int64_t>(b.size() - head) != total) return std::nullopt;
  out.data.assign(b.begin() + static_cast<std::ptrdiff_t>(head), b.end());
  return out;
}

ByteMutator::Format gzip_format() {
  ByteMutator::Format f;
  f.tokens = {"\x1f\x8b",
              "\x1f\x8b\x08",
              std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10),
              std::string("\x03\x00", 2),
              std::string("\x00\x00\x00\x00", 4),
              "\xff\xff\xff\xff"};
  return f;
}

// gzip seeds: one member, two members, an empty member, one with every optional header field, a stored one.
std::vector<BinSeed> gzip_seeds() {
  std::string text;
  for (int i = 0; i < 12; ++i) text += fmt::format("{}\tline {} of the seed, {}\n", i % 3, i, std::string(i, 'x'));
  const Bytes t = to_bytes(text), a(t.begin(), t.begin() + 100), b(t.begin() + 100, t.end());
  Bytes two = gzip_bytes(a), second = gzip_bytes(b);
  two.insert(two.end(), second.begin(), second.end());
  Bytes bin(64);
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i * 151 + 7);
  std::vector<BinSeed> s = {{"one-member", t, gzip_bytes(t)},
                            {"two-members", t, two, {two.size() - second.size()}},
                            {"empty", {}, gzip_bytes({})},
                            {"header-fields", bin, gzip_bytes(bin, 6, "name.idx", "a comment", "XYextra")},
                            {"stored", a, gzip_bytes(a, 0)}};
  for (BinSeed& b : s) b.ends.push_back(b.gz.size());
  return s;
}

// A Task that loaded: its fields and its examples agree with each other and with the options. `all`: every example
// (at most `cap` of a split), else the first and the last of each split.
void check_task(const data::Task& t, const data::TaskOptions& o, bool all, int64_t cap) {
  FUZZ_EXPECT(t.train && t.val && t.test, "task '" << t.name << "' lacks a split");
  FUZZ_EXPECT(t.classes >= 1 && t.vocab >= 1 && t.max_len >= 1, "task '" << t.name << "' has classes " << t.classes
                                                                         << ", vocab " << t.vocab << ", max_len "
                                                                         << t.max_len);
  FUZZ_EXPECT(t.class_names.empty() || static_cast<int64_t>(t.class_names.size()) == t.classes,
              t.class_names.size() << " class names for " << t.classes << " classes");
  const bool listops = t.name == "listops", file = t.name.starts_with("file:");
  const std::pair<const data::Dataset*, int64_t> splits[] = {
      {t.train.get(), o.train_size}, {t.val.get(), o.val_size}, {t.test.get(), o.test_size}};
  for (const auto& [ds, want] : splits) {
    const int64_t n = ds->size();
    FUZZ_EXPECT(n >= 1 && (want == 0 || n == want), "a split of " << n << " examples (asked " << want << ")");
    std::vector<int64_t> idx;
    if (all)
      for (int64_t i = 0; i < std::min(n, cap); ++i) idx.push_back(i);
    else
      idx = {0, n - 1};
    for (int64_t i : idx) {
      data::Example ex;
      const bool ok = loads("Dataset::get", [&] { ex = ds->get(i); });
      FUZZ_EXPECT(ok, "example " << i << " of a split of " << n << " does not load");
      FUZZ_EXPECT(ex.input.defined() && ex.input.dtype() == kInt64 && ex.input.dim() == 1,
                  "example " << i << " is not a (T) int64 sequence");
      const int64_t T = ex.input.numel();
      FUZZ_EXPECT(
          T >= 1 && T <= t.max_len && (o.max_len == 0 || T <= o.max_len),
          "example " << i << " has " << T << " tokens (task max_len " << t.max_len << ", options " << o.max_len << ")");
      if (listops || file) FUZZ_EXPECT(T >= o.min_len, "example " << i << " has " << T << " < min_len tokens");
      FUZZ_EXPECT(ex.label >= 0 && ex.label < t.classes, "label " << ex.label << " of " << t.classes << " classes");
      for (int64_t v : ex.input.to_vector<int64_t>())
        FUZZ_EXPECT(v >= 0 && v < t.vocab, "token " << v << " outside the vocabulary of " << t.vocab);
      if (ex.groups.defined()) {
        FUZZ_EXPECT(ex.groups.numel() == T, "groups for " << ex.groups.numel() << " of " << T << " tokens");
        for (int64_t g : ex.groups.to_vector<int64_t>())
          FUZZ_EXPECT(g >= 0 && g < t.classes, "group " << g << " of " << t.classes);
      }
    }
  }
}

// File task seeds: TSV text, TSV with class ids, CSV with quotes (a quoted comma, "" and a text across lines), token
// ids with a header (TSV and CSV).
struct FileSeed {
  std::string name, text, ext;
};
std::vector<FileSeed> file_seeds() {
  return {{"text.tsv",
           "label\ttext\npos\tA fine, quiet film.\nneg\tdull\tand long\n\npos\t  spaced  \r\nneg\tno\nmid\tso-so\n"
           "pos\t\"quoted\" in a tsv\nneg\tbad\n",
           ".tsv"},
          {"ids-labels.tsv", "0\thello\n1\tworld\n2\tfoo bar\n0\tbaz\n1\tqux\n2\tquux\n", ".tsv"},
          {"quoted.csv",
           "label,text\n\"pos\",\"hello, \"\"world\"\"\"\nneg,plain text, with a comma\n\"mid\",\"two\nlines\"\n"
           "pos,ok\nneg,\"x\"  \r\n\"a,b\",c\n",
           ".csv"},
          {"tokens.tsv", "label\tids\n0\t1 2 3\n1\t4 5\n2\t 7 8 9 10 \n0\t0\n1\t16777215\n2\t3 3 3\n", ".tsv"},
          {"tokens.csv", "\xEF\xBB\xBFlabel,ids\n3,10 20\n1,5\n3,7\t7\n0,1 2 3 4\n1,9\n", ".csv"}};
}

ByteMutator::Format file_format() {
  ByteMutator::Format f;
  f.tokens = {"label",  "text",     "ids",      "Label", "TEXT", "\t",    ",",           "\"",
              "\"\"",   "\n",       "\r\n",     " ",     "-1",   "0",     "1",           "99999",
              "100000", "16777215", "16777216", "pos",   "neg",  "train", "\xEF\xBB\xBF"};
  return f;
}

// Options drawn for a file task: the defaults mostly, else small values, with a hostile one now and then.
data::TaskOptions file_options(ByteMutator& mut) {
  data::TaskOptions o;
  if (mut.below(3) != 0) return o;
  static constexpr int64_t lens[] = {0, 0, 0, 1, 2, 3, 5, 8, 100, -1, INT64_MAX, INT64_MIN};
  static constexpr int64_t sizes[] = {0, 0, 0, 1, 2, 3, 4, 100, -1, INT64_MAX, INT64_MIN};
  o.seed = mut.below(2) ? mut.below(4) : mut.rng()();
  o.min_len = lens[mut.below(std::size(lens))], o.max_len = lens[mut.below(std::size(lens))];
  o.train_size = sizes[mut.below(std::size(sizes))], o.val_size = sizes[mut.below(std::size(sizes))];
  o.test_size = sizes[mut.below(std::size(sizes))];
  if (mut.below(16) == 0) o.data_dir = "/tmp";
  if (mut.below(16) == 0) o.image_size = 2;
  return o;
}

std::string show_options(const data::TaskOptions& o) {
  return fmt::format(
      "{{.seed = {}, .train_size = {}, .val_size = {}, .test_size = {}, .min_len = {}, .max_len = {}, "
      ".data_dir = \"{}\", .image_size = {}}}",
      o.seed, o.train_size, o.val_size, o.test_size, o.min_len, o.max_len, o.data_dir, o.image_size);
}

}  // namespace

TEST_CASE("fuzz corpus: the data seeds load") {
  Scratch dir("data_corpus");
  for (const BinSeed& s : idx_seeds()) {
    CAPTURE(s.name);
    write_file(dir / "a.idx", s.plain);
    write_file(dir / "a.idx.gz", s.gz);
    for (const char* f : {"a.idx", "a.idx.gz"}) {
      data::IdxArray a = data::read_idx((dir / f).string());
      CHECK(a.data == idx_reference(s.plain)->data);
      CHECK(a.dims == idx_reference(s.plain)->dims);
    }
  }
  for (const BinSeed& s : gzip_seeds()) {
    CAPTURE(s.name);
    write_file(dir / "a.gz", s.gz);
    CHECK(data::read_file_maybe_gzip((dir / "a.gz").string()) == to_string(s.plain));
    CHECK(data::CompressedReader((dir / "a.gz").string(), "fuzz").compressed());
  }
  for (const FileSeed& s : file_seeds()) {
    CAPTURE(s.name);
    write_file(dir / ("f" + s.ext), to_bytes(s.text));
    data::Task t = data::make_task("file:" + (dir / ("f" + s.ext)).string());
    check_task(t, {}, true, 100);
    CHECK(t.train->size() + t.val->size() + t.test->size() >= 5);
  }
}

TEST_CASE("fuzz regressions: an IDX header promising GiBs from a small file allocates little") {
  // [65536, 65535]: 4 GiB - 64 KiB, under kMaxIdxBytes (4 GiB), from a 10-byte payload: read_idx reads the payload in
  // 64 MiB chunks, so it stops at the file's end after one chunk instead of allocating what the header promises.
  static_assert(data::kMaxIdxBytes == int64_t{1} << 32);
  Scratch dir("idx_regress");
  Bytes b = idx_file({1}, 0);
  b[3] = 0x02;  // two dimensions
  b.resize(4);
  for (uint32_t d : {65536u, 65535u})
    for (int i = 3; i >= 0; --i) b.push_back(static_cast<uint8_t>(d >> (8 * i)));
  b.insert(b.end(), 10, 7);
  write_file(dir / "big.idx", b);
  write_gz(dir / "big.idx.gz", b);
  const long before = max_rss_mib();
  for (const char* f : {"big.idx", "big.idx.gz"})
    check_error([&] { data::read_idx((dir / f).string()); }, {"truncated", "[65536, 65535]", "4294901760", "holds 10"});
  CHECK(max_rss_mib() - before < 1024);
  // One byte more than the limit is refused before anything is read: [65536, 65537].
  b[8] = 0x00, b[9] = 0x01, b[10] = 0x00, b[11] = 0x01;
  write_file(dir / "over.idx", b);
  check_error([&] { data::read_idx((dir / "over.idx").string()); }, {"past the 4294967296 byte limit"});
}

TEST_CASE("fuzz: mutated IDX files (plain and gzip) load or throw asc::Error") {
  const std::vector<BinSeed> seeds = idx_seeds();
  ByteMutator::Format plain_format, gz_format = gzip_format();
  plain_format.be32_words = 4;  // the magic and up to three sizes
  Scratch dir("idx");
  const fs::path tmp = dir / "m.idx";
  uint64_t loaded = 0, modes[3] = {};
  fuzz_loop("IDX files", "fuzz: mutated IDX*", 0x1D8, kShareIdx, [&](const LoopInfo& li) {
    ByteMutator pick(li.seed, nullptr, plain_format);
    const BinSeed& s = seeds[pick.below(seeds.size())];
    const uint64_t mode = pick.below(3);  // 0: plain mutant, 1: gzip of a mutant, 2: mutant of the gzip
    ++modes[mode];
    ByteMutator mut(pick.rng()(), li.log, mode == 2 ? gz_format : plain_format);
    Bytes plain = mode == 2 ? Bytes() : s.plain, file;
    if (mode == 2) {
      file = s.gz;
      mut.mutate(file);
      write_file(tmp, file);
    } else {
      mut.mutate(plain);
      if (mode == 0)
        write_file(tmp, plain), file = plain;
      else
        write_gz(tmp, plain), file = read_file(tmp);
    }
    g_current.seed_file = s.name.c_str(), g_current.mutant = &file, g_current.ext = mode == 0 ? ".idx" : ".idx.gz";
    replay_note(li, fmt::format("mode {} mutant of {} ({} bytes)", mode, s.name, file.size()));
    data::IdxArray a;
    const bool ok = loads_in("read_idx", kSlow, [&] { a = data::read_idx(tmp.string()); });
    if (ok) {
      int64_t prod = 1;
      for (int64_t d : a.dims) {
        FUZZ_EXPECT(d > 0, "a dimension of " << d);
        prod *= d;
      }
      FUZZ_EXPECT(!a.dims.empty() && prod == static_cast<int64_t>(a.data.size()),
                  "dims of " << prod << " bytes, data of " << a.data.size());
      ++loaded;
    }
    // A plain file (or the gzip of one) loads exactly when it is well-formed, and then as the reference reads it.
    // (A plain mutant that starts with gzip's magic is read as gzip: not compared.)
    if (mode != 2 && !(mode == 0 && plain.size() >= 2 && plain[0] == 0x1f && plain[1] == 0x8b)) {
      const auto ref = idx_reference(plain);
      FUZZ_EXPECT(ok == ref.has_value(), "read_idx " << (ok ? "loaded" : "refused") << " a file the reference "
                                                     << (ref ? "loads" : "refuses"));
      if (ok) FUZZ_EXPECT(a.dims == ref->dims && a.data == ref->data, "read_idx and the reference disagree");
    }
  });
  MESSAGE(loaded << " IDX mutants loaded; plain / gzip of mutant / mutant of gzip: " << modes[0] << " / " << modes[1]
                 << " / " << modes[2]);
}

TEST_CASE("fuzz: mutated gzip files load or throw asc::Error; cut streams and trailing bytes throw") {
  const std::vector<BinSeed> seeds = gzip_seeds();
  const ByteMutator::Format format = gzip_format();
  Scratch dir("gzip");
  const fs::path tmp = dir / "m.gz";
  uint64_t loaded = 0, must_throw = 0;
  fuzz_loop("gzip files", "fuzz: mutated gzip*", 0x6219, kShareGzip, [&](const LoopInfo& li) {
    ByteMutator mut(li.seed, li.log, format);
    const BinSeed& s = seeds[mut.below(seeds.size())];
    Bytes m = s.gz;
    const uint64_t mode = mut.below(8);
    std::string what;
    // A cut inside a member (1 .. size - 1 bytes, and not where a member ends).
    auto cut = [&](const BinSeed& b) {
      size_t k = 1 + mut.below(b.gz.size() - 1);
      if (std::find(b.ends.begin(), b.ends.end(), k) != b.ends.end()) --k;
      return k;
    };
    if (mode == 0) {  // the stream cut short
      const size_t k = cut(s);
      m.resize(k);
      what = fmt::format("cut to {} of {} bytes", k, s.gz.size());
    } else if (mode == 1) {  // a whole stream, then another cut short
      const BinSeed& o = seeds[mut.below(seeds.size())];
      const size_t k = cut(o);
      m.insert(m.end(), o.gz.begin(), o.gz.begin() + static_cast<std::ptrdiff_t>(k));
      what = fmt::format("then {} of the {} bytes of {}", k, o.gz.size(), o.name);
    } else if (mode == 2) {  // trailing bytes that cannot start a member
      const size_t k = 1 + mut.below(16);
      for (size_t i = 0; i < k; ++i) m.push_back(static_cast<uint8_t>(mut.rng()()));
      if (m[s.gz.size()] == 0x1f) m[s.gz.size()] = 0x20;
      what = fmt::format("then {} bytes of junk", k);
    } else {
      mut.mutate(m);
      what = "mutated";
    }
    const bool throws = mode <= 2;
    must_throw += throws;
    write_file(tmp, m);
    g_current.seed_file = s.name.c_str(), g_current.mutant = &m, g_current.ext = ".gz";
    replay_note(li, fmt::format("{} {} ({} bytes)", s.name, what, m.size()));

    std::string whole, chunked;
    const bool ok = loads_in("read_file_maybe_gzip", kSlow, [&] { whole = data::read_file_maybe_gzip(tmp.string()); });
    // The reader in chunks of a random size: fewer bytes than asked only at the end, and nothing after that.
    const size_t chunk = std::vector<size_t>{1, 2, 3, 7, 64, 100, 4096}[mut.below(7)];
    size_t over = 0, after_end = 0;
    const bool ok_chunks = loads_in("CompressedReader::read", kSlow, [&] {
      data::CompressedReader r(tmp.string(), "fuzz");
      Bytes buf(chunk);
      for (;;) {
        const size_t got = r.read(buf.data(), chunk);
        if (got > chunk) over = got;
        chunked.append(reinterpret_cast<const char*>(buf.data()), std::min(got, chunk));
        if (got < chunk) break;
      }
      after_end = r.read(buf.data(), chunk);
    });
    FUZZ_EXPECT(over == 0, "read " << over << " bytes into " << chunk);
    FUZZ_EXPECT(after_end == 0, after_end << " bytes read after a short read");
    FUZZ_EXPECT(ok == ok_chunks, "read_file_maybe_gzip " << (ok ? "loaded" : "refused") << " what CompressedReader "
                                                         << "in chunks of " << chunk << " "
                                                         << (ok_chunks ? "loaded" : "refused"));
    if (ok) FUZZ_EXPECT(whole == chunked, "read_file_maybe_gzip and CompressedReader read different data");
    if (throws) FUZZ_EXPECT(!ok, "a gzip file " << what << " loaded (" << whole.size() << " bytes)");
    if (m == s.gz) FUZZ_EXPECT(ok && whole == to_string(s.plain), "an unchanged seed read wrong");
    loaded += ok;
  });
  MESSAGE(loaded << " gzip mutants loaded; " << must_throw << " cut / followed by junk, all refused");
}

TEST_CASE("fuzz: mutated TSV / CSV / token-id files load as file tasks or throw asc::Error") {
  const std::vector<FileSeed> seeds = file_seeds();
  const ByteMutator::Format format = file_format();
  Scratch dir("file_task");
  uint64_t loaded = 0, with_sibling = 0;
  fuzz_loop("file tasks", "fuzz: mutated TSV*", 0xF11E, kShareFileTask, [&](const LoopInfo& li) {
    ByteMutator mut(li.seed, li.log, format);
    const FileSeed& s = seeds[mut.below(seeds.size())];
    static const std::string exts[] = {".tsv", ".csv", ".txt", "", ".tsv.gz", ".csv.gz"};
    const std::string ext = mut.below(4) == 0 ? exts[mut.below(std::size(exts))] : s.ext;
    const bool sibling = mut.below(4) == 0;  // fz_train + fz_val beside it
    Bytes m = to_bytes(s.text);
    mut.mutate(m);
    Bytes val = to_bytes(s.text);
    if (sibling && mut.below(2)) mut.mutate(val);
    const data::TaskOptions o = file_options(mut);
    std::vector<fs::path> old;
    for (const auto& e : fs::directory_iterator(dir.dir)) old.push_back(e.path());
    for (const fs::path& p : old) fs::remove(p);
    const fs::path main = dir / ((sibling ? "fz_train" : "fz") + ext);
    auto put = [&](const fs::path& p, const Bytes& b) { ext.ends_with(".gz") ? write_gz(p, b) : write_file(p, b); };
    put(main, m);
    if (sibling) put(dir / ("fz_val" + ext), val), ++with_sibling;
    g_current.seed_file = s.name.c_str(), g_current.mutant = &m, g_current.ext = ".txt";
    replay_note(li, fmt::format("mutant of {} as {}{}, options {}:\n{}", s.name, main.filename().string(),
                                sibling ? " (and fz_val)" : "", show_options(o), to_string(m)));
    data::Task t;
    if (loads_in("make_task(file:)", kSlow, [&] { t = data::make_task("file:" + main.string(), o); })) {
      check_task(t, o, true, 200);
      ++loaded;
    }
  });
  MESSAGE(loaded << " file-task mutants loaded; " << with_sibling << " with a val file beside them");
}

TEST_CASE("fuzz: generated tasks with hostile options build or throw asc::Error") {
  static constexpr int64_t sizes[] = {
      0, 0, 1, 2, 7, -1, INT64_MIN, INT64_MAX, int64_t{1} << 62, -(int64_t{1} << 62), 1'000'000'000, int64_t{1} << 31};
  static constexpr int64_t lens[] = {0,
                                     0,
                                     0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     16,
                                     64,
                                     100,
                                     500,
                                     1024,
                                     2000,
                                     4096,
                                     1 << 24,
                                     (1 << 24) + 1,
                                     -1,
                                     INT64_MIN,
                                     INT64_MAX,
                                     int64_t{1} << 62,
                                     int64_t{1} << 31};
  static constexpr int64_t images[] = {0,  0, 0, 1,  2,  4,         8,         16,
                                       32, 3, 7, 64, -1, INT64_MIN, INT64_MAX, int64_t{1} << 62};
  static const std::string names[] = {"listops", "pathfinder", "grouping"};
  const ByteMutator::Format none;
  uint64_t built = 0, fetched = 0, per_name[3] = {};
  fuzz_loop("generated tasks", "fuzz: generated*", 0x6E2, kShareGenerated, [&](const LoopInfo& li) {
    ByteMutator mut(li.seed, nullptr, none);
    const size_t which = mut.below(3);
    const std::string& name = names[which];
    data::TaskOptions o;
    const uint64_t seeds[] = {0, 1, UINT64_MAX, mut.rng()()};
    o.seed = seeds[mut.below(4)];
    // Each option hostile a quarter of the time: the others then mostly stay at their defaults.
    auto draw = [&](const auto& pool) { return mut.below(4) == 0 ? pool[mut.below(std::size(pool))] : pool[0]; };
    o.train_size = draw(sizes), o.val_size = draw(sizes), o.test_size = draw(sizes);
    o.min_len = draw(lens), o.max_len = draw(lens), o.image_size = draw(images);
    if (mut.below(32) == 0) o.data_dir = "/nonexistent";
    replay_note(li, fmt::format("make_task(\"{}\", {})", name, show_options(o)));
    INFO("make_task(\"" << name << "\", " << show_options(o) << ")");
    data::Task t;
    if (!loads_in("make_task", kSlow, [&] { t = data::make_task(name, o); })) return;
    ++built, ++per_name[which];
    // Examples are made on demand: read the first and last of each split where one is cheap (the task's longest
    // sequence a few thousand tokens; listops with a wide length window, as its generator draws trees until one fits:
    // [500, 500] takes some 50 ms an example, a window beyond what it draws 2.5 s before it gives up).
    const bool cheap = t.max_len <= 4096 && (name != "listops" || (o.min_len <= 100 && t.max_len >= 2000));
    if (cheap) check_task(t, o, false, 2), ++fetched;
  });
  MESSAGE(built << " generated tasks built (listops / pathfinder / grouping: " << per_name[0] << " / " << per_name[1]
                << " / " << per_name[2] << "), " << fetched << " with their examples read");
}
