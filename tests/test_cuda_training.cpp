// Training on the GPU: the two-moons MLP of the demo trains on CUDA and follows the CPU's loss curve; the same
// model in bfloat16 with float32 master weights (and float16 with the loss scaler) still learns; the trainer's
// attention models take bfloat16 steps with dropout on. Skips, saying so, where no CUDA device is present.
#include <cmath>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "ascender.h"
#include "testing.h"
#if ASC_TEST_TRAINER  // the trainer library (train/) is built: CLI11 and nlohmann-json were found
#include "train/trainer.h"
#endif

using namespace asc;
using asc::testing::gpu_or_skip;

namespace {

std::pair<Tensor, Tensor> two_moons(int64_t n, Generator& g) {
  std::vector<double> u = rand({n, 3}, {.dtype = kFloat64}, &g).to_vector<double>();
  std::vector<float> pts(static_cast<size_t>(2 * n));
  std::vector<int64_t> label(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double t = u[3 * i] * M_PI, noise = 0.1 * (u[3 * i + 2] - 0.5);
    label[i] = u[3 * i + 1] < 0.5 ? 0 : 1;
    pts[2 * i] = static_cast<float>((label[i] ? 1.0 - std::cos(t) : std::cos(t)) + noise);
    pts[2 * i + 1] = static_cast<float>((label[i] ? 0.5 - std::sin(t) : std::sin(t)) - noise);
  }
  return {tensor(pts, {n, 2}), tensor(label, {n})};
}

// Losses of `steps` full-batch AdamW steps of a 2-32-32-2 MLP on `device`, from the seed-0 initialisation.
std::vector<double> train_mlp(Device device, int steps, DType compute = kFloat32) {
  manual_seed(0);
  auto mlp = std::make_shared<nn::MLP>(nn::MLPOptions({2, 32, 32, 2}).activation("tanh"));
  Generator g(1);
  auto [x, y] = two_moons(256, g);
  mlp->to(device);
  x = x.to(device), y = y.to(device);
  std::vector<double> losses;
  if (compute == kFloat32) {
    optim::AdamW opt(mlp->parameters(), {.lr = 1e-2});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      Tensor loss = cross_entropy((*mlp)(x), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  }
  mlp->to(compute);
  optim::MasterWeights master(mlp->parameters());
  optim::AdamW opt(master.parameters(), {.lr = 1e-2});
  optim::GradScaler scaler({.enabled = compute == kFloat16});
  Tensor xc = x.to(compute);
  for (int s = 0; s < steps; ++s) {
    mlp->zero_grad();
    Tensor loss = cross_entropy((*mlp)(xc).to(kFloat32), y);
    scaler.scale(loss).backward();
    master.copy_grads_to_master();
    if (scaler.step(opt)) master.copy_master_to_model();
    scaler.update();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace

TEST_CASE("CUDA training: the demo MLP follows the CPU loss curve") {
  if (!gpu_or_skip()) return;
  std::vector<double> cpu = train_mlp(Device::cpu(), 200), gpu = train_mlp(Device::cuda(), 200);
  for (size_t i = 0; i < cpu.size(); ++i)
    CHECK_MESSAGE(std::abs(gpu[i] - cpu[i]) <= 1e-3 * std::max(1.0, std::abs(cpu[i])),
                  "step " << i << ": cpu " << cpu[i] << " gpu " << gpu[i]);
  CHECK(gpu.back() < 0.05);
}

TEST_CASE("CUDA mixed precision: bf16 and f16 compute with float32 master weights still learn") {
  if (!gpu_or_skip()) return;
  std::vector<double> ref = train_mlp(Device::cuda(), 200);
  for (DType dt : {kBFloat16, kFloat16}) {
    std::vector<double> mp = train_mlp(Device::cuda(), 200, dt);
    CHECK_MESSAGE(mp.back() < 2 * ref.back() + 0.05,
                  "dtype " << dtype_name(dt) << ": final loss " << mp.back() << " vs float32 " << ref.back());
  }
}

#if ASC_TEST_TRAINER
// `train --device cuda --dtype bfloat16` runs every op of a step in bfloat16: dropout, the feed-forward's fused
// bias-activation-dropout, the attention kernels, the optimizer on float32 masters. Each model kind that takes bfloat16
// on CUDA trains a few steps of a tiny task with dropout on, and its losses stay finite.
TEST_CASE("CUDA bfloat16 training: each attention model's steps run in bfloat16 with dropout") {
  if (!gpu_or_skip()) return;
  // per process: ctest runs this program twice at once in the emulator build (both thread orders)
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("asc_cuda_bf16_train_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  struct Rows : train::Callback {
    std::vector<double> losses;
    void on_row(train::Trainer&, const train::Row& r) override { losses.push_back(r.loss); }
  };
  for (const char* model : {"dense", "asam", "ascender"}) {
    INFO("model ", model);
    train::Config c;
    c.task = "listops", c.min_len = 24, c.max_len = 32, c.train_size = 32, c.val_size = 8, c.test_size = 8;
    c.model = model, c.d_model = 16, c.heads = 2, c.layers = 1, c.ffn = 32, c.k = {4};
    c.dropout = 0.1, c.attn_dropout = std::string(model) == "asam" ? 0.0 : 0.1;  // ASAM has no attention dropout
    c.batch = 8, c.steps = 3, c.eval_every = 3, c.eval_batches = 1, c.progress = "none";
    c.device = "cuda", c.dtype = "bfloat16", c.out = (root / model).string();
    train::Trainer t(c);
    auto rows = std::make_shared<Rows>();
    t.add_callback(rows);
    CHECK(t.fit());
    REQUIRE_FALSE(rows->losses.empty());
    for (double l : rows->losses) CHECK(std::isfinite(l));
  }
  std::filesystem::remove_all(root);
}
#endif
