// Hostile input that used to get past the checks (issue #15): sizes whose products overflow 64 bits, methods of an
// undefined Tensor, an optimizer with nothing to optimise. Each must throw asc::Error naming the op; none may crash
// or hand back a tensor whose shape is larger than its storage.
#include <climits>
#include <cmath>
#include <limits>
#include <set>

#include "core/overlap.h"
#include "models/decoder_lm.h"
#include "models/transformer_classifier.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The call throws asc::Error whose message contains `what` (the op's name, usually).
template <class F>
void check_error(F&& f, const std::string& what) {
  try {
    f();
    FAIL("no asc::Error thrown, expected one mentioning '" << what << "'");
  } catch (const Error& e) {
    INFO(std::string(e.what()));
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("creation: element and byte counts that overflow int64 are refused") {
  // 2^40 * 2^40 = 2^80 wrapped to 0: an empty storage behind a huge shape, written out of bounds by zeros().
  check_error([] { Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}); }, "more elements than fit in 64 bits");
  check_error([] { zeros({kMax, 2}); }, "empty");
  check_error([] { ones({int64_t{1} << 32, int64_t{1} << 32, 3}); }, "empty");
  // Fits as an element count, not as a byte count (x 4 bytes).
  check_error([] { Tensor::empty({kMax / 2}); }, "byte count overflow");
  check_error([] { Tensor::empty({3, -1}); }, "negative dimension");
  // A shape with a zero dimension is empty, but the product of the others must still fit (its strides are that).
  check_error([] { Tensor::empty({0, int64_t{1} << 40, int64_t{1} << 40}); }, "more elements");
  CHECK(Tensor::empty({0, int64_t{1} << 40}).numel() == 0);
}

TEST_CASE("creation ops that multiply sizes internally: eye, one_hot, arange") {
  check_error([] { eye(int64_t{1} << 32); }, "eye");  // n * n = 2^64
  check_error([] { eye(3037000500); }, "eye");        // n * n just above 2^63
  Tensor idx = tensor(std::vector<int64_t>{0, 1, 2}, {3});
  check_error([&] { one_hot(idx, kMax); }, "one_hot");  // 3 * (2^63 - 1)
  check_error([] { arange(0.0, 1e300); }, "arange");    // does not fit in int64
  check_error([] { arange(0.0, 1e19); }, "arange");
  check_error([] { arange(0.0, 1.0, std::numeric_limits<double>::quiet_NaN()); }, "arange");
  // The rewritten loops still produce the right values.
  CHECK(arange(2.0, 9.0, 3.0).to_vector<int64_t>() == std::vector<int64_t>{2, 5, 8});
  CHECK(arange(1.0, 0.0, -0.25, {.dtype = kFloat64}).to_vector<double>() == std::vector<double>{1, 0.75, 0.5, 0.25});
  CHECK(eye(3, {.dtype = kFloat64}).to_vector<double>() == std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(eye(0).numel() == 0);
}

TEST_CASE("views: narrow / slice / expand / reshape bounds cannot overflow") {
  Tensor x = arange(10.0, 20.0, 1.0, {.dtype = kFloat64});
  // start + length overflowed to a negative number and passed the bound check.
  check_error([&] { x.narrow(0, kMax - 1, 5); }, "narrow");
  check_error([&] { x.narrow(0, 5, kMax); }, "narrow");
  check_error([&] { x.narrow(0, 3, 8); }, "narrow");
  CHECK(x.narrow(0, 3, 7).to_vector<double>().front() == 13);
  // (end - start + step - 1) / step overflowed for a huge step.
  Tensor s = x.slice(0, 2, 10, kMax);
  CHECK(s.shape() == Shape{1});
  CHECK(s.item<double>() == 12);
  CHECK(x.slice(0, 1, 10, 4).to_vector<double>() == std::vector<double>{11, 15, 19});
  CHECK(x.slice(0, 10, 10, kMax).numel() == 0);
  // An expanded view may be huge (no storage behind it), but not beyond 64 bits.
  Tensor one = ones({1, 3});
  check_error([&] { one.expand({int64_t{1} << 32, int64_t{1} << 32, 3}); }, "expand");
  Tensor big = one.expand({int64_t{1} << 20, int64_t{1} << 20, 3});  // a valid view of 3 elements
  CHECK(big.numel() == (int64_t{3} << 40));
  check_error([&] { ones({1}).reshape({-1, int64_t{1} << 40, int64_t{1} << 40}); }, "reshape");
  check_error([&] { zeros({0}).reshape({int64_t{1} << 40, int64_t{1} << 40, 0}); }, "reshape");
}

TEST_CASE("cat: a total length that overflows int64 is refused before anything is allocated") {
  Tensor half = zeros({1}).expand({kMax / 2 + 1});
  check_error([&] { cat({half, half}, 0); }, "cat");
}

TEST_CASE("found by the op fuzzer: randint over a range wider than 2^63, empty copies, empty index_select") {
  // high - low overflowed int64 (UBSan: signed overflow); values must land in [low, high).
  Generator g(3);
  for (int64_t v : randint(-2, kMax, {64}, {.dtype = kInt64}, &g).to_vector<int64_t>()) CHECK(v >= -2);
  for (int64_t v : randint(std::numeric_limits<int64_t>::min(), kMax, {64}, {.dtype = kInt64}, &g).to_vector<int64_t>())
    CHECK(v < kMax);
  // cat of an empty piece at a position whose offset (start * stride) does not fit: nothing to copy.
  Tensor a = zeros({0, int64_t{1} << 40}), b = zeros({0, int64_t{1} << 40});
  CHECK(cat({a, b}, 0).numel() == 0);
  Tensor e = zeros({int64_t{1} << 61, 0});
  CHECK(cat({e, e}, 0).shape() == Shape{int64_t{1} << 62, 0});
  Tensor f = zeros({int64_t{1} << 62, 0});
  check_error([&] { cat({f, f}, 0); }, "cat");  // 2^63 rows
  // index_select producing nothing: memcpy from a null pointer was undefined.
  CHECK(index_select(zeros({3, 0}), 0, tensor(std::vector<int64_t>{0, 2}, {2})).shape() == Shape{2, 0});
  // An empty view's offset is 0, whatever offset was asked for.
  CHECK(make_view(zeros({4}), {0}, {1}, 3).offset() == 0);
}

TEST_CASE("make_view: a view reaching outside its storage is refused, whatever produced it") {
  Tensor x = zeros({2, 3});
  check_error([&] { make_view(x, {2, 3}, {3, 1}, 1); }, "outside the storage");  // last element at 6
  check_error([&] { make_view(x, {3, 3}, {3, 1}, 0); }, "outside the storage");
  check_error([&] { make_view(x, {2}, {kMax, 1}, 0); }, "view");  // shape and strides differ
  check_error([&] { make_view(x, {2}, {kMax}, 0); }, "outside the storage");
  check_error([&] { make_view(x, {3}, {kMax}, 0); }, "offset overflow");
  check_error([&] { make_view(x, {2}, {-1}, 0); }, "outside the storage");
  CHECK(make_view(x, {2}, {-1}, 1).numel() == 2);              // negative strides within bounds are fine
  CHECK(make_view(x, {0, 5}, {kMax, kMax}, 99).numel() == 0);  // nothing addressed
}

TEST_CASE("an undefined Tensor: every method throws asc::Error instead of dereferencing null") {
  Tensor u;
  REQUIRE_FALSE(u.defined());
  check_error([&] { (void)u.shape(); }, "shape");
  check_error([&] { (void)u.strides(); }, "strides");
  check_error([&] { (void)u.dim(); }, "dim");
  check_error([&] { (void)u.numel(); }, "numel");
  check_error([&] { (void)u.size(0); }, "undefined");
  check_error([&] { (void)u.stride(0); }, "undefined");
  check_error([&] { (void)u.offset(); }, "offset");
  check_error([&] { (void)u.dtype(); }, "dtype");
  check_error([&] { (void)u.device(); }, "device");
  check_error([&] { (void)u.element_size(); }, "element_size");
  check_error([&] { (void)u.is_contiguous(); }, "undefined");
  check_error([&] { (void)u.options(); }, "undefined");
  check_error([&] { (void)u.data_ptr<float>(); }, "undefined");
  check_error([&] { (void)u.raw_data(); }, "raw_data");
  check_error([&] { (void)u.item<float>(); }, "undefined");
  check_error([&] { (void)u.to_vector<float>(); }, "undefined");
  check_error([&] { (void)u.is_leaf(); }, "is_leaf");
  check_error([&] { (void)u.grad_fn(); }, "grad_fn");
  check_error([&] { (void)u.grad(); }, "grad");
  check_error([&] { u.set_grad(ones({1})); }, "set_grad");
  check_error([&] { u.zero_grad(); }, "zero_grad");
  check_error([&] { u.set_requires_grad(true); }, "undefined");
  check_error([&] { u.retain_grad(); }, "retain_grad");
  check_error([&] { u.backward(); }, "backward");
  check_error([&] { (void)u.detach(); }, "detach");
  check_error([&] { (void)u.shares_storage(ones({1})); }, "shares_storage");
  check_error([&] { (void)ones({1}).shares_storage(u); }, "shares_storage");
  check_error([&] { (void)u.reshape({1}); }, "undefined");
  check_error([&] { (void)u.view({1}); }, "undefined");
  check_error([&] { (void)u.flatten(); }, "undefined");
  check_error([&] { (void)u.permute({0}); }, "undefined");
  check_error([&] { (void)u.transpose(0, 1); }, "undefined");
  check_error([&] { (void)u.t(); }, "undefined");
  check_error([&] { (void)u.narrow(0, 0, 1); }, "undefined");
  check_error([&] { (void)u.slice(0, 0, 1); }, "undefined");
  check_error([&] { (void)u.select(0, 0); }, "undefined");
  check_error([&] { (void)u.squeeze(); }, "undefined");
  check_error([&] { (void)u.unsqueeze(0); }, "undefined");
  check_error([&] { (void)u.expand({1}); }, "undefined");
  check_error([&] { (void)u.contiguous(); }, "undefined");
  check_error([&] { (void)u.clone(); }, "undefined");
  check_error([&] { (void)u.to(kFloat64); }, "undefined");
  check_error([&] { (void)u.cpu(); }, "undefined");
  check_error([&] { (void)u.pin_memory(); }, "undefined");
  check_error([&] { u.copy_(ones({1})); }, "undefined");
  check_error([&] { ones({1}).copy_(u); }, "undefined");
  check_error([&] { u.fill_(1.0); }, "undefined");
  check_error([&] { u.add_(ones({1})); }, "undefined");
  check_error([&] { u.mul_(2.0); }, "undefined");
  check_error([&] { (void)(-u); }, "undefined");
  check_error([&] { (void)u.exp(); }, "undefined");
  check_error([&] { (void)u.sum(); }, "undefined");
  check_error([&] { (void)u.mean({0}); }, "undefined");
  check_error([&] { (void)u.matmul(ones({1})); }, "undefined");
  check_error([&] { (void)(u + 1.0); }, "undefined");
  CHECK_FALSE(u.requires_grad());
  CHECK_FALSE(u.is_pinned());
  CHECK(to_string(u) == "tensor(undefined)");
}

TEST_CASE("optimizers refuse an empty parameter list (as torch.optim does)") {
  check_error([] { optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}); }, "empty parameter list");
  check_error([] { optim::AdamW(std::vector<Tensor>{}, {}); }, "AdamW: got an empty parameter list");
  Tensor w = zeros({2}).set_requires_grad();
  optim::SGD sgd({w}, {.lr = 0.1});
  check_error([&] { sgd.add_param_group({}, {.lr = 0.1}); }, "group 1");
  CHECK(sgd.num_groups() == 1);
}

TEST_CASE("optimizer state: step counts load as exact int64, and one the next update would overflow is refused") {
  Tensor w = zeros({2}, {.dtype = kFloat64}).set_requires_grad();
  optim::SGD sgd({w}, {.lr = 0.1, .momentum = 0.9});
  w.set_grad(ones({2}, {.dtype = kFloat64}));
  sgd.step();
  StateDict sd = sgd.state_dict();
  const int64_t exact = (int64_t{1} << 53) + 1;  // not a double
  sd.set("state.0.0.step", tensor(std::vector<int64_t>{exact}, Shape{}));
  sgd.load_state_dict(sd);
  CHECK(sgd.step_count(w) == exact);
  sd.set("state.0.0.step", tensor(std::vector<int64_t>{kMax}, Shape{}));
  check_error([&] { sgd.load_state_dict(sd); }, "a step count must be in [0, 2^63 - 1)");
  CHECK(sgd.step_count(w) == exact);  // unchanged by the refused load
}

// ---- anomaly detection ------------------------------------------------------------------------------------------

TEST_CASE("anomaly mode: the first forward op producing NaN/Inf throws, naming the op and its modules") {
  Tensor x = tensor({1.0, -1.0, 2.0}, {.dtype = kFloat64, .requires_grad = true});
  {
    // Off: NaN flows silently, as it always did.
    Tensor y = log(x);
    CHECK(std::isnan(y.to_vector<double>()[1]));
  }
  {
    autograd::DetectAnomalyGuard anomaly;
    check_error([&] { (void)log(x); }, "anomaly: the forward of 'log' produced NaN/Inf in output 0 (shape [3])");
    // Where: the scopes open when the op was recorded (modules push their type name the same way).
    try {
      autograd::AnomalyScope outer("Model");
      autograd::AnomalyScope inner("Head");
      (void)(x / zeros({3}, {.dtype = kFloat64}));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("created in Model > Head") != std::string::npos);
    }
    // Finite values pass, also on ops without a graph (nothing is checked when no node is recorded).
    CHECK(exp(x).sum().item<double>() > 0);
    NoGradGuard ng;
    CHECK(std::isnan(log(x).to_vector<double>()[1]));
  }
  CHECK_FALSE(autograd::anomaly_enabled());
}

TEST_CASE("anomaly mode: a backward producing NaN/Inf throws, naming the op and where it was created") {
  // sqrt at 0: forward finite (0), backward 1 / (2 sqrt 0) = Inf.
  Tensor x = tensor({0.0, 4.0}, {.dtype = kFloat64, .requires_grad = true});
  autograd::DetectAnomalyGuard anomaly;
  Tensor y;
  {
    autograd::AnomalyScope scope("Net");
    y = sqrt(x).sum();
  }
  try {
    y.backward();
    FAIL("no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("anomaly: the backward of 'sqrt' returned NaN/Inf in the gradient of input 0 (shape [2])") !=
          std::string::npos);
    CHECK(m.find("created in Net") != std::string::npos);
  }
  // A module's forward names the module: Linear with an Inf weight.
  auto lin = std::make_shared<nn::Linear>(2, 1);
  {
    NoGradGuard ng;
    lin->weight.fill_(std::numeric_limits<double>::infinity());
  }
  check_error([&] { (void)(*lin)(ones({1, 2})); }, "created in Linear");
}

TEST_CASE("all_finite: floating tensors scanned, others always finite") {
  CHECK(autograd::all_finite(tensor({1.0, 2.0})));
  CHECK_FALSE(autograd::all_finite(tensor({1.0, std::numeric_limits<double>::infinity()})));
  CHECK(autograd::all_finite(tensor(std::vector<int64_t>{1, 2}, {2})));
  CHECK(autograd::all_finite(Tensor()));
  CHECK(autograd::all_finite(zeros({0})));
}

// ---- deterministic mode -----------------------------------------------------------------------------------------

TEST_CASE("deterministic mode: the flag, and CUDA's atomic paths replaced by fixed-order sums") {
  CHECK_FALSE(deterministic_algorithms_enabled());
  use_deterministic_algorithms(true);
  CHECK(deterministic_algorithms_enabled());
  use_deterministic_algorithms(false);
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  struct Reset {
    ~Reset() { use_deterministic_algorithms(false); }
  } reset;
  // scatter_add along each dim of a 3-D index with repeated targets, and index_add (embedding backward) with many
  // indices into few rows, the shape that took atomics: deterministic results equal the CPU's exactly in float64
  // (each sum in index order, as the CPU adds), and repeat bit for bit in float32.
  Generator g(7);
  Tensor src = randn({4, 5, 6}, {.dtype = kFloat64}, &g);
  for (int d = 0; d < 3; ++d) {
    Tensor idx = randint(0, 3, {4, 5, 6}, {.dtype = kInt64}, &g);
    Tensor want = scatter_add(zeros({4, 5, 6}, {.dtype = kFloat64}), d, idx, src);
    use_deterministic_algorithms(true);
    Tensor got = scatter_add(zeros({4, 5, 6}, {.dtype = kFloat64, .device = gpu}), d, idx.to(gpu), src.to(gpu));
    Tensor f1 = scatter_add(zeros({4, 5, 6}, {.device = gpu}), d, idx.to(gpu), src.to(kFloat32).to(gpu));
    Tensor f2 = scatter_add(zeros({4, 5, 6}, {.device = gpu}), d, idx.to(gpu), src.to(kFloat32).to(gpu));
    use_deterministic_algorithms(false);
    CHECK(got.to_vector<double>() == want.to_vector<double>());
    CHECK(f1.to_vector<float>() == f2.to_vector<float>());
  }
  Tensor w = randn({3, 8}, {.dtype = kFloat64, .requires_grad = true}, &g);
  Tensor tokens = randint(0, 3, {200}, {.dtype = kInt64}, &g);
  Tensor gy = randn({200, 8}, {.dtype = kFloat64}, &g);
  embedding(w, tokens).backward(gy);
  Tensor want = w.grad();
  Tensor wg = w.detach().to(gpu).set_requires_grad();
  use_deterministic_algorithms(true);
  embedding(wg, tokens.to(gpu)).backward(gy.to(gpu));
  use_deterministic_algorithms(false);
  CHECK(wg.grad().to_vector<double>() == want.to_vector<double>());
}

// ---- aliasing of in-place ops ------------------------------------------------------------------------------------

namespace {
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }
}  // namespace

TEST_CASE("aliasing: an in-place op whose input shares the output's memory gives the non-aliased result") {
  Generator g(11);
  const Tensor x0 = randn({4, 4}, {.dtype = kFloat64}, &g);
  // Each case: the op on aliased arguments, and the same op with the input cloned first (the independent result).
  auto both = [&](const std::function<void(Tensor&, bool)>& op) {
    Tensor a = x0.clone(), b = x0.clone();
    op(a, false);  // aliased
    op(b, true);   // input cloned
    CHECK(values(a) == values(b));
    CHECK(values(a) != values(x0));  // the op did something
  };
  auto in = [](const Tensor& t, bool cloned) { return cloned ? t.clone() : t; };
  both([&](Tensor& x, bool c) { x.add_(in(x.t(), c)); });  // transposed self: x + x^T
  both([&](Tensor& x, bool c) { x.add_(in(x.t(), c), -2.5); });
  both([&](Tensor& x, bool c) { x.add_(in(x, c)); });                                   // exactly itself
  both([&](Tensor& x, bool c) { x.add_(in(x.select(0, 2), c)); });                      // a row of itself, broadcast
  both([&](Tensor& x, bool c) { x.narrow(0, 1, 3).copy_(in(x.narrow(0, 0, 3), c)); });  // shifted down one row
  both([&](Tensor& x, bool c) { x.narrow(0, 0, 3).copy_(in(x.narrow(0, 1, 3), c)); });  // shifted up one row
  both([&](Tensor& x, bool c) { x.copy_(in(x.t(), c)); });                              // transpose in place
  both([&](Tensor& x, bool c) { x.narrow(1, 1, 3).add_(in(x.narrow(1, 0, 3), c)); });   // overlapping columns
  both([&](Tensor& x, bool c) {
    Tensor flat = x.view({16});
    flat.slice(0, 0, 16, 2).copy_(in(flat.slice(0, 1, 16, 2), c));  // interleaved, never the same element
  });
}

TEST_CASE("aliasing: a destination whose elements share memory (expand) is refused; fill_ is allowed there") {
  Tensor base = arange(0, 4, 1, {.dtype = kFloat64}).view({1, 4});
  Tensor e = base.expand({3, 4});
  const auto before = values(base);
  check_error(
      [&] {
        e.copy_(randn({3, 4}, {.dtype = kFloat64}));
      },
      "copy_: unsupported operation: more than one element");
  check_error([&] { e.add_(ones({3, 4}, {.dtype = kFloat64})); }, "add_: unsupported operation");
  check_error([&] { e.add_(e); }, "add_: unsupported operation");
  check_error([&] { e.mul_(2.0); }, "mul_: unsupported operation");
  CHECK(values(base) == before);  // refused before anything was written
  e.fill_(7.0);                   // every element gets the same value: well defined
  CHECK(values(base) == std::vector<double>(4, 7.0));
  // Size-1 dims with any stride, and a 0-stride dim of size 1, are not overlap.
  Tensor one = zeros({1});
  one.expand({1}).copy_(ones({1}));
  CHECK(one.item<double>() == 1.0);
}

TEST_CASE("aliasing: mem_overlap, has_internal_overlap and the checks for in-place kernels") {
  Tensor a = arange(0, 12, 1, {.dtype = kFloat32}).view({3, 4});
  CHECK(mem_overlap(a, a) == MemOverlap::Full);
  CHECK(mem_overlap(a, a.view({3, 4})) == MemOverlap::Full);  // another handle, the same layout
  CHECK(mem_overlap(a, a.clone()) == MemOverlap::None);
  CHECK(mem_overlap(a.narrow(0, 0, 1), a.narrow(0, 2, 1)) == MemOverlap::None);  // disjoint rows
  CHECK(mem_overlap(a.narrow(0, 0, 2), a.narrow(0, 1, 2)) == MemOverlap::Partial);
  CHECK(mem_overlap(a, a.t()) == MemOverlap::Partial);
  CHECK(mem_overlap(a, a.view({4, 3})) == MemOverlap::Partial);                         // same memory, other order
  CHECK(mem_overlap(a.slice(1, 0, 4, 2), a.slice(1, 1, 4, 2)) == MemOverlap::Partial);  // interleaved: conservative
  CHECK(mem_overlap(a.narrow(0, 0, 0), a) == MemOverlap::None);                         // empty
  CHECK(mem_overlap(a, Tensor()) == MemOverlap::None);
  CHECK(mem_overlap(a.view({12}).to(kFloat32), a) == MemOverlap::Partial);  // to() of the same dtype is a view
  // A reversed view (negative stride, make_view) covers the same bytes.
  CHECK(mem_overlap(make_view(a, {4}, {-1}, 3), a.narrow(0, 0, 1)) == MemOverlap::Partial);
  CHECK(mem_overlap(make_view(a, {4}, {-1}, 3), a.narrow(0, 1, 1)) == MemOverlap::None);

  CHECK_FALSE(has_internal_overlap(a));
  CHECK_FALSE(has_internal_overlap(a.t()));
  CHECK_FALSE(has_internal_overlap(a.slice(1, 0, 4, 3)));
  CHECK_FALSE(has_internal_overlap(a.narrow(0, 1, 1).expand({1, 4})));
  CHECK_FALSE(has_internal_overlap(make_view(a, {4}, {-1}, 3)));
  CHECK(has_internal_overlap(a.narrow(0, 0, 1).expand({5, 4})));
  CHECK(has_internal_overlap(make_view(a, {3, 4}, {1, 1}, 0)));  // sliding windows (unfold)
  CHECK(has_internal_overlap(make_view(a, {2, 3}, {2, 1}, 0)));  // windows of 3 every 2
  CHECK_FALSE(has_internal_overlap(make_view(a, {2, 3}, {3, 1}, 0)));

  check_no_partial_overlap(a, a, "op_");  // elementwise on itself: allowed
  check_no_partial_overlap(a, a.clone(), "op_");
  check_no_partial_overlap(a, Tensor(), "op_");
  check_error([&] { check_no_partial_overlap(a.narrow(0, 1, 2), a.narrow(0, 0, 2), "op_"); },
              "op_: unsupported operation: some elements of the input tensor");
  check_error([&] { check_no_overlap(a, a, "matmul_"); }, "matmul_: unsupported operation");
  check_error([&] { check_no_internal_overlap(a.narrow(0, 0, 1).expand({2, 4}), "op_"); }, "more than one element");
}

// ---- models and the sampler: the accepted options, each bound on each side (docs/modules.md) ---------------------

namespace {
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

models::TransformerClassifierOptions small_classifier() {
  return models::TransformerClassifierOptions(8, 6, 3).d_model(8).heads(2).layers(1).ffn(8).dropout(0.0);
}
void build(const models::TransformerClassifierOptions& o) { models::TransformerClassifier m(o); }
void build(const models::DecoderLMOptions& o) { models::DecoderLM m(o); }
}  // namespace

TEST_CASE("TransformerClassifier: every integer option at 0, 1, -1, INT64_MIN and INT64_MAX; dropout at its bounds") {
  using O = models::TransformerClassifierOptions;
  struct IntOption {
    const char* name;
    std::function<void(O&, int64_t)> set;
  };
  const std::vector<IntOption> options = {
      {"vocab", [](O& o, int64_t v) { o.vocab(v); }},     {"max_len", [](O& o, int64_t v) { o.max_len(v); }},
      {"classes", [](O& o, int64_t v) { o.classes(v); }}, {"d_model", [](O& o, int64_t v) { o.d_model(v).heads(1); }},
      {"heads", [](O& o, int64_t v) { o.heads(v); }},     {"layers", [](O& o, int64_t v) { o.layers(v); }},
      {"ffn", [](O& o, int64_t v) { o.ffn(v); }}};
  for (const auto& opt : options) {
    INFO(opt.name);
    for (int64_t bad : {int64_t{0}, int64_t{-1}, kMin}) {
      O o = small_classifier();
      opt.set(o, bad);
      check_error([&] { build(o); }, fmt::format("TransformerClassifier: {} must be >= 1, got {}", opt.name, bad));
    }
    O one = small_classifier();
    opt.set(one, 1);
    if (std::string(opt.name) != "heads") build(one);  // heads = 1 with d_model 8: fine too, but covered below
    O huge = small_classifier();
    opt.set(huge, kMax);
    // Refused, never allocated: a clear error (memory, int64 overflow of a size, or heads not dividing d_model).
    CHECK_THROWS_AS(build(huge), Error);
  }
  build(small_classifier().heads(1));
  build(small_classifier().heads(8));  // d_model / heads = 1
  check_error([] { build(small_classifier().layers(kMax)); }, "more than this machine's");
  check_error([] { build(small_classifier().d_model(kMax).heads(1)); }, "more than this machine's");
  check_error([] { build(small_classifier().heads(3)); }, "MultiHeadAttention");  // 8 % 3 != 0
  for (double p : {0.0, 0.5, 0.999}) build(small_classifier().dropout(p));
  for (double p : {-0.1, 1.0, 1.5, kNaN, kInf, -kInf})
    check_error([&] { build(small_classifier().dropout(p)); }, "dropout must be in [0, 1)");
  check_error([] { build(small_classifier().attention("sparse")); }, "unknown attention 'sparse'");
  // Token lengths: 1 .. max_len; 0 and max_len + 1 refused.
  models::TransformerClassifier m(small_classifier());
  CHECK(m.forward(zeros({2, 1}, {.dtype = kInt64})).shape() == Shape{2, 3});
  CHECK(m.forward(zeros({2, 6}, {.dtype = kInt64})).shape() == Shape{2, 3});
  check_error([&] { m.forward(zeros({2, 0}, {.dtype = kInt64})); }, "expected tokens (B, 1 <= T <= 6)");
  check_error([&] { m.forward(zeros({2, 7}, {.dtype = kInt64})); }, "expected tokens (B, 1 <= T <= 6)");
  check_error([&] { m.forward(Tensor()); }, "expected tokens");
}

TEST_CASE("TransformerClassifier: explicit attention widths and head counts must be the model's (0 takes them)") {
  // The attention options' d_model / heads are no longer silently replaced by the model's.
  check_error(
      [] {
        build(models::TransformerClassifierOptions(8, 6, 3)
                  .attention("ascender")
                  .ascender(nn::AscenderAttentionOptions(128, 2)));
      },
      "the ascender attention options have d_model 128 and heads 2, the model has d_model 128 and heads 4");
  check_error(
      [] {
        build(models::TransformerClassifierOptions(8, 6, 3).attention("asam").asam(nn::AsamAttentionOptions(256, 4)));
      },
      "the asam attention options have d_model 256 and heads 4, the model has d_model 128 and heads 4");
  check_error([] { build(small_classifier().attention("ascender").ascender(nn::AscenderAttentionOptions(16, 2))); },
              "d_model 16 and heads 2, the model has d_model 8 and heads 2");
  // Equal, or left at 0 (the default): built with the model's width and heads.
  for (const auto& attn : {nn::AscenderAttentionOptions(8, 2).k({2}), nn::AscenderAttentionOptions(0, 0).k({2}),
                           nn::AscenderAttentionOptions(8, 0).k({2}), nn::AscenderAttentionOptions(0, 2).k({2})}) {
    models::TransformerClassifier m(small_classifier().attention("ascender").ascender(attn));
    auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(
        std::static_pointer_cast<nn::TransformerEncoderBlock>((*m.blocks)[0])->attn);
    REQUIRE(a != nullptr);
    CHECK(a->options.d_model() == 8);
    CHECK(a->options.heads() == 2);
  }
  build(small_classifier().attention("ascender"));  // the default options: the model's width, whatever it is
  build(small_classifier().attention("asam"));
  build(small_classifier().attention("asam").asam(nn::AsamAttentionOptions(8, 2)));
  // A mismatch in the options of an attention that is not used is no error.
  build(small_classifier().attention("dense").ascender(nn::AscenderAttentionOptions(128, 2)));
  // The factories refuse the same for any block: DecoderLM and hand-built blocks.
  check_error(
      [] {
        models::DecoderLM m(models::DecoderLMOptions(8).d_model(8).heads(2).layers(1).ffn(8),
                            nn::asam_attention_factory(nn::AsamAttentionOptions(16, 2)));
      },
      "asam_attention: the attention options have d_model 16 but the block (model) has d_model 8");
  check_error(
      [] {
        nn::TransformerEncoderBlock b(nn::TransformerBlockOptions(8, 2),
                                      nn::ascender_attention_factory(nn::AscenderAttentionOptions(8, 4)));
      },
      "ascender_attention: the attention options have heads 4 but the block (model) has heads 2");
  nn::TransformerEncoderBlock ok(nn::TransformerBlockOptions(8, 2),
                                 nn::ascender_attention_factory(nn::AscenderAttentionOptions(0, 0).k({2})));
}

TEST_CASE("TransformerBlockOptions and DecoderLM: the accepted options, each bound on each side") {
  for (double p : {-0.1, 1.0, kNaN})
    check_error([&] { nn::TransformerEncoderBlock b(nn::TransformerBlockOptions(8, 2).dropout(p)); }, "dropout");
  for (double eps : {-1e-5, kNaN, kInf})
    check_error([&] { nn::TransformerEncoderBlock b(nn::TransformerBlockOptions(8, 2).layer_norm_eps(eps)); },
                "layer_norm_eps must be finite and >= 0");
  nn::TransformerEncoderBlock fine(nn::TransformerBlockOptions(8, 2).layer_norm_eps(0).dropout(0.999));
  for (int64_t bad : {int64_t{0}, int64_t{-1}, kMin})
    check_error([&] { nn::TransformerEncoderBlock b(nn::TransformerBlockOptions(8, 2).ffn(bad)); }, "must be positive");

  using O = models::DecoderLMOptions;
  auto small = [] { return O(8).d_model(8).heads(2).layers(1).ffn(8); };
  const std::vector<std::pair<const char*, std::function<void(O&, int64_t)>>> ints = {
      {"vocab", [](O& o, int64_t v) { o.vocab(v); }},
      {"d_model", [](O& o, int64_t v) { o.d_model(v).heads(1); }},
      {"heads", [](O& o, int64_t v) { o.heads(v); }},
      {"layers", [](O& o, int64_t v) { o.layers(v); }},
      {"ffn", [](O& o, int64_t v) { o.ffn(v); }}};
  for (const auto& [name, set] : ints) {
    INFO(name);
    for (int64_t bad : {int64_t{0}, int64_t{-1}, kMin}) {
      O o = small();
      set(o, bad);
      check_error([&] { build(o); }, fmt::format("DecoderLM: {} must be >= 1, got {}", name, bad));
    }
    O huge = small();
    set(huge, kMax);
    CHECK_THROWS_AS(build(huge), Error);
  }
  build(small().vocab(1));
  build(small().layers(1).ffn(1));
  for (double p : {-0.1, 1.0, kNaN}) check_error([&] { build(small().dropout(p)); }, "dropout must be in [0, 1)");
  check_error([&] { models::DecoderLM m(small(), nn::AttentionFactory()); }, "empty attention factory");
  models::DecoderLM lm(small());
  const Tensor prompt = zeros({1, 2}, {.dtype = kInt64});
  CHECK(lm.generate(prompt, 0).shape() == Shape{1, 2});
  CHECK(lm.generate(prompt, 1).shape() == Shape{1, 3});
  check_error([&] { lm.generate(prompt, -1); }, "steps >= 0");
  check_error([&] { lm.generate(prompt, kMax); }, "overflows int64");
  check_error([&] { lm.forward(zeros({1, 0}, {.dtype = kInt64})); }, "T >= 1");
  check_error([&] { lm.loss(zeros({1, 1}, {.dtype = kInt64})); }, "T >= 2");
}

TEST_CASE("DistributedSampler: the accepted options, each bound on each side, and its shares against a direct count") {
  using distributed::DistributedSampler;
  // world_size >= 1; 0 <= rank < world_size
  for (int w : {0, -1, INT_MIN}) check_error([&] { DistributedSampler s(10, 0, w); }, "world_size must be >= 1");
  for (int r : {-1, 2, INT_MAX, INT_MIN})
    check_error([&] { DistributedSampler s(10, r, 2); }, "is not in a world of size 2");
  CHECK(DistributedSampler(10, 1, 2).num_samples() == 5);
  // dataset_size >= 1; with drop_last >= world_size
  for (int64_t n : {int64_t{0}, int64_t{-1}, kMin})
    check_error([&] { DistributedSampler s(n, 0, 1); }, "the dataset is empty");
  CHECK(DistributedSampler(1, 0, 1).indices() == std::vector<int64_t>{0});
  check_error([] { DistributedSampler s(2, 0, 3, {.drop_last = true}); }, "drop_last with 2 examples for 3 ranks");
  CHECK(DistributedSampler(3, 2, 3, {.drop_last = true}).num_samples() == 1);
  // A huge world over a small dataset: every rank gets one (padded) example, without materialising the padding.
  DistributedSampler wide(1, INT_MAX - 1, INT_MAX);
  CHECK(wide.indices() == std::vector<int64_t>{0});
  // INT64 extremes: padding that overflows is refused; a share larger than memory is an asc::Error, not bad_alloc.
  check_error([] { DistributedSampler s(kMax, 0, 2); }, "overflows int64");
  CHECK(DistributedSampler(kMax, 0, 1).num_samples() == kMax);
  DistributedSampler huge(kMax - 1, 1, 2, {.shuffle = false});
  CHECK(huge.num_samples() == kMax / 2);
  check_error([&] { (void)huge.indices(); }, "more than this machine's");
  DistributedSampler huge_dropped(kMax, 1, 2, {.drop_last = true});
  CHECK(huge_dropped.num_samples() == kMax / 2);
  check_error([&] { (void)huge_dropped.indices(); }, "more than this machine's");
  // Any epoch (seed + epoch wraps): a permutation each time.
  DistributedSampler s(7, 0, 1, {.seed = 5});
  for (int64_t epoch : {kMin, int64_t{-1}, int64_t{0}, kMax}) {
    s.set_epoch(epoch);
    auto idx = s.indices();
    CHECK(std::set<int64_t>(idx.begin(), idx.end()).size() == 7u);
  }
  // Unshuffled shares against the definition: 0 .. n-1, padded by repeating from its start up to a multiple of the
  // world size (or cut to one), dealt out to the ranks in turn.
  for (int64_t n : {1, 5, 10, 11}) {
    for (int w : {1, 2, 3, 4, 12}) {
      for (bool drop : {false, true}) {
        if (drop && n < w) continue;
        std::vector<int64_t> padded;
        for (int64_t i = 0; i < n; ++i) padded.push_back(i);
        while (padded.size() % w != 0) {
          if (drop)
            padded.pop_back();
          else
            padded.push_back(padded[padded.size() - static_cast<size_t>(n)]);
        }
        std::vector<std::vector<int64_t>> dealt(static_cast<size_t>(w));
        for (size_t p = 0; p < padded.size(); ++p) dealt[p % w].push_back(padded[p]);
        for (int r = 0; r < w; ++r)
          CHECK(DistributedSampler(n, r, w, {.shuffle = false, .drop_last = drop}).indices() == dealt[r]);
      }
    }
  }
}

// The block factories' names until 0.2 still build the same layers (deprecated for one minor version).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_CASE("deprecated factory names: nn::ascender_attention / nn::asam_attention build what the _factory names build") {
  nn::TransformerEncoderBlock a(nn::TransformerBlockOptions(8, 2),
                                nn::ascender_attention(nn::AscenderAttentionOptions(0, 0)));
  nn::TransformerEncoderBlock b(nn::TransformerBlockOptions(8, 2), nn::asam_attention(nn::AsamAttentionOptions(0, 0)));
  CHECK(std::dynamic_pointer_cast<nn::AscenderAttention>(a.attn) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::AsamAttention>(b.attn) != nullptr);
}
#pragma GCC diagnostic pop

TEST_CASE("a tensor larger than this machine's memory is an asc::Error before any allocation (not an abort)") {
  // 2^40 float32 = 4 TiB: under AddressSanitizer the system allocator would abort, elsewhere overcommit would
  // promise it and the kernel kill the process on first touch.
  check_error([] { empty({int64_t(1) << 40}); }, {"cpu allocator", "more than this machine's", "bytes of memory"});
  check_error([] { randn({int64_t(1) << 20, int64_t(1) << 20}); }, {"more than this machine's"});
  CHECK(empty({16}).numel() == 16);  // small ones are unaffected
}
