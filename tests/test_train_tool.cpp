// The `train` tool end to end (tools/train.cpp), on the grouping task (generated: no package needed) with a tiny
// model: its files, resume after a checkpoint and after SIGINT bit-identical to an unbroken run, --config with
// overriding flags, --eval-only, and the command-line contract.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cctype>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "nn/safetensors.h"
#include "ops/ops.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace asc;

#ifdef ASC_TRAIN_BIN

namespace {

const std::string kTiny =
    " --task grouping --train-size 256 --val-size 64 --test-size 64 --model ascender --d-model 16 --heads 2"
    " --layers 1 --ffn 32 --k 4 --batch 16 --dropout 0.1 --eval-every 8 --progress none --threads 1";

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("asc_train_{}_{}", name, ::getpid());
  fs::remove_all(p);
  return p;
}

// Runs train with `args`; returns its exit code (stdout/stderr into DIR/../name.log).
int run(const std::string& args, const std::string& log) {
  const std::string cmd = fmt::format("{} {} > {} 2>&1", ASC_TRAIN_BIN, args, log);
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string log_of(const fs::path& d) { return d.string() + ".log"; }

// The firing cases train on Fashion-MNIST (Debian's dataset-fashion-mnist); they are skipped without it.
bool have_fashion_mnist() { return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every tensor of two checkpoints equal bit for bit (metadata holds wall times, which differ).
void check_same_tensors(const fs::path& a, const fs::path& b) {
  StateDict x = load_safetensors(a.string()), y = load_safetensors(b.string());
  REQUIRE(x.size() == y.size());
  for (const auto& [name, t] : x) {
    CAPTURE(name);
    const Tensor* u = y.find(name);
    REQUIRE(u != nullptr);
    REQUIRE(u->shape() == t.shape());
    CHECK(std::memcmp(u->raw_data(), t.raw_data(),
                      static_cast<size_t>(t.numel() * static_cast<int64_t>(dtype_size(t.dtype())))) == 0);
  }
}

// The metrics rows without their timing columns (tokens_per_s, time_s), which differ between runs.
std::string rows_without_time(const fs::path& csv) {
  std::ifstream f(csv);
  std::string out, line;
  while (std::getline(f, line)) {
    std::vector<std::string> cols;
    size_t s = 0;
    for (size_t e; (e = line.find(',', s)) != std::string::npos; s = e + 1) cols.push_back(line.substr(s, e - s));
    cols.push_back(line.substr(s));
    for (size_t i = 0; i < cols.size(); ++i)
      if (i != 6 && i != 7) out += cols[i] + ",";
    out += "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("train: the files of a run") {
  const fs::path d = temp_dir("files");
  REQUIRE(run(kTiny + " --steps 16 --dump-decomposition 0,3 --out " + d.string(), d.string() + ".log") == 0);
  for (const char* f :
       {"config.json", "metrics.csv", "metrics.jsonl", "summary.json", "predictions.csv", "best.safetensors",
        "ckpt/last.safetensors", "dumps/decomposition_0.safetensors", "dumps/decomposition_3.safetensors"})
    CHECK_MESSAGE(fs::exists(d / f), f);
  // predictions: a header and one row per test example
  const std::string pred = read(d / "predictions.csv");
  CHECK(std::count(pred.begin(), pred.end(), '\n') == 65);
  const std::string summary = read(d / "summary.json");
  CHECK(summary.find("\"test_accuracy\"") != std::string::npos);
  CHECK(summary.find("\"attention_flops_per_token\"") != std::string::npos);
  // ω per head in the metrics; the decomposition of example 0 has every term for layer 0, (H, T, T)
  CHECK(read(d / "metrics.csv").find("L0.omega_sep.h1") != std::string::npos);
  StateDict dec = load_safetensors((d / "dumps/decomposition_0.safetensors").string());
  for (const char* k : {"L0.S_base", "L0.align", "L0.sep", "L0.coh", "L0.S", "L0.A"}) {
    CAPTURE(k);
    REQUIRE(dec.find(k) != nullptr);
    CHECK(dec.find(k)->shape() == Shape{2, 64, 64});
  }
  // --eval-only reproduces the test accuracy of the best checkpoint, the model built from the config.json beside it
  const fs::path e = temp_dir("eval");
  REQUIRE(run("--progress none --out " + e.string() + " --eval-only " + (d / "best.safetensors").string(),
              e.string() + ".log") == 0);
  const auto acc = [](const std::string& s) { return s.substr(s.find("\"test_accuracy\"")).substr(0, 40); };
  CHECK(acc(read(e / "summary.json")) == acc(summary));
  fs::remove_all(d), fs::remove_all(e);
}

TEST_CASE("train: --resume continues bit-identically, after a checkpoint and after SIGINT") {
  const fs::path full = temp_dir("full"), split = temp_dir("split"), sig = temp_dir("sig");
  REQUIRE(run(kTiny + " --steps 24 --out " + full.string(), full.string() + ".log") == 0);
  // Resumed with no step left (as after a SIGINT between the last step and the test evaluation): it evaluates again
  // and writes the same rows — the test row's lr too, the last step's (it reported the scheduler's next lr, 0).
  {
    const fs::path again = temp_dir("again");
    fs::copy(full, again, fs::copy_options::recursive);
    REQUIRE(run(kTiny + " --steps 24 --out " + again.string() + " --resume", again.string() + ".log") == 0);
    CHECK(rows_without_time(full / "metrics.csv") == rows_without_time(again / "metrics.csv"));
    fs::remove_all(again);
  }
  // Stopped after 10 steps (its checkpoint at step 10), then continued to 24 with the same flags.
  REQUIRE(run(kTiny + " --steps 24 --ckpt-every 5 --out " + split.string() + " --stop-after 10",
              split.string() + ".log") == 130);
  REQUIRE(run(kTiny + " --steps 24 --out " + split.string() + " --resume", split.string() + ".log") == 0);
  check_same_tensors(full / "ckpt/last.safetensors", split / "ckpt/last.safetensors");
  check_same_tensors(full / "best.safetensors", split / "best.safetensors");
  CHECK(rows_without_time(full / "metrics.csv") == rows_without_time(split / "metrics.csv"));

  // SIGINT at whatever step it lands on: exit 130 with a checkpoint, and the resumed run ends where the full one did.
  const std::string cmd = std::string(ASC_TRAIN_BIN) + kTiny + " --steps 24 --out " + sig.string();
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " > " + sig.string() + ".log 2>&1").c_str(), (char*)nullptr);
    _exit(127);
  }
  // wait until it has trained a step (its first metrics row), then interrupt it
  for (int i = 0; i < 600 && !fs::exists(sig / "metrics.csv"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  const int code = WEXITSTATUS(status);
  CHECK((code == 130 || code == 0));  // 0 only if the run finished before the signal arrived
  if (code == 130) {
    CHECK(fs::exists(sig / "ckpt/last.safetensors"));
    REQUIRE(run(kTiny + " --steps 24 --out " + sig.string() + " --resume", sig.string() + ".log") == 0);
  }
  check_same_tensors(full / "ckpt/last.safetensors", sig / "ckpt/last.safetensors");
  CHECK(rows_without_time(full / "metrics.csv") == rows_without_time(sig / "metrics.csv"));
  fs::remove_all(full), fs::remove_all(split), fs::remove_all(sig);
}

TEST_CASE("train: resume mid-window: the training rows' partial sums (loss and ASAM gate) are checkpointed too") {
  const std::string args =
      " --task grouping --train-size 128 --val-size 32 --test-size 32 --model asam --asam-window 4"
      " --d-model 16 --heads 2 --layers 1 --ffn 32 --batch 16 --steps 16 --log-every 4"
      " --eval-every 8 --eval-batches 1 --progress none --threads 1";
  const fs::path full = temp_dir("mw_full"), split = temp_dir("mw_split");
  REQUIRE(run(args + " --out " + full.string(), full.string() + ".log") == 0);
  REQUIRE(run(args + " --out " + split.string() + " --stop-after 5", split.string() + ".log") ==
          130);  // step 5 of a 4-step row
  REQUIRE(run(args + " --out=" + split.string() + " --resume", split.string() + ".log") == 0);  // the --out= spelling
  CHECK(rows_without_time(full / "metrics.csv") == rows_without_time(split / "metrics.csv"));
  check_same_tensors(full / "ckpt/last.safetensors", split / "ckpt/last.safetensors");
  fs::remove_all(full), fs::remove_all(split);
}

TEST_CASE("train: --config, with flags overriding it; a run directory is not overwritten") {
  const fs::path a = temp_dir("cfg_a"), b = temp_dir("cfg_b");
  REQUIRE(run(kTiny + " --steps 4 --seed 5 --out " + a.string(), a.string() + ".log") == 0);
  REQUIRE(run("--config=" + (a / "config.json").string() + " --seed 6 --out " + b.string(), b.string() + ".log") == 0);
  const std::string cb = read(b / "config.json");
  CHECK(cb.find("\"seed\": 6") != std::string::npos);
  CHECK(cb.find("\"d_model\": 16") != std::string::npos);  // from the file
  CHECK(cb.find("\"git_commit\"") != std::string::npos);
  // the same directory again without --resume: refused, nothing overwritten
  const std::string before = read(a / "metrics.csv");
  CHECK(run(kTiny + " --steps 4 --out " + a.string(), a.string() + ".log") == 1);
  CHECK(read(a / "metrics.csv") == before);
  // A config file's values are checked like flags: a bad value, an unknown option or a wrong type is exit 2.
  for (const std::string bad : {R"({"batch": 0})", R"({"model": "ASCender"})", R"({"bogus": 1})", R"({"batch": 32.7})",
                                R"({"optimizer": "AdamW"})", R"([1, 2])", "{not json"}) {
    CAPTURE(bad);
    const fs::path cfg = fs::path(b.string() + "_bad.json");
    std::ofstream(cfg) << bad;
    CHECK(run("--config " + cfg.string() + " --out " + b.string() + "_x", b.string() + ".log") == 2);
    CHECK(read(b.string() + ".log").find("config file") != std::string::npos);
    fs::remove(cfg);
  }
  // --eval-only of a model file with no config.json beside it and no --config: a usage error
  CHECK(run("--eval-only /nonexistent/best.safetensors --out " + b.string() + "_y", b.string() + ".log") == 2);
  fs::remove_all(a), fs::remove_all(b);
}

TEST_CASE("train: every model kind trains a few steps and logs its mechanism's statistics") {
  const std::string small =
      " --train-size 64 --val-size 32 --test-size 32 --d-model 16 --heads 2 --layers 1 --ffn 32"
      " --batch 16 --steps 4 --eval-every 2 --progress none --threads 1";
  struct Case {
    std::string args, column, dump;
  };
  const std::vector<Case> cases = {
      {"--task grouping --model asam --asam-window 4", "L0.asam_gate", "dumps/asam_gate.safetensors"},
      {"--task grouping --model window-global --asam-window 4", "L0.asam_gate", "dumps/asam_gate.safetensors"},
      {"--task grouping --model dense --positional alibi", "accuracy", ""},
      {"--task listops --min-len 20 --max-len 60 --model ascender --asc-mode windowed --asc-window 8 --k 2",
       "L0.omega_coh.h1", ""},
      {"--task grouping --model lm", "bits_per_byte", ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const fs::path d = temp_dir("kind");
    REQUIRE(run(c.args + small + " --out " + d.string(), d.string() + ".log") == 0);
    const std::string m = read(d / "metrics.csv");
    CHECK(m.substr(0, m.find('\n')).find(c.column) != std::string::npos);
    if (!c.dump.empty()) CHECK(fs::exists(d / c.dump));
    const auto cfg = nlohmann::json::parse(read(d / "config.json"));  // the model's default rate, as used
    CHECK(cfg["lr"] == (c.args.find("model lm") != std::string::npos ? 3e-3 : 1e-3));
    CHECK(cfg["epochs"] == 1);  // a generated task: one epoch, also for the language model
    fs::remove_all(d);
  }
  // The firing network on Fashion-MNIST images with rule B (skipped without the dataset).
  if (!have_fashion_mnist()) {
    MESSAGE("dataset-fashion-mnist not installed: the firing case is skipped");
    return;
  }
  const fs::path d = temp_dir("firing");
  REQUIRE(run("--task fashion-mnist --model firing --rule B --firing-hidden 32 --fan-out 2" + small + " --out " +
                  d.string(),
              d.string() + ".log") == 0);
  CHECK(read(d / "metrics.csv").find("L0.firing_threshold") != std::string::npos);
  StateDict rates = load_safetensors((d / "dumps/firing_rates.safetensors").string());
  REQUIRE(rates.find("L0.rate") != nullptr);
  CHECK(rates.find("L0.rate")->shape() == Shape{32});
  const double mx = amax(*rates.find("L0.rate")).item<double>(), mn = amin(*rates.find("L0.rate")).item<double>();
  CHECK((mn >= 0 && mx <= 1));
  fs::remove_all(d);
}

TEST_CASE("train: --cluster-metrics scores each head's attention rows (and ASCender's z) against the true groups") {
  const std::string small =
      " --train-size 64 --val-size 32 --test-size 32 --d-model 16 --heads 2 --layers 1 --ffn 32"
      " --batch 16 --steps 2 --progress none --threads 1 --task grouping --cluster-metrics 20";
  for (const std::string model : {"ascender", "dense"}) {
    CAPTURE(model);
    const fs::path d = temp_dir("cluster");
    REQUIRE(run("--model " + model + small + " --out " + d.string(), d.string() + ".log") == 0);
    const auto j = nlohmann::json::parse(read(d / "cluster_metrics.json"));
    CHECK(j["examples"] == 20);
    CHECK(j["spaces"].contains("z") == (model == "ascender"));
    const auto& heads = j["spaces"]["A"]["layers"][0];
    REQUIRE(heads.size() == 2);
    for (const auto& h : heads) {
      CHECK(h["nmi"].get<double>() >= 0);
      CHECK(h["nmi"].get<double>() <= 1);
      CHECK(h["ari"].get<double>() >= -0.5);
      CHECK(h["ari"].get<double>() <= 1);
      if (!h["silhouette"].is_null()) CHECK(std::fabs(h["silhouette"].get<double>()) <= 1);
    }
    fs::remove_all(d);
  }
  const fs::path d = temp_dir("cluster_bad");
  CHECK(run("--model asam" + small + " --out " + d.string(), d.string() + ".log") == 1);
  CHECK(read(d.string() + ".log").find("--cluster-metrics needs") != std::string::npos);
  fs::remove_all(d);
  CHECK(run(kTiny + " --steps 2 --task listops --min-len 20 --max-len 40 --cluster-metrics 4 --out " + d.string(),
            d.string() + ".log") == 1);
  CHECK(read(d.string() + ".log").find("true groups") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("train: --params-only prints the size without writing; --attn-dropout > 0 refused with ASAM") {
  const fs::path d = temp_dir("params");
  const std::string log = d.string() + ".log";
  REQUIRE(run(kTiny + " --params-only --out " + d.string(), log) == 0);
  CHECK(!fs::exists(d));
  const auto j = nlohmann::json::parse(read(log));
  CHECK(j["params"].get<int64_t>() > 0);
  CHECK(j["attention_flops_per_token"].get<double>() > 0);
  CHECK(run(kTiny + " --model asam --attn-dropout 0.1 --params-only --out " + d.string(), log) == 1);
  CHECK(read(log).find("ASAM attention has no attention dropout") != std::string::npos);
}

TEST_CASE("train: --robustness measures noise, FGSM, float32 vs float64 and lengths; --on-nonfinite skip counts") {
  const fs::path d = temp_dir("robust");
  REQUIRE(run(kTiny + " --steps 2 --model dense --robustness 1 --robustness-max-len 64 --robustness-examples 8 --out " +
                  d.string(),
              d.string() + ".log") == 0);
  const auto j = nlohmann::json::parse(read(d / "robustness.json"));
  CHECK(j["examples"].get<int64_t>() >= 8);
  CHECK(std::fabs(j["noise_correlation"].get<double>()) <= 1.0);
  CHECK(j["noise_correlation"].get<double>() > 0.5);  // 10 % noise leaves the logits strongly correlated
  CHECK(j["fgsm_relative_change"].get<double>() > 0);
  CHECK(j["float32_vs_float64_max_relative"].get<double>() < 1e-4);
  REQUIRE(j["lengths"].size() == 3);  // 16, 32, 64
  for (const auto& row : j["lengths"]) CHECK(row["ok"].get<bool>());
  CHECK(run(kTiny + " --steps 2 --robustness 1 --robustness-max-len 100 --out " + d.string() + "x", log_of(d)) == 2);
  CHECK(read(log_of(d)).find("'robustness_max_len' must be a power of two, got 100") != std::string::npos);
  fs::remove_all(d);
  // An absurd learning rate overflows the weights within a few steps: the default stops with a message, skip counts.
  const std::string blowup = kTiny + " --model dense --steps 6 --lr 1e38 --clip 0";
  CHECK(run(blowup + " --out " + d.string(), log_of(d)) == 1);
  CHECK(read(log_of(d)).find("is not finite") != std::string::npos);
  fs::remove_all(d);
  REQUIRE(run(blowup + " --on-nonfinite skip --out " + d.string(), log_of(d)) == 0);
  CHECK(nlohmann::json::parse(read(d / "summary.json"))["nonfinite_steps"].get<int64_t>() >= 1);
  fs::remove_all(d);
}

TEST_CASE("train: rule A moves the first firing layer by its rule alone; the MLP baseline trains") {
  if (!have_fashion_mnist()) {
    MESSAGE("dataset-fashion-mnist not installed: skipped");
    return;
  }
  const std::string small =
      " --task fashion-mnist --train-size 64 --val-size 32 --test-size 32 --batch 16 --steps 3"
      " --eval-every 3 --progress none --threads 1";
  // Rule A with all its rates 0: only backprop could move the first layer, and it must not. A run at lr 0.05 and one
  // at lr 1e-30 (nothing moves) end with the same first layer, bit for bit, and different readouts.
  const std::string rule_a =
      "--model firing --firing-hidden 16 --fan-out 2 --firing-init nonnegative --rule A"
      " --eta-w 0 --eta-f 0 --eta-sp 0" +
      small;
  const fs::path d = temp_dir("rule_a"), still = temp_dir("rule_a_still");
  // (--min-lr: the cosine schedule's floor is absolute; it must not reach the rule's layer either)
  REQUIRE(run(rule_a + " --lr 0.05 --min-lr 0.01 --out " + d.string(), d.string() + ".log") == 0);
  REQUIRE(run(rule_a + " --lr 1e-30 --out " + still.string(), still.string() + ".log") == 0);
  StateDict moved = load_safetensors((d / "best.safetensors").string());
  StateDict fixed = load_safetensors((still / "best.safetensors").string());
  int hidden = 0, readout_changed = 0;
  for (const auto& [name, t] : moved) {
    CAPTURE(name);
    const Tensor* u = fixed.find(name);
    REQUIRE(u != nullptr);
    const bool same =
        std::memcmp(u->raw_data(), t.raw_data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype())) == 0;
    if (name.rfind("hidden.", 0) == 0) {
      ++hidden;
      CHECK(same);
    }
    if (name.rfind("readout.", 0) == 0 && !same) ++readout_changed;
  }
  CHECK(hidden >= 2);
  CHECK(readout_changed >= 1);
  fs::remove_all(d);
  fs::remove_all(still);
  const fs::path m = temp_dir("mlp");
  REQUIRE(run("--model mlp --mlp-hidden 32,16" + small + " --out " + m.string(), m.string() + ".log") == 0);
  CHECK(nlohmann::json::parse(read(m / "summary.json"))["params"] == 784 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10);
  // --eval-only rebuilds the model from config.json, whose empty data_dir must stay empty (it once swallowed the
  // next option as its value: Fashion-MNIST was then looked for in a directory named "--data-seed=0")
  const fs::path e = temp_dir("mlp_eval");
  REQUIRE(run("--eval-only " + (m / "best.safetensors").string() + " --progress none --out " + e.string(),
              e.string() + ".log") == 0);
  CHECK(nlohmann::json::parse(read(e / "summary.json"))["test_accuracy"] ==
        nlohmann::json::parse(read(m / "summary.json"))["test_accuracy"]);
  fs::remove_all(e);
  fs::remove_all(m);
}

TEST_CASE("train: --eta-w / --eta-f default to each rule's own rates, written to config.json as used") {
  if (!have_fashion_mnist()) {
    MESSAGE("dataset-fashion-mnist not installed: skipped");
    return;
  }
  const std::string small =
      " --model firing --firing-hidden 8 --fan-out 2 --task fashion-mnist --train-size 32 --val-size 16"
      " --test-size 16 --batch 16 --steps 1 --progress none --threads 1";
  struct Case {
    std::string flags;
    double eta_w, eta_f;
  };
  const Case cases[] = {
      {"--rule B", optim::RuleBOptions{}.eta_w, optim::RuleBOptions{}.eta_f},
      {"--rule A --firing-init nonnegative", optim::RuleAOptions{}.eta_plus, optim::RuleAOptions{}.rho_plus},
      {"--rule B --eta-w 0.25 --eta-f 0", 0.25, 0.0},
      {"--rule B --eta-w -1", optim::RuleBOptions{}.eta_w, optim::RuleBOptions{}.eta_f},
  };
  for (const Case& k : cases) {
    CAPTURE(k.flags);
    const fs::path d = temp_dir("rule_rates");
    REQUIRE(run(k.flags + small + " --out " + d.string(), log_of(d)) == 0);
    const auto cfg = nlohmann::json::parse(read(d / "config.json"));
    CHECK(cfg["eta_w"].get<double>() == k.eta_w);
    CHECK(cfg["eta_f"].get<double>() == k.eta_f);
    fs::remove_all(d);
  }
  const fs::path bad = temp_dir("rule_rates_bad");
  CHECK(run("--rule B --eta-w -0.5" + small + " --out " + bad.string(), log_of(bad)) == 2);
  fs::remove_all(bad);
}

TEST_CASE("train: --profile N records N steps after a warm-up step: the table and a Chrome trace") {
  const fs::path d = temp_dir("profile");
  REQUIRE(run(kTiny + " --steps 5 --profile 3 --out " + d.string(), log_of(d)) == 0);
  const std::string table = read(d / "profile.txt");
  CHECK(table.find("3 step(s) from step 2") != std::string::npos);
  CHECK(table.find("train_step") != std::string::npos);
  CHECK(table.find("matmul") != std::string::npos);
  CHECK(table.find("ascender_attention") != std::string::npos);    // the fused attention kernel of the model
  CHECK(read(log_of(d)).find("train_step") != std::string::npos);  // printed too
  const nlohmann::json trace = nlohmann::json::parse(read(d / "profile_trace.json"));
  int64_t steps = 0;
  for (const auto& e : trace["traceEvents"]) steps += e["name"] == "train_step";
  CHECK(steps == 3);
  // more steps than the run has: what was recorded (no warm-up step then)
  const fs::path d2 = temp_dir("profile_short");
  REQUIRE(run(kTiny + " --steps 2 --profile 5 --out " + d2.string(), log_of(d2)) == 0);
  CHECK(read(d2 / "profile.txt").find("2 step(s) from step 1") != std::string::npos);
  fs::remove_all(d), fs::remove_all(d2);
}

TEST_CASE(
    "train: every option is checked like a flag, in flags and config files: exit 2 naming the key, nothing read") {
  const fs::path d = temp_dir("validate");
  const std::string log = d.string() + ".log";
  // flags: nothing clamped, wrapped or coerced; names from their lists; the options together
  const std::pair<std::string, std::string> flags[] = {
      {"--steps 9223372036854775808", "--steps: must be an integer in [0, 1000000000000]"},
      {"--seed -1", "--seed: must be an integer in [0, 2^64 - 1]"},
      {"--norm-first 2", "--norm-first: must be true or false, got '2'"},
      {"--threads 1000000000", "--threads: must be an integer in [0, 4096]"},
      {"--lr 1e400", "--lr: must be -1 or a number > 0, got '1e400'"},
      {"--asam-patterns window,foo", "--asam-patterns: must be one of window | strided"},
      {"--surrogate foo", "--surrogate: must be one of"},
      {"--task file:", "--task: must be one of"},
      {"--fixed-gate -0.5", "--fixed-gate: must be -1 or a number in [0, 1]"},
      {"--k -1", "--k: must be an integer in [1, "},
      {"--heads 3", "'d_model' 16 must be a multiple of 'heads' 3"},
      {"--k 4,4,4", "'k' has 4 values: give one (every head) or one per head ('heads' 2)"},  // kTiny's --k 4 too
      {"--min-len 9 --max-len 8", "'min_len' 9 exceeds 'max_len' 8"},
      {"--batch 1048576 --max-len 1000000", "this run needs at least"},
  };
  for (const auto& [bad, says] : flags) {
    CAPTURE(bad);
    CHECK(run(kTiny + " --steps 2 " + bad + " --out " + d.string(), log) == 2);
    CHECK(read(log).find(says) != std::string::npos);
    CHECK_FALSE(fs::exists(d));  // refused before anything is read or written
  }
  // config files: each key's JSON type, its range, named as the file names it
  const std::pair<std::string, std::string> files[] = {
      {R"({"steps": 9223372036854775808})", "'steps': must be an integer in [0, 1000000000000]"},
      {R"({"seed": -1})", "'seed': must be an integer in [0, 2^64 - 1]"},
      {R"({"norm_first": 2})", "'norm_first' must be true or false, got 2"},
      {R"({"steps": 5.0})", "'steps' must be an integer, got 5.0"},
      {R"({"steps": "5"})", "'steps' must be an integer, got \"5\""},
      {R"({"lr": null})", "'lr' must be a number, got null"},
      {R"({"lr": {"a": 1}})", "'lr' must be a number, got {\"a\":1}"},
      {R"({"threads": 1000000000})", "'threads': must be an integer in [0, 4096]"},
      {R"({"tau_sep": [1, 2, 3]})", "'tau_sep' has 3 values"},
      {std::string(100000, '[') + std::string(100000, ']'), "JSON nested deeper than 32 levels"},
  };
  const fs::path cfg = fs::path(d.string() + "_cfg.json");
  for (const auto& [text, says] : files) {
    CAPTURE(text.substr(0, 60));
    std::ofstream(cfg) << text;
    CHECK(run(kTiny + " --steps 2 --config " + cfg.string() + " --out " + d.string(), log) == 2);
    CHECK(read(log).find(says) != std::string::npos);
    CHECK_FALSE(fs::exists(d));
  }
  fs::remove(cfg);
  // a directory or a missing path as the config file: one line saying so
  CHECK(run("--config " + fs::temp_directory_path().string() + " --out " + d.string(), log) == 2);
  CHECK(read(log).find("a directory, not a config file") != std::string::npos);
  // --resume in a directory where no run was started: one line, exit 1
  fs::create_directories(d);
  CHECK(run(kTiny + " --steps 2 --resume --out " + d.string(), log) == 1);
  CHECK(read(log).find("has no config.json, so no run was started there") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE(
    "train: --resume of a finished run changes nothing (more --steps extend it); a refused run leaves no directory") {
  const fs::path d = temp_dir("finished");
  const std::string log = d.string() + ".log";
  REQUIRE(run(kTiny + " --steps 4 --out " + d.string(), log) == 0);
  const std::string summary = read(d / "summary.json"), metrics = read(d / "metrics.csv");
  CHECK(run(kTiny + " --steps 4 --resume --out " + d.string(), log) == 0);
  CHECK(read(log).find("holds a finished run") != std::string::npos);
  CHECK(read(d / "summary.json") == summary);
  CHECK(read(d / "metrics.csv") == metrics);
  // extended and interrupted: unfinished again (no summary.json), then finished by the next resume
  REQUIRE(run(kTiny + " --steps 6 --stop-after 1 --resume --out " + d.string(), log) == 130);
  CHECK_FALSE(fs::exists(d / "summary.json"));
  REQUIRE(run(kTiny + " --steps 6 --resume --out " + d.string(), log) == 0);
  CHECK(nlohmann::json::parse(read(d / "summary.json"))["steps"] == 6);
  fs::remove_all(d);
  // the data cannot be read: refused after the options, before anything is written
  CHECK(run(kTiny + " --steps 2 --task file:/nonexistent/x.tsv --out " + d.string(), log) == 1);
  CHECK_FALSE(fs::exists(d));
  // an interrupted run's last progress line says where it stopped, not 100 %
  REQUIRE(run(kTiny + " --steps 8 --stop-after 3 --progress auto --progress-every 1000 --out " + d.string(), log) ==
          130);
  CHECK(read(log).find("3/8") != std::string::npos);
  CHECK(read(log).find("8/8") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("train: a corrupt checkpoint is refused on --resume, naming the tensor or the counter") {
  const fs::path d = temp_dir("corrupt");
  const std::string log = d.string() + ".log";
  REQUIRE(run(kTiny + " --steps 8 --stop-after 4 --out " + d.string(), log) == 130);
  const fs::path ckpt = d / "ckpt" / "last.safetensors";
  const std::string good = read(ckpt);
  // one flipped byte of the first model weight (the data section starts after the 8-byte length and the header)
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(good[static_cast<size_t>(i)]);
  std::string bad = good;
  bad[8 + n + 3] ^= 0x01;
  std::ofstream(ckpt, std::ios::binary) << bad;
  CHECK(run(kTiny + " --steps 8 --resume --out " + d.string(), log) == 1);
  CHECK(read(log).find("is corrupt: the CRC-32 of its") != std::string::npos);
  // a counter that no run could have written: refused even with the checksums rewritten
  std::ofstream(ckpt, std::ios::binary) << good;
  std::map<std::string, std::string> meta;
  StateDict sd = load_safetensors(ckpt.string(), &meta);
  meta["step"] = "-5";
  save_safetensors(ckpt.string(), sd, meta);
  CHECK(run(kTiny + " --steps 8 --resume --out " + d.string(), log) == 1);
  CHECK(read(log).find("step -5 must be >= 0") != std::string::npos);
  // the good one resumes
  meta["step"] = "4";
  save_safetensors(ckpt.string(), sd, meta);
  CHECK(run(kTiny + " --steps 8 --resume --out " + d.string(), log) == 0);
  fs::remove_all(d);
}

TEST_CASE("sample: text from a trained byte-level LM — streamed, batched, seeded, stopped; cached as recomputed") {
  const fs::path d = temp_dir("sample");
  const std::string log = d.string() + ".log";
  // a tiny LM on a file of text lines (bytes), a few steps
  fs::create_directories(d.string() + "_data");
  const fs::path tsv = fs::path(d.string() + "_data") / "lines.tsv";
  {
    std::ofstream f(tsv);
    for (int i = 0; i < 60; ++i) f << (i % 2 ? "a" : "b") << "\tthe cat sat on the mat number " << i << "\n";
  }
  REQUIRE(run("--task file:" + tsv.string() +
                  " --model lm --d-model 16 --heads 2 --layers 1 --ffn 32 --batch 8 --steps 6 --progress none "
                  "--threads 1 --out " +
                  d.string(),
              log) == 0);
  {  // the language model's own defaults, written to config.json as used: windows of 256 bytes, lr 3e-3, 4 epochs
    const auto cfg = nlohmann::json::parse(read(d / "config.json"));
    CHECK(cfg["max_len"] == 256);
    CHECK(cfg["lr"] == 3e-3);
    CHECK(cfg["epochs"] == 4);
    CHECK(cfg["positional"] == "rope");
  }
  auto sample = [&](const std::string& args) {
    const std::string cmd =
        std::string(ASC_SAMPLE_BIN) + " --run " + d.string() + " " + args + " > " + log + ".out 2> " + log;
    const int rc = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read(log + ".out"));
  };
  auto [rc, text] = sample("--prompt 'the c' --max-new-tokens 20 --seed 3");
  REQUIRE(rc == 0);
  CHECK(text.starts_with("the c"));
  CHECK(text.size() == 5 + 20 + 1);  // the prompt, 20 bytes, a newline
  CHECK(read(log).find("tokens/s; KV cache") != std::string::npos);
  CHECK(sample("--prompt 'the c' --max-new-tokens 20 --seed 3").second == text);             // seeded
  CHECK(sample("--prompt 'the c' --max-new-tokens 20 --seed 3 --no-cache").second == text);  // same numbers
  // greedy: the cached and recomputed decodings agree
  CHECK(sample("--prompt 'the' --temperature 0 --max-new-tokens 16").second ==
        sample("--prompt 'the' --temperature 0 --max-new-tokens 16 --no-cache").second);
  // several prompts, batched by length, each printed; a stop string ends each continuation
  auto [rc2, many] = sample("--prompt 'the' --prompt 'cat' --prompt 'number' --max-new-tokens 12 --temperature 0");
  CHECK(rc2 == 0);
  CHECK(many.find("---") != std::string::npos);
  CHECK(many.find("number") != std::string::npos);
  // the stop string: the continuation's first letter, digit or space (so the shell passes it as it is); the same
  // seeded draws with --stop end right after it
  const std::string draws = "--prompt 'the' --max-new-tokens 200 --temperature 1 --seed 1";
  auto [rc3, full] = sample(draws);
  REQUIRE(rc3 == 0);
  size_t at = 3;
  while (at < full.size() - 1 && !std::isalnum(static_cast<unsigned char>(full[at])) && full[at] != ' ') ++at;
  REQUIRE(at < full.size() - 1);
  auto [rc4, stopped] = sample(draws + " --stop '" + full.substr(at, 1) + "'");
  CHECK(rc4 == 0);
  CHECK(stopped == full.substr(0, at + 1) + "\n");
  // on a GPU (the GPU machine's suite): decoding there, cached and recomputed, makes as many bytes
  if (testing::gpu_or_skip()) {
    for (const std::string cache : {"", " --no-cache"}) {
      auto [rc_gpu, gpu_text] = sample("--prompt 'the c' --max-new-tokens 20 --seed 3 --device cuda" + cache);
      CHECK(rc_gpu == 0);
      CHECK(gpu_text.starts_with("the c"));
      CHECK(gpu_text.size() == text.size());
      CHECK(read(log).find("cuda") != std::string::npos);
    }
  }
  // not a language model, or no prompt: refused
  CHECK(sample("--prompt-ids 300").first == 1);
  fs::remove_all(d), fs::remove_all(d.string() + "_data");
}

TEST_CASE("predict: a trained classifier on new text lines and token ids, CSV and JSON lines") {
  const fs::path d = temp_dir("predict");
  const std::string log = d.string() + ".log";
  fs::create_directories(d.string() + "_data");
  const fs::path tsv = fs::path(d.string() + "_data") / "reviews.tsv";
  {
    std::ofstream f(tsv);
    for (int i = 0; i < 60; ++i)
      f << (i % 2 ? "good" : "bad") << "\t" << (i % 2 ? "a fine film " : "a dull film ") << i << "\n";
  }
  REQUIRE(run("--task file:" + tsv.string() +
                  " --model dense --d-model 16 --heads 2 --layers 1 --ffn 32 --batch 8 --steps 4 --progress none "
                  "--threads 1 --out " +
                  d.string(),
              log) == 0);
  auto predict = [&](const std::string& args) {
    const std::string cmd =
        std::string(ASC_PREDICT_BIN) + " --run " + d.string() + " " + args + " > " + log + ".out 2> " + log;
    const int rc = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read(log + ".out"));
  };
  // the TSV's own lines (text after the tab), CSV on stdout: one row per line, probabilities summing to 1
  auto [rc, csv] = predict("--tsv " + tsv.string() + " --progress none");
  REQUIRE(rc == 0);
  std::istringstream rows(csv);
  std::string header, line;
  std::getline(rows, header);
  CHECK(header == "line,prediction,class,p_0,p_1");
  int n = 0;
  while (std::getline(rows, line)) {
    ++n;
    std::vector<std::string> cols;
    size_t s = 0;
    for (size_t e; (e = line.find(',', s)) != std::string::npos; s = e + 1) cols.push_back(line.substr(s, e - s));
    cols.push_back(line.substr(s));
    REQUIRE(cols.size() == 5);
    CHECK(std::stoll(cols[0]) == n);
    CHECK((cols[2] == "bad" || cols[2] == "good"));
    CHECK(std::stod(cols[3]) + std::stod(cols[4]) == doctest::Approx(1.0).epsilon(1e-5));
  }
  CHECK(n == 60);
  // a text file of new inputs, to JSON lines, a blank line skipped
  const fs::path txt = fs::path(d.string() + "_data") / "new.txt";
  std::ofstream(txt) << "a fine film\n\na dull film\n";
  const fs::path out = fs::path(d.string() + "_data") / "p.jsonl";
  REQUIRE(predict("--text " + txt.string() + " --out " + out.string()).first == 0);
  const std::string jl = read(out);
  CHECK(jl.find("{\"line\":1,") == 0);
  CHECK(jl.find("{\"line\":3,") != std::string::npos);
  // on a GPU (the GPU machine's suite): the same probabilities from the model rebuilt there
  if (testing::gpu_or_skip()) {
    auto [rc_gpu, csv_gpu] = predict("--tsv " + tsv.string() + " --progress none --device cuda");
    REQUIRE(rc_gpu == 0);
    std::istringstream a(csv), b(csv_gpu);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb)) {
      const size_t pa = la.rfind(','), pb = lb.rfind(',');  // the last class's probability
      if (la.starts_with("line")) continue;
      CHECK(std::stod(la.substr(pa + 1)) == doctest::Approx(std::stod(lb.substr(pb + 1))).epsilon(1e-4));
    }
  }
  // the wrong kind of input, two kinds at once, an LM run: refused
  CHECK(predict("--images " + tsv.string()).first == 1);
  CHECK(predict("--text " + txt.string() + " --ids " + txt.string()).first == 2);
  CHECK(predict("--text " + txt.string() + " --out p.txt").first == 2);
  fs::remove_all(d), fs::remove_all(d.string() + "_data");
}

TEST_CASE("train: the command-line contract") {
  const fs::path d = temp_dir("cli");
  const std::string log = d.string() + ".log";
  CHECK(run("--help", log) == 0);
  CHECK(read(log).find("--dump-decomposition") != std::string::npos);
  for (const std::string bad :
       {"--steps -1", "--batch 0", "--model bogus", "--lr abc", "--task", "--bogus 1", "--k 4,x", "--dropout 1.5",
        "--config /nonexistent.json", "--profile -1", "--dtype float16", "--tf32 maybe"}) {
    CAPTURE(bad);
    CHECK(run(bad + " --out " + d.string(), log) == 2);
  }
  // runtime refusals: exit 1 with a message, not a crash
  CHECK(run(kTiny + " --steps 2 --model firing --out " + d.string(), log) == 1);
  CHECK(read(log).find("firing network reads fixed-size float inputs") != std::string::npos);
  fs::remove_all(d);
  CHECK(run(kTiny + " --steps 2 --task nosuchtask --out " + d.string(), log) == 2);
  CHECK(read(log).find("--task: must be one of") != std::string::npos);
  CHECK_FALSE(fs::exists(d));
  // bfloat16 on the CPU is autocast where the processor multiplies bfloat16, refused before anything is written
  // elsewhere; TF32 is a GPU setting
  if (cpu_bf16_supported()) {
    CHECK(run(kTiny + " --steps 3 --profile 1 --dtype bfloat16 --out " + d.string(), log) == 0);
    CHECK(read((d / "config.json").string()).find("\"dtype\": \"bfloat16\"") != std::string::npos);
    CHECK(read((d / "profile.txt").string()).find("matmul_bf16") != std::string::npos);  // the layers' products
    fs::remove_all(d);
  } else {
    CHECK(run(kTiny + " --steps 2 --dtype bfloat16 --out " + d.string(), log) == 1);
    CHECK(read(log).find("--dtype bfloat16 on the CPU needs bfloat16 products") != std::string::npos);
    CHECK_FALSE(fs::exists(d));
  }
  CHECK(run(kTiny + " --steps 2 --tf32 true --out " + d.string(), log) == 1);
  CHECK(read(log).find("--tf32 applies to --device cuda") != std::string::npos);
  CHECK_FALSE(fs::exists(d));
}

#else
TEST_CASE("train: not built (ASC_BUILD_TOOLS off)") { MESSAGE("the train tool is not built: skipped"); }
#endif
