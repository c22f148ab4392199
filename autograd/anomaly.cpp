#include "autograd/anomaly.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/format.h"

namespace asc::autograd {

namespace {
std::atomic<bool> g_anomaly{false};
std::atomic<uint64_t> g_op_counter{0};  // ops recorded since anomaly mode was switched on
thread_local std::vector<std::string> t_scopes;
}  // namespace

bool anomaly_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
void set_anomaly_enabled(bool enabled) {
  if (enabled && !g_anomaly.load()) g_op_counter.store(0);
  g_anomaly.store(enabled);
}

AnomalyScope::AnomalyScope(const std::string& name) {
  if (!anomaly_enabled()) return;
  t_scopes.push_back(name);
  active_ = true;
}
AnomalyScope::~AnomalyScope() {
  if (active_) t_scopes.pop_back();
}

std::string anomaly_creation_context() {
  std::string where = t_scopes.empty() ? "outside any module" : fmt::format("in {}", fmt::join(t_scopes, " > "));
  return fmt::format("op #{}, created {}", g_op_counter.fetch_add(1) + 1, where);
}

bool all_finite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return true;
  NoGradGuard no_grad;
  Tensor x = t.detach();
  // The CPU backend has no bfloat16/float16 arithmetic: widen on the tensor's own device first.
  if (x.dtype() == kBFloat16 || x.dtype() == kFloat16) x = x.to(kFloat32);
  for (double v : x.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace asc::autograd
