// Data-parallel training step time: 1 rank on the whole batch against N ranks on 1/N of it each
// (DistributedDataParallel over the MPI process group), for several bucket sizes, side by side in one run.
//
//   mpirun -np 2 --oversubscribe ./build/release/tools/bench_ddp [--steps 30] [--batch 256] [--csv out.csv]
//                                                                [--json out.json]
//
// Every rank gets cores / N threads (OpenMP and OpenBLAS), as a rank gets one device: the "1 rank" row runs rank 0
// alone with that share while the other ranks wait, the N-rank rows run every rank on 1/N of the batch.
// Speedup = T(1 rank) / T(N ranks), efficiency = speedup / N. The "no all-reduce" row is the N-rank step without
// DDP (each rank's local gradient): its difference to the DDP rows is what averaging the gradients costs.
// The arguments are parsed before MPI starts: --help lists the options and a bad value exits 2 (tools/cli.h) on every
// rank. Progress on rank 0's stderr, one step per configuration.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>

#include "tools/bench_util.h"
#include "tools/cli.h"
#include "train/distributed.h"

#if defined(ASC_HAVE_OPENMP)
#include <omp.h>
#endif
#if defined(ASC_HAVE_CBLAS)
extern "C" void openblas_set_num_threads(int);
#endif

using namespace asc;

namespace {

void set_threads(int n) {
#if defined(ASC_HAVE_OPENMP)
  omp_set_num_threads(n);
#endif
#if defined(ASC_HAVE_CBLAS)
  openblas_set_num_threads(n);
#endif
}

// An MLP of about 1.6 M float32 parameters (6.3 MB of gradients per step).
std::shared_ptr<nn::Module> make_model() {
  manual_seed(0);
  return std::make_shared<nn::MLP>(nn::MLPOptions({256, 1024, 1024, 256, 10}));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median step time (ms) of `steps` SGD steps on (x, y), after 3 untimed ones.
double time_steps(nn::Module& model, const Tensor& x, const Tensor& y, int steps) {
  optim::SGD opt(model.parameters(), {.lr = 1e-3});
  std::vector<double> ms;
  for (int s = 0; s < steps + 3; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    cross_entropy(model.forward(x), y).backward();
    opt.step();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 3) ms.push_back(t);
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  int64_t batch = 256;
  tools::Outputs out;
  const std::vector<int64_t> caps = {64 << 10, 1 << 20, 25 << 20};
  CLI::App app{
      "bench_ddp: data-parallel training step time, 1 rank on the whole batch against N ranks "
      "(run under mpirun -np N)",
      "bench_ddp"};
  app.option_defaults()->always_capture_default();
  app.add_option("--steps", steps, "timed SGD steps per configuration (after 3 untimed)")
      ->check(tools::int_range(1, 1000000));
  app.add_option("--batch", batch, "global batch (divisible by the number of ranks)")
      ->check(tools::int_range(1, int64_t{1} << 24));
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
  tools::ProfileRun profile_run(out.profile);
  return tools::guarded("bench_ddp", [&] {
    auto pg = distributed::init_process_group("mpi");
    const int rank = pg->rank(), world = pg->size();
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (batch % world != 0) {
      if (rank == 0)
        std::fprintf(stderr, "bench_ddp: --batch %lld is not divisible by %d ranks\n", static_cast<long long>(batch),
                     world);
      return 2;
    }
    Generator data(1);
    const Tensor X = randn({batch, 256}, {}, &data), Y = randint(0, 10, {batch}, {.dtype = kInt64}, &data);
    const int64_t share = batch / world;
    const Tensor Xr = X.narrow(0, rank * share, share).contiguous(), Yr = Y.narrow(0, rank * share, share).contiguous();

    struct Row {
      std::string what;
      int ranks;
      int64_t bucket;
      double ms;
    };
    std::vector<Row> rows;
    std::optional<tools::Progress> progress;
    if (rank == 0) progress.emplace(static_cast<int64_t>(caps.size()) + (world > 1 ? 2 : 1), "bench_ddp");
    auto tick = [&] {
      if (progress) progress->update(static_cast<int64_t>(rows.size()), rows.back().what);
    };
    // 1 rank, whole batch, with a rank's share of the cores.
    const int per_rank = std::max(1, cores / world);
    set_threads(per_rank);
    double t1 = 0;
    if (rank == 0) {
      auto m = make_model();
      t1 = time_steps(*m, X, Y, steps);
    }
    pg->barrier();
    rows.push_back({"1 rank, whole batch", 1, 0, t1});
    tick();
    if (world > 1) {
      auto m = make_model();
      const double t = time_steps(*m, Xr, Yr, steps);
      Tensor worst = full({1}, t, {.dtype = kFloat64});
      pg->all_reduce(worst, distributed::ReduceOp::Max);
      rows.push_back({fmt::format("{} ranks, no all-reduce", world), world, 0, worst.item<double>()});
      tick();
    }
    for (int64_t cap : caps) {
      auto m = make_model();
      auto ddp = std::make_shared<distributed::DistributedDataParallel>(m, pg, distributed::DDPOptions{cap});
      const double t = time_steps(*ddp, Xr, Yr, steps);
      Tensor worst = full({1}, t, {.dtype = kFloat64});  // a step is as slow as the slowest rank
      pg->all_reduce(worst, distributed::ReduceOp::Max);
      rows.push_back({fmt::format("{} ranks, DDP, {} buckets", world, ddp->bucket_layout().size()), world, cap,
                      worst.item<double>()});
      tick();
    }
    if (rank != 0) return 0;
    progress->finish();

    fmt::print(
        "bench_ddp: MLP 256-1024-1024-256-10 (1.6 M parameters, float32), global batch {}, {} ranks, {} cores "
        "({} thread(s) per rank), median of {} SGD steps\n\n",
        batch, world, cores, per_rank, steps);
    fmt::print("| configuration | bucket cap | step ms | speedup vs 1 rank | efficiency |\n|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      const double speedup = t1 / r.ms;
      fmt::print("| {} | {} | {:.2f} | {:.2f}x | {:.0f} % |\n", r.what,
                 r.bucket ? fmt::format("{} KiB", r.bucket >> 10) : std::string("-"), r.ms, speedup,
                 100.0 * speedup / r.ranks);
    }
    tools::Table table({"configuration", "ranks", "bucket_cap_bytes", "step_ms", "speedup", "efficiency"});
    for (const Row& r : rows)
      table.add({tools::Cell::str(r.what), tools::Cell::integer(r.ranks), tools::Cell::integer(r.bucket),
                 tools::Cell::fixed(r.ms, 4), tools::Cell::fixed(t1 / r.ms, 4),
                 tools::Cell::fixed(t1 / r.ms / r.ranks, 4)});
    auto facts = tools::run_facts("bench_ddp", argc, argv);
    facts["ranks"] = world;
    facts["threads_per_rank"] = per_rank;
    if (!tools::write_results(table, out, facts, /*announce=*/false)) return 1;
    return 0;
  });
}
