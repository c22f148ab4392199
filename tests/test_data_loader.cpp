// The data loader (data/loader.h): collate's padding, valid mask, groups and image stacking against hand-built
// expectations; every example exactly once per epoch; the shuffle as a function of (seed, epoch); checkpoint resume;
// two ranks covering an epoch; the prefetch thread's error delivery and clean shutdown; bad input.
#include <chrono>
#include <map>
#include <set>

#include "data/dataset.h"
#include "data/loader.h"
#include "testing.h"
using namespace asc;
using namespace asc::data;

namespace {

// Example i: tokens (i * 10, i * 10 + 1, ...) of length 1 + (i * 7) % 5, label i % 3 — its index is readable from
// its first token, so a batch can be checked against the dataset without trusting batch.indices.
std::shared_ptr<InMemoryDataset> sequences(int64_t n) {
  auto ds = std::make_shared<InMemoryDataset>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 1 + (i * 7) % 5;
    std::vector<int64_t> tok(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) tok[static_cast<size_t>(t)] = i * 10 + t;
    ds->push_back({.input = tensor(tok, {len}), .label = i % 3});
  }
  return ds;
}

// A dataset whose get() throws at one index.
class Throwing : public Dataset {
 public:
  Throwing(int64_t n, int64_t bad) : base_(sequences(n)), bad_(bad) {}
  int64_t size() const override { return base_->size(); }
  Example get(int64_t i) const override {
    ASC_CHECK(i != bad_, "Throwing.get: example {} is broken", i);
    return base_->get(i);
  }

 private:
  std::shared_ptr<InMemoryDataset> base_;
  int64_t bad_;
};

std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }
std::vector<bool> bools(const Tensor& t) {
  std::vector<bool> v;
  for (int64_t x : t.to_vector<int64_t>()) v.push_back(x != 0);
  return v;
}

// The whole content of a batch, for exact comparisons between loaders.
struct Snapshot {
  std::vector<int64_t> indices, input, labels;
  std::vector<bool> valid;
  Shape shape;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snap(const Batch& b) { return {b.indices, ints(b.input), ints(b.labels), bools(b.valid), b.input.shape()}; }
std::vector<Snapshot> take(DataLoader& loader, int64_t k) {
  std::vector<Snapshot> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(snap(loader.next()));
  return out;
}

// Checks one batch against the dataset it came from (independently of collate: example by example).
void check_against_dataset(const Batch& b, const Dataset& ds, int64_t pad_id) {
  const int64_t B = b.size();
  REQUIRE(b.input.shape()[0] == B);
  const int64_t T = b.input.shape()[1];
  const auto in = ints(b.input), lab = ints(b.labels);
  const auto val = bools(b.valid);
  for (int64_t r = 0; r < B; ++r) {
    const Example e = ds.get(b.indices[static_cast<size_t>(r)]);
    const auto tok = ints(e.input);
    CHECK(lab[static_cast<size_t>(r)] == e.label);
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < static_cast<int64_t>(tok.size());
      CHECK(val[static_cast<size_t>(r * T + t)] == real);
      CHECK(in[static_cast<size_t>(r * T + t)] == (real ? tok[static_cast<size_t>(t)] : pad_id));
    }
  }
}

}  // namespace

TEST_CASE("collate pads token sequences to the longest and marks real tokens true in valid") {
  const std::vector<std::vector<int64_t>> seqs = {{5, 6, 7}, {8}, {1, 2, 3, 4}, {}};
  std::vector<Example> ex;
  for (size_t k = 0; k < seqs.size(); ++k)
    ex.push_back({.input = tensor(seqs[k], {static_cast<int64_t>(seqs[k].size())}), .label = static_cast<int64_t>(k)});
  const Batch b = collate(ex, /*pad_id=*/9);
  // Hand-built: 4 rows padded to T = 4 with 9.
  CHECK(b.input.shape() == Shape{4, 4});
  CHECK(b.input.dtype() == kInt64);
  CHECK(ints(b.input) == std::vector<int64_t>{5, 6, 7, 9, 8, 9, 9, 9, 1, 2, 3, 4, 9, 9, 9, 9});
  CHECK(b.valid.dtype() == kBool);
  CHECK(bools(b.valid) == std::vector<bool>{1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0});
  CHECK(ints(b.labels) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(b.tokens == 8);
  CHECK_FALSE(b.groups.defined());
  CHECK_FALSE(b.input.requires_grad());
  CHECK(b.indices.empty());  // collate does not know where the examples came from
}

TEST_CASE("collate pads groups with -1 and reads strided example tensors correctly") {
  // The second example's tokens and groups are strided views (every other element of a longer tensor).
  Tensor long_tokens = tensor(std::vector<int64_t>{3, 0, 4, 0, 5, 0}, {6});
  Tensor long_groups = tensor(std::vector<int64_t>{2, 0, 0, 0, 1, 0}, {6});
  std::vector<Example> ex = {
      {.input = tensor(std::vector<int64_t>{1, 2}, {2}), .label = 1, .groups = tensor(std::vector<int64_t>{0, 1}, {2})},
      {.input = long_tokens.slice(0, 0, 6, 2), .label = 0, .groups = long_groups.slice(0, 0, 6, 2)},
  };
  const Batch b = collate(ex, 0);
  CHECK(ints(b.input) == std::vector<int64_t>{1, 2, 0, 3, 4, 5});
  CHECK(ints(b.groups) == std::vector<int64_t>{0, 1, -1, 2, 0, 1});
  CHECK(bools(b.valid) == std::vector<bool>{1, 1, 0, 1, 1, 1});
  CHECK(b.tokens == 5);
}

TEST_CASE("collate stacks float images and has no valid mask for them") {
  std::vector<Example> ex;
  for (int k = 0; k < 3; ++k) ex.push_back({.input = testing::randn32({4, 5}, 10 + k), .label = k});
  const Batch b = collate(ex, 0);
  CHECK(b.input.shape() == Shape{3, 4, 5});
  CHECK(b.input.dtype() == kFloat32);
  CHECK_FALSE(b.valid.defined());
  CHECK(b.tokens == 3 * 20);
  const auto got = b.input.to_vector<float>();
  for (int k = 0; k < 3; ++k) {
    const auto want = ex[static_cast<size_t>(k)].input.to_vector<float>();
    for (size_t j = 0; j < want.size(); ++j) CHECK(got[static_cast<size_t>(k) * 20 + j] == want[j]);
  }
}

TEST_CASE("collate refuses mixed kinds, mixed image shapes, partial groups and bad labels, naming the shapes") {
  const Example tok{.input = tensor(std::vector<int64_t>{1, 2}, {2}), .label = 0};
  const Example img{.input = zeros({28, 28}), .label = 0};
  const Example img2{.input = zeros({27, 28}), .label = 0};
  CHECK_THROWS_WITH_AS(collate({tok, img}, 0), doctest::Contains("float32 [28, 28]"), Error);
  CHECK_THROWS_WITH_AS(collate({tok, img}, 0), doctest::Contains("int64 [2]"), Error);
  CHECK_THROWS_WITH_AS(collate({img, img2}, 0), doctest::Contains("[27, 28]"), Error);
  CHECK_THROWS_AS(collate({}, 0), Error);
  Example grouped = tok;
  grouped.groups = tensor(std::vector<int64_t>{0, 0}, {2});
  CHECK_THROWS_WITH_AS(collate({grouped, tok}, 0), doctest::Contains("groups"), Error);
  Example bad_groups = tok;
  bad_groups.groups = tensor(std::vector<int64_t>{0, 0, 0}, {3});
  CHECK_THROWS_WITH_AS(collate({bad_groups}, 0), doctest::Contains("[3]"), Error);
  Example bad_label = tok;
  bad_label.label = -2;
  CHECK_THROWS_WITH_AS(collate({bad_label}, 0), doctest::Contains("-2"), Error);
  CHECK_THROWS_AS(collate({Example{.input = zeros({2, 2}, {.dtype = kInt64})}}, 0), Error);  // 2-D tokens
  CHECK_THROWS_AS(collate({Example{.input = zeros({2}, {.dtype = kFloat64})}}, 0), Error);
  CHECK_THROWS_AS(collate({Example{}}, 0), Error);
}

TEST_CASE("every example exactly once per epoch, with and without shuffle and drop_last, for many batch sizes") {
  for (int64_t n : {10, 12}) {
    auto ds = sequences(n);
    for (int64_t bs : {1, 3, 4, 5, 12, 13}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          if (drop_last && bs > n) continue;  // refused (tested below)
          CAPTURE(n);
          CAPTURE(bs);
          CAPTURE(shuffle);
          CAPTURE(drop_last);
          DataLoader loader(ds, {.batch_size = bs,
                                 .shuffle = shuffle,
                                 .seed = 3,
                                 .drop_last = drop_last,
                                 .prefetch = bs % 2,
                                 .pad_id = -7});
          const int64_t full = n / bs, expect_batches = drop_last ? full : (n + bs - 1) / bs;
          REQUIRE(loader.batches_per_epoch() == expect_batches);
          for (int64_t epoch = 0; epoch < 2; ++epoch) {
            std::map<int64_t, int> seen;
            std::vector<int64_t> order;
            for (int64_t k = 0; k < expect_batches; ++k) {
              CHECK(loader.epoch() == epoch);
              CHECK(loader.position() == k);
              const Batch b = loader.next();
              CHECK(b.size() == std::min(bs, n - k * bs));
              check_against_dataset(b, *ds, -7);
              for (int64_t i : b.indices) {
                ++seen[i];
                order.push_back(i);
              }
            }
            CHECK(loader.epoch() == epoch + 1);  // the next batch opens the next epoch
            CHECK(loader.position() == 0);
            const int64_t covered = drop_last ? full * bs : n;
            CHECK(static_cast<int64_t>(seen.size()) == covered);
            for (auto [i, count] : seen) CHECK(count == 1);
            if (!shuffle) {
              std::vector<int64_t> in_order(static_cast<size_t>(covered));
              for (int64_t i = 0; i < covered; ++i) in_order[static_cast<size_t>(i)] = i;
              CHECK(order == in_order);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the order is a function of (seed, epoch): same seed same order, other seed or next epoch another") {
  auto ds = sequences(40);
  auto epoch_orders = [&](uint64_t seed) {
    DataLoader loader(ds, {.batch_size = 8, .seed = seed});
    std::vector<std::vector<int64_t>> epochs(3);
    for (auto& e : epochs)
      for (int64_t k = 0; k < loader.batches_per_epoch(); ++k)
        for (int64_t i : loader.next().indices) e.push_back(i);
    return epochs;
  };
  const auto a = epoch_orders(5), b = epoch_orders(5), c = epoch_orders(6);
  CHECK(a == b);
  CHECK(a[0] != c[0]);
  CHECK(a[0] != a[1]);
  CHECK(a[1] != a[2]);
  // The loader's order is the DistributedSampler's permutation for seed + epoch.
  distributed::DistributedSampler sampler(40, 0, 1, {.shuffle = true, .seed = 5});
  sampler.set_epoch(2);
  CHECK(a[2] == sampler.indices());
}

TEST_CASE("prefetch 0 and prefetch > 0 give identical batches") {
  auto ds = sequences(23);
  DataLoader sync(ds, {.batch_size = 4, .seed = 11, .prefetch = 0});
  DataLoader async(ds, {.batch_size = 4, .seed = 11, .prefetch = 3});
  CHECK(take(sync, 20) == take(async, 20));  // 3+ epochs of 6 batches
}

TEST_CASE("state / set_state resumes exactly: mid-epoch and at an epoch boundary, prefetch on and off") {
  auto ds = sequences(21);
  for (int64_t save_prefetch : {0, 2}) {
    for (int64_t load_prefetch : {0, 5}) {
      for (int64_t after : {3, 4, 7}) {  // 4 batches per epoch (drop_last): 4 is a boundary, 3 and 7 are not
        CAPTURE(save_prefetch);
        CAPTURE(load_prefetch);
        CAPTURE(after);
        DataLoader unbroken(ds, {.batch_size = 5, .seed = 9, .drop_last = true, .prefetch = save_prefetch});
        REQUIRE(unbroken.batches_per_epoch() == 4);
        take(unbroken, after);
        const LoaderState s = unbroken.state();
        CHECK(s.epoch == after / 4);
        CHECK(s.position == after % 4);
        CHECK(s.seed == 9);
        // A loader with another seed, already part-way through its own stream, takes the saved state.
        DataLoader resumed(ds, {.batch_size = 5, .seed = 1234, .drop_last = true, .prefetch = load_prefetch});
        take(resumed, 2);
        resumed.set_state(s);
        CHECK(resumed.epoch() == s.epoch);
        CHECK(resumed.position() == s.position);
        CHECK(resumed.options().seed == 9);
        CHECK(take(resumed, 9) == take(unbroken, 9));
      }
    }
  }
}

TEST_CASE("a bad set_state is refused and changes nothing") {
  auto ds = sequences(10);
  DataLoader loader(ds, {.batch_size = 3, .seed = 2});
  DataLoader twin(ds, {.batch_size = 3, .seed = 2, .prefetch = 0});
  take(loader, 2);
  take(twin, 2);
  CHECK_THROWS_WITH_AS(loader.set_state({.epoch = -1, .position = 0, .seed = 2}), doctest::Contains("-1"), Error);
  CHECK_THROWS_WITH_AS(loader.set_state({.epoch = 0, .position = 4, .seed = 2}), doctest::Contains("4"), Error);
  CHECK_THROWS_AS(loader.set_state({.epoch = 0, .position = -1, .seed = 2}), Error);
  CHECK(loader.position() == 2);
  CHECK(take(loader, 5) == take(twin, 5));
}

TEST_CASE("world_size 2: the two ranks together read every example once per epoch, plus the sampler's padding") {
  // 11 examples over 2 ranks: each rank reads ceil(11 / 2) = 6 per epoch; the sampler pads the permutation to 12 by
  // repeating its first element, so exactly one example is read twice per epoch (by rank 1, as position 11).
  auto ds = sequences(11);
  for (bool shuffle : {false, true}) {
    CAPTURE(shuffle);
    DataLoader r0(ds, {.batch_size = 4, .shuffle = shuffle, .seed = 4, .rank = 0, .world_size = 2});
    DataLoader r1(ds, {.batch_size = 4, .shuffle = shuffle, .seed = 4, .prefetch = 0, .rank = 1, .world_size = 2});
    REQUIRE(r0.samples_per_epoch() == 6);
    REQUIRE(r0.batches_per_epoch() == 2);
    REQUIRE(r1.batches_per_epoch() == 2);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::map<int64_t, int> seen;
      std::vector<int64_t> rank0;
      for (int64_t k = 0; k < 2; ++k) {
        const Batch a = r0.next(), b = r1.next();
        check_against_dataset(a, *ds, 0);
        check_against_dataset(b, *ds, 0);
        for (int64_t i : a.indices) {
          ++seen[i];
          rank0.push_back(i);
        }
        for (int64_t i : b.indices) ++seen[i];
      }
      CHECK(seen.size() == 11);
      int twice = 0;
      for (auto [i, count] : seen) {
        CHECK((count == 1 || count == 2));
        if (count == 2) {
          ++twice;
          CHECK(i == rank0.front());  // the repeated one is the permutation's first, which rank 0 read first
        }
      }
      CHECK(twice == 1);
    }
  }
  CHECK_THROWS_AS(DataLoader(ds, {.rank = 2, .world_size = 2}), Error);
  CHECK_THROWS_AS(DataLoader(ds, {.rank = -1, .world_size = 2}), Error);
  CHECK_THROWS_AS(DataLoader(ds, {.world_size = 0}), Error);
  // drop_last drops the tail instead of padding (5 examples per rank here) and needs a full batch on each rank.
  CHECK(DataLoader(ds, {.batch_size = 5, .drop_last = true, .rank = 1, .world_size = 2}).samples_per_epoch() == 5);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batch_size = 6, .drop_last = true, .rank = 1, .world_size = 2}),
                       doctest::Contains("rank 1 of 2"), Error);
}

TEST_CASE("drop_last over N ranks: the ranks' batches k together are batch k of one loader of batch x N") {
  // What `train` under mpirun relies on for the same steps as one process: every epoch, any N, sizes that do not
  // divide evenly, shuffled or not.
  for (int64_t n : {37, 48, 50}) {
    auto ds = sequences(n);
    for (int world : {2, 3, 4}) {
      for (bool shuffle : {false, true}) {
        CAPTURE(n);
        CAPTURE(world);
        CAPTURE(shuffle);
        const int64_t b = 4;
        DataLoader one(ds, {.batch_size = b * world, .shuffle = shuffle, .seed = 9, .drop_last = true, .prefetch = 0});
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < world; ++r)
          ranks.push_back(std::make_unique<DataLoader>(ds, LoaderOptions{.batch_size = b,
                                                                         .shuffle = shuffle,
                                                                         .seed = 9,
                                                                         .drop_last = true,
                                                                         .prefetch = 0,
                                                                         .rank = r,
                                                                         .world_size = world}));
        REQUIRE(ranks[0]->batches_per_epoch() == one.batches_per_epoch());
        for (int64_t k = 0; k < 2 * one.batches_per_epoch() + 1; ++k) {  // into a third epoch
          const Batch whole = one.next();
          std::multiset<int64_t> want(whole.indices.begin(), whole.indices.end()), got;
          for (auto& r : ranks) {
            const Batch part = r->next();
            REQUIRE(part.size() == b);
            got.insert(part.indices.begin(), part.indices.end());
          }
          CHECK(got == want);
        }
      }
    }
  }
}

TEST_CASE("an error in the prefetch thread is rethrown by next() after the batches before it, then retried") {
  // Example 9 is broken: in index order with batch_size 4, batches 0 and 1 are fine and batch 2 holds index 9.
  auto ds = std::make_shared<Throwing>(14, 9);
  for (int64_t prefetch : {0, 1, 3}) {
    CAPTURE(prefetch);
    DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .prefetch = prefetch});
    CHECK(loader.next().indices == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(loader.next().indices == std::vector<int64_t>{4, 5, 6, 7});
    CHECK_THROWS_WITH_AS(loader.next(), "Throwing.get: example 9 is broken", Error);
    CHECK(loader.position() == 2);  // the failed batch is still the next one
    CHECK_THROWS_WITH_AS(loader.next(), "Throwing.get: example 9 is broken", Error);
    loader.set_state({.epoch = 0, .position = 3, .seed = 0});  // skip it
    CHECK(loader.next().indices == std::vector<int64_t>{12, 13});
    CHECK(loader.next().indices == std::vector<int64_t>{0, 1, 2, 3});  // epoch 1
  }
}

TEST_CASE("destroying a loader with a full queue, or one never read, or set_state while full, is prompt") {
  auto ds = sequences(200);
  const auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 20; ++rep) {
    { DataLoader never_read(ds, {.batch_size = 2, .prefetch = 4}); }
    {
      DataLoader full(ds, {.batch_size = 2, .prefetch = 2});
      full.next();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the producer fill the queue and block
    }
    {
      DataLoader reset(ds, {.batch_size = 2, .prefetch = 64});
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      reset.set_state({.epoch = 3, .position = 99, .seed = 1});
      DataLoader twin(ds, {.batch_size = 2, .seed = 1, .prefetch = 0});
      twin.set_state({.epoch = 3, .position = 99, .seed = 1});
      CHECK(snap(reset.next()) == snap(twin.next()));
      CHECK(reset.epoch() == 4);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 10.0);  // would hang, not just be slow, if a join waited on a full queue
}

TEST_CASE("bad loader options are refused with an asc::Error naming the value") {
  auto ds = sequences(5);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batch_size = 0}), doctest::Contains("batch_size"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.prefetch = -1}), doctest::Contains("-1"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.prefetch = 65}), doctest::Contains("65"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(nullptr, {}), doctest::Contains("null"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(std::make_shared<InMemoryDataset>(), {}), doctest::Contains("empty"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batch_size = 6, .drop_last = true}), doctest::Contains("drop_last"), Error);
  CHECK_NOTHROW(DataLoader(ds, {.batch_size = 6}));
  CHECK_NOTHROW(DataLoader(ds, {.batch_size = 5, .drop_last = true}));
}

TEST_CASE("for_each_batch reads a dataset once, in order, the last batch partial") {
  auto ds = sequences(11);
  std::vector<int64_t> order;
  int batches = 0;
  for_each_batch(*ds, 4, 0, [&](const Batch& b) {
    check_against_dataset(b, *ds, 0);
    order.insert(order.end(), b.indices.begin(), b.indices.end());
    ++batches;
  });
  CHECK(batches == 3);
  std::vector<int64_t> want(11);
  for (int64_t i = 0; i < 11; ++i) want[static_cast<size_t>(i)] = i;
  CHECK(order == want);
  CHECK_THROWS_AS(for_each_batch(*ds, 0, 0, [](const Batch&) {}), Error);
  CHECK_THROWS_AS(for_each_batch(InMemoryDataset(), 4, 0, [](const Batch&) {}), Error);
}

TEST_CASE("InMemoryDataset and Subset check their indices") {
  auto ds = sequences(6);
  CHECK_THROWS_WITH_AS(ds->get(6), doctest::Contains("6"), Error);
  CHECK_THROWS_AS(ds->get(-1), Error);
  Subset sub(ds, {4, 1});
  CHECK(sub.size() == 2);
  CHECK(ints(sub.get(0).input) == ints(ds->get(4).input));
  CHECK(sub.get(1).label == ds->get(1).label);
  CHECK_THROWS_AS(sub.get(2), Error);
  CHECK_THROWS_WITH_AS(Subset(ds, {0, 6}), doctest::Contains("6"), Error);
  CHECK_THROWS_AS(Subset(nullptr, {}), Error);
}
