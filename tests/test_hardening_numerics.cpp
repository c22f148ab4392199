// Hardening of the core ops' numerics and parallelism: exceptions thrown inside parallel regions reach the caller,
// NaN propagates as in PyTorch, and results do not depend on the number of threads.
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>

#include "ops/cpu/loops.h"
#include "testing.h"

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

using namespace asc;
using namespace asc::testing;

namespace {}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Exceptions inside parallel regions: without a capture, an exception leaving an OpenMP region calls
// std::terminate. These cases would abort the test binary, not fail a CHECK, if the capture were missing.

TEST_CASE("parallel_for: an exception thrown on every thread reaches the caller") {
  for (int threads : {1, 2, 4}) {
    ThreadCount tc(threads);
    CHECK_THROWS_WITH_AS(cpu::parallel_for(1 << 20, 1, [](int64_t, int64_t) { throw asc::Error("boom"); }),
                         doctest::Contains("boom"), asc::Error);
  }
}

TEST_CASE("parallel_for: an exception thrown on one thread only reaches the caller; the others finish") {
  for (int threads : {2, 3, 4}) {
    ThreadCount tc(threads);
    const int64_t n = 1 << 20;
    std::atomic<int64_t> done{0};
    // Only the range holding the last index throws (the last thread's range). A thread that starts after the throw
    // skips its range, one that started before finishes it: either way nothing is counted twice or half.
    CHECK_THROWS_WITH_AS(cpu::parallel_for(n, 1,
                                           [&](int64_t b, int64_t e) {
                                             if (e == n) throw std::runtime_error("last range");
                                             done += e - b;
                                           }),
                         doctest::Contains("last range"), std::runtime_error);
    CHECK(done.load() < n);
    // The loop is usable again afterwards.
    std::atomic<int64_t> total{0};
    cpu::parallel_for(n, 1, [&](int64_t b, int64_t e) { total += e - b; });
    CHECK(total.load() == n);
  }
}

TEST_CASE("for_each_strided: exceptions from the callback reach the caller (one long run and many rows)") {
  ThreadCount tc(4);
  const int64_t n = 1 << 18;
  // One long contiguous run: split into chunks across threads.
  CHECK_THROWS_AS(
      cpu::for_each_strided<1>(Shape{n}, {Strides{1}},
                               [&](const std::array<int64_t, 1>& off, int64_t, const std::array<int64_t, 1>&) {
                                 if (off[0] == 0) throw asc::Error("first chunk");
                               }),
      asc::Error);
  // Many rows (a transposed operand keeps the rows apart): only the row holding element 0 throws.
  CHECK_THROWS_WITH_AS(
      cpu::for_each_strided<2>(Shape{512, 512}, {Strides{512, 1}, Strides{1, 512}},
                               [&](const std::array<int64_t, 2>& off, int64_t, const std::array<int64_t, 2>&) {
                                 if (off[0] == 0) throw std::invalid_argument("row zero");
                               }),
      doctest::Contains("row zero"), std::invalid_argument);
  // Serial request: the exception passes straight through.
  CHECK_THROWS_AS(
      cpu::for_each_strided<1>(
          Shape{n}, {Strides{1}},
          [&](const std::array<int64_t, 1>&, int64_t, const std::array<int64_t, 1>&) { throw asc::Error("serial"); },
          false),
      asc::Error);
}

// ---------------------------------------------------------------------------------------------------------------
// Determinism across thread counts: with use_deterministic_algorithms(true), every CPU op gives the same bits at 1,
// 2, 3 and 4 threads. Each input is big enough for the op to go parallel (parallel_for's grain is 32768).

namespace {

// Runs fn at 1, 2, 3 and 4 OpenMP threads (deterministic mode on) and requires every output to have the bits of
// the 1-thread run.
void require_thread_independent(const std::string& what, const std::function<TensorList()>& fn) {
  asc::use_deterministic_algorithms(true);
  TensorList ref;
  {
    ThreadCount tc(1);
    ref = fn();
  }
  for (int threads : {2, 3, 4}) {
    ThreadCount tc(threads);
    TensorList got = fn();
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto a = ref[i].to_vector<double>(), b = got[i].to_vector<double>();
      REQUIRE(a.size() == b.size());
      size_t bad = a.size();
      for (size_t j = 0; j < a.size() && bad == a.size(); ++j)
        if (std::memcmp(&a[j], &b[j], sizeof(double)) != 0) bad = j;
      CHECK_MESSAGE(bad == a.size(), what << " output " << i << " at " << threads << " threads differs at element "
                                          << bad << ": " << (bad < a.size() ? b[bad] : 0) << " vs "
                                          << (bad < a.size() ? a[bad] : 0) << " at 1 thread");
    }
  }
  asc::use_deterministic_algorithms(false);
}

Tensor grad_of(const Tensor& x) { return x.grad(); }

}  // namespace

TEST_CASE("determinism: reductions give the same bits at 1, 2, 3 and 4 threads") {
  for (DType dt : {kFloat32, kFloat64}) {
    Generator g(3);
    const Tensor x = randn({517, 389}, {.dtype = dt}, &g);  // odd sizes: thread ranges split unevenly
    const Tensor xt = x.transpose(0, 1);                    // a strided view
    const Tensor big = randn({1 << 20}, {.dtype = dt}, &g);
    require_thread_independent("sum", [&] { return TensorList{sum(x), sum(xt), sum(big), sum(x, {0}), sum(x, {1})}; });
    require_thread_independent("mean", [&] { return TensorList{mean(x), mean(big), mean(xt, {1})}; });
    require_thread_independent("var/std", [&] { return TensorList{var(x), asc::std(big), var(x, {0})}; });
    require_thread_independent("norm", [&] { return TensorList{norm(x), norm(big, 1.0), norm(x, 3.0, {1})}; });
    require_thread_independent("logsumexp/amax", [&] {
      return TensorList{logsumexp(x, {1}), amax(x, {0}), argmax(x, 1)};
    });
  }
}

TEST_CASE("determinism: nn ops forward and backward give the same bits at 1, 2, 3 and 4 threads") {
  Generator g(5);
  const Tensor x0 = randn({1031, 96}, {}, &g), w0 = randn({96}, {}, &g), b0 = randn({96}, {}, &g);
  const Tensor tgt = randint(0, 96, {1031}, {.dtype = kInt64}, &g);
  require_thread_independent("softmax / log_softmax / layer_norm / cross_entropy", [&] {
    Tensor x = x0.clone(), w = w0.clone(), b = b0.clone();
    x.set_requires_grad(true), w.set_requires_grad(true), b.set_requires_grad(true);
    Tensor y = layer_norm(x, {96}, w, b);
    Tensor loss =
        cross_entropy(y, tgt) + softmax(y, 1).pow(2.0).mean() + log_softmax(x, 0).mean() + rms_norm(x, {96}, w).mean();
    loss.backward();
    return TensorList{loss, y, grad_of(x), grad_of(w), grad_of(b)};
  });
}

TEST_CASE("determinism: matmul and linear give the same bits at 1, 2, 3 and 4 threads") {
  Generator g(7);
  for (auto [M, K, N] : {std::array<int64_t, 3>{7, 300, 500}, {513, 257, 129}, {1000, 64, 3}, {2, 4096, 33}}) {
    const Tensor a = randn({M, K}, {}, &g), b = randn({K, N}, {}, &g);
    require_thread_independent(fmt::format("matmul {}x{}x{}", M, K, N), [&] {
      return TensorList{matmul(a, b), matmul(b.transpose(0, 1), a.transpose(0, 1))};
    });
  }
  const Tensor a3 = randn({3, 129, 70}, {}, &g), b3 = randn({3, 70, 300}, {}, &g);
  require_thread_independent("batched matmul", [&] { return TensorList{matmul(a3, b3)}; });
  const Tensor x0 = randn({333, 200}, {}, &g), w0 = randn({150, 200}, {}, &g), bias0 = randn({150}, {}, &g);
  require_thread_independent("linear backward", [&] {
    Tensor x = x0.clone(), w = w0.clone(), bias = bias0.clone();
    x.set_requires_grad(true), w.set_requires_grad(true), bias.set_requires_grad(true);
    Tensor y = linear(x, w, bias);
    (y * y).sum().backward();
    return TensorList{y, grad_of(x), grad_of(w), grad_of(bias)};
  });
}

TEST_CASE("determinism: attention and index ops give the same bits at 1, 2, 3 and 4 threads") {
  Generator g(11);
  const Tensor q0 = randn({2, 3, 150, 32}, {}, &g), k0 = randn({2, 3, 170, 32}, {}, &g),
               v0 = randn({2, 3, 170, 32}, {}, &g);
  const Tensor keep = gt(rand({2, 1, 150, 170}, {}, &g), 0.2);
  require_thread_independent("sdpa", [&] {
    Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
    q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
    Tensor o = scaled_dot_product_attention(q, k, v, keep);
    (o * o).sum().backward();
    return TensorList{o, grad_of(q), grad_of(k), grad_of(v)};
  });
  const Tensor table0 = randn({50, 300}, {}, &g);
  const Tensor idx = randint(0, 50, {4000}, {.dtype = kInt64}, &g);
  const Tensor src0 = randn({400, 300}, {}, &g);
  const Tensor gidx = randint(0, 400, {400, 300}, {.dtype = kInt64}, &g);
  require_thread_independent("embedding / gather backward", [&] {
    Tensor table = table0.clone(), src = src0.clone();
    table.set_requires_grad(true), src.set_requires_grad(true);
    Tensor e = embedding(table, idx);
    Tensor ga = gather(src, 0, gidx);
    ((e * e).sum() + (ga * ga).sum()).backward();
    return TensorList{grad_of(table), grad_of(src), scatter_add(src0, 0, gidx, src0)};
  });
}

// ---------------------------------------------------------------------------------------------------------------
// NaN propagates as in PyTorch (expected values written by hand from PyTorch's definitions). Each case runs on the
// CPU and, where there is one, on the CUDA device (the emulator in the cuda-emu build), in float32 and float64.

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (cuda::is_available()) d.push_back(Device::cuda());
  return d;
}

// NaN where `want` has NaN, +-inf where it has them, and within float32 rounding (2e-7 relative) elsewhere.
void check_exact(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const auto v = got.to(Device::cpu()).to_vector<double>();
  REQUIRE_MESSAGE(v.size() == want.size(), what);
  for (size_t i = 0; i < v.size(); ++i) {
    const bool ok = (std::isnan(v[i]) && std::isnan(want[i])) || v[i] == want[i] ||
                    (std::isfinite(want[i]) && std::abs(v[i] - want[i]) <= 2e-7 * std::abs(want[i]));
    CHECK_MESSAGE(ok, what << ": element " << i << " is " << v[i] << ", expected " << want[i]);
  }
}

// The NaN positions of a tensor, as 0/1.
std::vector<int> nan_pattern(const Tensor& t) {
  std::vector<int> r;
  for (double v : t.to(Device::cpu()).to_vector<double>()) r.push_back(std::isnan(v) ? 1 : 0);
  return r;
}

}  // namespace

TEST_CASE("NaN: relu, maximum, minimum, clamp and the activations propagate NaN, forward and backward") {
  for (Device dev : devices())
    for (DType dt : {kFloat32, kFloat64}) {
      INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
      INFO("dtype " << dtype_name(dt));
      const TensorOptions o{.dtype = dt, .device = dev};
      Tensor x = tensor({kNaN, -1.0, 0.0, 2.0, -kInf, kInf}, o).detach();
      x.set_requires_grad(true);
      Tensor y = relu(x);
      check_exact(y, {kNaN, 0, 0, 2, 0, kInf}, "relu");
      y.backward(ones({6}, o));
      // PyTorch's threshold_backward passes the gradient wherever relu(x) is not <= 0: NaN included.
      check_exact(x.grad(), {1, 0, 0, 1, 0, 1}, "relu backward");

      const Tensor zero = zeros({6}, o), nanv = full({6}, kNaN, o);
      check_exact(maximum(x.detach(), zero), {kNaN, 0, 0, 2, 0, kInf}, "maximum(x, 0)");
      check_exact(maximum(zero, x.detach()), {kNaN, 0, 0, 2, 0, kInf}, "maximum(0, x)");
      check_exact(minimum(x.detach(), zero), {kNaN, -1, 0, 0, -kInf, 0}, "minimum(x, 0)");
      check_exact(minimum(zero, x.detach()), {kNaN, -1, 0, 0, -kInf, 0}, "minimum(0, x)");
      check_exact(maximum(nanv, x.detach()), std::vector<double>(6, kNaN), "maximum(NaN, x)");
      check_exact(minimum(x.detach(), nanv), std::vector<double>(6, kNaN), "minimum(x, NaN)");
      check_exact(clamp(x.detach(), 0.0, 1.0), {kNaN, 0, 0, 1, 0, 1}, "clamp");
      check_exact(clamp(x.detach(), std::nullopt, 1.0), {kNaN, -1, 0, 1, -kInf, 1}, "clamp_max");
      check_exact(clamp(x.detach(), 0.0, std::nullopt), {kNaN, 0, 0, 2, 0, kInf}, "clamp_min");
      const Tensor n1 = tensor({kNaN}, o);
      check_exact(asc::abs(n1), {kNaN}, "abs");
      check_exact(asc::silu(n1), {kNaN}, "silu");
      check_exact(asc::sigmoid(n1), {kNaN}, "sigmoid");
      check_exact(asc::tanh(n1), {kNaN}, "tanh");
      check_exact(asc::exp(n1), {kNaN}, "exp");
      check_exact(asc::sqrt(n1), {kNaN}, "sqrt");
      check_exact(asc::neg(n1), {kNaN}, "neg");
      check_exact(gelu(n1), {kNaN}, "gelu");
      check_exact(gelu(n1, true), {kNaN}, "gelu tanh");
      check_exact(softplus(n1), {kNaN}, "softplus");

      // maximum / minimum backward: PyTorch gives each side g unless it lost outright (g/2 on ties), so at a NaN
      // both sides get g.
      Tensor a = tensor({kNaN, 1.0, 3.0, 2.0}, o).detach(), b = tensor({0.0, kNaN, 1.0, 2.0}, o).detach();
      a.set_requires_grad(true), b.set_requires_grad(true);
      maximum(a, b).sum().backward();
      check_exact(a.grad(), {1, 1, 1, 0.5}, "maximum backward a");
      check_exact(b.grad(), {1, 1, 0, 0.5}, "maximum backward b");
      a = a.detach(), b = b.detach();
      a.set_requires_grad(true), b.set_requires_grad(true);
      minimum(a, b).sum().backward();
      check_exact(a.grad(), {1, 1, 0, 0.5}, "minimum backward a");
      check_exact(b.grad(), {1, 1, 1, 0.5}, "minimum backward b");
    }
}

TEST_CASE("NaN: reductions give NaN; max / min / argmax point at the NaN") {
  for (Device dev : devices())
    for (DType dt : {kFloat32, kFloat64}) {
      INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
      INFO("dtype " << dtype_name(dt));
      const Tensor x = tensor({1.0, kNaN, 5.0, -2.0, 3.0, 4.0}, {6}, {.dtype = dt, .device = dev}).view({2, 3});
      check_exact(sum(x, {1}), {kNaN, 5}, "sum");
      check_exact(mean(x), {kNaN}, "mean");
      check_exact(var(x, {1}), {kNaN, 31.0 / 3}, "var");
      check_exact(norm(x, 2.0, {1}), {kNaN, std::sqrt(29.0)}, "norm");
      check_exact(amax(x, {1}), {kNaN, 4}, "amax");
      check_exact(amin(x, {0}), {-2, kNaN, 4}, "amin");
      check_exact(argmax(x, 1), {1, 2}, "argmax");
      check_exact(argmin(x, 1), {1, 0}, "argmin");
      check_exact(max(x, 1).values, {kNaN, 4}, "max");
      check_exact(logsumexp(x, {1}), {kNaN, std::log(std::exp(-2.0) + std::exp(3.0) + std::exp(4.0))}, "logsumexp");
    }
}

TEST_CASE("NaN: softmax and log_softmax give NaN on a row holding a NaN; only masked rows give 0") {
  for (Device dev : devices())
    for (DType dt : {kFloat32, kFloat64})
      for (bool log : {false, true}) {
        INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
        INFO("dtype " << dtype_name(dt));
        CAPTURE(log);
        const TensorOptions o{.dtype = dt, .device = dev};
        auto sm = [&](const Tensor& x, const Tensor& m = {}) { return log ? log_softmax(x, 1, m) : softmax(x, 1, m); };
        // Rows: all NaN; one NaN; NaN and -inf; all -inf (a dead row); +inf and a finite value; a plain row.
        const Tensor x = tensor(
            {kNaN, kNaN, kNaN, 1.0, kNaN, 2.0, kNaN, -kInf, -kInf, -kInf, -kInf, -kInf, kInf, 0.0, 1.0, 0.0, 0.0, 0.0},
            {6, 3}, o);
        Tensor y = sm(x);
        const std::vector<int> nan_rows{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0};
        CHECK(nan_pattern(y) == nan_rows);
        const auto v = y.to(Device::cpu()).to_vector<double>();
        for (int j = 9; j < 12; ++j) CHECK(v[j] == 0.0);  // dead row: zeros (log_softmax too)
        const double p = log ? -std::log(3.0) : 1.0 / 3.0;
        for (int j = 15; j < 18; ++j) CHECK(v[j] == doctest::Approx(p));

        // Masked: a NaN at a masked position is never read; a NaN at a kept one poisons the kept entries only;
        // a row with nothing kept gives zeros.
        const Tensor xm = tensor({kNaN, 1.0, 1.0, kNaN, 1.0, 1.0, kNaN, kNaN, kNaN}, {3, 3}, o);
        const Tensor keep = gt(tensor({0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0}, {3, 3}, o), 0.5);
        const Tensor ym = sm(xm, keep);
        const double half = log ? -std::log(2.0) : 0.5, masked = log ? -kInf : 0.0;
        check_exact(ym, {masked, half, half, kNaN, kNaN, masked, 0, 0, 0}, "masked softmax");
      }
}

TEST_CASE("NaN: cross_entropy and layer_norm give NaN on the rows that hold one, and only there") {
  for (Device dev : devices())
    for (DType dt : {kFloat32, kFloat64}) {
      INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
      INFO("dtype " << dtype_name(dt));
      const TensorOptions o{.dtype = dt, .device = dev};
      const Tensor x = tensor({kNaN, 1.0, 2.0, 0.0, 1.0, 2.0}, {2, 3}, o);
      const Tensor t = tensor({1.0, 2.0}, {.dtype = kInt64, .device = dev});
      check_exact(isnan(cross_entropy(x, t, {.reduction = Reduction::None})).to(kFloat64), {1, 0}, "cross_entropy");
      CHECK(std::isnan(cross_entropy(x, t).item<double>()));
      CHECK(nan_pattern(layer_norm(x, {3})) == std::vector<int>{1, 1, 1, 0, 0, 0});
      CHECK(nan_pattern(rms_norm(x, {3})) == std::vector<int>{1, 1, 1, 0, 0, 0});
    }
}

TEST_CASE("NaN: scaled_dot_product_attention gives NaN on a NaN query's row (every backend), zeros on masked rows") {
  struct Restore {
    SdpaBackend prev = sdpa_backend();
    ~Restore() { set_sdpa_backend(prev); }
  } restore;
  for (Device dev : devices())
    for (DType dt : {kFloat32, kFloat64})
      for (SdpaBackend backend : {SdpaBackend::Math, SdpaBackend::Fused}) {
        INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
        INFO("dtype " << dtype_name(dt));
        CAPTURE(static_cast<int>(backend));
        const TensorOptions o{.dtype = dt, .device = dev};
        const int64_t B = 1, H = 2, T = 5, S = 40, D = 8;  // S > 32: the CUDA kernel walks two key tiles
        Generator g(2);
        Tensor q = randn({B, H, T, D}, {.dtype = dt}, &g), k = randn({B, H, S, D}, {.dtype = dt}, &g),
               v = randn({B, H, S, D}, {.dtype = dt}, &g);
        // Query row 1 of head 0 is NaN; row 3 of head 1 sees no key (masked out entirely).
        auto qa = q.to_vector<double>();
        for (int64_t c = 0; c < D; ++c) qa[(0 * T + 1) * D + c] = kNaN;
        q = tensor(std::span<const double>(qa), q.shape(), {.dtype = dt});
        std::vector<double> keepv(static_cast<size_t>(H * T * S), 1.0);
        for (int64_t s = 0; s < S; ++s) keepv[static_cast<size_t>((1 * T + 3) * S + s)] = 0.0;
        const Tensor keep = gt(tensor(std::span<const double>(keepv), {1, H, T, S}, {.device = dev}), 0.5);
        q = q.to(dev), k = k.to(dev), v = v.to(dev);
        set_sdpa_backend(SdpaBackend::Auto);
        if (backend == SdpaBackend::Fused && sdpa_choice(q, k, v, {.keep_mask = keep}).rfind("fused", 0) != 0) {
          MESSAGE("no fused kernel here: " << sdpa_choice(q, k, v, {.keep_mask = keep}));
          continue;
        }
        set_sdpa_backend(backend);
        q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
        const Tensor out = scaled_dot_product_attention(q, k, v, keep);
        std::vector<int> want(static_cast<size_t>(H * T * D), 0);
        for (int64_t c = 0; c < D; ++c) want[static_cast<size_t>((0 * T + 1) * D + c)] = 1;
        CHECK(nan_pattern(out) == want);
        const auto ov = out.detach().to(Device::cpu()).to_vector<double>();
        for (int64_t c = 0; c < D; ++c) CHECK(ov[static_cast<size_t>((1 * T + 3) * D + c)] == 0.0);
        out.sum().backward();
        // The NaN row's gradient is NaN (its row of dq; every dk, dv row of its head sees it); head 1 stays finite.
        const auto dq = nan_pattern(q.grad()), dk = nan_pattern(k.grad());
        CHECK(dq[static_cast<size_t>((0 * T + 1) * D)] == 1);
        for (int64_t i = T * D; i < H * T * D; ++i) CHECK(dq[static_cast<size_t>(i)] == 0);
        CHECK(dk[0] == 1);
        for (int64_t i = S * D; i < H * S * D; ++i) CHECK(dk[static_cast<size_t>(i)] == 0);
      }
}

// ---------------------------------------------------------------------------------------------------------------
// The "Accepted options" table of docs/ops.md, walked bound by bound on every device: the checks live in the ops,
// before the dispatch, so the CPU and the CUDA backend accept and refuse the same values with the same message.

TEST_CASE("accepted options: each bound of docs/ops.md's table, each side, on every device") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  for (Device dev : devices()) {
    INFO("device " << std::string(dev.is_cuda() ? "cuda" : "cpu"));
    const TensorOptions o{.device = dev};
    Generator g(1);
    const Tensor x = randn({3, 4}, {}, &g).to(dev);

    // softmax / log_softmax: dim in [-ndim, ndim); mask bool and broadcastable.
    CHECK(softmax(x, -2).shape() == x.shape());
    CHECK(softmax(x, 1).shape() == x.shape());
    for (int64_t d : {int64_t{2}, int64_t{-3}, kMax, kMin})
      check_error([&] { softmax(x, d); }, {"softmax", "out of range"});
    check_error([&] { softmax(x, 1, ones({3, 4}, o)); }, {"softmax", "mask must be a bool"});
    check_error([&] { log_softmax(x, 1, gt(ones({5}, o), 0.0)); }, {"log_softmax", "does not broadcast"});

    // layer_norm / rms_norm: eps finite, >= 0.
    CHECK(layer_norm(x, {4}, {}, {}, 0.0).shape() == x.shape());
    CHECK(rms_norm(x, {4}, {}, 1e300).shape() == x.shape());
    for (double eps : {-1e-300, kNaN, kInf, -kInf}) {
      check_error([&] { layer_norm(x, {4}, {}, {}, eps); }, {"layer_norm", "eps"});
      check_error([&] { rms_norm(x, {4}, {}, eps); }, {"rms_norm", "eps"});
    }

    // cross_entropy: label_smoothing in [0, 1]; ignore_index any int64 (INT64_MIN / INT64_MAX included).
    const Tensor t = tensor({0.0, 3.0, 1.0}, {.dtype = kInt64, .device = dev});
    for (double s : {0.0, 1.0}) CHECK(std::isfinite(cross_entropy(x, t, {.label_smoothing = s}).item<double>()));
    for (double s : {-1e-12, 1.0 + 1e-12, kNaN, kInf})
      check_error([&] { cross_entropy(x, t, {.label_smoothing = s}); }, {"cross_entropy", "label_smoothing"});
    for (int64_t ig : {kMin, kMax, int64_t{0}})
      CHECK(std::isfinite(cross_entropy(x, t, {.ignore_index = ig}).item<double>()));
    check_error(
        [&] {
          cross_entropy(x, tensor({0.0, 4.0, 1.0}, {.dtype = kInt64, .device = dev}));
        },
        {"cross_entropy", "out of range"});

    // dropout: p in [0, 1] (1 drops everything).
    CHECK(dropout(x, 0.0).to(Device::cpu()).to_vector<double>() == x.to(Device::cpu()).to_vector<double>());
    CHECK(sum(abs(dropout(x, 1.0))).item<double>() == 0.0);
    for (double p : {-1e-12, 1.0 + 1e-12, kNaN, kInf}) check_error([&] { dropout(x, p); }, {"dropout", "[0, 1]"});

    // clamp: bounds any non-NaN value, lo <= hi (equal allowed, +-inf allowed).
    CHECK(clamp(x, 0.5, 0.5).to(Device::cpu()).to_vector<double>() == std::vector<double>(12, 0.5));
    CHECK(clamp(x, -kInf, kInf).to(Device::cpu()).to_vector<double>() == x.to(Device::cpu()).to_vector<double>());
    check_error([&] { clamp(x, 1.0, 0.0); }, {"clamp", "above upper bound"});
    check_error([&] { clamp(x, kNaN, 1.0); }, {"clamp", "NaN"});
    check_error([&] { clamp(x, std::nullopt, kNaN); }, {"clamp", "NaN"});

    // softplus: beta positive and finite; threshold any non-NaN value (+-inf: never / always linear).
    CHECK(std::isfinite(sum(softplus(x, 1e-30, kInf)).item<double>()));
    CHECK(softplus(x, 1e30, -kInf).to(Device::cpu()).to_vector<double>() == x.to(Device::cpu()).to_vector<double>());
    for (double beta : {0.0, -1.0, kNaN, kInf}) check_error([&] { softplus(x, beta); }, {"softplus", "beta"});
    check_error([&] { softplus(x, 1.0, kNaN); }, {"softplus", "threshold"});

    // var / std: correction in [0, N).
    CHECK(std::isfinite(var(x, {1}, 3).sum().item<double>()));
    CHECK(std::isfinite(asc::std(x, {}, 0).item<double>()));
    for (int64_t c : {int64_t{4}, int64_t{-1}, kMax, kMin}) {
      check_error([&] { var(x, {1}, c); }, {"var", "correction"});
      check_error([&] { asc::std(x, {1}, c); }, {"std", "correction"});
    }

    // norm: p >= 1, +inf allowed (max |x|).
    CHECK(norm(x, 1.0).item<double>() > 0);
    CHECK(norm(x, kInf).item<double>() == amax(abs(x)).item<double>());
    for (double p : {0.999, 0.0, -1.0, kNaN, -kInf}) check_error([&] { norm(x, p); }, {"norm", "p must be"});

    // reductions: dims in [-ndim, ndim), no repeats; no reduction over an empty dimension where there is no value.
    for (int64_t d : {int64_t{2}, int64_t{-3}, kMax, kMin}) {
      check_error([&] { sum(x, {d}); }, {"sum", "out of range"});
      check_error([&] { max(x, d); }, {"max", "out of range"});
    }
    const Tensor e = zeros({0, 4}, o);
    CHECK(sum(e).item<double>() == 0.0);
    check_error([&] { mean(e, {0}); }, {"mean", "empty"});
    check_error([&] { amax(e, {0}); }, {"amax", "size 0"});

    // scaled_dot_product_attention: dropout in [0, 1); keep_mask bool (a float mask is refused on every device,
    // before any kernel reads it as bool); bias floating.
    const Tensor q = randn({1, 2, 3, 4}, {}, &g).to(dev);
    CHECK(scaled_dot_product_attention(q, q, q, {}, {}, 0.0, true).shape() == q.shape());
    for (double p : {1.0, -1e-12, kNaN, kInf})
      check_error([&] { scaled_dot_product_attention(q, q, q, {}, {}, p, true); },
                  {"scaled_dot_product_attention", "dropout"});
    for (SdpaBackend backend : {SdpaBackend::Auto, SdpaBackend::Math, SdpaBackend::Fused}) {
      const SdpaBackend prev = sdpa_backend();
      set_sdpa_backend(backend);
      check_error(
          [&] {
            scaled_dot_product_attention(q, q, q, ones({1, 1, 3, 3}, o));
          },
          {"scaled_dot_product_attention", "keep_mask must be bool"});
      check_error(
          [&] {
            scaled_dot_product_attention(q, q, q, {}, gt(ones({1, 1, 3, 3}, o), 0.0));
          },
          {"scaled_dot_product_attention", "bias must be floating"});
      set_sdpa_backend(prev);
    }
  }
}

TEST_CASE(
    "determinism: a training step (linear, layer_norm, attention, cross-entropy, AdamW) has the same bits at 1 "
    "and 2 threads") {
  // Large enough that every op goes parallel: B·T = 512 rows of width 128, 4 heads of 32, T = 64.
  const int64_t B = 8, T = 64, D = 128, C = 10;
  Generator g(21);
  const Tensor x = randn({B, T, 32}, {}, &g);
  const Tensor y = randint(0, C, {B * T}, {.dtype = kInt64}, &g);
  const Tensor keep = gt(rand({B, 1, 1, T}, {}, &g), 0.1);
  auto step = [&]() -> TensorList {
    manual_seed(5);
    auto in = std::make_shared<nn::Linear>(32, D);
    auto ln = std::make_shared<nn::LayerNorm>(D);
    auto mha = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(D, 4));
    auto head = std::make_shared<nn::Linear>(D, C);
    std::vector<Tensor> params;
    for (nn::Module* m : std::initializer_list<nn::Module*>{in.get(), ln.get(), mha.get(), head.get()})
      for (const Tensor& p : m->parameters()) params.push_back(p);
    optim::AdamW opt(params, {.lr = 1e-2});
    Tensor loss;
    for (int it = 0; it < 2; ++it) {
      opt.zero_grad();
      Tensor h = ln->forward(in->forward(x));
      h = h + mha->attend(h, {.key_padding_mask = keep.view({B, T})});
      loss = cross_entropy(head->forward(h).reshape({B * T, C}), y);
      loss.backward();
      opt.step();
    }
    TensorList out{loss.detach()};
    for (const Tensor& p : params) out.push_back(p.detach().clone());
    return out;
  };
  require_thread_independent("training step", step);
}
