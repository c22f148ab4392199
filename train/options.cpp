// The trainer's option table (train/options.h).
#include "train/options.h"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/format.h"
#include "data/tasks.h"
#include "nn/asam_attention.h"
#include "ops/geometry.h"
#include "optim/firing_rules.h"

namespace asc::train {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

// ---- what each option accepts ---------------------------------------------------------------------------------
//
// Every value is checked as text, before CLI11 converts it into the option's field, so that nothing is clamped,
// wrapped or coerced: an integer is an integer within its range (2^63 is not clamped, -1 is not a seed), a real is
// a finite number within its range (1e400 is not infinity), a boolean is true or false (2 is not true), a name is
// one of the choices. The messages state the accepted range; the help shows it.

constexpr int64_t kMaxSteps = 1'000'000'000'000;              // steps, step counters and intervals: more is a typo
constexpr int64_t kMaxCount = 1'000'000'000;                  // examples, sizes
constexpr int64_t kMaxLen = int64_t{1} << 24;                 // tokens of a sequence, windows
constexpr double kHuge = std::numeric_limits<double>::max();  // the top of "any finite number"

std::string show(double v) {
  if (v >= kHuge) return "inf";
  if (v <= -kHuge) return "-inf";
  return fmt::format("{}", v);
}

struct IntRange {
  int64_t lo, hi;
  std::string text() const { return fmt::format("an integer in [{}, {}]", lo, hi); }
};
struct RealRange {
  double lo, hi;
  bool open_lo = false;          // (lo, hi] instead of [lo, hi]
  bool allow_minus_one = false;  // -1 also accepted: "the default" (the rules' rates, ASAM's learned gate)
  std::string text() const {
    if (lo <= -kHuge && hi >= kHuge) return "a finite number";
    if (hi >= kHuge) return fmt::format("{}a number {} {}", allow_minus_one ? "-1 or " : "", open_lo ? ">" : ">=", lo);
    return fmt::format("{}a number in {}{}, {}]", allow_minus_one ? "-1 or " : "", open_lo ? "(" : "[", show(lo),
                       show(hi));
  }
};
using Choices = std::vector<std::string>;

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data() + (!s.empty() && s[0] == '+'), end, v);
  if (s.empty() || r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

CLI::Validator int_check(IntRange r) {
  return CLI::Validator(
      [r](std::string& s) -> std::string {
        const auto v = parse_int(s);
        if (!v || *v < r.lo || *v > r.hi) return fmt::format("must be {}, got '{}'", r.text(), s);
        return "";
      },
      r.text());
}

CLI::Validator seed_check() {  // the full unsigned 64-bit range, and nothing else
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto res = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size())
          return fmt::format("must be an integer in [0, 2^64 - 1], got '{}'", s);
        return "";
      },
      "an integer in [0, 2^64 - 1]");
}

CLI::Validator real_check(RealRange r) {
  return CLI::Validator(
      [r](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s.c_str(), &end);
        const bool number = !s.empty() && *end == '\0' && std::isfinite(v) && errno != ERANGE;
        const bool in = number && ((r.allow_minus_one && v == -1) || ((r.open_lo ? v > r.lo : v >= r.lo) && v <= r.hi));
        if (!in) return fmt::format("must be {}, got '{}'", r.text(), s);
        return "";
      },
      r.text());
}

CLI::Validator bool_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "true" || s == "false" || s == "1" || s == "0") return "";
        return fmt::format("must be true or false, got '{}'", s);
      },
      "true | false");
}

CLI::Validator choice_check(Choices choices, bool file_task = false) {
  std::string all;
  for (const auto& c : choices) all += (all.empty() ? "" : " | ") + c;
  if (file_task) all += " | file:PATH";
  return CLI::Validator(
      [choices, all, file_task](std::string& s) -> std::string {
        if (std::find(choices.begin(), choices.end(), s) != choices.end()) return "";
        if (file_task && s.size() > 5 && s.starts_with("file:")) return "";
        return fmt::format("must be one of {}, got '{}'", all, s);
      },
      all);
}

// The kind of value an option holds, as config.json must give it (a JSON integer for an integer option, ...).
enum class Kind { Int, Seed, Real, Bool, String, IntList, RealList, StringList };

// One option: its config.json key, kind, and how it writes itself there.
struct OptionIO {
  std::string key;
  Kind kind;
  std::function<void(json&)> save;  // empty: an option of one process, not of the run (a flag only)
};

std::string flag_of(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

class Options {
 public:
  explicit Options(CLI::App& app) : app_(app) {}
  // The help's heading of the options added from now on.
  void group(std::string name) { group_ = std::move(name); }
  CLI::Option* add(const std::string& key, int64_t& f, const std::string& help, IntRange r) {
    return bind(key, f, help, Kind::Int)->check(int_check(r));
  }
  // An option of this process only (how far it trains, what it profiles): a flag, not in config.json.
  CLI::Option* add_process_option(const std::string& key, int64_t& f, const std::string& help, IntRange r) {
    CLI::Option* o = bind(key, f, help, Kind::Int)->check(int_check(r));
    io_.back().save = nullptr;
    return o;
  }
  CLI::Option* add(const std::string& key, uint64_t& f, const std::string& help) {
    return bind(key, f, help, Kind::Seed)->check(seed_check());
  }
  CLI::Option* add(const std::string& key, double& f, const std::string& help, RealRange r) {
    return bind(key, f, help, Kind::Real)->check(real_check(r));
  }
  CLI::Option* add(const std::string& key, bool& f, const std::string& help) {
    return bind(key, f, help, Kind::Bool)->check(bool_check());
  }
  CLI::Option* add(const std::string& key, std::string& f, const std::string& help, const Choices& c = {}) {
    CLI::Option* o = bind(key, f, help, Kind::String);
    return c.empty() ? o : o->check(choice_check(c));
  }
  CLI::Option* add(const std::string& key, std::vector<int64_t>& f, const std::string& help, IntRange r) {
    return bind(key, f, help, Kind::IntList)->check(int_check(r));
  }
  CLI::Option* add(const std::string& key, std::vector<double>& f, const std::string& help, RealRange r) {
    return bind(key, f, help, Kind::RealList)->check(real_check(r));
  }
  CLI::Option* add(const std::string& key, std::vector<std::string>& f, const std::string& help, const Choices& c) {
    return bind(key, f, help, Kind::StringList)->check(choice_check(c));
  }
  json save() const {
    json j;
    for (const auto& o : io_)
      if (o.save) o.save(j);
    return j;
  }
  // The options of a config.json as command-line arguments, so that CLI11 parses and validates them exactly like
  // flags. Keys must be known options (a typo in a config file is an error, not silently ignored) and each value of
  // its option's JSON type: an integer for an integer option (not 5.0 or "5"), true / false for a boolean, a string
  // for a name, an array (or one value) for a list.
  std::vector<std::string> to_args(const json& j) const {
    ASC_CHECK(j.is_object(), "expected a JSON object of options, got {}", j.type_name());
    std::vector<std::string> args;
    for (const auto& [key, value] : j.items()) {
      if (key == "git_commit" || key == "command") continue;  // provenance written beside the options
      const auto io = std::find_if(io_.begin(), io_.end(), [&](const OptionIO& o) { return o.key == key; });
      ASC_CHECK(io != io_.end(), "unknown option '{}'", key);
      ASC_CHECK(io->save != nullptr, "'{}' is an option of one process, not of the run: give it as a flag ({})", key,
                flag_of(key));
      std::string v;
      const bool list = io->kind == Kind::IntList || io->kind == Kind::RealList || io->kind == Kind::StringList;
      if (list && value.is_array()) {
        if (value.empty()) continue;  // an empty list: the option's default
        for (const json& item : value) v += (v.empty() ? "" : ",") + text(key, io->kind, item);
      } else {
        v = text(key, io->kind, value);
        // An empty string is the option's default (every string option's default here is empty or a path the file
        // states): CLI11 reads "--opt=" as an option without its value, which would take the next argument as it.
        if (v.empty()) continue;
      }
      args.push_back(flag_of(key) + "=" + v);
    }
    return args;
  }

 private:
  template <class T>
  CLI::Option* bind(const std::string& key, T& field, const std::string& help, Kind kind) {
    io_.push_back({key, kind, [key, &field](json& j) { j[key] = field; }});
    CLI::Option* o = app_.add_option(flag_of(key), field, help)->capture_default_str()->group(group_);
    if constexpr (requires { field.begin(); } && !std::is_same_v<T, std::string>)
      o->delimiter(',');
    else
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last one counts
    return o;
  }
  // One JSON value of option `key` as the text of a flag, or asc::Error naming the key when its type is wrong.
  static std::string text(const std::string& key, Kind kind, const json& v) {
    switch (kind) {
      case Kind::Int:
      case Kind::Seed:
      case Kind::IntList:
        ASC_CHECK(v.is_number_integer() || v.is_number_unsigned(), "'{}' must be an integer, got {} ({})", key,
                  v.dump(), v.type_name());
        return v.dump();
      case Kind::Real:
      case Kind::RealList:
        ASC_CHECK(v.is_number(), "'{}' must be a number, got {} ({})", key, v.dump(), v.type_name());
        return v.is_number_float() ? fmt::format("{:.17g}", v.get<double>()) : v.dump();
      case Kind::Bool:
        ASC_CHECK(v.is_boolean(), "'{}' must be true or false, got {} ({})", key, v.dump(), v.type_name());
        return v.get<bool>() ? "true" : "false";
      case Kind::String:
      case Kind::StringList:
        ASC_CHECK(v.is_string(), "'{}' must be a string, got {} ({})", key, v.dump(), v.type_name());
        return v.get<std::string>();
    }
    return "";
  }
  CLI::App& app_;
  std::vector<OptionIO> io_;
  std::string group_ = "Options";
};

// The ranges the options share.
constexpr IntRange kSize{0, kMaxCount}, kPositive{1, kMaxCount}, kSteps{0, kMaxSteps}, kLen{0, kMaxLen},
    kPositiveLen{1, kMaxLen};
constexpr RealRange kPositiveReal{0, kHuge, true}, kNonnegReal{0, kHuge}, kAnyReal{-kHuge, kHuge},
    kProbability{0, 0.99};

// make_task's names but file:PATH (a prefix, checked apart).
Choices named_tasks() {
  Choices out;
  for (const std::string& n : data::task_names())
    if (!n.starts_with("file:")) out.push_back(n);
  return out;
}

void define_task_and_model(Options& o, Config& c) {
  o.group("Task and data");
  o.add("task", c.task, "the task (docs/data.md); file:PATH a TSV / CSV file of your own")
      ->check(choice_check(named_tasks(), /*file_task=*/true));
  o.add("image_size", c.image_size,
        "image tasks: side after average pooling (fashion-mnist 28 -> 14: 196 tokens); 0 native", IntRange{0, 4096});
  o.add("train_size", c.train_size, "examples of the training split (0: the task's default)", kSize);
  o.add("val_size", c.val_size, "examples of the validation split (0: default)", kSize);
  o.add("test_size", c.test_size, "examples of the test split (0: default)", kSize);
  o.add("min_len", c.min_len, "generated / read sequences: minimum length (0: the task's default)", kLen);
  o.add("max_len", c.max_len, "maximum length (0: the task's default)", kLen);
  o.add("data_dir", c.data_dir, "where a file task's data lives (empty: its default)");
  o.add("data_seed", c.data_seed, "seed of generated data and file splits (kept apart from --seed)");
  o.add("pathfinder_size", c.pathfinder_size,
        "pathfinder: side the scene is drawn at, before pooling to --image-size (0: 32)", IntRange{0, 256});
  o.add("path_steps", c.path_steps, "pathfinder: steps of each long path, its length (0: 12)", IntRange{0, 1000});
  o.add("distractors", c.distractors, "pathfinder: short paths without dots (-1: 3)", IntRange{-1, 1000});
  o.add("pathfinder_solid", c.pathfinder_solid, "pathfinder: paths drawn solid instead of dashed (easier)");
  o.group("Model");
  o.add("model", c.model, "the model: attention classifiers, the firing network and its MLP baseline, a byte-level LM",
        {"dense", "ascender", "asam", "window", "window-global", "firing", "mlp", "lm"});
  o.add("positional", c.positional, "positional encoding of the classifiers (the LM: rope, which its default becomes)",
        {"learned", "sinusoidal", "none", "rope", "alibi"});
  o.add("d_model", c.d_model, "model width (a multiple of --heads)", IntRange{1, 65536});
  o.add("heads", c.heads, "attention heads", IntRange{1, 1024});
  o.add("layers", c.layers, "Transformer blocks", IntRange{1, 1024});
  o.add("ffn", c.ffn, "feed-forward width", IntRange{1, 1 << 20});
  o.add("dropout", c.dropout, "dropout probability (residual and feed-forward)", kProbability);
  o.add("attn_dropout", c.attn_dropout,
        "dropout on the attention probabilities (dense, ascender; ASCender's fused "
        "kernels have none: > 0 runs its composed reference, several times slower)",
        kProbability);
  o.add("norm_first", c.norm_first, "pre-norm blocks (false: post-norm)");
}

void define_mechanisms(Options& o, Config& c) {
  o.group("ASCender attention (--model ascender, --lm-attention ascender)");
  o.add("k", c.k, "ASCender: neighbourhood size per head (one value: every head), e.g. 4,8,16,32", kPositiveLen);
  o.add("tau_sep", c.tau_sep, "ASCender: separation kernel temperature per head", kPositiveReal);
  o.add("tau_coh", c.tau_coh, "ASCender: cohesion kernel temperature per head", kPositiveReal);
  o.add("alpha_align", c.alpha_align, "ASCender: alignment gate sharpness per head", kNonnegReal);
  o.add("alpha_coh", c.alpha_coh, "ASCender: cohesion gate sharpness per head", kNonnegReal);
  o.add("gate_position", c.gate_position, "ASCender: gates before or after the row normalisation", {"before", "after"});
  o.add("asc_mode", c.asc_mode,
        "ASCender: every pair, a window and global tokens, or the first layer's neighbours reused",
        {"full", "windowed", "reuse"});
  o.add("asc_window", c.asc_window, "ASCender windowed mode: window", kPositiveLen);
  o.add("asc_global", c.asc_global, "ASCender windowed mode: global tokens", kLen);
  o.add("use_align", c.use_align, "ASCender: the alignment term (ablation switch)");
  o.add("use_sep", c.use_sep, "ASCender: the separation term");
  o.add("use_coh", c.use_coh, "ASCender: the cohesion term");
  o.add("include_self", c.include_self, "ASCender: a token may be its own neighbour");
  o.add("omega_init", c.omega_init, "ASCender: initial omega of the three terms", kAnyReal);
  o.add("omega_warmup", c.omega_warmup, "ASCender: steps over which the omegas ramp up from 0", kSteps);
  o.add("sep_start", c.sep_start, "ASCender: step from which separation is on", kSteps);
  o.add("aux_align", c.aux_align, "ASCender: auxiliary alignment loss weight", kNonnegReal);
  o.add("aux_sep", c.aux_sep, "ASCender: auxiliary separation loss weight", kNonnegReal);
  o.add("aux_coh", c.aux_coh, "ASCender: auxiliary cohesion loss weight", kNonnegReal);
  o.add("aux_start", c.aux_start,
        "ASCender: step from which the auxiliary losses count (-1: from the end of --omega-warmup)",
        IntRange{-1, kMaxSteps});
  o.group("ASAM attention (--model asam / window / window-global, --lm-attention asam)");
  o.add("asam_patterns", c.asam_patterns,
        "ASAM: sparse patterns, from window,strided,global,random,clustered,hierarchical", nn::asam_pattern_names());
  o.add("asam_window", c.asam_window, "ASAM: local window w (also the window models')", kPositiveLen);
  o.add("asam_stride", c.asam_stride, "ASAM: stride", kPositiveLen);
  o.add("asam_global", c.asam_global, "ASAM: global tokens (also window-global's)", kLen);
  o.add("asam_random", c.asam_random, "ASAM: random keys per query", kPositiveLen);
  o.add("asam_clusters", c.asam_clusters, "ASAM: centroids per head (clustered)", IntRange{1, 65536});
  o.add("fixed_gate", c.fixed_gate, "ASAM: a constant gate in [0, 1] (1: sparse only); -1: learned",
        RealRange{0, 1, false, true});
  o.add("gate_tau", c.gate_tau, "ASAM: gate temperature", kPositiveReal);
  o.add("cluster_loss", c.cluster_loss, "ASAM: weight of the centroids' k-means loss", kNonnegReal);
  o.group("Firing network and its baseline (--model firing / mlp)");
  o.add("firing_hidden", c.firing_hidden, "firing: neurons of the first layer", IntRange{1, 1 << 20});
  o.add("fan_out", c.fan_out, "firing: outputs per neuron (the second layer's neurons)", IntRange{1, 1024});
  o.add("mlp_hidden", c.mlp_hidden,
        "mlp: hidden widths (ReLU between), e.g. 256 (about the firing network's size) "
        "or 512,128",
        IntRange{1, 1 << 20});
  o.add("firing_backward", c.firing_backward, "firing: the hard gate's backward", {"exact", "ste", "surrogate"});
  o.add("surrogate", c.surrogate, "firing: surrogate derivative", surrogate_names());
  o.add("surrogate_width", c.surrogate_width, "firing: surrogate width", kPositiveReal);
  o.add("threshold", c.threshold, "firing: initial threshold SP", kAnyReal);
  o.add("firing_init", c.firing_init, "firing: the sign of the initial weights", {"signed", "nonnegative"});
  o.add("rule", c.rule, "firing: local rule on the first layer", {"none", "A", "B"});
  // -1 (the default): the rule's own rate, from optim/firing_rules.h
  const RealRange rule_rate{0, kHuge, false, true};
  o.add("eta_w", c.eta_w, "rule B: Oja rate on W (rule A: eta+ and eta-); -1: the rule's default", rule_rate);
  o.add("eta_f", c.eta_f, "rule B: rate on f (rule A: rho+ and rho-); -1: the rule's default", rule_rate);
  o.add("eta_sp", c.eta_sp, "rules: homeostatic threshold rate", kNonnegReal);
  o.add("r_target", c.r_target, "rules: target firing rate", RealRange{0, 1});
  o.add("w_min", c.w_min, "rule B: W range low (rule A: 0)", kAnyReal);
  o.add("w_max", c.w_max, "rules: W range high", kPositiveReal);
  o.add("f_min", c.f_min, "rule B: f range low", kAnyReal);
  o.add("f_max", c.f_max, "rules: f range high", kPositiveReal);
  o.group("Language model (--model lm)");
  o.add("lm_attention", c.lm_attention, "lm: the attention of its blocks", {"dense", "ascender", "asam"});
}

void define_training(Options& o, Config& c) {
  o.group("Optimisation");
  o.add("optimizer", c.optimizer, "the optimizer", {"adamw", "adam", "sgd"});
  o.add("lr", c.lr, "learning rate; -1: the model's default (3e-3 for lm, 1e-3 otherwise)",
        RealRange{0, kHuge, true, true});
  o.add("weight_decay", c.weight_decay, "weight decay", kNonnegReal);
  o.add("momentum", c.momentum, "sgd: momentum", RealRange{0, 0.999});
  o.add("schedule", c.schedule, "learning-rate schedule (cosine: linear warmup, then cosine to --min-lr)",
        {"constant", "cosine"});
  o.add("warmup", c.warmup, "warmup steps", kSteps);
  o.add("min_lr", c.min_lr, "cosine: final learning rate", kNonnegReal);
  o.add("clip", c.clip, "gradient-norm clipping (0: off)", kNonnegReal);
  o.add("batch", c.batch, "batch size", IntRange{1, int64_t{1} << 20});
  o.add("steps", c.steps, "optimizer steps (0: --epochs of the training split)", kSteps);
  o.add("epochs", c.epochs, "epochs when --steps is 0; 0: the model's default (4 for lm on text / file:, else 1)",
        IntRange{0, 1'000'000});
  o.add("eval_every", c.eval_every, "steps between validations (0: 10 per run)", kSteps);
  o.add("eval_batches", c.eval_batches, "validation batches per evaluation (0: the whole split)", kSize);
  o.add("log_every", c.log_every, "steps between training-metric rows (0: 50 per run)", kSteps);
  o.add("seed", c.seed, "seed of the initialisation, data order and dropout");
  o.group("Run and output");
  o.add("threads", c.threads, "CPU threads (0: OpenMP's default)", IntRange{0, 4096});
  o.add("prefetch", c.prefetch, "batches the loader builds ahead on its thread (0: none)", IntRange{0, 64});
  o.add("ckpt_every", c.ckpt_every, "steps between checkpoints (0: at every validation)", kSteps);
  o.add("device", c.device, "where the run computes", {"cpu", "cuda"});
  o.add("dtype", c.dtype,
        "the model's parameters and activations (bfloat16, CUDA: the optimizer updates float32 master copies "
        "of the parameters, optim/amp.h, and the products run on tensor cores; bfloat16, CPU: autocast, the "
        "parameters and activations stay float32 and the linear layers' and attention's products run in bfloat16, "
        "core/autocast.h; float64: every value in double precision, to check a result's numerics)",
        {"float32", "bfloat16", "float64"});
  o.add("tf32", c.tf32, "CUDA: float32 products on TF32 tensor cores (10 fraction bits), as PyTorch's allow_tf32");
  o.add("out", c.out, "output directory");
  o.add("progress", c.progress, "auto: a line redrawn on a terminal, plain lines otherwise", {"auto", "none"});
  o.add("progress_every", c.progress_every, "seconds between plain progress lines when stderr is not a terminal",
        RealRange{0, 1e6, true});
  o.group("Analyses");
  o.add("dump_decomposition", c.dump_decomposition, "test examples whose ASCender decomposition is written to dumps/",
        IntRange{0, kMaxCount});
  o.add("robustness", c.robustness,
        "classifiers: robustness.json — outputs under Gaussian noise (10 % of the "
        "embeddings' std) and one FGSM step (eps 0.01) on the input embeddings of the test set; the first attention "
        "layer's float32 vs float64 output and forward + backward at every power of two up to --robustness-max-len");
  o.add("robustness_examples", c.robustness_examples, "test examples the noise and FGSM measures use", kPositive);
  o.add("robustness_max_len", c.robustness_max_len, "longest sequence of the length sweep (a power of two)",
        IntRange{16, int64_t{1} << 20});
  o.group("Run and output");
  o.add("on_nonfinite", c.on_nonfinite,
        "a training step whose loss or gradient is not finite: error stops with a message, skip makes no update "
        "and counts it in summary.json's nonfinite_steps",
        {"error", "skip"});
  o.add_process_option("stop_after", c.stop_after,
                       "train at most this many steps in this process, then checkpoint and exit 130: a long run in "
                       "parts that fit a time budget, each continued with --resume (0: no limit)",
                       kSteps);
  o.add_process_option("profile", c.profile,
                       "profile this many training steps, after this process's first (warm-up) step: a table of the "
                       "ops by self time on stdout and in OUT/profile.txt, a Chrome trace in OUT/profile_trace.json "
                       "(Perfetto opens it); 0: off",
                       IntRange{0, 1'000'000});
  o.group("Analyses");
  o.add("cluster_metrics", c.cluster_metrics,
        "grouping task: cluster the tokens of this many test examples by k-means "
        "on each head's attention rows (and ASCender's latent z); NMI / ARI against the true groups, silhouette and "
        "Calinski-Harabasz -> cluster_metrics.json (0: off)",
        kSize);
}

void define_options(Options& o, Config& c) {
  define_task_and_model(o, c);
  define_mechanisms(o, c);
  define_training(o, c);
}

}  // namespace

struct OptionTable::Impl {
  explicit Impl(CLI::App& app) : app(app), options(app) {}
  CLI::App& app;
  Options options;
};

OptionTable::OptionTable(CLI::App& app, Config& c) : impl_(std::make_unique<Impl>(app)) {
  define_options(impl_->options, c);
}
OptionTable::~OptionTable() = default;

std::string OptionTable::to_json(const std::vector<std::pair<std::string, std::string>>& provenance) const {
  json j = impl_->options.save();
  for (const auto& [k, v] : provenance) j[k] = v;
  return j.dump(2) + "\n";
}

// A config file is a few kilobytes; a larger file is something else given by mistake.
constexpr uintmax_t kMaxConfigBytes = 1 << 20;
// JSON nested deeper than this is not a config file (and a parser's recursion is bounded before it starts).
constexpr int kMaxJsonDepth = 32;

std::vector<std::string> OptionTable::args_from_json(const std::string& text) const {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      ASC_CHECK(++depth <= kMaxJsonDepth, "not a config file: JSON nested deeper than {} levels", kMaxJsonDepth);
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ASC_THROW("not valid JSON: {}", e.what());
  }
  return impl_->options.to_args(j);
}

std::string config_json(const Config& c, const std::vector<std::pair<std::string, std::string>>& provenance) {
  Config copy = c;
  CLI::App app;
  OptionTable table(app, copy);
  return table.to_json(provenance);
}

bool lm_reads_windows(const Config& c) { return c.model == "lm" && (c.task == "text" || c.task.starts_with("file:")); }

void resolve_defaults(Config& c) {
  if (c.model == "lm" && c.positional == "learned") c.positional = "rope";  // the default: the LM's rotary positions
  if (lm_reads_windows(c) && c.max_len == 0) c.max_len = kLMContext;
  if (c.lr < 0) c.lr = c.model == "lm" ? kLMLearningRate : kLearningRate;
  if (c.epochs == 0) c.epochs = lm_reads_windows(c) ? kLMEpochs : 1;
  if (c.eta_w < 0) c.eta_w = c.rule == "A" ? optim::RuleAOptions{}.eta_plus : optim::RuleBOptions{}.eta_w;
  if (c.eta_f < 0) c.eta_f = c.rule == "A" ? optim::RuleAOptions{}.rho_plus : optim::RuleBOptions{}.eta_f;
}

void OptionTable::parse_file(const std::string& path) const {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  ASC_CHECK(!ec && fs::exists(status), "no such file");
  ASC_CHECK(!fs::is_directory(status), "a directory, not a config file");
  ASC_CHECK(fs::is_regular_file(status), "not a regular file");
  const auto size = fs::file_size(path, ec);
  ASC_CHECK(!ec && size <= kMaxConfigBytes, "{} bytes: larger than a config file can be ({} bytes)", ec ? 0 : size,
            kMaxConfigBytes);
  std::ifstream f(path, std::ios::binary);
  ASC_CHECK(f.good(), "cannot read it: {}", std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(f)), {});
  ASC_CHECK(!f.bad(), "cannot read it: {}", std::strerror(errno));
  std::vector<std::string> args = args_from_json(text);
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes the arguments last first
  try {
    impl_->app.parse(args);
  } catch (const CLI::ParseError& e) {
    // CLI11 names the flag ("--lr: must be ..."); in a file, the key is what the reader looks for
    std::string msg = e.what();
    if (msg.starts_with("--")) {
      const size_t colon = msg.find(':');
      std::string key = msg.substr(2, colon - 2);
      std::replace(key.begin(), key.end(), '-', '_');
      if (colon != std::string::npos) msg = "'" + key + "'" + msg.substr(colon);
    }
    ASC_THROW("{}", msg);
  }
}

namespace {

// The tokens of the task's longest sequence, as far as the options tell without reading any data (0: unknown).
int64_t expected_len(const Config& c) {
  if (c.max_len > 0) return c.max_len;
  if (lm_reads_windows(c)) return kLMContext;
  const int64_t side = c.image_size;
  if (c.task == "fashion-mnist-seq") return side > 0 ? side * side : 28 * 28;
  if (c.task == "pathfinder") {
    const int64_t drawn = c.pathfinder_size > 0 ? c.pathfinder_size : 32;
    return side > 0 ? side * side : drawn * drawn;
  }
  if (c.task == "fortunes") return 256;
  if (c.task == "listops") return 2000;
  if (c.task == "text") return 4096;
  if (c.task == "grouping") return 64;
  return 0;  // fashion-mnist (rows as tokens, depending on the model), file:PATH
}

double machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1 << 30)); }

}  // namespace

MemoryBound memory_lower_bound(const Config& c) {
  const bool attention = c.model != "firing" && c.model != "mlp";
  const int64_t T = expected_len(c);
  if (c.device != "cpu" || !attention || T <= 0) return {};
  const double L = static_cast<double>(c.layers), B = static_cast<double>(c.batch), d = static_cast<double>(c.d_model),
               f = static_cast<double>(c.ffn),
               elem = c.dtype == "float64" ? 8.0 : 4.0;  // bfloat16 on the CPU keeps float32 activations (autocast)
  const double activations = L * B * static_cast<double>(T) * (4 * d + f) * elem;
  const double params = L * (4 * d * d + 2 * d * f) * 8.0;  // float32 weights and gradients
  return {activations + params,
          fmt::format("activations kept for the backward: layers {} x batch {} x {} tokens x (4 x d_model {} + ffn {}) "
                      "x {} bytes; parameters and gradients: {}",
                      c.layers, c.batch, T, c.d_model, c.ffn, elem, gib(params))};
}

void validate_config(const Config& c, bool check_memory) {
  const bool attention = c.model != "firing" && c.model != "mlp";
  if (attention)
    ASC_CHECK(c.d_model % c.heads == 0, "'d_model' {} must be a multiple of 'heads' {}", c.d_model, c.heads);
  auto per_head = [&](const char* key, size_t n) {
    ASC_CHECK(n == 1 || static_cast<int64_t>(n) == c.heads,
              "'{}' has {} values: give one (every head) or one per head ('heads' {})", key, n, c.heads);
  };
  per_head("k", c.k.size()), per_head("tau_sep", c.tau_sep.size()), per_head("tau_coh", c.tau_coh.size());
  per_head("alpha_align", c.alpha_align.size()), per_head("alpha_coh", c.alpha_coh.size());
  ASC_CHECK(c.model != "lm" || c.positional == "rope" || c.positional == "learned",
            "'positional' {} is not available to the language model (--model lm): it uses rotary positions (rope)",
            c.positional);
  ASC_CHECK(c.min_len == 0 || c.max_len == 0 || lm_reads_windows(c) || c.min_len <= c.max_len,
            "'min_len' {} exceeds 'max_len' {}", c.min_len, c.max_len);  // windows: min_len bounds the whole text
  ASC_CHECK(c.w_min < c.w_max, "'w_min' {} must be below 'w_max' {}", c.w_min, c.w_max);
  ASC_CHECK(c.f_min < c.f_max, "'f_min' {} must be below 'f_max' {}", c.f_min, c.f_max);
  ASC_CHECK((c.robustness_max_len & (c.robustness_max_len - 1)) == 0,
            "'robustness_max_len' must be a power of two, got {}", c.robustness_max_len);
  if (!check_memory) return;
  const MemoryBound m = memory_lower_bound(c);
  const double have = machine_memory_bytes();
  ASC_CHECK(have <= 0 || m.bytes <= have,
            "this run needs at least {} of memory, more than this machine's {} ({}); lower 'batch', 'max_len' / "
            "'image_size' or the model's size",
            gib(m.bytes), gib(have), m.how);
}

Config read_config(const std::string& path) {
  Config c;
  CLI::App app;
  const OptionTable table(app, c);
  try {
    table.parse_file(path);
  } catch (const Error& e) {
    ASC_THROW("read_config: '{}': {}", path, e.what());
  }
  return c;
}

std::string git_commit() {
#ifdef ASC_SOURCE_DIR
  const std::string cmd = std::string("git -C '") + ASC_SOURCE_DIR + "' rev-parse HEAD 2>/dev/null";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[64] = {};
    const bool ok = std::fgets(buf, sizeof buf, p) != nullptr;
    pclose(p);
    std::string s = ok ? std::string(buf) : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (!s.empty()) return s;
  }
#endif
  return "unknown";
}

}  // namespace asc::train
