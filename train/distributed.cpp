// DistributedDataParallel and rank-0 checkpoints (train/distributed.h).
#include "train/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <new>
#include <numeric>
#include <stdexcept>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "core/generator.h"

namespace asc::distributed {

// The bucket state the gradient hooks work on. Owned by the DDP module; the hooks hold it weakly.
struct DistributedDataParallel::Reducer : std::enable_shared_from_this<Reducer> {
  struct Bucket {
    std::vector<size_t> params;    // indices into `params`
    std::vector<int64_t> offsets;  // each parameter's first element in `flat`
    Tensor flat;                   // (Σ numel), the parameters' dtype and device
    size_t pending = 0;            // parameters whose gradient has not come in during this backward
    std::shared_ptr<Work> work;    // the all-reduce, once started
  };
  std::shared_ptr<ProcessGroup> group;
  std::vector<Tensor> params;     // the wrapped module's parameters that require grad
  std::vector<size_t> bucket_of;  // parameter -> bucket
  std::vector<size_t> slot_of;    // parameter -> its position in the bucket
  std::vector<bool> ready;        // parameter's gradient came in during this backward
  std::vector<Bucket> buckets;    // in launch order
  size_t next_launch = 0;         // buckets [0, next_launch) have started
  bool in_backward = false;
  bool sync = true;        // false under no_sync(): the hooks leave the gradients where backward accumulates them
  int64_t reductions = 0;  // all-reduces started since construction

  Tensor slice(const Bucket& b, size_t j) const {
    const Tensor& p = params[b.params[j]];
    return b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape());
  }

  // Runs finish() at the end of the backward it was queued in; if that backward throws first (its callbacks are
  // dropped), resets the buckets for the next one instead.
  struct EndOfBackward {
    std::weak_ptr<Reducer> reducer;
    bool ran = false;
    ~EndOfBackward() {
      if (auto self = reducer.lock(); self && !ran) self->reset();
    }
  };

  // Hook: parameter i's .grad was just updated by backward.
  void on_grad(size_t i) {
    if (!sync) return;   // no_sync(): .grad keeps accumulating; the next synchronised backward reduces all of it
    if (!in_backward) {  // the first gradient of this backward: finish() runs when the whole graph is done
      in_backward = true;
      auto end = std::make_shared<EndOfBackward>();
      end->reducer = weak_from_this();
      autograd::queue_callback([end] {
        end->ran = true;
        if (auto self = end->reducer.lock()) self->finish();
      });
    }
    Bucket& b = buckets[bucket_of[i]];
    const size_t j = slot_of[i];
    slice(b, j).copy_(params[i].grad());
    if (!ready[i]) ready[i] = true, --b.pending;
    launch_ready();
    for (size_t k = 0; k < next_launch; ++k) buckets[k].work->test();  // lets started all-reduces progress
  }

  // Starts every bucket, in order, whose gradients are all in.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.work = group->all_reduce_async(b.flat, ReduceOp::Average, /*check_signature=*/false);
      ++reductions;
    }
  }

  // End of backward: start the rest (parameters without a new gradient contribute their .grad, or zeros), wait for
  // every bucket, write the averages into .grad.
  void finish() {
    NoGradGuard no_grad;
    for (Bucket& b : buckets) {
      for (size_t j = 0; j < b.params.size(); ++j) {
        const size_t i = b.params[j];
        if (ready[i]) continue;
        const Tensor g = params[i].grad();
        if (g.defined())
          slice(b, j).copy_(g);
        else
          slice(b, j).zero_();
        ready[i] = true, --b.pending;
      }
    }
    launch_ready();
    for (Bucket& b : buckets) {
      b.work->wait();
      for (size_t j = 0; j < b.params.size(); ++j) {
        Tensor& p = params[b.params[j]];
        const Tensor g = p.grad();
        if (g.defined() && g.shape() == p.shape() && g.is_contiguous())
          g.detach().copy_(slice(b, j));
        else
          p.set_grad(slice(b, j).clone());
      }
    }
    reset();
  }

  void reset() {
    in_backward = false;
    for (Bucket& b : buckets) b.work.reset(), b.pending = b.params.size();
    std::fill(ready.begin(), ready.end(), false);
    next_launch = 0;
  }
};

namespace {

// FNV-1a over the parameter list's names, shapes and dtypes: equal on every rank iff the models are built alike.
uint64_t parameter_signature(const std::vector<std::pair<std::string, Tensor>>& named) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  for (const auto& [name, p] : named) mix(fmt::format("{}:{}:{};", name, p.shape(), p.dtype()));
  return h;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> m, std::shared_ptr<ProcessGroup> g,
                                                 DDPOptions options)
    : nn::Module("DistributedDataParallel"), group(std::move(g)) {
  ASC_CHECK(m != nullptr, "DistributedDataParallel: the module is null");
  ASC_CHECK(group != nullptr, "DistributedDataParallel: the process group is null");
  ASC_CHECK(options.bucket_cap_bytes > 0, "DistributedDataParallel: bucket_cap_bytes must be > 0, got {}",
            options.bucket_cap_bytes);
  module = register_module("module", std::move(m));

  // 1. Every rank must wrap the same model: compare (count, signature) of the parameter lists.
  const auto named = module->named_parameters();
  const Tensor mine = tensor(
      std::vector<int64_t>{static_cast<int64_t>(named.size()), static_cast<int64_t>(parameter_signature(named))}, {2});
  const auto all = group->all_gather(mine).to_vector<int64_t>();  // (size, 2)
  for (int r = 1; r < group->size(); ++r)
    ASC_CHECK(all[2 * r] == all[0] && all[2 * r + 1] == all[1],
              "DistributedDataParallel: the ranks' models differ: rank 0 has {} parameters (signature {:016x}), "
              "rank {} has {} (signature {:016x}); every rank must build the same model (names, shapes, dtypes)",
              all[0], static_cast<uint64_t>(all[1]), r, all[2 * r], static_cast<uint64_t>(all[2 * r + 1]));

  // 2. Rank 0's parameters and buffers everywhere.
  {
    NoGradGuard no_grad;
    auto broadcast = [&](const Tensor& t) {
      if (t.is_contiguous()) {
        group->broadcast(t.detach(), 0);
      } else {
        const Tensor c = t.contiguous();
        group->broadcast(c, 0);
        t.detach().copy_(c);
      }
    };
    for (const auto& [name, p] : named) broadcast(p);
    for (const auto& [name, b] : module->named_buffers()) broadcast(b);
  }

  // 3. Buckets, in reverse parameter order; a bucket holds one dtype and device.
  reducer_ = std::make_shared<Reducer>();
  Reducer& r = *reducer_;
  r.group = group;
  for (const auto& [name, p] : named)
    if (p.requires_grad()) r.params.push_back(p);
  r.bucket_of.resize(r.params.size());
  r.slot_of.resize(r.params.size());
  r.ready.assign(r.params.size(), false);
  std::vector<std::vector<size_t>> layout;
  int64_t bytes = 0;
  for (size_t k = r.params.size(); k-- > 0;) {
    const Tensor& p = r.params[k];
    const int64_t nb = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    const bool fits = !layout.empty() && bytes + nb <= options.bucket_cap_bytes &&
                      r.params[layout.back().front()].dtype() == p.dtype() &&
                      r.params[layout.back().front()].device() == p.device();
    if (!fits) layout.emplace_back(), bytes = 0;
    layout.back().push_back(k);
    bytes += nb;
  }
  for (auto& idx : layout) {
    Reducer::Bucket b;
    b.params = idx;
    int64_t n = 0;
    for (size_t i : idx) b.offsets.push_back(n), n += r.params[i].numel();
    const Tensor& first = r.params[idx.front()];
    b.flat = zeros({n}, {.dtype = first.dtype(), .device = first.device()});
    b.pending = idx.size();
    for (size_t j = 0; j < idx.size(); ++j) r.bucket_of[idx[j]] = r.buckets.size(), r.slot_of[idx[j]] = j;
    r.buckets.push_back(std::move(b));
  }

  // 4. The hooks.
  for (size_t i = 0; i < r.params.size(); ++i)
    autograd::register_post_accumulate_grad_hook(r.params[i],
                                                 [weak = std::weak_ptr<Reducer>(reducer_), i](const Tensor&) {
                                                   if (auto self = weak.lock()) self->on_grad(i);
                                                 });
}

DistributedDataParallel::~DistributedDataParallel() = default;

int64_t DistributedDataParallel::reductions() const { return reducer_->reductions; }

bool DistributedDataParallel::require_backward_grad_sync() const { return reducer_->sync; }
void DistributedDataParallel::set_require_backward_grad_sync(bool sync) {
  ASC_CHECK(!reducer_->in_backward, "DistributedDataParallel: gradient sync switched during a backward");
  reducer_->sync = sync;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.require_backward_grad_sync()) {
  ddp_.set_require_backward_grad_sync(false);
}
DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.reducer_->sync = previous_; }

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : reducer_->buckets) out.push_back(b.params);
  return out;
}

// ---- checkpoints -----------------------------------------------------------------------------------------------

void save_checkpoint(ProcessGroup& group, const std::string& path, const TrainingState& state,
                     const std::map<std::string, std::string>& metadata) {
  std::string error;
  if (group.rank() == 0) {
    try {
      asc::save_checkpoint(path, state, metadata);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Every rank learns whether rank 0 succeeded (rather than some waiting at a barrier for a rank that threw).
  const Tensor ok = full({1}, error.empty() ? 1.0 : 0.0, {.dtype = kInt64});
  group.broadcast(ok, 0);
  ASC_CHECK(ok.item<int64_t>() == 1, "distributed::save_checkpoint: rank 0 could not write '{}'{}", path,
            error.empty() ? "" : ": " + error);
}

}  // namespace asc::distributed
