// Training on the GPU: the two-moons MLP of the demo trains on CUDA and follows the CPU's loss curve; the same
// model in bfloat16 with float32 master weights (and float16 with the loss scaler) still learns. Skips, saying
// so, where no CUDA device is present.
#include <cmath>

#include "ascender.h"
#include "testing.h"

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
std::vector<double> train(Device device, int steps, DType compute = kFloat32) {
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
  std::vector<double> cpu = train(Device::cpu(), 200), gpu = train(Device::cuda(), 200);
  for (size_t i = 0; i < cpu.size(); ++i)
    CHECK_MESSAGE(std::abs(gpu[i] - cpu[i]) <= 1e-3 * std::max(1.0, std::abs(cpu[i])),
                  "step " << i << ": cpu " << cpu[i] << " gpu " << gpu[i]);
  CHECK(gpu.back() < 0.05);
}

TEST_CASE("CUDA mixed precision: bf16 and f16 compute with float32 master weights still learn") {
  if (!gpu_or_skip()) return;
  std::vector<double> ref = train(Device::cuda(), 200);
  for (DType dt : {kBFloat16, kFloat16}) {
    std::vector<double> mp = train(Device::cuda(), 200, dt);
    CHECK_MESSAGE(mp.back() < 2 * ref.back() + 0.05,
                  "dtype " << dtype_name(dt) << ": final loss " << mp.back() << " vs float32 " << ref.back());
  }
}
