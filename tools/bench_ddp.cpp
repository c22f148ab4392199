// Data-parallel training step time: 1 rank on the whole batch against N ranks on 1/N of it each
// (DistributedDataParallel over the MPI process group), for several bucket sizes, side by side in one run.
//
//   mpirun -np 2 --oversubscribe ./build/release/tools/bench_ddp [--steps 30] [--batch 256] [--csv out.csv]
//
// Every rank gets cores / N threads (OpenMP and OpenBLAS), as a rank gets one device: the "1 rank" row runs rank 0
// alone with that share while the other ranks wait, the N-rank rows run every rank on 1/N of the batch.
// Speedup = T(1 rank) / T(N ranks), efficiency = speedup / N. The "no all-reduce" row is the N-rank step without
// DDP (each rank's local gradient): its difference to the DDP rows is what averaging the gradients costs.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "bench_util.h"
#include "nn/distributed.h"

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
  std::string csv;
  std::vector<int64_t> caps = {64 << 10, 1 << 20, 25 << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = std::stoll(argv[++i]);
    else if (a == "--csv" && i + 1 < argc) csv = argv[++i];
    else {
      std::fprintf(stderr, "usage: mpirun -np N bench_ddp [--steps S] [--batch B] [--csv FILE]\n");
      return 2;
    }
  }
  auto pg = distributed::init_process_group("mpi");
  const int rank = pg->rank(), world = pg->size();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (batch % world != 0) {
    if (rank == 0) std::fprintf(stderr, "bench_ddp: --batch %lld is not divisible by %d ranks\n",
                                static_cast<long long>(batch), world);
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
  if (world > 1) {
    auto m = make_model();
    const double t = time_steps(*m, Xr, Yr, steps);
    Tensor worst = full({1}, t, {.dtype = kFloat64});
    pg->all_reduce(worst, distributed::ReduceOp::Max);
    rows.push_back({fmt::format("{} ranks, no all-reduce", world), world, 0, worst.item<double>()});
  }
  for (int64_t cap : caps) {
    auto m = make_model();
    auto ddp = std::make_shared<distributed::DistributedDataParallel>(m, pg, distributed::DDPOptions{cap});
    const double t = time_steps(*ddp, Xr, Yr, steps);
    Tensor worst = full({1}, t, {.dtype = kFloat64});  // a step is as slow as the slowest rank
    pg->all_reduce(worst, distributed::ReduceOp::Max);
    rows.push_back({fmt::format("{} ranks, DDP, {} buckets", world, ddp->bucket_layout().size()), world, cap,
                    worst.item<double>()});
  }
  if (rank != 0) return 0;

  fmt::print("bench_ddp: MLP 256-1024-1024-256-10 (1.6 M parameters, float32), global batch {}, {} ranks, {} cores "
             "({} thread(s) per rank), median of {} SGD steps\n\n", batch, world, cores, per_rank, steps);
  fmt::print("| configuration | bucket cap | step ms | speedup vs 1 rank | efficiency |\n|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double speedup = t1 / r.ms;
    fmt::print("| {} | {} | {:.2f} | {:.2f}x | {:.0f} % |\n", r.what,
               r.bucket ? fmt::format("{} KiB", r.bucket >> 10) : std::string("-"), r.ms, speedup,
               100.0 * speedup / r.ranks);
  }
  if (!csv.empty()) {
    FILE* f = std::fopen(csv.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_ddp: cannot write %s\n", csv.c_str());
      return 1;
    }
    std::fprintf(f, "configuration,ranks,bucket_cap_bytes,step_ms,speedup,efficiency\n");
    for (const Row& r : rows)
      std::fprintf(f, "%s,%d,%lld,%.4f,%.4f,%.4f\n", r.what.c_str(), r.ranks, static_cast<long long>(r.bucket), r.ms,
                   t1 / r.ms, t1 / r.ms / r.ranks);
    std::fclose(f);
  }
  return 0;
}
