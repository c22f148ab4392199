// Runs: the task and the model a Config describes (train/run.h).
#include "train/run.h"

#include <filesystem>

#include "core/autocast.h"
#include "core/cpu_isa.h"
#include "cuda/cuda.h"
#include "nn/safetensors.h"

namespace asc::train {

namespace fs = std::filesystem;

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

void check_device_and_dtype(const Config& c) {
  const bool on_cuda = c.device == "cuda";
  ASC_CHECK(c.device != "cuda" || cuda::is_available(), "--device cuda, but {}",
            cuda::is_available() ? "" : "no CUDA device is available in this build / machine");
  ASC_CHECK(!c.tf32 || on_cuda, "--tf32 applies to --device cuda (TF32 is a GPU tensor-core format)");
  // On the CPU, bfloat16 is autocast (core/autocast.h): float32 parameters, linear and attention products in bfloat16.
  ASC_CHECK(c.dtype != "bfloat16" || on_cuda || cpu_bf16_supported(),
            "--dtype bfloat16 on the CPU needs bfloat16 products (AVX512-BF16 or AMX-BF16) and a build with oneDNN; "
            "this machine's GEMM: {}",
            cpu_gemm_kernel());
  ASC_CHECK(c.dtype == "float32" || c.model != "firing" || (c.dtype == "bfloat16" && !on_cuda),
            "--dtype {}: the firing network's local rules and gate update float32 parameters; use --dtype float32{}",
            c.dtype, c.dtype == "bfloat16" ? " (or bfloat16 on the CPU, which keeps them float32)" : "");
}

Run make_run(const Config& c, int cuda_index) {
  validate_config(c, /*check_memory=*/false);  // what the options ask together, before any data is read
  Run r;
  r.c = c;
  resolve_defaults(r.c);  // the rules' -1 rates: their own defaults
  check_device_and_dtype(c);
  r.device = c.device == "cuda" ? Device::cuda(cuda_index) : Device::cpu();
  r.cpu_autocast = c.dtype == "bfloat16" && !r.device.is_cuda();
  r.dtype = c.dtype == "bfloat16" && !r.cpu_autocast ? kBFloat16 : c.dtype == "float64" ? kFloat64 : kFloat32;
  manual_seed(c.seed);
  r.task = data::make_task(r.c.task, {.seed = r.c.data_seed,
                                      .train_size = r.c.train_size,
                                      .val_size = r.c.val_size,
                                      .test_size = r.c.test_size,
                                      .min_len = r.c.min_len,
                                      .max_len = r.c.max_len,
                                      .data_dir = r.c.data_dir,
                                      .image_size = r.c.image_size,
                                      .windows = lm_reads_windows(r.c),
                                      .pathfinder_size = r.c.pathfinder_size,
                                      .path_steps = r.c.path_steps,
                                      .distractors = r.c.distractors,
                                      .pathfinder_solid = r.c.pathfinder_solid});
  ASC_CHECK(r.task.train->size() > 0 && r.task.val->size() > 0 && r.task.test->size() > 0,
            "task {} has an empty split (train {}, val {}, test {})", c.task, r.task.train->size(), r.task.val->size(),
            r.task.test->size());
  manual_seed(c.seed);  // the model's initialisation depends on --seed only
  build_model(r);
  return r;
}

Run load_run(const std::string& dir, const std::string& weights, const std::string& device) {
  const fs::path config = fs::path(dir) / "config.json", file = fs::path(dir) / weights;
  ASC_CHECK(fs::exists(config), "load_run: '{}' has no config.json", dir);
  ASC_CHECK(fs::exists(file), "load_run: '{}' has no {}", dir, weights);
  Config c = read_config(config.string());
  ASC_CHECK(device.empty() || device == "cpu" || device == "cuda", "load_run: device must be cpu or cuda, got '{}'",
            device);
  if (!device.empty()) c.device = device;
  Run r = make_run(c);
  r.model->load_state_dict(load_safetensors(file.string()));
  r.model->eval();
  return r;
}

}  // namespace asc::train
