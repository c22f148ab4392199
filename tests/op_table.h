#pragma once
// The op table: one entry per op call the tests exercise — the idea of PyTorch's OpInfo and ggml's
// test-backend-ops. An entry names the op, describes its sample inputs (shapes, including long rows and odd sizes;
// what kind of values: normal, positive, indices, masks), and calls the op through its public asc:: function on them.
// The tests that read it:
//   test_cuda_parity   every entry on the CPU and on the GPU (float32 / float64, then bfloat16 / float16 where the
//                      entry allows), outputs and gradients, through contiguous, transposed and sliced views
//   test_op_table      every entry with a reference against it (float32 and float64, every view); float64
//                      gradcheck of every differentiable entry; the coverage check: every kernel declared in
//                      ops/kernel_list.inc is dispatched by some entry (the CPU kernels in the Release suite, the
//                      CUDA kernels in the emulator suite), read from the profiler's kernel events
//   test_cpu_isa       every entry at every CPU instruction set level: float32 within tolerance of float64, float64
//                      levels within 1e-12 of each other
//   test_fuzz_ops      every entry on inputs with NaN, ±inf, ±0, huge and subnormal values: asc::Error or outputs, and
//                      the reference's NaN and infinities where the entry has one
// A new op adds its entry here (docs/architecture.md, "How to add an op"); its own test file keeps what needs a
// hand-written float64 reference.
//
//   for (const asc::optable::Family& f : asc::optable::op_table())
//     for (const asc::optable::OpCase& c : f.cases) { TensorList out = c.fn(asc::optable::inputs(c, kFloat64)); }
#include <functional>
#include <string>
#include <vector>

#include "ascender.h"

namespace asc::optable {

enum class Kind { Normal, Positive, Index, Mask, Int };
enum class View { Contig, Transposed, Sliced };

// One sample input.
struct In {
  Shape shape;
  Kind kind = Kind::Normal;
  int64_t high = 0;  // Index / Int: values in [0, high)
  bool grad = true;  // float inputs only: whether the backward checks its gradient
};

using Fn = std::function<TensorList(const TensorList&)>;

struct OpCase {
  std::string op;
  std::vector<In> inputs;
  Fn fn;  // the op on inputs of any float dtype and device; returns its outputs (a random op seeds its own generator)
  bool backward = true;  // differentiable: gradients are compared and gradchecked
  std::vector<View> views = {View::Contig, View::Transposed, View::Sliced};
  bool half = true;  // the GPU also runs it in bfloat16 / float16 (false: a selection or threshold that rounding moves)
  double isa_tol = 1e-3;  // float32 against float64 at every CPU level (0: not comparable, e.g. random draws)
  bool gradcheck = true;  // float64 gradcheck (false: a piecewise op whose finite differences cross a boundary)
  // An independent computation of the outputs, in float64 on the CPU from the inputs as given (plain loops over their
  // values, not the op's kernels); empty: none (the op's own test file holds its reference).
  Fn reference = {};
};

struct Family {
  std::string name;
  std::vector<OpCase> cases;
};

// Every family, in a fixed order.
const std::vector<Family>& op_table();
const Family& family(const std::string& name);

// The leaf (contiguous storage) for an input, drawn from `gen`, in the layout the view then reads it through.
Tensor make_leaf(const In& in, View view, DType dt, Generator& gen);
// The logical input (in.shape) read from the leaf through the view.
Tensor view_of(const Tensor& leaf, const In& in, View view);
bool is_float_input(const In& in);
// The entry's inputs at dtype dt (float inputs; indices and masks keep theirs) on `device`, drawn from `seed` and read
// through `view`; the leaves of float inputs that the backward checks require grad when `grad`.
TensorList inputs(const OpCase& c, DType dt, uint64_t seed = 1, Device device = Device::cpu(), bool grad = false,
                  View view = View::Contig);

inline TensorList one(Tensor t) { return {t}; }

}  // namespace asc::optable
