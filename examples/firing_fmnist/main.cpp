// docs/firing.md's firing-perceptron snippet as a program: the layer and the learning rule exactly as that page writes
// them ("Using it"), with a linear readout and a training loop added, trained on Fashion-MNIST.
//
//   firing_fmnist [--data DIR] [--epochs 3] [--limit N] [--test-limit N] [--expect ACC]
//
// DIR holds the four IDX files (gzip-compressed, as Debian's dataset-fashion-mnist installs them; default:
// $ASC_FMNIST_DIR, else /usr/share/datasets/fashion-mnist), read by the library's task (data/tasks.h: the first 55000
// training images; the last 5000 are its validation split, unused here) and batched by asc::data::DataLoader (shuffled
// with seed 1).
// --limit / --test-limit train / test on the first N examples only;
// --expect fails (exit 1) when the final test accuracy is below ACC. Exit code 77 when the dataset is not there, so
// a test that runs this program is skipped rather than failed.
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

#include "ascender.h"
#include "data/loader.h"
#include "data/tasks.h"

using namespace asc;

namespace {

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
    fmt::print(
        "firing_fmnist: no Fashion-MNIST in {} (apt-get install dataset-fashion-mnist, or --data DIR): "
        "skipped\n",
        dir);
    return 77;
  }
  const data::Task task =
      data::make_task("fashion-mnist", {.train_size = limit, .test_size = test_limit, .data_dir = dir});
  manual_seed(0);

  // ---- as docs/firing.md writes them ----
  auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(784, 128).threshold(0.1));  // W (128, 784)
  optim::Adam opt(layer->parameters(), {.lr = 1e-3});
  // + rule B: Oja and homeostasis beside backprop
  opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 1e-5, .z_ref = 0.3, .r_target = 0.3, .w_min = -1}));
  // ---- added: a linear readout of the 128 neurons, trained with them, and the loop ----
  auto readout = std::make_shared<nn::Linear>(128, 10);
  opt.add_param_group(readout->parameters(), {.lr = 1e-3});
  auto logits = [&](const data::Batch& b) {
    return (*readout)((*layer)(b.input.reshape({b.size(), 784})));  // images (B, 28, 28) -> (B, 10)
  };

  auto accuracy = [&] {
    NoGradGuard no_grad;
    layer->eval();
    double correct = 0;
    data::for_each_batch(*task.test, 1000, 0, [&](const data::Batch& b) {
      correct += sum(eq(argmax(logits(b), -1), b.labels).to(kFloat64)).item<double>();
    });
    layer->train();
    return correct / static_cast<double>(task.test->size());
  };
  data::DataLoader loader(task.train, {.batch_size = 64, .seed = 1});
  double acc = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    for (int64_t step = 0; step < loader.batches_per_epoch(); ++step) {
      const data::Batch b = loader.next();
      opt.zero_grad();
      Tensor loss = cross_entropy(logits(b), b.labels);
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>();
    }
    acc = accuracy();
    fmt::print("epoch {}: train loss {:.4f}, firing rate {:.3f}, test accuracy {:.2f} %\n", epoch,
               loss_sum / static_cast<double>(loader.batches_per_epoch()), mean(layer->r_bar).item<double>(),
               100 * acc);
  }
  fmt::print("test accuracy after {} epochs: {:.2f} % ({} training, {} test examples)\n", epochs, 100 * acc,
             task.train->size(), task.test->size());
  return acc >= expect ? 0 : 1;
}

}  // namespace
