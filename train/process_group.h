#pragma once
// Process groups: collective communication between the processes (ranks) of one training job, the transport under
// DistributedDataParallel (train/distributed.h). Backends:
//   "mpi"  — MPI (Debian's OpenMPI), CPU tensors. Start the job with mpirun: `mpirun -np 2 ./train`.
//   "nccl" — NCCL (the CUDA toolkit's libnccl), CUDA tensors, one GPU per rank; started by mpirun too (MPI hands
//            the ranks NCCL's id). Built when both MPI and NCCL are found.
//
//   auto pg = asc::distributed::init_process_group("mpi");   // initialises MPI on first use
//   asc::Tensor t = asc::full({4}, pg->rank());
//   pg->all_reduce(t);                                       // every rank: t = 0 + 1 + ... + (size - 1)
//
// Every collective waits at most ProcessGroupOptions::timeout_s. A rank that stops taking part (stuck, or gone
// without mpirun noticing) makes the others throw asc::Error naming the collective instead of hanging; mpirun
// itself ends the job when a process exits. After a timeout the group is broken (its ranks may be anywhere in
// their sequence of collectives): every later call on it throws; end the job (abort()).
//
// Unless check_signatures is off, every collective first compares what each rank passes (operation, dtype, element
// count, root): ranks that disagree all throw the same asc::Error, instead of the transport reading past a buffer.
#include <functional>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace asc::distributed {

enum class ReduceOp { Sum, Average, Max, Min };

struct ProcessGroupOptions {
  double timeout_s = 300.0;      // per collective
  bool check_signatures = true;  // one small all-gather before each collective (DDP's buckets skip it)
};

// A collective in flight (all_reduce_async).
class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;  // lets it progress; true once complete
  virtual void wait() = 0;  // until complete, or throws at the group's timeout
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }
  const ProcessGroupOptions& options() const { return options_; }

  // In place on t (contiguous, on the backend's device; every rank the same dtype and element count). Average divides
  // the sum by size() (floating dtypes). check_signature = false skips the signature check for this call (for callers
  // that have established that the ranks agree, as DDP does for its buckets).
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum,
                                                 bool check_signature = true) = 0;
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  // In place: every rank's t becomes rank `root`'s.
  virtual void broadcast(const Tensor& t, int root = 0) = 0;
  // (size(), *t.shape): rank r's t at index r.
  virtual Tensor all_gather(const Tensor& t) = 0;
  virtual void barrier() = 0;
  // Ends every process of the job with this exit code (MPI_Abort).
  [[noreturn]] virtual void abort(int code = 1) = 0;

 protected:
  ProcessGroup(std::string backend, int rank, int size, ProcessGroupOptions options)
      : backend_(std::move(backend)), rank_(rank), size_(size), options_(options) {}

 private:
  std::string backend_;
  int rank_, size_;
  ProcessGroupOptions options_;
};

// A new group of all the job's processes on `backend` ("mpi" or "nccl"); throws when the backend was not built.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options = {});
// How a launcher started this process, read from the environment it sets (OpenMPI's mpirun: OMPI_COMM_WORLD_SIZE /
// _RANK / _LOCAL_RANK; MPICH's and Slurm's PMI: PMI_SIZE / PMI_RANK / MPI_LOCALRANKID): the number of processes of the
// job (1 when no launcher started it), this one's rank, and its rank among those on its machine (which picks its GPU).
// Reading it needs no MPI: a program decides whether to start a process group from it. An unreadable value is an
// asc::Error naming the variable.
struct LaunchInfo {
  int size = 1, rank = 0, local_rank = 0;
};
LaunchInfo launch_info();
// Whether init_process_group(backend) can work in this program: "mpi" when MPI was found at configure time, "nccl"
// when the program also links the CUDA backend (ascender::cuda) built with NCCL.
bool backend_available(const std::string& backend);

namespace detail {
// The "nccl" group lives in the CUDA backend library (cuda/process_group_nccl.cpp, compiled into libascender_cuda),
// which registers its factory as it loads; init_process_group calls it once MPI has given every rank its place, with
// `share` copying rank 0's bytes to every rank (an MPI broadcast).
using NcclGroupFactory = std::shared_ptr<ProcessGroup> (*)(int rank, int size, const ProcessGroupOptions& options,
                                                           const std::function<void(void*, size_t)>& share);
void register_nccl_group_factory(NcclGroupFactory factory);
}  // namespace detail

}  // namespace asc::distributed
