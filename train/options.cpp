// The trainer's option table (train/options.h).
#include "train/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/format.h"
#include "optim/firing_rules.h"

namespace asc::train {

using json = nlohmann::ordered_json;

namespace {

// One option: its flag, help, and how it reads and writes config.json.
struct OptionIO {
  std::string key;
  std::function<void(json&)> save;
};

class Options {
 public:
  explicit Options(CLI::App& app) : app_(app) {}
  template <class T>
  CLI::Option* add(const std::string& key, T& field, const std::string& help) {
    io_.push_back({key, [key, &field](json& j) { j[key] = field; }});
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    CLI::Option* o = app_.add_option(flag, field, help)->capture_default_str();
    if constexpr (requires { field.begin(); } && !std::is_same_v<T, std::string>)
      o->delimiter(',');
    else
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last one counts
    return o;
  }
  json save() const {
    json j;
    for (const auto& o : io_) o.save(j);
    return j;
  }
  // The options of a config.json as command-line arguments, so that CLI11 parses and validates them exactly like
  // flags (a value out of range, a name that is not one of the choices, 32.7 for an integer: all refused). Keys must
  // be known options: a typo in a config file is an error, not silently ignored.
  std::vector<std::string> to_args(const json& j) const {
    ASC_CHECK(j.is_object(), "expected a JSON object of options");
    auto text = [](const json& v) -> std::string {
      if (v.is_string()) return v.get<std::string>();
      if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
      if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
      if (v.is_number_float()) return fmt::format("{:.17g}", v.get<double>());
      ASC_THROW("a value {} that is neither a string, a number nor a boolean", v.dump());
    };
    std::vector<std::string> args;
    for (const auto& [key, value] : j.items()) {
      if (key == "git_commit" || key == "command") continue;  // provenance written beside the options
      ASC_CHECK(std::any_of(io_.begin(), io_.end(), [&](const OptionIO& o) { return o.key == key; }),
                "unknown option '{}'", key);
      std::string v;
      if (value.is_array()) {
        if (value.empty()) continue;  // an empty list: the option's default
        for (const json& item : value) v += (v.empty() ? "" : ",") + text(item);
      } else {
        v = text(value);
        // An empty string is the option's default (every string option's default here is empty or a path the file
        // states): CLI11 reads "--opt=" as an option without its value, which would take the next argument as it.
        if (v.empty()) continue;
      }
      std::string flag = "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      args.push_back(flag + "=" + v);
    }
    return args;
  }

 private:
  CLI::App& app_;
  std::vector<OptionIO> io_;
};

// The validators the options share: > 0 and >= 0, with messages that say so ("must be > 0, got 0").
struct Bounds {
  CLI::Validator pos, nonneg;
};

Bounds bounds() {
  // "must be > 0, got 0" rather than CLI11's "not in range 0.000000 to 1.797693e+308" (the value is parsed into
  // the option's own type afterwards, so "1.5" for an integer is still refused there).
  auto bound = [](bool strict) {
    return CLI::Validator(
        [strict](std::string& s) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(s.c_str(), &end);
          if (s.empty() || *end != '\0' || !std::isfinite(v)) return "'" + s + "' is not a number";
          if (strict ? !(v > 0) : !(v >= 0)) return fmt::format("must be {} 0, got {}", strict ? ">" : ">=", s);
          return "";
        },
        strict ? "> 0" : ">= 0");
  };
  return {bound(true), bound(false)};
}

void define_task_and_model(Options& o, Config& c, const Bounds& b) {
  const CLI::Validator &pos = b.pos, &nonneg = b.nonneg;
  // task
  o.add("task", c.task, "fashion-mnist | fashion-mnist-seq | listops | text | pathfinder | grouping | file:PATH");
  o.add("image_size", c.image_size,
        "image tasks: side after average pooling (fashion-mnist 28 -> 14: 196 tokens); 0 native")
      ->check(nonneg);
  o.add("train_size", c.train_size, "examples of the training split (0: the task's default)")->check(nonneg);
  o.add("val_size", c.val_size, "examples of the validation split (0: default)")->check(nonneg);
  o.add("test_size", c.test_size, "examples of the test split (0: default)")->check(nonneg);
  o.add("min_len", c.min_len, "generated / read sequences: minimum length (0: the task's default)")->check(nonneg);
  o.add("max_len", c.max_len, "maximum length (0: the task's default)")->check(nonneg);
  o.add("data_dir", c.data_dir, "where a file task's data lives (empty: its default)");
  o.add("data_seed", c.data_seed, "seed of generated data and file splits (kept apart from --seed)");
  // model
  o.add("model", c.model, "dense | ascender | asam | window | window-global | firing | mlp | lm")
      ->check(CLI::IsMember({"dense", "ascender", "asam", "window", "window-global", "firing", "mlp", "lm"}));
  o.add("positional", c.positional, "learned | sinusoidal | none | rope | alibi (lm: rope only)")
      ->check(CLI::IsMember({"learned", "sinusoidal", "none", "rope", "alibi"}));
  o.add("d_model", c.d_model, "model width")->check(pos);
  o.add("heads", c.heads, "attention heads")->check(pos);
  o.add("layers", c.layers, "Transformer blocks")->check(pos);
  o.add("ffn", c.ffn, "feed-forward width")->check(pos);
  o.add("dropout", c.dropout, "dropout probability (residual and feed-forward)")->check(CLI::Range(0.0, 0.99));
  o.add("attn_dropout", c.attn_dropout,
        "dropout on the attention probabilities (dense, ascender; ASCender's fused "
        "kernels have none: > 0 runs its composed reference, several times slower)")
      ->check(CLI::Range(0.0, 0.99));
  o.add("norm_first", c.norm_first, "pre-norm blocks (false: post-norm)");
}

void define_mechanisms(Options& o, Config& c, const Bounds& b) {
  const CLI::Validator &pos = b.pos, &nonneg = b.nonneg;
  // ASCender
  o.add("k", c.k, "ASCender: neighbourhood size per head (one value: every head), e.g. 4,8,16,32");
  o.add("tau_sep", c.tau_sep, "ASCender: separation kernel temperature per head");
  o.add("tau_coh", c.tau_coh, "ASCender: cohesion kernel temperature per head");
  o.add("alpha_align", c.alpha_align, "ASCender: alignment gate sharpness per head");
  o.add("alpha_coh", c.alpha_coh, "ASCender: cohesion gate sharpness per head");
  o.add("gate_position", c.gate_position, "ASCender: gates before or after the row normalisation")
      ->check(CLI::IsMember({"before", "after"}));
  o.add("asc_mode", c.asc_mode, "ASCender: full | windowed | reuse")
      ->check(CLI::IsMember({"full", "windowed", "reuse"}));
  o.add("asc_window", c.asc_window, "ASCender windowed mode: window")->check(pos);
  o.add("asc_global", c.asc_global, "ASCender windowed mode: global tokens")->check(nonneg);
  o.add("use_align", c.use_align, "ASCender: the alignment term (ablation switch)");
  o.add("use_sep", c.use_sep, "ASCender: the separation term");
  o.add("use_coh", c.use_coh, "ASCender: the cohesion term");
  o.add("include_self", c.include_self, "ASCender: a token may be its own neighbour");
  o.add("omega_init", c.omega_init, "ASCender: initial omega of the three terms");
  o.add("omega_warmup", c.omega_warmup, "ASCender: steps over which the omegas ramp up from 0")->check(nonneg);
  o.add("sep_start", c.sep_start, "ASCender: step from which separation is on")->check(nonneg);
  o.add("aux_align", c.aux_align, "ASCender: auxiliary alignment loss weight")->check(nonneg);
  o.add("aux_sep", c.aux_sep, "ASCender: auxiliary separation loss weight")->check(nonneg);
  o.add("aux_coh", c.aux_coh, "ASCender: auxiliary cohesion loss weight")->check(nonneg);
  o.add("aux_start", c.aux_start,
        "ASCender: step from which the auxiliary losses count (-1: from the end of --omega-warmup)");
  // ASAM
  o.add("asam_patterns", c.asam_patterns,
        "ASAM: sparse patterns, from window,strided,global,random,clustered,hierarchical");
  o.add("asam_window", c.asam_window, "ASAM: local window w (also the window models')")->check(pos);
  o.add("asam_stride", c.asam_stride, "ASAM: stride")->check(pos);
  o.add("asam_global", c.asam_global, "ASAM: global tokens (also window-global's)")->check(nonneg);
  o.add("asam_random", c.asam_random, "ASAM: random keys per query")->check(pos);
  o.add("asam_clusters", c.asam_clusters, "ASAM: centroids per head (clustered)")->check(pos);
  o.add("fixed_gate", c.fixed_gate, "ASAM: a constant gate in [0, 1] (1: sparse only); -1: learned");
  o.add("gate_tau", c.gate_tau, "ASAM: gate temperature")->check(pos);
  o.add("cluster_loss", c.cluster_loss, "ASAM: weight of the centroids' k-means loss")->check(nonneg);
  // firing
  o.add("firing_hidden", c.firing_hidden, "firing: neurons of the first layer")->check(pos);
  o.add("fan_out", c.fan_out, "firing: outputs per neuron (the second layer's neurons)")->check(pos);
  o.add("mlp_hidden", c.mlp_hidden,
        "mlp: hidden widths (ReLU between), e.g. 256 (about the firing network's size) "
        "or 512,128")
      ->check(pos);
  o.add("firing_backward", c.firing_backward, "firing: exact | ste | surrogate")
      ->check(CLI::IsMember({"exact", "ste", "surrogate"}));
  o.add("surrogate", c.surrogate, "firing: surrogate derivative (sigmoid, fast_sigmoid, triangle, gaussian)");
  o.add("surrogate_width", c.surrogate_width, "firing: surrogate width")->check(pos);
  o.add("threshold", c.threshold, "firing: initial threshold SP");
  o.add("firing_init", c.firing_init, "firing: signed | nonnegative weights")
      ->check(CLI::IsMember({"signed", "nonnegative"}));
  o.add("rule", c.rule, "firing: local rule on the first layer: none | A | B")
      ->check(CLI::IsMember({"none", "A", "B"}));
  // -1 (the default): the rule's own rate, from optim/firing_rules.h
  const CLI::Validator rule_rate = nonneg | CLI::Range(-1.0, -1.0);
  o.add("eta_w", c.eta_w, "rule B: Oja rate on W (rule A: eta+ and eta-); -1: the rule's default")->check(rule_rate);
  o.add("eta_f", c.eta_f, "rule B: rate on f (rule A: rho+ and rho-); -1: the rule's default")->check(rule_rate);
  o.add("eta_sp", c.eta_sp, "rules: homeostatic threshold rate")->check(nonneg);
  o.add("r_target", c.r_target, "rules: target firing rate")->check(CLI::Range(0.0, 1.0));
  o.add("w_min", c.w_min, "rule B: W range low (rule A: 0)");
  o.add("w_max", c.w_max, "rules: W range high")->check(pos);
  o.add("f_min", c.f_min, "rule B: f range low");
  o.add("f_max", c.f_max, "rules: f range high")->check(pos);
  // lm
  o.add("lm_attention", c.lm_attention, "lm: dense | ascender | asam")
      ->check(CLI::IsMember({"dense", "ascender", "asam"}));
}

void define_training(Options& o, Config& c, const Bounds& b) {
  const CLI::Validator &pos = b.pos, &nonneg = b.nonneg;
  // optimisation
  o.add("optimizer", c.optimizer, "adamw | adam | sgd")->check(CLI::IsMember({"adamw", "adam", "sgd"}));
  o.add("lr", c.lr, "learning rate")->check(pos);
  o.add("weight_decay", c.weight_decay, "weight decay")->check(nonneg);
  o.add("momentum", c.momentum, "sgd: momentum")->check(CLI::Range(0.0, 0.999));
  o.add("schedule", c.schedule, "constant | cosine (linear warmup, then cosine to --min-lr)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  o.add("warmup", c.warmup, "warmup steps")->check(nonneg);
  o.add("min_lr", c.min_lr, "cosine: final learning rate")->check(nonneg);
  o.add("clip", c.clip, "gradient-norm clipping (0: off)")->check(nonneg);
  o.add("batch", c.batch, "batch size")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  o.add("steps", c.steps, "optimizer steps (0: --epochs of the training split)")->check(nonneg);
  o.add("epochs", c.epochs, "epochs when --steps is 0")->check(pos);
  o.add("eval_every", c.eval_every, "steps between validations (0: 10 per run)")->check(nonneg);
  o.add("eval_batches", c.eval_batches, "validation batches per evaluation (0: the whole split)")->check(nonneg);
  o.add("log_every", c.log_every, "steps between training-metric rows (0: 50 per run)")->check(nonneg);
  o.add("seed", c.seed, "seed of the initialisation, data order and dropout");
  // run
  o.add("threads", c.threads, "CPU threads (0: OpenMP's default)")->check(nonneg);
  o.add("prefetch", c.prefetch, "batches the loader builds ahead on its thread (0: none)")->check(CLI::Range(0, 64));
  o.add("ckpt_every", c.ckpt_every, "steps between checkpoints (0: at every validation)")->check(nonneg);
  o.add("device", c.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  o.add("dtype", c.dtype,
        "the model's parameters and activations: float32 | bfloat16 (the optimizer updates float32 master copies "
        "of the parameters, optim/amp.h; on CUDA the products run on tensor cores)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  o.add("tf32", c.tf32, "CUDA: float32 products on TF32 tensor cores (10 fraction bits), as PyTorch's allow_tf32");
  o.add("out", c.out, "output directory");
  o.add("progress", c.progress, "auto (a line redrawn on a terminal, plain lines otherwise) | none")
      ->check(CLI::IsMember({"auto", "none"}));
  o.add("progress_every", c.progress_every, "seconds between plain progress lines when stderr is not a terminal")
      ->check(pos);
  o.add("dump_decomposition", c.dump_decomposition, "test examples whose ASCender decomposition is written to dumps/");
  o.add("robustness", c.robustness,
        "classifiers: robustness.json — outputs under Gaussian noise (10 % of the "
        "embeddings' std) and one FGSM step (eps 0.01) on the input embeddings of the test set; the first attention "
        "layer's float32 vs float64 output and forward + backward at every power of two up to --robustness-max-len");
  o.add("robustness_examples", c.robustness_examples, "test examples the noise and FGSM measures use")->check(pos);
  o.add("robustness_max_len", c.robustness_max_len, "longest sequence of the length sweep (a power of two)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  o.add("on_nonfinite", c.on_nonfinite,
        "a training step whose loss or gradient is not finite: error (stop with a "
        "message) | skip (no update; counted in summary.json's nonfinite_steps)")
      ->check(CLI::IsMember({"error", "skip"}));
  o.add("cluster_metrics", c.cluster_metrics,
        "grouping task: cluster the tokens of this many test examples by k-means "
        "on each head's attention rows (and ASCender's latent z); NMI / ARI against the true groups, silhouette and "
        "Calinski-Harabasz -> cluster_metrics.json (0: off)")
      ->check(nonneg);
}

void define_options(Options& o, Config& c) {
  const Bounds b = bounds();
  define_task_and_model(o, c, b);
  define_mechanisms(o, c, b);
  define_training(o, c, b);
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

std::vector<std::string> OptionTable::args_from_json(const std::string& text) const {
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

void resolve_defaults(Config& c) {
  if (c.eta_w < 0) c.eta_w = c.rule == "A" ? optim::RuleAOptions{}.eta_plus : optim::RuleBOptions{}.eta_w;
  if (c.eta_f < 0) c.eta_f = c.rule == "A" ? optim::RuleAOptions{}.rho_plus : optim::RuleBOptions{}.eta_f;
}

void OptionTable::parse_file(const std::string& path) const {
  std::ifstream f(path);
  ASC_CHECK(f.good(), "cannot read it");
  std::stringstream text;
  text << f.rdbuf();
  std::vector<std::string> args = args_from_json(text.str());
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes the arguments last first
  try {
    impl_->app.parse(args);
  } catch (const CLI::ParseError& e) {
    ASC_THROW("{}", e.what());
  }
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
