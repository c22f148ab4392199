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
  int64_t kill_step = 0;  // 0: never
  int64_t kill_rank = 0;
};

// A positive whole number from the environment, or 0 (unset or anything else: a test's typo must not kill a user's
// run).
int64_t positive(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return *end == '\0' && n > 0 ? n : 0;
}

const Plan& plan() {
  static const Plan p = [] {
    Plan out;
    out.die_at = positive("ASC_FAULT_DIE_AT");
    if (const char* t = std::getenv("ASC_FAULT_TORN")) out.torn = t[0] == '1';
    out.kill_step = positive("ASC_FAULT_KILL_STEP");
    out.kill_rank = positive("ASC_FAULT_KILL_RANK");
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

void step_point(int rank, int64_t step) {
  const Plan& p = plan();
  if (p.kill_step == 0 || step != p.kill_step || rank != p.kill_rank) return;
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);
}

}  // namespace asc::fault
