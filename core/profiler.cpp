#include "core/profiler.h"

#include "core/atomic_file.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "core/allocator.h"
#include "core/cpu_isa.h"
#include "core/cpu_peak.h"
#include "core/error.h"
#include "core/format.h"

namespace asc::profiler {
namespace detail {
std::atomic<bool> g_recording{false};
}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

// The recording session: one at a time. Events are appended under the mutex (only while recording); each thread
// keeps its own stack of open events, tagged with the session they belong to.
std::mutex g_mu;
std::atomic<uint64_t> g_session{0};  // incremented by every Profile
Clock::time_point g_t0;              // the session's start
std::vector<Event> g_events;         // guarded by g_mu
int g_threads = 0;                   // threads seen this session (guarded by g_mu)
std::atomic<int64_t> g_peak{0};      // the largest live CPU storage sampled at an event's end

// Device time (core/profiler.h): the registered timer, each CUDA kernel event's pair of marks (by its index in
// g_events), and per device the profile's first mark with the host time it was queued at (the device was idle).
const detail::DeviceTimer* g_timer = nullptr;
struct MarkPair {
  size_t event;
  void *from, *to;
};
std::vector<MarkPair> g_marks;  // guarded by g_mu
struct Origin {
  void* mark;
  int64_t host_ns;
};
std::map<int, Origin> g_origins;  // guarded by g_mu

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - g_t0).count(); }
int64_t live_cpu_bytes() { return static_cast<int64_t>(cpu_memory_stats().allocated); }

struct Open {
  Event event;
  int64_t children_ns = 0;
};
struct ThreadState {
  uint64_t session = 0;
  int id = -1;
  std::vector<Open> stack;
  int64_t mark = 0;  // thread_allocated_bytes() at the end of this thread's last kernel event
};
thread_local ThreadState t_state;

ThreadState& state() {
  ThreadState& t = t_state;
  const uint64_t session = g_session.load(std::memory_order_relaxed);
  if (t.session != session) {  // first event of this session on this thread
    t = ThreadState{};
    t.session = session;
    t.mark = static_cast<int64_t>(thread_allocated_bytes());
    std::lock_guard lock(g_mu);
    t.id = g_threads++;
  }
  return t;
}

// JSON string contents: quotes, backslashes and control characters escaped.
std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\', out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string display_name(const Event& e) {
  if (e.kind == EventKind::Range || e.kernel.empty() || e.kernel == e.name) return e.name;
  return fmt::format("{} ({})", e.name, e.kernel);
}

}  // namespace

namespace detail {

bool begin(EventKind kind, std::string name, const char* kernel) {
  // Acquire: the session's start (g_t0, g_session) was written before the release that set g_recording.
  if (!g_recording.load(std::memory_order_acquire)) return false;
  ThreadState& t = state();
  Open o;
  o.event.name = std::move(name);
  o.event.kernel = kernel;
  o.event.kind = kind;
  o.event.thread = t.id;
  o.event.depth = static_cast<int>(t.stack.size());
  o.event.bytes = kind == EventKind::Range ? static_cast<int64_t>(thread_allocated_bytes()) : 0;
  o.event.start_ns = now_ns();
  t.stack.push_back(std::move(o));
  return true;
}

void register_device_timer(const DeviceTimer* timer) { g_timer = timer; }

void* device_mark(int device) {
  if (!g_timer || !g_recording.load(std::memory_order_acquire)) return nullptr;
  bool has_origin = false;
  {
    std::lock_guard lock(g_mu);
    has_origin = g_origins.count(device) != 0;
  }
  if (!has_origin) {
    // The device's origin, made outside the lock (it waits for the device); kept unless another thread's came first
    // or the profile stopped meanwhile.
    void* origin = g_timer->mark(device, /*wait_first=*/true);
    if (!origin) return nullptr;
    const int64_t host_ns = now_ns();
    std::lock_guard lock(g_mu);
    if (g_recording.load(std::memory_order_relaxed) && !g_origins.count(device)) {
      g_origins[device] = {origin, host_ns};
    } else {
      g_timer->release(origin);
      if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
    }
  }
  return g_timer->mark(device, false);
}

void end(double flops, bool cpu, int device, void* mark) {
  void* to = mark ? g_timer->mark(device, false) : nullptr;  // after the dispatch's launches
  const int64_t t_end = now_ns();
  ThreadState& t = t_state;
  auto drop_marks = [&] {
    for (void* m : {mark, to})
      if (m) g_timer->release(m);
  };
  if (t.session != g_session.load(std::memory_order_relaxed) || t.stack.empty()) {
    drop_marks();
    return;  // opened in an earlier session
  }
  Open o = std::move(t.stack.back());
  t.stack.pop_back();
  Event& e = o.event;
  e.duration_ns = t_end - e.start_ns;
  e.self_ns = e.duration_ns - o.children_ns;
  e.flops = flops;
  e.cpu = cpu;
  e.device = device;
  const auto allocated = static_cast<int64_t>(thread_allocated_bytes());
  if (e.kind == EventKind::Kernel) {
    e.bytes = allocated - t.mark;  // the op's outputs and temporaries, allocated just before its dispatch
    t.mark = allocated;
  } else {
    e.bytes = allocated - e.bytes;
  }
  e.live_bytes = live_cpu_bytes();
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (e.live_bytes > peak && !g_peak.compare_exchange_weak(peak, e.live_bytes, std::memory_order_relaxed)) {
  }
  if (!t.stack.empty()) t.stack.back().children_ns += e.duration_ns;
  std::lock_guard lock(g_mu);
  if (!g_recording.load(std::memory_order_relaxed)) {  // stopped meanwhile
    drop_marks();
    return;
  }
  if (mark && to) {
    g_marks.push_back({g_events.size(), mark, to});
  } else {
    drop_marks();
  }
  g_events.push_back(std::move(e));
}

}  // namespace detail

// ---- Profile ----------------------------------------------------------------------------------------------------

Profile::Profile() {
  std::lock_guard lock(g_mu);
  ASC_CHECK(!detail::g_recording.load(), "profiler: a Profile is already recording in this process (one at a time)");
  g_session.fetch_add(1);
  g_events.clear();
  g_marks.clear();
  g_origins.clear();
  // This thread is track 0, and what it allocates from now on is counted (other threads: from their first event).
  t_state = ThreadState{};
  t_state.session = g_session.load();
  t_state.id = 0;
  t_state.mark = static_cast<int64_t>(thread_allocated_bytes());
  g_threads = 1;
  reset_cpu_peak_memory();
  g_peak.store(live_cpu_bytes());
  g_t0 = Clock::now();
  recording_ = true;
  detail::g_recording.store(true, std::memory_order_release);
}

Profile::~Profile() { stop(); }

void Profile::stop() {
  if (!recording_) return;
  recording_ = false;
  std::vector<MarkPair> marks;
  std::map<int, Origin> origins;
  {
    std::lock_guard lock(g_mu);
    detail::g_recording.store(false);
    wall_ns_ = now_ns();
    events_ = std::move(g_events);
    g_events.clear();
    marks = std::move(g_marks), origins = std::move(g_origins);
    g_marks.clear(), g_origins.clear();
  }
  // The device times, outside the lock: each pair waits for its end mark (the device finishes the profiled work
  // here), then every mark is released.
  for (const MarkPair& m : marks) {
    Event& e = events_[m.event];
    const double ms = g_timer->elapsed_ms(m.from, m.to);
    const auto origin = origins.find(e.device);
    const double since = origin == origins.end() ? -1 : g_timer->elapsed_ms(origin->second.mark, m.from);
    if (ms >= 0) e.device_ns = static_cast<int64_t>(ms * 1e6);
    if (ms >= 0 && since >= 0) e.device_start_ns = origin->second.host_ns + static_cast<int64_t>(since * 1e6);
  }
  for (const MarkPair& m : marks) g_timer->release(m.from), g_timer->release(m.to);
  for (const auto& [device, origin] : origins) g_timer->release(origin.mark);
  // The allocator's peak since the start, unless a benchmark reset it meanwhile: then the sampled peak still holds.
  peak_bytes_ = std::max(g_peak.load(), static_cast<int64_t>(cpu_memory_stats().peak_allocated));
  std::sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
}

std::vector<OpStats> Profile::stats() const {
  std::map<std::pair<std::string, int>, OpStats> rows;
  for (const Event& e : events_) {
    std::string name = display_name(e);
    OpStats& r = rows[{name, static_cast<int>(e.kind)}];
    if (r.calls == 0) r.name = std::move(name), r.kind = e.kind;
    ++r.calls;
    r.self_ns += e.self_ns;
    r.total_ns += e.duration_ns;
    r.bytes += e.bytes;
    if (e.flops >= 0) r.flops += e.flops, ++r.counted;
    if (e.device_ns >= 0) r.device_ns += e.device_ns, ++r.device_calls;
  }
  std::vector<OpStats> out;
  out.reserve(rows.size());
  for (auto& [key, r] : rows) out.push_back(std::move(r));
  std::stable_sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) { return a.self_ns > b.self_ns; });
  return out;
}

int64_t Profile::calls(const std::string& op, const std::string& kernel) const {
  return std::count_if(events_.begin(), events_.end(), [&](const Event& e) {
    return e.kind == EventKind::Kernel && e.name == op && (kernel.empty() || e.kernel == kernel);
  });
}

GemmTime Profile::cpu_gemm(const std::string& op) const {
  GemmTime g;
  for (const Event& e : events_)
    if (e.kind == EventKind::Kernel && e.cpu &&
        (e.name == op || (op == "matmul" && e.name == "addmm") || (op == "matmul_bf16" && e.name == "addmm_bf16")) &&
        e.flops >= 0)
      ++g.calls, g.flops += e.flops, g.ns += e.self_ns;
  return g;
}

double Profile::device_ms() const {
  int64_t ns = 0;
  for (const Event& e : events_)
    if (e.device_ns > 0) ns += e.device_ns;
  return static_cast<double>(ns) * 1e-6;
}

double Profile::device_wait_ms() const {
  int64_t ns = 0;
  for (const Event& e : events_)
    if (e.thread == 0 && e.kind == EventKind::Range && e.name == kDeviceWait) ns += e.duration_ns;
  return static_cast<double>(ns) * 1e-6;
}

double Profile::recorded_ms() const {
  int64_t ns = 0;
  for (const Event& e : events_)
    if (e.thread == 0) ns += e.self_ns;
  return static_cast<double>(ns) * 1e-6;
}

std::string Profile::table(size_t rows) const {
  const std::vector<OpStats> st = stats();
  int64_t self_all = 0;
  for (const OpStats& r : st) self_all += r.self_ns;
  // The device column only where a kernel ran on a device (a CPU profile's table is unchanged).
  const bool devices = std::any_of(st.begin(), st.end(), [](const OpStats& r) { return r.device_calls > 0; });
  std::string out = fmt::format("{:<40} {:>6} {:>8} {:>10} {:>7} {:>10} {:>10} {:>9} {:>10}", "name", "kind", "calls",
                                "self ms", "self %", "total ms", "avg us", "GFLOP/s", "alloc MB");
  out += devices ? fmt::format(" {:>10}\n", "device ms") : "\n";
  const size_t n = rows == 0 ? st.size() : std::min(rows, st.size());
  for (size_t i = 0; i < n; ++i) {
    const OpStats& r = st[i];
    const double self_ms = static_cast<double>(r.self_ns) * 1e-6;
    // GFLOP/s over the calls whose FLOPs are known (their share of the self time, assuming equal calls).
    std::string gflops = "";
    if (r.counted > 0 && r.self_ns > 0) {
      const double known_s =
          static_cast<double>(r.self_ns) * 1e-9 * static_cast<double>(r.counted) / static_cast<double>(r.calls);
      gflops = fmt::format("{:.1f}", r.flops / known_s * 1e-9);
    }
    out += fmt::format(
        "{:<40} {:>6} {:>8} {:>10.3f} {:>7.1f} {:>10.3f} {:>10.1f} {:>9} {:>10.2f}",
        r.name.size() > 40 ? r.name.substr(0, 37) + "..." : r.name, r.kind == EventKind::Kernel ? "kernel" : "range",
        r.calls, self_ms, self_all > 0 ? 100.0 * static_cast<double>(r.self_ns) / static_cast<double>(self_all) : 0.0,
        static_cast<double>(r.total_ns) * 1e-6, static_cast<double>(r.total_ns) * 1e-3 / static_cast<double>(r.calls),
        gflops, static_cast<double>(r.bytes) / (1 << 20));
    if (devices)
      out += r.device_calls > 0 ? fmt::format(" {:>10.3f}\n", static_cast<double>(r.device_ns) * 1e-6)
                                : fmt::format(" {:>10}\n", "");
    else
      out += "\n";
  }
  if (n < st.size()) out += fmt::format("... {} more rows\n", st.size() - n);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double recorded = recorded_ms(), wall = wall_ms();
  out += fmt::format(
      "wall {:.3f} ms; recorded {:.3f} ms ({:.1f} %) on the profiling thread, the rest ran outside any kernel or "
      "range\n"
      "peak live CPU tensor storage {:.2f} MB; process peak resident set {:.1f} MB\n",
      wall, recorded, wall > 0 ? 100 * recorded / wall : 0.0, static_cast<double>(peak_bytes_) / (1 << 20),
      static_cast<double>(ru.ru_maxrss) / 1024);
  if (devices) {
    // Host work: the profiling thread's recorded time less its waits; the device's busy time is the sum of its
    // kernels' (one stream: they do not overlap).
    const double dev = device_ms(), wait = device_wait_ms();
    out += fmt::format(
        "device: kernels ran {:.3f} ms ({:.1f} % of wall); the host waited for the device {:.3f} ms ({:.1f} %) and "
        "worked {:.3f} ms ({:.1f} %)\n",
        dev, wall > 0 ? 100 * dev / wall : 0.0, wait, wall > 0 ? 100 * wait / wall : 0.0, wall - wait,
        wall > 0 ? 100 * (wall - wait) / wall : 0.0);
  }
  if (const GemmTime g = cpu_gemm(); g.calls > 0 && g.ns > 0) {
    const CpuPeak& peak = cpu_peak();
    const double rate = g.flops / (static_cast<double>(g.ns) * 1e-9);
    out += fmt::format(
        "CPU GEMM ({} matmul kernels, {}): {:.3f} GFLOP in {:.3f} ms, {:.1f} GFLOP/s = {:.1f} % of the {}\n", g.calls,
        cpu_gemm_kernel(), g.flops * 1e-9, static_cast<double>(g.ns) * 1e-6, rate * 1e-9,
        peak.fp32_flops > 0 ? 100 * rate / peak.fp32_flops : 0.0, peak.describe());
  }
  return out;
}

void Profile::write_chrome_trace(const std::string& path) const {
  std::ostringstream f;  // written whole at the end (core/atomic_file.h)
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto sep = [&] {
    if (!first) f << ",\n";
    first = false;
  };
  for (const Event& e : events_) {
    sep();
    f << fmt::format(
        "{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": {:.3f}, \"pid\": 1, \"tid\": {}, "
        "\"args\": {{\"kernel\": \"{}\", \"bytes\": {}, \"self_us\": {:.3f}",
        json_escape(e.name), e.kind == EventKind::Kernel ? "kernel" : "range", static_cast<double>(e.start_ns) * 1e-3,
        static_cast<double>(e.duration_ns) * 1e-3, e.thread, json_escape(e.kernel), e.bytes,
        static_cast<double>(e.self_ns) * 1e-3);
    if (e.flops >= 0) f << fmt::format(", \"flops\": {:.0f}", e.flops);
    f << "}}";
    if (e.kind == EventKind::Kernel) {
      sep();
      f << fmt::format(
          "{{\"name\": \"CPU memory\", \"ph\": \"C\", \"ts\": {:.3f}, \"pid\": 1, \"tid\": {}, \"args\": {{\"MiB\": "
          "{:.3f}}}}}",
          static_cast<double>(e.start_ns + e.duration_ns) * 1e-3, e.thread,
          static_cast<double>(e.live_bytes) / (1 << 20));
    }
  }
  // Each device's kernels on a track of its own (tid 1000 + device), where the device ran them.
  std::map<int, bool> tracks;
  for (const Event& e : events_) {
    if (e.device_ns < 0 || e.device_start_ns < 0) continue;
    if (!tracks[e.device]) {
      tracks[e.device] = true;
      sep();
      f << fmt::format(
          "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"args\": {{\"name\": \"cuda:{}\"}}}}",
          1000 + e.device, e.device);
    }
    sep();
    f << fmt::format(
        "{{\"name\": \"{}\", \"cat\": \"device\", \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": {:.3f}, \"pid\": 1, "
        "\"tid\": {}, \"args\": {{\"kernel\": \"{}\"}}}}",
        json_escape(e.name), static_cast<double>(e.device_start_ns) * 1e-3, static_cast<double>(e.device_ns) * 1e-3,
        1000 + e.device, json_escape(e.kernel));
  }
  f << "\n]}\n";
  try {
    write_file_atomic(path, f.str());
  } catch (const Error& e) {
    ASC_THROW("profiler: cannot write the trace: {}", e.what());
  }
}

// ---- Range ------------------------------------------------------------------------------------------------------

Range::Range(const char* name) {
  if (detail::recording()) open_ = detail::begin(EventKind::Range, name);
}
Range::Range(std::string name) {
  if (detail::recording()) open_ = detail::begin(EventKind::Range, std::move(name));
}
Range::~Range() {
  if (open_) detail::end(-1);
}

}  // namespace asc::profiler
