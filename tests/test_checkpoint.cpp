// Whole-training checkpoints: resuming continues bit-identically; bad files and mismatches leave everything
// untouched.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "models/transformer_classifier.h"
#include "nn/safetensors.h"
#include "optim/optim.h"
#include "testing.h"
#include "train/checkpoint.h"

using namespace asc;
using namespace asc::testing;

namespace {

auto make_model(int64_t d_model = 16, const std::string& attention = "dense") {
  // With ASCender attention the schedule's step counter (ω warm-up, separation from step 4) is part of the state.
  return std::make_shared<models::TransformerClassifier>(
      models::TransformerClassifierOptions(8, 6, 3)
          .d_model(d_model)
          .heads(2)
          .layers(1)
          .ffn(32)
          .dropout(0.2)
          .attention(attention)
          .ascender(nn::AscenderAttentionOptions(d_model, 2).k({2}).warmup_steps(6).sep_start_step(4).aux_coh(0.1)));
}

// Batch i depends only on i, so only the model/optimizer/scheduler/dropout state decides the trajectory.
std::pair<Tensor, Tensor> batch(int i) {
  Generator g(1000 + static_cast<uint64_t>(i));
  return {randint(0, 8, {4, 6}, {.dtype = kInt64}, &g), randint(0, 3, {4}, {.dtype = kInt64}, &g)};
}

struct Run {
  std::shared_ptr<models::TransformerClassifier> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::WarmupCosine> sched;
  explicit Run(uint64_t seed, const std::string& attention = "dense") {
    manual_seed(seed);
    model = make_model(16, attention);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
    sched =
        std::make_unique<optim::WarmupCosine>(*opt, optim::WarmupCosineOptions{.warmup_steps = 3, .total_steps = 12});
  }
  TrainingState state() {
    return {.model = model.get(), .optimizer = opt.get(), .scheduler = sched.get(), .generator = &default_generator()};
  }
  std::vector<double> train(int from, int to) {
    std::vector<double> losses;
    for (int i = from; i < to; ++i) {
      auto [x, y] = batch(i);
      opt->zero_grad();
      Tensor logits = model->forward(x);  // first: aux_loss() reads what this forward computed
      Tensor loss = cross_entropy(logits, y) + model->aux_loss();
      loss.backward();
      opt->step();
      sched->step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  }
};

std::vector<std::vector<float>> snapshot(nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (auto& [n, t] : m.state_dict()) out.push_back(t.to(kFloat32).to_vector<float>());
  return out;
}

std::string tmp_path(const char* name) { return std::string("/tmp/asc_test_") + name + ".safetensors"; }

}  // namespace

TEST_CASE("checkpoint: resumed training is bit-identical to uninterrupted training (dense and ASCender)") {
  for (const char* attention : {"dense", "ascender"}) {
    CAPTURE(attention);
    Run a(1, attention);
    std::vector<double> full = a.train(0, 10);

    Run b(1, attention);
    std::vector<double> first = b.train(0, 5);
    std::string path = tmp_path("resume");
    save_checkpoint(path, b.state(), {{"note", "step 5"}});
    manual_seed(12345);  // disturb the default generator: the checkpoint must restore it

    Run c(777, attention);  // a differently initialised run picks up from the file
    std::map<std::string, std::string> meta;
    load_checkpoint(path, c.state(), &meta);
    CHECK(meta["note"] == "step 5");
    CHECK(c.sched->last_step() == 5);
    std::vector<double> rest = c.train(5, 10);

    first.insert(first.end(), rest.begin(), rest.end());
    REQUIRE(first.size() == full.size());
    for (size_t i = 0; i < full.size(); ++i) CHECK_MESSAGE(first[i] == full[i], "step " << i);  // exact
    CHECK(snapshot(*c.model) == snapshot(*a.model));
    CHECK(c.opt->lr(0) == a.opt->lr(0));
    std::remove(path.c_str());
  }
}

TEST_CASE("checkpoint: a corrupt or truncated file, a missing part or a shape mismatch leaves everything untouched") {
  Run src(1);
  src.train(0, 3);
  std::string path = tmp_path("good");
  save_checkpoint(path, src.state());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  Run dst(5);
  dst.train(0, 2);
  auto before = snapshot(*dst.model);
  StateDict opt_before = dst.opt->state_dict();
  int64_t sched_before = dst.sched->last_step();
  auto rng_before = default_generator().state();
  auto unchanged = [&] {
    CHECK(snapshot(*dst.model) == before);
    StateDict now = dst.opt->state_dict();
    REQUIRE(now.size() == opt_before.size());
    for (const auto& [n, t] : opt_before) CHECK(now.at(n).to_vector<double>() == t.to_vector<double>());
    CHECK(dst.sched->last_step() == sched_before);
    CHECK(default_generator().state().offset == rng_before.offset);
  };

  SUBCASE("truncated") {
    std::string bad = tmp_path("truncated");
    std::ofstream(bad, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 7));
    check_error([&] { load_checkpoint(bad, dst.state()); }, {"truncated"});
    unchanged();
    std::remove(bad.c_str());
  }
  SUBCASE("corrupt header") {
    std::string bad = tmp_path("corrupt");
    std::vector<char> b = bytes;
    b[9] = '#';  // inside the JSON header
    std::ofstream(bad, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    check_error([&] { load_checkpoint(bad, dst.state()); }, {"corrupt"});
    unchanged();
    std::remove(bad.c_str());
  }
  SUBCASE("missing part") {
    std::string weights_only = tmp_path("weights_only");
    save_checkpoint(weights_only, {.model = src.model.get()});
    check_error([&] { load_checkpoint(weights_only, dst.state()); }, {"optim."});
    unchanged();
    std::remove(weights_only.c_str());
  }
  SUBCASE("shape mismatch in the model") {
    manual_seed(2);
    auto wide = make_model(32);
    std::string p = tmp_path("wide");
    save_checkpoint(p, {.model = wide.get()});
    rng_before = default_generator().state();
    check_error([&] { load_checkpoint(p, {.model = dst.model.get()}); }, {"shape mismatch", "32]"});
    unchanged();
    std::remove(p.c_str());
  }
  SUBCASE("a later part fails: the model, already loaded, is rolled back") {
    StateDict all = load_safetensors(path), broken;
    bool done = false;
    for (const auto& [n, t] : all) {  // one optimizer state tensor gets a wrong shape
      bool hit = !done && n.rfind("optim.", 0) == 0 && t.dim() >= 1;
      broken.set(n, hit ? zeros({t.size(0) + 1}) : t);
      done |= hit;
    }
    REQUIRE(done);
    std::string p = tmp_path("broken_optim");
    save_safetensors(p, broken);
    check_error([&] { load_checkpoint(p, dst.state()); }, {"load_checkpoint"});
    unchanged();
    std::remove(p.c_str());
  }
  std::remove(path.c_str());
}

TEST_CASE("gradient checkpointing: an empty segment, a recomputation that differs, a throwing one: clear errors") {
  using autograd::checkpoint;
  testing::check_error([] { checkpoint(autograd::SegmentFn(), {ones({2})}); }, {"checkpoint: empty segment function"});
  // A segment whose output depends on something else than its inputs and the default generator: the backward's
  // recomputation returns another shape, which must be an error (its gradient would be indexed out of range).
  int calls = 0;
  Tensor x = randn({3}, {.dtype = kFloat64, .requires_grad = true});
  auto changing = [&](const TensorList& in) {
    ++calls;
    return calls == 1 ? TensorList{in[0] * 2.0} : TensorList{in[0] * 2.0, in[0]};
  };
  TensorList out = checkpoint(changing, {x});
  testing::check_error([&] { sum(out[0]).backward(); },
                       {"recomputed segment returned 2 outputs, the forward returned 1"});
  calls = 0;
  auto reshaping = [&](const TensorList& in) {
    ++calls;
    return TensorList{calls == 1 ? in[0] * 2.0 : in[0].narrow(0, 0, 2) * 2.0};
  };
  out = checkpoint(reshaping, {x});
  testing::check_error([&] { sum(out[0]).backward(); }, {"output 0 of the recomputed segment has shape [2]"});
  // A recomputation that throws leaves the default generator where it was, not at the forward's saved state.
  calls = 0;
  auto throwing = [&](const TensorList& in) {
    if (++calls == 2) {
      (void)rand({4});  // draws from the restored forward state
      ASC_THROW("segment failed");
    }
    return TensorList{in[0] * 3.0};
  };
  out = checkpoint(throwing, {x});
  (void)rand({5});
  const Generator::State before = default_generator().state();
  testing::check_error([&] { sum(out[0]).backward(); }, {"segment failed"});
  CHECK(default_generator().state().seed == before.seed);
  CHECK(default_generator().state().offset == before.offset);
}
