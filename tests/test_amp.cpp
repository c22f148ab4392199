// Mixed precision: the dynamic loss scaler (torch.cuda.amp.GradScaler semantics) and float32 master weights.
// Device-agnostic logic, tested on the CPU; the bf16/f16-on-GPU run is in test_cuda_training.cpp.
#include <filesystem>

#include "ascender.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

TEST_CASE("GradScaler: scales the loss, unscales gradients exactly, grows after clean steps, backs off on inf") {
  Tensor w = tensor({1.0, 2.0, 3.0}, {3}, {.dtype = kFloat64}).set_requires_grad(true);
  optim::SGD opt({w}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  CHECK(scaler.get_scale() == 1024.0);
  std::vector<double> expect = {1.0, 2.0, 3.0};
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor loss = sum(w * w) * 0.5;  // grad = w
    Tensor scaled = scaler.scale(loss);
    CHECK(scaled.item<double>() == loss.item<double>() * 1024.0);
    scaled.backward();
    CHECK(scaler.step(opt));                // finite: steps with the unscaled gradient
    for (double& e : expect) e -= 0.5 * e;  // SGD on grad = w (power-of-two scale: exact)
    check_close(w, expect, 0, 0);
    scaler.update();
  }
  CHECK(scaler.get_scale() == 2048.0);  // grown after growth_interval = 3 clean steps

  // A step with an inf gradient is skipped (parameters bit-identical), the scale backs off, the tracker resets.
  opt.zero_grad();
  Tensor before = w.detach().clone();
  (scaler.scale(sum(w * tensor({1.0, INFINITY, 1.0}, {3}, {.dtype = kFloat64})))).backward();
  CHECK(scaler.unscale_(opt));
  CHECK_FALSE(scaler.step(opt));
  CHECK(same_bits(w.detach(), before));
  scaler.update();
  CHECK(scaler.get_scale() == 1024.0);
  // Two clean steps do not grow it (the tracker restarted); the third does.
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(sum(w)).backward();
    scaler.step(opt);
    scaler.update();
    CHECK(scaler.get_scale() == (i < 2 ? 1024.0 : 2048.0));
  }
}

TEST_CASE("GradScaler: state dict round trip, misuse and disabled mode") {
  optim::GradScaler a({.init_scale = 256.0, .growth_interval = 5});
  Tensor w = zeros({2}, {.requires_grad = true});
  optim::SGD opt({w}, {.lr = 0.1});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    a.scale(sum(w * 3.0)).backward();
    a.step(opt);
    a.update();
  }
  optim::GradScaler b;
  b.load_state_dict(a.state_dict());
  CHECK(b.get_scale() == 256.0);
  CHECK(b.state_dict().at("growth_tracker").item<int64_t>() == 2);
  StateDict bad;
  bad.set("scale", scalar_tensor(-1.0, {.dtype = kFloat64}));
  bad.set("growth_tracker", scalar_tensor(0, {.dtype = kInt64}));
  check_error([&] { b.load_state_dict(bad); }, {"GradScaler.load_state_dict", "-1"});
  CHECK(b.get_scale() == 256.0);
  check_error([] { optim::GradScaler({.backoff_factor = 1.5}); }, {"backoff_factor", "1.5"});
  check_error([&] { b.update(); }, {"GradScaler.update", "step()"});

  optim::GradScaler off({.enabled = false});
  Tensor loss = sum(w * 2.0);
  CHECK(off.scale(loss).is_same(loss));
  opt.zero_grad();
  loss.backward();
  CHECK(off.step(opt));
  check_close(w, {-0.8, -0.8}, 1e-6, 0);  // two scaled steps of grad 3, then one of grad 2, lr 0.1
}

TEST_CASE("MasterWeights: float64 masters for a float32 model train like float32 within rounding") {
  // The CPU stand-in for bf16/f16 compute with float32 masters: the model computes in float32, AdamW updates
  // float64 masters, and every step rounds them back into the model.
  auto make = [] {
    manual_seed(4);
    return std::make_shared<nn::MLP>(nn::MLPOptions({3, 16, 2}).activation("tanh"));
  };
  Generator g(5);
  Tensor x = randn({64, 3}, {}, &g);
  Tensor y = randint(0, 2, {64}, {.dtype = kInt64}, &g);

  auto plain = make();
  optim::AdamW opt_plain(plain->parameters(), {.lr = 1e-2});
  auto mixed = make();
  optim::MasterWeights master(mixed->parameters(), kFloat64);
  REQUIRE(master.parameters().size() == mixed->parameters().size());
  for (size_t i = 0; i < master.parameters().size(); ++i) {
    CHECK(master.parameters()[i].dtype() == kFloat64);
    CHECK_FALSE(master.parameters()[i].shares_storage(mixed->parameters()[i]));
  }
  optim::AdamW opt_master(master.parameters(), {.lr = 1e-2});
  optim::GradScaler scaler({.init_scale = 128.0});
  for (int step = 0; step < 50; ++step) {
    opt_plain.zero_grad();
    Tensor lp = cross_entropy((*plain)(x), y);
    lp.backward();
    opt_plain.step();

    mixed->zero_grad();
    Tensor lm = cross_entropy((*mixed)(x), y);
    scaler.scale(lm).backward();
    master.copy_grads_to_master();
    REQUIRE(scaler.step(opt_master));
    master.copy_master_to_model();
    scaler.update();
    CHECK(lm.item<double>() == doctest::Approx(lp.item<double>()).epsilon(1e-4));
  }
  // The model holds exactly its master values rounded to float32.
  for (size_t i = 0; i < master.parameters().size(); ++i)
    CHECK(same_bits(mixed->parameters()[i].detach(), master.parameters()[i].detach().to(kFloat32)));
}

// A run in lower precision resumes from its float64 (here) / float32 master copies, not from the model's rounded
// values: the checkpoint keeps them as "master.*" (train/checkpoint.h), and loading them rounds them into the model.
TEST_CASE("MasterWeights: a checkpoint keeps the masters; a bad one changes nothing") {
  auto make = [] {
    manual_seed(6);
    return std::make_shared<nn::MLP>(nn::MLPOptions({3, 8, 2}));
  };
  auto model = make();
  optim::MasterWeights master(model->parameters(), kFloat64);
  optim::AdamW opt(master.parameters(), {.lr = 1e-2});
  Generator g(7);
  Tensor x = randn({16, 3}, {}, &g);
  Tensor y = randint(0, 2, {16}, {.dtype = kInt64}, &g);
  auto train_step = [&](nn::MLP& m, optim::MasterWeights& w, optim::AdamW& o) {
    m.zero_grad();
    cross_entropy(m(x), y).backward();
    w.copy_grads_to_master();
    o.step();
    w.copy_master_to_model();
  };
  for (int s = 0; s < 3; ++s) train_step(*model, master, opt);
  const auto path = (std::filesystem::temp_directory_path() / "asc_test_amp_master.safetensors").string();
  save_checkpoint(path, {.model = model.get(), .optimizer = &opt, .master = &master});
  // The masters carry more than the model: below float32's rounding, a reload from the model alone would lose it.
  bool finer = false;
  for (const Tensor& m : master.parameters()) finer |= !same_bits(m.detach(), m.detach().to(kFloat32).to(kFloat64));
  CHECK(finer);

  auto model2 = make();
  optim::MasterWeights master2(model2->parameters(), kFloat64);
  optim::AdamW opt2(master2.parameters(), {.lr = 1e-2});
  load_checkpoint(path, {.model = model2.get(), .optimizer = &opt2, .master = &master2});
  for (size_t i = 0; i < master.parameters().size(); ++i) {
    CHECK(same_bits(master2.parameters()[i].detach(), master.parameters()[i].detach()));
    CHECK(same_bits(model2->parameters()[i].detach(), model->parameters()[i].detach()));
  }
  // The resumed run continues bit-identically.
  train_step(*model, master, opt);
  train_step(*model2, master2, opt2);
  for (size_t i = 0; i < master.parameters().size(); ++i)
    CHECK(same_bits(master2.parameters()[i].detach(), master.parameters()[i].detach()));

  // A checkpoint without masters, asked for them: an error naming the part, and nothing changed.
  const auto bare = (std::filesystem::temp_directory_path() / "asc_test_amp_bare.safetensors").string();
  save_checkpoint(bare, {.model = model.get(), .optimizer = &opt});
  const Tensor before = master2.parameters()[0].detach().clone();
  check_error([&] { load_checkpoint(bare, {.model = model2.get(), .optimizer = &opt2, .master = &master2}); },
              {"master.", "no"});
  CHECK(same_bits(master2.parameters()[0].detach(), before));
  // Masters of another model: refused by shape before anything changes (the model part, loaded first, rolls back).
  auto other = std::make_shared<nn::MLP>(nn::MLPOptions({3, 4, 2}));
  optim::MasterWeights wrong(other->parameters(), kFloat64);
  check_error([&] { wrong.load_state_dict(master.state_dict()); }, {"MasterWeights::load_state_dict", "entry"});
  check_error([&] { master2.load_state_dict(StateDict{}); }, {"0 entries"});
  std::filesystem::remove(path);
  std::filesystem::remove(bare);
}
