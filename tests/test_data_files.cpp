// File-based tasks (data/fashion_mnist.h, data/text.h): read_idx on hand-built IDX files (gzip and plain) and on
// every malformed header / payload; the Fashion-MNIST task on a small generated set and on the real Debian files;
// the man-page text task against the test's own count of the pages dpkg lists; file_task on TSV / CSV fixtures
// written into a temporary directory. The real-data checks report themselves skipped when a package is missing.
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "data/fashion_mnist.h"
#include "data/tasks.h"
#include "data/text.h"
#include "testing.h"
using namespace asc;
using namespace asc::data;

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// doctest::Contains of a std::string (doctest's own String takes a const char*; it copies it).
doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

// A fresh empty directory under the system temp directory, removed at the end of the test case.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) : path(fs::temp_directory_path() / ("asc_test_data_files_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

void write_plain(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}
void write_text(const std::string& path, const std::string& s) { write_plain(path, Bytes(s.begin(), s.end())); }
void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}
Bytes read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}
// An IDX file of unsigned bytes: magic, big-endian sizes, payload — each part given separately so tests can break it.
Bytes idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes b;
  put_be32(b, magic);
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}
Bytes idx_ubyte(const std::vector<uint32_t>& dims, const Bytes& payload) {
  return idx_bytes(0x0800u | static_cast<uint32_t>(dims.size()), dims, payload);
}
Bytes iota_bytes(size_t n, uint8_t mul = 7) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * mul + 3);
  return b;
}

// Every example of a dataset, in order.
std::vector<Example> all_of(const Dataset& d) {
  std::vector<Example> v;
  for (int64_t i = 0; i < d.size(); ++i) v.push_back(d.get(i));
  return v;
}
std::string bytes_of(const Tensor& t) {
  std::string s;
  for (int64_t v : t.to_vector<int64_t>()) s.push_back(static_cast<char>(v));
  return s;
}

}  // namespace

// ---- read_idx -------------------------------------------------------------------------------------------------

TEST_CASE("read_idx reads a hand-built IDX file back exactly, gzip-compressed and plain") {
  TempDir dir("idx_ok");
  for (const std::vector<uint32_t>& dims : {std::vector<uint32_t>{5}, {3, 4, 2}, {2, 1, 3, 1}}) {
    size_t n = 1;
    for (uint32_t d : dims) n *= d;
    const Bytes payload = iota_bytes(n);
    const Bytes file = idx_ubyte(dims, payload);
    write_plain(dir / "a.idx", file);
    write_gz(dir / "a.idx.gz", file);
    for (const std::string& p : {dir / "a.idx", dir / "a.idx.gz"}) {
      CAPTURE(p);
      const IdxArray a = read_idx(p);
      CHECK(a.dims == std::vector<int64_t>(dims.begin(), dims.end()));
      CHECK(a.data == payload);
    }
  }
}

TEST_CASE("read_idx refuses every malformed file with an error naming it") {
  TempDir dir("idx_bad");
  const Bytes good = idx_ubyte({2, 3}, iota_bytes(6));
  auto expect_error = [&](const Bytes& file, const std::string& what) {
    for (bool gz : {false, true}) {
      const std::string p = dir / (gz ? "bad.idx.gz" : "bad.idx");
      gz ? write_gz(p, file) : write_plain(p, file);
      CAPTURE(p);
      CHECK_THROWS_WITH_AS(read_idx(p), has(p + what), Error);
    }
  };
  Bytes truncated = good;
  truncated.pop_back();
  expect_error(truncated, " is truncated: its header [2, 3] promises 6 bytes, it holds 5");
  expect_error(Bytes(good.begin(), good.begin() + 6), " is truncated: it ends inside the header");  // inside a size
  expect_error(Bytes(good.begin(), good.begin() + 2), " is truncated: it ends inside the header");  // inside the magic
  expect_error({}, " is truncated: it ends inside the header");
  Bytes trailing = good;
  trailing.push_back(0);
  expect_error(trailing, " has trailing bytes after the 6 payload bytes");
  expect_error(idx_bytes(0x12340802u, {2, 3}, iota_bytes(6)), " is not an IDX file: magic 0x12340802");
  expect_error(idx_bytes(0x00000002u, {2, 3}, iota_bytes(6)), " is not an IDX file");
  expect_error(idx_bytes(0x00000D02u, {2, 3}, Bytes(24)), ": IDX element type 0x0d is not supported");  // float32
  expect_error(idx_bytes(0x00000800u, {}, iota_bytes(6)), ": magic 0x00000800 declares 0 dimensions");
  expect_error(idx_bytes(0x00000803u, {2, 3}, iota_bytes(6)), " is truncated");  // claims 3 dims, gives 2 (+payload)
  expect_error(idx_ubyte({2, 0, 3}, {}), ": dimension 1 has size 0");
  expect_error(idx_ubyte({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}), ": dimension 1 of size 4294967295");  // overflow
  expect_error(
      idx_ubyte({0xFFFFFFFFu, 2}, {}),
      ": dimension 1 of size 2 (after [4294967295]) takes the payload past the 4294967296 byte limit");  // 8 GiB
                                                                                                         // claimed,
                                                                                                         // refused
                                                                                                         // early

  // A corrupt gzip stream (a damaged deflate body) and a cut one.
  write_gz(dir / "c.gz", idx_ubyte({64, 64}, iota_bytes(4096, 13)));
  Bytes gz = read_plain(dir / "c.gz");
  Bytes cut(gz.begin(), gz.begin() + static_cast<ptrdiff_t>(gz.size() / 2));
  write_plain(dir / "cut.gz", cut);
  CHECK_THROWS_WITH_AS(read_idx(dir / "cut.gz"), has(dir / "cut.gz"), Error);
  for (size_t i = 12; i < gz.size() - 8; i += 5) gz[i] ^= 0x5A;
  write_plain(dir / "corrupt.gz", gz);
  CHECK_THROWS_WITH_AS(read_idx(dir / "corrupt.gz"), has(dir / "corrupt.gz"), Error);
  CHECK_THROWS_WITH_AS(read_idx(dir / "absent.idx"), has("absent.idx not found"), Error);
}

// ---- Fashion-MNIST ------------------------------------------------------------------------------------------------

namespace {
// A small Fashion-MNIST-shaped set: n_train training and n_test t10k images of rows x cols.
struct FakeFmnist {
  Bytes train_px, train_lab, test_px, test_lab;
  FakeFmnist(const std::string& dir, uint32_t n_train, uint32_t n_test, uint32_t rows, uint32_t cols) {
    train_px = iota_bytes(size_t{n_train} * rows * cols, 7);
    test_px = iota_bytes(size_t{n_test} * rows * cols, 11);
    for (uint32_t i = 0; i < n_train; ++i) train_lab.push_back(static_cast<uint8_t>((i * 3) % 10));
    for (uint32_t i = 0; i < n_test; ++i) test_lab.push_back(static_cast<uint8_t>((i * 7) % 10));
    write_gz(dir + "/train-images-idx3-ubyte.gz", idx_ubyte({n_train, rows, cols}, train_px));
    write_gz(dir + "/train-labels-idx1-ubyte.gz", idx_ubyte({n_train}, train_lab));
    write_plain(dir + "/t10k-images-idx3-ubyte", idx_ubyte({n_test, rows, cols}, test_px));  // unpacked copies
    write_plain(dir + "/t10k-labels-idx1-ubyte", idx_ubyte({n_test}, test_lab));
  }
};
}  // namespace

TEST_CASE("gzip: truncated streams, trailing garbage and corrupt members refused; concatenated members read") {
  TempDir dir("gzip");
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += fmt::format("{}\tline {} of a file long enough for several blocks\n", i % 3, i);
  const Bytes content(text.begin(), text.end());
  write_gz(dir / "a.gz", content);
  const Bytes gz = read_plain(dir / "a.gz");
  CHECK(read_file_maybe_gzip(dir / "a.gz") == text);
  // cut anywhere: inside the header, the data, the CRC-32 / length trailer
  for (size_t len = 2; len < gz.size(); len += len < 40 ? 1 : 97) {
    write_plain(dir / "cut.gz", Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(len)));
    CAPTURE(len);
    CHECK_THROWS_WITH_AS(read_file_maybe_gzip(dir / "cut.gz"), has(dir / "cut.gz" + ": the gzip stream is truncated"),
                         Error);
  }
  write_plain(dir / "cut.gz", Bytes(gz.end() - 1, gz.end()));  // the last byte only: not gzip (plain, one byte)
  CHECK(read_file_maybe_gzip(dir / "cut.gz").size() == 1);
  write_plain(dir / "one.gz", Bytes{0x1f});
  CHECK_THROWS_WITH_AS(read_file_maybe_gzip(dir / "one.gz"), has("one byte long"), Error);
  // trailing garbage, zero padding included
  for (const Bytes& tail : {Bytes{'x', 'y', 'z'}, Bytes{0, 0, 0, 0}, Bytes{0x1f}}) {
    Bytes b = gz;
    b.insert(b.end(), tail.begin(), tail.end());
    write_plain(dir / "tail.gz", b);
    CHECK_THROWS_WITH_AS(read_file_maybe_gzip(dir / "tail.gz"), has("trailing garbage after gzip member 1"), Error);
  }
  // a flipped byte in the trailer's CRC-32 or in the deflate data
  for (size_t at : {gz.size() - 6, gz.size() / 2}) {
    Bytes b = gz;
    b[at] ^= 0x55;
    write_plain(dir / "flip.gz", b);
    CAPTURE(at);
    CHECK_THROWS_WITH_AS(read_file_maybe_gzip(dir / "flip.gz"), has("the gzip stream is corrupt in member 1"), Error);
  }
  // `cat a.gz b.gz`: both members, in order; the second one truncated is refused
  write_gz(dir / "b.gz", Bytes{'e', 'n', 'd', '\n'});
  Bytes two = gz, b = read_plain(dir / "b.gz");
  two.insert(two.end(), b.begin(), b.end());
  write_plain(dir / "two.gz", two);
  CHECK(read_file_maybe_gzip(dir / "two.gz") == text + "end\n");
  two.resize(two.size() - 3);
  write_plain(dir / "two.gz", two);
  CHECK_THROWS_WITH_AS(read_file_maybe_gzip(dir / "two.gz"), has("truncated: the file ends inside member 2"), Error);
  // the readers built on it: read_idx, and a file: task (TSV) — no silent partial data
  const Bytes idx = idx_ubyte({100, 7}, iota_bytes(700));
  write_gz(dir / "x.idx.gz", idx);
  Bytes idx_gz = read_plain(dir / "x.idx.gz");
  idx_gz.resize(idx_gz.size() - 5);
  write_plain(dir / "x.idx.gz", idx_gz);
  CHECK_THROWS_WITH_AS(read_idx(dir / "x.idx.gz"),
                       has("read_idx: " + (dir / "x.idx.gz") + ": the gzip stream is truncated"), Error);
  Bytes tsv = gz;
  tsv.resize(tsv.size() * 2 / 3);
  write_plain(dir / "task.tsv.gz", tsv);
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "task.tsv.gz"), {}), has("truncated"), Error);
  // a plain file that merely starts like nothing in particular reads as it is
  write_text(dir / "plain.tsv", "a\tb\n");
  CHECK(read_file_maybe_gzip(dir / "plain.tsv") == "a\tb\n");
}

TEST_CASE("inputs for predict: prepared as the tasks prepare theirs (images pooled, text bytes, token ids)") {
  TempDir dir("inputs");
  // text lines: bytes, blank lines skipped (their numbers kept), CRLF, --tsv takes the text after the first tab, cut
  write_text(dir / "t.txt", "ab\tc\r\n\n  \nxyz\n");
  Inputs t = text_inputs(dir / "t.txt", false, 0);
  REQUIRE(t.examples->size() == 2);
  CHECK(t.lines == std::vector<int64_t>{1, 4});
  CHECK(t.examples->get(0).input.to_vector<int64_t>() == std::vector<int64_t>{'a', 'b', '\t', 'c'});
  CHECK(t.examples->get(0).label == -1);
  write_text(dir / "t.tsv", "ab\tc\td\n");
  CHECK(text_inputs(dir / "t.tsv", true, 0).examples->get(0).input.to_vector<int64_t>() ==
        std::vector<int64_t>{'c', '\t', 'd'});
  CHECK_THROWS_WITH_AS(text_inputs(dir / "t.txt", true, 0), has("t.txt:4: no tab"), Error);
  CHECK(text_inputs(dir / "t.txt", false, 2).examples->get(1).input.to_vector<int64_t>() ==
        std::vector<int64_t>{'x', 'y'});
  // bytes above 127 stay 128..255
  write_text(dir / "u.txt", "\xc3\xbc\n");
  CHECK(text_inputs(dir / "u.txt", false, 0).examples->get(0).input.to_vector<int64_t>() ==
        std::vector<int64_t>{0xc3, 0xbc});
  // token ids: spaces, tabs or commas; checked against the vocabulary
  write_text(dir / "i.txt", "1 2,3\t4\n\n5\n");
  Inputs ids = id_inputs(dir / "i.txt", 6, 3);
  CHECK(ids.lines == std::vector<int64_t>{1, 3});
  CHECK(ids.examples->get(0).input.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  CHECK_THROWS_WITH_AS(id_inputs(dir / "i.txt", 5, 0), has("i.txt:3: token 5 is outside the model's vocabulary [0, 5)"),
                       Error);
  write_text(dir / "bad.txt", "1 x 3\n");
  CHECK_THROWS_WITH_AS(id_inputs(dir / "bad.txt", 10, 0), has("bad.txt:1: 'x 3' is not a token id"), Error);
  write_text(dir / "empty.txt", "\n\n");
  CHECK_THROWS_WITH_AS(text_inputs(dir / "empty.txt", false, 0), has("holds no input"), Error);
  // images: the task's own preparation — pixel tokens or floats, pooled as make_task pools
  const Bytes px = iota_bytes(2 * 4 * 4);
  IdxArray imgs;
  imgs.dims = {2, 4, 4};
  imgs.data = px;
  Inputs im = image_inputs(imgs, true, 2);
  REQUIRE(im.examples->size() == 2);
  CHECK(im.lines == std::vector<int64_t>{1, 2});
  const std::vector<int64_t> pooled = im.examples->get(1).input.to_vector<int64_t>();
  REQUIRE(pooled.size() == 4);
  const uint8_t* b = px.data() + 16;  // image 1, top-left 2 x 2 block: the rounded mean
  CHECK(pooled[0] == static_cast<int64_t>(std::floor((b[0] + b[1] + b[4] + b[5]) / 4.0 + 0.5)));
  CHECK(image_inputs(imgs, false, 0).examples->get(0).input.shape() == Shape{4, 4});
  CHECK_THROWS_WITH_AS(image_inputs(imgs, true, 3), has("pooled from a side it divides"), Error);
  // the real Fashion-MNIST test images: identical to the fashion-mnist-seq task's test split at image_size 14
  const std::string t10k = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  if (fs::exists(t10k)) {
    const Task task = make_task("fashion-mnist-seq", {.test_size = 50, .image_size = 14});
    const Inputs real = image_inputs(read_idx(t10k), true, 14);
    for (int64_t i : {0, 7, 49})
      CHECK(real.examples->get(i).input.to_vector<int64_t>() == task.test->get(i).input.to_vector<int64_t>());
  }
}

TEST_CASE("fashion-mnist: splits, pixels and labels of a generated set match the files") {
  TempDir dir("fmnist_fake");
  const uint32_t n_train = 5006, n_test = 9, rows = 2, cols = 3;
  FakeFmnist f(dir.path.string(), n_train, n_test, rows, cols);
  const Task img = make_task("fashion-mnist", {.data_dir = dir.path.string()});
  const Task seq = make_task("fashion-mnist-seq", {.data_dir = dir.path.string()});
  CHECK(img.train->size() == 6);  // n_train - 5000
  CHECK(img.val->size() == 5000);
  CHECK(img.test->size() == 9);
  CHECK(img.classes == 10);
  CHECK(img.vocab == 0);
  CHECK(seq.vocab == 256);
  CHECK(img.max_len == 6);
  CHECK(img.class_names.size() == 10);
  CHECK(img.class_names[9] == "Ankle boot");
  // Example i of a split is image (first + i) of its file.
  auto check_split = [&](const Dataset& di, const Dataset& ds, const Bytes& px, const Bytes& lab, int64_t first) {
    for (int64_t i : {int64_t{0}, di.size() / 2, di.size() - 1}) {
      CAPTURE(i);
      const Example a = di.get(i), b = ds.get(i);
      CHECK(a.input.shape() == Shape{rows, cols});
      CHECK(a.input.dtype() == kFloat32);
      CHECK(b.input.shape() == Shape{rows * cols});
      CHECK(b.input.dtype() == kInt64);
      CHECK(a.label == lab[static_cast<size_t>(first + i)]);
      CHECK(b.label == a.label);
      const auto fa = a.input.to_vector<float>();
      const auto sb = b.input.to_vector<int64_t>();
      for (int64_t k = 0; k < rows * cols; ++k) {
        const uint8_t p = px[static_cast<size_t>((first + i) * rows * cols + k)];
        CHECK(sb[static_cast<size_t>(k)] == p);
        CHECK(fa[static_cast<size_t>(k)] == doctest::Approx(p / 255.0).epsilon(1e-6));
      }
    }
  };
  check_split(*img.train, *seq.train, f.train_px, f.train_lab, 0);
  check_split(*img.val, *seq.val, f.train_px, f.train_lab, n_train - 5000);
  check_split(*img.test, *seq.test, f.test_px, f.test_lab, 0);
  // get is safe from several threads at once: two threads reading the validation split see what one thread sees.
  std::vector<std::vector<float>> seen[2];
  auto read_all = [&](int w) {
    for (int64_t i = 0; i < img.val->size(); ++i) seen[w].push_back(img.val->get(i).input.to_vector<float>());
  };
  std::thread other(read_all, 1);
  read_all(0);
  other.join();
  CHECK(seen[0] == seen[1]);
  CHECK_THROWS_AS(img.train->get(6), Error);
  CHECK_THROWS_AS(img.test->get(-1), Error);

  const Task small =
      make_task("fashion-mnist", {.train_size = 2, .val_size = 3, .test_size = 4, .data_dir = dir.path.string()});
  CHECK(small.train->size() == 2);
  CHECK(small.val->size() == 3);
  CHECK(small.test->size() == 4);
  CHECK(small.val->get(0).label == f.train_lab[n_train - 5000]);  // val still starts 5000 from the end
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.train_size = 7, .data_dir = dir.path.string()}),
                       has("train_size 7 exceeds the 6 examples"), Error);
}

TEST_CASE("fashion-mnist: missing files, bad labels and mismatched files are errors naming the fix or the file") {
  TempDir dir("fmnist_bad");
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.data_dir = dir.path.string()}),
                       has("not found; install it with: apt-get install dataset-fashion-mnist"), Error);
  FakeFmnist f(dir.path.string(), 5001, 3, 2, 2);
  const std::string labels = dir / "t10k-labels-idx1-ubyte";
  write_plain(labels, idx_ubyte({3}, {1, 10, 2}));
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.data_dir = dir.path.string()}),
                       has("label 10 of example 1 is outside [0, 9]"), Error);
  write_plain(labels, idx_ubyte({4}, {1, 2, 3, 4}));
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.data_dir = dir.path.string()}),
                       has("holds 3 images but " + labels + " holds 4 labels"), Error);
  write_plain(labels, idx_ubyte({3, 1}, {1, 2, 3}));
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.data_dir = dir.path.string()}),
                       has("holds 2 dimensions, expected 1"), Error);
  write_plain(labels, idx_ubyte({3}, {1, 2, 3}));
  write_plain(dir / "t10k-images-idx3-ubyte", idx_ubyte({3, 2, 3}, iota_bytes(18)));
  CHECK_THROWS_WITH_AS(make_task("fashion-mnist", {.data_dir = dir.path.string()}),
                       has("training images are 2 x 2 but the t10k images are 2 x 3"), Error);
}

TEST_CASE("fashion-mnist: the real Debian files (55000 / 5000 / 10000, 6000 per class in train + val)") {
  const char* env = std::getenv("ASC_FMNIST_DIR");
  const std::string dir = env && *env ? env : "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): skipped");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Task img = make_task("fashion-mnist");
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("loaded Fashion-MNIST in " << load_s << " s");
  const Task seq = make_task("fashion-mnist-seq");
  REQUIRE(img.train->size() == 55000);
  REQUIRE(img.val->size() == 5000);
  REQUIRE(img.test->size() == 10000);
  CHECK(seq.max_len == 784);
  std::vector<int64_t> per_class(10, 0), test_class(10, 0);
  for (const Dataset* d : {img.train.get(), img.val.get()})
    for (int64_t i = 0; i < d->size(); ++i) {
      const int64_t l = d->get(i).label;
      REQUIRE((l >= 0 && l < 10));
      ++per_class[static_cast<size_t>(l)];
    }
  for (int64_t i = 0; i < img.test->size(); ++i) ++test_class[static_cast<size_t>(img.test->get(i).label)];
  CHECK(per_class == std::vector<int64_t>(10, 6000));
  CHECK(test_class == std::vector<int64_t>(10, 1000));
  // The two forms agree and lie in range, on a spread of examples of each split.
  for (auto [a, b] : {std::pair{img.train, seq.train}, std::pair{img.val, seq.val}, std::pair{img.test, seq.test}})
    for (int64_t i = 0; i < a->size(); i += 997) {
      const Example x = a->get(i), y = b->get(i);
      REQUIRE(x.input.shape() == Shape{28, 28});
      REQUIRE(y.input.shape() == Shape{784});
      CHECK(x.label == y.label);
      const auto f = x.input.to_vector<float>();
      const auto t = y.input.to_vector<int64_t>();
      int64_t bad = 0;  // pixels out of range or differing between the two forms
      for (size_t k = 0; k < 784; ++k) bad += t[k] < 0 || t[k] > 255 || f[k] != static_cast<float>(t[k]) / 255.0f;
      CHECK(bad == 0);
    }
}

// ---- man-page text ----------------------------------------------------------------------------------------------

namespace {
// The test's own count of the man pages per class: regular files dpkg lists for the two packages, minus `.so`
// redirects (judged here by "one non-comment line, and it is a .so request").
std::map<int64_t, int64_t> expected_man_counts() {
  const std::map<std::string, int64_t> cls = {{"man2", 0}, {"man3", 1}, {"man4", 2}, {"man5", 2}, {"man7", 3}};
  std::map<int64_t, int64_t> counts;
  for (const char* pkg : {"manpages", "manpages-dev"}) {
    std::ifstream in(std::string("/var/lib/dpkg/info/") + pkg + ".list");
    for (std::string line; std::getline(in, line);) {
      const fs::path p(line);
      if (p.parent_path().parent_path() != "/usr/share/man" || fs::is_symlink(p) || !fs::is_regular_file(p)) continue;
      const auto c = cls.find(p.parent_path().filename().string());
      if (c == cls.end()) continue;
      std::vector<std::string> lines;
      std::istringstream body(read_file_maybe_gzip(line));
      for (std::string l; std::getline(body, l);)
        if (!l.starts_with(".\\\"") && !l.starts_with("'\\\"") && l.find_first_not_of(" \t\r") != std::string::npos)
          lines.push_back(l);
      if (lines.size() == 1 && lines[0].starts_with(".so ")) continue;
      ++counts[c->second];
    }
  }
  return counts;
}
}  // namespace

TEST_CASE("text: man pages by section, counts match the packages, inputs in range, no stubs, deterministic") {
  if (!fs::exists("/var/lib/dpkg/info/manpages.list") || !fs::exists("/var/lib/dpkg/info/manpages-dev.list")) {
    CHECK_THROWS_WITH_AS(make_task("text"), has("apt-get install manpages manpages-dev"), Error);
    MESSAGE("manpages / manpages-dev not installed: real-data checks skipped");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Task t = make_task("text");
  MESSAGE("loaded the man pages in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                     << " s: " << t.description);
  CHECK(t.classes == 4);
  CHECK(t.vocab == 256);
  CHECK(t.class_names == man_page_class_names());
  CHECK(t.max_len == 4096);
  std::map<int64_t, int64_t> got;
  std::map<int64_t, int64_t> per_split[3];
  std::vector<std::string> inputs;
  int s = 0;
  for (const Dataset* d : {t.train.get(), t.val.get(), t.test.get()}) {
    for (const Example& e : all_of(*d)) {
      REQUIRE((e.label >= 0 && e.label < 4));
      ++got[e.label];
      ++per_split[s][e.label];
      REQUIRE(e.input.dtype() == kInt64);
      REQUIRE((e.input.numel() >= 1 && e.input.numel() <= 4096));
      const std::string b = bytes_of(e.input);
      const auto v = e.input.to_vector<int64_t>();
      REQUIRE((*std::min_element(v.begin(), v.end()) >= 0 && *std::max_element(v.begin(), v.end()) <= 255));
      CHECK_FALSE(b.starts_with(".so "));
      CHECK(b.find("\n.TH ") == std::string::npos);  // the title line (naming the section) is removed
      CHECK_FALSE(b.starts_with(".TH "));
      inputs.push_back(b);
    }
    ++s;
  }
  CHECK(got == expected_man_counts());
  const int64_t total = t.train->size() + t.val->size() + t.test->size();
  MESSAGE("pages per class (train / val / test): " << [&] {
    std::string r;
    for (int64_t c = 0; c < 4; ++c)
      r += fmt::format("{}{} {}/{}/{}", c ? ", " : "", t.class_names[static_cast<size_t>(c)], per_split[0][c],
                       per_split[1][c], per_split[2][c]);
    return r;
  }());
  CHECK(t.val->size() > total / 14);  // about 10 % each
  CHECK(t.val->size() < total / 7);
  CHECK(t.test->size() > total / 14);
  CHECK(t.test->size() < total / 7);
  // Deterministic, and max_len / min_len / split sizes apply.
  const Task again = make_task("text", {.train_size = 10, .max_len = 512});
  CHECK(again.train->size() == 10);
  CHECK(again.val->size() == t.val->size());
  CHECK(again.max_len == 512);
  for (int64_t i = 0; i < again.val->size(); ++i) {
    const Example e = again.val->get(i);
    CHECK(bytes_of(e.input) == inputs[static_cast<size_t>(t.train->size() + i)].substr(0, 512));
  }
  const Task longer = make_task("text", {.min_len = 4096});
  CHECK(longer.train->size() < t.train->size());
  for (int64_t i = 0; i < longer.test->size(); ++i) CHECK(longer.test->get(i).input.numel() == 4096);
  CHECK_THROWS_WITH_AS(make_task("text", {.data_dir = "/tmp"}), has("data_dir '/tmp' is not used"), Error);

  // windows (the language model's reading): every page whole, in windows of max_len bytes overlapping by one, in
  // the page's split; the bytes a model predicts (all but each window's first) are every page's bytes after its first
  const Task full = make_task("text", {.max_len = 1 << 20});  // no page is cut: each page whole, in order
  const Task win = make_task("text", {.max_len = 256, .windows = true});
  CHECK(win.max_len == 256);
  for (const auto& [whole, windows] : {std::pair{full.val.get(), win.val.get()}, {full.test.get(), win.test.get()}}) {
    std::vector<std::pair<int64_t, std::string>> want, got;
    int64_t page_targets = 0, predicted = 0;
    for (const Example& e : all_of(*whole)) {
      const std::string b = bytes_of(e.input);
      page_targets += e.input.numel() - 1;
      for (size_t start = 0; start + 1 < b.size(); start += 255) want.emplace_back(e.label, b.substr(start, 256));
    }
    for (const Example& e : all_of(*windows))
      got.emplace_back(e.label, bytes_of(e.input)), predicted += e.input.numel() - 1;
    CHECK(got == want);
    CHECK(predicted == page_targets);  // every byte after a page's first is a target exactly once
  }
  CHECK(win.train->size() > 10 * t.train->size() / 2);  // pages average ~4 kB: many windows each
  CHECK_THROWS_WITH_AS(make_task("text", {.max_len = 1, .windows = true}), has("windows need max_len >= 2"), Error);
  CHECK_THROWS_WITH_AS(make_task("listops", {.windows = true}), has("windows apply to the text and file: tasks"),
                       Error);
}

TEST_CASE("fortunes: Debian's fortunes by topic, independent of the code that reads them; pinned version; splits") {
  if (!fs::exists("/var/lib/dpkg/info/fortunes.list")) {
    CHECK_THROWS_WITH_AS(make_task("fortunes"), has("apt-get install fortunes="), Error);
    MESSAGE("fortunes not installed: real-data checks skipped");
    return;
  }
  const Task t = make_task("fortunes");
  MESSAGE(t.description);
  CHECK(t.classes == 4);
  CHECK(t.vocab == 256);
  CHECK(t.class_names == fortune_topics());
  CHECK(t.max_len == 256);
  CHECK(t.test->size() >= 1000);  // a test set that can resolve a few points
  // An independent reading of the files: split on lines "%", drop empty texts and texts in two topics.
  std::map<std::string, std::set<int64_t>> topics_of;
  for (size_t c = 0; c < fortune_topics().size(); ++c) {
    std::ifstream in("/usr/share/games/fortunes/" + fortune_topics()[c], std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find("\n%\n", start);
      const bool last = end == std::string::npos;
      if (last) end = all.size();
      std::string text = all.substr(start, end - start);
      if (last && !text.empty() && text.back() == '\n') text.pop_back();  // the file's own last line end
      if (text.starts_with("%\n")) text = text.substr(2);
      if (text.find_first_not_of(" \t\r\n") != std::string::npos) topics_of[text].insert(static_cast<int64_t>(c));
      start = end + 3;
    }
  }
  std::map<std::string, int64_t> expected;  // text cut to 256 bytes -> topic, for the unambiguous ones
  for (const auto& [text, topics] : topics_of)
    if (topics.size() == 1) expected[text.substr(0, 256)] = *topics.begin();
  std::map<int64_t, int64_t> per_topic[3];
  std::set<std::string> seen;
  int s = 0;
  int64_t total = 0;
  for (const Dataset* d : {t.train.get(), t.val.get(), t.test.get()}) {
    for (const Example& e : all_of(*d)) {
      const std::string b = bytes_of(e.input);
      REQUIRE(expected.contains(b));
      CHECK(expected.at(b) == e.label);
      CHECK(seen.insert(b).second);  // each text once, in one split
      ++per_topic[s][e.label];
      ++total;
    }
    ++s;
  }
  CHECK(total == static_cast<int64_t>(expected.size()));
  for (int64_t c = 0; c < 4; ++c) {  // stratified: a quarter of each topic in test, 5 % in val
    const int64_t n = per_topic[0][c] + per_topic[1][c] + per_topic[2][c];
    CHECK(per_topic[2][c] == n / 4);
    CHECK(per_topic[1][c] == n / 20);
  }
  // deterministic; sizes and max_len apply; data_dir refused
  const Task again = make_task("fortunes", {.test_size = 100, .max_len = 64});
  CHECK(again.test->size() == 100);
  CHECK(again.max_len == 64);
  CHECK(bytes_of(again.test->get(7).input) == bytes_of(t.test->get(7).input).substr(0, 64));
  CHECK_THROWS_WITH_AS(make_task("fortunes", {.data_dir = "/tmp"}), has("data_dir '/tmp' is not used"), Error);
  CHECK_THROWS_WITH_AS(make_task("fortunes", {.max_len = 8, .windows = true}), has("windows apply"), Error);
}

TEST_CASE("file: windows split each text into overlapping windows of max_len in its text's split") {
  TempDir dir("file_windows");
  std::string content;
  for (int i = 0; i < 30; ++i)
    content += fmt::format("{}	{}\n", i % 2 ? "b" : "a",
                           std::string(static_cast<size_t>(5 + i), static_cast<char>('a' + i % 26)));
  write_text(dir / "w.tsv", content);
  const Task whole = make_task("file:" + (dir / "w.tsv"), {.seed = 2});
  const Task win = make_task("file:" + (dir / "w.tsv"), {.seed = 2, .max_len = 8, .windows = true});
  CHECK(win.max_len == 8);
  for (const auto& [w, d] : {std::pair{whole.train.get(), win.train.get()},
                             {whole.val.get(), win.val.get()},
                             {whole.test.get(), win.test.get()}}) {
    // expected: each text of the split (in order) as windows [0, 8), [7, 15), ... of at least 2 bytes
    std::vector<std::pair<int64_t, std::string>> want, got;
    for (const Example& e : all_of(*w)) {
      const std::string b = bytes_of(e.input);
      for (size_t start = 0; start + 1 < b.size(); start += 7) want.emplace_back(e.label, b.substr(start, 8));
    }
    for (const Example& e : all_of(*d)) got.emplace_back(e.label, bytes_of(e.input));
    CHECK(got == want);
  }
  // min_len bounds the whole text, and may exceed max_len with windows
  const Task longer = make_task("file:" + (dir / "w.tsv"), {.seed = 2, .min_len = 30, .max_len = 8, .windows = true});
  CHECK(longer.train->size() + longer.val->size() + longer.test->size() > 0);
  for (const Dataset* d : {longer.train.get(), longer.val.get(), longer.test.get()})
    for (const Example& e : all_of(*d)) CHECK(e.input.numel() >= 2);
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "w.tsv"), {.windows = true}), has("windows need max_len >= 2"),
                       Error);
}

// ---- file:PATH ----------------------------------------------------------------------------------------------------

namespace {
// (label, text) pairs of a task's three splits, the label as its class name.
std::multiset<std::pair<std::string, std::string>> pairs_of(const Task& t) {
  std::multiset<std::pair<std::string, std::string>> r;
  for (const Dataset* d : {t.train.get(), t.val.get(), t.test.get()})
    for (const Example& e : all_of(*d)) r.emplace(t.class_names.at(static_cast<size_t>(e.label)), bytes_of(e.input));
  return r;
}
}  // namespace

TEST_CASE("file: a TSV of class names is split 80/10/10 by the seed, names numbered by first appearance") {
  TempDir dir("file_tsv");
  std::string content;
  std::multiset<std::pair<std::string, std::string>> want;
  const char* names[] = {"pos", "neg", "neutral"};
  for (int i = 0; i < 40; ++i) {
    const std::string label = names[(i * 7 + 1) % 3], text = fmt::format("example {} with\ttab and, comma", i);
    content += label + "\t" + text + (i % 5 == 0 ? "\r\n" : "\n");
    if (i == 17) content += "\n";  // a blank line is skipped
    want.emplace(label, text);
  }
  write_text(dir / "reviews.tsv", content);
  const Task t = make_task("file:" + (dir / "reviews.tsv"), {.seed = 3});
  CHECK(t.train->size() == 32);
  CHECK(t.val->size() == 4);
  CHECK(t.test->size() == 4);
  CHECK(t.class_names == std::vector<std::string>{"neg", "neutral", "pos"});  // first appearances: i = 0, 1, 2
  CHECK(t.classes == 3);
  CHECK(t.vocab == 256);
  CHECK(t.pad_id == 0);
  CHECK(pairs_of(t) == want);
  size_t longest = 0;
  for (const auto& [l, s] : want) longest = std::max(longest, s.size());
  CHECK(t.max_len == static_cast<int64_t>(longest));
  // The same seed gives the same split; another seed another one; each split keeps the file's order.
  const Task same = make_task("file:" + (dir / "reviews.tsv"), {.seed = 3});
  const Task other = make_task("file:" + (dir / "reviews.tsv"), {.seed = 4});
  std::vector<std::string> a, b, c;
  for (const Example& e : all_of(*t.val)) a.push_back(bytes_of(e.input));
  for (const Example& e : all_of(*same.val)) b.push_back(bytes_of(e.input));
  for (const Example& e : all_of(*other.val)) c.push_back(bytes_of(e.input));
  CHECK(a == b);
  CHECK(a != c);
  std::vector<int> order;
  for (const Example& e : all_of(*t.train)) order.push_back(std::stoi(bytes_of(e.input).substr(8)));
  CHECK(std::is_sorted(order.begin(), order.end()));
  // max_len cuts, min_len skips, split sizes take the first n.
  const Task cut = make_task("file:" + (dir / "reviews.tsv"), {.seed = 3, .train_size = 5, .max_len = 9});
  CHECK(cut.train->size() == 5);
  CHECK(cut.max_len == 9);
  CHECK(bytes_of(cut.train->get(0).input) == bytes_of(t.train->get(0).input).substr(0, 9));
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "reviews.tsv"), {.train_size = 33}),
                       has("train_size 33 exceeds the 32 examples"), Error);
}

TEST_CASE("file: CSV quoting, integer class ids, sniffed separators") {
  TempDir dir("file_csv");
  write_text(dir / "q.csv",
             "label,text\n"
             "1,plain text, with a comma\n"
             "\"0\",\"he said \"\"hi\"\", then left\"\n"
             "3,\"two\nlines\"\r\n"
             "1,\"\"\"quoted start\"\n");
  const Task t = make_task("file:" + (dir / "q.csv"));
  CHECK(t.classes == 4);  // ids 0..3, class 2 unused
  CHECK(t.class_names == std::vector<std::string>{"0", "1", "2", "3"});
  CHECK(pairs_of(t) == std::multiset<std::pair<std::string, std::string>>{{"1", "plain text, with a comma"},
                                                                          {"0", "he said \"hi\", then left"},
                                                                          {"3", "two\nlines"},
                                                                          {"1", "\"quoted start"}});
  // No extension: the first line decides the separator.
  write_text(dir / "data.txt", "a,x y\nb,z\na,w\n");
  CHECK(pairs_of(make_task("file:" + (dir / "data.txt"))) ==
        std::multiset<std::pair<std::string, std::string>>{{"a", "x y"}, {"b", "z"}, {"a", "w"}});
  write_text(dir / "data2.txt", "a\tx,y\nb\tz\na\tw\n");
  CHECK(pairs_of(make_task("file:" + (dir / "data2.txt"))).count({"a", "x,y"}) == 1);
}

TEST_CASE("file: token-id mode (header label<SEP>ids) reads whitespace-separated ids, vocab = largest + 1") {
  TempDir dir("file_ids");
  write_text(dir / "ids.tsv", "label\tids\ncat\t5 7  9\ndog\t0\ncat\t\t12 3 \n");
  const Task t = make_task("file:" + (dir / "ids.tsv"));
  CHECK(t.vocab == 13);
  CHECK(t.class_names == std::vector<std::string>{"cat", "dog"});
  std::multiset<std::pair<int64_t, std::vector<int64_t>>> got;
  for (const Dataset* d : {t.train.get(), t.val.get(), t.test.get()})
    for (const Example& e : all_of(*d)) got.emplace(e.label, e.input.to_vector<int64_t>());
  CHECK(got == std::multiset<std::pair<int64_t, std::vector<int64_t>>>{{0, {5, 7, 9}}, {1, {0}}, {0, {12, 3}}});
  CHECK(t.max_len == 3);
}

TEST_CASE("file: sibling val / test files are the splits; a missing one is cut from the training file") {
  TempDir dir("file_siblings");
  std::string train;
  for (int i = 0; i < 20; ++i) train += fmt::format("{}\ttrain {}\n", i % 2 ? "b" : "a", i);
  write_text(dir / "my_train.tsv", train);
  write_text(dir / "my_test.tsv", "c\ttest 0\na\ttest 1\n");
  const Task t1 = make_task("file:" + (dir / "my_train.tsv"));
  CHECK(t1.test->size() == 2);
  CHECK(bytes_of(t1.test->get(0).input) == "test 0");
  CHECK(t1.class_names == std::vector<std::string>{"a", "b", "c"});  // the test file's new name numbered last
  CHECK(t1.val->size() == 2);                                        // cut: 10 % of 20
  CHECK(t1.train->size() == 18);
  write_text(dir / "my_val.tsv", "label\ttext\nb\tval 0\n");  // a header in a sibling is fine when it agrees
  const Task t2 = make_task("file:" + (dir / "my_train.tsv"));
  CHECK(t2.train->size() == 20);
  CHECK(t2.val->size() == 1);
  CHECK(bytes_of(t2.val->get(0).input) == "val 0");
  CHECK(t2.val->get(0).label == 1);
  write_text(dir / "my_val.tsv", "label\tids\n1\t2 3\n");
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "my_train.tsv")), has("its header says 'ids'"), Error);
}

TEST_CASE("file: bad lines and empty files are errors naming file:line and what was expected") {
  TempDir dir("file_bad");
  auto expect = [&](const std::string& name, const std::string& content, const std::string& what) {
    write_text(dir / name, content);
    CAPTURE(content);
    CHECK_THROWS_WITH_AS(make_task("file:" + (dir / name)), has(what), Error);
  };
  const std::string p = dir / "";
  expect("a.tsv", "", p + "a.tsv is empty");
  expect("a.tsv", "\n\n", p + "a.tsv is empty");
  expect("a.tsv", "label\ttext\n", p + "a.tsv holds no examples");
  expect("a.tsv", "x\thello\ny\tworld\nno separator here\n", p + "a.tsv:3: expected label<TAB>text, found no tab");
  expect("a.csv", "x,hello\n,world\n", p + "a.csv:2: the label (first field) is empty");
  expect("a.csv", "x,hello\ny,\n", p + "a.csv:2: the text (second field) is empty");
  expect("a.csv", "x,hello\ny,\"never closed\nz,more\n", p + "a.csv:2: the quoted text is never closed");
  expect("a.csv", "x,\"quoted\" tail\n", p + "a.csv:1: unexpected characters after the closing quote");
  expect("a.tsv", "1\tone\ncat\ttwo\n", "label '1' is a number but " + p + "a.tsv:2 has the class name 'cat'");
  expect("a.tsv", "1\tone\n-1\ttwo\n", p + "a.tsv:2: class id -1 is out of range");
  expect("a.tsv", "label\tids\nx\t1 2 z\n", p + "a.tsv:2: token 'z' is not a token id");
  expect("a.tsv", "label\tids\nx\t1 -2\n", p + "a.tsv:2: token '-2' is not a token id");
  expect("a.tsv", "label\tids\nx\t99999999999999999999\n", "is not a token id");
  expect("a.tsv", "label\tids\nx\t   \n", p + "a.tsv:2: no token ids");
  expect("a.tsv", "label\twords\nx\ty\n", p + "a.tsv:1: a header's second field must be 'text'");
  expect("a.txt", "no separator at all\n", p + "a.txt:1: cannot tell the separator");
  expect("a.tsv", "x\tone\ny\ttwo\n", "too few to cut");  // 2 examples cannot give train, val and test
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "absent.tsv")), has("absent.tsv not found"), Error);
  CHECK_THROWS_WITH_AS(make_task("file:" + (dir / "a.tsv"), {.data_dir = "/tmp"}), has("data_dir '/tmp' is not used"),
                       Error);
}
