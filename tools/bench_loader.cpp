// Loader benchmark (not a test): is the data loader ever a training step's bottleneck? For each task, the same
// training step (a small dense Transformer classifier, AdamW) is fed two ways, in alternating rounds:
//   loader    asc::data::DataLoader with its prefetch thread (batches built while the step runs)
//   memory    the same batches, built by an identical loader before the round and read from a vector
// Both see exactly the same batches (same seed, same order), so the only difference is the loader. Reported: the
// median time per step of each over the rounds, and loader / memory − 1 (the target: at most 5 %).
//   ./build/release/tools/bench_loader [--tasks fashion-mnist-seq,listops] [--batch 32] [--steps 10] [--rounds 4]
//                                      [--prefetch 2] [--d-model 64] [--layers 1] [--csv F] [--json F]
// The model is deliberately small (the loader's share is largest when the step is cheap).
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "ascender.h"
#include "data/loader.h"
#include "data/tasks.h"
#include "models/transformer_classifier.h"
#include "tools/cli.h"

using namespace asc;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> tasks = {"fashion-mnist-seq", "listops"};
  int64_t batch = 32, steps = 10, rounds = 4, prefetch = 2, d_model = 64, layers = 1, train_size = 2048;
  tools::Outputs out;
  CLI::App app{
      "bench_loader: a training step fed by the prefetching DataLoader against the same batches built in "
      "memory beforehand, alternating rounds",
      "bench_loader"};
  tools::add_name_list(app, "--tasks", tasks, "tasks (data/tasks.h)",
                       {"fashion-mnist-seq", "listops", "text", "pathfinder", "grouping"});
  app.add_option("--batch", batch, "batch size")->check(tools::int_range(1, 4096))->capture_default_str();
  app.add_option("--steps", steps, "training steps per round")
      ->check(tools::int_range(1, 100000))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds of each feeding (alternating)")
      ->check(tools::int_range(1, 1000))
      ->capture_default_str();
  app.add_option("--prefetch", prefetch, "the loader's prefetch depth")
      ->check(tools::int_range(1, 64))
      ->capture_default_str();
  app.add_option("--d-model", d_model, "model width (4 heads)")
      ->check(tools::int_range(4, 4096))
      ->capture_default_str();
  app.add_option("--layers", layers, "Transformer blocks")->check(tools::int_range(1, 64))->capture_default_str();
  app.add_option("--train-size", train_size, "training examples the loader draws from")
      ->check(tools::int_range(1, 1 << 24))
      ->capture_default_str();
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  if (d_model % 4) tools::usage_error(app, fmt::format("--d-model {} is not divisible by the 4 heads", d_model));

  tools::ProfileRun profile_run(out.profile);

  return tools::guarded("bench_loader", [&] {
    tools::Table table({"task", "T", "batch", "steps", "rounds", "loader_ms", "memory_ms", "overhead_pct"});
    fmt::print("{:<20} {:>6} {:>12} {:>12} {:>10}\n", "task", "T", "loader ms", "memory ms", "overhead");
    tools::Progress progress(static_cast<int64_t>(tasks.size()) * rounds * 2, "bench_loader");
    int64_t done = 0;
    for (const std::string& name : tasks) {
      data::Task task = data::make_task(name, {.seed = 0, .train_size = train_size, .val_size = 1, .test_size = 1});
      manual_seed(0);
      models::TransformerClassifier model(models::TransformerClassifierOptions(task.vocab, task.max_len, task.classes)
                                              .d_model(d_model)
                                              .heads(4)
                                              .ffn(2 * d_model)
                                              .layers(layers)
                                              .dropout(0));
      optim::AdamW opt(model.parameters(), {.lr = 1e-4});
      const data::LoaderOptions lo{
          .batch_size = batch, .seed = 1, .drop_last = true, .prefetch = prefetch, .pad_id = task.pad_id};
      auto step = [&](const data::Batch& b) {
        opt.zero_grad();
        cross_entropy(model.forward(b.input, b.valid), b.labels).backward();
        opt.step();
      };
      step(data::DataLoader(task.train, lo).next());  // warm-up: allocator blocks, thread pool
      std::vector<double> with_loader, in_memory;
      int64_t T = 0;
      for (int64_t r = 0; r < rounds; ++r) {
        // The round's batches, the same for both feedings: round r reads steps [r * steps, (r + 1) * steps).
        data::LoaderState at{.epoch = 0, .position = 0, .seed = 1};
        {
          data::DataLoader probe(
              task.train, {.batch_size = batch, .seed = 1, .drop_last = true, .prefetch = 0, .pad_id = task.pad_id});
          const int64_t first = r * steps;
          at.epoch = first / probe.batches_per_epoch(), at.position = first % probe.batches_per_epoch();
        }
        for (int feeding = 0; feeding < 2; ++feeding) {
          const bool loader_first = r % 2 == 0;  // alternate which goes first, so drift hits both alike
          const bool use_loader = (feeding == 0) == loader_first;
          data::LoaderOptions options = lo;
          if (!use_loader) options.prefetch = 0;  // built on this thread, before the clock starts
          data::DataLoader loader(task.train, options);
          loader.set_state(at);
          std::vector<data::Batch> ready;
          if (!use_loader)
            for (int64_t s = 0; s < steps; ++s) ready.push_back(loader.next());
          const auto t0 = Clock::now();
          for (int64_t s = 0; s < steps; ++s) {
            data::Batch b = use_loader ? loader.next() : ready[static_cast<size_t>(s)];
            T = std::max(T, b.input.size(1));
            step(b);
          }
          const double ms =
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / static_cast<double>(steps);
          (use_loader ? with_loader : in_memory).push_back(ms);
          progress.update(++done, fmt::format("{} round {}", name, r + 1));
        }
      }
      const double a = median(with_loader), m = median(in_memory), pct = 100 * (a / m - 1);
      progress.clear();
      fmt::print("{:<20} {:>6} {:>12.2f} {:>12.2f} {:>9.1f}%\n", name, T, a, m, pct);
      table.add({tools::Cell::str(name), tools::Cell::integer(T), tools::Cell::integer(batch),
                 tools::Cell::integer(steps), tools::Cell::integer(rounds), tools::Cell::fixed(a, 3),
                 tools::Cell::fixed(m, 3), tools::Cell::fixed(pct, 2)});
    }
    progress.finish();
    tools::Json facts = tools::run_facts("bench_loader", argc, argv);
    return tools::write_results(table, out, facts, /*announce=*/true) ? 0 : 1;
  });
}
