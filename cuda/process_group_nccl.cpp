// The "nccl" process group (train/process_group.h): collectives on CUDA tensors with NCCL, one GPU per rank. Beside
// the MPI group in source, but compiled into the CUDA backend library (it links CUDA and NCCL) when the CUDA backend,
// NCCL and MPI are all found (ASC_HAVE_NCCL); it registers its factory as that library loads. MPI starts the job and
// hands every rank NCCL's id (train/process_group.cpp). The communicator is non-blocking (ncclConfig_t::blocking = 0):
// every call is followed by polling ncclCommGetAsyncError, and every collective by polling an event on the stream it
// was queued on, until done or the group's timeout, when the communicator is aborted (ncclCommAbort) and the group
// breaks.
//
// Compiled in CUDA builds, never run here: this project's machines have had no GPU (and the CPU CUDA emulator has no
// NCCL). tests/test_distributed.cpp covers the "mpi" group; run it with the "nccl" backend on a multi-GPU machine.
#if defined(ASC_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "train/collective_signature.h"
#include "train/process_group.h"

namespace asc::distributed {
namespace {

ncclDataType_t nccl_type(DType d, const char* op) {
  switch (d) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kBFloat16: return ncclBfloat16;
    case kFloat16: return ncclFloat16;
    case kInt64: return ncclInt64;
    default: ASC_CHECK(false, "{} (nccl): dtype {} cannot be reduced", op, d);
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    default: return ncclSum;
  }
}

// Keeps a tensor's memory for the rest of the process: for a collective that may still write into it after its
// Work is gone. Held in a reachable list, so that leak checkers do not report it.
void keep_forever(Tensor t) {
  static std::mutex mu;
  static auto* kept = new std::vector<Tensor>();  // never destroyed: the collectives may outlive static destruction
  std::lock_guard lock(mu);
  kept->push_back(std::move(t));
}

class NcclGroup;

// The work keeps its group alive (a shared_ptr), so that it can be waited for after the caller dropped the group.
// Dropped before it completes, it waits in its destructor: NCCL goes on writing into the tensor until then.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclGroup> g, cudaEvent_t e, Tensor t) : group_(std::move(g)), event_(e), t_(std::move(t)) {}
  ~NcclWork() override;
  bool test() override;
  void wait() override;

 private:
  std::shared_ptr<NcclGroup> group_;
  cudaEvent_t event_;
  Tensor t_;  // kept alive until the collective is done
  bool done_ = false;
};

class NcclGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclGroup> {
 public:
  NcclGroup(int rank, int size, const ProcessGroupOptions& o, const ncclUniqueId& id, int device)
      : ProcessGroup("nccl", rank, size, o), device_(device) {
    ASC_CUDA_CHECK(cudaSetDevice(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "init_process_group");
    settle("init_process_group");
  }
  ~NcclGroup() override {
    if (broken_.empty()) ncclCommDestroy(comm_);
  }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op, bool check_sig) override {
    check_tensor("all_reduce", t);
    const ncclDataType_t type = nccl_type(t.dtype(), "all_reduce");
    if (check_sig && options().check_signatures) check_signature(detail::Collective::AllReduce, t, -1);
    cudaStream_t s = cuda::stream_of(device_);
    check(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), type, nccl_op(op), comm_, s),
          "all_reduce");
    settle("all_reduce");
    return std::make_shared<NcclWork>(shared_from_this(), record(s), t);
  }
  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t);
    ASC_CHECK(root >= 0 && root < size(), "broadcast (nccl): root {} is not a rank of this group (size {})", root,
              size());
    if (options().check_signatures) check_signature(detail::Collective::Broadcast, t, root);
    cudaStream_t s = cuda::stream_of(device_);
    check(ncclBroadcast(t.raw_data(), t.raw_data(), t.numel() * dtype_size(t.dtype()), ncclUint8, root, comm_, s),
          "broadcast");
    settle("broadcast");
    NcclWork(shared_from_this(), record(s), t).wait();
    t.impl()->storage->bump_version();
  }
  Tensor all_gather(const Tensor& t) override {
    check_tensor("all_gather", t);
    if (options().check_signatures) check_signature(detail::Collective::AllGather, t, -1);
    return gather_bytes(t);
  }
  void barrier() override {
    Tensor one = ones({1}, {.device = Device::cuda(device_)});
    all_reduce(one);
  }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    std::_Exit(code);  // mpirun ends the other ranks when one exits with an error
  }

  // Polls until fn() is true; at the timeout the communicator is aborted and the group breaks.
  void poll(const char* what, const std::function<bool()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    while (!fn()) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > options().timeout_s) {
        broken_ = fmt::format(
            "{} timed out on rank {} after {:.1f} s (timeout_s = {}): another rank stopped taking "
            "part",
            what, rank(), waited, options().timeout_s);
        ncclCommAbort(comm_);
        ASC_CHECK(false, "{}", broken_);
      }
      if (waited > 0.05) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  bool broken() const { return !broken_.empty(); }
  bool event_done(cudaEvent_t e, const char* what) {
    const cudaError_t st = cudaEventQuery(e);
    if (st == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      check(async == ncclInProgress ? ncclSuccess : async, what);
      return false;
    }
    ASC_CUDA_CHECK(st);
    return true;
  }

 private:
  void check(ncclResult_t r, const char* what) {
    ASC_CHECK(r == ncclSuccess || r == ncclInProgress, "{} (nccl): {}", what, ncclGetErrorString(r));
  }
  // A non-blocking communicator may return ncclInProgress: the call is complete once the async state is success.
  void settle(const char* what) {
    poll(what, [&] {
      ncclResult_t r = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &r), what);
      check(r, what);
      return r == ncclSuccess;
    });
  }
  cudaEvent_t record(cudaStream_t s) {
    cudaEvent_t e;
    ASC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ASC_CUDA_CHECK(cudaEventRecord(e, s));
    return e;
  }
  void check_tensor(const char* op, const Tensor& t) const {
    ASC_CHECK(broken_.empty(), "{} (nccl): the process group is broken by an earlier timeout ({})", op, broken_);
    ASC_CHECK(t.defined(), "{} (nccl): the tensor is undefined", op);
    ASC_CHECK(t.device() == Device::cuda(device_), "{} (nccl): this rank's group works on cuda:{}, got a tensor on {}",
              op, device_, t.device());
    ASC_CHECK(t.is_contiguous(), "{} (nccl): the tensor must be contiguous (shape {})", op, t.shape());
  }
  Tensor gather_bytes(const Tensor& t) {
    Shape shape = t.shape();
    shape.insert(0, size());
    Tensor out = Tensor::empty(shape, {.dtype = t.dtype(), .device = t.device()});
    cudaStream_t s = cuda::stream_of(device_);
    check(ncclAllGather(t.raw_data(), out.raw_data(), t.numel() * dtype_size(t.dtype()), ncclUint8, comm_, s),
          "all_gather");
    settle("all_gather");
    NcclWork(shared_from_this(), record(s), out).wait();
    return out;
  }
  void check_signature(detail::Collective op, const Tensor& t, int64_t root) {
    const auto sig = detail::collective_signature(op, t, root);
    const Tensor mine = tensor(std::vector<int64_t>(sig.begin(), sig.end()), {4}).to(Device::cuda(device_));
    detail::check_collective_signatures(gather_bytes(mine).to(Device::cpu()).to_vector<int64_t>(), "nccl");
  }

  int device_;
  ncclComm_t comm_ = nullptr;
  std::string broken_;
};

NcclWork::~NcclWork() {
  if (!done_) {
    bool completed = false;
    if (!group_->broken()) {  // a wait() that timed out broke the group: no second timeout here
      try {
        wait();
        completed = true;
      } catch (...) {  // a destructor must not throw
      }
    }
    if (!completed) keep_forever(t_);  // the collective may still write into it
  }
  cudaEventDestroy(event_);
}

bool NcclWork::test() {
  if (!done_) done_ = group_->event_done(event_, "all_reduce");
  return done_;
}
void NcclWork::wait() {
  if (!done_) group_->poll("all_reduce", [&] { return test(); });
}

}  // namespace

// Called by init_process_group("nccl") once MPI has given every rank its place; `share` copies rank 0's bytes to
// every rank (an MPI broadcast).
std::shared_ptr<ProcessGroup> make_nccl_group(int rank, int size, const ProcessGroupOptions& options,
                                              const std::function<void(void*, size_t)>& share) {
  int devices = 0;
  const cudaError_t st = cudaGetDeviceCount(&devices);
  ASC_CHECK(st == cudaSuccess && devices > 0,
            "init_process_group(\"nccl\"): NCCL needs a CUDA GPU for every rank, and rank {} sees none ({}); on a "
            "machine without a GPU use the \"mpi\" backend with CPU tensors",
            rank, st == cudaSuccess ? "0 devices" : cudaGetErrorString(st));
  // One GPU per rank: the local rank (mpirun's OMPI_COMM_WORLD_LOCAL_RANK) picks it, else the global rank.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = (local ? std::atoi(local) : rank) % devices;
  ncclUniqueId id;
  if (rank == 0) ASC_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "init_process_group(\"nccl\"): ncclGetUniqueId failed");
  share(&id, sizeof(id));
  return std::make_shared<NcclGroup>(rank, size, options, id, device);
}

namespace {
const bool g_registered = [] {
  detail::register_nccl_group_factory(&make_nccl_group);
  return true;
}();
}  // namespace

}  // namespace asc::distributed
#endif  // ASC_HAVE_NCCL
