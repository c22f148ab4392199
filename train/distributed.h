#pragma once
// Data-parallel training over a process group (train/process_group.h), like PyTorch's DistributedDataParallel: every
// rank holds a replica of the model and trains on its own share of each batch; the gradients are averaged across the
// ranks during backward, so every optimizer step sees the gradient of the whole batch on every rank.
//
//   auto pg = asc::distributed::init_process_group("mpi");                 // run under mpirun -np N
//   auto model = std::make_shared<Net>();
//   auto ddp = std::make_shared<asc::distributed::DistributedDataParallel>(model, pg);  // rank 0's weights everywhere
//   asc::optim::AdamW opt(ddp->parameters());
//   asc::distributed::DistributedSampler sampler(dataset_size, *pg);      // this rank's share of the examples
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);                                             // a new shuffle, the same on every rank
//     ... batches from sampler.indices(): opt.zero_grad(); loss(ddp->forward(x)).backward(); opt.step(); ...
//   }
//   asc::distributed::save_checkpoint(*pg, "run.safetensors", {.model = model.get(), .optimizer = &opt});
//
// How the gradients are averaged. At construction the ranks' parameter lists are compared (a mismatch throws on
// every rank) and rank 0's parameters and buffers are broadcast. The parameters are grouped into buckets of about
// bucket_cap_bytes, in reverse order (the order in which backward produces their gradients). After each gradient
// accumulation a hook copies the gradient into its bucket; a bucket whose gradients are all in starts its all-reduce
// at once (buckets start in order, the same on every rank), while backward goes on computing the others. When
// backward ends, the buckets not yet started start (a parameter without a gradient contributes its .grad from
// earlier or zeros), all are waited for, and the averages are written back into the parameters' .grad.
#include <memory>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "nn/module.h"
#include "train/checkpoint.h"
#include "train/process_group.h"

namespace asc::distributed {

struct DDPOptions {
  int64_t bucket_cap_bytes = 1 << 20;  // a bucket closes once it holds at least one parameter and would pass this
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  ~DistributedDataParallel() override;
  Tensor forward(const Tensor& x) override { return (*module)(x); }

  std::shared_ptr<nn::Module> module;  // registered as "module": state_dict names are "module.<name>"
  std::shared_ptr<ProcessGroup> group;
  // The buckets in launch order, each a list of indices into module->parameters() (those that require grad).
  std::vector<std::vector<size_t>> bucket_layout() const;
  // Bucket all-reduces started since construction: one per bucket per backward.
  int64_t reductions() const;
  // PyTorch's no_sync(): while the returned guard lives, backward accumulates each rank's local gradients in .grad
  // and starts no all-reduce; the first backward after it reduces everything accumulated (gradient accumulation:
  // N - 1 micro-batches under the guard, the last one outside it). Every rank must use it alike.
  //   { auto guard = ddp->no_sync(); loss(ddp->forward(x1)).backward(); }
  //   loss(ddp->forward(x2)).backward();  // the gradients of x1 and x2 averaged over the ranks
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  // What no_sync() switches (nanoGPT sets PyTorch's attribute of this name directly): false, backward only accumulates.
  bool require_backward_grad_sync() const;
  void set_require_backward_grad_sync(bool sync);

 private:
  struct Reducer;
  std::shared_ptr<Reducer> reducer_;  // the gradient hooks hold it weakly: they do nothing once this is gone
};

// DistributedSampler, the share of the examples each rank reads, lives with the data loader that uses it
// (data/sampler.h); it takes a ProcessGroup's rank and size.

// Rank 0 writes the checkpoint, then every rank waits until it is written (a barrier); any rank can then
// load_checkpoint() it (a file system every rank sees). Save from the wrapped module, so that the names have no
// "module." prefix and the checkpoint also loads without DDP.
void save_checkpoint(ProcessGroup& group, const std::string& path, const TrainingState& state,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace asc::distributed
