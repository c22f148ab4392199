// train: trains and evaluates one model on one task, and writes everything a study needs into --out DIR.
//
//   ./build/release/tools/train --task fashion-mnist-seq --image-size 14 --model ascender --steps 300 --out runs/a
//   ./build/release/tools/train --config runs/a/config.json --seed 2 --out runs/a-s2      # flags override the file
//   ./build/release/tools/train --out runs/a --resume                                     # continue (bit-identical)
//   ./build/release/tools/train --out runs/a-eval --eval-only runs/a/best.safetensors     # runs/a/config.json's model
//
// Models: dense / ascender / asam attention classifiers (models::TransformerClassifier); window and window-global:
// ASAM's sparse patterns alone (gate fixed at 1); firing: models::FiringClassifier on image tasks, with rule A / B;
// lm: a byte-level decoder LM (models::DecoderLM) on a token task's sequences, reporting bits per byte.
//
// DIR receives: config.json (every option, the git commit: rerun with --config), metrics.csv and metrics.jsonl (one
// row per log / evaluation: loss, accuracy, lr, tokens/s, time and the mechanisms' statistics), summary.json (the
// best validation checkpoint's validation and test accuracy, wall time, peak memory, throughput, parameters, FLOPs),
// predictions.csv (every test example), best.safetensors (the model selected on validation), ckpt/last.safetensors
// (the whole training state: model, optimizer, scheduler, generator, data order, counters) and dumps/ (ASCender's
// decomposition for --dump-decomposition examples, the ASAM gate per test sample and head, firing rates per neuron).
// SIGINT / SIGTERM finish the step, save ckpt/last.safetensors and exit 130; --resume continues from it.
// Exit codes: 0 done, 1 a runtime error (message on stderr), 2 a bad command line, 130 interrupted.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ascender.h"
#include "data/loader.h"
#include "data/tasks.h"
#include "models/decoder_lm.h"
#include "models/firing_net.h"
#include "models/flops.h"
#include "models/transformer_classifier.h"
#include "stats/cluster.h"
#include "tools/cli.h"

using namespace asc;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

// ---- configuration: every option once, for the command line and config.json alike ----------------------------------

struct Config {
  // task
  std::string task = "fashion-mnist-seq";
  int64_t image_size = 0, train_size = 0, val_size = 0, test_size = 0, min_len = 0, max_len = 0;
  std::string data_dir;
  uint64_t data_seed = 0;
  // model
  std::string model = "ascender", positional = "learned";
  std::string dtype = "float32";  // the model's compute dtype; bfloat16 keeps float32 master weights
  bool tf32 = false;
  int64_t d_model = 64, heads = 4, layers = 2, ffn = 128;
  double dropout = 0.1, attn_dropout = 0.0;
  bool norm_first = true;
  // ASCender
  std::vector<int64_t> k = {8};
  std::vector<double> tau_sep = {1.0}, tau_coh = {1.0}, alpha_align = {1.0}, alpha_coh = {1.0};
  std::string gate_position = "before", asc_mode = "full";
  int64_t asc_window = 128, asc_global = 4;
  bool use_align = true, use_sep = true, use_coh = true, include_self = false;
  double omega_init = 0.1, aux_coh = 0, aux_sep = 0, aux_align = 0;
  int64_t omega_warmup = 0, sep_start = 0, aux_start = -1;
  // ASAM
  std::vector<std::string> asam_patterns = {"window", "global", "random"};
  int64_t asam_window = 64, asam_stride = 16, asam_global = 2, asam_random = 4, asam_clusters = 4;
  double fixed_gate = -1, gate_tau = 1, cluster_loss = 1;
  // firing
  int64_t firing_hidden = 256, fan_out = 4;
  std::vector<int64_t> mlp_hidden = {256};
  std::string firing_backward = "surrogate", surrogate = "sigmoid", firing_init = "signed", rule = "none";
  double surrogate_width = 4, threshold = 0;
  // eta_w, eta_f: -1 = the rule's own defaults (optim/firing_rules.h: RuleBOptions, RuleAOptions), resolved before the
  // run starts and written to config.json as used.
  double eta_w = -1, eta_f = -1, eta_sp = 1e-2, r_target = 0.1, w_min = -1, w_max = 1, f_min = 0, f_max = 1;
  // language model
  std::string lm_attention = "dense";
  // optimisation
  std::string optimizer = "adamw", schedule = "cosine";
  double lr = 1e-3, weight_decay = 0.01, momentum = 0.9, clip = 1.0, min_lr = 0;
  int64_t warmup = 0, batch = 32, steps = 0, epochs = 1, eval_every = 0, eval_batches = 0, log_every = 0;
  uint64_t seed = 0;
  // run
  int64_t threads = 0, prefetch = 2, ckpt_every = 0;
  int64_t stop_after = 0;  // this process only: not written to config.json
  int64_t profile = 0;     // this process only: steps to profile (--profile)
  std::string device = "cpu", out = "runs/latest", progress = "auto";
  double progress_every = 10;
  std::vector<int64_t> dump_decomposition;
  int64_t cluster_metrics = 0, robustness_examples = 500, robustness_max_len = 4096;
  bool robustness = false;
  std::string on_nonfinite = "error";
};

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

void define_options(Options& o, Config& c) {
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
  const CLI::Validator pos = bound(true), nonneg = bound(false);
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

// ---- small helpers -----------------------------------------------------------------------------------------------

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) {
  if (g_stop) _exit(130);  // a second signal: stop now
  g_stop = 1;
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

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : ""; }
json jnum(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// ---- the model and its mechanisms ----------------------------------------------------------------------------------

struct Run {
  Config c;
  data::Task task;
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<models::TransformerClassifier> classifier;
  std::shared_ptr<models::DecoderLM> lm;
  std::shared_ptr<models::FiringClassifier> firing;
  std::shared_ptr<nn::MLP> mlp;  // the baseline of the firing network: Linear -> ReLU -> ... -> Linear
  std::vector<std::shared_ptr<nn::Attention>> attention;  // per block
  Device device = Device::cpu();
  DType dtype = kFloat32;  // --dtype: the model's parameters, and the float inputs it reads
  bool is_lm() const { return lm != nullptr; }
};

nn::AscenderAttentionOptions ascender_options(const Config& c) {
  auto mode = c.asc_mode == "full"       ? nn::AscenderMode::Full
              : c.asc_mode == "windowed" ? nn::AscenderMode::Windowed
                                         : nn::AscenderMode::Reuse;
  return nn::AscenderAttentionOptions(0, 0)
      .k(c.k)
      .tau_sep(c.tau_sep)
      .tau_coh(c.tau_coh)
      .alpha_align(c.alpha_align)
      .alpha_coh(c.alpha_coh)
      .neighbors_include_self(c.include_self)
      .gate_position(c.gate_position == "after" ? nn::GatePosition::AfterNorm : nn::GatePosition::BeforeNorm)
      .mode(mode)
      .window(c.asc_window)
      .global_tokens(c.asc_global)
      .use_align(c.use_align)
      .use_sep(c.use_sep)
      .use_coh(c.use_coh)
      .omega_init(c.omega_init)
      .aux_align(c.aux_align)
      .aux_sep(c.aux_sep)
      .aux_coh(c.aux_coh)
      .aux_start_step(c.aux_start)
      .warmup_steps(c.omega_warmup)
      .sep_start_step(c.sep_start);
}

nn::AsamAttentionOptions asam_options(const Config& c) {
  auto o = nn::AsamAttentionOptions(0, 0)
               .patterns(c.asam_patterns)
               .window(c.asam_window)
               .stride(c.asam_stride)
               .global_tokens(c.asam_global)
               .random_keys(c.asam_random)
               .clusters(c.asam_clusters)
               .fixed_gate(c.fixed_gate)
               .gate_tau(c.gate_tau)
               .cluster_loss_weight(c.cluster_loss)
               .seed(c.seed);
  if (c.model == "window") o.patterns({"window"}).fixed_gate(1.0);
  if (c.model == "window-global") o.patterns({"window", "global"}).fixed_gate(1.0);
  return o;
}

void build_model(Run& r) {
  const Config& c = r.c;
  const data::Task& t = r.task;
  if (c.model == "firing") {
    ASC_CHECK(t.vocab == 0,
              "the firing network reads fixed-size float inputs (task fashion-mnist); task '{}' "
              "gives token sequences",
              t.name);
    auto o = models::FiringClassifierOptions(t.max_len, t.classes)
                 .hidden(c.firing_hidden)
                 .fan_out(c.fan_out)
                 .backward(c.firing_backward == "exact" ? GateBackward::None
                           : c.firing_backward == "ste" ? GateBackward::StraightThrough
                                                        : GateBackward::Surrogate)
                 .surrogate(c.surrogate)
                 .surrogate_width(c.surrogate_width)
                 .threshold(c.threshold)
                 .init(c.firing_init == "nonnegative" ? nn::FiringInit::NonNegative : nn::FiringInit::Signed);
    r.firing = std::make_shared<models::FiringClassifier>(o);
    r.model = r.firing;
  } else if (c.model == "mlp") {
    ASC_CHECK(t.vocab == 0,
              "the MLP reads fixed-size float inputs (task fashion-mnist); task '{}' gives token "
              "sequences",
              t.name);
    std::vector<int64_t> sizes = {t.max_len};
    sizes.insert(sizes.end(), c.mlp_hidden.begin(), c.mlp_hidden.end());
    sizes.push_back(t.classes);
    r.mlp = std::make_shared<nn::MLP>(nn::MLPOptions(sizes).dropout(c.dropout));
    r.model = r.mlp;
  } else {
    ASC_CHECK(t.vocab > 0,
              "model '{}' reads token sequences; task '{}' gives float images (use "
              "fashion-mnist-seq, or --model firing)",
              c.model, t.name);
    if (c.model == "lm") {
      ASC_CHECK(c.positional == "rope" || c.positional == "learned",
                "the decoder LM uses rotary positions; --positional {} is not available for it", c.positional);
      auto o = models::DecoderLMOptions(t.vocab)
                   .d_model(c.d_model)
                   .heads(c.heads)
                   .layers(c.layers)
                   .ffn(c.ffn)
                   .dropout(c.dropout)
                   .attention_dropout(c.attn_dropout);
      nn::AttentionFactory f = nn::dense_attention;
      if (c.lm_attention == "ascender") f = nn::ascender_attention_factory(ascender_options(c).rope(true));
      if (c.lm_attention == "asam") f = nn::asam_attention_factory(asam_options(c));
      r.lm = std::make_shared<models::DecoderLM>(o, f);
      r.model = r.lm;
      for (auto& b : *r.lm->blocks)
        r.attention.push_back(std::static_pointer_cast<nn::TransformerEncoderBlock>(b)->attn);
    } else {
      const std::string attn = c.model == "dense" ? "dense" : c.model == "ascender" ? "ascender" : "asam";
      auto o = models::TransformerClassifierOptions(t.vocab, t.max_len, t.classes)
                   .d_model(c.d_model)
                   .heads(c.heads)
                   .layers(c.layers)
                   .ffn(c.ffn)
                   .dropout(c.dropout)
                   .attention_dropout(c.attn_dropout)
                   .norm_first(c.norm_first)
                   .attention(attn)
                   .positional(c.positional)
                   .ascender(ascender_options(c))
                   .asam(asam_options(c));
      r.classifier = std::make_shared<models::TransformerClassifier>(o);
      r.model = r.classifier;
      for (auto& b : *r.classifier->blocks)
        r.attention.push_back(std::static_pointer_cast<nn::TransformerEncoderBlock>(b)->attn);
    }
  }
  if (r.device.is_cuda()) r.model->to(r.device);
  if (r.dtype != kFloat32) r.model->to(r.dtype);
}

// Mechanism statistics of the model now (parameters) and of the batches seen since the last reset (gates, rates).
class MechStats {
 public:
  explicit MechStats(const Run& r) : r_(r) {}
  // Column names, fixed for the run (the CSV header).
  std::vector<std::string> columns() const {
    std::vector<std::string> cols;
    for (size_t l = 0; l < r_.attention.size(); ++l) {
      if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r_.attention[l]))
        for (const char* w : {"omega_align", "omega_sep", "omega_coh"})
          for (int64_t h = 0; h < a->options.heads(); ++h) cols.push_back(fmt::format("L{}.{}.h{}", l, w, h));
      if (std::dynamic_pointer_cast<nn::AsamAttention>(r_.attention[l]))
        cols.push_back(fmt::format("L{}.asam_gate", l));
    }
    if (r_.firing)
      for (int l = 0; l < 2; ++l) {
        cols.push_back(fmt::format("L{}.firing_rate", l));
        cols.push_back(fmt::format("L{}.firing_threshold", l));
      }
    return cols;
  }
  void reset() { sums_.assign(slots(), 0.0), counts_.assign(slots(), 0.0); }
  // The sums since the last reset, exactly (hex floats), for a checkpoint: "s0,c0,s1,c1,...".
  std::string state() const {
    std::string out;
    for (size_t i = 0; i < sums_.size(); ++i) out += fmt::format("{}{:a},{:a}", i ? "," : "", sums_[i], counts_[i]);
    return out;
  }
  void set_state(const std::string& s) {
    reset();
    std::vector<double> v;
    for (const std::string& item : tools::split_list(s))
      if (!item.empty()) v.push_back(std::strtod(item.c_str(), nullptr));
    ASC_CHECK(v.size() == 2 * sums_.size(), "checkpoint's mechanism sums have {} values, this model needs {}", v.size(),
              2 * sums_.size());
    for (size_t i = 0; i < sums_.size(); ++i) sums_[i] = v[2 * i], counts_[i] = v[2 * i + 1];
  }
  // After a forward: accumulate the gates and firing rates of that batch.
  void observe() {
    if (sums_.empty()) reset();
    size_t s = 0;
    for (auto& a : r_.attention)
      if (auto asam = std::dynamic_pointer_cast<nn::AsamAttention>(a)) {
        Tensor g = asam->last_gate();
        if (g.defined()) sums_[s] += sum(g).item<double>(), counts_[s] += static_cast<double>(g.numel());
        ++s;
      }
    if (r_.firing)
      for (auto* layer : {r_.firing->hidden.get(), r_.firing->second.get()}) {
        Tensor F = layer->last_gate();
        if (F.defined()) sums_[s] += sum(F).item<double>(), counts_[s] += static_cast<double>(F.numel());
        ++s;
      }
  }
  // {"L0.omega_align": [...], "L0.asam_gate": x, ...} for metrics.jsonl, and the flat columns for the CSV.
  void values(json& mech, std::map<std::string, double>& flat) const {
    size_t s = 0;
    for (size_t l = 0; l < r_.attention.size(); ++l) {
      if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r_.attention[l])) {
        const std::pair<const char*, Tensor> ws[] = {
            {"omega_align", a->omega_align}, {"omega_sep", a->omega_sep}, {"omega_coh", a->omega_coh}};
        for (const auto& [name, w] : ws) {
          std::vector<double> v = w.to(Device::cpu()).to(kFloat64).to_vector<double>();
          mech[fmt::format("L{}.{}", l, name)] = v;
          for (size_t h = 0; h < v.size(); ++h) flat[fmt::format("L{}.{}.h{}", l, name, h)] = v[h];
        }
      }
      if (std::dynamic_pointer_cast<nn::AsamAttention>(r_.attention[l])) {
        const double g = mean_of(s++);
        mech[fmt::format("L{}.asam_gate", l)] = jnum(g);
        flat[fmt::format("L{}.asam_gate", l)] = g;
      }
    }
    if (r_.firing) {
      int l = 0;
      for (auto* layer : {r_.firing->hidden.get(), r_.firing->second.get()}) {
        const double rate = mean_of(s++), sp = mean(layer->SP).item<double>();
        mech[fmt::format("L{}.firing_rate", l)] = jnum(rate);
        mech[fmt::format("L{}.firing_threshold", l)] = sp;
        flat[fmt::format("L{}.firing_rate", l)] = rate;
        flat[fmt::format("L{}.firing_threshold", l)] = sp;
        ++l;
      }
    }
  }

 private:
  size_t slots() const {
    size_t n = 0;
    for (auto& a : r_.attention) n += std::dynamic_pointer_cast<nn::AsamAttention>(a) ? 1 : 0;
    return n + (r_.firing ? 2 : 0);
  }
  double mean_of(size_t s) const { return s < counts_.size() && counts_[s] > 0 ? sums_[s] / counts_[s] : std::nan(""); }
  const Run& r_;
  std::vector<double> sums_, counts_;
};

// ---- one step's arithmetic: loss and accuracy of a batch
// -------------------------------------------------------------

struct BatchResult {
  Tensor loss;               // scalar: the mean task loss (+ auxiliary losses when training)
  Tensor example_loss;       // (B) per-example loss (classifiers) — for predictions
  Tensor prediction;         // (B) classifiers, or (B, T-1) the LM's next-byte guesses
  double task_loss_sum = 0;  // summed over the examples (classifier) or the predicted bytes (LM)
  double correct = 0, count = 0;
  // The three above as (3) float64 on the model's device until read(): a training step reads them once, after its
  // backward is queued, so the host does not wait for the forward before queueing the backward.
  Tensor sums;
  void read() {
    if (!sums.defined()) return;
    const std::vector<double> v = sums.to_vector<double>();
    task_loss_sum = v[0], correct = v[1], count = v[2];
    sums = Tensor();
  }
};

BatchResult run_batch(Run& r, const data::Batch& b, bool training) {
  BatchResult out;
  Tensor input = b.input.to(r.device), valid = b.valid.defined() ? b.valid.to(r.device) : Tensor();
  if (is_floating(input.dtype()) && input.dtype() != r.dtype) input = input.to(r.dtype);  // images: --dtype
  if (r.is_lm()) {
    const int64_t T = input.size(1);
    ASC_CHECK(T >= 2, "the LM needs sequences of at least 2 tokens, got a batch of length {}", T);
    Tensor logits = r.lm->forward(input).narrow(1, 0, T - 1);  // (B, T-1, V): predicts tokens 1..T-1
    Tensor target = input.narrow(1, 1, T - 1);                 // (B, T-1)
    if (valid.defined()) target = where(valid.narrow(1, 1, T - 1), target, -100.0).to(kInt64);
    const int64_t V = logits.size(2);
    Tensor flat_t = target.reshape({-1});
    Tensor per = cross_entropy(logits.reshape({-1, V}), flat_t, {.reduction = Reduction::None});  // 0 at ignored
    // the predicted bytes, counted in float32 / float64 (exact; bfloat16 is not past 256), the loss divided there
    const DType acc = per.dtype() == kFloat64 ? kFloat64 : kFloat32;
    const Tensor n = sum(ne(flat_t, -100.0).to(acc));
    out.loss = (sum(per).to(acc) / clamp(n, 1.0, std::nullopt)).to(per.dtype());
    out.prediction = argmax(logits, -1);
    NoGradGuard ng;
    out.sums = cat({sum(per).to(kFloat64).view({1}),
                    sum(eq(out.prediction.reshape({-1}), flat_t).to(kFloat64)).view({1}), n.to(kFloat64).view({1})},
                   0);
  } else {
    Tensor logits = r.firing ? r.firing->forward(input.reshape({input.size(0), -1}))
                    : r.mlp  ? r.mlp->forward(input.reshape({input.size(0), -1}))
                             : r.classifier->forward(input, valid);  // (B, classes)
    Tensor labels = b.labels.to(r.device);
    out.example_loss = cross_entropy(logits, labels, {.reduction = Reduction::None});  // (B)
    out.loss = mean(out.example_loss);
    if (training && r.classifier) {
      Tensor aux = r.classifier->aux_loss();
      out.loss = out.loss + aux;
    }
    out.prediction = argmax(logits, -1);
    NoGradGuard ng;
    out.sums =
        cat({sum(out.example_loss).to(kFloat64).view({1}), sum(eq(out.prediction, labels).to(kFloat64)).view({1}),
             full({1}, static_cast<double>(b.size()), {.dtype = kFloat64, .device = r.device})},
            0);
  }
  if (!training) out.read();  // evaluation reads at once
  return out;
}

// ---- evaluation -----------------------------------------------------------------------------------------------------

struct EvalResult {
  double loss = 0, accuracy = 0, count = 0;
  std::vector<std::array<double, 5>> predictions;  // index, label, prediction, correct, loss
};

EvalResult evaluate(Run& r, const data::Dataset& ds, int64_t max_batches, MechStats& mech, bool keep_predictions,
                    const std::function<void(const data::Batch&)>& after_batch = {}) {
  NoGradGuard ng;
  r.model->eval();
  mech.reset();
  EvalResult e;
  double loss_sum = 0;
  int64_t batches = 0;
  struct Stop {};
  try {
    data::for_each_batch(ds, r.c.batch, r.task.pad_id, [&](const data::Batch& b) {
      if (max_batches > 0 && batches >= max_batches) throw Stop{};
      BatchResult br = run_batch(r, b, false);
      mech.observe();
      if (after_batch) after_batch(b);
      loss_sum += br.task_loss_sum, e.accuracy += br.correct, e.count += br.count;
      if (keep_predictions && !r.is_lm()) {
        std::vector<int64_t> pred = br.prediction.to(Device::cpu()).to_vector<int64_t>();
        std::vector<double> el = br.example_loss.to(Device::cpu()).to(kFloat64).to_vector<double>();
        std::vector<int64_t> lab = b.labels.to_vector<int64_t>();
        for (size_t i = 0; i < pred.size(); ++i)
          e.predictions.push_back({static_cast<double>(b.indices[i]), static_cast<double>(lab[i]),
                                   static_cast<double>(pred[i]), pred[i] == lab[i] ? 1.0 : 0.0, el[i]});
      }
      ++batches;
    });
  } catch (const Stop&) {
  }
  r.model->train();
  e.loss = loss_sum / std::max(1.0, e.count);
  e.accuracy /= std::max(1.0, e.count);
  return e;
}

// ---- output files ---------------------------------------------------------------------------------------------------

class MetricsWriter {
 public:
  MetricsWriter(const fs::path& dir, std::vector<std::string> mech_columns, bool lm, bool append)
      : mech_(std::move(mech_columns)), lm_(lm) {
    const bool fresh = !append || !fs::exists(dir / "metrics.csv");
    csv_.open(dir / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
    jsonl_.open(dir / "metrics.jsonl", fresh ? std::ios::trunc : std::ios::app);
    ASC_CHECK(csv_ && jsonl_, "cannot write metrics files in {}", dir.string());
    if (fresh) {
      csv_ << "step,epoch,split,loss,accuracy,lr,tokens_per_s,time_s" << (lm_ ? ",bits_per_byte" : "");
      for (const auto& m : mech_) csv_ << "," << m;
      csv_ << "\n";
    }
  }
  void row(int64_t step, double epoch, const std::string& split, double loss, double acc, double lr, double tps,
           double time_s, const json& mech, const std::map<std::string, double>& flat) {
    csv_ << step << "," << num(epoch) << "," << split << "," << num(loss) << "," << num(acc) << "," << num(lr) << ","
         << num(tps) << "," << num(time_s);
    if (lm_) csv_ << "," << num(loss / std::log(2.0));
    for (const auto& m : mech_) {
      auto it = flat.find(m);
      csv_ << "," << (it == flat.end() ? "" : num(it->second));
    }
    csv_ << "\n";
    json j = {{"step", step},
              {"epoch", epoch},
              {"split", split},
              {"loss", jnum(loss)},
              {"accuracy", jnum(acc)},
              {"lr", lr},
              {"tokens_per_s", jnum(tps)},
              {"time_s", time_s}};
    if (lm_) j["bits_per_byte"] = jnum(loss / std::log(2.0));
    j["mech"] = mech.is_null() ? json::object() : mech;
    jsonl_ << j.dump() << "\n";
    csv_.flush(), jsonl_.flush();
  }

 private:
  std::ofstream csv_, jsonl_;
  std::vector<std::string> mech_;
  bool lm_;
};

// Keeps the train and val rows of metrics.csv / metrics.jsonl up to `step`: a resumed run rewrites what came after its
// checkpoint, and its own test row replaces any earlier one. A line cut short (a run killed mid-write) is dropped.
void truncate_metrics(const fs::path& dir, int64_t step) {
  for (const char* name : {"metrics.csv", "metrics.jsonl"}) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) continue;
    std::ifstream in(p);
    std::vector<std::string> keep;
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (std::string(name) == "metrics.csv" && first) {
        keep.push_back(line), first = false;
        continue;
      }
      int64_t s = -1;
      std::string split;
      try {
        if (std::string(name) == "metrics.csv") {
          const size_t a = line.find(','), b = line.find(',', a + 1), e = line.find(',', b + 1);
          if (a == std::string::npos || b == std::string::npos || e == std::string::npos) continue;
          s = std::stoll(line.substr(0, a)), split = line.substr(b + 1, e - b - 1);
        } else {
          const json j = json::parse(line);
          s = j.at("step").get<int64_t>(), split = j.at("split").get<std::string>();
        }
      } catch (const std::exception&) {
        continue;  // a line cut short
      }
      if (s <= step && split != "test") keep.push_back(line);
    }
    in.close();
    std::ofstream o(p, std::ios::trunc);
    for (const auto& l : keep) o << l << "\n";
  }
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p.string() + ".tmp", std::ios::trunc);
  f << j.dump(2) << "\n";
  f.close();
  ASC_CHECK(f.good(), "cannot write {}", p.string());
  fs::rename(p.string() + ".tmp", p);
}

// ---- the run --------------------------------------------------------------------------------------------------------

// ---- interpretability: do the heads group tokens the way the data's latent groups do?
// --------------------------------

// For the first n test examples of a task with true groups (grouping): per layer and head, k-means (k = the number of
// groups in the example) on the rows of the attention matrix A (T, T) and, for ASCender, on the latent z (T, d_z);
// NMI and ARI of those clusters against the true groups, their silhouette and Calinski-Harabasz in that space. Means
// over the examples; a score that is undefined for an example (k-means found one cluster) is left out of its mean and
// counted in "undefined".
json cluster_metrics(Run& r, int64_t n) {
  NoGradGuard ng;
  r.model->eval();
  r.classifier->need_weights = true;
  const size_t L = r.attention.size();
  std::vector<Tensor> inputs(L);  // each ASCender layer's input, for z
  std::vector<int> hooks(L, -1);
  for (size_t l = 0; l < L; ++l)
    if (std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]))
      hooks[l] =
          r.attention[l]->add_forward_pre_hook([&inputs, l](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
            inputs[l] = x.detach();
            return std::nullopt;
          });
  struct Restore {  // the model as it was, also when a measure throws
    Run& r;
    std::vector<int>& hooks;
    ~Restore() {
      r.classifier->need_weights = false;
      for (size_t l = 0; l < hooks.size(); ++l)
        if (hooks[l] >= 0) r.attention[l]->remove_hook(hooks[l]);
      r.model->train();
    }
  } restore{r, hooks};
  const int64_t H = r.c.heads;
  // sums[space][l][h][metric], metrics: nmi, ari, silhouette, calinski_harabasz; counts of defined values
  constexpr int kMetrics = 4;
  const char* metric_names[kMetrics] = {"nmi", "ari", "silhouette", "calinski_harabasz"};
  auto grid = [&] {
    return std::vector<std::vector<std::array<double, kMetrics>>>(L, std::vector<std::array<double, kMetrics>>(H));
  };
  std::map<std::string, decltype(grid())> sums, counts;
  int64_t seen = 0;
  struct Stop {};
  auto score = [&](const std::string& space, size_t l, int64_t h, const std::vector<double>& x, int64_t d,
                   const std::vector<int64_t>& truth, int64_t k, uint64_t seed) {
    if (!sums.count(space)) sums[space] = grid(), counts[space] = grid();
    const stats::KMeansResult km = stats::kmeans(x, d, k, {.seed = seed});
    const int64_t found = static_cast<int64_t>(std::set<int64_t>(km.labels.begin(), km.labels.end()).size());
    const int64_t T = static_cast<int64_t>(truth.size());
    const double v[kMetrics] = {
        stats::normalized_mutual_info(truth, km.labels), stats::adjusted_rand_index(truth, km.labels),
        found >= 2 && found <= T - 1 ? stats::silhouette_score(x, d, km.labels) : std::nan(""),
        found >= 2 && found <= T - 1 ? stats::calinski_harabasz_score(x, d, km.labels) : std::nan("")};
    for (int m = 0; m < kMetrics; ++m)
      if (std::isfinite(v[m])) sums[space][l][h][m] += v[m], counts[space][l][h][m] += 1;
  };
  try {
    data::for_each_batch(*r.task.test, r.c.batch, r.task.pad_id, [&](const data::Batch& b) {
      run_batch(r, b, false);
      const std::vector<int64_t> groups = b.groups.to_vector<int64_t>();  // (B, T)
      const int64_t B = b.size(), T = b.groups.size(1);
      // Once per batch and layer: A (B, H, T, T); z (B, T, H·d_z) from the layer's input (ASCender only)
      std::vector<Tensor> As(L), zs(L);
      for (size_t l = 0; l < L; ++l) {
        As[l] = r.attention[l]->attention_weights().to(Device::cpu()).to(kFloat64);
        if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]))
          zs[l] = (*a->z_proj)(inputs[l]).to(Device::cpu()).to(kFloat64);
      }
      for (int64_t i = 0; i < B && seen < n; ++i, ++seen) {
        std::vector<int64_t> truth(groups.begin() + i * T, groups.begin() + (i + 1) * T);
        const int64_t k = static_cast<int64_t>(std::set<int64_t>(truth.begin(), truth.end()).size());
        if (k < 2) continue;  // one group: nothing to recover
        for (size_t l = 0; l < L; ++l) {
          const Tensor& A = As[l];
          const Tensor& z = zs[l];
          for (int64_t h = 0; h < H; ++h) {
            const uint64_t seed = (static_cast<uint64_t>(seen) * L + l) * static_cast<uint64_t>(H) + h;  // distinct
            score("A", l, h, A.select(0, i).select(0, h).contiguous().to_vector<double>(), T, truth, k, seed);
            if (z.defined()) {
              const int64_t dz = z.size(2) / H;
              Tensor zh = z.select(0, i).view({T, H, dz}).select(1, h).contiguous();  // (T, d_z)
              score("z", l, h, zh.to_vector<double>(), dz, truth, k, seed);
            }
          }
        }
      }
      if (seen >= n) throw Stop{};
    });
  } catch (const Stop&) {
  }
  json out = {{"examples", seen}, {"k", "the number of true groups in each example"}, {"spaces", json::object()}};
  for (auto& [space, s] : sums) {
    json layers = json::array();
    std::array<double, kMetrics> total{}, total_n{};
    for (size_t l = 0; l < L; ++l) {
      json heads = json::array();
      for (int64_t h = 0; h < H; ++h) {
        json m = json::object();
        for (int k = 0; k < kMetrics; ++k) {
          const double c = counts[space][l][h][k];
          m[metric_names[k]] = c > 0 ? json(s[l][h][k] / c) : json(nullptr);
          m[std::string(metric_names[k]) + "_undefined"] = static_cast<double>(seen) - c;
          total[k] += s[l][h][k], total_n[k] += c;
        }
        heads.push_back(m);
      }
      layers.push_back(heads);
    }
    json mean = json::object();
    for (int k = 0; k < kMetrics; ++k)
      mean[metric_names[k]] = total_n[k] > 0 ? json(total[k] / total_n[k]) : json(nullptr);
    out["spaces"][space] = {{"layers", layers}, {"mean_over_heads", mean}};
  }
  return out;
}

// ---- robustness: how the trained classifier's outputs respond to perturbed inputs, and its attention to precision and
// length (the rows of seed 004's robustness table, defined in docs/train.md) -----------------------------------------

json robustness(Run& r) {
  const Config& c = r.c;
  auto& model = *r.classifier;
  model.eval();
  // (1) The input embeddings of the first examples of the test set, perturbed through a hook on the token embedding.
  Generator gen(c.seed + 7919);
  std::function<Tensor(const Tensor&)> perturb;  // embeddings (B, T, D) -> what the model reads
  const int hook =
      model.tok_emb->add_forward_post_hook([&](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
        if (!perturb) return std::nullopt;
        return perturb(out);
      });
  struct RemoveHook {  // the hook refers to `perturb`: it must not outlive this function, also when a measure throws
    nn::Module& m;
    int id;
    ~RemoveHook() { m.remove_hook(id); }
  } remove_hook{*model.tok_emb, hook};
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, n = 0;  // Pearson sums over every logit, clean vs noisy
  double clean_sq = 0, change_sq = 0;                       // FGSM: ||L_adv - L||² and ||L||²
  int64_t seen = 0;
  struct Stop {};
  try {
    data::for_each_batch(*r.task.test, c.batch, r.task.pad_id, [&](const data::Batch& b) {
      if (seen >= c.robustness_examples) throw Stop{};
      Tensor x = b.input.to(r.device), valid = b.valid.defined() ? b.valid.to(r.device) : Tensor();
      Tensor labels = b.labels.to(r.device);
      Tensor clean, noisy, adv;
      {
        NoGradGuard ng;
        perturb = nullptr;
        clean = model.forward(x, valid);  // (B, classes)
        perturb = [&](const Tensor& e) {  // Gaussian noise of 10 % of the embeddings' standard deviation
          const double sd = std::sqrt(mean(pow(e - mean(e), 2.0)).item<double>());
          return e + randn(e.shape(), {.dtype = e.dtype(), .device = e.device()}, &gen) * (0.1 * sd);
        };
        noisy = model.forward(x, valid);
      }
      Tensor leaf;  // FGSM: the gradient of the loss with respect to the embeddings
      perturb = [&](const Tensor& e) {
        leaf = e.detach();
        leaf.set_requires_grad(true);
        return leaf;
      };
      cross_entropy(model.forward(x, valid), labels).backward();
      const Tensor step = (gt(leaf.grad(), 0.0).to(leaf.dtype()) - lt(leaf.grad(), 0.0).to(leaf.dtype())) * 0.01;
      {
        NoGradGuard ng;
        perturb = [&](const Tensor& e) { return e + step; };
        adv = model.forward(x, valid);
      }
      perturb = nullptr;
      model.zero_grad();
      const std::vector<double> a = clean.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      const std::vector<double> z = noisy.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      const std::vector<double> v = adv.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      for (size_t i = 0; i < a.size(); ++i) {
        sx += a[i], sy += z[i], sxx += a[i] * a[i], syy += z[i] * z[i], sxy += a[i] * z[i], n += 1;
        clean_sq += a[i] * a[i], change_sq += (v[i] - a[i]) * (v[i] - a[i]);
      }
      seen += b.size();
    });
  } catch (const Stop&) {
  }
  perturb = nullptr;
  const double cov = sxy - sx * sy / n, vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
  json out = {{"examples", seen},
              {"noise_correlation", jnum(cov / std::sqrt(vx * vy))},
              {"fgsm_relative_change", jnum(std::sqrt(change_sq / clean_sq))}};
  // (2) The first attention layer alone on N(0, 1) inputs of width d_model: float32 against float64, same weights.
  auto& layer = *r.attention[0];
  const int64_t D = c.d_model, T = r.task.max_len;
  {
    NoGradGuard ng;
    Tensor x = randn({2, T, D}, {.device = r.device}, &gen);
    Tensor y32 = layer.attend(x, {}).to(Device::cpu()).to(kFloat64);
    layer.to(kFloat64);
    Tensor y64 = layer.attend(x.to(kFloat64), {}).to(Device::cpu());
    layer.to(kFloat32);
    out["float32_vs_float64_max_relative"] = jnum(amax(abs(y32 - y64)).item<double>() / amax(abs(y64)).item<double>());
  }
  // (3) Forward + backward of that layer at every power of two from 16 to --robustness-max-len.
  json lengths = json::array();
  for (int64_t len = 16; len <= c.robustness_max_len; len *= 2) {
    json row = {{"length", len}};
    try {
      reset_cpu_peak_memory();
      const auto t0 = std::chrono::steady_clock::now();
      Tensor x = randn({1, len, D}, {.device = r.device, .requires_grad = true}, &gen);
      Tensor y = layer.attend(x, {});
      sum(y).backward();
      const bool finite = std::isfinite(sum(y).item<double>()) && std::isfinite(sum(x.grad()).item<double>());
      row["ok"] = finite;
      row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row["peak_mb"] = static_cast<double>(cpu_memory_stats().peak_allocated) / (1 << 20);
    } catch (const std::exception& e) {
      row["ok"] = false;
      row["error"] = e.what();
    }
    layer.zero_grad();
    lengths.push_back(row);
  }
  out["lengths"] = lengths;
  model.train();
  return out;
}

int train_main(Config c, const Options& options, bool resume, const std::string& eval_only, const std::string& command,
               bool params_only) {
#ifdef _OPENMP
  if (c.threads > 0) omp_set_num_threads(static_cast<int>(c.threads));
#endif
  // First thing: a SIGINT during the set-up (data, model, checkpoint, the GEMM peak measurement) stops the run after
  // its first step with a checkpoint, like one during training, instead of killing it without one.
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  Run r;
  r.c = c;
  ASC_CHECK(c.device != "cuda" || cuda::is_available(), "--device cuda, but {}",
            cuda::is_available() ? "" : "no CUDA device is available in this build / machine");
  r.device = c.device == "cuda" ? Device::cuda(0) : Device::cpu();
  r.dtype = c.dtype == "bfloat16" ? kBFloat16 : kFloat32;
  ASC_CHECK(!c.tf32 || r.device.is_cuda(), "--tf32 applies to --device cuda (TF32 is a GPU tensor-core format)");
  ASC_CHECK(r.dtype == kFloat32 || r.device.is_cuda(),
            "--dtype {} needs --device cuda (the CPU kernels compute in float32 / float64)", c.dtype);
  ASC_CHECK(r.dtype == kFloat32 || c.model != "firing",
            "--dtype {}: the firing network's local rules and gate update float32 parameters; use --dtype float32",
            c.dtype);
  if (c.tf32) cuda::set_allow_tf32(true);
  const fs::path out = c.out;
  const fs::path last_ckpt = out / "ckpt" / "last.safetensors";
  if (!params_only) fs::create_directories(out / "ckpt");
  if (!resume && !params_only)
    ASC_CHECK(!fs::exists(out / "metrics.csv"),
              "{} already holds a run (metrics.csv); continue it with --resume or choose another --out", out.string());

  manual_seed(c.seed);
  r.task = data::make_task(c.task, {.seed = c.data_seed,
                                    .train_size = c.train_size,
                                    .val_size = c.val_size,
                                    .test_size = c.test_size,
                                    .min_len = c.min_len,
                                    .max_len = c.max_len,
                                    .data_dir = c.data_dir,
                                    .image_size = c.image_size});
  ASC_CHECK(r.task.train->size() > 0 && r.task.val->size() > 0 && r.task.test->size() > 0,
            "task {} has an empty split (train {}, val {}, test {})", c.task, r.task.train->size(), r.task.val->size(),
            r.task.test->size());
  manual_seed(c.seed);  // the model's initialisation depends on --seed only
  build_model(r);
  if (params_only) {  // the model's size and cost at the task's length, nothing written
    int64_t n = 0;
    for (const Tensor& p : r.model->parameters()) n += p.numel();
    const models::FlopCount f = models::count_flops(*r.model, r.task.max_len);
    const double len = static_cast<double>(r.task.max_len);
    fmt::print("{}\n", json({{"params", n},
                             {"max_len", r.task.max_len},
                             {"flops_per_token", f.forward / len},
                             {"attention_flops_per_token", f.attention / len}})
                           .dump());
    return 0;
  }
  for (int64_t i : c.dump_decomposition)  // checked now, not after the training it would follow
    ASC_CHECK(i >= 0 && i < r.task.test->size(), "--dump-decomposition {}: the test split has {} examples", i,
              r.task.test->size());
  ASC_CHECK(c.cluster_metrics == 0 ||
                (r.classifier && c.model != "asam" && c.model != "window" && c.model != "window-global"),
            "--cluster-metrics needs the attention classifier with dense or ASCender attention (--model dense or "
            "ascender)");
  ASC_CHECK(!c.robustness || r.classifier,
            "--robustness needs an attention classifier (--model dense, ascender, asam, "
            "window or window-global)");
  ASC_CHECK(!c.robustness || (c.robustness_max_len & (c.robustness_max_len - 1)) == 0,
            "--robustness-max-len must be a power of two, got {}", c.robustness_max_len);
  ASC_CHECK(c.cluster_metrics == 0 || r.task.test->get(0).groups.defined(),
            "--cluster-metrics needs a task whose examples carry their tokens' true groups (--task grouping)");
  ASC_CHECK(
      c.dump_decomposition.empty() ||
          std::any_of(r.attention.begin(), r.attention.end(),
                      [](const auto& a) { return std::dynamic_pointer_cast<nn::AscenderAttention>(a) != nullptr; }),
      "--dump-decomposition needs ASCender attention (--model ascender, or --model lm --lm-attention ascender)");
  MechStats mech(r), train_mech(r);  // evaluation's, and the training batches' since the last log row

  // Rule A is local only (docs/firing.md §5): the first firing layer's parameters sit in a group of their own at
  // learning rate 0 and weight decay 0, so only the rule moves them; backprop trains the layers after it.
  std::vector<Tensor> params, local;
  const std::vector<Tensor> rule_a_params =
      r.firing && c.rule == "A" ? r.firing->hidden->parameters() : std::vector<Tensor>{};
  for (const Tensor& p : r.model->parameters()) {
    const bool is_local =
        std::any_of(rule_a_params.begin(), rule_a_params.end(), [&](const Tensor& h) { return h.is_same(p); });
    (is_local ? local : params).push_back(p);
  }
  // ... and get no gradient at all: a parameter without a .grad is skipped by the optimizer whatever its group's
  // learning rate becomes (a schedule's --min-lr would otherwise move them).
  for (Tensor& p : local) p.set_requires_grad(false);
  // --dtype bfloat16: the optimizer (and the gradient clipping) work on float32 master copies; after each update the
  // masters are rounded into the model (optim/amp.h). bfloat16 has float32's range, so no loss scaling is needed.
  std::optional<optim::MasterWeights> master;
  if (r.dtype != kFloat32) {
    master.emplace(params);
    params = master->parameters();
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (c.optimizer == "adamw") {
    auto o = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay});
    if (!local.empty()) o->add_param_group(local, {.lr = 0.0, .weight_decay = 0.0});
    opt = std::move(o);
  } else if (c.optimizer == "adam") {
    auto o = std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = c.lr, .weight_decay = c.weight_decay});
    if (!local.empty()) o->add_param_group(local, {.lr = 0.0, .weight_decay = 0.0});
    opt = std::move(o);
  } else {
    auto o = std::make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
    if (!local.empty()) o->add_param_group(local, {.lr = 0.0, .momentum = 0.0, .weight_decay = 0.0});
    opt = std::move(o);
  }
  if (r.firing && c.rule == "B")
    opt->add_local_rule(r.firing->hidden->rule_b({.eta_w = c.eta_w,
                                                  .eta_f = c.eta_f,
                                                  .eta_sp = c.eta_sp,
                                                  .r_target = c.r_target,
                                                  .w_min = c.w_min,
                                                  .w_max = c.w_max,
                                                  .f_min = c.f_min,
                                                  .f_max = c.f_max}));
  if (r.firing && c.rule == "A")
    opt->add_local_rule(r.firing->hidden->rule_a({.eta_plus = c.eta_w,
                                                  .eta_minus = c.eta_w,
                                                  .rho_plus = c.eta_f,
                                                  .rho_minus = c.eta_f,
                                                  .eta_sp = c.eta_sp,
                                                  .w_max = c.w_max,
                                                  .f_max = c.f_max,
                                                  .r_target = c.r_target}));
  ASC_CHECK(!(c.rule != "none" && !r.firing), "--rule {} applies to --model firing only", c.rule);

  data::DataLoader loader(r.task.train, {.batch_size = c.batch,
                                         .shuffle = true,
                                         .seed = c.seed,
                                         .drop_last = true,
                                         .prefetch = c.prefetch,
                                         .pad_id = r.task.pad_id});
  const int64_t total = c.steps > 0 ? c.steps : c.epochs * loader.batches_per_epoch();
  const int64_t eval_every = c.eval_every > 0 ? c.eval_every : std::max<int64_t>(1, total / 10);
  const int64_t log_every = c.log_every > 0 ? c.log_every : std::max<int64_t>(1, std::min(eval_every, total / 50));
  const int64_t ckpt_every = c.ckpt_every > 0 ? c.ckpt_every : eval_every;
  std::unique_ptr<optim::LRScheduler> sched;
  if (c.schedule == "cosine")
    sched = std::make_unique<optim::WarmupCosine>(
        *opt,
        optim::WarmupCosineOptions{
            .warmup_steps = std::min(c.warmup, total), .total_steps = std::max<int64_t>(total, 1), .min_lr = c.min_lr});
  else
    sched = std::make_unique<optim::LambdaLR>(*opt, [w = c.warmup](int64_t s) {
      return w > 0 && s < w ? static_cast<double>(s + 1) / static_cast<double>(w) : 1.0;
    });

  const int64_t n_params = [&] {
    int64_t n = 0;
    for (const Tensor& p : r.model->parameters()) n += p.numel();
    return n;
  }();
  const models::FlopCount flops_max = models::count_flops(*r.model, r.task.max_len);
  // MFU's denominator: the processor's fp32 peak (core/cpu_peak.h); no GPU peak is known here
  const double peak = r.device.is_cuda() ? 0.0 : cpu_peak().fp32_flops;

  // State carried through checkpoints.
  int64_t step = 0, best_step = -1;
  double best_val = -1, wall_before = 0;
  double acc_loss = 0, acc_correct = 0, acc_count = 0, acc_tokens = 0;
  int64_t nonfinite_steps = 0;
  auto save_state = [&] {
    std::map<std::string, std::string> m = {{"step", std::to_string(step)},
                                            {"best_step", std::to_string(best_step)},
                                            {"best_val", fmt::format("{:a}", best_val)},
                                            {"loader.epoch", std::to_string(loader.state().epoch)},
                                            {"loader.position", std::to_string(loader.state().position)},
                                            {"loader.seed", std::to_string(loader.state().seed)},
                                            {"acc.loss", fmt::format("{:a}", acc_loss)},
                                            {"acc.correct", fmt::format("{:a}", acc_correct)},
                                            {"acc.count", fmt::format("{:a}", acc_count)},
                                            {"acc.tokens", fmt::format("{:a}", acc_tokens)},
                                            {"mech.train", train_mech.state()}};
    m["wall_s"] = num(wall_before);
    m["nonfinite_steps"] = std::to_string(nonfinite_steps);
    save_checkpoint(last_ckpt.string(),
                    {.model = r.model.get(),
                     .optimizer = opt.get(),
                     .scheduler = sched.get(),
                     .generator = &default_generator(),
                     .master = master ? &*master : nullptr},
                    m);
  };

  if (!eval_only.empty()) {
    r.model->load_state_dict(load_safetensors(eval_only));
  } else if (resume) {
    ASC_CHECK(fs::exists(last_ckpt), "--resume, but {} has no checkpoint ({})", out.string(), last_ckpt.string());
    std::map<std::string, std::string> m;
    load_checkpoint(last_ckpt.string(),
                    {.model = r.model.get(),
                     .optimizer = opt.get(),
                     .scheduler = sched.get(),
                     .generator = &default_generator(),
                     .master = master ? &*master : nullptr},
                    &m);
    auto get = [&](const std::string& k) {
      ASC_CHECK(m.count(k), "checkpoint {} lacks '{}' (not written by train?)", last_ckpt.string(), k);
      return m.at(k);
    };
    auto integer = [&](const std::string& k) {
      const std::string v = get(k);
      int64_t x = 0;
      ASC_CHECK(tools::detail::parse_int(v, x), "checkpoint {}: '{}' is not an integer ('{}')", last_ckpt.string(), k,
                v);
      return x;
    };
    auto real = [&](const std::string& k) {  // hex floats (exact) or decimal
      const std::string v = get(k);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      ASC_CHECK(!v.empty() && *end == '\0', "checkpoint {}: '{}' is not a number ('{}')", last_ckpt.string(), k, v);
      return x;
    };
    step = integer("step"), best_step = integer("best_step");
    best_val = real("best_val"), wall_before = real("wall_s");
    acc_loss = real("acc.loss"), acc_correct = real("acc.correct"), acc_count = real("acc.count");
    acc_tokens = real("acc.tokens");
    nonfinite_steps = m.count("nonfinite_steps") ? integer("nonfinite_steps") : 0;  // older checkpoints: none
    train_mech.set_state(get("mech.train"));
    loader.set_state(
        {integer("loader.epoch"), integer("loader.position"), static_cast<uint64_t>(std::stoull(get("loader.seed")))});
    truncate_metrics(out, step);
  }
  json cfg = options.save();
  cfg["git_commit"] = git_commit();
  cfg["command"] = command;
  if (eval_only.empty()) write_json(out / "config.json", cfg);

  // Progress: one line redrawn on a terminal, plain lines otherwise (tools/cli.h).
  const bool show = c.progress != "none";
  tools::Progress progress(total, fmt::format("train {} {}", c.model, c.task));
  progress.set_plain_every(c.progress_every);

  MetricsWriter metrics(out, mech.columns(), r.is_lm(), resume || !eval_only.empty());
  auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return wall_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  // The lr the last step ran with: a run resumed after its last step (a SIGINT between it and the test evaluation)
  // reports the same test row as an uninterrupted one, not the scheduler's next lr.
  double lr_used = step > 0 && sched->last_step() > 0 ? sched->lr_at(0, sched->last_step() - 1) : opt->lr(0);
  auto lr_now = [&] { return lr_used; };
  // Throughput windows run from one log row to the next, less the time spent validating and checkpointing.
  double tokens_per_s = 0, flops_done = 0, window_t0 = elapsed(), window_tokens = 0, paused = 0;

  reset_cpu_peak_memory();
  bool interrupted = false;
  if (eval_only.empty()) {
    r.model->train();
    const int64_t first_step = step;
    // --profile N: steps [profile_from, profile_from + N), after one warm-up step when the run has room for it
    const int64_t profile_from = total - first_step > c.profile ? first_step + 1 : first_step;
    std::optional<profiler::Profile> prof;
    auto finish_profile = [&] {
      prof->stop();
      const int64_t steps = std::min(step, profile_from + c.profile) - profile_from;
      const std::string table = fmt::format("train --profile: {} step(s) from step {} ({})\n{}", steps,
                                            profile_from + 1, out.string(), prof->table(30));
      std::ofstream(out / "profile.txt") << table;
      prof->write_chrome_trace((out / "profile_trace.json").string());
      progress.clear();
      fmt::print("{}profile: {} and {}\n", table, (out / "profile.txt").string(),
                 (out / "profile_trace.json").string());
      prof.reset();
    };
    while (step < total) {
      if (c.profile > 0 && step == profile_from) prof.emplace();
      std::optional<profiler::Range> step_range;
      if (prof) step_range.emplace("train_step");
      data::Batch b = loader.next();
      opt->zero_grad();
      if (master) r.model->zero_grad();  // the optimizer's parameters are the masters: the model's own .grad too
      BatchResult br = run_batch(r, b, true);
      train_mech.observe();
      br.loss.backward();
      br.read();  // the step's one read of its figures, with the backward queued
      if (master) master->copy_grads_to_master();
      // The gradient norm (clipped to --clip when it is set; --clip 0 only measures it): a NaN or infinite loss or
      // norm stops the run, or with --on-nonfinite skip leaves the parameters as they were and is counted.
      const double grad_norm = optim::clip_grad_norm(
          params, c.clip > 0 ? c.clip : std::numeric_limits<double>::infinity(), 2.0, /*error_if_nonfinite=*/false);
      lr_used = opt->lr(0);  // the rows report the lr this step ran with, not the next one's
      if (std::isfinite(br.task_loss_sum) && std::isfinite(grad_norm)) {
        opt->step();
        if (master) master->copy_master_to_model();
      } else {
        ++nonfinite_steps;
        ASC_CHECK(c.on_nonfinite == "skip",
                  "step {}: the loss ({}) or the gradient norm ({}) is not finite; "
                  "--on-nonfinite skip skips such steps and counts them",
                  step + 1, br.task_loss_sum, grad_norm);
      }
      sched->step();
      ++step;
      step_range.reset();
      if (prof && step == profile_from + c.profile) finish_profile();
      const int64_t T = b.input.dim() >= 2 ? b.input.size(1) : 1;
      flops_done += models::count_flops(*r.model, T).training() * static_cast<double>(b.size());
      if (std::isfinite(br.task_loss_sum))  // a skipped non-finite step is counted, not averaged into the loss
        acc_loss += br.task_loss_sum, acc_correct += br.correct, acc_count += br.count;
      acc_tokens += static_cast<double>(b.tokens), window_tokens += static_cast<double>(b.tokens);
      if (step % log_every == 0 || step == total) {
        const double now = elapsed();
        const double dt = std::max(1e-9, now - window_t0 - paused);
        tokens_per_s = window_tokens / dt;
        const double mfu = peak > 0 ? flops_done / dt / peak : std::nan("");
        window_t0 = now, window_tokens = 0, flops_done = 0, paused = 0;
        json mj;
        std::map<std::string, double> flat;
        train_mech.values(mj, flat);
        train_mech.reset();
        const double loss = acc_loss / std::max(1.0, acc_count), acc = acc_correct / std::max(1.0, acc_count);
        metrics.row(step, static_cast<double>(step) / static_cast<double>(loader.batches_per_epoch()), "train", loss,
                    acc, lr_now(), tokens_per_s, now, mj, flat);
        acc_loss = acc_correct = acc_count = acc_tokens = 0;
        if (show)
          progress.update(step,
                          fmt::format("loss {:.4f}  acc {:.1f}%  {:.0f} tok/s  MFU {}", loss, 100 * acc, tokens_per_s,
                                      std::isfinite(mfu) ? fmt::format("{:.1f}%", 100 * mfu) : "n/a"));
      }
      const double pause_t0 = elapsed();
      if (step % eval_every == 0 || step == total) {
        EvalResult v = evaluate(r, *r.task.val, c.eval_batches, mech, false);
        json mj;
        std::map<std::string, double> flat;
        mech.values(mj, flat);
        metrics.row(step, static_cast<double>(step) / static_cast<double>(loader.batches_per_epoch()), "val", v.loss,
                    v.accuracy, lr_now(), std::nan(""), elapsed(), mj, flat);
        const double score = r.is_lm() ? -v.loss : v.accuracy;
        if (best_step < 0 || score > best_val) {
          best_val = score, best_step = step;
          save_safetensors(
              (out / "best.safetensors").string(), r.model->state_dict(),
              {{"step", std::to_string(step)}, {"val_accuracy", num(v.accuracy)}, {"val_loss", num(v.loss)}});
        }
        if (show)
          progress.update(step, fmt::format("val loss {:.4f}  val acc {:.1f}%  (best at step {})", v.loss,
                                            100 * v.accuracy, best_step));
      }
      const bool part_done = c.stop_after > 0 && step - first_step >= c.stop_after && step < total;
      if (step % ckpt_every == 0 || step == total || g_stop || part_done) {
        // wall_s in the checkpoint: the time so far, so that a resumed run's clock goes on from it
        const double now = elapsed();
        wall_before = now, t_start = std::chrono::steady_clock::now();
        save_state();
      }
      paused += elapsed() - pause_t0;
      if (g_stop || part_done) {
        interrupted = true;
        break;
      }
    }
    if (prof) finish_profile();  // the run ended before N steps: what was recorded
    if (show)
      progress.finish(interrupted ? fmt::format("interrupted at step {}: saved {}", step, last_ckpt.string())
                                  : fmt::format("done: best validation at step {}", best_step));
  }
  if (interrupted) {
    fmt::print(stderr, "train: {} at step {} of {}; saved {} (continue with --resume --out {})\n",
               g_stop ? "interrupted" : "stopped (--stop-after)", step, total, last_ckpt.string(), out.string());
    return 130;
  }

  // ---- test: the best validation checkpoint, evaluated once --------------------------------------------------------
  if (eval_only.empty() && fs::exists(out / "best.safetensors"))
    r.model->load_state_dict(load_safetensors((out / "best.safetensors").string()));
  std::vector<std::vector<Tensor>> asam_gates(r.attention.size());
  std::vector<Tensor> firing_sum(2);
  double firing_n = 0;
  EvalResult val = evaluate(r, *r.task.val, 0, mech, false);
  const auto test_t0 = std::chrono::steady_clock::now();  // inference latency: the whole test pass, per example
  EvalResult test = evaluate(r, *r.task.test, 0, mech, true, [&](const data::Batch& b) {
    for (size_t l = 0; l < r.attention.size(); ++l)
      if (auto a = std::dynamic_pointer_cast<nn::AsamAttention>(r.attention[l]))
        asam_gates[l].push_back(a->last_gate().to(Device::cpu()));
    if (r.firing) {
      int l = 0;
      for (auto* layer : {r.firing->hidden.get(), r.firing->second.get()}) {
        Tensor F = layer->last_gate().to(Device::cpu()).to(kFloat32);
        Tensor s = sum(F.reshape({F.size(0), -1}), {0});
        firing_sum[l] = firing_sum[l].defined() ? firing_sum[l] + s : s;
        ++l;
      }
      firing_n += static_cast<double>(b.size());
    }
  });
  const double test_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - test_t0).count();
  {
    json mj;
    std::map<std::string, double> flat;
    mech.values(mj, flat);
    metrics.row(step, static_cast<double>(step) / static_cast<double>(loader.batches_per_epoch()), "test", test.loss,
                test.accuracy, lr_now(), std::nan(""), elapsed(), mj, flat);
  }
  {
    std::ofstream p(out / "predictions.csv", std::ios::trunc);
    p << "index,label,prediction,correct,loss\n";
    for (const auto& row : test.predictions)
      p << static_cast<int64_t>(row[0]) << "," << static_cast<int64_t>(row[1]) << "," << static_cast<int64_t>(row[2])
        << "," << static_cast<int64_t>(row[3]) << "," << num(row[4]) << "\n";
  }
  // ---- dumps
  // ---------------------------------------------------------------------------------------------------------
  fs::create_directories(out / "dumps");
  {
    StateDict g;
    for (size_t l = 0; l < asam_gates.size(); ++l)
      if (!asam_gates[l].empty()) g.set(fmt::format("L{}.gate", l), cat(asam_gates[l], 0).to(kFloat32));
    if (g.size() > 0) save_safetensors((out / "dumps" / "asam_gate.safetensors").string(), g);
    StateDict f;
    for (int l = 0; l < 2; ++l)
      if (firing_sum[l].defined()) f.set(fmt::format("L{}.rate", l), firing_sum[l] / std::max(1.0, firing_n));
    if (f.size() > 0) save_safetensors((out / "dumps" / "firing_rates.safetensors").string(), f);
  }
  for (int64_t i : c.dump_decomposition) {
    std::vector<std::shared_ptr<nn::AscenderAttention>> layers;  // the indices and the layers were checked at start
    for (auto& a : r.attention)
      if (auto x = std::dynamic_pointer_cast<nn::AscenderAttention>(a)) layers.push_back(x);
    data::Example ex = r.task.test->get(i);
    data::Batch b = data::collate({ex}, r.task.pad_id);
    NoGradGuard ng;
    r.model->eval();
    for (auto& l : layers) l->need_decomposition = true;
    run_batch(r, b, false);
    StateDict d;
    for (size_t l = 0; l < r.attention.size(); ++l) {
      auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]);
      if (!a) continue;
      AscenderDecomposition dec = a->decomposition();
      const std::pair<const char*, Tensor> parts[] = {{"S_base", dec.S_base}, {"align", dec.align}, {"sep", dec.sep},
                                                      {"coh", dec.coh},       {"S", dec.S},         {"A", dec.A}};
      for (const auto& [name, t] : parts)
        d.set(fmt::format("L{}.{}", l, name), t.select(0, 0).to(Device::cpu()).to(kFloat32).contiguous());
      a->need_decomposition = false;
    }
    d.set("tokens", b.input.select(0, 0).contiguous());
    save_safetensors((out / "dumps" / fmt::format("decomposition_{}.safetensors", i)).string(), d,
                     {{"example", std::to_string(i)}, {"label", std::to_string(ex.label)}});
    r.model->train();
  }
  // ---- summary
  // -------------------------------------------------------------------------------------------------------
  json s = {{"task", c.task},
            {"model", c.model},
            {"seed", c.seed},
            {"best_step", best_step},
            {"val_accuracy", jnum(val.accuracy)},
            {"val_loss", jnum(val.loss)},
            {"test_accuracy", jnum(test.accuracy)},
            {"test_loss", jnum(test.loss)},
            {"steps", step},
            {"wall_s", elapsed()},
            {"peak_mem_mb", static_cast<double>(cpu_memory_stats().peak_allocated) / (1 << 20)},
            {"tokens_per_s", jnum(tokens_per_s)},
            {"params", n_params},
            {"flops_per_token", flops_max.forward / static_cast<double>(r.task.max_len)},
            {"attention_flops_per_token", flops_max.attention / static_cast<double>(r.task.max_len)},
            {"fp32_peak_flops", jnum(peak)},
            {"test_examples", test.count},
            {"nonfinite_steps", nonfinite_steps},
            // batches of --batch, the loader and the bookkeeping included (what a user of the model waits for)
            {"test_ms_per_example", jnum(1000 * test_seconds / std::max(1.0, test.count))}};
  if (r.is_lm()) s["test_bits_per_byte"] = test.loss / std::log(2.0);
  write_json(out / "summary.json", s);
  // The analyses, after the summary (its peak memory is training's; a finished run stays finished): an analysis that
  // fails writes its error into its file and a warning, not a failed run.
  auto analysis = [&](const char* file, const std::function<json()>& f) {
    json j;
    try {
      j = f();
    } catch (const std::exception& e) {
      j = {{"error", e.what()}};
      fmt::print(stderr, "train: warning: {} failed: {}\n", file, e.what());
      r.model->train();
    }
    write_json(out / file, j);
  };
  if (c.cluster_metrics > 0) analysis("cluster_metrics.json", [&] { return cluster_metrics(r, c.cluster_metrics); });
  if (c.robustness) analysis("robustness.json", [&] { return robustness(r); });
  if (r.is_lm())
    fmt::print(
        "{}: test {:.4f} bits per byte (next-byte accuracy {:.2f}%; best validation at step {}), {} parameters, "
        "{:.1f} s; wrote {}\n",
        c.task, test.loss / std::log(2.0), 100 * test.accuracy, best_step, n_params, elapsed(), out.string());
  else
    fmt::print("{}: test accuracy {:.2f}% (best validation {:.2f}% at step {}), {} parameters, {:.1f} s; wrote {}\n",
               c.task, 100 * test.accuracy, 100 * val.accuracy, best_step, n_params, elapsed(), out.string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{
      "train: train and evaluate one model on one task; every output goes to --out DIR (see "
      "docs/train.md)",
      "train"};
  app.set_help_flag("-h,--help", "print this help (every option with its default) and exit");
  Options options(app);
  define_options(options, c);
  std::string config_file, eval_only;
  bool resume = false, params_only = false;
  app.add_option("--config", config_file, "a config.json of options (flags given here override it)");
  app.add_flag("--resume", resume,
               "continue the run in --out from its last checkpoint (its config.json, then these flags)");
  app.add_option("--stop-after", c.stop_after,
                 "train at most this many steps in this process, then checkpoint and exit "
                 "130: a long run in parts that fit a time budget, each continued with --resume (0: no limit)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  app.add_option("--profile", c.profile,
                 "profile this many training steps, after this process's first (warm-up) step: a table of the ops by "
                 "self time on stdout and in OUT/profile.txt, a Chrome trace in OUT/profile_trace.json (Perfetto "
                 "opens it); 0: off")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--eval-only", eval_only,
                 "evaluate this model file (best.safetensors) on validation and test, no training");
  app.add_flag("--params-only", params_only,
               "print the model's parameter count and FLOPs per token at the task's "
               "length as one JSON line, train nothing, write nothing");
  // Options come from, in order (each overriding the one before): the defaults; with --resume, the run's own
  // config.json; with --eval-only, the config.json beside the model file (unless --config is given); --config FILE;
  // the flags. A first pass reads only the flags that choose those files (in any of CLI11's spellings, --out=DIR too).
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  {
    CLI::App pre;
    pre.allow_extras();
    pre.set_help_flag();
    std::string pre_out = c.out, pre_config, pre_eval;
    bool pre_resume = false;
    pre.add_option("--out", pre_out);
    pre.add_option("--config", pre_config);
    pre.add_option("--eval-only", pre_eval);
    pre.add_flag("--resume", pre_resume);
    try {
      pre.parse(argc, argv);
    } catch (const CLI::ParseError&) {
      // the real parse below reports it
    }
    std::vector<std::string> files;
    if (pre_resume && fs::exists(fs::path(pre_out) / "config.json"))
      files.push_back((fs::path(pre_out) / "config.json").string());
    if (!pre_eval.empty() && pre_config.empty()) {
      const fs::path beside = fs::path(pre_eval).parent_path() / "config.json";
      if (!fs::exists(beside))
        tools::usage_error(app, fmt::format("--eval-only {}: no config.json beside it to build the model from; give "
                                            "the run's options with --config FILE",
                                            pre_eval));
      files.push_back(beside.string());
    }
    if (!pre_config.empty()) files.push_back(pre_config);
    for (const std::string& path : files) {
      std::vector<std::string> args;
      try {
        std::ifstream f(path);
        ASC_CHECK(f.good(), "cannot read it");
        json j;
        try {
          j = json::parse(f);
        } catch (const json::exception& e) {
          ASC_THROW("not valid JSON: {}", e.what());
        }
        args = options.to_args(j);
        std::reverse(args.begin(), args.end());  // CLI11's vector form takes the arguments last first
        app.parse(args);
      } catch (const Error& e) {
        tools::usage_error(app, fmt::format("config file '{}': {}", path, e.what()));
      } catch (const CLI::ParseError& e) {
        tools::usage_error(app, fmt::format("config file '{}': {}", path, e.what()));
      }
    }
  }
  tools::parse_or_exit(app, argc, argv);  // --help: exit 0; a bad flag or value: error + usage, exit 2
  // -1: the rule's own rates. Resolved here, in the Config the options write config.json from, so the file holds them.
  if (c.eta_w < 0) c.eta_w = c.rule == "A" ? optim::RuleAOptions{}.eta_plus : optim::RuleBOptions{}.eta_w;
  if (c.eta_f < 0) c.eta_f = c.rule == "A" ? optim::RuleAOptions{}.rho_plus : optim::RuleBOptions{}.eta_f;
  try {
    return train_main(c, options, resume, eval_only, command, params_only);
  } catch (const Error& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 1;
  }
}
