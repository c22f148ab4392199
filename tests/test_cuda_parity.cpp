// CUDA vs CPU parity, in the style of ggml's test-backend-ops: a table of cases, each an op called through its
// public asc:: function on random inputs (contiguous, transposed, strided-sliced and broadcast), in float32 and
// float64. Each case runs on the CPU, then on the same inputs moved to the GPU; outputs are compared, then
// gradients: backward of sum(out * cotangent) with the same random cotangent on both sides, compared per input.
// Tolerances depend on the dtype. Every case is attempted and reported (a missing kernel fails with its "no CUDA
// kernel yet" error; the suite then goes on), and each family ends with a summary of what passed.
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

enum class Kind { Normal, Positive, Index, Mask, Int };
enum class View { Contig, Transposed, Sliced };

struct In {
  Shape shape;
  Kind kind = Kind::Normal;
  int64_t high = 0;  // Index / Int: values in [0, high)
  bool grad = true;  // float inputs only
};

struct Case {
  std::string op;
  std::vector<In> inputs;
  std::function<TensorList(const TensorList&)> fn;
  bool backward = true;
  std::vector<View> views = {View::Contig, View::Transposed, View::Sliced};
};

const char* view_name(View v) {
  switch (v) {
    case View::Contig: return "contig";
    case View::Transposed: return "transposed";
    case View::Sliced: return "sliced";
  }
  return "?";
}

// The leaf (contiguous storage) for an input, drawn from `gen`, in the layout the view then reads it through.
Tensor make_leaf(const In& in, View view, DType dt, Generator& gen) {
  Shape s = in.shape;
  if (s.size() >= 2 && view == View::Transposed) std::swap(s[s.size() - 1], s[s.size() - 2]);
  if (s.size() >= 1 && view == View::Sliced) s[s.size() - 1] *= 2;
  switch (in.kind) {
    case Kind::Normal: return randn(s, {.dtype = dt}, &gen);
    case Kind::Positive: return add(rand(s, {.dtype = dt}, &gen), 0.5);
    case Kind::Index:
    case Kind::Int: return randint(0, in.high, s, {.dtype = kInt64}, &gen);
    case Kind::Mask: return lt(rand(s, {.dtype = kFloat64}, &gen), 0.7);
  }
  return {};
}

// The logical input (in.shape) read from the leaf through the view.
Tensor view_of(const Tensor& leaf, const In& in, View view) {
  if (in.shape.size() >= 2 && view == View::Transposed) return leaf.transpose(-1, -2);
  if (in.shape.size() >= 1 && view == View::Sliced) return leaf.slice(-1, 0, leaf.size(-1), 2);
  return leaf;
}

bool is_float_input(const In& in) { return in.kind == Kind::Normal || in.kind == Kind::Positive; }

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
    std::string m = compare(half ? gg.to(gc.dtype()).cpu() : gg.cpu(), gc, tol);
    if (!m.empty()) return fmt::format("grad of input {}: {}", i, m);
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
  uint64_t seed = 1000;
  // The whole table in float32 / float64, then again in bfloat16 / float16.
  auto run_dtypes = [&](std::initializer_list<DType> dtypes, const char* tag, int& passed, int& failed) {
    for (const Case& c : cases) {
      for (DType dt : dtypes) {
        for (View v : c.views) {
          std::string err;
          try {
            err = run_one(c, dt, v, ++seed);
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

TensorList one(Tensor t) { return {t}; }

}  // namespace

// ---- elementwise --------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: unary ops") {
  const Shape s{5, 7};
  const In x{s}, xp{s, Kind::Positive};
  std::vector<Case> cases = {
      {"neg", {x}, [](const TensorList& a) { return one(neg(a[0])); }},
      {"exp", {x}, [](const TensorList& a) { return one(exp(a[0])); }},
      {"log", {xp}, [](const TensorList& a) { return one(log(a[0])); }},
      {"sqrt", {xp}, [](const TensorList& a) { return one(sqrt(a[0])); }},
      {"rsqrt", {xp}, [](const TensorList& a) { return one(rsqrt(a[0])); }},
      {"abs", {x}, [](const TensorList& a) { return one(abs(a[0])); }},
      {"relu", {x}, [](const TensorList& a) { return one(relu(a[0])); }},
      {"gelu", {x}, [](const TensorList& a) { return one(gelu(a[0])); }},
      {"gelu_tanh", {x}, [](const TensorList& a) { return one(gelu(a[0], true)); }},
      {"silu", {x}, [](const TensorList& a) { return one(silu(a[0])); }},
      {"sigmoid", {x}, [](const TensorList& a) { return one(sigmoid(a[0])); }},
      {"tanh", {x}, [](const TensorList& a) { return one(tanh(a[0])); }},
      {"softplus", {x}, [](const TensorList& a) { return one(softplus(a[0], 2.0, 1.5)); }},
      {"clamp", {x}, [](const TensorList& a) { return one(clamp(a[0], -0.5, 0.7)); }},
      {"add_scalar", {x}, [](const TensorList& a) { return one(add(a[0], 1.25)); }},
      {"mul_scalar", {x}, [](const TensorList& a) { return one(mul(a[0], -3.0)); }},
      {"rsub_scalar", {x}, [](const TensorList& a) { return one(rsub(2.0, a[0])); }},
      {"rdiv_scalar", {xp}, [](const TensorList& a) { return one(rdiv(2.0, a[0])); }},
      {"pow_scalar", {xp}, [](const TensorList& a) { return one(pow(a[0], 2.5)); }},
      {"to_dtype_roundtrip",
       {x},
       [](const TensorList& a) {
         DType other = a[0].dtype() == kFloat32 ? kFloat64 : kFloat32;
         return one(a[0].to(other).to(a[0].dtype()));
       }},
      {"contiguous", {x}, [](const TensorList& a) { return one(a[0].contiguous()); }},
      {"clone", {x}, [](const TensorList& a) { return one(a[0].clone()); }},
      {"isnan", {x}, [](const TensorList& a) { return one(isnan(log(a[0]))); }, false},
  };
  run_family("unary", cases);
}

TEST_CASE("cuda parity: binary ops and broadcasting") {
  // Same shapes, row broadcast, column broadcast, and a 3-D outer broadcast.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4, 6}, {4, 6}}, {{4, 6}, {1, 6}}, {{4, 6}, {4, 1}}, {{3, 1, 6}, {4, 6}}};
  std::vector<Case> cases;
  for (auto& [sa, sb] : shapes) {
    const std::string tag = fmt::format(" {}x{}", sa, sb);
    const In a{sa}, b{sb}, bp{sb, Kind::Positive}, ap{sa, Kind::Positive};
    cases.push_back({"add" + tag, {a, b}, [](const TensorList& t) { return one(add(t[0], t[1])); }});
    cases.push_back({"sub" + tag, {a, b}, [](const TensorList& t) { return one(sub(t[0], t[1])); }});
    cases.push_back({"mul" + tag, {a, b}, [](const TensorList& t) { return one(mul(t[0], t[1])); }});
    cases.push_back({"div" + tag, {a, bp}, [](const TensorList& t) { return one(div(t[0], t[1])); }});
    cases.push_back({"pow" + tag, {ap, b}, [](const TensorList& t) { return one(pow(t[0], t[1])); }});
    cases.push_back({"maximum" + tag, {a, b}, [](const TensorList& t) { return one(maximum(t[0], t[1])); }});
    cases.push_back({"minimum" + tag, {a, b}, [](const TensorList& t) { return one(minimum(t[0], t[1])); }});
    cases.push_back({"eq/ne/lt/le/gt/ge" + tag,
                     {a, b},
                     [](const TensorList& t) {
                       return TensorList{eq(t[0], t[1]), ne(t[0], t[1]), lt(t[0], t[1]),
                                         le(t[0], t[1]), gt(t[0], t[1]), ge(t[0], t[1])};
                     },
                     false});
    cases.push_back(
        {"where" + tag, {In{sa, Kind::Mask}, a, b}, [](const TensorList& t) { return one(where(t[0], t[1], t[2])); }});
  }
  cases.push_back({"logical_and/or/not",
                   {In{{4, 6}, Kind::Mask}, In{{1, 6}, Kind::Mask}},
                   [](const TensorList& t) {
                     return TensorList{logical_and(t[0], t[1]), logical_or(t[0], t[1]), logical_not(t[0])};
                   },
                   false});
  cases.push_back({"masked_fill", {In{{4, 6}}, In{{4, 6}, Kind::Mask}}, [](const TensorList& t) {
                     return one(masked_fill(t[0], t[1], -2.5));
                   }});
  cases.push_back({"expand+copy_", {In{{1, 6}}}, [](const TensorList& t) {
                     Tensor dst = zeros({4, 6}, {.dtype = t[0].dtype(), .device = t[0].device()});
                     NoGradGuard ng;
                     dst.copy_(t[0].detach());
                     return TensorList{dst, t[0].expand({4, 6}).contiguous()};
                   }});
  cases.push_back({"fill_",
                   {In{{4, 6}}},
                   [](const TensorList& t) {
                     Tensor d = t[0].detach().clone();
                     d.fill_(0.375);
                     return one(d);
                   },
                   false});
  run_family("binary", cases);
}

// ---- reductions ---------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: reductions") {
  const In x{{4, 5, 6}};
  std::vector<Case> cases = {
      {"sum all", {x}, [](const TensorList& a) { return one(sum(a[0])); }},
      {"sum dim 1", {x}, [](const TensorList& a) { return one(sum(a[0], {1})); }},
      {"sum dims 0,2 keepdim",
       {x},
       [](const TensorList& a) {
         return one(sum(a[0], {0, 2}, true));
       }},
      {"sum large", {In{{3, 3000}}}, [](const TensorList& a) { return one(sum(a[0], {1})); }},
      {"sum all large", {In{{257, 300}}}, [](const TensorList& a) { return one(sum(a[0])); }},
      {"mean", {x}, [](const TensorList& a) { return one(mean(a[0], {-1})); }},
      {"var", {x}, [](const TensorList& a) { return one(var(a[0], {1})); }},
      {"std",
       {x},
       [](const TensorList& a) {
         return one(asc::std(a[0], {0, 2}));
       }},
      {"max dim",
       {x},
       [](const TensorList& a) {
         auto r = max(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"min dim",
       {x},
       [](const TensorList& a) {
         auto r = min(a[0], -1);
         return TensorList{r.values, r.indices};
       }},
      {"amax",
       {x},
       [](const TensorList& a) {
         return one(amax(a[0], {0, 1}));
       }},
      {"amin", {x}, [](const TensorList& a) { return one(amin(a[0])); }},
      {"argmax/argmin",
       {x},
       [](const TensorList& a) {
         return TensorList{argmax(a[0], 2), argmin(a[0], 0)};
       },
       false},
      {"logsumexp", {x}, [](const TensorList& a) { return one(logsumexp(a[0], {-1})); }},
      {"norm p=2", {x}, [](const TensorList& a) { return one(norm(a[0], 2.0, {1})); }},
      {"norm p=1", {x}, [](const TensorList& a) { return one(norm(a[0], 1.0, {2})); }},
      {"norm p=inf", {x}, [](const TensorList& a) { return one(norm(a[0], INFINITY, {2})); }},
      // Long rows take the block-per-row kernels (n > 256); a long middle dimension the strided max/min kernel.
      {"max dim large",
       {In{{3, 2000}}},
       [](const TensorList& a) {
         auto r = max(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"min middle dim large",
       {In{{4, 700, 3}}},
       [](const TensorList& a) {
         auto r = min(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"logsumexp large", {In{{3, 2000}}}, [](const TensorList& a) { return one(logsumexp(a[0], {-1})); }},
  };
  run_family("reductions", cases);
}

// ---- linear algebra, nn functional --------------------------------------------------------------------------------

TEST_CASE("cuda parity: matmul and nn functional") {
  std::vector<Case> cases = {
      {"matmul 2d", {In{{5, 7}}, In{{7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"matmul batched", {In{{2, 5, 7}}, In{{2, 7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"matmul broadcast", {In{{2, 5, 7}}, In{{7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"linear", {In{{4, 6}}, In{{3, 6}}, In{{3}}}, [](const TensorList& a) { return one(linear(a[0], a[1], a[2])); }},
      {"softmax", {In{{4, 9}}}, [](const TensorList& a) { return one(softmax(a[0], -1)); }},
      {"softmax dim 0", {In{{4, 9}}}, [](const TensorList& a) { return one(softmax(a[0], 0)); }},
      {"softmax masked",
       {In{{4, 9}}, In{{4, 9}, Kind::Mask}},
       [](const TensorList& a) { return one(softmax(a[0], -1, a[1])); }},
      {"log_softmax", {In{{4, 9}}}, [](const TensorList& a) { return one(log_softmax(a[0], -1)); }},
      {"log_softmax masked",
       {In{{4, 9}}, In{{4, 9}, Kind::Mask}},
       [](const TensorList& a) { return one(log_softmax(a[0], -1, a[1])); }},
      {"cross_entropy",
       {In{{6, 5}}, In{{6}, Kind::Index, 5}},
       [](const TensorList& a) { return one(cross_entropy(a[0], a[1])); }},
      {"cross_entropy smoothing+ignore+sum",
       {In{{6, 5}}, In{{6}, Kind::Index, 5}},
       [](const TensorList& a) {
         Tensor t = where(eq(a[1], 2.0), full({6}, -100.0, {.dtype = kInt64, .device = a[1].device()}), a[1]);
         return one(cross_entropy(a[0], t, {.label_smoothing = 0.1, .reduction = Reduction::Sum}));
       }},
      {"mse_loss", {In{{4, 6}}, In{{4, 6}}}, [](const TensorList& a) { return one(mse_loss(a[0], a[1])); }},
      {"layer_norm",
       {In{{4, 8}}, In{{8}}, In{{8}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {8}, a[1], a[2])); }},
      {"layer_norm no affine", {In{{3, 4, 8}}}, [](const TensorList& a) { return one(layer_norm(a[0], {8})); }},
      {"rms_norm", {In{{4, 8}}, In{{8}}}, [](const TensorList& a) { return one(rms_norm(a[0], {8}, a[1])); }},
      // Long rows (block per row), many rows (layer norm's weight gradient in several row chunks), a GEMM whose
      // sizes are not multiples of anything.
      {"matmul odd sizes", {In{{33, 65}}, In{{65, 17}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"softmax long rows", {In{{3, 700}}}, [](const TensorList& a) { return one(softmax(a[0], -1)); }},
      {"log_softmax masked long rows",
       {In{{3, 700}}, In{{3, 700}, Kind::Mask}},
       [](const TensorList& a) { return one(log_softmax(a[0], -1, a[1])); }},
      {"cross_entropy many classes",
       {In{{4, 600}}, In{{4}, Kind::Index, 600}},
       [](const TensorList& a) { return one(cross_entropy(a[0], a[1])); }},
      {"layer_norm long rows",
       {In{{3, 1000}}, In{{1000}}, In{{1000}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {1000}, a[1], a[2])); }},
      {"layer_norm many rows",
       {In{{600, 24}}, In{{24}}, In{{24}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {24}, a[1], a[2])); }},
      {"rms_norm long rows",
       {In{{3, 1000}}, In{{1000}}},
       [](const TensorList& a) { return one(rms_norm(a[0], {1000}, a[1])); }},
  };
  run_family("matmul/nn", cases);
}

// ---- geometry, indexing -------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: geometry and indexing ops") {
  std::vector<Case> cases = {
      {"topk",
       {In{{4, 9}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 3);
         return TensorList{r.values, r.indices};
       }},
      {"topk smallest no-diag",
       {In{{2, 6, 6}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 2, {.largest = false, .exclude_diagonal = true});
         return TensorList{r.values, r.indices};
       }},
      {"topk masked",
       {In{{2, 6, 6}}, In{{2, 6, 6}, Kind::Mask}},
       [](const TensorList& a) {
         Tensor m = logical_or(a[1], eye(6, {.dtype = kBool, .device = a[1].device()}));  // >= 1 selectable per row
         auto r = topk(a[0], 1, {.mask = m});
         return TensorList{r.values, r.indices};
       }},
      {"pairwise_sqdist",
       {In{{5, 3}}, In{{4, 3}}},
       [](const TensorList& a) { return one(pairwise_sqdist(a[0], a[1])); }},
      {"cosine_similarity_matrix",
       {In{{5, 3}}, In{{4, 3}}},
       [](const TensorList& a) { return one(cosine_similarity_matrix(a[0], a[1])); }},
      {"normalize_rows", {In{{5, 4}}}, [](const TensorList& a) { return one(normalize_rows(a[0])); }},
      {"row_standardize", {In{{5, 6}}}, [](const TensorList& a) { return one(row_standardize(a[0])); }},
      {"row_standardize masked",
       {In{{5, 6}}, In{{5, 6}, Kind::Mask}},
       [](const TensorList& a) { return one(row_standardize(a[0], a[1])); }},
      {"hard_gate surrogate",
       {In{{5, 6}}, In{{1, 6}}},
       [](const TensorList& a) {
         return one(hard_gate(a[0], a[1], {.mode = GateBackward::Surrogate, .surrogate = "sigmoid", .width = 2.0}));
       }},
      // Long rows: 64 / 128 threads per row, lists of 32, and k > 32 in two passes over the row.
      {"topk long rows k=20",
       {In{{3, 1500}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 20);
         return TensorList{r.values, r.indices};
       }},
      {"topk long rows k=40",
       {In{{2, 3000}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 40);
         return TensorList{r.values, r.indices};
       }},
      {"topk masked long rows",
       {In{{2, 1500}}, In{{2, 1500}, Kind::Mask}},
       [](const TensorList& a) {
         auto r = topk(a[0], 5, {.largest = false, .mask = a[1]});
         return TensorList{r.values, r.indices};
       }},
      {"normalize_rows long rows", {In{{4, 700}}}, [](const TensorList& a) { return one(normalize_rows(a[0])); }},
      {"row_standardize masked long rows",
       {In{{4, 700}}, In{{4, 700}, Kind::Mask}},
       [](const TensorList& a) { return one(row_standardize(a[0], a[1])); }},
      {"index_select",
       {In{{5, 6}}, In{{4}, Kind::Index, 5}},
       [](const TensorList& a) { return one(index_select(a[0], 0, a[1])); }},
      {"gather",
       {In{{5, 6}}, In{{5, 3}, Kind::Index, 6}},
       [](const TensorList& a) { return one(gather(a[0], 1, a[1])); }},
      {"scatter_add",
       {In{{5, 6}}, In{{5, 3}, Kind::Index, 6}, In{{5, 3}}},
       [](const TensorList& a) { return one(scatter_add(a[0], 1, a[1], a[2])); }},
      {"embedding",
       {In{{7, 4}}, In{{3, 2}, Kind::Index, 7}},
       [](const TensorList& a) { return one(embedding(a[0], a[1])); }},
      // 60 indices into a 4-wide table: the backward's index_add takes the atomic path.
      {"embedding many indices",
       {In{{7, 4}}, In{{10, 6}, Kind::Index, 7}},
       [](const TensorList& a) { return one(embedding(a[0], a[1])); }},
      {"one_hot", {In{{6}, Kind::Index, 4}}, [](const TensorList& a) { return one(one_hot(a[0], 4)); }, false},
      {"cat",
       {In{{3, 4}}, In{{2, 4}}},
       [](const TensorList& a) {
         return one(cat({a[0], a[1]}, 0));
       }},
      {"stack",
       {In{{3, 4}}, In{{3, 4}}},
       [](const TensorList& a) {
         return one(stack({a[0], a[1]}, 1));
       }},
      {"split/chunk",
       {In{{6, 4}}},
       [](const TensorList& a) {
         TensorList s = split(a[0], 2, 0), c = chunk(a[0], 2, 1);
         s.insert(s.end(), c.begin(), c.end());
         return s;
       }},
      {"permute+reshape",
       {In{{2, 3, 4}}},
       [](const TensorList& a) {
         return one(a[0].permute({2, 0, 1}).reshape({4, 6}));
       }},
  };
  run_family("geometry/index", cases);
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

// ---- optimizers ---------------------------------------------------------------------------------------------------

TEST_CASE("cuda parity: optimizer steps") {
  ASC_GPU_GUARD();
  auto run = [](const char* name, auto make) {
    INFO("case: " << name);
    for (DType dt : {kFloat32, kFloat64}) {
      Generator gen(31);
      Tensor p0 = randn({4, 6}, {.dtype = dt}, &gen), g0 = randn({4, 6}, {.dtype = dt}, &gen);
      Tensor pc = p0.clone().set_requires_grad(true), pg = p0.to(gpu()).set_requires_grad(true);
      auto oc = make(std::vector<Tensor>{pc}), og = make(std::vector<Tensor>{pg});
      try {
        for (int step = 0; step < 3; ++step) {
          pc.set_grad(mul(g0, double(step + 1)));
          pg.set_grad(mul(g0, double(step + 1)).to(gpu()));
          oc.step();
          og.step();
        }
        CHECK(compare(pg.detach().cpu(), pc.detach(), tol_for(dt)) == "");
      } catch (const Error& e) {
        FAIL_CHECK(name << " [" << dtype_name(dt) << "]: " << e.what());
      }
    }
  };
  run("SGD", [](std::vector<Tensor> p) { return optim::SGD(p, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}); });
  run("Adam", [](std::vector<Tensor> p) { return optim::Adam(p, {.lr = 0.01, .amsgrad = true}); });
  run("AdamW", [](std::vector<Tensor> p) { return optim::AdamW(p, {.lr = 0.01}); });
  run("RMSprop",
      [](std::vector<Tensor> p) { return optim::RMSprop(p, {.lr = 0.01, .momentum = 0.5, .centered = true}); });
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
