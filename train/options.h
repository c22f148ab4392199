#pragma once
// The trainer's options (train/trainer.h): every option once, in one table that the command line's flags and a run's
// config.json are both parsed and validated against — a value out of range, a name that is not one of the choices,
// 32.7 for an integer, an unknown key in a config file: all refused the same way.
//
//   asc::train::Config c = asc::train::read_config("runs/a/config.json");  // a finished run's options
//   c.seed = 2;                                                              // then change what you like
//
// tools/train.cpp binds the same table to its flags (--image-size for image_size, lists comma-separated).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace asc::train {

struct Config {
  // task
  std::string task = "fashion-mnist-seq";
  int64_t image_size = 0, train_size = 0, val_size = 0, test_size = 0, min_len = 0, max_len = 0;
  std::string data_dir;
  uint64_t data_seed = 0;
  int64_t pathfinder_size = 0, path_steps = 0, distractors = -1;  // pathfinder's scene; 0 / -1: its defaults
  bool pathfinder_solid = false;
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
  // lr -1 and epochs 0: the model's own defaults (resolve_defaults), written to config.json as used
  double lr = -1, weight_decay = 0.01, momentum = 0.9, clip = 1.0, min_lr = 0;
  int64_t warmup = 0, batch = 32, steps = 0, epochs = 0, eval_every = 0, eval_batches = 0, log_every = 0;
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

// The table: binds every option of `c` to a flag of `app` (with its help text, default and validation). Built once
// per Config; `app` and `c` must outlive it.
class OptionTable {
 public:
  OptionTable(CLI::App& app, Config& c);
  ~OptionTable();
  OptionTable(const OptionTable&) = delete;
  OptionTable& operator=(const OptionTable&) = delete;
  // The options' current values as config.json text (in the table's order), with provenance keys added after them
  // (git_commit, command), which parsing skips.
  std::string to_json(const std::vector<std::pair<std::string, std::string>>& provenance = {}) const;
  // A config.json's options as command-line arguments (--key=value, lists comma-separated), so that the flags'
  // parser validates them; an unknown key throws asc::Error.
  std::vector<std::string> args_from_json(const std::string& text) const;
  // Reads a config.json into the app the table is bound to, as if its options were flags given there; asc::Error
  // (naming what is wrong, not the file) for a file that cannot be read, is not JSON or holds a bad key or value.
  void parse_file(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The Config as config.json text: every option of the table in its order, then the provenance keys (git_commit,
// command), which reading skips.
std::string config_json(const Config& c, const std::vector<std::pair<std::string, std::string>>& provenance = {});
// The defaults that depend on other options resolved, so that config.json records what the run uses: eta_w / eta_f
// (-1) become the chosen rule's own rates (optim/firing_rules.h); the language model's positional encoding is rope,
// its context (max_len) on the text and file: tasks kLMContext, and the learning rate (-1) and epochs (0) the model's
// own: kLearningRate and 1 epoch, or for the language model kLMLearningRate and (on the text and file: tasks)
// kLMEpochs.
void resolve_defaults(Config& c);
// The defaults of the language model on the text and file: tasks, sized so that `train --model lm --task text` reaches
// about 2.2 bits per byte in under 4 minutes on two CPU cores (docs/train.md): a context long enough for a man page's
// paragraph, a learning rate three times the classifiers' (a small byte-level model learns faster with it), and the
// epochs that take it there.
inline constexpr int64_t kLMContext = 256;
inline constexpr double kLMLearningRate = 3e-3;
inline constexpr int64_t kLMEpochs = 4;
inline constexpr double kLearningRate = 1e-3;  // every other model's
// Whether the run's model reads its task's texts in windows of max_len bytes (data::TaskOptions::windows): the
// language model on the text and file: tasks, which learns from every byte of a text instead of its first max_len.
bool lm_reads_windows(const Config& c);

// What the options ask together, checked once the flags and files are read (the train tool exits 2 on it; make_run
// checks it too, without the memory bound: a model rebuilt for inference needs far less): the width a multiple of the
// heads, per-head lists of one value or one per head, min_len <= max_len, the rules' ranges ordered, and (check_memory)
// no training run whose memory (memory_lower_bound) exceeds the machine's. asc::Error naming the options.
void validate_config(const Config& c, bool check_memory = true);

// A lower bound of the bytes a CPU run of `c` holds (0 where none is known: another device, a file task of unknown
// length, the firing and MLP models), and how it was counted: the activations an attention model keeps for the
// backward (layers x batch x tokens x (4 x d_model + ffn) values) and its parameters with their gradients.
struct MemoryBound {
  double bytes = 0;
  std::string how;
};
MemoryBound memory_lower_bound(const Config& c);

// config.json (the file a run writes, or one written by hand) -> Config, through the table: the defaults, then the
// file. asc::Error names the file and the key or value it refuses.
Config read_config(const std::string& path);
// The git commit of the source tree this library was built from ("unknown" outside a checkout).
std::string git_commit();

}  // namespace asc::train
