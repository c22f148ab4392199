#pragma once
// A training run's pieces (train/trainer.h): the task's data and the model its options describe, on its device and in
// its dtype. make_run builds them from a Config; load_run rebuilds a finished run's model from its directory.
//
//   asc::train::Run r = asc::train::load_run("runs/a");        // runs/a/config.json + runs/a/best.safetensors
//   asc::Tensor logits = r.classifier->forward(batch.input, batch.valid);
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "data/tasks.h"
#include "models/decoder_lm.h"
#include "models/firing_net.h"
#include "models/transformer_classifier.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "train/options.h"

namespace asc::train {

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
  // --dtype bfloat16 on the CPU: the model stays float32 (dtype) and its forward passes run under CpuAutocast
  // (core/autocast.h): the linear layers' and dense attention's products, and their backward's, in bfloat16
  bool cpu_autocast = false;
  bool is_lm() const { return lm != nullptr; }
};

// The task (seeded by data_seed) and the model (initialised from seed), moved to the device and dtype the Config
// names (device "cuda": GPU `cuda_index`, each rank's own in a job of several processes); asc::Error for a model that
// cannot read the task, a device or dtype that is not available.
Run make_run(const Config& c, int cuda_index = 0);
// A finished run's model: DIR/config.json's options, DIR/<weights> loaded (best.safetensors: the model selected on
// validation; last.safetensors ... any file the run wrote, or an absolute path), in evaluation mode, on `device`
// ("cpu", "cuda"; "": the run's own). The task's data are built too (the same splits the run used). A weights file
// that does not fit the model is an asc::Error naming the first key that differs.
Run load_run(const std::string& dir, const std::string& weights = "best.safetensors", const std::string& device = "");

// The device and dtype a Config asks for are available here and fit together (asc::Error otherwise; make_run checks
// them first, and the trainer before it writes anything).
void check_device_and_dtype(const Config& c);

// The layer options a Config describes (also for building models outside a Run).
nn::AscenderAttentionOptions ascender_options(const Config& c);
nn::AsamAttentionOptions asam_options(const Config& c);
// r.model (and its typed handle) from r.c and r.task, on r.device in r.dtype.
void build_model(Run& r);

}  // namespace asc::train
