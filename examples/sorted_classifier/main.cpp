// A Transformer classifier with ASCender swarm attention learns whether a sequence of digits is sorted. Built as an
// outside project against the installed package (see CMakeLists.txt next to this file).
#include <algorithm>
#include <vector>

#include "ascender.h"
#include "models/transformer_classifier.h"

using namespace asc;

// n sequences of `len` digits in [0, vocab): half sorted (label 1), half random (label 0, almost never sorted).
std::pair<Tensor, Tensor> sorted_task(int64_t n, int64_t len, int64_t vocab, Generator& gen) {
  std::vector<int64_t> x = randint(0, vocab, {n, len}, {.dtype = kInt64}, &gen).to_vector<int64_t>(), y(n);
  for (int64_t i = 0; i < n; ++i) {
    auto row = x.begin() + i * len;
    if (i % 2 == 0) std::sort(row, row + len);
    y[i] = std::is_sorted(row, row + len) ? 1 : 0;
  }
  return {tensor(x, {n, len}), tensor(y, {n})};
}

int main() {
  manual_seed(0);
  Generator data(1);
  const int64_t len = 8, vocab = 10;
  auto opts = models::TransformerClassifierOptions(vocab, len, /*classes=*/2)
                  .d_model(32)
                  .heads(2)
                  .layers(2)
                  .ffn(64)
                  .dropout(0.0)
                  .attention("ascender");
  opts.ascender(nn::AscenderAttentionOptions(32, 2).k({3}));
  auto model = std::make_shared<models::TransformerClassifier>(opts);
  optim::AdamW opt(model->parameters(), {.lr = 3e-3});

  auto [x_test, y_test] = sorted_task(512, len, vocab, data);
  auto accuracy = [&] {
    NoGradGuard no_grad;
    model->eval();
    const double acc = mean(eq(argmax(model->forward(x_test), -1), y_test).to(kFloat32)).item<double>();
    model->train();
    return acc;
  };
  const double before = accuracy();
  for (int step = 0; step < 200; ++step) {
    auto [x, y] = sorted_task(64, len, vocab, data);
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    if (step % 50 == 0) fmt::print("step {:3d}  loss {:.4f}\n", step, loss.item<double>());
  }
  const double after = accuracy();
  fmt::print("test accuracy {:.3f} -> {:.3f}\n", before, after);
  return after > 0.85 ? 0 : 1;
}
