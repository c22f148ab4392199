// Thread safety: several threads running models at once. Each result must equal the same call made by one thread
// alone, bit for bit. This file runs in every build (in Release with OpenMP and OpenBLAS underneath each thread's
// calls). The `tsan` preset also runs it under ThreadSanitizer, which reports a data race even when the numbers come
// out right.
//
// What is promised (docs/reliability.md):
//   - separate modules: built and trained (forward, backward, optimizer step) on several threads at once;
//   - one module shared by several threads, forward in no-grad mode (inference). The state a forward pass leaves
//     behind (attention weights, gates, auxiliary losses, ASAM's pattern cache) is locked; with concurrent calls it
//     holds whichever call stored last;
//   - grad mode and anomaly scopes are per thread; the default random generator hands each caller a disjoint range.
// Not promised: training one module from several threads at once, or changing a module (to(), load_state_dict,
// registering hooks) while another thread runs it.
#include <barrier>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "autograd/anomaly.h"
#include "models/decoder_lm.h"
#include "models/firing_net.h"
#include "models/transformer_classifier.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/thread_pool.h"
#include "testing.h"

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

using namespace asc;

namespace {

constexpr int kThreads = 4;

// Runs fn(0) ... fn(n - 1) on n threads; each waits at a barrier so they start together. The first exception one
// of them throws is rethrown here after all have joined (doctest's CHECKs are not thread-safe, so threads throw).
void run_threads(int n, const std::function<void(int)>& fn) {
  std::barrier start(n);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        fn(t);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  if (first) std::rethrow_exception(first);
}

// Throws (from any thread) unless a and b have the same shape, dtype and bits.
void require_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASC_CHECK(a.defined() == b.defined(), "{}: one result is undefined", what);
  if (!a.defined()) return;
  ASC_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), "{}: {} {} vs {} {}", what, a.shape(), a.dtype(),
            b.shape(), b.dtype());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i)
    ASC_CHECK(std::memcmp(&va[i], &vb[i], sizeof(double)) == 0, "{}: element {} is {} here, {} alone", what, i, va[i],
              vb[i]);
}

// One model kind of the framework: how to build it and how to run it on an input made from a seed and a length.
struct ModelKind {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
  // Returns the output for the input numbered `seed` of length T (the batch is 2).
  std::function<Tensor(nn::Module&, uint64_t seed, int64_t T)> run;
  // The auxiliary loss of the last forward (classifiers), or undefined.
  std::function<Tensor(nn::Module&)> aux = [](nn::Module&) { return Tensor(); };
};

constexpr int64_t kVocab = 12, kMaxLen = 16;

Tensor tokens(uint64_t seed, int64_t T) {
  Generator g(seed);
  return randint(0, kVocab, {2, T}, {.dtype = kInt64}, &g);
}
Tensor valid_mask(int64_t T) {  // sample 1 has two padding positions at the end
  std::vector<uint8_t> v(static_cast<size_t>(2 * T), 1);
  v[static_cast<size_t>(2 * T - 1)] = v[static_cast<size_t>(2 * T - 2)] = 0;
  return tensor(std::vector<double>(v.begin(), v.end()), {2, T}).to(kBool);
}

std::vector<ModelKind> model_kinds() {
  auto classifier = [](const std::string& attention) {
    return [attention] {
      auto o = models::TransformerClassifierOptions(kVocab, kMaxLen, 3).d_model(16).heads(2).layers(2).ffn(32);
      o.attention(attention);
      o.ascender(nn::AscenderAttentionOptions(16, 2).k({3}).aux_coh(0.1).aux_sep(0.1).aux_align(0.1).rope(true));
      o.asam(nn::AsamAttentionOptions(16, 2)
                 .patterns({"window", "random", "hierarchical", "clustered"})
                 .window(3)
                 .random_keys(2)
                 .block(4)
                 .clusters(2));
      return std::static_pointer_cast<nn::Module>(std::make_shared<models::TransformerClassifier>(o));
    };
  };
  auto run_classifier = [](nn::Module& m, uint64_t seed, int64_t T) {
    return dynamic_cast<models::TransformerClassifier&>(m).forward(tokens(seed, T), valid_mask(T));
  };
  auto aux = [](nn::Module& m) { return dynamic_cast<models::TransformerClassifier&>(m).aux_loss(); };
  std::vector<ModelKind> kinds;
  for (const char* a : {"dense", "ascender", "asam"})
    kinds.push_back({std::string("classifier/") + a, classifier(a), run_classifier, aux});
  kinds.push_back({"decoder_lm",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::DecoderLM>(
                         models::DecoderLMOptions(kVocab).d_model(16).heads(2).layers(1).ffn(32)));
                   },
                   [](nn::Module& m, uint64_t seed, int64_t T) { return m.forward(tokens(seed, T)); }});
  kinds.push_back({"firing_classifier",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::FiringClassifier>(
                         models::FiringClassifierOptions(10, 3).hidden(16).fan_out(2)));
                   },
                   [](nn::Module& m, uint64_t seed, int64_t T) {
                     Generator g(seed);
                     return m.forward(randn({T, 10}, {}, &g));
                   }});
  kinds.push_back({"firing_token_model",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::FiringTokenModel>(
                         models::FiringTokenModelOptions(kVocab, 8).ssm_rank(4)));
                   },
                   [](nn::Module& m, uint64_t seed, int64_t T) { return m.forward(tokens(seed, T)); }});
  return kinds;
}

// A scalar loss that weighs every output element differently (so each gradient entry matters).
Tensor weighted_loss(const Tensor& y) {
  Generator g(5);
  return sum(y * randn(y.shape(), {.dtype = y.dtype()}, &g));
}

}  // namespace

TEST_CASE("separate models built and trained on several threads at once match one thread alone") {
  for (const ModelKind& kind : model_kinds()) {
    INFO(kind.name);
    // Two Adam steps (forward, backward, update); returns the last step's output.
    auto train = [&](nn::Module& m, int t) {
      optim::Adam opt(m.parameters(), {.lr = 1e-2});
      Tensor y;
      for (int i = 0; i < 2; ++i) {
        opt.zero_grad();
        y = kind.run(m, 100 + static_cast<uint64_t>(t), 6 + t);
        const Tensor aux = kind.aux(m);  // this module's own last forward: no other thread runs it
        (aux.defined() ? weighted_loss(y) + aux : weighted_loss(y)).backward();
        opt.step();
      }
      return y.detach();
    };
    auto snapshot = [](const nn::Module& m) {
      StateDict s;
      for (const auto& [name, t] : m.state_dict()) s.set(name, t.clone());
      return s;
    };
    std::vector<std::shared_ptr<nn::Module>> models(kThreads);
    std::vector<StateDict> initial(kThreads), trained(kThreads);
    std::vector<Tensor> outputs(kThreads);
    // Built concurrently: the parameters' initial values come from the default generator, shared by the threads.
    run_threads(kThreads, [&](int t) {
      models[t] = kind.make();
      models[t]->eval();  // no dropout: the same call gives the same result
      initial[t] = snapshot(*models[t]);
      outputs[t] = train(*models[t], t);
      trained[t] = snapshot(*models[t]);
    });
    for (int t = 0; t < kThreads; ++t) {  // the same training again, now on this thread only
      models[t]->load_state_dict(initial[t]);
      CHECK_NOTHROW(require_same(outputs[t], train(*models[t], t), fmt::format("thread {} output", t)));
      for (const auto& [name, value] : models[t]->state_dict())
        CHECK_NOTHROW(require_same(trained[t].at(name), value, fmt::format("thread {} {}", t, name)));
    }
    // Concurrent construction drew disjoint random ranges: no two models start from the same weights.
    auto first_weight = [&](int t) { return initial[t].begin()->second; };
    for (int a = 0; a < kThreads; ++a)
      for (int b = a + 1; b < kThreads; ++b) CHECK(!testing::same_bits(first_weight(a), first_weight(b)));
  }
}

TEST_CASE("one model shared by several threads in no-grad mode: every call matches the same call alone") {
  manual_seed(3);
  for (const ModelKind& kind : model_kinds()) {
    INFO(kind.name);
    auto model = kind.make();
    model->eval();
    // Each thread runs its own inputs, of its own length (ASAM's pattern cache is rebuilt as the lengths alternate).
    constexpr int kCalls = 3;
    std::map<std::pair<int, int>, Tensor> alone;
    {
      NoGradGuard ng;
      for (int t = 0; t < kThreads; ++t)
        for (int c = 0; c < kCalls; ++c) alone[{t, c}] = kind.run(*model, 1000 + 10 * t + c, 5 + (t + c) % 3);
    }
    run_threads(kThreads, [&](int t) {
      NoGradGuard ng;
      for (int c = 0; c < kCalls; ++c) {
        const Tensor y = kind.run(*model, 1000 + 10 * t + c, 5 + (t + c) % 3);
        ASC_CHECK(!y.requires_grad(), "no-grad forward recorded a graph");
        require_same(y, alone.at({t, c}), fmt::format("thread {} call {}", t, c));
        // Read what the forward passes leave behind while other threads write it.
        for (auto& [name, sub] : model->named_modules()) {
          if (auto* a = dynamic_cast<nn::Attention*>(sub.get())) (void)a->attention_weights();
          if (auto* a = dynamic_cast<nn::AscenderAttention*>(sub.get())) (void)a->aux_loss(), (void)a->aux();
          if (auto* a = dynamic_cast<nn::AsamAttention*>(sub.get())) (void)a->last_gate(), (void)a->aux_loss();
          if (auto* f = dynamic_cast<nn::FiringLayer*>(sub.get())) (void)f->last_gate();
        }
      }
    });
  }
}

TEST_CASE("one sparse pattern's first calls on several threads at once: each plans or waits, every result as alone") {
  // The CPU sparse kernels plan a pattern on its first call and keep the plans in it, for every copy (without
  // padding once; with padding the last table and its key_keep), and make its transpose the first time a backward
  // of a single (batch, head) needs it. Threads that all make their first calls at once, on copies of one fresh
  // pattern, half of them with padding and a quarter on one (batch, head), forward and backward, three times each.
  const int64_t T = 100, D = 16;
  auto make = [&] {
    return pattern_union(
        {local_window_pattern(T, 20, false), global_tokens_pattern(T, 4, false), random_keys_pattern(T, 5, 9, false)});
  };
  // Odd threads pad the last keys of their batch (their own key_keep: the pattern keeps one padded table at a time,
  // which the threads replace under each other).
  auto keep_of = [&](int t) {
    if (t % 2 == 0) return Tensor();
    Tensor keep = ones({2, T}, {.dtype = kBool});
    for (int64_t j = T - 10 - t; j < T; ++j) keep.data_ptr<bool>()[T + j] = false;
    return keep;
  };
  auto run = [&](const SparsePattern& p, int t) {
    Generator g(static_cast<uint64_t>(50 + t));
    const int64_t BH = t % 4 == 2 ? 1 : 2;  // B = H = 1: the two-pass backward, over the transpose
    Tensor q = randn({BH, BH, T, D}, {}, &g).set_requires_grad(true), k = randn({BH, BH, T, D}, {}, &g),
           v = randn({BH, BH, T, D}, {}, &g);
    Tensor o = sparse_attention(q, k, v, p, keep_of(t));
    o.sum().backward();
    return std::pair{o.detach(), q.grad()};
  };
  std::vector<std::pair<Tensor, Tensor>> alone;
  for (int t = 0; t < kThreads; ++t) alone.push_back(run(make(), t));  // each on a pattern of its own
  const SparsePattern shared = make();
  run_threads(kThreads, [&](int t) {
    const SparsePattern mine = shared;  // a copy shares the lists and the kept plans
    for (int c = 0; c < 3; ++c) {
      const auto [o, dq] = run(mine, t);
      require_same(o, alone[static_cast<size_t>(t)].first, fmt::format("thread {} call {} output", t, c));
      require_same(dq, alone[static_cast<size_t>(t)].second, fmt::format("thread {} call {} dq", t, c));
    }
  });
}

TEST_CASE("grad mode is per thread: a no-grad thread and a recording thread at the same time") {
  manual_seed(4);
  auto lin = std::make_shared<nn::Linear>(4, 3);
  const Tensor x = randn({2, 4});
  std::barrier both_inside(2);
  bool recorded[2] = {};
  run_threads(2, [&](int t) {
    std::optional<NoGradGuard> ng;
    if (t == 0) ng.emplace();
    both_inside.arrive_and_wait();  // thread 0 has grad mode off while thread 1 runs
    recorded[t] = (*lin)(x).requires_grad();
    both_inside.arrive_and_wait();
  });
  CHECK(!recorded[0]);
  CHECK(recorded[1]);
  CHECK(GradMode::is_enabled());
}

TEST_CASE("anomaly scopes are per thread: each thread's error names its own module") {
  autograd::DetectAnomalyGuard anomaly;
  std::vector<std::string> messages(kThreads);
  run_threads(kThreads, [&](int t) {
    autograd::AnomalyScope scope(fmt::format("worker{}", t));
    try {
      (void)log(full({2}, -1.0, {.requires_grad = true}));  // NaN, recorded
    } catch (const Error& e) {
      messages[t] = e.what();
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    INFO(messages[t]);
    CHECK(messages[t].find(fmt::format("worker{}", t)) != std::string::npos);
    for (int u = 0; u < kThreads; ++u)
      if (u != t) CHECK(messages[t].find(fmt::format("worker{}", u)) == std::string::npos);
  }
}

TEST_CASE("the default generator gives threads that draw at once disjoint, complete ranges of its stream") {
  constexpr int kDraws = 25;
  constexpr int64_t kN = 8;
  Generator probe;
  (void)randn({kN}, {}, &probe);
  const uint64_t blocks = probe.offset();  // Philox blocks per draw
  manual_seed(77);
  const uint64_t start = default_generator().offset();
  std::vector<std::vector<Tensor>> drawn(kThreads);
  run_threads(kThreads, [&](int t) {
    for (int i = 0; i < kDraws; ++i) drawn[t].push_back(randn({kN}));
  });
  CHECK(default_generator().offset() == start + kThreads * kDraws * blocks);
  // The same stream drawn by one thread: every concurrent draw is exactly one of these, and each is used once.
  Generator g(77);
  g.set_offset(start);
  std::map<std::vector<double>, int> unused;
  for (int i = 0; i < kThreads * kDraws; ++i) ++unused[randn({kN}, {}, &g).to_vector<double>()];
  for (const auto& per_thread : drawn)
    for (const Tensor& d : per_thread) {
      auto it = unused.find(d.to_vector<double>());
      REQUIRE(it != unused.end());
      if (--it->second == 0) unused.erase(it);
    }
  CHECK(unused.empty());
}

// Deterministic mode: every model of models/ trains (two Adam steps) to the same bits at 1, 2 and 3 OpenMP threads.
// The sizes make every op go parallel (without the mode, the GEMM-based ops differ here; see docs/ops.md).
TEST_CASE("deterministic mode: every model trains to the same bits at 1, 2 and 3 OpenMP threads") {
#ifdef ASC_HAVE_OPENMP
  constexpr int64_t kV = 50, kT = 80;
  auto toks = [](uint64_t seed) {
    Generator g(seed);
    return randint(0, kV, {16, kT}, {.dtype = kInt64}, &g);
  };
  struct Big {
    std::string name;
    std::function<std::shared_ptr<nn::Module>()> make;
    std::function<Tensor(nn::Module&)> loss;
  };
  auto classifier = [&](const std::string& attention) {
    return Big{"classifier/" + attention,
               [attention] {
                 auto o = models::TransformerClassifierOptions(kV, 96, 3).d_model(64).heads(2).layers(2).ffn(128);
                 o.attention(attention);
                 o.ascender(nn::AscenderAttentionOptions(64, 2).k({3}).aux_coh(0.1).aux_sep(0.1).aux_align(0.1));
                 o.asam(nn::AsamAttentionOptions(64, 2)
                            .patterns({"window", "random", "hierarchical", "clustered"})
                            .window(3)
                            .random_keys(2)
                            .block(4)
                            .clusters(2));
                 return std::static_pointer_cast<nn::Module>(std::make_shared<models::TransformerClassifier>(o));
               },
               [toks](nn::Module& m) {
                 auto& c = dynamic_cast<models::TransformerClassifier&>(m);
                 const Tensor y = c.forward(toks(1));
                 const Tensor aux = c.aux_loss();
                 return aux.defined() ? weighted_loss(y) + aux : weighted_loss(y);
               }};
  };
  std::vector<Big> kinds{classifier("dense"), classifier("ascender"), classifier("asam")};
  kinds.push_back({"decoder_lm",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::DecoderLM>(
                         models::DecoderLMOptions(kV).d_model(64).heads(2).layers(1).ffn(128)));
                   },
                   [toks](nn::Module& m) { return weighted_loss(m.forward(toks(2))); }});
  kinds.push_back({"firing_classifier",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::FiringClassifier>(
                         models::FiringClassifierOptions(64, 10).hidden(256).fan_out(4)));
                   },
                   [](nn::Module& m) {
                     Generator g(3);
                     return weighted_loss(m.forward(randn({512, 64}, {}, &g)));
                   }});
  kinds.push_back({"firing_token_model",
                   [] {
                     return std::static_pointer_cast<nn::Module>(std::make_shared<models::FiringTokenModel>(
                         models::FiringTokenModelOptions(kV, 64).ssm_rank(8)));
                   },
                   [toks](nn::Module& m) { return weighted_loss(m.forward(toks(4))); }});
  const int saved = omp_get_max_threads();
  use_deterministic_algorithms(true);
  for (const Big& kind : kinds) {
    INFO(kind.name);
    std::map<std::string, Tensor> ref;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      manual_seed(9);
      auto m = kind.make();
      m->eval();
      optim::Adam opt(m->parameters(), {.lr = 1e-2});
      for (int i = 0; i < 2; ++i) {
        opt.zero_grad();
        kind.loss(*m).backward();
        opt.step();
      }
      for (const auto& [name, t] : m->state_dict()) {
        if (threads == 1)
          ref[name] = t.clone();
        else
          CHECK_NOTHROW(require_same(ref.at(name), t, fmt::format("{} at {} threads", name, threads)));
      }
    }
  }
  use_deterministic_algorithms(false);
  omp_set_num_threads(saved);
#else
  MESSAGE("no OpenMP: one thread only");
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// The CPU kernels' thread pool (ops/cpu/thread_pool.h): every chunk runs exactly once, whoever takes it.

namespace {

// Runs `chunks` chunks on `threads` threads and returns how often each ran.
std::vector<int> chunk_runs(int64_t chunks, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(chunks));
  auto f = [&](int64_t c) { runs[static_cast<size_t>(c)].fetch_add(1, std::memory_order_relaxed); };
  cpu::run_chunks(chunks, threads, f);
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return out;
}

}  // namespace

TEST_CASE("thread pool: every chunk runs exactly once, for any chunk and thread count") {
  // 1100000 chunks is more than the pool's segment words count (2^20 - 1): they run in groups.
  for (int threads : {1, 2, 3, 8})
    for (int64_t chunks : {1, 2, 3, 8, 100, 1100000}) {
      INFO("threads ", threads, ", chunks ", chunks);
      const std::vector<int> runs = chunk_runs(chunks, threads);
      CHECK(std::count(runs.begin(), runs.end(), 1) == chunks);
    }
}

TEST_CASE("thread pool: jobs from several threads at once, and jobs started inside a chunk, all complete") {
  asc::testing::ThreadCount tc(2);
  // Four user threads each run many parallel_for jobs; the pool takes one job at a time, the others run inline.
  std::vector<int64_t> sums(kThreads, 0);
  run_threads(kThreads, [&](int t) {
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<int64_t> out(1 << 12, 0);
      cpu::parallel_for(static_cast<int64_t>(out.size()), 64, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * (t + 1);
      });
      int64_t s = 0;
      for (int64_t v : out) s += v;
      ASC_CHECK(s == int64_t{(t + 1)} * 4095 * 4096 / 2, "thread {} rep {}: sum {}", t, rep, s);
    }
    sums[static_cast<size_t>(t)] = 1;
  });
  CHECK(std::count(sums.begin(), sums.end(), 1) == kThreads);
  // A job whose chunks start jobs of their own: the inner ones run inline on the chunk's thread.
  std::vector<std::atomic<int64_t>> cells(64);
  cpu::parallel_for(64, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      cpu::parallel_for(1 << 10, 64, [&](int64_t ib, int64_t ie) { cells[static_cast<size_t>(i)] += ie - ib; });
  });
  for (auto& c : cells) CHECK(c.load() == 1 << 10);
}

TEST_CASE("thread pool: a slow chunk does not hold up the others, and the caller waits for it") {
  asc::testing::ThreadCount tc(2);
  // Chunk 0 sleeps; whoever takes it, every other chunk is run meanwhile and the job returns only after chunk 0.
  std::atomic<int> finished{0};
  std::atomic<bool> slow_done{false};
  auto f = [&](int64_t c) {
    if (c == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      slow_done = true;
    }
    finished.fetch_add(1);
  };
  cpu::run_chunks(8, 2, f);
  CHECK(slow_done.load());
  CHECK(finished.load() == 8);
  // Workers asleep after a pause are woken by the next job.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::vector<int> runs = chunk_runs(16, 2);
  CHECK(std::count(runs.begin(), runs.end(), 1) == 16);
}

#if !defined(__SANITIZE_THREAD__)
TEST_CASE("thread pool: a forked child runs parallel jobs (the parent's workers did not survive the fork)") {
  asc::testing::ThreadCount tc(2);
  (void)chunk_runs(8, 2);  // the parent's pool has its workers
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::vector<int> runs = chunk_runs(64, 2);
    _exit(std::count(runs.begin(), runs.end(), 1) == 64 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif
