// The op table (tests/op_table.h) read as a whole: every differentiable entry's backward against finite differences
// in float64, and the coverage check — every kernel ops/kernel_list.inc declares is dispatched by some entry, on the
// CPU here and, in the CUDA emulator suite (or on a GPU), on CUDA. A kernel no entry reaches is listed by name: add an
// entry that calls the op that dispatches it (docs/architecture.md, "How to add an op").
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "op_table.h"
#include "testing.h"

using namespace asc;

namespace {

// The kernels ops/kernel_list.inc declares, by name.
const std::vector<std::string>& declared_kernels() {
  static const std::vector<std::string> names = {
#define ASC_DECLARE_KERNEL(name, params) #name,
#include "ops/kernel_list.inc"
#undef ASC_DECLARE_KERNEL
  };
  return names;
}

// Forward, and backward of Σ out·cot over the differentiable outputs, of every entry at float32 and float64 on
// `device`; returns the kernels the profiler saw dispatched there. Errors are failures naming the entry.
std::set<std::string> kernels_dispatched(Device device, const std::string& only_family = "") {
  std::set<std::string> seen;
  profiler::Profile prof;
  for (const optable::Family& f : optable::op_table())
    for (const optable::OpCase& c : f.cases)
      if (only_family.empty() || f.name == only_family)
        for (DType dt : {kFloat32, kFloat64}) {
          INFO(f.name << ": " << c.op << " [" << dtype_name(dt) << "]");
          try {
            const TensorList in = optable::inputs(c, dt, 3, device, /*grad=*/true);
            Tensor loss;
            for (const Tensor& o : c.fn(in))
              if (c.backward && o.defined() && o.requires_grad()) {
                Generator g(4);
                Tensor term = sum(mul(o, randn(o.shape(), {.dtype = o.dtype()}, &g).to(device)));
                loss = loss.defined() ? add(loss, term) : term;
              }
            if (loss.defined()) loss.backward();
          } catch (const Error& e) {
            FAIL_CHECK(e.what());
          }
        }
  prof.stop();
  for (const profiler::Event& e : prof.events())
    if (e.kind == profiler::EventKind::Kernel && (device.is_cuda() ? e.device == device.index : e.cpu))
      seen.insert(e.kernel);
  return seen;
}

void check_coverage(Device device) {
  const std::set<std::string> seen = kernels_dispatched(device);
  std::vector<std::string> missing;
  for (const std::string& k : declared_kernels())
    if (!seen.count(k)) missing.push_back(k);
  std::string list;
  for (const std::string& k : missing) list += " " + k;
  CHECK_MESSAGE(missing.empty(), fmt::format("kernels no op-table entry dispatches on {}:{}", device, list));
  MESSAGE(fmt::format("{}: {} of {} declared kernels dispatched by the op table", device,
                      declared_kernels().size() - missing.size(), declared_kernels().size()));
}

}  // namespace

TEST_CASE("op table: every entry with a reference against it, float32 and float64, through every view") {
  int checked = 0;
  for (const optable::Family& f : optable::op_table())
    for (const optable::OpCase& c : f.cases) {
      if (!c.reference) continue;
      for (DType dt : {kFloat32, kFloat64})
        for (optable::View view : c.views) {
          INFO(f.name << ": " << c.op << " [" << dtype_name(dt) << ", view " << static_cast<int>(view) << "]");
          const TensorList in = optable::inputs(c, dt, 31, Device::cpu(), /*grad=*/false, view);
          TensorList in64;
          for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(kFloat64) : t);
          const TensorList out = c.fn(in), ref = c.reference(in64);
          REQUIRE(out.size() == ref.size());
          for (size_t k = 0; k < out.size(); ++k) {
            CHECK(out[k].dtype() == dt);
            if (dt == kFloat64)
              testing::check_close(out[k], ref[k], 1e-12, 1e-10);
            else
              testing::check_close(out[k].to(kFloat64), ref[k], 1e-5, 1e-5);
          }
        }
      ++checked;
    }
  MESSAGE(fmt::format("{} entries against their references", checked));
  CHECK(checked > 50);
}

TEST_CASE("op table: every differentiable entry's gradient against finite differences (float64)") {
  int checked = 0, large = 0;
  for (const optable::Family& f : optable::op_table())
    for (const optable::OpCase& c : f.cases) {
      if (!c.backward || !c.gradcheck) continue;
      int64_t elements = 0;
      for (const optable::In& in : c.inputs)
        if (optable::is_float_input(in) && in.grad) elements += checked_numel(in.shape, "op table");
      if (elements > 1500) {  // long rows: their gradients are checked against the CPU's by the parity test
        ++large;
        continue;
      }
      INFO(f.name << ": " << c.op);
      const TensorList in = optable::inputs(c, kFloat64, 11, Device::cpu(), /*grad=*/true);
      const optable::Fn fn = c.fn;
      auto float_outputs = [fn](const TensorList& x) {
        TensorList out;
        for (const Tensor& o : fn(x))
          if (o.defined() && is_floating(o.dtype())) out.push_back(o);
        return out;
      };
      testing::check_grad(float_outputs, in);
      ++checked;
    }
  MESSAGE(fmt::format("gradcheck: {} entries (and {} with more than 1500 input elements left to the parity test)",
                      checked, large));
  CHECK(checked > 50);
}

TEST_CASE("op table: every CPU kernel is dispatched by some entry") {
  if (!ASC_PROFILER_ENABLED) {
    MESSAGE("built without the profiler (ASC_WITH_PROFILER=OFF): the coverage check cannot see kernels");
    return;
  }
  check_coverage(Device::cpu());
  // The check sees what is not run: one family alone leaves most kernels out.
  const std::set<std::string> unary_only = kernels_dispatched(Device::cpu(), "unary");
  CHECK(unary_only.count("unary"));
  CHECK_FALSE(unary_only.count("matmul"));
  CHECK(unary_only.size() < declared_kernels().size() / 2);
}

TEST_CASE("op table: every CUDA kernel is dispatched by some entry") {
  if (!cuda::is_available()) {
    const char* required = std::getenv("ASC_REQUIRE_GPU");
    if (required && std::string(required) == "1") FAIL("ASC_REQUIRE_GPU=1 but no CUDA device is available");
    MESSAGE("no CUDA device: the CUDA kernels' coverage is checked in the emulator suite and on a GPU");
    return;
  }
  check_coverage(Device::cuda(0));
}
