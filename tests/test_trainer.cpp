// The trainer library (train/trainer.h) from C++: the typed, versioned checkpoint state (round trip, older and newer
// versions, refusals that change nothing), the option table (config.json written and read back, unknown keys and bad
// values refused), callbacks (the order of events, a stop that leaves a checkpoint to resume from, bit-identical to
// an unbroken run), and a run rebuilt from its directory. The `train` tool's own contract: test_train_tool.cpp.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nn/safetensors.h"
#include "testing.h"
#include "train/process_group.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace asc;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("asc_trainer_{}_{}", name, ::getpid());
  fs::remove_all(p);
  return p;
}

train::Config tiny(const fs::path& out) {
  train::Config c;
  c.task = "grouping", c.train_size = 256, c.val_size = 64, c.test_size = 64;
  c.model = "ascender", c.d_model = 16, c.heads = 2, c.layers = 1, c.ffn = 32, c.k = {4};
  c.batch = 16, c.steps = 24, c.eval_every = 8, c.progress = "none", c.out = out.string();
  return c;
}

// Records the events it sees, and stops after `stop_at` steps (0: never).
struct Recorder : train::Callback {
  explicit Recorder(int64_t stop_at = 0) : stop_at(stop_at) {}
  void on_train_begin(train::Trainer&) override { events.push_back("begin"); }
  void on_step_begin(train::Trainer& t) override { events.push_back(fmt::format("step{}", t.state().step + 1)); }
  void on_row(train::Trainer&, const train::Row& r) override {
    events.push_back(fmt::format("{}@{}", r.split, r.step));
  }
  bool should_stop(train::Trainer& t) override { return stop_at > 0 && t.state().step >= stop_at; }
  void on_train_end(train::Trainer&, bool stopped) override { events.push_back(stopped ? "stopped" : "end"); }
  int64_t stop_at;
  std::vector<std::string> events;
};

}  // namespace

TEST_CASE("LoopState: exact round trip through checkpoint metadata; version 1 reads, a newer version is refused") {
  train::LoopState s;
  s.step = 17, s.best_step = 8, s.best_val = 0.1 + 0.2, s.wall_s = 12.5, s.nonfinite_steps = 2;
  s.acc_loss = 1.0 / 3.0, s.acc_correct = 5, s.acc_count = 16, s.acc_tokens = 1e10 + 1;
  s.loader = {.epoch = 3, .position = 5, .seed = 18446744073709551615ull};
  s.mech_train = {0.25, 1.0 / 7.0, 3, 4};
  std::map<std::string, std::string> m = train::to_metadata(s);
  CHECK(m.at("format_version") == std::to_string(train::kCheckpointFormatVersion));
  const train::LoopState r = train::loop_state_from_metadata(m, "ckpt");
  CHECK(r.step == 17);
  CHECK(r.best_step == 8);
  CHECK(r.best_val == s.best_val);  // bit for bit: hex floats
  CHECK(r.acc_loss == s.acc_loss);
  CHECK(r.acc_tokens == s.acc_tokens);
  CHECK(r.loader.seed == s.loader.seed);
  CHECK(r.loader.epoch == 3);
  CHECK(r.loader.position == 5);
  CHECK(r.mech_train == s.mech_train);
  CHECK(r.nonfinite_steps == 2);

  auto version1 = m;  // written before the version key existed, and before nonfinite_steps
  version1.erase("format_version"), version1.erase("nonfinite_steps");
  CHECK(train::loop_state_from_metadata(version1, "old").nonfinite_steps == 0);
  auto newer = m;
  newer["format_version"] = std::to_string(train::kCheckpointFormatVersion + 1);
  CHECK_THROWS_WITH_AS(train::loop_state_from_metadata(newer, "new.safetensors"), doctest::Contains("format version"),
                       Error);
  for (const auto& [key, bad] : std::vector<std::pair<std::string, std::string>>{
           {"step", "12x"}, {"best_val", ""}, {"loader.seed", "-1"}, {"mech.train", "1,,2"}, {"step", "-3"}}) {
    auto broken = m;
    broken[key] = bad;
    CAPTURE(key);
    CHECK_THROWS_AS(train::loop_state_from_metadata(broken, "x"), Error);
  }
  // counters no run writes: best_step after step, more skipped steps than steps, a negative or non-finite time,
  // more correct answers than examples, a metrics size below -1
  for (const auto& [key, bad] :
       std::vector<std::pair<std::string, std::string>>{{"best_step", "18"},
                                                        {"nonfinite_steps", "18"},
                                                        {"wall_s", "-1"},
                                                        {"wall_s", "inf"},
                                                        {"acc.correct", "0x1.1p+4"},
                                                        {"metrics.csv_bytes", "-2"},
                                                        {"metrics.csv_bytes", "5"}}) {  // one of two
    auto broken = m;
    broken[key] = bad;
    CAPTURE(key);
    CHECK_THROWS_AS(train::loop_state_from_metadata(broken, "x"), Error);
  }
  auto version2 = m;  // before the metrics sizes: not recorded
  version2["format_version"] = "2", version2.erase("metrics.csv_bytes"), version2.erase("metrics.jsonl_bytes");
  CHECK(train::loop_state_from_metadata(version2, "v2").metrics_csv_bytes == -1);
  auto missing = m;
  missing.erase("acc.count");
  CHECK_THROWS_WITH_AS(train::loop_state_from_metadata(missing, "x"), doctest::Contains("acc.count"), Error);
}

TEST_CASE("Options: config.json written from a Config reads back to it; unknown keys and bad values are refused") {
  const fs::path dir = temp_dir("config");
  fs::create_directories(dir);
  train::Config c = tiny(dir);
  c.k = {4, 8}, c.tau_sep = {0.5, 2}, c.lr = 1.0 / 3.0, c.asam_patterns = {"window", "clustered"}, c.seed = 42;
  std::ofstream(dir / "config.json") << train::config_json(c, {{"git_commit", "abc"}, {"command", "train ..."}});
  const train::Config r = train::read_config((dir / "config.json").string());
  CHECK(r.k == c.k);
  CHECK(r.tau_sep == c.tau_sep);
  CHECK(r.lr == c.lr);  // 17 significant digits
  CHECK(r.asam_patterns == c.asam_patterns);
  CHECK(r.seed == 42);
  CHECK(train::config_json(r) == train::config_json(c));

  std::ofstream(dir / "typo.json") << R"({"lerning_rate": 0.1})";
  CHECK_THROWS_WITH_AS(train::read_config((dir / "typo.json").string()), doctest::Contains("lerning_rate"), Error);
  std::ofstream(dir / "bad.json") << R"({"heads": 0})";
  CHECK_THROWS_WITH_AS(train::read_config((dir / "bad.json").string()), doctest::Contains("heads"), Error);
  std::ofstream(dir / "choice.json") << R"({"model": "transformer"})";
  CHECK_THROWS_AS(train::read_config((dir / "choice.json").string()), Error);
  std::ofstream(dir / "broken.json") << R"({"heads": )";
  CHECK_THROWS_WITH_AS(train::read_config((dir / "broken.json").string()), doctest::Contains("not valid JSON"), Error);
  CHECK_THROWS_AS(train::read_config((dir / "absent.json").string()), Error);
  CHECK_THROWS_WITH_AS(train::read_config(dir.string()), doctest::Contains("a directory, not a config file"), Error);
  fs::remove_all(dir);
}

TEST_CASE("validate_config: the options together, and a memory lower bound against the machine's memory") {
  train::Config c;
  CHECK_NOTHROW(train::validate_config(c));
  CHECK(train::memory_lower_bound(c).bytes > 0);  // fashion-mnist-seq: 784 tokens
  auto refused = [](train::Config bad, const char* says) {
    CAPTURE(says);
    CHECK_THROWS_WITH_AS(train::validate_config(bad), doctest::Contains(says), Error);
    if (std::string(says).find("needs at least") == std::string::npos)  // make_run: no memory bound (inference)
      CHECK_THROWS_WITH_AS(train::make_run(bad), doctest::Contains(says), Error);  // before any data is read
  };
  train::Config h = c;
  h.heads = 3;
  refused(h, "'d_model' 64 must be a multiple of 'heads' 3");
  h = c, h.alpha_coh = {1, 2};
  refused(h, "'alpha_coh' has 2 values");
  h = c, h.min_len = 10, h.max_len = 5;
  refused(h, "'min_len' 10 exceeds 'max_len' 5");
  h = c, h.w_min = 1, h.w_max = 1;
  refused(h, "'w_min' 1 must be below 'w_max' 1");
  h = c, h.batch = 1 << 20, h.max_len = 1 << 20;
  refused(h, "this run needs at least");
  // what is not an attention model, or of unknown length, or on another device, has no bound
  h.model = "mlp";
  CHECK(train::memory_lower_bound(h).bytes == 0);
  h = c, h.task = "file:/x.tsv";
  CHECK(train::memory_lower_bound(h).bytes == 0);
}

TEST_CASE("Trainer: callbacks in order; a stop leaves a checkpoint; resumed, the run ends bit-identical") {
  const fs::path whole = temp_dir("whole"), parts = temp_dir("parts");
  std::string best_whole;
  {
    train::Trainer t(tiny(whole));
    auto rec = std::make_shared<Recorder>();
    t.add_callback(rec);
    CHECK(t.fit());
    CHECK(t.state().step == 24);
    const std::vector<std::string>& e = rec->events;
    REQUIRE(e.size() > 4);
    CHECK(e.front() == "begin");
    CHECK(e[1] == "step1");
    CHECK(e.back() == "end");
    // the val row of step 8 comes after step 8 began and before step 9 did
    const auto at = [&](const std::string& x) { return std::find(e.begin(), e.end(), x) - e.begin(); };
    CHECK(at("step8") < at("val@8"));
    CHECK(at("val@8") < at("step9"));
    t.write_summary(t.test());
    std::ifstream f(whole / "best.safetensors", std::ios::binary);
    best_whole.assign(std::istreambuf_iterator<char>(f), {});
  }
  {
    train::Trainer t(tiny(parts));
    auto rec = std::make_shared<Recorder>(10);
    t.add_callback(rec);
    CHECK_FALSE(t.fit());  // stopped after step 10, with a checkpoint of it
    CHECK(t.state().step == 10);
    CHECK(rec->events.back() == "stopped");
  }
  {
    train::TrainerFlags resume;
    resume.resume = true;
    train::Trainer t(tiny(parts), resume);
    CHECK(t.state().step == 10);
    CHECK(t.fit());
    t.write_summary(t.test());
  }
  std::ifstream f(parts / "best.safetensors", std::ios::binary);
  const std::string best_parts(std::istreambuf_iterator<char>(f), {});
  CHECK(best_parts == best_whole);  // the model, bit for bit
  // a checkpoint whose counters cannot be read changes nothing
  {
    train::TrainerFlags resume;
    resume.resume = true;
    const fs::path ckpt = parts / "ckpt" / "last.safetensors";
    std::map<std::string, std::string> meta;
    StateDict entries = load_safetensors(ckpt.string(), &meta);
    meta["step"] = "oops";
    save_safetensors(ckpt.string(), entries, meta);
    train::Run r = train::make_run(tiny(parts));
    train::Optimization o = train::make_optimization(r, 24);
    const StateDict before = r.model->state_dict();
    std::vector<Tensor> copies;
    for (const auto& [name, t] : before) copies.push_back(t.clone());
    CHECK_THROWS_WITH_AS(train::load_training_state(ckpt.string(), r, o), doctest::Contains("'step'"), Error);
    size_t i = 0;
    for (const auto& [name, t] : r.model->state_dict()) CHECK(testing::same_bits(t, copies[i++]));
  }
  fs::remove_all(whole), fs::remove_all(parts);
}

TEST_CASE("Trainer: a checkpoint before the first step resumes; counters the run cannot take are refused first") {
  const fs::path dir = temp_dir("step0");
  train::Config c = tiny(dir);
  c.model = "asam";  // mechanism sums in the checkpoint (the gate's)
  c.steps = 6;
  {
    train::Trainer t(c);
    t.checkpoint();  // step 0: nothing observed yet
  }
  train::TrainerFlags resume;
  resume.resume = true;
  {
    train::Trainer t(c, resume);
    CHECK(t.state().step == 0);
    CHECK(t.fit());
    CHECK(t.state().step == 6);
  }
  // a loader position beyond the epoch: refused (before the tensors are loaded: load_training_state's accept)
  const fs::path ckpt = dir / "ckpt" / "last.safetensors";
  std::map<std::string, std::string> meta;
  StateDict entries = load_safetensors(ckpt.string(), &meta);
  meta["loader.position"] = "999999";
  save_safetensors(ckpt.string(), entries, meta);
  CHECK_THROWS_WITH_AS(train::Trainer(c, resume), doctest::Contains("position 999999"), Error);
  fs::remove_all(dir);
}

TEST_CASE("load_run: a finished run's model rebuilt from its directory scores as its test pass did") {
  const fs::path dir = temp_dir("load");
  train::Config c = tiny(dir);
  c.steps = 8;
  double test_accuracy = 0;
  {
    train::Trainer t(c);
    CHECK(t.fit());
    test_accuracy = t.test().test.accuracy;
  }
  train::Run r = train::load_run(dir.string());
  train::MechStats mech(r);
  CHECK(train::evaluate(r, *r.task.test, 0, mech, false).accuracy == test_accuracy);
  CHECK_THROWS_WITH_AS(train::load_run((dir / "nowhere").string()), doctest::Contains("config.json"), Error);
  CHECK_THROWS_WITH_AS(train::load_run(dir.string(), "absent.safetensors"), doctest::Contains("absent"), Error);
  fs::remove_all(dir);
}

TEST_CASE("load_run for every model kind: the rebuilt model scores as the run did; predict agrees with evaluate") {
  const bool fmnist = fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  for (const std::string kind : {"dense", "ascender", "asam", "window", "window-global", "lm", "firing", "mlp"}) {
    CAPTURE(kind);
    if ((kind == "firing" || kind == "mlp") && !fmnist) continue;  // image models: Debian's dataset-fashion-mnist
    const fs::path dir = temp_dir("kind_" + kind);
    train::Config c = tiny(dir);
    c.model = kind, c.steps = 3, c.asam_window = 4;
    if (kind == "firing" || kind == "mlp")
      c.task = "fashion-mnist", c.image_size = 7, c.train_size = 64, c.val_size = 32, c.test_size = 32,
      c.firing_hidden = 16, c.mlp_hidden = {16};
    train::TestResult first;
    {
      train::Trainer t(c);
      REQUIRE(t.fit());
      first = t.test();
    }
    train::Run r = train::load_run(dir.string());
    train::MechStats mech(r);
    const train::EvalResult again = train::evaluate(r, *r.task.test, 0, mech, true);
    CHECK(again.loss == first.test.loss);
    CHECK(again.accuracy == first.test.accuracy);
    if (kind != "lm") {  // predict: the class of highest probability is evaluate's prediction, rows sum to 1
      const Tensor p = train::predict_probabilities(r, *r.task.test, 5);
      REQUIRE(p.shape() == Shape{r.task.test->size(), r.task.classes});
      const std::vector<int64_t> best = argmax(p, 1).to_vector<int64_t>();
      for (const auto& row : again.predictions)
        CHECK(best[static_cast<size_t>(row[0])] == static_cast<int64_t>(row[2]));
      testing::check_close(sum(p, {1}), std::vector<double>(static_cast<size_t>(p.size(0)), 1.0), 1e-12, 0);
    } else {
      CHECK_THROWS_WITH_AS(train::predict_probabilities(r, *r.task.test, 5), doctest::Contains("language model"),
                           Error);
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("launch_info: a launcher's environment read, one process without it, a bad value refused naming it") {
  const char* names[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE", "PMI_RANK",
      "MPI_LOCALRANKID"};
  std::vector<std::pair<std::string, std::string>> saved;  // this process's own (a test run under mpirun has them)
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
  for (const char* n : names) unsetenv(n);
  auto l = distributed::launch_info();
  CHECK((l.size == 1 && l.rank == 0 && l.local_rank == 0));
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1), setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  l = distributed::launch_info();
  CHECK((l.size == 4 && l.rank == 3 && l.local_rank == 1));
  for (const char* n : names) unsetenv(n);
  setenv("PMI_SIZE", "2", 1), setenv("PMI_RANK", "1", 1);  // MPICH / Slurm
  l = distributed::launch_info();
  CHECK((l.size == 2 && l.rank == 1 && l.local_rank == 0));
  setenv("PMI_RANK", "two", 1);
  CHECK_THROWS_WITH_AS(distributed::launch_info(), doctest::Contains("PMI_RANK='two' is not a whole number"), Error);
  setenv("PMI_RANK", "2", 1);
  CHECK_THROWS_WITH_AS(distributed::launch_info(), doctest::Contains("rank 2 is not in a job of 2 processes"), Error);
  for (const char* n : names) unsetenv(n);
  for (const auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}
