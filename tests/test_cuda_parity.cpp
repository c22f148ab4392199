// CUDA vs CPU parity, in the style of ggml's test-backend-ops: the op table's cases (tests/op_table.h), each an op
// called through its public asc:: function on random inputs (contiguous, transposed, strided-sliced and broadcast), in
// float32 and float64 (then bfloat16 / float16 where the case allows). Each case runs on the CPU, then on the same
// inputs moved to the GPU; outputs are compared, then gradients: backward of sum(out * cotangent) with the same random
// cotangent on both sides, compared per input. Tolerances depend on the dtype. Every case is attempted and reported (a
// missing kernel fails with its "no CUDA kernel yet" error; the suite then goes on), and each family ends with a
// summary of what passed.
//
// Without a CUDA device every GPU case prints "no CUDA device: skipped" and returns. With ASC_REQUIRE_GPU=1 in the
// environment (tools/gpu_check.sh sets it) a missing device is a failure instead, so a GPU run cannot silently
// skip. The last cases run on every machine: dispatch errors for CUDA tensors without a GPU.
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ascender.h"
#include "cuda/cuda.h"
#include "op_table.h"
#include "testing.h"
#ifdef ASC_HAVE_CUDA
#include "ops/kernels.h"
#endif

using namespace asc;

namespace {

bool gpu_required() {
  const char* v = std::getenv("ASC_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

// The device the GPU side runs on: cuda:0, or cuda:N with ASC_PARITY_DEVICE=N (the suite then runs on a device
// that is not the current one, so every op must switch to its tensors' device; in the CUDA emulator a kernel given
// another device's memory is an error).
Device gpu() {
  static const Device d = [] {
    const char* v = std::getenv("ASC_PARITY_DEVICE");
    return Device::cuda(v ? std::atoi(v) : 0);
  }();
  return d;
}

// The guard every GPU case starts with.
#define ASC_GPU_GUARD()                                                              \
  do {                                                                               \
    if (!asc::cuda::is_available()) {                                                \
      if (gpu_required()) FAIL("ASC_REQUIRE_GPU=1 but no CUDA device is available"); \
      MESSAGE("no CUDA device: skipped");                                            \
      return;                                                                        \
    }                                                                                \
  } while (0)

using Case = optable::OpCase;
using optable::In;
using optable::View;

const char* view_name(View v) {
  switch (v) {
    case View::Contig: return "contig";
    case View::Transposed: return "transposed";
    case View::Sliced: return "sliced";
  }
  return "?";
}

using optable::is_float_input;
using optable::make_leaf;
using optable::view_of;

struct Tol {
  double atol, rtol;
};
// 16-bit: 8 (bfloat16) / 11 (float16) significant bits, a few roundings deep, and sums that cancel: about 8 units of
// the last place, relative to the terms rather than the result.
Tol tol_for(DType dt) {
  switch (dt) {
    case kFloat64: return {1e-10, 1e-9};
    case kBFloat16: return {3e-2, 3e-2};
    case kFloat16: return {6e-3, 6e-3};
    default: return {2e-5, 2e-4};
  }
}

// First mismatch between a (from CUDA, moved back) and b (CPU), or "" when they agree.
std::string compare(const Tensor& a, const Tensor& b, Tol tol) {
  if (a.defined() != b.defined()) return "one side undefined";
  if (!a.defined()) return "";
  if (a.shape() != b.shape()) return fmt::format("shape {} vs CPU {}", a.shape(), b.shape());
  if (a.dtype() != b.dtype()) return fmt::format("dtype {} vs CPU {}", a.dtype(), b.dtype());
  if (a.dtype() == kInt64 || a.dtype() == kBool) {
    auto va = a.to(kInt64).to_vector<int64_t>(), vb = b.to(kInt64).to_vector<int64_t>();
    for (size_t i = 0; i < va.size(); ++i)
      if (va[i] != vb[i]) return fmt::format("element {}: {} vs CPU {}", i, va[i], vb[i]);
    return "";
  }
  auto va = a.to(kFloat64).to_vector<double>(), vb = b.to(kFloat64).to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    const double x = va[i], y = vb[i];
    const bool ok = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y) ||
                    std::abs(x - y) <= tol.atol + tol.rtol * std::abs(y);
    if (!ok) return fmt::format("element {}: {} vs CPU {}", i, x, y);
  }
  return "";
}

// Backpropagates loss = sum_k sum(out_k * cot_k) over the differentiable outputs on both sides with the same random
// cotangents (on the GPU in `half` when given, the CPU then taking the rounded values back), and compares the
// leaves' gradients. Returns "" when they agree.
std::string compare_gradients(const TensorList& out_cpu, const TensorList& out_gpu,
                              const std::vector<Tensor>& leaves_cpu, const std::vector<Tensor>& leaves_gpu,
                              std::optional<DType> half, Generator& gen, Tol tol) {
  Tensor loss_cpu, loss_gpu;
  for (size_t k = 0; k < out_cpu.size(); ++k) {
    if (!out_cpu[k].defined() || !out_cpu[k].requires_grad()) continue;
    Tensor cot = randn(out_cpu[k].shape(), {.dtype = out_cpu[k].dtype()}, &gen);
    try {
      Tensor cot_g = cot.to(gpu()).to(half.value_or(cot.dtype()));
      if (half) cot = cot_g.to(cot.dtype()).cpu();
      Tensor lg = sum(mul(out_gpu[k], cot_g));
      loss_gpu = loss_gpu.defined() ? add(loss_gpu, lg) : lg;
    } catch (const Error& e) {
      return fmt::format("loss: {}", e.what());
    }
    Tensor lc = sum(mul(out_cpu[k], cot));
    loss_cpu = loss_cpu.defined() ? add(loss_cpu, lc) : lc;
  }
  if (!loss_cpu.defined()) return "";
  loss_cpu.backward();
  try {
    loss_gpu.backward();
  } catch (const Error& e) {
    return fmt::format("backward: {}", e.what());
  }
  for (size_t i = 0; i < leaves_cpu.size(); ++i) {
    if (!leaves_cpu[i].requires_grad()) continue;
    Tensor gc = leaves_cpu[i].grad(), gg = leaves_gpu[i].grad();
    if (!gc.defined() && !gg.defined()) continue;
    if (!gg.defined()) return fmt::format("input {}: no gradient on the GPU", i);
    if (!gc.defined()) return fmt::format("input {}: gradient on the GPU only", i);
    // 16-bit: a backward's rounding errors scale with the largest terms it sums, not with each element's own size
    // (a gradient element near 0 is a difference of terms as large as the rest), so atol scales with max |gradient|
    Tol t = tol;
    if (half) t.atol *= std::max(1.0, amax(abs(gc)).item<double>());
    std::string m = compare(half ? gg.to(gc.dtype()).cpu() : gg.cpu(), gc, t);
    if (!m.empty()) return fmt::format("grad of input {}: {} (atol {:.3g})", i, m, t.atol);
  }
  return "";
}

// Runs one (case, dtype, view); returns "" on success or what went wrong.
// 16-bit dtypes: the GPU runs in that dtype, the CPU (which has no 16-bit kernels) in float32 on the very same
// 16-bit-rounded inputs and cotangents; the GPU rounds its outputs (and, in composite ops, intermediates) to 16 bits,
// hence tol_for's wider tolerances.
// cpu_only: just the CPU half (forward and backward), to validate the table on machines without a GPU.
std::string run_one(const Case& c, DType dt, View view, uint64_t seed, bool cpu_only = false) {
  Generator gen(seed);
  const bool half = is_reduced_float(dt);
  std::vector<Tensor> leaves_cpu, leaves_gpu;
  TensorList args_cpu, args_gpu;
  bool float_input = false;
  for (const In& in : c.inputs) {
    Tensor leaf = make_leaf(in, view, half ? kFloat32 : dt, gen);
    const bool fl = is_float_input(in), grad = c.backward && in.grad && fl;
    float_input = float_input || fl;
    Tensor lc, lg;
    if (cpu_only) {
      lc = leaf.detach(), lg = leaf.detach().clone();
    } else if (half && fl) {
      lg = leaf.to(gpu()).to(dt).detach();
      lc = lg.to(kFloat32).cpu().detach();
    } else {
      lc = leaf.detach(), lg = leaf.detach().to(gpu());
    }
    if (grad) {
      lc.set_requires_grad(true);
      lg.set_requires_grad(true);
    }
    leaves_cpu.push_back(lc);
    leaves_gpu.push_back(lg);
    args_cpu.push_back(view_of(lc, in, view));
    args_gpu.push_back(view_of(lg, in, view));
  }
  TensorList out_cpu = c.fn(args_cpu);
  if (cpu_only) {
    Tensor loss;
    for (const Tensor& o : out_cpu)
      if (c.backward && o.defined() && o.requires_grad()) loss = loss.defined() ? add(loss, sum(o)) : sum(o);
    if (loss.defined()) loss.backward();
    return "";
  }
  TensorList out_gpu;
  try {
    out_gpu = c.fn(args_gpu);
  } catch (const Error& e) {
    return fmt::format("forward: {}", e.what());
  }
  const Tol tol = tol_for(dt);
  if (out_cpu.size() != out_gpu.size()) return "different number of outputs";
  for (size_t k = 0; k < out_cpu.size(); ++k) {
    if (!out_gpu[k].defined() || !out_cpu[k].defined()) continue;
    if (!(out_gpu[k].device() == gpu())) return fmt::format("output {} is not on the GPU", k);
    const bool float_out = is_floating(out_cpu[k].dtype());
    if (half && float_input && float_out && out_gpu[k].dtype() != dt)
      return fmt::format("output {} is {}, not {}", k, out_gpu[k].dtype(), dt);
    std::string m = compare(half && float_out ? out_gpu[k].to(kFloat32).cpu() : out_gpu[k].cpu(), out_cpu[k], tol);
    if (!m.empty()) return fmt::format("output {}: {}", k, m);
  }
  if (!c.backward) return "";
  return compare_gradients(out_cpu, out_gpu, leaves_cpu, leaves_gpu, half ? std::optional<DType>(dt) : std::nullopt,
                           gen, tol);
}

// Runs every case of a family in float32 and float64 and every view; reports each failure and a summary.
// Without a GPU only the CPU half runs (so the table itself is checked on every machine), then it reports the skip.
void run_family(const char* family, const std::vector<Case>& cases) {
  if (!asc::cuda::is_available()) {
    if (gpu_required()) FAIL("ASC_REQUIRE_GPU=1 but no CUDA device is available");
    int n = 0;
    for (const Case& c : cases)
      for (DType dt : {kFloat32, kFloat64})
        for (View v : c.views) {
          CAPTURE(c.op);
          INFO("view: " << view_name(v));  // CAPTURE of a const char* would print the pointer
          CHECK_NOTHROW(run_one(c, dt, v, 1, /*cpu_only=*/true));
          ++n;
        }
    MESSAGE(fmt::format("no CUDA device: skipped ({}: the CPU side of {} runs checked)", family, n));
    return;
  }
  if (gpu().index >= asc::cuda::device_count())
    FAIL("ASC_PARITY_DEVICE=" << gpu().index << " but only " << asc::cuda::device_count() << " CUDA devices exist");
  const size_t dev0_before = asc::cuda::memory_stats(0).allocated;
  std::map<std::string, std::string> first_failure;  // op (+ " (16-bit)") -> first error
  // Each run's inputs are drawn from a seed of its own (op, dtype, view), so that adding an entry to the table does not
  // redraw every later entry's inputs.
  auto seed_of = [](const std::string& op, DType dt, View v) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : fmt::format("{}|{}|{}", op, dtype_name(dt), view_name(v))) h = (h ^ ch) * 1099511628211ull;
    return h;
  };
  // The whole table in float32 / float64, then again in bfloat16 / float16.
  auto run_dtypes = [&](std::initializer_list<DType> dtypes, const char* tag, int& passed, int& failed) {
    for (const Case& c : cases) {
      for (DType dt : dtypes) {
        if (is_reduced_float(dt) && !c.half) continue;  // a selection or threshold that 16-bit rounding moves
        for (View v : c.views) {
          std::string err;
          try {
            err = run_one(c, dt, v, seed_of(c.op, dt, v));
          } catch (const Error& e) {
            err = fmt::format("CPU reference failed: {}", e.what());
          }
          if (err.empty()) {
            ++passed;
          } else {
            ++failed;
            std::string what = fmt::format("{} [{} {}]: {}", c.op, dtype_name(dt), view_name(v), err);
            first_failure.emplace(c.op + tag, what);
            FAIL_CHECK(what);
          }
        }
      }
    }
  };
  int passed = 0, failed = 0, half_passed = 0, half_failed = 0;
  run_dtypes({kFloat32, kFloat64}, "", passed, failed);
  run_dtypes({kBFloat16, kFloat16}, " (16-bit)", half_passed, half_failed);
  // Work on another device allocates nothing on cuda:0 (every output and scratch buffer lives with its inputs).
  if (gpu().index != 0) CHECK(asc::cuda::memory_stats(0).allocated == dev0_before);
  std::string summary = fmt::format("{}: {} passed, {} failed on {}; bfloat16/float16: {} passed, {} failed", family,
                                    passed, failed, gpu(), half_passed, half_failed);
  for (auto& [op, what] : first_failure) summary += fmt::format("\n  missing/wrong: {}", what);
  MESSAGE(summary);
}

}  // namespace

// ---- elementwise --------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: unary ops") { run_family("unary", optable::family("unary").cases); }

TEST_CASE("cuda parity: binary ops and broadcasting") { run_family("binary", optable::family("binary").cases); }

// ---- reductions ---------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: reductions") { run_family("reductions", optable::family("reductions").cases); }

// ---- linear algebra, nn functional --------------------------------------------------------------------------------

TEST_CASE("cuda parity: matmul and nn functional") { run_family("matmul/nn", optable::family("matmul/nn").cases); }

// ---- geometry, indexing -------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: geometry and indexing ops") {
  run_family("geometry/index", optable::family("geometry/index").cases);
}

// ---- the mechanisms' ops, random draws, optimizer steps (tests/op_table.cpp) ------------------------------------

TEST_CASE("cuda parity: dense attention, ASCender, sparse attention") {
  for (const char* f : {"attention", "ascender", "sparse"}) run_family(f, optable::family(f).cases);
}

TEST_CASE("cuda parity: the firing perceptron's ops and rule B") {
  run_family("firing", optable::family("firing").cases);
}

TEST_CASE("cuda parity: random draws and optimizer steps") {
  for (const char* f : {"random", "optimizers"}) run_family(f, optable::family(f).cases);
}

// ---- random ops: the CUDA stream is the CPU's ---------------------------------------------------------------------

TEST_CASE("cuda parity: random ops give the CPU's numbers") {
  ASC_GPU_GUARD();
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dt));
    for (int64_t n : {1, 3, 4, 5, 1001}) {
      CAPTURE(n);
      const Shape s{n};
      {
        Generator a(11), b(11);
        Tensor c = rand(s, {.dtype = dt}, &a), g = rand(s, {.dtype = dt, .device = gpu()}, &b);
        CHECK(testing::same_bits(g.cpu(), c));  // bit for bit
        CHECK(a.offset() == b.offset());
      }
      {
        Generator a(12), b(12);
        Tensor c = randn(s, {.dtype = dt}, &a), g = randn(s, {.dtype = dt, .device = gpu()}, &b);
        // Box-Muller's log/cos/sin may differ in the last ulp between glibc and CUDA's libdevice.
        CHECK(compare(g.cpu(), c, dt == kFloat64 ? Tol{1e-13, 1e-12} : Tol{1e-6, 1e-6}) == "");
      }
      {
        Generator a(13), b(13);
        Tensor x = ones(s, {.dtype = dt});
        Tensor c = dropout(x, 0.3, true, &a), g = dropout(x.to(gpu()), 0.3, true, &b);
        CHECK(testing::same_bits(g.cpu(), c));
      }
    }
  }
  Generator a(14), b(14);
  Tensor c = randint(-5, 1000, {9, 7}, {.dtype = kInt64}, &a);
  Tensor g = randint(-5, 1000, {9, 7}, {.dtype = kInt64, .device = gpu()}, &b);
  CHECK(testing::same_bits(g.cpu(), c));
}

// The 16-bit floats draw float32's uniforms: the same keys as float32's dropout from the same generator state, values
// rounded once; bias_activation_dropout computes in float and rounds once, forward and backward (a bfloat16 training
// run on the GPU drops out its activations).
TEST_CASE("cuda parity: 16-bit random ops and dropout keep float32's draws") {
  ASC_GPU_GUARD();
  for (DType half : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(half));
    const Tol tol = half == kBFloat16 ? Tol{1e-2, 1e-2} : Tol{1e-3, 1e-3};
    for (int64_t n : {1, 5, 1001}) {
      CAPTURE(n);
      const Shape s{n};
      {
        Generator a(31), b(31);
        Tensor c = rand(s, {.dtype = kFloat32, .device = gpu()}, &a), g = rand(s, {.dtype = half, .device = gpu()}, &b);
        CHECK(compare(g.to(kFloat32).cpu(), c.cpu(), tol) == "");
        CHECK(a.offset() == b.offset());
      }
      {
        Generator a(32), b(32);
        Tensor x32 = add(rand(s, {.dtype = kFloat32, .device = gpu()}), 0.5);
        Tensor xh = x32.to(half).set_requires_grad(true);
        Tensor c = dropout(x32, 0.3, true, &a), g = dropout(xh, 0.3, true, &b);
        CHECK(a.offset() == b.offset());
        // dropped exactly where float32 drops (the inputs are >= 0.5: no kept value rounds to 0)
        CHECK(testing::same_bits(eq(g.to(kFloat32), 0.0).cpu(), eq(c, 0.0).cpu()));
        CHECK(compare(g.to(kFloat32).cpu(), c.cpu(), tol) == "");
        g.sum().backward();
        CHECK(testing::same_bits(eq(xh.grad().to(kFloat32), 0.0).cpu(), eq(c, 0.0).cpu()));
      }
      for (const double p : {0.0, 0.25}) {
        CAPTURE(p);
        Generator a(33), b(33);
        Tensor x32 = rand(Shape{3, n}, {.dtype = kFloat32, .device = gpu()});
        Tensor b32 = rand(Shape{n}, {.dtype = kFloat32, .device = gpu()});
        Tensor xh = x32.to(half).set_requires_grad(true), bh = b32.to(half).set_requires_grad(true);
        // float32 from the 16-bit values, so that only the rounding of the result differs
        Tensor xr = xh.detach().to(kFloat32).set_requires_grad(true),
               br = bh.detach().to(kFloat32).set_requires_grad(true);
        Tensor c = bias_activation_dropout(xr, br, Activation::Gelu, p, true, &a);
        Tensor g = bias_activation_dropout(xh, bh, Activation::Gelu, p, true, &b);
        CHECK(a.offset() == b.offset());
        CHECK(compare(g.to(kFloat32).cpu(), c.cpu(), tol) == "");
        c.sum().backward(), g.sum().backward();
        CHECK(compare(xh.grad().to(kFloat32).cpu(), xr.grad().cpu(), tol) == "");
        CHECK(compare(bh.grad().to(kFloat32).cpu(), br.grad().cpu(), Tol{tol.atol * 4, tol.rtol}) == "");
      }
    }
  }
}

// ---- dtype conversions: every pair, on strided views --------------------------------------------------------------

TEST_CASE("cuda parity: copy between every dtype pair") {
  ASC_GPU_GUARD();
  Generator gen(21);
  Tensor base = mul(randn({6, 5}, {.dtype = kFloat64}, &gen), 4.0);
  const std::vector<DType> cpu_types = {kFloat32, kFloat64, kInt64, kBool};
  for (DType from : cpu_types) {
    for (DType to : cpu_types) {
      CAPTURE(dtype_name(from));
      CAPTURE(dtype_name(to));
      Tensor x = base.to(from).t();  // transposed: the strided kernel path
      Tensor c = x.to(to), g = x.to(gpu()).t().t().to(to);
      try {
        CHECK(compare(g.cpu(), c, {0, 0}) == "");
      } catch (const Error& e) {
        FAIL_CHECK(e.what());
      }
    }
  }
  // 16-bit floats exist only on the GPU: compare the round trip with the float32 value at 16-bit tolerance.
  for (DType half : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(half));
    Tensor x = base.to(kFloat32);
    Tensor g = x.to(gpu()).to(half).to(kFloat32).cpu();
    CHECK(compare(g, x, half == kBFloat16 ? Tol{1e-2, 1e-2} : Tol{1e-3, 1e-3}) == "");
    Tensor e = exp(x.to(gpu()).to(half)).to(kFloat32).cpu();
    CHECK(compare(e, exp(x), half == kBFloat16 ? Tol{1e-2, 2e-2} : Tol{1e-3, 2e-3}) == "");
  }
}

TEST_CASE("cuda parity: 16-bit embedding / index_select gradients and scatter_add accumulate in float32") {
  ASC_GPU_GUARD();
  const Device dev = gpu();
  // 2048 addends of 0.01 into one row: a float32 sum rounded once to bfloat16 is 20.5; summing in bfloat16 itself
  // stalls at 4 (from there the bfloat16 spacing 2^-5 is over twice each addend).
  {
    for (const DType dt : {kBFloat16, kFloat16}) {
      INFO(fmt::format("{}", dt));
      const int64_t n = 2048;
      const double addend =
          full({1}, 0.01, {.dtype = dt, .device = dev}).to(kFloat64).item<double>();  // 0.01 rounded to dt
      const double want = full({1}, n * addend, {.dtype = dt, .device = dev}).to(kFloat64).item<double>();
      Tensor index = full({n}, 1, {.dtype = kInt64, .device = dev});  // every index is row 1
      Tensor w = zeros({4, 3}, {.dtype = dt, .device = dev, .requires_grad = true});
      Tensor out = embedding(w, index);  // (n, 3)
      out.backward(full({n, 3}, 0.01, {.dtype = dt, .device = dev}));
      Tensor gw = w.grad().to(kFloat64).cpu();
      CHECK(gw.dtype() == kFloat64);
      CHECK(w.grad().dtype() == dt);
      CHECK(gw.to_vector<double>()[3] == want);
      CHECK(gw.to_vector<double>()[0] == 0.0);

      Tensor x = zeros({4, 3}, {.dtype = dt, .device = dev, .requires_grad = true});
      index_select(x, 0, index).backward(full({n, 3}, 0.01, {.dtype = dt, .device = dev}));
      CHECK(x.grad().to(kFloat64).cpu().to_vector<double>()[5] == want);

      Tensor acc =
          scatter_add(zeros({2}, {.dtype = dt, .device = dev}), 0, zeros({n}, {.dtype = kInt64, .device = dev}),
                      full({n}, 0.01, {.dtype = dt, .device = dev}));
      CHECK(acc.dtype() == dt);
      CHECK(acc.to(kFloat64).cpu().to_vector<double>() == std::vector<double>{want, 0.0});
    }
  }
}

// ---- two devices ----------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: a model on the second device trains like the CPU one; devices are never mixed") {
  ASC_GPU_GUARD();
  if (asc::cuda::device_count() < 2) {
    MESSAGE("one CUDA device: skipped (the CUDA emulator runs it with ASC_CUDA_EMU_DEVICES=2)");
    return;
  }
  const Device d1 = Device::cuda(1);
  Generator gen(41);
  Tensor x = randn({5, 7}, {}, &gen);  // (N, D)
  Tensor x0 = x.to(Device::cuda(0)), x1 = x0.to(d1);
  CHECK(x1.device() == d1);
  CHECK(testing::same_bits(x1.cpu(), x));
  testing::check_error([&] { (void)add(x0, x1); }, {"different devices"});
  // Views with a storage offset (pointers inside a block) are copied from the device that owns them.
  Tensor rows1 = x1.slice(0, 2, 4);  // (2, 7) at offset 14
  CHECK(testing::same_bits(rows1.cpu(), x.slice(0, 2, 4)));
  CHECK(testing::same_bits(rows1.to(Device::cuda(0)).cpu(), x.slice(0, 2, 4)));
  CHECK(testing::same_bits(x.slice(0, 1, 3).to(d1).cpu(), x.slice(0, 1, 3)));

  // Three AdamW steps of a small MLP on cuda:1 (cuda:0 stays current) follow the CPU; nothing lands on cuda:0.
  auto run = [&](Device dev) {
    manual_seed(3);
    auto mlp = std::make_shared<nn::MLP>(nn::MLPOptions({7, 16, 3}));
    mlp->to(dev);
    optim::AdamW opt(mlp->parameters(), {.lr = 1e-2});
    Tensor xi = x.to(dev), y = tensor(std::vector<int64_t>{0, 1, 2, 1, 0}, {5}).to(dev);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      Tensor loss = cross_entropy((*mlp)(xi), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const size_t dev0_before = asc::cuda::memory_stats(0).allocated;
  const std::vector<double> cpu = run(Device::cpu()), on1 = run(d1);
  CHECK(asc::cuda::memory_stats(0).allocated == dev0_before);
  CHECK(asc::cuda::memory_stats(1).num_allocs > 0);
  REQUIRE(on1.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) CHECK(on1[i] == doctest::Approx(cpu[i]).epsilon(1e-5));
}

// ---- runs everywhere: CUDA tensors in a process without a GPU -----------------------------------------------------

TEST_CASE("no GPU: CUDA tensors cannot be created, and ops on them are an asc::Error") {
  if (cuda::is_available()) {
    MESSAGE("a CUDA device is present: the no-GPU error paths are not reachable here");
    return;
  }
  // Without a device no CUDA allocator is registered: creating a CUDA tensor is a clear error.
  testing::check_error([] { (void)Tensor::empty({2, 3}, {.device = Device::cuda()}); }, {"no CUDA device"});
  testing::check_error([] { (void)ones({2}).to(Device::cuda()); }, {"no CUDA device"});

  const testing::HostMemoryAsCuda fake;
  Tensor x = ones({2, 3}).to(Device::cuda());
  REQUIRE(x.device() == Device::cuda());
#ifdef ASC_HAVE_CUDA
  // CUDA build: the op reaches the CUDA kernel, whose launch fails without a device.
  testing::check_error([&] { (void)exp(x); }, {"unary (CUDA)"});
  testing::check_error([&] { (void)add(x, x); }, {"binary (CUDA)"});
  testing::check_error([&] { (void)sum(x); }, {"sum (CUDA)"});
  testing::check_error([&] { (void)rand({4}, {.device = Device::cuda()}); }, {"rand (CUDA)"});
  // Entry points called directly (the op in front could fail earlier): their own validation, or the missing
  // device, is an asc::Error.
  Tensor counts = Tensor::empty({2}, {.dtype = kInt64, .device = Device::cuda()});
  testing::check_error([&] { cuda::topk_count(x, 0, counts); }, {"topk (CUDA)", "mask"});
  Tensor y = Tensor::empty({2, 3}, {.device = Device::cuda()});
  testing::check_error([&] { cuda::softmax_forward(x, Tensor(), false, y); }, {"CUDA"});
  // Host-side validation runs before any launch: the CPU kernels' dtype errors.
  Tensor xi = ones({3}, {.dtype = kInt64}).to(Device::cuda());
  Tensor oi = Tensor::empty({3}, {.dtype = kInt64, .device = Device::cuda()});
  testing::check_error([&] { cuda::unary(math::Unary::Exp, {}, xi, oi); }, {"unary", "int64"});
#else
  // CPU-only build: the dispatcher itself refuses (tests/test_cpu_only.cpp checks the same in every build).
  testing::check_error([&] { (void)exp(x); }, {"no kernel for device", "ascender::cuda"});
#endif
}
