// float32 unary ops on a (2048, 512) tensor (2^20 elements, bench_train's FFN activations), forward and forward +
// backward, best of 5 batches of 20 calls, 2 threads; linked against the library build named on the command line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ascender.h"

using namespace asc;
using Clock = std::chrono::steady_clock;

static double best_ms(const std::function<void()>& f) {
  for (int i = 0; i < 5; ++i) f();
  double best = 1e30;
  for (int b = 0; b < 5; ++b) {
    auto t0 = Clock::now();
    for (int i = 0; i < 20; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / 20);
  }
  return best;
}

int main(int argc, char** argv) {
  const std::string label = argc > 1 ? argv[1] : "ascender";
  Generator g(1);
  Tensor x0 = mul(randn({2048, 512}, {}, &g), 2.0), gy = randn({2048, 512}, {}, &g);
  Tensor xpos = add(abs(x0), 1e-3);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"exp", [](const Tensor& t) { return exp(t); }},
      {"log", [](const Tensor& t) { return log(t); }},
      {"tanh", [](const Tensor& t) { return tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"softplus", [](const Tensor& t) { return softplus(t, 1.0, 20.0); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, true); }},
      {"gelu", [](const Tensor& t) { return gelu(t); }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor& in = name == "log" ? xpos : x0;
    Tensor x = in.detach();
    x.set_requires_grad(true);
    Tensor y;
    const double fwd = best_ms([&] {
      NoGradGuard ng;
      y = op(in);
    });
    const double fb = best_ms([&] {
      x.zero_grad();
      y = op(x);
      y.backward(gy);
    });
    std::printf("%s,%s,%.4f,%.4f\n", label.c_str(), name.c_str(), fwd, fb);
  }
}
