// read_idx and the Fashion-MNIST task (data/fashion_mnist.h, data/tasks.h).
#include "data/fashion_mnist.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/gzip.h"
#include "data/tasks.h"

namespace asc::data {

namespace {

constexpr int64_t kValCount = 5000;  // the last 5000 training images are the validation split (fixed)

uint32_t read_be32(CompressedReader& f, const std::string& path, const char* what) {
  uint8_t b[4];
  ASC_CHECK(f.read(b, 4) == 4, "read_idx: {} is truncated: it ends inside the header ({})", path, what);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

// One Fashion-MNIST split: `count` images starting at image `begin` of the shared buffers.
class FashionMnistDataset : public Dataset {
 public:
  FashionMnistDataset(std::shared_ptr<const std::vector<uint8_t>> pixels,
                      std::shared_ptr<const std::vector<uint8_t>> labels, int64_t rows, int64_t cols, int64_t begin,
                      int64_t count, bool as_sequence)
      : pixels_(std::move(pixels)),
        labels_(std::move(labels)),
        rows_(rows),
        cols_(cols),
        begin_(begin),
        count_(count),
        as_sequence_(as_sequence) {}

  int64_t size() const override { return count_; }

  // Reads only the immutable shared buffers, so any number of threads may call it at once.
  Example get(int64_t i) const override {
    ASC_CHECK(i >= 0 && i < count_, "FashionMnist.get: index {} is out of range for {} examples (0 <= i < {})", i,
              count_, count_);
    const int64_t n = rows_ * cols_;
    return image_example(pixels_->data() + (begin_ + i) * n, rows_, cols_, (*labels_)[static_cast<size_t>(begin_ + i)],
                         as_sequence_);
  }

 private:
  std::shared_ptr<const std::vector<uint8_t>> pixels_;  // (N_all, R, C) every image of the task
  std::shared_ptr<const std::vector<uint8_t>> labels_;  // (N_all)
  int64_t rows_, cols_, begin_, count_;
  bool as_sequence_;
};

// <dir>/<base>.gz, else <dir>/<base> (an unpacked copy); a clear error naming the fix when neither exists.
std::string find_idx(const std::string& dir, const std::string& base) {
  std::error_code ec;
  for (const std::string& p : {dir + "/" + base + ".gz", dir + "/" + base})
    if (std::filesystem::is_regular_file(p, ec)) return p;
  ASC_THROW(
      "fashion-mnist: {}/{}.gz not found; install it with: apt-get install dataset-fashion-mnist (or bash "
      "tools/setup.sh), or pass the directory / set ASC_FMNIST_DIR",
      dir, base);
}

// Images (N, R, C) and labels (N) of one file pair, checked against each other.
struct Pair {
  IdxArray images, labels;
};
Pair read_pair(const std::string& dir, const std::string& split) {
  const std::string ip = find_idx(dir, split + "-images-idx3-ubyte");
  const std::string lp = find_idx(dir, split + "-labels-idx1-ubyte");
  Pair p{read_idx(ip), read_idx(lp)};
  ASC_CHECK(p.images.dims.size() == 3, "fashion-mnist: {} holds {} dimensions, expected 3 (N, rows, cols)", ip,
            p.images.dims.size());
  ASC_CHECK(p.labels.dims.size() == 1, "fashion-mnist: {} holds {} dimensions, expected 1 (N)", lp,
            p.labels.dims.size());
  ASC_CHECK(p.images.dims[0] == p.labels.dims[0], "fashion-mnist: {} holds {} images but {} holds {} labels", ip,
            p.images.dims[0], lp, p.labels.dims[0]);
  const auto bad = std::find_if(p.labels.data.begin(), p.labels.data.end(), [](uint8_t l) { return l > 9; });
  ASC_CHECK(bad == p.labels.data.end(), "fashion-mnist: {}: label {} of example {} is outside [0, 9]", lp, *bad,
            bad - p.labels.data.begin());
  return p;
}

// The first n of a split of `available` (n = 0: all of them).
int64_t split_count(int64_t requested, int64_t available, const char* split) {
  ASC_CHECK(requested <= available, "fashion-mnist: {}_size {} exceeds the {} examples of the {} split", split,
            requested, available, split);
  return requested > 0 ? requested : available;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  CompressedReader in(path, "read_idx");  // gzip (truncation and trailing garbage refused) or plain

  // 1. Header: magic 0x0000 TT NN (TT = 0x08 unsigned byte, NN = ndims), then NN big-endian sizes.
  const uint32_t magic = read_be32(in, path, "magic");
  ASC_CHECK((magic >> 16) == 0 && ((magic >> 8) & 0xFF) != 0,
            "read_idx: {} is not an IDX file: magic 0x{:08x} (expected 0x000008NN, NN = the number of dimensions)",
            path, magic);
  ASC_CHECK(((magic >> 8) & 0xFF) == 0x08,
            "read_idx: {}: IDX element type 0x{:02x} is not supported (only 0x08, unsigned byte)", path,
            (magic >> 8) & 0xFF);
  const int ndims = static_cast<int>(magic & 0xFF);
  ASC_CHECK(ndims >= 1, "read_idx: {}: magic 0x{:08x} declares 0 dimensions (need >= 1)", path, magic);
  IdxArray out;
  int64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const int64_t size = read_be32(in, path, "dimension sizes");
    ASC_CHECK(size > 0, "read_idx: {}: dimension {} has size 0 (every size must be > 0)", path, d);
    ASC_CHECK(total <= kMaxIdxBytes / size,  // checked before multiplying: no overflow
              "read_idx: {}: dimension {} of size {} (after [{}]) takes the payload past the {} byte limit", path, d,
              size, fmt::join(out.dims, ", "), kMaxIdxBytes);
    total *= size;
    out.dims.push_back(size);
  }

  // 2. Payload, read in chunks so that a header promising more than the file holds allocates little.
  constexpr int64_t kChunk = int64_t{64} << 20;
  int64_t got = 0;
  while (got < total) {
    const int64_t next = std::min(total, got + kChunk);
    out.data.resize(static_cast<size_t>(next));
    const size_t r = in.read(out.data.data() + got, static_cast<size_t>(next - got));
    got += static_cast<int64_t>(r);
    if (got < next) break;
  }
  ASC_CHECK(got == total, "read_idx: {} is truncated: its header [{}] promises {} bytes, it holds {}", path,
            fmt::join(out.dims, ", "), total, got);
  uint8_t extra = 0;
  ASC_CHECK(in.read(&extra, 1) == 0,
            "read_idx: {} has trailing bytes after the {} payload bytes its header [{}] declares", path, total,
            fmt::join(out.dims, ", "));
  return out;
}

Example image_example(const uint8_t* px, int64_t rows, int64_t cols, int64_t label, bool as_sequence) {
  const int64_t n = rows * cols;
  Example ex;
  ex.label = label;
  if (as_sequence) {
    ex.input = empty({n}, {.dtype = kInt64});  // (R*C) pixel tokens 0..255, row-major
    int64_t* dst = ex.input.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) dst[k] = px[k];
  } else {
    ex.input = empty({rows, cols}, {.dtype = kFloat32});  // (R, C) in [0, 1]
    float* dst = ex.input.data_ptr<float>();
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<float>(px[k]) / 255.0f;
  }
  return ex;
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

Task fashion_mnist_task(const TaskOptions& options, bool as_sequence) {
  std::string dir = options.data_dir;
  if (dir.empty()) {
    const char* env = std::getenv("ASC_FMNIST_DIR");
    dir = env && *env ? env : "/usr/share/datasets/fashion-mnist";
  }
  Pair train = read_pair(dir, "train");
  Pair test = read_pair(dir, "t10k");
  const int64_t rows = train.images.dims[1], cols = train.images.dims[2];
  ASC_CHECK(test.images.dims[1] == rows && test.images.dims[2] == cols,
            "fashion-mnist: the training images are {} x {} but the t10k images are {} x {}", rows, cols,
            test.images.dims[1], test.images.dims[2]);
  const int64_t n_train_file = train.images.dims[0], n_test_file = test.images.dims[0];
  ASC_CHECK(n_train_file > kValCount,
            "fashion-mnist: the training file holds {} images; need more than the {} held out for validation",
            n_train_file, kValCount);
  const int64_t n_train = split_count(options.train_size, n_train_file - kValCount, "train");
  const int64_t n_val = split_count(options.val_size, kValCount, "val");
  const int64_t n_test = split_count(options.test_size, n_test_file, "test");

  // One buffer for all images: training file first, then t10k (the test split starts at image n_train_file).
  auto pixels = std::make_shared<std::vector<uint8_t>>(std::move(train.images.data));  // (N_train + N_test, R, C)
  pixels->insert(pixels->end(), test.images.data.begin(), test.images.data.end());
  auto labels = std::make_shared<std::vector<uint8_t>>(std::move(train.labels.data));  // (N_train + N_test)
  labels->insert(labels->end(), test.labels.data.begin(), test.labels.data.end());

  auto split = [&](int64_t begin, int64_t count) {
    return std::make_shared<const FashionMnistDataset>(pixels, labels, rows, cols, begin, count, as_sequence);
  };
  Task task;
  task.name = as_sequence ? "fashion-mnist-seq" : "fashion-mnist";
  task.train = split(0, n_train);
  task.val = split(n_train_file - kValCount, n_val);
  task.test = split(n_train_file, n_test);
  task.vocab = as_sequence ? 256 : 0;
  task.classes = 10;
  task.max_len = rows * cols;
  task.pad_id = 0;  // every sequence has the full length: nothing is padded
  task.class_names = fashion_mnist_class_names();
  task.description = fmt::format(
      "Fashion-MNIST ({}): {} train / {} val (the last {} training images) / {} test {}x{} grey images, 10 classes; {}",
      dir, n_train, n_val, kValCount, n_test, rows, cols,
      as_sequence ? fmt::format("input {} int64 pixel tokens 0..255 (LRA's Image task is CIFAR-10 in grey at length "
                                "1024; CIFAR is not packaged in Debian)",
                                rows * cols)
                  : fmt::format("input ({}, {}) float32 in [0, 1]", rows, cols));
  return task;
}

}  // namespace asc::data
