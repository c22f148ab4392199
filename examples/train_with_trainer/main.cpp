// Training from C++ with the trainer library (train/trainer.h): the same runs as the `train` tool, driven by a
// program. It trains an ASCender classifier on the synthetic grouping task (no download), stops early through a
// callback of its own once validation reaches --target, tests the model selected on validation, and rebuilds that
// model from the run directory (load_run) to check it scores the same.
//
//   train_with_trainer [--out DIR] [--steps N] [--target ACC]
//
// DIR receives what `train --out DIR` writes (config.json, metrics.csv, summary.json, best.safetensors, ...).
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>

#include "train/trainer.h"

using namespace asc;

namespace {

constexpr const char* kUsage =
    "usage: train_with_trainer [--out DIR] [--steps N] [--target ACC]\n"
    "  --out DIR      the run directory, which must not hold a run yet (default runs/train_with_trainer)\n"
    "  --steps N      optimizer steps, 1..100000 (default 200)\n"
    "  --target ACC   stop once the validation accuracy reaches ACC, in [0, 1] (default 1: never early)\n";

// Stops the loop at the first validation at or above the target (the trainer writes a checkpoint first).
class EarlyStop : public train::Callback {
 public:
  explicit EarlyStop(double target) : target_(target) {}
  void on_row(train::Trainer&, const train::Row& row) override {
    if (row.split == "val") {
      fmt::print("step {:4}  val accuracy {:.1f}%\n", row.step, 100 * row.accuracy);
      reached_ = reached_ || row.accuracy >= target_;
    }
  }
  bool should_stop(train::Trainer&) override { return reached_; }

 private:
  double target_;
  bool reached_ = false;
};

template <class T>
std::optional<T> parse(const std::string& s, T lo, T hi) {
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !(v >= lo && v <= hi)) return std::nullopt;
  return v;
}

int usage_error(const std::string& message) {
  fmt::print(stderr, "train_with_trainer: {}\n{}", message, kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  train::Config c;  // every option of the `train` tool, with its defaults
  c.task = "grouping", c.model = "ascender", c.d_model = 32, c.heads = 2, c.layers = 1, c.ffn = 64;
  c.train_size = 2000, c.steps = 200, c.batch = 32, c.lr = 3e-3, c.progress = "none";
  c.out = "runs/train_with_trainer";
  double target = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return fmt::print("{}", kUsage), 0;
    if (i + 1 >= argc) return usage_error("missing value for " + flag);
    const std::string value = argv[++i];
    if (flag == "--out") {
      c.out = value;
    } else if (flag == "--steps") {
      auto v = parse<int64_t>(value, 1, 100000);
      if (!v) return usage_error("bad value '" + value + "' for --steps");
      c.steps = *v;
    } else if (flag == "--target") {
      auto v = parse<double>(value, 0.0, 1.0);
      if (!v) return usage_error("bad value '" + value + "' for --target");
      target = *v;
    } else {
      return usage_error("unknown option " + flag);
    }
  }
  try {
    train::Trainer t(c);
    t.add_callback(std::make_shared<EarlyStop>(target));
    const bool finished = t.fit();
    fmt::print("{} at step {} (best validation at step {})\n", finished ? "trained" : "stopped early", t.state().step,
               t.state().best_step);
    const train::TestResult r = t.test();
    t.write_summary(r);
    // The model selected on validation, rebuilt from the run directory alone, scores the same on the test split.
    train::Run again = train::load_run(c.out);
    train::MechStats mech(again);
    const train::EvalResult e = train::evaluate(again, *again.task.test, 0, mech, false);
    const bool same = e.accuracy == r.test.accuracy;
    fmt::print("test accuracy {:.2f}%; the model rebuilt from {} scores {:.2f}%: {}\n", 100 * r.test.accuracy, c.out,
               100 * e.accuracy, same ? "the same" : "DIFFERENT");
    return same ? 0 : 1;
  } catch (const Error& e) {
    fmt::print(stderr, "train_with_trainer: {}\n", e.what());
    return 1;
  }
}
