// predict: a classifier trained by `train` on new inputs — the predicted class and every class's probability.
//
//   ./build/release/tools/predict --run runs/a --images t10k-images-idx3-ubyte.gz --out preds.csv
//   ./build/release/tools/predict --run runs/mine --text reviews.txt --out preds.jsonl
//   ./build/release/tools/predict --run runs/lo --ids expressions.txt
//
// The run's model is rebuilt from RUN/config.json and RUN/best.safetensors (--weights for another file), and the
// inputs are prepared as its task prepared its own (data::image_inputs / text_inputs / id_inputs): images as pixel
// tokens or [0, 1] floats, average-pooled to the run's --image-size; text lines as bytes (--tsv: those after the first
// tab), cut at the model's length; token ids checked against its vocabulary. Output: CSV (one row per input: its line,
// the predicted class, its name where the task names its classes, then p_0 ... p_{C-1}) or JSON lines (.jsonl), to
// --out or stdout. Progress goes to stderr. Exit codes: 0 done, 1 a runtime error, 2 a bad command line.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/format.h"
#include "nn/safetensors.h"
#include "tools/cli.h"
#include "train/step.h"

using namespace asc;
namespace fs = std::filesystem;

namespace {

struct Flags {
  std::string run, weights = "best.safetensors", device, images, text, tsv, ids, out, progress = "auto";
  int64_t batch = 64;
};

std::string csv_field(const std::string& s) {  // quoted when it holds a comma, quote or newline
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

int run(const Flags& f) {
  const fs::path config = fs::path(f.run) / "config.json";
  ASC_CHECK(fs::exists(config), "--run {}: no config.json there (a directory written by train)", f.run);
  train::Config c = train::read_config(config.string());
  ASC_CHECK(c.model != "lm", "--run {}: a language model; sample continues its text", f.run);
  const fs::path weights = fs::path(f.run) / f.weights;
  ASC_CHECK(fs::exists(weights), "--run {}: no {} (--weights names the file in the run directory)", f.run, f.weights);
  train::Run r = train::load_run(f.run, f.weights, f.device);
  const data::Task& task = r.task;

  // the inputs, prepared as the run's task prepared its examples
  data::Inputs in;
  const bool image_task = c.task == "fashion-mnist" || c.task == "fashion-mnist-seq" || c.task == "pathfinder";
  if (!f.images.empty()) {
    ASC_CHECK(image_task, "--images: the run's task '{}' does not read images (use --text or --ids)", c.task);
    in = data::image_inputs(data::read_idx(f.images), c.task != "fashion-mnist", c.image_size);
  } else if (!f.text.empty() || !f.tsv.empty()) {
    ASC_CHECK(!image_task && task.vocab >= 256, "--text / --tsv: the run's model reads {} (task '{}'), not bytes",
              image_task ? "images" : "token ids", c.task);
    in = data::text_inputs(f.text.empty() ? f.tsv : f.text, !f.tsv.empty(), task.max_len);
  } else {
    ASC_CHECK(!image_task, "--ids: the run's task '{}' reads images (use --images)", c.task);
    in = data::id_inputs(f.ids, task.vocab, task.max_len);
  }
  const int64_t n = in.examples->size(), C = task.classes;
  if (!f.images.empty())  // the images' size, after the pooling, must be the one the model was trained on
    ASC_CHECK(in.examples->get(0).input.numel() == task.max_len,
              "--images: {} images give {} values an input; the run's model reads {} (its task's images, pooled to "
              "--image-size {})",
              f.images, in.examples->get(0).input.numel(), task.max_len, c.image_size);

  tools::Progress progress(n, "predict");
  const Tensor probs = train::predict_probabilities(r, *in.examples, f.batch, [&](int64_t done) {
    if (f.progress != "none") progress.update(done);
  });  // (N, C) float64
  if (f.progress != "none") progress.finish();
  const std::vector<double> p = probs.to_vector<double>();

  const bool jsonl = f.out.ends_with(".jsonl");
  std::string text;
  if (!jsonl) {
    text = "line,prediction,class";
    for (int64_t k = 0; k < C; ++k) text += fmt::format(",p_{}", k);
    text += "\n";
  }
  for (int64_t i = 0; i < n; ++i) {
    const double* row = p.data() + i * C;
    const int64_t best = std::max_element(row, row + C) - row;
    const std::string name =
        static_cast<int64_t>(task.class_names.size()) == C ? task.class_names[static_cast<size_t>(best)] : "";
    if (jsonl) {
      tools::Json j = {{"line", in.lines[static_cast<size_t>(i)]},
                       {"prediction", best},
                       {"class", name},
                       {"probabilities", std::vector<double>(row, row + C)}};
      text += j.dump() + "\n";
    } else {
      text += fmt::format("{},{},{}", in.lines[static_cast<size_t>(i)], best, csv_field(name));
      for (int64_t k = 0; k < C; ++k) text += fmt::format(",{:.6g}", row[k]);
      text += "\n";
    }
  }
  if (f.out.empty())
    fmt::print("{}", text);
  else
    write_file_atomic(f.out, text);
  fmt::print(stderr, "predict: {} inputs, {} classes{}\n", n, C, f.out.empty() ? "" : "; wrote " + f.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "predict: a classifier trained by train on new inputs (IDX images, text lines, token ids): the predicted class "
      "and every class's probability, as CSV or JSON lines",
      "predict"};
  app.set_help_flag("-h,--help", "print this help and exit");
  Flags f;
  app.add_option("--run", f.run, "the run directory (config.json and its weights)")->required()->group("Model");
  app.add_option("--weights", f.weights, "the weights file in the run directory")
      ->capture_default_str()
      ->group("Model");
  app.add_option("--device", f.device, "where to compute (default: the run's)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->group("Model");
  auto* images = app.add_option("--images", f.images, "an IDX file of images (N, rows, cols), gzip or plain")
                     ->check(CLI::ExistingFile)
                     ->group("Inputs (one of)");
  auto* text = app.add_option("--text", f.text, "a text file, one input per line (its bytes)")
                   ->check(CLI::ExistingFile)
                   ->group("Inputs (one of)");
  auto* tsv = app.add_option("--tsv", f.tsv, "a TSV file, one input per line: the text after the first tab")
                  ->check(CLI::ExistingFile)
                  ->group("Inputs (one of)");
  auto* ids = app.add_option("--ids", f.ids, "a file of token ids, one input per line (spaces or commas between)")
                  ->check(CLI::ExistingFile)
                  ->group("Inputs (one of)");
  images->excludes(text)->excludes(tsv)->excludes(ids);
  text->excludes(tsv)->excludes(ids);
  tsv->excludes(ids);
  app.add_option("--out", f.out, "the predictions: FILE.csv or FILE.jsonl (default: CSV on stdout)")->group("Output");
  app.add_option("--batch", f.batch, "inputs per batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str()
      ->group("Output");
  app.add_option("--progress", f.progress, "auto | none")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str()
      ->group("Output");
  tools::parse_or_exit(app, argc, argv);
  if (f.images.empty() && f.text.empty() && f.tsv.empty() && f.ids.empty())
    tools::usage_error(app, "no inputs: give --images, --text, --tsv or --ids");
  if (!f.out.empty() && !f.out.ends_with(".csv") && !f.out.ends_with(".jsonl"))
    tools::usage_error(app, fmt::format("--out {}: the file must end in .csv or .jsonl", f.out));
  return tools::guarded("predict", [&] { return run(f); });
}
