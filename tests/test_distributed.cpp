// Distributed training over the MPI process group (train/process_group.h, train/distributed.h). CTest runs this file
// twice: as one process (a world of size 1) and under `mpirun -np 2 --oversubscribe` (tests/CMakeLists.txt). Every rank
// runs every test case in the same order, so the collectives pair up; the expected values are written for any size.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cuda/cuda.h"
#include "testing.h"
#include "train/distributed.h"

using namespace asc;
using namespace asc::distributed;

namespace {

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg = init_process_group("mpi", {.timeout_s = 60});
  return pg;
}

// A small float64 MLP; `extra` adds a layer (a different parameter list), `unused` a layer forward never reads.
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, unused, extra;
  explicit Mlp(bool with_extra = false) : nn::Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
    unused = register_module("unused", std::make_shared<nn::Linear>(3, 2));
    if (with_extra) extra = register_module("extra", std::make_shared<nn::Linear>(3, 3));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(tanh((*fc1)(x))); }  // (N, 6) -> (N, 3)
};

std::shared_ptr<Mlp> make_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Mlp>();
}

Tensor mse(const Tensor& y, const Tensor& target) { return mean(pow(y - target, 2.0)); }

}  // namespace

TEST_CASE(
    "collectives: all_reduce (sum, average, max, min), broadcast, all_gather and barrier give the expected values") {
  auto pg = world();
  const int r = pg->rank(), n = pg->size();
  REQUIRE(pg->backend() == "mpi");
  MESSAGE("world size " << n);

  Tensor s = full({5}, r + 1.0, {.dtype = kFloat64});
  pg->all_reduce(s);
  testing::check_close(s, std::vector<double>(5, n * (n + 1) / 2.0), 0, 0);

  Tensor a = full({2, 3}, 2.0 * r, {.dtype = kFloat32});
  pg->all_reduce(a, ReduceOp::Average);
  testing::check_close(a, std::vector<double>(6, n - 1.0), 1e-6, 0);

  Tensor mx = tensor(std::vector<int64_t>{r, -r}, {2});
  pg->all_reduce(mx, ReduceOp::Max);
  CHECK(mx.to_vector<int64_t>() == std::vector<int64_t>{n - 1, 0});
  Tensor mn = tensor(std::vector<int64_t>{r, -r}, {2});
  pg->all_reduce(mn, ReduceOp::Min);
  CHECK(mn.to_vector<int64_t>() == std::vector<int64_t>{0, -(n - 1)});

  auto work = pg->all_reduce_async(full({3}, 1.0));
  work->wait();
  CHECK(work->test());

  const int root = n - 1;
  Tensor b = full({4}, 10.0 * r, {.dtype = kFloat64});
  pg->broadcast(b, root);
  testing::check_close(b, std::vector<double>(4, 10.0 * root), 0, 0);
  Tensor flags = full({3}, r == root ? 1.0 : 0.0, {.dtype = kBool});  // any dtype: bytes
  pg->broadcast(flags, root);
  CHECK(flags.to_vector<double>() == std::vector<double>(3, 1.0));

  Tensor mine = arange(0, 6, 1, {.dtype = kFloat32}).view({2, 3}) + 100.0 * r;
  Tensor all = pg->all_gather(mine);
  REQUIRE(all.shape() == Shape{n, 2, 3});
  for (int k = 0; k < n; ++k)
    testing::check_close(all.select(0, k), arange(0, 6, 1, {.dtype = kFloat32}).view({2, 3}) + 100.0 * k, 0, 0);
  pg->barrier();
}

TEST_CASE("collectives refuse bad input with a clear error on every rank, and ranks that disagree all throw") {
  auto pg = world();
  const auto expect_error = [](const std::function<void()>& f, const char* part) { testing::check_error(f, {part}); };
  expect_error([&] { pg->all_reduce(Tensor()); }, "undefined");
  expect_error([&] { pg->all_reduce(randn({3, 4}).transpose(0, 1)); }, "contiguous");
  expect_error([&] { pg->all_reduce(Tensor::empty({4}, {.dtype = kBFloat16})); }, "cannot be reduced over MPI");
  expect_error([&] { pg->all_reduce(zeros({4}, {.dtype = kInt64}), ReduceOp::Average); }, "Average needs a floating");
  expect_error([&] { pg->broadcast(zeros({4}), pg->size()); }, "is not a rank");
  expect_error([] { (void)init_process_group("gloo"); }, "unknown backend 'gloo'");
  if (!backend_available("nccl")) expect_error([] { (void)init_process_group("nccl"); }, "not in this build");
  // a build with NCCL on a machine without a GPU: the error names NCCL, the device count and the fix
  if (backend_available("nccl") && cuda::device_count() == 0)
    expect_error([] { (void)init_process_group("nccl"); },
                 "NCCL needs a CUDA GPU for every rank, and this machine has 0");
  if (pg->size() > 1) {
    // Rank 0 passes 4 elements, the others 5: every rank sees every signature and throws the same error.
    Tensor t = zeros({pg->rank() == 0 ? 4 : 5});
    expect_error([&] { pg->all_reduce(t); }, "the ranks disagree");
    expect_error([&] { pg->broadcast(zeros({4}), pg->rank() == 0 ? 0 : 1 % pg->size()); }, "the ranks disagree");
    pg->barrier();  // still usable: nothing was sent
    Tensor ok = ones({2});
    pg->all_reduce(ok);
    testing::check_close(ok, std::vector<double>(2, pg->size()), 0, 0);
  }
}

TEST_CASE("a rank that stops taking part makes the others time out with an error, not hang") {
  auto pg = world();
  if (pg->size() < 2) return;
  // A group of its own with a short timeout and no signature exchange, so that the late rank's call pairs with the
  // one that timed out.
  auto short_pg = init_process_group("mpi", {.timeout_s = 0.5, .check_signatures = false});
  Tensor t = ones({3});
  if (pg->rank() == 0) {
    testing::check_error([&] { short_pg->all_reduce(t); }, {"timed out on rank 0"});
    testing::check_error([&] { short_pg->barrier(); }, {"broken by an earlier timeout"});
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // "stuck" past rank 0's timeout
    // Joins late: rank 0's request is still posted, and rank 0 lets it progress while it waits in the barrier below.
    short_pg->all_reduce(t);
  }
  pg->barrier();
}

TEST_CASE("DDP: N steps on every rank's share of the batch give the parameters of 1 process on the whole batch") {
  auto pg = world();
  const int r = pg->rank(), n = pg->size();
  Generator data(11);
  const int64_t B = 8;  // divisible by 1 and 2 ranks: equal shares, so the mean of the ranks' means is the mean
  const Tensor X = randn({B, 6}, {.dtype = kFloat64}, &data), Y = randn({B, 3}, {.dtype = kFloat64}, &data);
  const int64_t share = B / n;
  const Tensor Xr = X.narrow(0, r * share, share), Yr = Y.narrow(0, r * share, share);

  for (int64_t cap : {int64_t{64}, int64_t{1} << 20}) {
    INFO("bucket_cap_bytes " << cap);
    auto reference = make_mlp(5);  // one process, the whole batch
    optim::Adam ref_opt(reference->parameters(), {.lr = 1e-2});
    // Rank 0's model has the reference's weights; the others start elsewhere and get rank 0's by broadcast.
    auto local = make_mlp(r == 0 ? 5 : 1000 + r);
    auto ddp = std::make_shared<DistributedDataParallel>(local, pg, DDPOptions{.bucket_cap_bytes = cap});
    const auto layout = ddp->bucket_layout();
    // 64 B: unused.bias (16 B) and unused.weight (48 B) share one; fc2.bias, fc2.weight, fc1.bias, fc1.weight alone.
    CHECK(layout.size() == (cap == 64 ? 5u : 1u));
    optim::Adam opt(ddp->parameters(), {.lr = 1e-2});
    for (int step = 0; step < 5; ++step) {
      ref_opt.zero_grad();
      mse(reference->forward(X), Y).backward();
      ref_opt.step();
      opt.zero_grad();
      mse(ddp->forward(Xr), Yr).backward();
      opt.step();
    }
    CHECK(ddp->reductions() == 5 * static_cast<int64_t>(layout.size()));  // one all-reduce per bucket per backward
    const auto want = reference->named_parameters(), got = local->named_parameters();
    REQUIRE(want.size() == got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(want[i].first);
      testing::check_close(got[i].second, want[i].second, 1e-12, 1e-10);
    }
    // The parameter forward never reads got a zero gradient on every rank: unchanged by Adam.
    CHECK(local->unused->weight.grad().defined());
  }
}

TEST_CASE("DDP no_sync: no all-reduce under the guard, each rank keeps its gradient; the next backward reduces both") {
  auto pg = world();
  const int r = pg->rank(), n = pg->size();
  Generator data(13);
  const int64_t share = 3;  // each rank's micro-batch
  // Two micro-batches per rank; every rank draws all of them, so that any rank can compute every rank's reference.
  const TensorOptions f64{.dtype = kFloat64};
  const Tensor X1 = randn({n * share, 6}, f64, &data), Y1 = randn({n * share, 3}, f64, &data);
  const Tensor X2 = randn({n * share, 6}, f64, &data), Y2 = randn({n * share, 3}, f64, &data);
  auto rows = [&](const Tensor& t, int k) { return t.narrow(0, k * share, share); };
  // Rank k's gradient without DDP, from a model with the same weights: of micro-batch 1, or of 1 and 2 accumulated.
  auto reference_grads = [&](int k, bool both) {
    auto ref = make_mlp(7);
    mse(ref->forward(rows(X1, k)), rows(Y1, k)).backward();
    if (both) mse(ref->forward(rows(X2, k)), rows(Y2, k)).backward();
    std::vector<Tensor> g;
    for (const Tensor& p : ref->parameters()) g.push_back(p.grad());
    return g;
  };

  auto local = make_mlp(7);
  auto ddp = std::make_shared<DistributedDataParallel>(local, pg, DDPOptions{.bucket_cap_bytes = 64});
  const auto buckets = static_cast<int64_t>(ddp->bucket_layout().size());
  const auto params = local->parameters();
  CHECK(ddp->require_backward_grad_sync());
  const int64_t before = ddp->reductions();
  {
    auto guard = ddp->no_sync();
    CHECK_FALSE(ddp->require_backward_grad_sync());
    mse(ddp->forward(rows(X1, r)), rows(Y1, r)).backward();
    CHECK(ddp->reductions() == before);  // no all-reduce started
    const auto mine = reference_grads(r, false);
    REQUIRE(mine.size() == params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!mine[i].defined()) continue;  // the layer forward never reads
      REQUIRE(params[i].grad().defined());
      testing::check_close(params[i].grad(), mine[i], 1e-12, 1e-10);  // this rank's own, not averaged
    }
  }
  CHECK(ddp->require_backward_grad_sync());  // restored when the guard ends
  mse(ddp->forward(rows(X2, r)), rows(Y2, r)).backward();
  CHECK(ddp->reductions() == before + buckets);  // one all-reduce per bucket, for both micro-batches
  // The average over the ranks of each rank's two micro-batch gradients, the same on every rank.
  std::vector<Tensor> want(params.size());
  for (int k = 0; k < n; ++k) {
    const auto g = reference_grads(k, true);
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i].defined()) want[i] = want[i].defined() ? add(want[i], g[i]) : g[i];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(params[i].grad().defined());
    if (want[i].defined())
      testing::check_close(params[i].grad(), want[i] / static_cast<double>(n), 1e-12, 1e-10);
    else  // the unused layer: zeros from every rank
      testing::check_close(params[i].grad(), std::vector<double>(static_cast<size_t>(params[i].numel()), 0.0), 0, 0);
  }

  // Guards nest, each restoring the setting it found; set_require_backward_grad_sync switches the same thing.
  {
    auto outer = ddp->no_sync();
    {
      auto inner = ddp->no_sync();
      CHECK_FALSE(ddp->require_backward_grad_sync());
    }
    CHECK_FALSE(ddp->require_backward_grad_sync());
  }
  CHECK(ddp->require_backward_grad_sync());
  ddp->zero_grad();
  const int64_t mid = ddp->reductions();
  ddp->set_require_backward_grad_sync(false);
  mse(ddp->forward(rows(X1, r)), rows(Y1, r)).backward();
  CHECK(ddp->reductions() == mid);
  ddp->set_require_backward_grad_sync(true);
  mse(ddp->forward(rows(X2, r)), rows(Y2, r)).backward();
  CHECK(ddp->reductions() == mid + buckets);
  for (size_t i = 0; i < params.size(); ++i)
    if (want[i].defined()) testing::check_close(params[i].grad(), want[i] / static_cast<double>(n), 1e-12, 1e-10);
  pg->barrier();
}

TEST_CASE("DDP refuses ranks whose models differ, on every rank") {
  auto pg = world();
  if (pg->size() < 2) return;
  manual_seed(1);
  auto model = std::make_shared<Mlp>(/*with_extra=*/pg->rank() == 1);
  testing::check_error([&] { DistributedDataParallel(model, pg); }, {"the ranks' models differ"});
  pg->barrier();
}

TEST_CASE("DistributedSampler: disjoint shares that cover the dataset, one shuffle per epoch, the same on every rank") {
  for (int world_size : {1, 2, 3}) {
    for (bool drop_last : {false, true}) {
      std::vector<int64_t> seen;
      std::vector<std::vector<int64_t>> per_rank;
      for (int rank = 0; rank < world_size; ++rank) {
        DistributedSampler s(10, rank, world_size, {.seed = 3, .drop_last = drop_last});
        s.set_epoch(1);
        per_rank.push_back(s.indices());
        CHECK(static_cast<int64_t>(per_rank.back().size()) == s.num_samples());
        seen.insert(seen.end(), per_rank.back().begin(), per_rank.back().end());
      }
      std::sort(seen.begin(), seen.end());
      const auto distinct = static_cast<size_t>(std::unique(seen.begin(), seen.end()) - seen.begin());
      if (drop_last)
        CHECK(distinct == static_cast<size_t>(10 / world_size * world_size));  // none repeated
      else
        CHECK(distinct == 10u);  // all covered
    }
  }
  DistributedSampler a(10, 0, 2, {.seed = 3}), b(10, 0, 2, {.seed = 3});
  b.set_epoch(1);
  CHECK(a.indices() != b.indices());  // a new epoch reshuffles
  a.set_epoch(1);
  CHECK(a.indices() == b.indices());  // the same (seed, epoch): the same order
  DistributedSampler plain(5, 1, 2, {.shuffle = false});
  CHECK(plain.indices() == std::vector<int64_t>{1, 3, 0});  // padded with the start
  testing::check_error([] { DistributedSampler(10, 2, 2); }, {"rank 2 is not in a world of size 2"});
  testing::check_error([] { DistributedSampler(0, 0, 1); }, {"empty"});
}

TEST_CASE("rank-0 checkpoint: every rank resumes from it and continues exactly as without the stop") {
  auto pg = world();
  const int r = pg->rank(), n = pg->size();
  Generator data(12);
  const Tensor X = randn({8, 6}, {.dtype = kFloat64}, &data), Y = randn({8, 3}, {.dtype = kFloat64}, &data);
  const int64_t share = 8 / n;
  const Tensor Xr = X.narrow(0, r * share, share), Yr = Y.narrow(0, r * share, share);
  auto train = [&](DistributedDataParallel& ddp, optim::Optimizer& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      mse(ddp.forward(Xr), Yr).backward();
      opt.step();
    }
  };
  auto model = make_mlp(6);
  DistributedDataParallel ddp(model, pg);
  optim::AdamW opt(ddp.parameters(), {.lr = 1e-2});
  train(ddp, opt, 3);
  // One path for every rank: rank 0's pid.
  const Tensor pid = pg->all_gather(tensor(std::vector<int64_t>{static_cast<int64_t>(getpid())}, {1}));
  const std::string path = fmt::format("/tmp/asc_ddp_{}.safetensors", pid.to_vector<int64_t>()[0]);
  save_checkpoint(*pg, path, {.model = model.get(), .optimizer = &opt});

  auto resumed = make_mlp(999);
  DistributedDataParallel ddp2(resumed, pg);
  optim::AdamW opt2(ddp2.parameters(), {.lr = 1e-2});
  load_checkpoint(path, {.model = resumed.get(), .optimizer = &opt2});
  train(ddp, opt, 2);
  train(ddp2, opt2, 2);
  const auto a = model->named_parameters(), b = resumed->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(testing::same_bits(a[i].second, b[i].second));
  pg->barrier();
  if (r == 0) std::remove(path.c_str());
}

TEST_CASE("all_reduce_async: a work that outlives the caller's group handle, or is dropped unfinished, stays safe") {
  auto pg = world();
  const int r = pg->rank(), n = pg->size();
  // The work keeps its group alive: waiting after the last handle to the group is gone polls a live communicator
  // (it used to read the freed group).
  Tensor t = full({4096}, r + 1.0, {.dtype = kFloat64});
  std::shared_ptr<Work> work;
  {
    auto own = init_process_group("mpi", {.timeout_s = 60});
    work = own->all_reduce_async(t, ReduceOp::Average);
  }
  work->wait();
  CHECK(work->test());
  testing::check_close(t, std::vector<double>(4096, (n + 1) / 2.0), 1e-12, 0);
  work.reset();  // the group goes with it
  // A work dropped before completion waits in its destructor (MPI writes into the tensor until the collective is
  // done): afterwards the tensor holds the result, Average included.
  Tensor u = full({4096}, r + 1.0, {.dtype = kFloat64});
  (void)pg->all_reduce_async(u, ReduceOp::Average);
  testing::check_close(u, std::vector<double>(4096, (n + 1) / 2.0), 1e-12, 0);
  Tensor v = full({3}, 1.0, {.dtype = kFloat64});
  pg->all_reduce_async(v).reset();
  testing::check_close(v, std::vector<double>(3, n), 0, 0);
  pg->barrier();
}
