// The demo: a small MLP learns the two-moons problem with the autograd engine and SGD with momentum.
//   ./build/release/tools/demo [--steps 1000] [--hidden 32] [--seed 2026]
// Prints the loss and training accuracy every 200 steps, then the test accuracy; exits 1 when that is below 0.95.
// --help lists the options; a bad value exits 2 (tools/cli.h). Progress (the loss) on stderr.
#include <chrono>
#include <cmath>

#include "ascender.h"
#include "tools/cli.h"

using namespace asc;

namespace {

// Two interleaved half circles with Gaussian noise. x: (n, 2), y: (n, 1) in {0, 1}.
std::pair<Tensor, Tensor> two_moons(int64_t n, double noise, Generator& gen) {
  auto u = rand({n}, {.dtype = kFloat64}, &gen).to_vector<double>();
  auto e = randn({n, 2}, {.dtype = kFloat64}, &gen).to_vector<double>();
  std::vector<double> x(static_cast<size_t>(2 * n)), y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double t = M_PI * u[i];
    bool upper = i % 2 == 0;
    x[2 * i] = (upper ? std::cos(t) : 1.0 - std::cos(t)) + noise * e[2 * i];
    x[2 * i + 1] = (upper ? std::sin(t) : 0.5 - std::sin(t)) + noise * e[2 * i + 1];
    y[i] = upper ? 0.0 : 1.0;
  }
  return {tensor(x, {n, 2}, {.dtype = kFloat32}), tensor(y, {n, 1}, {.dtype = kFloat32})};
}

struct Mlp {
  Tensor w1, b1, w2, b2, w3, b3;  // (2, H), (H), (H, H), (H), (H, 1), (1)
  Mlp(int64_t hidden, Generator& gen) {
    auto init = [&](int64_t fan_in, const Shape& s) {
      return (randn(s, {}, &gen) * (1.0 / std::sqrt(static_cast<double>(fan_in)))).set_requires_grad(true);
    };
    w1 = init(2, {2, hidden});
    b1 = zeros({hidden}, {.requires_grad = true});
    w2 = init(hidden, {hidden, hidden});
    b2 = zeros({hidden}, {.requires_grad = true});
    w3 = init(hidden, {hidden, 1});
    b3 = zeros({1}, {.requires_grad = true});
  }
  Tensor operator()(const Tensor& x) const {  // (n, 2) -> logits (n, 1)
    Tensor h = tanh(matmul(x, w1) + b1);
    h = tanh(matmul(h, w2) + b2);
    return matmul(h, w3) + b3;
  }
  TensorList params() const { return {w1, b1, w2, b2, w3, b3}; }
};

// Binary cross-entropy with logits, written from elementwise ops: softplus(z) - y z, averaged.
Tensor bce_with_logits(const Tensor& z, const Tensor& y) { return mean(softplus(z) - y * z); }

double accuracy(const Tensor& logits, const Tensor& y) {
  return mean(eq(gt(logits, 0.0).to(kFloat32), y).to(kFloat32)).item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 1000;
  int64_t hidden = 32;
  uint64_t seed = 2026;
  CLI::App app{"demo: a 2-H-H-1 tanh MLP learns two moons with SGD + momentum; exit 1 if test accuracy < 0.95", "demo"};
  app.option_defaults()->always_capture_default();
  app.add_option("--hidden", hidden, "hidden width H")->check(tools::int_range(1, 4096))->group("Model");
  app.add_option("--steps", steps, "full-batch SGD steps")->check(tools::int_range(1, 1000000))->group("Optimisation");
  app.add_option("--seed", seed, "seed of the data and the initialisation")->group("Data and seed");
  tools::parse_or_exit(app, argc, argv);
  return tools::guarded("demo", [&] {
    Generator gen(seed);
    auto [x_train, y_train] = two_moons(512, 0.1, gen);
    auto [x_test, y_test] = two_moons(512, 0.1, gen);
    Mlp model(hidden, gen);
    std::vector<Tensor> velocity;
    for (const Tensor& p : model.params()) velocity.push_back(zeros_like(p));
    const double lr = 0.1, momentum = 0.9;

    fmt::print("ascender demo: 2-{}-{}-1 tanh MLP on two moons (512 train / 512 test), SGD lr {} momentum {}\n", hidden,
               hidden, lr, momentum);
    auto t0 = std::chrono::steady_clock::now();
    tools::Progress progress(steps + 1, "demo");
    for (int step = 0; step <= steps; ++step) {
      Tensor loss = bce_with_logits(model(x_train), y_train);
      for (Tensor p : model.params()) p.zero_grad();
      loss.backward();
      {
        NoGradGuard ng;
        TensorList ps = model.params();
        for (size_t i = 0; i < ps.size(); ++i) {
          velocity[i] = velocity[i] * momentum + ps[i].grad();
          ps[i].add_(velocity[i], -lr);
        }
      }
      progress.update(step + 1, fmt::format("loss {:.4f}", loss.item<double>()));
      if (step % 200 == 0) {
        NoGradGuard ng;
        progress.clear();
        fmt::print("  step {:4d}  loss {:.4f}  train acc {:.3f}\n", step, loss.item<double>(),
                   accuracy(model(x_train), y_train));
        std::fflush(stdout);
      }
    }
    progress.finish();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    NoGradGuard ng;
    double acc = accuracy(model(x_test), y_test);
    fmt::print("test accuracy {:.3f} after {} full-batch steps ({:.2f} s, {:.2f} ms/step)\n", acc, steps, secs,
               1e3 * secs / (steps + 1));
    return acc > 0.95 ? 0 : 1;
  });
}
