#include "core/determinism.h"

#include <atomic>

namespace asc {

namespace {
std::atomic<bool> g_deterministic{false};
}

void use_deterministic_algorithms(bool enabled) { g_deterministic.store(enabled); }
bool deterministic_algorithms_enabled() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace asc
