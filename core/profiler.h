#pragma once
// asc::profiler: where a program's time and memory go, op by op (like torch.profiler).
//
//   {
//     asc::profiler::Profile prof;              // records from here ...
//     for (int s = 0; s < 5; ++s) {
//       asc::profiler::Range step("train_step");  // a named scope of your own (torch's record_function)
//       train_step();
//     }
//     prof.stop();                              // ... to here (or the end of the scope)
//     std::cout << prof.table();                // ops sorted by self time: calls, self / total ms, GFLOP/s, MB
//     prof.write_chrome_trace("trace.json");    // open in https://ui.perfetto.dev or chrome://tracing
//   }
//
// What is recorded, on every thread that calls into the framework:
// - kernel events: every dispatch of an op's kernel (ops/dispatch.h: ASC_KERNEL), named after the op ("matmul",
//   "mul", "softmax", "adamw"). Kernels are leaves (they call no op), so an event's time is its own. Their FLOPs
//   where the op knows them (GEMMs, the attention kernels; counted as ops/flops.h counts), and the bytes of tensor
//   storage the calling thread allocated since the previous kernel event ended on it: the op's outputs and
//   temporaries, which the op allocates just before it dispatches (ops/dispatch.h states the rule).
// - range events: Range scopes, and the backward of each autograd node ("matmul backward"), with the kernels they
//   ran as children: a range's self time is its time outside its children (the glue: autograd, views, checks).
// - memory: the peak of live CPU tensor storage over the profile (core/allocator.h: cpu_memory_stats), and a
//   "CPU memory" counter track in the trace.
// - device time: a kernel event on a CUDA tensor also gets the time its kernels ran on the device (device_ns), from a
//   pair of CUDA events queued around its launches on the device's stream and read when the profile stops, and its
//   device start on the profile's clock (device_start_ns). The host's time stays what it measures there: the launch.
//   The CUDA backend records the host's blocking waits for the device (a stream synchronisation, a copy to the host)
//   as "device wait" ranges (kDeviceWait), so a step splits into host work, device work and waiting (the table's
//   last lines; the trace shows each device as a track of its own).
// Times are wall-clock: host times on the host's clock, device times from the device's event timer.
//
// Off (no Profile alive), each dispatch pays one relaxed atomic load and a predictable branch; built with
// -DASC_WITH_PROFILER=OFF, nothing (ASC_PROFILER_ENABLED is 0 and the hooks compile away). One Profile at a time
// per process; a second is an asc::Error.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#ifndef ASC_PROFILER_ENABLED
#define ASC_PROFILER_ENABLED 1
#endif

namespace asc::profiler {

enum class EventKind { Kernel, Range };

struct Event {
  std::string name;    // the op ("matmul"), or the range's name
  std::string kernel;  // kernel events: the backend kernel the op dispatched ("unary_backward"); else empty
  EventKind kind = EventKind::Kernel;
  int thread = 0;           // 0 for the thread that started the profile, then 1, 2, ... in order of first event
  int64_t start_ns = 0;     // since the profile started
  int64_t duration_ns = 0;  // wall time, children included
  int64_t self_ns = 0;      // duration minus the direct children's durations
  double flops = -1;        // -1: not known
  // tensor storage allocated: kernel, since the thread's previous kernel event (its first: since the profile began,
  // or on another thread since the event began); range, inside it
  int64_t bytes = 0;
  int64_t live_bytes = 0;  // live CPU tensor storage at the event's end
  int depth = 0;           // enclosing events on the same thread
  bool cpu = true;         // kernel events: the kernel ran on the CPU (a GPU kernel's event times its launch)
  int device = -1;         // kernel events on a CUDA tensor: the device's index; else -1
  // CUDA kernel events: the time the dispatch's kernels took on the device, from its start there to its end (-1:
  // not measured), and that start on the profile's clock (aligned at the device's first event of the profile).
  int64_t device_ns = -1, device_start_ns = -1;
};

// The name of the ranges in which the host blocked on a device (core/profiler.h, "device time").
inline constexpr const char* kDeviceWait = "device wait";

// The CPU's matrix products over a profile: the "matmul" kernel events on the CPU (linear layers and every op built
// on matmul dispatch it), their FLOPs and their time.
struct GemmTime {
  int64_t calls = 0;
  double flops = 0;
  int64_t ns = 0;
};

// One row of the table: the events of one name and kind.
struct OpStats {
  std::string name;  // the op, then the kernel in parentheses when its name differs: "exp (unary_backward)"
  EventKind kind = EventKind::Kernel;
  int64_t calls = 0;
  int64_t self_ns = 0, total_ns = 0;
  double flops = 0;     // of the calls whose FLOPs are known
  int64_t counted = 0;  // calls with known FLOPs
  int64_t bytes = 0;
  int64_t device_ns = 0;  // Σ device time of the calls that have one
  int64_t device_calls = 0;
};

class Profile {
 public:
  Profile();  // starts recording; an asc::Error if another Profile is recording
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  void stop();  // stops recording (the destructor does it too); the results stay readable
  bool recording() const { return recording_; }

  const std::vector<Event>& events() const { return events_; }
  // Aggregated by name and kind, sorted by self time (largest first).
  std::vector<OpStats> stats() const;
  // Σ over the CPU "matmul" kernel events (with addmm's: a product with a bias). Its rate ÷ cpu_peak().fp32_flops
  // (core/cpu_peak.h) is the GEMM efficiency the table's last line states. op "matmul_bf16" (with addmm_bf16's): the
  // products run in bfloat16 (core/autocast.h).
  GemmTime cpu_gemm(const std::string& op = "matmul") const;
  // Kernel events of the op `op` (any kernel), or of that op's kernel `kernel`.
  int64_t calls(const std::string& op, const std::string& kernel = "") const;

  double wall_ms() const { return static_cast<double>(wall_ns_) * 1e-6; }
  // Σ of every event's self time on the profile's first thread: the time its recorded scopes account for.
  double recorded_ms() const;
  // Σ of the device times of the CUDA kernel events (0 without any), and of the host's waits for a device: the
  // durations of the kDeviceWait ranges on the profile's first thread.
  double device_ms() const;
  double device_wait_ms() const;
  // Peak live CPU tensor storage during the profile, in bytes (blocks above 4 KiB, core/allocator.h).
  int64_t peak_cpu_bytes() const { return peak_bytes_; }

  // The table, `rows` rows (0: all), then the totals: wall time, recorded time, peak memory, and when the CPU ran
  // matrix products, their efficiency against the processor's fp32 peak.
  std::string table(size_t rows = 25) const;
  // Chrome trace-event JSON ("X" events, µs, one track per thread, plus the memory counter); an asc::Error naming the
  // file when it cannot be written.
  void write_chrome_trace(const std::string& path) const;

 private:
  bool recording_ = false;
  int64_t wall_ns_ = 0, peak_bytes_ = 0;
  std::vector<Event> events_;
};

// A named scope recorded as a range event while a Profile records (nothing otherwise).
class Range {
 public:
  explicit Range(const char* name);
  explicit Range(std::string name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool open_ = false;
};

namespace detail {
extern std::atomic<bool> g_recording;
inline bool recording() { return ASC_PROFILER_ENABLED && g_recording.load(std::memory_order_relaxed); }
bool begin(EventKind kind, std::string name, const char* kernel = "");  // false: not recording after all
// Closes the innermost open event of this thread; `cpu`: for a kernel event, whether the kernel ran on the CPU;
// `device` and `mark`: a CUDA kernel event's device and the device mark queued before its launches (or null).
void end(double flops, bool cpu = true, int device = -1, void* mark = nullptr);

// How a backend times work on its devices (the CUDA backend registers one as it loads): marks are events queued on
// a device's current stream, opaque here. Called only while a profile records, and to resolve its marks at stop.
struct DeviceTimer {
  void* (*mark)(int device, bool wait_first);  // null on failure; wait_first: the device is idle before it
  double (*elapsed_ms)(void* from, void* to);  // waits for `to`; -1 on failure
  void (*release)(void* mark);
};
void register_device_timer(const DeviceTimer* timer);
// A mark queued now on `device` (the profile's first on that device waits for the device first, so that the device's
// clock and the host's share an origin); null without a timer or when not recording.
void* device_mark(int device);
}  // namespace detail

// The event of one kernel dispatch (ASC_KERNEL); flops, if known, and the device set before it closes.
class KernelScope {
 public:
  KernelScope(const char* op, const char* kernel) {
    if (detail::recording()) [[unlikely]]
      open_ = detail::begin(EventKind::Kernel, op, kernel);
  }
  ~KernelScope() {
    if (open_) [[unlikely]]
      detail::end(flops_, cpu_, device_, mark_);
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
  bool open() const { return open_; }
  void set_flops(double flops) { flops_ = flops; }
  void set_cpu(bool cpu) { cpu_ = cpu; }
  // The kernel runs on CUDA device `index`: its device time is measured from a mark queued here, before the launch.
  void set_cuda_device(int index) {
    cpu_ = false, device_ = index;
    mark_ = detail::device_mark(index);
  }

 private:
  bool open_ = false;
  bool cpu_ = true;
  int device_ = -1;
  void* mark_ = nullptr;
  double flops_ = -1;
};

}  // namespace asc::profiler
