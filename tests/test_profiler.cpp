// The op profiler (core/profiler.h): exact kernel counts and FLOPs for a known model, the bytes an op allocates,
// ranges and their self time, the table's total against the wall time, threads, the Chrome trace, and misuse.
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/profiler.h"
#include "models/flops.h"
#include "ops/flops.h"
#include "testing.h"

using namespace asc;
namespace prof = asc::profiler;

namespace {

int64_t count_kind(const prof::Profile& p, prof::EventKind kind) {
  int64_t n = 0;
  for (const auto& e : p.events()) n += e.kind == kind;
  return n;
}

}  // namespace

TEST_CASE("profiler: a 3-layer MLP's kernels are counted exactly, forward and backward, with the model's FLOPs") {
  Generator gen(3);
  auto mlp = nn::MLP(nn::MLPOptions({32, 64, 64, 10}));  // Linear, ReLU, Linear, ReLU, Linear
  const int64_t batch = 16;
  Tensor x = randn({batch, 32}, {}, &gen);
  {
    prof::Profile p;
    NoGradGuard ng;
    mlp.forward(x);
    p.stop();
    // one GEMM with its bias per layer (addmm), one ReLU between layers, no separate bias add
    CHECK(p.calls("addmm", "matmul_bias") == 3);
    CHECK(p.calls("matmul") == 0);
    CHECK(p.calls("add") == 0);
    CHECK(p.calls("relu") == 2);
    CHECK(count_kind(p, prof::EventKind::Range) == 0);  // no backward ran
    // The GEMMs' FLOPs, summed over the events, are the model counter's forward count (the same formula), and the
    // profile's GEMM time counts them.
    double gemm_flops = 0;
    for (const auto& e : p.events())
      if (e.name == "addmm") gemm_flops += e.flops;
    CHECK(gemm_flops == doctest::Approx(models::count_flops(mlp, 1).forward * batch).epsilon(1e-12));
    CHECK(p.cpu_gemm().calls == 3);
    CHECK(p.cpu_gemm().flops == doctest::Approx(gemm_flops).epsilon(1e-12));
  }
  {
    prof::Profile p;
    sum(mlp.forward(x)).backward();
    p.stop();
    // forward 3 GEMMs with their biases; backward: dW for each layer, dX for the two layers whose input needs a
    // gradient (x does not), and each bias's gradient as a sum over the rows
    CHECK(p.calls("addmm") == 3);
    CHECK(p.calls("matmul") == 3 + 2);
    CHECK(p.calls("sum") == 3 + 1);  // the biases' and the loss's
    CHECK(p.calls("relu", "unary") == 2);
    CHECK(p.calls("relu", "unary_backward") == 2);
    // one backward range per recorded node that ran: its kernels are its children
    int64_t matmul_ranges = 0;
    for (const auto& e : p.events())
      if (e.kind == prof::EventKind::Range && e.name == "addmm backward") {
        ++matmul_ranges;
        CHECK(e.self_ns >= 0);
        CHECK(e.self_ns <= e.duration_ns);
      }
    CHECK(matmul_ranges == 3);
    for (const auto& e : p.events())
      if (e.name == "matmul" && e.depth == 1) CHECK(e.flops > 0);  // backward GEMMs are counted too
  }
}

TEST_CASE("profiler: a kernel event carries the bytes its op allocated and the exact GEMM FLOPs") {
  Generator gen(5);
  const int64_t M = 48, K = 40, N = 72;
  Tensor a = randn({M, K}, {}, &gen), b = randn({K, N}, {}, &gen);
  prof::Profile p;
  Tensor c = matmul(a, b);
  p.stop();
  REQUIRE(p.events().size() == 1);
  const prof::Event& e = p.events()[0];
  CHECK(e.name == "matmul");
  CHECK(e.kernel == "matmul");
  CHECK(e.kind == prof::EventKind::Kernel);
  CHECK(e.flops == 2.0 * M * N * K);
  CHECK(e.flops == flops::gemm(1, M, N, K));
  CHECK(e.bytes == M * N * 4);  // the output, nothing else
  CHECK(e.thread == 0);
  CHECK(e.depth == 0);

  // A batched product counts every matrix.
  Tensor a3 = randn({3, M, K}, {}, &gen), b3 = randn({3, K, N}, {}, &gen);
  prof::Profile p3;
  matmul(a3, b3);
  p3.stop();
  REQUIRE(p3.calls("matmul") == 1);
  CHECK(p3.events()[0].flops == 3 * 2.0 * M * N * K);
}

TEST_CASE("profiler: the CPU GEMM time sums the matmul kernels, and the table states it against the fp32 peak") {
  Generator gen(6);
  Tensor a = randn({64, 32}, {}, &gen), b = randn({32, 16}, {}, &gen);
  prof::Profile p;
  for (int i = 0; i < 3; ++i) matmul(a, b);
  add(a, a);  // not a GEMM
  p.stop();
  const prof::GemmTime g = p.cpu_gemm();
  CHECK(g.calls == 3);
  CHECK(g.flops == 3 * flops::gemm(1, 64, 16, 32));
  int64_t ns = 0;
  for (const prof::Event& e : p.events())
    if (e.name == "matmul") ns += e.self_ns;
  CHECK(g.ns == ns);
  const std::string t = p.table();
  CHECK(t.find("CPU GEMM (3 matmul kernels") != std::string::npos);
  CHECK(t.find("of the fp32 peak") != std::string::npos);
  // no matrix product, no GEMM line
  prof::Profile q;
  add(a, a);
  q.stop();
  CHECK(q.cpu_gemm().calls == 0);
  CHECK(q.table().find("CPU GEMM") == std::string::npos);
}

TEST_CASE("profiler: attention kernels count 4 pairs D forward and twice that backward") {
  Generator gen(7);
  const int64_t B = 2, H = 3, T = 24, D = 16;
  Tensor q = randn({B, H, T, D}, {.requires_grad = true}, &gen), k = randn({B, H, T, D}, {.requires_grad = true}, &gen),
         v = randn({B, H, T, D}, {.requires_grad = true}, &gen);
  for (bool causal : {false, true}) {
    prof::Profile p;
    sum(scaled_dot_product_attention(q, k, v, {.causal = causal})).backward();
    p.stop();
    double fwd = -1, bwd = -1;
    for (const auto& e : p.events()) {
      if (e.kernel == "sdpa_forward") fwd = e.flops;
      if (e.kernel == "sdpa_backward") bwd = e.flops;
    }
    const double pairs = causal ? T * (T + 1) / 2.0 : double(T * T);  // the kept (query, key) pairs
    CHECK(fwd == 4.0 * B * H * pairs * D);
    CHECK(bwd == 2 * fwd);
  }
  CHECK(flops::causal_pairs(3, 5) == 3 + 4 + 5);  // query t sees keys s <= t + 2
  CHECK(flops::causal_pairs(5, 3) == 0 + 0 + 1 + 2 + 3);
}

TEST_CASE("profiler: ranges nest, and a range's self time is its time outside its children") {
  Generator gen(9);
  Tensor a = randn({64, 64}, {}, &gen);
  prof::Profile p;
  {
    prof::Range outer("outer");
    matmul(a, a);
    {
      prof::Range inner(std::string("inner"));
      matmul(a, a);
    }
  }
  p.stop();
  REQUIRE(p.events().size() == 4);
  const prof::Event *outer = nullptr, *inner = nullptr;
  int64_t children_of_outer = 0, children_of_inner = 0;
  for (const auto& e : p.events()) {
    if (e.name == "outer") outer = &e;
    if (e.name == "inner") inner = &e;
  }
  REQUIRE(outer);
  REQUIRE(inner);
  CHECK(outer->depth == 0);
  CHECK(inner->depth == 1);
  for (const auto& e : p.events()) {
    if (e.name != "matmul") continue;
    if (e.depth == 1) children_of_outer += e.duration_ns;
    if (e.depth == 2) children_of_inner += e.duration_ns;
  }
  CHECK(inner->self_ns == inner->duration_ns - children_of_inner);
  CHECK(outer->self_ns == outer->duration_ns - children_of_outer - inner->duration_ns);
  // Σ self over the profiling thread = the outermost range's duration
  CHECK(p.recorded_ms() == doctest::Approx(outer->duration_ns * 1e-6).epsilon(1e-9));
  CHECK(outer->bytes >= 2 * 64 * 64 * 4);  // a range counts everything allocated inside it
}

TEST_CASE("profiler: the recorded time accounts for the wall time of a kernel-bound loop") {
  // 1024³ GEMMs: the op's own work outside its kernel (checks, one allocation, freeing the last result — slow under
  // ASan, which poisons the 4 MB it frees) is a small share of milliseconds per product. At 512³ it reached 27 % of
  // the wall time under ASan on a fast AVX-512 machine.
  constexpr int64_t n = 1024;
  constexpr int reps = 4;
  Generator gen(11);
  Tensor a = randn({n, n}, {}, &gen), b = randn({n, n}, {}, &gen);
  matmul(a, b);  // warm-up
  prof::Profile p;
  for (int i = 0; i < reps; ++i) matmul(a, b);
  p.stop();
  CHECK(p.calls("matmul") == reps);
  CHECK(p.recorded_ms() <= p.wall_ms());
  CHECK(p.recorded_ms() >= 0.8 * p.wall_ms());
  const auto st = p.stats();
  REQUIRE(!st.empty());
  CHECK(st[0].name == "matmul");
  CHECK(st[0].calls == reps);
  CHECK(st[0].counted == reps);
  CHECK(st[0].flops == doctest::Approx(reps * 2.0 * n * n * n));
  const std::string table = p.table();
  CHECK(table.find("matmul") != std::string::npos);
  CHECK(table.find("wall") != std::string::npos);
  CHECK(table.find("peak live CPU tensor storage") != std::string::npos);
}

TEST_CASE("profiler: events from other threads get their own track; peak memory covers a freed tensor") {
  Generator gen(13);
  Tensor a = randn({32, 32}, {}, &gen);
  prof::Profile p;
  matmul(a, a);
  std::thread worker([&] { matmul(a, a); });
  worker.join();
  { Tensor big = zeros({4 << 20}); }  // 16 MiB, freed at once
  p.stop();
  std::set<int> threads;
  for (const auto& e : p.events()) threads.insert(e.thread);
  CHECK(threads == std::set<int>{0, 1});
  CHECK(p.peak_cpu_bytes() >= (16 << 20));
}

TEST_CASE("profiler: the Chrome trace is JSON with one complete event per recorded event") {
  Generator gen(15);
  Tensor x = randn({8, 8}, {.requires_grad = true}, &gen);
  prof::Profile p;
  {
    prof::Range r("step \"1\"\n");  // a name that must be escaped
    sum(relu(matmul(x, x))).backward();
  }
  p.stop();
  const auto path = std::filesystem::temp_directory_path() / "asc_test_profiler_trace.json";
  p.write_chrome_trace(path.string());
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  REQUIRE(j.contains("traceEvents"));
  int64_t complete = 0, counters = 0;
  bool found_range = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["ts"].get<double>() >= 0);
      found_range |= e["name"] == "step \"1\"\n";
    } else if (e["ph"] == "C") {
      ++counters;
    }
  }
  CHECK(complete == static_cast<int64_t>(p.events().size()));
  CHECK(counters == count_kind(p, prof::EventKind::Kernel));
  CHECK(found_range);
}

TEST_CASE("profiler: one profile at a time; nothing is recorded outside one; bad trace path") {
  Tensor a = ones({4, 4});
  prof::Profile p;
  CHECK_THROWS_WITH_AS(prof::Profile(), doctest::Contains("already recording"), asc::Error);
  matmul(a, a);
  p.stop();
  matmul(a, a);  // after stop: not recorded
  CHECK(p.events().size() == 1);
  CHECK(!p.recording());
  {
    prof::Range r("outside");  // no profile: a no-op
    matmul(a, a);
  }
  prof::Profile q;  // a new session after the first ended
  matmul(a, a);
  q.stop();
  CHECK(q.events().size() == 1);
  CHECK_THROWS_WITH_AS(q.write_chrome_trace("/nonexistent-dir/trace.json"), doctest::Contains("cannot write"),
                       asc::Error);
}

// On CUDA (the emulator in CI) every kernel event also gets its device time from CUDA events around its launches,
// the host's blocking waits are "device wait" ranges, and the table and the trace show both.
TEST_CASE("profiler: CUDA kernel events carry device time; the host's waits are ranges; each device has a track") {
  if (!testing::gpu_or_skip()) return;
  Generator gen(16);
  Tensor x = randn({64, 64}, {}, &gen).to(Device::cuda()).set_requires_grad(true);
  prof::Profile p;
  sum(relu(matmul(x, x))).backward();
  const double total = sum(x.grad()).item<double>();  // a copy to the host: the host waits
  p.stop();
  CHECK(std::isfinite(total));
  int64_t cuda_kernels = 0, timed = 0, waits = 0;
  for (const prof::Event& e : p.events()) {
    if (e.kind == prof::EventKind::Range && e.name == prof::kDeviceWait) ++waits;
    if (e.kind != prof::EventKind::Kernel) continue;
    CAPTURE(e.name);
    if (e.cpu) {
      CHECK(e.device == -1);
      CHECK(e.device_ns == -1);
      continue;
    }
    ++cuda_kernels;
    CHECK(e.device == 0);
    if (e.device_ns >= 0) {
      ++timed;
      CHECK(e.device_start_ns >= 0);
      CHECK(e.device_start_ns <= p.wall_ms() * 1e6);
    }
  }
  CHECK(cuda_kernels >= 5);      // matmul, relu, sum, their backward, and the last sum
  CHECK(timed == cuda_kernels);  // every CUDA kernel event was timed on the device
  CHECK(waits >= 1);             // the item() copy
  CHECK(p.device_wait_ms() >= 0);
  CHECK(p.device_ms() >= 0);
  const std::string table = p.table();
  CHECK(table.find("device ms") != std::string::npos);
  CHECK(table.find("device: kernels ran") != std::string::npos);
  CHECK(table.find(prof::kDeviceWait) != std::string::npos);
  const auto path = std::filesystem::temp_directory_path() / "asc_test_profiler_cuda_trace.json";
  p.write_chrome_trace(path.string());
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  int64_t device_events = 0;
  bool named = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "device") {
      ++device_events;
      CHECK(e["tid"] == 1000);
    }
    named |= e["ph"] == "M" && e["args"]["name"] == "cuda:0";
  }
  CHECK(device_events == timed);
  CHECK(named);
  // A CPU profile keeps the table it had: no device column.
  prof::Profile q;
  matmul(x.detach().to(Device::cpu()), x.detach().to(Device::cpu()));
  q.stop();
  CHECK(q.table().find("device ms") == std::string::npos);
}
