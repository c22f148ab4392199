// sample: text from a language model trained by `train --model lm` (nanoGPT's sample.py for this framework).
//
//   ./build/release/tools/sample --run runs/lm --prompt "NAME" --max-new-tokens 300 --temperature 0.8 --top-k 40
//   ./build/release/tools/sample --run runs/lm --prompt-file prompts.txt --seed 3 --stop $'\n\n'
//
// The run's model is rebuilt from RUN/config.json and RUN/best.safetensors (train::load_run; --weights picks another
// file, e.g. ckpt/last.safetensors). Prompts are bytes (the byte-level tasks: text, file:) or, with --prompt-ids,
// token ids. One prompt streams its continuation as it is made; several are decoded together, batched by length, and
// each printed when done. Decoding caches each layer's keys and values where the attention can (dense); ASCender and
// ASAM recompute the sequence at every step (docs/train.md, "Sampling"). The speed goes to stderr.
// Exit codes: 0 done, 1 a runtime error, 2 a bad command line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/format.h"
#include "nn/safetensors.h"
#include "tools/cli.h"
#include "train/run.h"

using namespace asc;
namespace fs = std::filesystem;

namespace {

struct Flags {
  std::string run, weights = "best.safetensors", prompt_file, stop, device;
  std::vector<std::string> prompts, prompt_ids;
  int64_t max_new_tokens = 200, top_k = 0;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  bool no_cache = false;
};

// The prompts as token rows: bytes, or comma-separated ids.
std::vector<std::vector<int64_t>> read_prompts(const Flags& f, int64_t vocab) {
  std::vector<std::string> texts = f.prompts;
  if (!f.prompt_file.empty()) {
    std::ifstream in(f.prompt_file);
    ASC_CHECK(in.good(), "cannot read --prompt-file {}", f.prompt_file);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
      if (!line.empty()) texts.push_back(line);
    }
  }
  std::vector<std::vector<int64_t>> out;
  for (const std::string& t : texts) {
    ASC_CHECK(vocab >= 256, "the run's model has {} tokens, not bytes: give the prompt as --prompt-ids", vocab);
    out.emplace_back(t.begin(), t.end());
    for (int64_t& b : out.back()) b &= 0xFF;  // bytes 0..255 (char may be signed)
  }
  for (const std::string& ids : f.prompt_ids) {
    std::vector<int64_t> row;
    for (const std::string& item : tools::split_list(ids)) {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      ASC_CHECK(!item.empty() && *end == '\0' && v >= 0 && v < vocab,
                "--prompt-ids: '{}' is not a token id of the run's vocabulary [0, {})", item, vocab);
      row.push_back(v);
    }
    out.push_back(row);
  }
  for (const auto& row : out) ASC_CHECK(!row.empty(), "an empty prompt (give at least one byte or id)");
  return out;
}

std::string as_text(const std::vector<int64_t>& ids, bool bytes) {
  std::string s;
  for (int64_t v : ids) s += bytes ? std::string(1, static_cast<char>(v)) : fmt::format("{} ", v);
  return s;
}

int run(const Flags& f) {
  const fs::path config = fs::path(f.run) / "config.json";
  ASC_CHECK(fs::exists(config), "--run {}: no config.json there (a directory written by train)", f.run);
  train::Config c = train::read_config(config.string());
  ASC_CHECK(c.model == "lm", "--run {}: a --model {} run; sample needs a language model (train --model lm)", f.run,
            c.model);
  const fs::path weights = fs::path(f.run) / f.weights;
  ASC_CHECK(fs::exists(weights), "--run {}: no {} (--weights names the file in the run directory)", f.run, f.weights);
  train::Run r = train::load_run(f.run, f.weights, f.device);
  models::DecoderLM& lm = *r.lm;
  const int64_t vocab = lm.options.vocab();
  const bool bytes = f.prompt_ids.empty();
  const std::vector<std::vector<int64_t>> prompts = read_prompts(f, vocab);
  ASC_CHECK(!prompts.empty(), "no prompt: give --prompt TEXT, --prompt-file FILE or --prompt-ids IDS");
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  // The model learnt from windows of max_len tokens: past that many, it continues at distances it never saw
  if (const int64_t context = r.c.max_len; context > 0 && static_cast<int64_t>(longest) + f.max_new_tokens > context)
    fmt::print(stderr,
               "sample: note: a prompt of {} tokens plus {} new ones passes the {} tokens of context the model trained "
               "on (max_len); what comes after that is extrapolated\n",
               longest, f.max_new_tokens, context);

  // Prompts of one length decode together (the LM has no padding mask); each group in its own call.
  std::map<size_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < prompts.size(); ++i) by_len[prompts[i].size()].push_back(i);
  std::vector<std::string> done(prompts.size());
  Generator gen(f.seed);
  int64_t made = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const bool stream = prompts.size() == 1;
  for (const auto& [len, rows] : by_len) {
    std::vector<int64_t> flat;
    for (size_t i : rows) flat.insert(flat.end(), prompts[i].begin(), prompts[i].end());
    const int64_t B = static_cast<int64_t>(rows.size());
    const Tensor prompt = tensor(flat, {B, static_cast<int64_t>(len)}).to(r.device);
    if (stream) fmt::print("{}", as_text(prompts[0], bytes)), std::fflush(stdout);
    models::GenerateOptions o{.max_new_tokens = f.max_new_tokens,
                              .temperature = f.temperature,
                              .top_k = f.top_k,
                              .top_p = f.top_p,
                              .use_cache = !f.no_cache,
                              .generator = &gen};
    o.on_token = [&](const Tensor& next) {
      made += next.numel();
      if (stream) fmt::print("{}", as_text(next.to_vector<int64_t>(), bytes)), std::fflush(stdout);
    };
    if (!f.stop.empty() && bytes)  // every row's continuation holds the stop string
      o.stop_when = [&, len = len](const Tensor& seq) {
        const Tensor tail = seq.narrow(1, static_cast<int64_t>(len), seq.size(1) - static_cast<int64_t>(len));
        const std::vector<int64_t> ids = tail.to(Device::cpu()).to_vector<int64_t>();
        const size_t n = static_cast<size_t>(tail.size(1));
        for (size_t b = 0; b < static_cast<size_t>(tail.size(0)); ++b)
          if (as_text({ids.begin() + b * n, ids.begin() + (b + 1) * n}, true).find(f.stop) == std::string::npos)
            return false;
        return true;
      };
    const Tensor out = lm.generate(prompt, o).to(Device::cpu());
    const std::vector<int64_t> ids = out.to_vector<int64_t>();
    const size_t n = static_cast<size_t>(out.size(1));
    for (size_t b = 0; b < rows.size(); ++b) {
      std::string text = as_text({ids.begin() + b * n, ids.begin() + (b + 1) * n}, bytes);
      if (!f.stop.empty() && bytes) {  // cut after the first stop string of the continuation
        const size_t at = text.find(f.stop, len);
        if (at != std::string::npos) text.resize(at + f.stop.size());
      }
      done[rows[b]] = text;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stream)
    fmt::print("\n"), std::fflush(stdout);  // the text ends before the speed line on a shared terminal
  else
    for (size_t i = 0; i < done.size(); ++i) fmt::print("{}{}\n", i ? "\n---\n" : "", done[i]);
  std::fflush(stdout);
  fmt::print(stderr, "sample: {} tokens in {:.2f} s ({:.0f} tokens/s; {}, {}, {})\n", made, s,
             static_cast<double>(made) / std::max(s, 1e-9),
             !f.no_cache && lm.supports_kv_cache() ? "KV cache" : "recomputed each step", r.device,
             f.temperature > 0 ? fmt::format("temperature {}", f.temperature) : "greedy");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "sample: text from a language model trained by train --model lm, with temperature, top-k, top-p and stop "
      "strings; the continuation on stdout, the speed on stderr",
      "sample"};
  app.set_help_flag("-h,--help", "print this help and exit");
  Flags f;
  app.add_option("--run", f.run, "the run directory (config.json and its weights)")->required()->group("Model");
  app.add_option("--weights", f.weights, "the weights file in the run directory")
      ->capture_default_str()
      ->group("Model");
  app.add_option("--device", f.device, "where to decode (default: the run's)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->group("Model");
  app.add_option("--prompt", f.prompts, "a prompt (several: decoded together, batched by length)")->group("Prompts");
  app.add_option("--prompt-file", f.prompt_file, "a file of prompts, one per line")
      ->check(CLI::ExistingFile)
      ->group("Prompts");
  app.add_option("--prompt-ids", f.prompt_ids, "a prompt of comma-separated token ids (models of a token task)")
      ->group("Prompts");
  app.add_option("--max-new-tokens", f.max_new_tokens, "tokens to add to each prompt")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str()
      ->group("Decoding");
  app.add_option("--temperature", f.temperature, "softmax temperature; 0: greedy")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str()
      ->group("Decoding");
  app.add_option("--top-k", f.top_k, "sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24))
      ->capture_default_str()
      ->group("Decoding");
  app.add_option("--top-p", f.top_p, "sample among the most likely tokens whose probability reaches p")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str()
      ->group("Decoding");
  app.add_option("--seed", f.seed, "seed of the sampling")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return v.empty() || v.find_first_not_of("0123456789") != std::string::npos
                       ? "must be an integer in [0, 2^64 - 1], got '" + v + "'"
                       : "";
          },
          "an integer in [0, 2^64 - 1]"))
      ->capture_default_str()
      ->group("Decoding");
  app.add_option("--stop", f.stop, "end a continuation after this string (bytes)")->group("Decoding");
  app.add_flag("--no-cache", f.no_cache, "recompute the whole sequence at every step (to compare)")->group("Decoding");
  tools::parse_or_exit(app, argc, argv);
  if (f.prompts.empty() && f.prompt_file.empty() && f.prompt_ids.empty())
    tools::usage_error(app, "no prompt: give --prompt TEXT, --prompt-file FILE or --prompt-ids IDS");
  return tools::guarded("sample", [&] { return run(f); });
}
