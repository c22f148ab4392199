// End-to-end training with the nn + optim API: MLPs on XOR and two moons, the Transformer classifier on a
// synthetic "is the sequence sorted" task, and the decoder-only LM on a counting language.
#include <chrono>
#include <cmath>

#include "models/decoder_lm.h"
#include "models/transformer_classifier.h"
#include "optim/optim.h"
#include "testing.h"

using namespace asc;

namespace {

double accuracy(const Tensor& logits, const Tensor& labels) {
  return mean(eq(argmax(logits, -1), labels).to(kFloat32)).item<double>();
}

// Two interleaved half circles with Gaussian noise; label = which moon. (n, 2) points, (n) labels.
std::pair<Tensor, Tensor> two_moons(int64_t n, double noise, Generator& g) {
  std::vector<double> u = rand({n, 2}, {.dtype = kFloat64}, &g).to_vector<double>();
  std::vector<double> e = randn({n, 2}, {.dtype = kFloat64}, &g).to_vector<double>();
  std::vector<float> pts(static_cast<size_t>(2 * n));
  std::vector<int64_t> label(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double t = u[2 * i] * M_PI;
    label[i] = u[2 * i + 1] < 0.5 ? 0 : 1;
    double x = label[i] == 0 ? std::cos(t) : 1.0 - std::cos(t);
    double y = label[i] == 0 ? std::sin(t) : 0.5 - std::sin(t);
    pts[2 * i] = static_cast<float>(x + noise * e[2 * i]);
    pts[2 * i + 1] = static_cast<float>(y + noise * e[2 * i + 1]);
  }
  return {tensor(pts, {n, 2}), tensor(label, {n})};
}

}  // namespace

TEST_CASE("MLP learns XOR to 100%") {
  manual_seed(0);
  auto mlp = std::make_shared<nn::MLP>(nn::MLPOptions({2, 16, 2}).activation("tanh"));
  Tensor x = tensor({0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
  Tensor y = tensor(std::vector<int64_t>{0, 1, 1, 0}, {4});
  optim::Adam opt(mlp->parameters(), {.lr = 0.05});
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    cross_entropy((*mlp)(x), y).backward();
    opt.step();
  }
  CHECK(accuracy((*mlp)(x), y) == 1.0);
}

TEST_CASE("MLP learns two moons to 100% on held-out points") {
  manual_seed(0);
  Generator g(1);
  auto [xtr, ytr] = two_moons(512, 0.1, g);
  auto [xte, yte] = two_moons(512, 0.1, g);
  auto mlp = std::make_shared<nn::MLP>(nn::MLPOptions({2, 64, 64, 2}).activation("relu"));
  optim::AdamW opt(mlp->parameters(), {.lr = 0.01, .weight_decay = 1e-4});
  for (int step = 0; step < 400; ++step) {
    opt.zero_grad();
    cross_entropy((*mlp)(xtr), ytr).backward();
    opt.step();
  }
  mlp->eval();
  CHECK(accuracy((*mlp)(xtr), ytr) == 1.0);
  CHECK(accuracy((*mlp)(xte), yte) == 1.0);
}

namespace {
// "Is the sequence sorted (non-decreasing)?" Positives: sorted random sequences. Negatives: half fully random,
// half a sorted sequence with one adjacent pair of different values swapped (hard: one inversion).
std::pair<Tensor, Tensor> sorted_task(int64_t n, int64_t len, int64_t vocab, Generator& g) {
  std::vector<int64_t> toks(static_cast<size_t>(n * len)), labels(static_cast<size_t>(n));
  std::vector<int64_t> r = randint(0, vocab, {n, len + 2}, {.dtype = kInt64}, &g).to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t* row = &toks[i * len];
    const int64_t* src = &r[i * (len + 2)];
    std::copy(src, src + len, row);
    int64_t kind = src[len] % 4;  // 0, 1: sorted; 2: random; 3: one swap
    if (kind != 2) std::sort(row, row + len);
    if (kind == 3) {
      int64_t j = src[len + 1] % (len - 1);
      for (int64_t tries = 0; tries < len - 1 && row[j] == row[j + 1]; ++tries) j = (j + 1) % (len - 1);
      std::swap(row[j], row[j + 1]);
    }
    labels[i] = std::is_sorted(row, row + len) ? 1 : 0;
  }
  return {tensor(toks, {n, len}), tensor(labels, {n})};
}
// Trains on fresh sorted-task batches (AdamW, warm-up + cosine, clipping); returns the accuracy on 2000 new ones.
double train_sorted(models::TransformerClassifier& model, int steps, int64_t len, int64_t vocab) {
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  optim::WarmupCosine sched(opt, {.warmup_steps = 50, .total_steps = steps});
  Generator g(2);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = sorted_task(64, len, vocab, g);
    opt.zero_grad();
    cross_entropy(model.forward(x), y).backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    sched.step();
  }
  model.eval();
  Generator gt(99);
  auto [xt, yt] = sorted_task(2000, len, vocab, gt);
  return accuracy(model.forward(xt), yt);
}
}  // namespace

// Its time is reported, not checked: speed is measured by the benchmarks, and a wall-clock bound fails at random on a
// loaded machine.
TEST_CASE("Transformer classifier learns 'is the sequence sorted' to >= 95%") {
  auto t0 = std::chrono::steady_clock::now();
  manual_seed(0);
  const int64_t len = 8, vocab = 10;
  auto model = std::make_shared<models::TransformerClassifier>(
      models::TransformerClassifierOptions(vocab, len, 2).d_model(32).heads(2).layers(2).ffn(64).dropout(0.0));
  double acc = train_sorted(*model, 700, len, vocab);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("sorted-task test accuracy " << acc << " in " << secs << " s");
  CHECK(acc >= 0.95);
}

TEST_CASE("Transformer classifier with ASCender attention (chosen by name) learns the sorted task too") {
  manual_seed(0);
  const int64_t len = 8, vocab = 10;
  auto opts = models::TransformerClassifierOptions(vocab, len, 2).d_model(32).heads(2).layers(2).ffn(64).dropout(0.0);
  opts.attention("ascender")
      .ascender(nn::AscenderAttentionOptions(32, 2).k({3}).gate_position(nn::GatePosition::AfterNorm));
  auto model = std::make_shared<models::TransformerClassifier>(opts);
  REQUIRE(model->to_string().find("AscenderAttention") != std::string::npos);
  double acc = train_sorted(*model, 500, len, vocab);
  MESSAGE("sorted-task test accuracy with ASCender attention " << acc);
  CHECK(acc >= 0.9);
  CHECK_THROWS_WITH_AS(models::TransformerClassifier(models::TransformerClassifierOptions(4, 4, 2).attention("sparse")),
                       doctest::Contains("unknown attention 'sparse' (known: dense, ascender, asam)"), Error);
}

TEST_CASE("Decoder-only LM learns a counting language and continues it greedily") {
  manual_seed(0);
  const int64_t V = 12, T = 10;
  auto lm = std::make_shared<models::DecoderLM>(models::DecoderLMOptions(V).d_model(32).heads(2).layers(2).ffn(64));
  optim::AdamW opt(lm->parameters(), {.lr = 5e-3, .weight_decay = 0.0});
  Generator g(3);
  auto batch = [&](int64_t n) {  // token t+1 = (token t + stride) mod V, stride 1 or 2 per sequence
    std::vector<int64_t> r = randint(0, 2 * V, {n}, {.dtype = kInt64}, &g).to_vector<int64_t>(), seq;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < T; ++t) seq.push_back((r[i] % V + (1 + r[i] / V) * t) % V);
    return tensor(seq, {n, T});
  };
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    Tensor loss = lm->loss(batch(32));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  MESSAGE("LM loss " << first << " -> " << last);
  CHECK(last < 0.1 * first);
  // Prompt with 3 tokens (enough to see the stride), continue 5.
  Tensor prompt = tensor(std::vector<int64_t>{5, 7, 9, 3, 4, 5}, {2, 3});
  Tensor out = lm->generate(prompt, 5);
  CHECK(out.shape() == Shape{2, 8});
  std::vector<int64_t> got = out.to_vector<int64_t>();
  for (int64_t i = 0; i < 8; ++i) {
    CHECK(got[i] == (5 + 2 * i) % V);
    CHECK(got[8 + i] == (3 + i) % V);
  }
}

TEST_CASE("DecoderLM: KV-cached logits equal the full recomputation's; sampling by temperature, top-k, top-p, stops") {
  manual_seed(4);
  const int64_t V = 17;
  {
    // an untrained model of random weights: every logit matters, nothing is saturated
    auto lm = std::make_shared<models::DecoderLM>(models::DecoderLMOptions(V).d_model(24).heads(3).layers(2).ffn(40));
    lm->to(kFloat64);
    lm->eval();
    REQUIRE(lm->supports_kv_cache());
    Generator g(5);
    const Tensor tokens = randint(0, V, {2, 13}, {.dtype = kInt64}, &g);
    const Tensor full = lm->forward(tokens);  // (2, 13, V)
    // the prompt in one call, then one position at a time, then three at once: every step's last row matches
    std::vector<nn::KVCache> caches;
    NoGradGuard ng;
    Tensor l = lm->forward_incremental(tokens.narrow(1, 0, 5), caches);
    testing::check_close(l, full.select(1, 4), 1e-12, 1e-12);
    for (int64_t t = 5; t < 10; ++t) {
      l = lm->forward_incremental(tokens.narrow(1, t, 1), caches);
      testing::check_close(l, full.select(1, t), 1e-12, 1e-12);
    }
    l = lm->forward_incremental(tokens.narrow(1, 10, 3), caches);
    testing::check_close(l, full.select(1, 12), 1e-12, 1e-12);
    CHECK(caches[0].length() == 13);
    // generate: the same tokens with and without the cache (greedy and sampled with one seed)
    const Tensor prompt = tokens.narrow(1, 0, 4).contiguous();
    for (double temperature : {0.0, 1.0}) {
      Generator a(9), b(9);
      const Tensor x = lm->generate(prompt, {.max_new_tokens = 12, .temperature = temperature, .generator = &a});
      const Tensor y =
          lm->generate(prompt, {.max_new_tokens = 12, .temperature = temperature, .use_cache = false, .generator = &b});
      CHECK(x.shape() == Shape{2, 16});
      CHECK(x.to_vector<int64_t>() == y.to_vector<int64_t>());
    }
  }
  // a post-norm block (the LM's are pre-norm) by itself: incremental rows equal the causal forward's
  {
    nn::TransformerDecoderBlock block(nn::TransformerBlockOptions(12, 2).ffn(16).norm_first(false).rope(true));
    block.to(kFloat64);
    block.eval();
    const Tensor x = randn({2, 7, 12}, {.dtype = kFloat64});
    NoGradGuard ng;
    const Tensor full = block.forward(x);
    nn::KVCache cache;
    const Tensor a = block.forward_incremental(x.narrow(1, 0, 4), cache),
                 b = block.forward_incremental(x.narrow(1, 4, 3), cache);
    testing::check_close(cat({a, b}, 1), full, 1e-12, 1e-12);
  }
  // the sampler's distribution: a 1-layer model's first-step logits, 4000 draws per setting, against the softmax
  auto lm = std::make_shared<models::DecoderLM>(models::DecoderLMOptions(5).d_model(8).heads(2).layers(1).ffn(8));
  lm->eval();
  const Tensor prompt = tensor(std::vector<int64_t>{1, 2}, {1, 2});
  std::vector<double> logit;
  {
    NoGradGuard ng;
    logit = lm->forward(prompt).select(1, 1).reshape({5}).to(kFloat64).to_vector<double>();
  }
  // exaggerate the differences (the random init's logits are close together)
  auto draw = [&](const models::GenerateOptions& o0, int n) {
    std::vector<double> freq(5);
    Generator gen(11);
    models::GenerateOptions o = o0;
    o.generator = &gen, o.max_new_tokens = 1;
    const Tensor many = prompt.expand({n, 2}).contiguous();
    for (int64_t v : lm->generate(many, o).select(1, 2).to_vector<int64_t>()) freq[static_cast<size_t>(v)] += 1.0 / n;
    return freq;
  };
  std::vector<int64_t> order = {0, 1, 2, 3, 4};
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
  for (double temperature : {1.0, 0.05}) {
    const std::vector<double> f = draw({.temperature = temperature}, 4000);
    double z = 0;
    for (double v : logit) z += std::exp((v - logit[order[0]]) / temperature);
    for (int64_t v = 0; v < 5; ++v) {
      const double p = std::exp((logit[v] - logit[order[0]]) / temperature) / z;
      CAPTURE(v);
      CHECK(std::abs(f[v] - p) < 4 * std::sqrt(p * (1 - p) / 4000) + 1e-3);  // 4 standard errors
    }
  }
  // top-k 2: only the two most likely; top-k 1 and temperature 0: greedy; top-p 1e-9: the most likely
  std::vector<double> f = draw({.temperature = 1.0, .top_k = 2}, 2000);
  CHECK(f[order[0]] + f[order[1]] == doctest::Approx(1.0));
  CHECK(draw({.temperature = 1.0, .top_k = 1}, 200)[order[0]] == doctest::Approx(1.0));
  CHECK(draw({.temperature = 0.0}, 50)[order[0]] == doctest::Approx(1.0));
  CHECK(draw({.temperature = 3.0, .top_p = 1e-9}, 200)[order[0]] == doctest::Approx(1.0));
  // a stop token: every row ends there (its later positions repeat it), and generation ends when all have stopped
  const Tensor stopped = lm->generate(prompt.expand({3, 2}).contiguous(),
                                      {.max_new_tokens = 50, .temperature = 0.0, .stop_tokens = {order[0]}});
  CHECK(stopped.size(1) == 3);
  // streaming: one call per step with the new tokens
  int calls = 0;
  lm->generate(prompt, {.max_new_tokens = 4, .on_token = [&](const Tensor& next) { calls += next.numel() == 1; }});
  CHECK(calls == 4);
  // bad options
  CHECK_THROWS_WITH_AS(lm->generate(prompt, {.temperature = -1}), doctest::Contains("temperature"), Error);
  CHECK_THROWS_WITH_AS(lm->generate(prompt, {.top_p = 0}), doctest::Contains("top_p"), Error);
  CHECK_THROWS_WITH_AS(lm->generate(prompt, {.top_k = -2}), doctest::Contains("top_k"), Error);
  CHECK_THROWS_WITH_AS(lm->generate(prompt, {.stop_tokens = {5}}), doctest::Contains("stop token 5"), Error);
  CHECK_THROWS_WITH_AS(lm->generate(prompt.to(kFloat32), {}), doctest::Contains("int64 prompt"), Error);
  // past the rotary tables (4096 positions): refused before anything is generated
  CHECK_THROWS_WITH_AS(lm->generate(prompt, {.max_new_tokens = 4095}), doctest::Contains("rotary tables"), Error);
  // an attention that cannot cache (ASCender) decodes by recomputation, the same tokens either way
  auto asc_lm = std::make_shared<models::DecoderLM>(
      models::DecoderLMOptions(5).d_model(8).heads(2).layers(1).ffn(8),
      nn::ascender_attention_factory(nn::AscenderAttentionOptions(0, 0).k(std::vector<int64_t>{2})));
  CHECK_FALSE(asc_lm->supports_kv_cache());
  CHECK(asc_lm->generate(prompt, 6).to_vector<int64_t>() ==
        asc_lm->generate(prompt, {.max_new_tokens = 6, .temperature = 0, .use_cache = false}).to_vector<int64_t>());
}

TEST_CASE("TransformerClassifier: positional options — only 'none' is blind to the token order") {
  // Without positions, attention and masked mean pooling are permutation-equivariant / invariant: swapping two
  // tokens leaves the logits unchanged. Every positional option must break that symmetry. (Not a reversal: the
  // bidirectional ALiBi bias -m|i - j| is itself symmetric under reversing the sequence.)
  Tensor tokens = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 0}, {1, 8});
  Tensor swapped = tensor(std::vector<int64_t>{4, 2, 3, 1, 5, 6, 7, 0}, {1, 8});  // positions 0 and 3 swapped
  for (const std::string attention : {"dense", "ascender"})
    for (const std::string pos : {"none", "learned", "sinusoidal", "rope", "alibi"}) {
      CAPTURE(attention);
      CAPTURE(pos);
      manual_seed(3);
      auto m = models::TransformerClassifier(models::TransformerClassifierOptions(8, 8, 3)
                                                 .d_model(16)
                                                 .heads(2)
                                                 .ffn(32)
                                                 .layers(1)
                                                 .dropout(0)
                                                 .attention(attention)
                                                 .positional(pos)
                                                 .ascender(nn::AscenderAttentionOptions(0, 0).k({3})));
      m.eval();
      NoGradGuard ng;
      const double diff = amax(abs(m.forward(tokens) - m.forward(swapped))).item<double>();
      if (pos == "none")
        CHECK(diff < 1e-5);
      else
        CHECK(diff > 1e-4);
      CHECK((m.pos_emb != nullptr) == (pos == "learned"));
    }
  CHECK_THROWS_WITH_AS(
      models::TransformerClassifier(models::TransformerClassifierOptions(8, 8, 3).attention("asam").positional("rope")),
      doctest::Contains("ASAM"), Error);
  CHECK_THROWS_WITH_AS(models::TransformerClassifier(models::TransformerClassifierOptions(8, 8, 3).positional("abs")),
                       doctest::Contains("unknown positional"), Error);
}
