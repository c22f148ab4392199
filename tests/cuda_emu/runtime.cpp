// The CUDA emulator's runtime: devices, device memory, streams and events, and the kernel engine that runs every
// CUDA thread of a launch as a fibre (own stack), switching only at __syncthreads and warp operations.
// See tests/cuda_emu/include/cuda_runtime.h for the why and for what is checked.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "emulator.h"

struct CUstream_st {
  int device;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point when;
  bool recorded;
};

namespace asc::cuda::emu {

const Builtins* g_builtins = nullptr;

namespace {

// ---- configuration and per-thread state --------------------------------------------------------------------------

constexpr int kMaxDevices = 16;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxSharedBytes = 48 * 1024;

struct Config {
  int devices = 1;
  size_t memory = size_t{4096} << 20;
  bool reverse = false;
};

Config& config() {
  static Config c = [] {
    Config r;
    if (const char* v = std::getenv("ASC_CUDA_EMU_DEVICES")) r.devices = std::clamp(std::atoi(v), 0, kMaxDevices);
    if (const char* v = std::getenv("ASC_CUDA_EMU_MEMORY_MB")) r.memory = static_cast<size_t>(std::atoll(v)) << 20;
    if (const char* v = std::getenv("ASC_CUDA_EMU_ORDER")) r.reverse = std::string(v) == "reverse";
    return r;
  }();
  return c;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;
thread_local cudaError_t t_detail_code = cudaSuccess;
thread_local std::string t_detail;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// ---- device memory -------------------------------------------------------------------------------------------------
// Each allocation is its own mapping: a guard page, the accessible pages, a guard page. The user pointer is placed
// so that its (256-byte rounded) end meets the back guard page. Fresh memory is filled with 0xFF bytes (NaN in every
// float type, -1 in integers) so that a kernel reading memory nobody wrote is likely to show it.

struct Region {
  char* map;
  size_t map_len;
  char* access;
  size_t access_len;
  char* user;
  size_t user_len;
  int device;
};

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
std::map<uintptr_t, Region> g_regions;  // by map start
size_t g_used[kMaxDevices] = {};
int g_access_depth = 0;
bool g_in_kernel = false;
struct sigaction g_prev_segv {};

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

const Region* region_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_regions.upper_bound(a);
  if (it == g_regions.begin()) return nullptr;
  --it;
  const Region& r = it->second;
  return a < reinterpret_cast<uintptr_t>(r.map) + r.map_len ? &r : nullptr;
}

bool inside_user(const Region& r, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p), u = reinterpret_cast<uintptr_t>(r.user);
  return a >= u && a - u <= r.user_len && n <= r.user_len - (a - u);
}

void protect(const Region& r, bool open) {
  if (mprotect(r.access, r.access_len, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    std::perror("ascender CUDA emulator: mprotect");
    std::abort();
  }
}

std::string describe(const void* address, bool in_kernel) {
  const Region* r = region_of(address);
  if (!r) return {};
  const auto a = reinterpret_cast<uintptr_t>(address);
  const bool guard =
      a < reinterpret_cast<uintptr_t>(r->access) || a >= reinterpret_cast<uintptr_t>(r->access) + r->access_len;
  return format("invalid access to %p: %s the device allocation %p (%zu bytes, device %d)%s", address,
                guard ? "a guard page of" : "inside", static_cast<void*>(r->user), r->user_len, r->device,
                guard ? (in_kernel ? ": a kernel ran past the allocation" : ": an access past the allocation")
                      : (in_kernel ? "" : ": host code dereferenced a device pointer"));
}

// Names the device allocation a fault hit, then hands the signal to the previous handler (doctest reports the test).
void on_segv(int, siginfo_t* info, void*) {
  const std::string what = describe(info->si_addr, g_in_kernel);
  if (!what.empty()) {
    const std::string msg = "\nascender CUDA emulator: " + what + "\n";
    (void)!write(2, msg.data(), msg.size());
  }
  sigaction(SIGSEGV, &g_prev_segv, nullptr);  // returning re-runs the access under the previous handler
}

void install_segv_handler() {
  static const bool done = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    return true;
  }();
  (void)done;
}

// ---- streams and events --------------------------------------------------------------------------------------------

std::set<cudaStream_t> g_streams;
std::set<cudaEvent_t> g_events;
std::map<uintptr_t, size_t> g_pinned;  // pinned host blocks: start -> length
// Asynchronous copies touching pinned host memory, run at the next device operation (see cuda_runtime.h).
struct DeferredCopy {
  void* dst;
  const void* src;
  size_t count;
};
std::vector<DeferredCopy> g_deferred;

bool valid_stream(cudaStream_t s) {
  const auto v = reinterpret_cast<uintptr_t>(s);
  return v <= 2 || g_streams.count(s) > 0;  // 0: legacy default, 1: cudaStreamLegacy, 2: cudaStreamPerThread
}

// ---- fibre contexts ---------------------------------------------------------------------------------------------
// On x86-64 a switch saves the callee-saved registers on the old stack and swaps stack pointers (a few nanoseconds);
// elsewhere ucontext, whose swapcontext also saves the signal mask (a system call per switch, ~50x slower).

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
}  // namespace
}  // namespace asc::cuda::emu
// void asc_emu_switch(void** save_sp, void* load_sp): pushes rbp, rbx, r12-r15, stores rsp to *save_sp, loads
// load_sp, pops the same registers of the other context and returns into it.
asm(R"(
  .text
  .globl asc_emu_switch
  .type asc_emu_switch, @function
asc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size asc_emu_switch, .-asc_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
extern "C" void asc_emu_switch(void** save_sp, void* load_sp);
namespace asc::cuda::emu {
namespace {

// A fresh context whose first switch-in calls entry() (which must never return) on the given stack.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uintptr_t*>(top);
  *--slot = 0;                                   // entry's return address: none (rsp = 8 mod 16 at entry)
  *--slot = reinterpret_cast<uintptr_t>(entry);  // popped by asc_emu_switch's ret
  for (int i = 0; i < 6; ++i) *--slot = 0;       // rbp rbx r12-r15
  c.sp = slot;
}
void switch_context(Context& from, Context& to) { asc_emu_switch(&from.sp, to.sp); }
void init_contexts() {}
#else
struct Context {
  ucontext_t uc;
};
ucontext_t g_proto;
void init_contexts() { getcontext(&g_proto); }
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  c.uc = g_proto;
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- the kernel engine -----------------------------------------------------------------------------------------

enum class St : uint8_t { Ready, AtBlock, AtWarp, Done };
enum class WarpOp : uint8_t { Shuffle, Sync, Gather };

struct Fiber {
  Context ctx;
  Builtins b;
  St st;
  WarpOp op;
  unsigned mask;
  uint32_t seq;                      // warp operations completed
  uint64_t slot[2];                  // shuffle values, double-buffered by seq parity
  uint64_t gather[2][kGatherWords];  // warp_gather's words, double-buffered the same way
  int lin;                           // linear thread index in the block
};

constexpr size_t kStackBytes = 128 * 1024;

struct Engine {
  std::vector<Fiber> fibers;
  char* stacks = nullptr;
  Context sched;
  Fiber* cur = nullptr;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  std::string error;
  int nthreads = 0;
  bool active = false;
};

Engine& engine() {
  static Engine e;
  return e;
}

char* stack_of(Engine& E, int i) { return E.stacks + static_cast<size_t>(i) * (kStackBytes + kPage) + kPage; }

void ensure_stacks(Engine& E) {
  if (E.stacks) return;
  const size_t len = static_cast<size_t>(kMaxThreadsPerBlock) * (kStackBytes + kPage);
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("ascender CUDA emulator: fibre stacks");
    std::abort();
  }
  E.stacks = static_cast<char*>(m);
  for (int i = 0; i < kMaxThreadsPerBlock; ++i) mprotect(stack_of(E, i) - kPage, kPage, PROT_NONE);  // overflow guard
  E.fibers.resize(kMaxThreadsPerBlock);
  init_contexts();
}

std::string where(const Fiber& f) {
  return format("thread (%u,%u,%u) of block (%u,%u,%u)", f.b.thread_idx.x, f.b.thread_idx.y, f.b.thread_idx.z,
                f.b.block_idx.x, f.b.block_idx.y, f.b.block_idx.z);
}

void yield_to_scheduler() {
  Engine& E = engine();
  Fiber* f = E.cur;
  switch_context(f->ctx, E.sched);
}

[[noreturn]] void kernel_error(const std::string& msg) {
  Engine& E = engine();
  if (E.error.empty()) E.error = msg + " (" + where(*E.cur) + ")";
  E.cur->st = St::Done;
  yield_to_scheduler();
  std::abort();  // never resumed
}

Fiber& current_fiber(const char* what) {
  Engine& E = engine();
  if (!E.cur) {
    std::fprintf(stderr, "ascender CUDA emulator: %s called outside a kernel\n", what);
    std::abort();
  }
  return *E.cur;
}

void fiber_main() {
  Engine& E = engine();
  std::string err;
  try {
    E.body(E.ctx);
  } catch (const std::exception& ex) {
    err = std::string("the kernel threw: ") + ex.what();
  } catch (...) {
    err = "the kernel threw";
  }
  if (!err.empty()) kernel_error(err);
  E.cur->st = St::Done;
  yield_to_scheduler();
  std::abort();
}

// Lanes of warp w waiting at a warp operation are released once every lane their mask names is waiting at the same
// operation. Returns whether any lane was released; sets E.error on a mask naming an exited or missing lane.
bool release_warps(Engine& E) {
  bool released = false;
  const int n = E.nthreads;
  for (int base = 0; base < n; base += 32) {
    for (int l = 0; l < 32 && base + l < n; ++l) {
      const Fiber& f = E.fibers[base + l];
      if (f.st != St::AtWarp) continue;
      bool ready = true;
      for (int m = 0; m < 32; ++m) {
        if (!(f.mask >> m & 1u)) continue;
        if (base + m >= n) {
          E.error = format(
                        "warp operation with mask 0x%08x names lane %d, which does not exist (blockDim has %d "
                        "threads)",
                        f.mask, m, n) +
                    " (" + where(f) + ")";
          return false;
        }
        const Fiber& g = E.fibers[base + m];
        if (g.st == St::Done) {
          E.error = format("warp operation with mask 0x%08x waits for lane %d, which has exited", f.mask, m) + " (" +
                    where(f) + ")";
          return false;
        }
        if (g.st != St::AtWarp || g.mask != f.mask || g.op != f.op || g.seq != f.seq) ready = false;
      }
      if (!ready) continue;
      for (int m = 0; m < 32; ++m)
        if (f.mask >> m & 1u) E.fibers[base + m].st = St::Ready;
      released = true;
    }
  }
  return released;
}

// Runs one block to completion; false (with E.error) on a fault.
bool run_block(Engine& E, dim3 grid, dim3 block, uint3 bidx) {
  const int n = E.nthreads;
  for (int i = 0; i < n; ++i) {
    Fiber& f = E.fibers[i];
    const unsigned x = static_cast<unsigned>(i) % block.x, y = static_cast<unsigned>(i) / block.x % block.y,
                   z = static_cast<unsigned>(i) / (block.x * block.y);
    f.b = Builtins{uint3{x, y, z}, bidx, block, grid};
    f.st = St::Ready;
    f.seq = 0;
    f.lin = i;
    make_context(f.ctx, stack_of(E, i), kStackBytes, fiber_main);
  }
  const bool reverse = config().reverse;
  for (;;) {
    for (int k = 0; k < n; ++k) {
      Fiber& f = E.fibers[reverse ? n - 1 - k : k];
      if (f.st != St::Ready) continue;
      E.cur = &f;
      g_builtins = &f.b;
      switch_context(E.sched, f.ctx);
      E.cur = nullptr;
      g_builtins = nullptr;
      if (!E.error.empty()) return false;
    }
    int live = 0, at_block = 0, at_warp = 0, done = 0;
    for (int i = 0; i < n; ++i) {
      const St s = E.fibers[i].st;
      live += s != St::Done;
      at_block += s == St::AtBlock;
      at_warp += s == St::AtWarp;
      done += s == St::Done;
    }
    if (live == 0) return true;
    if (at_warp > 0) {
      if (release_warps(E)) continue;
      if (!E.error.empty()) return false;
    }
    if (at_block == live) {
      if (done > 0) {
        const Fiber* exited = nullptr;
        for (int i = 0; i < n && !exited; ++i)
          if (E.fibers[i].st == St::Done) exited = &E.fibers[i];
        E.error = format("__syncthreads() reached by %d threads while %d threads of the block have exited, e.g. ",
                         at_block, done) +
                  where(*exited) + " (undefined behaviour in CUDA: every thread of the block must reach it)";
        return false;
      }
      for (int i = 0; i < n; ++i) E.fibers[i].st = St::Ready;
      continue;
    }
    const Fiber* w = nullptr;
    for (int i = 0; i < n && !w; ++i)
      if (E.fibers[i].st == St::AtWarp) w = &E.fibers[i];
    E.error = format("deadlock: %d threads wait at __syncthreads(), %d at warp operations, %d have exited", at_block,
                     at_warp, done);
    if (w) E.error += format("; e.g. a warp operation with mask 0x%08x in ", w->mask) + where(*w);
    return false;
  }
}

}  // namespace

// ---- entry points of the engine (declared in cuda_runtime.h) -------------------------------------------------------

std::recursive_mutex& device_mutex() {
  static std::recursive_mutex m;
  return m;
}

DeviceAccess::DeviceAccess() {
  if (g_access_depth++ == 0) {
    for (const auto& [k, r] : g_regions) protect(r, true);
    // Queued asynchronous copies complete before any later device operation.
    for (const DeferredCopy& c : g_deferred) std::memmove(c.dst, c.src, c.count);
    g_deferred.clear();
  }
}
DeviceAccess::~DeviceAccess() {
  if (--g_access_depth == 0)
    for (const auto& [k, r] : g_regions) protect(r, false);
}

void flush_deferred() {
  if (!g_deferred.empty()) DeviceAccess access;
}

bool pinned_range(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

bool device_range_ok(const void* p, size_t bytes, const char* what, std::string* why) {
  const Region* r = region_of(p);
  if (r && inside_user(*r, p, bytes) && r->device == t_device) return true;
  if (why) {
    if (!r) {
      *why = format("%s %p is not device memory", what, p);
    } else if (!inside_user(*r, p, bytes)) {
      *why = format("%s [%p, +%zu bytes) runs outside its device allocation [%p, +%zu bytes)", what, p, bytes,
                    static_cast<void*>(r->user), r->user_len);
    } else {
      *why = format(
          "%s %p is memory of device %d, but device %d is current: the operation would be ordered on "
          "device %d's stream only (make device %d current; between devices use cudaMemcpyPeer)",
          what, p, r->device, t_device, t_device, r->device);
    }
  }
  return false;
}

bool is_device_pointer(const void* p) { return region_of(p) != nullptr; }

cudaError_t fail(cudaError_t error, const std::string& detail) {
  t_last = error;
  t_detail_code = error;
  t_detail = detail;
  return error;
}

// cudaSuccess when `s` exists and belongs to the current device (the legacy and per-thread default streams always
// do); else the error, with `call` in its description.
cudaError_t check_stream(cudaStream_t s, const char* call) {
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, format("%s on a stream that does not exist", call));
  const int device = reinterpret_cast<uintptr_t>(s) <= 2 ? t_device : s->device;
  if (device != t_device)
    return fail(cudaErrorInvalidResourceHandle,
                format("%s on a stream of device %d while device %d is current", call, device, t_device));
  return cudaSuccess;
}

cudaError_t launch_grid(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void (*body)(void*), void* ctx,
                        const void* const* pointers, int count) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  Engine& E = engine();
  if (config().devices == 0) return fail(cudaErrorNoDevice, "no CUDA device (ASC_CUDA_EMU_DEVICES=0)");
  if (E.active) return fail(cudaErrorNotSupported, "kernel launched from inside a kernel");
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || threads > kMaxThreadsPerBlock || block.x > 1024 ||
      block.y > 1024 || block.z > 64)
    return fail(cudaErrorInvalidConfiguration,
                format("invalid configuration argument: blockDim (%u, %u, %u) (at most 1024 threads, z <= 64)", block.x,
                       block.y, block.z));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return fail(cudaErrorInvalidConfiguration,
                format("invalid configuration argument: gridDim (%u, %u, %u)", grid.x, grid.y, grid.z));
  if (shared_bytes > kMaxSharedBytes)
    return fail(cudaErrorInvalidValue,
                format("%zu bytes of dynamic shared memory (at most %zu)", shared_bytes, kMaxSharedBytes));
  if (cudaError_t e = check_stream(stream, "launch"); e != cudaSuccess) return e;
  for (int i = 0; i < count; ++i) {
    const void* p = pointers[i];
    if (!p) continue;
    const Region* r = region_of(p);
    if (!r)
      return fail(cudaErrorIllegalAddress,
                  format("kernel argument %d (%p) is not device memory (a host pointer, or a freed allocation)", i, p));
    if (r->device != t_device)
      return fail(cudaErrorIllegalAddress, format("kernel argument %d (%p) is memory of device %d, but the kernel "
                                                  "runs on device %d",
                                                  i, p, r->device, t_device));
  }

  ensure_stacks(E);
  E.nthreads = static_cast<int>(threads);
  E.body = body;
  E.ctx = ctx;
  E.error.clear();
  E.active = true;
  DeviceAccess access;
  g_in_kernel = true;
  bool ok = true;
  uint3 bidx{};
  for (bidx.z = 0; ok && bidx.z < grid.z; ++bidx.z)
    for (bidx.y = 0; ok && bidx.y < grid.y; ++bidx.y)
      for (bidx.x = 0; ok && bidx.x < grid.x; ++bidx.x) ok = run_block(E, grid, block, bidx);
  g_in_kernel = false;
  E.active = false;
  if (ok) return cudaSuccess;
  const std::string detail = format("kernel fault (gridDim (%u,%u,%u), blockDim (%u,%u,%u)): ", grid.x, grid.y, grid.z,
                                    block.x, block.y, block.z) +
                             E.error;
  std::fprintf(stderr, "ascender CUDA emulator: %s\n", detail.c_str());
  return fail(cudaErrorLaunchFailure, detail);
}

void block_barrier() {
  Fiber& f = current_fiber("__syncthreads");
  f.st = St::AtBlock;
  yield_to_scheduler();
}

void warp_barrier(unsigned mask) {
  Fiber& f = current_fiber("__syncwarp");
  const int lane = f.lin & 31;
  if (!(mask >> lane & 1u)) kernel_error(format("__syncwarp(0x%08x) does not name the calling lane %d", mask, lane));
  f.mask = mask;
  f.op = WarpOp::Sync;
  f.st = St::AtWarp;
  yield_to_scheduler();
  ++f.seq;
}

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane) {
  Fiber& f = current_fiber("a warp shuffle");
  Engine& E = engine();
  const int lane = f.lin & 31;
  if (!(mask >> lane & 1u))
    kernel_error(format("shuffle with mask 0x%08x does not name the calling lane %d", mask, lane));
  f.slot[f.seq & 1u] = bits;
  f.mask = mask;
  f.op = WarpOp::Shuffle;
  f.st = St::AtWarp;
  yield_to_scheduler();
  uint64_t r = bits;
  if (src_lane >= 0) {
    if (!(mask >> src_lane & 1u))
      kernel_error(format("shuffle reads lane %d, which its mask 0x%08x does not name", src_lane, mask));
    r = E.fibers[(f.lin & ~31) + src_lane].slot[f.seq & 1u];
  }
  ++f.seq;
  return r;
}

void warp_gather(unsigned mask, const uint64_t* mine, int words, uint64_t* all) {
  Fiber& f = current_fiber("a warp-collective instruction");
  Engine& E = engine();
  const int lane = f.lin & 31;
  if (words < 1 || words > kGatherWords) kernel_error(format("warp_gather of %d words (1 to %d)", words, kGatherWords));
  if (!(mask >> lane & 1u))
    kernel_error(format("warp-collective instruction with mask 0x%08x does not name the calling lane %d", mask, lane));
  std::memcpy(f.gather[f.seq & 1u], mine, sizeof(uint64_t) * words);
  f.mask = mask;
  f.op = WarpOp::Gather;
  f.st = St::AtWarp;
  yield_to_scheduler();
  // Every lane of the mask is released together and none can pass its next warp operation before this lane reaches
  // it, so the other lanes' buffer of this parity still holds what they passed.
  for (int m = 0; m < 32; ++m) {
    uint64_t* out = all + m * words;
    if (mask >> m & 1u)
      std::memcpy(out, E.fibers[(f.lin & ~31) + m].gather[f.seq & 1u], sizeof(uint64_t) * words);
    else
      std::memset(out, 0, sizeof(uint64_t) * words);
  }
  ++f.seq;
}

int lane_id() { return current_fiber("lane_id").lin & 31; }

void set_reverse_thread_order(bool reverse) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  config().reverse = reverse;
}

std::string describe_address(const void* address, bool in_kernel) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  return describe(address, in_kernel);
}

}  // namespace asc::cuda::emu

// ---- the CUDA runtime API ----------------------------------------------------------------------------------------

using namespace asc::cuda::emu;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return record(cudaErrorInvalidValue);
  *count = config().devices;
  return config().devices > 0 ? cudaSuccess : record(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return record(cudaErrorInvalidValue);
  if (config().devices == 0) return record(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= config().devices) return record(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return record(cudaErrorInvalidValue);
  if (device < 0 || device >= config().devices) return record(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "ascender CUDA emulator (CPU)");
  prop->totalGlobalMem = config().memory;
  prop->sharedMemPerBlock = kMaxSharedBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->major = 9, prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return record(cudaErrorInvalidValue);
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMemoryClockRate: *value = 1000000; break;  // nominal: the emulator has no memory bandwidth
    case cudaDevAttrGlobalMemoryBusWidth: *value = 64; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    default: return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (config().devices == 0) return record(cudaErrorNoDevice);
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  flush_deferred();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!free_bytes || !total_bytes) return record(cudaErrorInvalidValue);
  *total_bytes = config().memory;
  *free_bytes = config().memory - g_used[t_device];
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return t_last; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == t_detail_code && !t_detail.empty()) return t_detail.c_str();
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return cudaGetErrorName(error);
  }
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return record(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (config().devices == 0) return record(cudaErrorNoDevice);
  if (size == 0) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  install_segv_handler();
  const int dev = t_device;
  if (size > config().memory - g_used[dev]) return record(cudaErrorMemoryAllocation);
  const size_t access_len = round_up(size, kPage), map_len = access_len + 2 * kPage;
  void* m = mmap(nullptr, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return record(cudaErrorMemoryAllocation);
  Region r;
  r.map = static_cast<char*>(m);
  r.map_len = map_len;
  r.access = r.map + kPage;
  r.access_len = access_len;
  r.user = r.access + access_len - round_up(size, 256);
  r.user_len = size;
  r.device = dev;
  protect(r, true);
  std::memset(r.access, 0xFF, r.access_len);
  if (g_access_depth == 0) protect(r, false);
  g_regions.emplace(reinterpret_cast<uintptr_t>(r.map), r);
  g_used[dev] += size;
  *ptr = r.user;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  flush_deferred();
  const Region* r = region_of(ptr);
  if (!r || r->user != ptr)
    return fail(cudaErrorInvalidDevicePointer, format("cudaFree(%p): not a pointer cudaMalloc returned", ptr));
  g_used[r->device] -= r->user_len;
  const Region copy = *r;
  g_regions.erase(reinterpret_cast<uintptr_t>(copy.map));
  munmap(copy.map, copy.map_len);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned flags) {
  if (!ptr || flags > (cudaHostAllocPortable | cudaHostAllocDefault)) return record(cudaErrorInvalidValue);
  *ptr = size ? std::aligned_alloc(256, round_up(size, 256)) : nullptr;
  if (!*ptr) return size ? record(cudaErrorMemoryAllocation) : cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  g_pinned[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }
cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  flush_deferred();
  if (!g_pinned.erase(reinterpret_cast<uintptr_t>(ptr)))
    return fail(cudaErrorInvalidValue, format("cudaFreeHost(%p): not a pointer cudaHostAlloc returned", ptr));
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue, "cudaMemcpy with a null pointer");
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  const Region* rd = region_of(dst);
  const Region* rs = region_of(src);
  std::string why;
  if (rd && !device_range_ok(dst, count, "cudaMemcpy destination", &why)) return fail(cudaErrorInvalidValue, why);
  if (rs && !device_range_ok(src, count, "cudaMemcpy source", &why)) return fail(cudaErrorInvalidValue, why);
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToHost && !rs && !rd) ||
                  (kind == cudaMemcpyHostToDevice && !rs && rd) || (kind == cudaMemcpyDeviceToHost && rs && !rd) ||
                  (kind == cudaMemcpyDeviceToDevice && rs && rd);
  if (!ok)
    return fail(cudaErrorInvalidMemcpyDirection,
                format("cudaMemcpy kind %d contradicts the pointers (source on %s, destination on %s)",
                       static_cast<int>(kind), rs ? "device" : "host", rd ? "device" : "host"));
  DeviceAccess access;
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (cudaError_t e = check_stream(stream, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  // Between pinned host memory and the device the copy is truly asynchronous: check it now, run it later.
  // (From pageable memory CUDA stages the source before returning, so it runs at once.)
  const bool h2d = pinned_range(src, count) && region_of(dst);
  const bool d2h = pinned_range(dst, count) && region_of(src);
  if (count == 0 || !(h2d || d2h)) return cudaMemcpy(dst, src, count, kind);
  std::string why;
  if (!device_range_ok(h2d ? dst : src, count, h2d ? "cudaMemcpyAsync destination" : "cudaMemcpyAsync source", &why))
    return fail(cudaErrorInvalidValue, why);
  if (kind != cudaMemcpyDefault && kind != (h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost))
    return fail(cudaErrorInvalidMemcpyDirection,
                format("cudaMemcpyAsync kind %d contradicts the pointers", static_cast<int>(kind)));
  g_deferred.push_back({dst, src, count});
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return record(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  *attributes = cudaPointerAttributes{cudaMemoryTypeUnregistered, -1, nullptr, nullptr};
  if (const Region* r = region_of(ptr); r && inside_user(*r, ptr, 0)) {
    *attributes = {cudaMemoryTypeDevice, r->device, const_cast<void*>(ptr), nullptr};
  } else if (pinned_range(ptr, 1)) {
    *attributes = {cudaMemoryTypeHost, t_device, const_cast<void*>(ptr), const_cast<void*>(ptr)};
  }
  return cudaSuccess;
}

// Device -> device between two devices: each pointer is checked against the device named for it.
cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!valid_stream(stream))
    return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyPeerAsync on a stream that does not exist");
  const int n = config().devices;
  if (dstDevice < 0 || dstDevice >= n || srcDevice < 0 || srcDevice >= n) return record(cudaErrorInvalidDevice);
  const Region* rd = region_of(dst);
  const Region* rs = region_of(src);
  if (!rd || !inside_user(*rd, dst, count) || rd->device != dstDevice || !rs || !inside_user(*rs, src, count) ||
      rs->device != srcDevice)
    return fail(cudaErrorInvalidValue,
                format("cudaMemcpyPeer: destination %p (+%zu bytes) must lie in an allocation of device %d and "
                       "source %p in one of device %d",
                       dst, count, dstDevice, src, srcDevice));
  DeviceAccess access;
  std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeer(void* dst, int dstDevice, const void* src, int srcDevice, size_t count) {
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, nullptr);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  std::string why;
  if (!device_range_ok(ptr, count, "cudaMemset destination", &why)) return fail(cudaErrorInvalidValue, why);
  DeviceAccess access;
  std::memset(ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    if (cudaError_t e = check_stream(stream, "cudaMemsetAsync"); e != cudaSuccess) return e;
  }
  return cudaMemset(ptr, value, count);
}

// Work runs when it is queued, so every stream is always idle.
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (!stream) return record(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  *stream = new CUstream_st{t_device};
  g_streams.insert(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!g_streams.erase(stream)) return record(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  flush_deferred();
  return valid_stream(stream) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return cudaStreamQuery(stream); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (flags & ~cudaEventDisableTiming) return record(cudaErrorInvalidValue);
  return cudaEventCreate(event);
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (!event) return record(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  *event = new CUevent_st{{}, false};
  g_events.insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!g_events.erase(event)) return record(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!g_events.count(event) || !valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  event->when = std::chrono::steady_clock::now();
  event->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  flush_deferred();
  return g_events.count(event) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  if (!ms || !g_events.count(start) || !g_events.count(end)) return record(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return record(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
