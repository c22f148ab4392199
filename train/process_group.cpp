// Process groups (train/process_group.h): the MPI backend. Every collective is started non-blocking (MPI_I*) and then
// polled with MPI_Test until it completes or the group's timeout passes, which is what turns a missing rank into an
// asc::Error instead of a hang.
#include "train/process_group.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "cuda/cuda.h"
#include "train/collective_signature.h"

#if defined(ASC_HAVE_MPI)
#include <mpi.h>
#endif

namespace asc::distributed {

namespace {
detail::NcclGroupFactory g_nccl_factory = nullptr;  // registered by the CUDA backend library when built with NCCL
}  // namespace

namespace detail {

void register_nccl_group_factory(NcclGroupFactory factory) { g_nccl_factory = factory; }

const char* collective_name(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllGather: return "all_gather";
  }
  return "?";
}

std::array<int64_t, 4> collective_signature(Collective op, const Tensor& t, int64_t root) {
  return {static_cast<int64_t>(op), static_cast<int64_t>(t.dtype()), t.numel(), root};
}

void check_collective_signatures(const std::vector<int64_t>& all, const std::string& backend) {
  auto describe = [&](size_t r) {
    const int64_t* s = &all[4 * r];
    std::string d = fmt::format("rank {}: {} of {} elements of {}", r, collective_name(static_cast<Collective>(s[0])),
                                s[2], static_cast<DType>(s[1]));
    if (s[3] >= 0) d += fmt::format(" (root {})", s[3]);
    return d;
  };
  for (size_t r = 1; 4 * r < all.size(); ++r)
    ASC_CHECK(std::equal(all.begin(), all.begin() + 4, all.begin() + 4 * r), "{} ({}): the ranks disagree: {}; {}",
              collective_name(static_cast<Collective>(all[0])), backend, describe(0), describe(r));
}

}  // namespace detail

LaunchInfo launch_info() {
  auto read = [](std::initializer_list<const char*> names, int fallback) {
    for (const char* name : names)
      if (const char* v = std::getenv(name)) {
        int x = -1;
        const std::string s(v);
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
        ASC_CHECK(ec == std::errc() && end == s.data() + s.size() && x >= 0,
                  "launch_info: {}='{}' is not a whole number (set by the launcher that started this process)", name,
                  s);
        return x;
      }
    return fallback;
  };
  LaunchInfo l;
  l.size = read({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1);
  l.rank = read({"OMPI_COMM_WORLD_RANK", "PMI_RANK"}, 0);
  l.local_rank = read({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, 0);
  ASC_CHECK(l.size >= 1 && l.rank < l.size, "launch_info: rank {} is not in a job of {} processes", l.rank, l.size);
  return l;
}

bool backend_available(const std::string& backend) {
#if defined(ASC_HAVE_MPI)
  if (backend == "mpi") return true;
  if (backend == "nccl") return g_nccl_factory != nullptr;
#endif
  return false;
}

#if defined(ASC_HAVE_MPI)
namespace {

// MPI is initialised for MPI_THREAD_SERIALIZED: calls may come from several threads, never at once. This lock makes
// that so across groups.
std::mutex g_mpi_mu;

void mpi_check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  ASC_CHECK(false, "{}: MPI error: {}", what, std::string(msg, static_cast<size_t>(len)));
}

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the application initialised MPI itself (and finalises it)
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init_process_group(\"mpi\")");
    ASC_CHECK(provided >= MPI_THREAD_SERIALIZED,
              "init_process_group(\"mpi\"): this MPI provides thread level {}, "
              "MPI_THREAD_SERIALIZED ({}) is needed",
              provided, MPI_THREAD_SERIALIZED);
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  });
}

using detail::Collective;

MPI_Datatype reduce_type(DType d, const char* op) {
  switch (d) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kInt64: return MPI_INT64_T;
    default:
      ASC_CHECK(false, "{} (mpi): dtype {} cannot be reduced over MPI; convert to float32, float64 or int64", op, d);
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;  // Sum, and Average (then divided)
  }
}

int checked_count(int64_t n, const char* op) {
  ASC_CHECK(n <= INT_MAX, "{} (mpi): {} elements in one call exceed MPI's int count; split the tensor", op, n);
  return static_cast<int>(n);
}

// Keeps a tensor's memory for the rest of the process: for a collective that may still write into it after its
// Work is gone. Held in a reachable list, so that leak checkers do not report it.
void keep_forever(Tensor t) {
  static std::mutex mu;
  static auto* kept = new std::vector<Tensor>();  // never destroyed: the collectives may outlive static destruction
  std::lock_guard lock(mu);
  kept->push_back(std::move(t));
}

class MpiGroup;

// The work keeps its group alive (a shared_ptr): a Work that outlives the caller's handle to the group still has a
// communicator to poll and a timeout to obey. Dropped before it completes, it waits for the collective in its
// destructor: MPI goes on writing into the tensor until then, so the tensor must not be freed earlier.
class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiGroup> group, MPI_Request request, Tensor t, ReduceOp op)
      : group_(std::move(group)), request_(request), t_(std::move(t)), op_(op) {}
  ~MpiWork() override;
  bool test() override;
  void wait() override;

 private:
  void finish();
  std::shared_ptr<MpiGroup> group_;
  MPI_Request request_;
  Tensor t_;
  ReduceOp op_;
  bool done_ = false, failed_ = false;
};

class MpiGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiGroup> {
 public:
  MpiGroup(MPI_Comm comm, int rank, int size, const ProcessGroupOptions& o)
      : ProcessGroup("mpi", rank, size, o), comm_(comm) {}
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken group may still have a collective in flight: its communicator is left to the end of the job.
    if (!finalized && broken_.empty()) MPI_Comm_free(&comm_);
  }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op, bool check) override {
    check_tensor("all_reduce", t);
    const MPI_Datatype type = reduce_type(t.dtype(), "all_reduce");
    ASC_CHECK(op != ReduceOp::Average || is_floating(t.dtype()),
              "all_reduce (mpi): Average needs a floating dtype, got {}", t.dtype());
    const int count = checked_count(t.numel(), "all_reduce");
    if (check) check_signature(Collective::AllReduce, t, -1);
    MPI_Request req;
    {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), count, type, reduce_op(op), comm_, &req), "all_reduce");
    }
    return std::make_shared<MpiWork>(shared_from_this(), req, t, op);
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t);
    ASC_CHECK(root >= 0 && root < size(), "broadcast (mpi): root {} is not a rank of this group (size {})", root,
              size());
    const int bytes = checked_count(t.numel() * static_cast<int64_t>(dtype_size(t.dtype())), "broadcast");
    check_signature(Collective::Broadcast, t, root);
    MPI_Request req;
    {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Ibcast(t.raw_data(), bytes, MPI_BYTE, root, comm_, &req), "broadcast");
    }
    wait_request(req, "broadcast");
    t.impl()->storage->bump_version();  // written in place
  }

  Tensor all_gather(const Tensor& t) override {
    check_tensor("all_gather", t);
    const int bytes = checked_count(t.numel() * static_cast<int64_t>(dtype_size(t.dtype())), "all_gather");
    check_signature(Collective::AllGather, t, -1);
    Shape shape = t.shape();
    shape.insert(0, size());
    Tensor out = Tensor::empty(shape, {.dtype = t.dtype(), .device = t.device()});
    MPI_Request req;
    {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Iallgather(t.raw_data(), bytes, MPI_BYTE, out.raw_data(), bytes, MPI_BYTE, comm_, &req),
                "all_gather");
    }
    wait_request(req, "all_gather");
    return out;
  }

  void barrier() override {
    check_usable("barrier");
    MPI_Request req;
    {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Ibarrier(comm_, &req), "barrier");
    }
    wait_request(req, "barrier");
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::abort();
  }

  // Polls `req` until it completes; at the timeout the group breaks and this throws.
  void wait_request(MPI_Request& req, const char* what) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (;;) {
      int done = 0;
      {
        std::lock_guard lock(g_mpi_mu);
        mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      }
      if (done) return;
      const double waited = std::chrono::duration<double>(clock::now() - start).count();
      if (waited > options().timeout_s) {
        broken_ = fmt::format(
            "{} timed out on rank {} after {:.1f} s (timeout_s = {}): another rank stopped taking "
            "part (it is stuck, died, or called a different collective)",
            what, rank(), waited, options().timeout_s);
        ASC_CHECK(false, "{}", broken_);
      }
      // MPI's non-blocking collectives advance only inside MPI calls, one step per MPI_Test: poll without pause while
      // the collective is moving (a large all-reduce takes hundreds of steps). Past 50 ms the other ranks are late
      // (still computing, or stuck): poll every millisecond, so that a waiting rank leaves the cores to them.
      if (waited > 0.05) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  bool broken() const { return !broken_.empty(); }

  bool test_request(MPI_Request& req, const char* what) {
    int done = 0;
    std::lock_guard lock(g_mpi_mu);
    mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    return done != 0;
  }

 private:
  void check_usable(const char* op) const {
    ASC_CHECK(broken_.empty(), "{} (mpi): the process group is broken by an earlier timeout ({})", op, broken_);
  }
  void check_tensor(const char* op, const Tensor& t) const {
    check_usable(op);
    ASC_CHECK(t.defined(), "{} (mpi): the tensor is undefined", op);
    ASC_CHECK(t.device().is_cpu(), "{} (mpi): the MPI backend takes CPU tensors, got one on {} (use \"nccl\")", op,
              t.device());
    ASC_CHECK(t.is_contiguous(), "{} (mpi): the tensor must be contiguous (shape {}, strides {})", op, t.shape(),
              t.strides());
  }
  // Every rank compares (operation, dtype, element count, root) with every other's; all throw on a mismatch.
  void check_signature(Collective op, const Tensor& t, int64_t root) {
    if (!options().check_signatures) return;
    const auto mine = detail::collective_signature(op, t, root);
    std::vector<int64_t> all(static_cast<size_t>(4 * size()));
    const char* what = detail::collective_name(op);
    MPI_Request req;
    {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Iallgather(mine.data(), 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_, &req), what);
    }
    wait_request(req, what);
    detail::check_collective_signatures(all, "mpi");
  }

  MPI_Comm comm_;
  std::string broken_;
};

MpiWork::~MpiWork() {
  if (done_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  bool completed = false;
  if (!failed_ && !finalized && !group_->broken()) {
    try {
      group_->wait_request(request_, "all_reduce");
      completed = true;
      finish();      // as if waited for: an Average is divided
    } catch (...) {  // a destructor must not throw
    }
  }
  // Timed out (now or in an earlier wait()), MPI failed or is gone: the collective may still write into the
  // tensor, so its memory is deliberately never freed.
  if (!completed) keep_forever(t_);
}

bool MpiWork::test() {
  if (!done_ && group_->test_request(request_, "all_reduce")) finish();
  return done_;
}
void MpiWork::wait() {
  if (done_) return;
  try {
    group_->wait_request(request_, "all_reduce");
  } catch (...) {
    failed_ = true;  // the destructor must not wait a second timeout
    throw;
  }
  finish();
}
void MpiWork::finish() {
  done_ = true;
  if (op_ == ReduceOp::Average) t_.detach().mul_(1.0 / group_->size());
  t_.impl()->storage->bump_version();  // written in place
}

}  // namespace
#endif  // ASC_HAVE_MPI

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options) {
  ASC_CHECK(options.timeout_s > 0, "init_process_group: timeout_s must be > 0, got {}", options.timeout_s);
  ASC_CHECK(backend == "mpi" || backend == "nccl", "init_process_group: unknown backend '{}' (known: mpi, nccl)",
            backend);
  ASC_CHECK(backend_available(backend), "init_process_group: the '{}' backend is not in this build ({})", backend,
            backend == "mpi" ? "MPI was not found at configure time: apt-get install libopenmpi-dev"
                             : "it needs MPI, and a program linking the CUDA backend built with NCCL");
  // NCCL runs on GPUs only; without one, CUDA's own error ("no CUDA-capable device is detected") would not say what
  // to do.
  ASC_CHECK(backend != "nccl" || cuda::device_count() > 0,
            "init_process_group(\"nccl\"): NCCL needs a CUDA GPU for every rank, and this machine has {} CUDA "
            "devices (cuda::device_count()); on a machine without a GPU use the \"mpi\" backend with CPU tensors "
            "(init_process_group(\"mpi\"))",
            cuda::device_count());
#if defined(ASC_HAVE_MPI)
  ensure_mpi_initialized();
  if (backend == "nccl") {
    int rank = 0, size = 0;
    {
      std::lock_guard lock(g_mpi_mu);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    return g_nccl_factory(rank, size, options, [](void* bytes, size_t n) {
      std::lock_guard lock(g_mpi_mu);
      mpi_check(MPI_Bcast(bytes, static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD), "init_process_group(\"nccl\")");
    });
  }
  std::lock_guard lock(g_mpi_mu);
  MPI_Comm comm;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "init_process_group");  // its own communicator: no cross-talk
  mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "init_process_group");
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::make_shared<MpiGroup>(comm, rank, size, options);
#else
  return nullptr;
#endif
}

}  // namespace asc::distributed
