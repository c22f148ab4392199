// Hostile input that used to get past the checks (issue #15): sizes whose products overflow 64 bits, methods of an
// undefined Tensor, an optimizer with nothing to optimise. Each must throw asc::Error naming the op; none may crash
// or hand back a tensor whose shape is larger than its storage.
#include <limits>

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
  check_error([] { eye(int64_t{1} << 32); }, "eye");          // n * n = 2^64
  check_error([] { eye(3037000500); }, "eye");                // n * n just above 2^63
  Tensor idx = tensor(std::vector<int64_t>{0, 1, 2}, {3});
  check_error([&] { one_hot(idx, kMax); }, "one_hot");        // 3 * (2^63 - 1)
  check_error([] { arange(0.0, 1e300); }, "arange");           // does not fit in int64
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
  check_error([&] { make_view(x, {2, 3}, {3, 1}, 1); }, "outside the storage");     // last element at 6
  check_error([&] { make_view(x, {3, 3}, {3, 1}, 0); }, "outside the storage");
  check_error([&] { make_view(x, {2}, {kMax, 1}, 0); }, "view");                    // shape and strides differ
  check_error([&] { make_view(x, {2}, {kMax}, 0); }, "outside the storage");
  check_error([&] { make_view(x, {3}, {kMax}, 0); }, "offset overflow");
  check_error([&] { make_view(x, {2}, {-1}, 0); }, "outside the storage");
  CHECK(make_view(x, {2}, {-1}, 1).numel() == 2);  // negative strides within bounds are fine
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
