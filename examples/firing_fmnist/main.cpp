// The README's firing-perceptron snippet as a program: the layer and the learning rule exactly as README.md writes
// them ("Firing-threshold perceptron"), with a linear readout and a training loop added, trained on Fashion-MNIST.
//
//   firing_fmnist [--data DIR] [--epochs 3] [--limit N] [--test-limit N] [--expect ACC]
//
// DIR holds the four IDX files (gzip-compressed, as Debian's dataset-fashion-mnist installs them; default: $ASC_FMNIST_DIR,
// else /usr/share/datasets/fashion-mnist). --limit / --test-limit train / test on the first N examples only;
// --expect fails (exit 1) when the final test accuracy is below ACC. Exit code 77 when the dataset is not there, so
// a test that runs this program is skipped rather than failed.
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ascender.h"

using namespace asc;

namespace {

// One IDX file (big-endian header: magic 0x00000803 images / 0x00000801 labels, then the sizes), read through zlib.
std::vector<uint8_t> read_idx(const std::string& path, int dims, std::vector<int64_t>& sizes) {
  gzFile f = gzopen(path.c_str(), "rb");
  ASC_CHECK(f != nullptr, "firing_fmnist: cannot open {}", path);
  auto read_u32 = [&] {
    unsigned char b[4];
    ASC_CHECK(gzread(f, b, 4) == 4, "firing_fmnist: {} is truncated", path);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
  };
  const uint32_t magic = read_u32();
  ASC_CHECK(magic == 0x800u + static_cast<uint32_t>(dims), "firing_fmnist: {} is not an IDX file of {} dims", path,
            dims);
  sizes.clear();
  int64_t total = 1;
  for (int i = 0; i < dims; ++i) {
    sizes.push_back(read_u32());
    total *= sizes.back();
  }
  ASC_CHECK(total > 0 && total < (int64_t{1} << 31), "firing_fmnist: {} has a bad size", path);
  std::vector<uint8_t> data(static_cast<size_t>(total));
  ASC_CHECK(gzread(f, data.data(), static_cast<unsigned>(total)) == static_cast<int>(total),
            "firing_fmnist: {} is truncated", path);
  gzclose(f);
  return data;
}

// Images (n, 784) float32 in [0, 1] and labels (n) int64, the first `limit` of them.
std::pair<Tensor, Tensor> load(const std::string& dir, const std::string& split, int64_t limit) {
  std::vector<int64_t> is, ls;
  const std::vector<uint8_t> img = read_idx(dir + "/" + split + "-images-idx3-ubyte.gz", 3, is);
  const std::vector<uint8_t> lab = read_idx(dir + "/" + split + "-labels-idx1-ubyte.gz", 1, ls);
  ASC_CHECK(is[0] == ls[0] && is[1] * is[2] == 784, "firing_fmnist: {} images and labels disagree", split);
  const int64_t n = limit > 0 ? std::min(limit, is[0]) : is[0];
  std::vector<float> x(static_cast<size_t>(n * 784));
  for (size_t i = 0; i < x.size(); ++i) x[i] = img[i] / 255.0f;
  std::vector<int64_t> y(lab.begin(), lab.begin() + n);
  return {tensor(std::vector<double>(x.begin(), x.end()), {n, 784}).to(kFloat32), tensor(y, {n})};
}

constexpr const char* kUsage =
    "usage: firing_fmnist [--data DIR] [--epochs N] [--limit N] [--test-limit N] [--expect ACC]\n"
    "  --data DIR        the four Fashion-MNIST IDX .gz files (default $ASC_FMNIST_DIR, else\n"
    "                    /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)\n"
    "  --epochs N        passes over the training set, 1..1000 (default 3)\n"
    "  --limit N         train on the first N examples only, 0 = all (default 0)\n"
    "  --test-limit N    test on the first N examples only, 0 = all (default 0)\n"
    "  --expect ACC      exit 1 when the final test accuracy is below ACC, in [0, 1] (default 0)\n";

// A whole-string number in [lo, hi], or nullopt (so "3x", "", "abc" and out-of-range values are refused).
template <class T>
std::optional<T> parse(const std::string& s, T lo, T hi) {
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !(v >= lo && v <= hi)) return std::nullopt;
  return v;
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    fmt::print(stderr, "firing_fmnist: {}\n", e.what());
    return 1;
  }
}

namespace {
int run(int argc, char** argv) {
  const char* env = std::getenv("ASC_FMNIST_DIR");
  std::string dir = env ? env : "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  int64_t limit = 0, test_limit = 0;
  double expect = 0;
  auto usage_error = [](const std::string& what) {
    fmt::print(stderr, "firing_fmnist: {}\n{}", what, kUsage);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (a != "--data" && a != "--epochs" && a != "--limit" && a != "--test-limit" && a != "--expect")
      return usage_error(fmt::format("unknown argument '{}'", a));
    if (i + 1 >= argc) return usage_error(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--data") {
      dir = v, ok = !v.empty();
    } else if (a == "--epochs") {
      const auto n = parse<int>(v, 1, 1000);
      ok = n.has_value(), epochs = n.value_or(epochs);
    } else if (a == "--limit" || a == "--test-limit") {
      const auto n = parse<int64_t>(v, 0, std::numeric_limits<int64_t>::max());
      ok = n.has_value(), (a == "--limit" ? limit : test_limit) = n.value_or(0);
    } else {
      const auto x = parse<double>(v, 0.0, 1.0);
      ok = x.has_value(), expect = x.value_or(expect);
    }
    if (!ok) return usage_error(fmt::format("bad value '{}' for {}", v, a));
  }
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    fmt::print("firing_fmnist: no Fashion-MNIST in {} (apt-get install dataset-fashion-mnist, or --data DIR): "
               "skipped\n", dir);
    return 77;
  }
  const auto [x_train, y_train] = load(dir, "train", limit);
  const auto [x_test, y_test] = load(dir, "t10k", test_limit);
  manual_seed(0);

  // ---- as README.md writes them ----
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(784, 128).threshold(0.1));  // W (128, 784)
  optim::Adam opt(layer->parameters(), {.lr = 1e-3});
  opt.add_local_rule(layer->rule_b({.eta_w = 1e-5, .z_ref = 0.3, .r_target = 0.3, .w_min = -1}));  // + Oja + homeostasis
  // ---- added: a linear readout of the 128 neurons, trained with them, and the loop ----
  auto readout = std::make_shared<nn::Linear>(128, 10);
  opt.add_param_group(readout->parameters(), {.lr = 1e-3});

  auto accuracy = [&] {
    NoGradGuard no_grad;
    layer->eval();
    const double acc =
        mean(eq(argmax((*readout)((*layer)(x_test)), -1), y_test).to(kFloat64)).item<double>();
    layer->train();
    return acc;
  };
  const int64_t n = x_train.size(0), batch = 64;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::mt19937_64 rng(1);
  double acc = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0;
    int64_t steps = 0;
    for (int64_t s = 0; s < n; s += batch) {
      const int64_t b = std::min(batch, n - s);
      const Tensor idx = tensor(std::vector<int64_t>(order.begin() + s, order.begin() + s + b), {b});
      opt.zero_grad();
      Tensor loss = cross_entropy((*readout)((*layer)(index_select(x_train, 0, idx))), index_select(y_train, 0, idx));
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>();
      ++steps;
    }
    acc = accuracy();
    fmt::print("epoch {}: train loss {:.4f}, firing rate {:.3f}, test accuracy {:.2f} %\n", epoch,
               loss_sum / std::max<int64_t>(steps, 1), mean(layer->r_bar).item<double>(), 100 * acc);
  }
  fmt::print("test accuracy after {} epochs: {:.2f} % ({} training, {} test examples)\n", epochs, 100 * acc, n,
             x_test.size(0));
  return acc >= expect ? 0 : 1;
}

}  // namespace
