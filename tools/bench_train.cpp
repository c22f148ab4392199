// Training-step benchmark (not a test): one AdamW step of the Transformer classifier (models/) on CPU, next to
// the same model in PyTorch (tools/bench_train_torch.py, Debian's python3-torch) run from this binary, in
// alternating rounds, so the ratio is measured side by side.
//   ./build/release/tools/bench_train [--csv out.csv] [--steps 20] [--rounds 2] [--threads 2] [--no-torch]
//        [--batch 16 --length 128 --width 128 --layers 2 --heads 4 --ffn 512]
// Prints ms/step (median of `steps` timed steps after 3 warm-up steps; best median over rounds) and the split
// into forward / backward / optimizer for ascender.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ascender.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#include "models/transformer_classifier.h"
#include "optim/optim.h"

using namespace asc;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int64_t batch = 16, length = 128, width = 128, layers = 2, heads = 4, ffn = 512, vocab = 64, classes = 2;
  double dropout = 0.1;
  int steps = 20, rounds = 2, threads = 2;
  bool torch = true;
  std::string csv;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double step, fwd, bwd, opt;
};

Timing run_ours(const Config& c) {
  manual_seed(0);
  auto model = std::make_shared<models::TransformerClassifier>(
      models::TransformerClassifierOptions(c.vocab, c.length, c.classes)
          .d_model(c.width).heads(c.heads).layers(c.layers).ffn(c.ffn).dropout(c.dropout));
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  Generator g(1);
  Tensor tokens = randint(0, c.vocab, {c.batch, c.length}, {.dtype = kInt64}, &g);
  Tensor labels = randint(0, c.classes, {c.batch}, {.dtype = kInt64}, &g);
  std::vector<double> step, fwd, bwd, upd;
  for (int i = 0; i < 3 + c.steps; ++i) {
    auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(tokens), labels);
    double f = ms_since(t0);
    loss.backward();
    double b = ms_since(t0);
    opt.step();
    double s = ms_since(t0);
    if (i < 3) continue;
    step.push_back(s), fwd.push_back(f), bwd.push_back(b - f), upd.push_back(s - b);
  }
  return {median(step), median(fwd), median(bwd), median(upd)};
}

// Runs the PyTorch twin; returns its median ms/step, or a negative value when it cannot run.
double run_torch(const Config& c, std::string& version) {
  std::string cmd = "/usr/bin/python3 " ASC_SOURCE_DIR "/tools/bench_train_torch.py" + std::string(" --batch ") +
                    std::to_string(c.batch) + " --length " + std::to_string(c.length) + " --width " +
                    std::to_string(c.width) + " --layers " + std::to_string(c.layers) + " --heads " +
                    std::to_string(c.heads) + " --ffn " + std::to_string(c.ffn) + " --vocab " +
                    std::to_string(c.vocab) + " --classes " + std::to_string(c.classes) + " --dropout " +
                    std::to_string(c.dropout) + " --steps " + std::to_string(c.steps) + " --threads " +
                    std::to_string(c.threads) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return -1;
  auto field = [&](const std::string& key) -> std::string {
    size_t k = out.find("\"" + key + "\": ");
    if (k == std::string::npos) return "";
    k += key.size() + 4;
    size_t e = out.find_first_of(",}", k);
    std::string v = out.substr(k, e - k);
    if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);  // a JSON string
    return v;
  };
  version = field("version");
  std::string ms = field("ms_median");
  return ms.empty() ? -1 : std::atof(ms.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--csv") c.csv = next();
    else if (a == "--steps") c.steps = std::atoi(next().c_str());
    else if (a == "--rounds") c.rounds = std::atoi(next().c_str());
    else if (a == "--threads") c.threads = std::atoi(next().c_str());
    else if (a == "--no-torch") c.torch = false;
    else if (a == "--batch") c.batch = std::atoll(next().c_str());
    else if (a == "--length") c.length = std::atoll(next().c_str());
    else if (a == "--width") c.width = std::atoll(next().c_str());
    else if (a == "--layers") c.layers = std::atoll(next().c_str());
    else if (a == "--heads") c.heads = std::atoll(next().c_str());
    else if (a == "--ffn") c.ffn = std::atoll(next().c_str());
    else {
      std::fprintf(stderr, "bench_train: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  // Both frameworks get the same thread count (OpenMP loops and OpenBLAS read these at start-up).
  std::string threads = std::to_string(c.threads);
  setenv("OMP_NUM_THREADS", threads.c_str(), 1);  // for the PyTorch child process
  setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
#ifdef _OPENMP
  omp_set_num_threads(c.threads);  // libgomp read the environment at load time: set ours directly
#endif

  Timing best{1e30, 0, 0, 0};
  double torch_ms = 1e30;
  std::string torch_version;
  for (int r = 0; r < c.rounds; ++r) {
    Timing t = run_ours(c);
    if (t.step < best.step) best = t;
    if (c.torch) {
      double ms = run_torch(c, torch_version);
      if (ms < 0) {
        std::printf("PyTorch twin could not run (needs /usr/bin/python3 with torch: apt-get install python3-torch)\n");
        c.torch = false;
      } else {
        torch_ms = std::min(torch_ms, ms);
      }
    }
  }

  std::printf("Transformer classifier training step (AdamW), batch %lld, length %lld, width %lld, %lld layers, "
              "%lld heads, FFN %lld, dropout %.2f, %d threads\n",
              (long long)c.batch, (long long)c.length, (long long)c.width, (long long)c.layers, (long long)c.heads,
              (long long)c.ffn, c.dropout, c.threads);
  std::printf("%-28s %12s\n", "", "ms/step");
  std::printf("%-28s %12.2f   (forward %.2f, backward %.2f, optimizer %.2f)\n", "ascender", best.step, best.fwd,
              best.bwd, best.opt);
  if (c.torch) {
    std::printf("%-28s %12.2f   (torch %s)\n", "pytorch", torch_ms, torch_version.c_str());
    std::printf("%-28s %12.3f   (target <= 0.8)\n", "ratio ascender / pytorch", best.step / torch_ms);
  }
  if (!c.csv.empty()) {
    FILE* f = std::fopen(c.csv.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_train: cannot write %s\n", c.csv.c_str());
      return 1;
    }
    std::fprintf(f, "framework,ms_per_step,forward_ms,backward_ms,optimizer_ms\n");
    std::fprintf(f, "ascender,%.3f,%.3f,%.3f,%.3f\n", best.step, best.fwd, best.bwd, best.opt);
    if (c.torch) std::fprintf(f, "pytorch,%.3f,,,\n", torch_ms);
    std::fclose(f);
  }
  return 0;
}
