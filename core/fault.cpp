// The crash tests' fault hook (core/fault.h).
#include "core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace asc::fault {

namespace {

struct Plan {
  int64_t die_at = 0;  // 0: never
  bool torn = false;
};

const Plan& plan() {
  static const Plan p = [] {
    Plan out;
    if (const char* v = std::getenv("ASC_FAULT_DIE_AT"); v && *v) {
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (*end == '\0' && n > 0) out.die_at = n;  // anything else: off (a test's typo must not kill a user's run)
    }
    if (const char* t = std::getenv("ASC_FAULT_TORN")) out.torn = t[0] == '1';
    return out;
  }();
  return p;
}

std::atomic<int64_t> g_points{0};

}  // namespace

void write_point(const std::function<void()>& tear) {
  const int64_t n = g_points.fetch_add(1, std::memory_order_relaxed) + 1;
  const Plan& p = plan();
  if (p.die_at == 0 || n != p.die_at) return;
  if (p.torn && tear) tear();
  ::kill(::getpid(), SIGKILL);  // as `kill -9`: no destructors, no buffers flushed, no atexit
  ::_exit(137);                 // not reached
}

int64_t write_points() { return g_points.load(std::memory_order_relaxed); }

}  // namespace asc::fault
