// The CPU kernels' instruction set levels (core/cpu_isa.h, ops/cpu/vec_math.h: ASC_CPU_DISPATCH): every dispatched
// kernel — softmax, LayerNorm / RMSNorm, cross-entropy, GELU, dropout, dense fused attention, ASCender attention,
// ASAM's sparse attention (tiled and row paths), the firing gate and rule B's passes — run at each level the processor
// has, forward and backward, in float32 and float64: each level's float32 results agree with float64 to float32
// rounding, each level's float64 results agree with every other's to 1e-12, and dropout's mask is the same bits at
// every level. The generic elementwise ops (unary with their backward, binary, contiguous and broadcast), sums,
// max / min / logsumexp and the optimizers' updates are the same bits as the baseline's at every level, NaN, ±inf and
// ±0 included (a few ulps where an FMA may fuse a multiply and an add). The kernels themselves are checked against
// independent float64 loops by their own test files at the best level; these tests carry that to the other levels. On a
// processor without AVX-512 the x86-64-v4 kernels are not tested, which the test reports.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "op_table.h"
#include "ops/cpu/compact.h"
#include "optim/optim.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

// Runs at one level for a scope, then restores the previous one.
struct IsaScope {
  CpuIsa prev = cpu_isa();
  explicit IsaScope(CpuIsa isa) { set_cpu_isa(isa); }
  ~IsaScope() { set_cpu_isa(prev); }
};

// The levels this processor runs (the best last), reporting the ones it cannot.
std::vector<CpuIsa> levels() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::baseline, CpuIsa::x86_64_v3, CpuIsa::x86_64_v4}) {
    if (isa <= cpu_isa_supported())
      out.push_back(isa);
    else
      MESSAGE("the ", cpu_isa_name(isa), " kernels are not tested: this processor (or this build) runs at most ",
              cpu_isa_name(cpu_isa_supported()));
  }
  return out;
}

// A workload: outputs and gradients of a small model or op at one dtype.
using Workload = std::function<TensorList(DType)>;

Tensor rand_like_seeded(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = dt}, &g);
}

// Leaves of the given shapes (requires_grad), the same values at every dtype (drawn in float64, then cast).
TensorList leaves(const std::vector<Shape>& shapes, DType dt, uint64_t seed) {
  TensorList out;
  for (const Shape& s : shapes) {
    Tensor t = rand_like_seeded(s, kFloat64, seed++).to(dt);
    t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// y's outputs and the gradients of Σ y·w (w fixed random weights) with respect to the leaves.
TensorList with_grads(const Tensor& y, const TensorList& xs, uint64_t seed) {
  Tensor w = rand_like_seeded(y.shape(), kFloat64, seed).to(y.dtype());
  sum(mul(y, w)).backward();
  TensorList out{y.detach()};
  for (const Tensor& x : xs) out.push_back(x.grad());
  return out;
}

// A module's output and every parameter's and the input's gradient; the module's parameters are set from a seeded
// draw at dtype dt (modules are built in float32).
template <class M>
TensorList module_grads(M& m, const Tensor& x, uint64_t seed) {
  Tensor y = m.forward(x);
  TensorList out = with_grads(y, {x}, seed);
  for (auto& [name, p] : m.named_parameters())
    if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

template <class M>
void set_parameters(M& m, DType dt, uint64_t seed) {
  m.to(dt);
  NoGradGuard ng;
  for (auto& [name, p] : m.named_parameters()) p.copy_(mul(rand_like_seeded(p.shape(), kFloat64, seed++), 0.3).to(dt));
}

// Every level's float32 result within tol of the float64 one (at the best level), every level's float64 result
// within 1e-12 of the best level's.
void check_levels(const std::string& name, const Workload& run, double tol32) {
  CAPTURE(name);
  const std::vector<CpuIsa> ls = levels();
  TensorList ref64;
  {
    IsaScope s(ls.back());
    ref64 = run(kFloat64);
  }
  for (CpuIsa isa : ls) {
    const std::string level = cpu_isa_name(isa);
    CAPTURE(level);
    IsaScope s(isa);
    const TensorList r32 = run(kFloat32), r64 = run(kFloat64);
    REQUIRE(r32.size() == ref64.size());
    REQUIRE(r64.size() == ref64.size());
    for (size_t i = 0; i < ref64.size(); ++i) {
      CAPTURE(i);
      REQUIRE(r32[i].defined());
      check_close(r32[i].to(kFloat64), ref64[i], tol32, tol32);
      check_close(r64[i], ref64[i], 1e-12, 1e-12);
    }
  }
}

}  // namespace

TEST_CASE("cpu_isa: names, parsing and the cap") {
  CHECK(std::string(cpu_isa_name(CpuIsa::baseline)) == "baseline");
  CHECK(std::string(cpu_isa_name(CpuIsa::x86_64_v3)) == "x86-64-v3");
  CHECK(std::string(cpu_isa_name(CpuIsa::x86_64_v4)) == "x86-64-v4");
  CHECK(parse_cpu_isa("default") == CpuIsa::baseline);
  CHECK(parse_cpu_isa("avx2") == CpuIsa::x86_64_v3);
  CHECK(parse_cpu_isa("x86-64-v4") == CpuIsa::x86_64_v4);
  check_error([] { parse_cpu_isa("avx10"); }, {"avx10", "baseline", "x86-64-v4"});
  check_error([] { set_cpu_isa(static_cast<CpuIsa>(7)); }, {"set_cpu_isa", "7"});
  CHECK(cpu_isa() <= cpu_isa_supported());
  {
    IsaScope s(CpuIsa::baseline);
    CHECK(cpu_isa() == CpuIsa::baseline);
  }
  if (cpu_isa_supported() < CpuIsa::x86_64_v4) {
    const CpuIsa before = cpu_isa();
    check_error([] { set_cpu_isa(CpuIsa::x86_64_v4); }, {"does not support", "x86-64-v4"});
    CHECK(cpu_isa() == before);  // unchanged by the refusal
  }
}

// Run by CTest with ASC_CPU_ISA set (tests/CMakeLists.txt): the level starts capped, before anything else sets it.
TEST_CASE("cpu_isa: ASC_CPU_ISA caps the level at start" * doctest::skip(std::getenv("ASC_CPU_ISA") == nullptr)) {
  const std::string env = std::getenv("ASC_CPU_ISA");
  CpuIsa want = cpu_isa_supported();
  try {
    const CpuIsa asked = parse_cpu_isa(env);
    want = asked < want ? asked : want;
  } catch (const Error&) {  // an unknown name is ignored (with a warning on stderr)
  }
  CAPTURE(env);
  CHECK(cpu_isa() == want);
}

TEST_CASE("cpu_isa: softmax, log_softmax (with and without a mask), forward and backward, at every level") {
  check_levels(
      "softmax",
      [](DType dt) {
        // rows of 37 (the vector loops and their remainders) and of 5 (the short rows' kernel)
        TensorList x = leaves({{7, 37}, {7, 37}, {9, 5}, {9, 5}}, dt, 1);
        Tensor keep = gt(rand_like_seeded({7, 37}, kFloat64, 9), -0.8);
        Tensor keep5 = gt(rand_like_seeded({9, 5}, kFloat64, 10), -0.8);
        TensorList out = with_grads(softmax(x[0], -1), {x[0]}, 3);
        for (const Tensor& t : with_grads(log_softmax(x[1], -1, keep), {x[1]}, 4)) out.push_back(t);
        for (const Tensor& t : with_grads(softmax(x[2], -1, keep5), {x[2]}, 5)) out.push_back(t);
        for (const Tensor& t : with_grads(log_softmax(x[3], -1), {x[3]}, 6)) out.push_back(t);
        return out;
      },
      2e-6);
}

TEST_CASE("cpu_isa: layer_norm, rms_norm and cross_entropy, forward and backward, at every level") {
  check_levels(
      "norms",
      [](DType dt) {
        TensorList x = leaves({{5, 45}, {45}, {45}, {5, 45}, {45}}, dt, 11);
        TensorList out = with_grads(layer_norm(x[0], {45}, x[1], x[2]), {x[0], x[1], x[2]}, 12);
        for (const Tensor& t : with_grads(rms_norm(x[3], {45}, x[4]), {x[3], x[4]}, 13)) out.push_back(t);
        return out;
      },
      2e-5);
  check_levels(
      "cross_entropy",
      [](DType dt) {
        TensorList x = leaves({{9, 19}}, dt, 21);
        Tensor target = tensor({0, 3, 18, -100, 7, 7, 2, 11, 5}, {.dtype = kInt64});
        Tensor loss = cross_entropy(x[0], target, {.ignore_index = -100, .label_smoothing = 0.1});
        return with_grads(loss, {x[0]}, 22);
      },
      2e-6);
}

TEST_CASE("cpu_isa: GELU (contiguous and transposed) at every level; dropout's mask is the same bits at every level") {
  check_levels(
      "gelu",
      [](DType dt) {
        TensorList x = leaves({{6, 35}}, dt, 31);
        TensorList out = with_grads(gelu(x[0]), {x[0]}, 32);
        x[0].zero_grad();
        for (const Tensor& t : with_grads(gelu(x[0].transpose(0, 1)), {x[0]}, 33)) out.push_back(t);
        return out;
      },
      2e-6);
  Tensor x = randn32({1000}, 41);
  Tensor best;
  for (CpuIsa isa : levels()) {
    IsaScope s(isa);
    Generator g(5);
    Tensor y = dropout(x, 0.3, true, &g);
    if (!best.defined())
      best = y;
    else
      CHECK(same_bits(y, best));
  }
}

TEST_CASE("cpu_isa: the fused dense attention kernel (causal and masked), forward and backward, at every level") {
  SdpaBackendScope fused(SdpaBackend::Fused);
  check_levels(
      "sdpa",
      [](DType dt) {
        TensorList x = leaves({{2, 2, 37, 24}, {2, 2, 37, 24}, {2, 2, 37, 24}}, dt, 51);
        SdpaOptions o;
        o.causal = true;
        return with_grads(scaled_dot_product_attention(x[0], x[1], x[2], o), x, 52);
      },
      2e-5);
}

TEST_CASE("cpu_isa: ASCender attention (full and windowed), forward and backward, at every level") {
  for (nn::AscenderMode mode : {nn::AscenderMode::Full, nn::AscenderMode::Windowed}) {
    check_levels(
        mode == nn::AscenderMode::Full ? "ascender full" : "ascender windowed",
        [mode](DType dt) {
          nn::AscenderAttention m(nn::AscenderAttentionOptions(32, 2).k({5}).mode(mode).window(9).global_tokens(2));
          set_parameters(m, dt, 61);
          Tensor x = leaves({{2, 41, 32}}, dt, 62)[0];
          return module_grads(m, x, 63);
        },
        5e-5);
  }
}

TEST_CASE("cpu_isa: ASAM's sparse attention, every pattern (tiled blocks and single rows), at every level") {
  check_levels(
      "asam",
      [](DType dt) {
        nn::AsamAttention m(nn::AsamAttentionOptions(32, 2)
                                .patterns({"window", "global", "random", "clustered", "hierarchical", "strided"})
                                .window(6)
                                .stride(7)
                                .clusters(3)
                                .block(8)
                                .fixed_gate(1.0));
        set_parameters(m, dt, 71);
        Tensor x = leaves({{2, 83, 32}}, dt, 72)[0];
        return module_grads(m, x, 73);
      },
      5e-5);
  check_levels(
      "asam, one head",  // B H = 1: the two-pass backward
      [](DType dt) {
        nn::AsamAttention m(nn::AsamAttentionOptions(16, 1).patterns({"window", "random"}).window(5).fixed_gate(1.0));
        set_parameters(m, dt, 74);
        Tensor x = leaves({{1, 50, 16}}, dt, 75)[0];
        return module_grads(m, x, 76);
      },
      5e-5);
  // Tiled blocks whose rows hold 0 to 20 rare keys: their dot products end in every tail the levels compile apart
  // (16 or 8 keys a vector, a padded vector, single dots).
  const int64_t T = 150;
  const SparsePattern scattered = scattered_rare_keys_pattern(T);
  for (int64_t D : {20, 64})
    check_levels(
        "sparse attention, 0 to 20 rare keys a row, D = " + std::to_string(D),
        [&](DType dt) {
          TensorList x = leaves({{2, 2, T, D}, {2, 2, 8 * T, D}, {2, 2, 8 * T, D}}, dt, 80);
          return with_grads(sparse_attention(x[0], x[1], x[2], scattered), x, 83);
        },
        5e-5);
}

TEST_CASE(
    "cpu_isa: the clustered pattern's rows (the every-key and per-bucket passes) are the same lists at every level") {
  // c = 3 soft clusters: each row's buckets hold most keys, so every row tests every key, four such rows at a time
  // (ops/cpu/clustered_rows.h), which the levels compile apart; c = 24 sharp ones: the tests of each bucket's members;
  // T 700, c 6 sharp: buckets of more than 64 members (each row's bits over them in several words).
  struct Case {
    int64_t T, c;
    double temp;
  };
  for (auto [T, c, temp] : {Case{300, 3, 1.5}, Case{300, 24, 6.0}, Case{700, 6, 6.0}}) {
    CAPTURE(T);
    CAPTURE(c);
    Generator gen(77);
    const Tensor a = softmax(randn({1, 2, T, c}, {.dtype = kFloat64}, &gen) * temp, -1);
    const double* ap = a.data_ptr<double>();
    // θ exactly at some pairs' sums as the builders form them (each product and each sum rounded on its own): such a
    // pair is out (a_i · a_j > θ); a fused multiply-add would round the sum differently and could let it in.
    std::vector<double> thetas;
    for (int64_t i : {3, 50, 120, 299}) {
      const int64_t j = (i * 7 + 11) % T;
      volatile double sum = 0;  // volatile: no contraction here either
      for (int64_t m = 0; m < c; ++m) {
        volatile double product = ap[i * c + m] * ap[j * c + m];
        sum = sum + product;
      }
      thetas.push_back(static_cast<double>(sum));
    }
    const SparsePattern base = pattern_union({local_window_pattern(T, 8, false), global_tokens_pattern(T, 2, false)});
    for (bool causal : {false, true})
      for (double theta : thetas) {
        CAPTURE(causal);
        CAPTURE(theta);
        std::vector<int64_t> ref_ptr, ref_cols, ref_alone;
        for (CpuIsa isa : levels()) {
          CAPTURE(cpu_isa_name(isa));
          IsaScope scope(isa);
          const SparsePattern u = clustered_union(base, a, theta, causal);
          const std::vector<int64_t> ptr = u.row_ptr().to_vector<int64_t>(), cols = u.cols().to_vector<int64_t>();
          const std::vector<int64_t> alone = clustered_pattern(a, theta, causal).cols().to_vector<int64_t>();
          if (ref_ptr.empty()) {
            ref_ptr = ptr, ref_cols = cols, ref_alone = alone;
            continue;
          }
          CHECK(ptr == ref_ptr);
          CHECK(cols == ref_cols);
          CHECK(alone == ref_alone);
        }
      }
  }
}

TEST_CASE("cpu_isa: compact_flags lists the set flags in order at every level, within the n entries it may write") {
  // The x86-64-v4 path compresses eight indices in a register and stores all eight lanes; the scalar one writes every
  // j: both may write anything into out[len, n), nothing past it (the sentinel after n must survive).
  Generator gen(78);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 300}) {
    for (double density : {0.0, 0.1, 0.5, 0.9, 1.0}) {
      std::vector<unsigned char> flags(static_cast<size_t>(n));
      const std::vector<double> u = rand({std::max<int64_t>(n, 1)}, {.dtype = kFloat64}, &gen).to_vector<double>();
      std::vector<int64_t> expected;
      for (int64_t j = 0; j < n; ++j) {
        flags[j] = u[j] < density ? 1 : 0;
        if (flags[j]) expected.push_back(j);
      }
      for (CpuIsa isa : levels()) {
        CAPTURE(n);
        CAPTURE(density);
        CAPTURE(cpu_isa_name(isa));
        IsaScope scope(isa);
        std::vector<int64_t> out(static_cast<size_t>(n) + 1, -7);
        const int64_t len = cpu::compact_flags(flags.data(), n, out.data());
        REQUIRE(len == static_cast<int64_t>(expected.size()));
        CHECK(std::equal(expected.begin(), expected.end(), out.begin()));
        CHECK(out[n] == -7);
      }
    }
  }
}

TEST_CASE("cpu_isa: compact_greater lists the keys above a threshold in order at every level (NaN never above)") {
  // ASCender's top-k candidates: 16 floats / 8 doubles a vector at x86-64-v4, a scalar tail; -inf entries (masked keys)
  // and a -inf threshold (every finite entry passes), NaN entries and a NaN threshold (nothing passes).
  Generator gen(79);
  auto check = [&](auto zero) {
    using T = decltype(zero);
    const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 256, 300}) {
      const std::vector<double> u = rand({std::max<int64_t>(n, 1)}, {.dtype = kFloat64}, &gen).to_vector<double>();
      std::vector<T> x(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) x[j] = j % 11 == 3 ? -inf : j % 13 == 5 ? nan : static_cast<T>(u[j]);
      for (T thr : {T(-1), T(0.5), T(0.9), T(2), -inf, nan}) {
        std::vector<int64_t> expected;
        for (int64_t j = 0; j < n; ++j)
          if (x[j] > thr) expected.push_back(j);
        for (CpuIsa isa : levels()) {
          CAPTURE(n);
          CAPTURE(thr);
          CAPTURE(cpu_isa_name(isa));
          IsaScope scope(isa);
          std::vector<int64_t> out(static_cast<size_t>(n) + 1, -7);
          const int64_t len = cpu::compact_greater(x.data(), n, thr, out.data());
          REQUIRE(len == static_cast<int64_t>(expected.size()));
          CHECK(std::equal(expected.begin(), expected.end(), out.begin()));
          CHECK(out[n] == -7);
        }
      }
    }
  };
  check(0.0f);
  check(0.0);
}

TEST_CASE("cpu_isa: the firing gate (exact, straight-through, fan-out 1, 2, 3) and rule B's passes, at every level") {
  for (int64_t fan_out : {1, 2, 3})
    for (GateBackward mode : {GateBackward::None, GateBackward::StraightThrough}) {
      check_levels(
          "firing",
          [&](DType dt) {
            nn::FiringLinear m(nn::FiringOptions(13, 37).fan_out(fan_out).backward(mode).threshold(0.05));
            set_parameters(m, dt, 81);
            Tensor x = leaves({{70, 13}}, dt, 82)[0];
            return module_grads(m, x, 83);
          },
          2e-5);
    }
  check_levels(
      "rule B passes",
      [](DType dt) {
        Tensor Z = rand_like_seeded({70, 37}, kFloat64, 91).to(dt);
        Tensor SP = mul(rand_like_seeded({37}, kFloat64, 92), 0.2).to(dt);
        Tensor F = ge(Z, SP).to(dt);
        Tensor dZ = rand_like_seeded({70, 37}, kFloat64, 93).to(dt);
        Tensor c = rand_like_seeded({37}, kFloat64, 94).to(dt);
        FiringBatchSums s = firing_batch_sums(Z, F, SP);
        Tensor coef = firing_rule_b_coef(Z, F, 0.5, dZ, c);
        // a sparse coefficient matrix (the sparse update path) and a dense one (the GEMM path)
        Tensor W1 = rand_like_seeded({37, 13}, kFloat64, 95).to(dt), W2 = W1.clone();
        Tensor X = rand_like_seeded({70, 13}, kFloat64, 96).to(dt);
        Tensor keep = full({37}, 0.99, {.dtype = dt});
        Tensor sparse_coef = mul(coef, gt(Z, add(SP, 1.2)).to(dt));
        firing_weight_update_(W1, keep, sparse_coef, X);
        firing_weight_update_(W2, keep, coef, X);
        return TensorList{s.fz2, s.fired, s.margin, coef, W1, W2};
      },
      2e-5);
}

namespace {

// x (n) float64 with the special values a kernel must carry through: NaN, ±inf, ±0, ±1, and ±1e-30 (a float32
// subnormal after the cast), spread over the vector body and its tail; the rest random, some negative.
Tensor special_values(int64_t n, DType dt, uint64_t seed) {
  Tensor x = mul(rand_like_seeded({n}, kFloat64, seed), 3.0);
  double* p = x.data_ptr<double>();
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30};
  for (int64_t i = 0; i < n; i += 7) p[i] = specials[(i / 7) % 9];
  if (n > 2) p[n - 2] = NAN;
  return x.to(dt);
}

// Every op's outputs at each level the processor has against the baseline's: the same bits where each element is
// one IEEE operation (or a chain of them the compiler cannot fuse), else — where GCC contracts a * b + c into an FMA
// at x86-64-v3 and above — within a few float ulps, NaN where the baseline has NaN.
void check_same_bits_at_every_level(const std::string& name, const std::function<TensorList()>& run,
                                    bool exact = true) {
  CAPTURE(name);
  const std::vector<CpuIsa> ls = levels();
  TensorList base;
  {
    IsaScope s(CpuIsa::baseline);
    base = run();
  }
  for (CpuIsa isa : ls) {
    const std::string level = cpu_isa_name(isa);
    CAPTURE(level);
    IsaScope s(isa);
    const TensorList r = run();
    REQUIRE(r.size() == base.size());
    for (size_t i = 0; i < r.size(); ++i) {
      CAPTURE(i);
      if (exact || isa == CpuIsa::baseline) {
        CHECK(same_bits(r[i], base[i]));
      } else {
        const double tol = r[i].dtype() == kFloat32 ? 1e-6 : 1e-14;
        check_close(r[i], base[i], tol, tol);
      }
    }
  }
}

}  // namespace

TEST_CASE("cpu_isa: the generic elementwise ops, forward and backward, are the same bits at every level") {
  // 1000 + 37: the 512-bit body and a tail; (37, 29) transposed: the strided loops, which stay baseline code.
  using UnaryFn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, UnaryFn>> unary_ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x, 2.0, 5.0); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
      {"add_scalar", [](const Tensor& x) { return add(x, 0.25); }},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -1.5); }},
      {"rsub_scalar", [](const Tensor& x) { return rsub(2.0, x); }},
      {"rdiv_scalar", [](const Tensor& x) { return div(full_like(x, 3.0), x); }},
      {"square", [](const Tensor& x) { return pow(x, 2.0); }},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 1.7); }},
  };
  // Those with a multiply feeding an add in the forward or the derivative: x + c x³, 1 - y², s (1 + x (1 - s)); and
  // in float32 those whose rows evaluate polynomials (ops/cpu/vec_math.h: exp_full, log_full, sigmoid_full).
  const std::vector<std::string> fused = {"gelu_tanh", "silu", "tanh"};
  const std::vector<std::string> fused32 = {"exp", "log", "sigmoid", "softplus"};
  for (DType dt : {kFloat32, kFloat64})
    for (const auto& [name, op] : unary_ops) {
      const bool exact = std::find(fused.begin(), fused.end(), name) == fused.end() &&
                         (dt != kFloat32 || std::find(fused32.begin(), fused32.end(), name) == fused32.end());
      check_same_bits_at_every_level(
          name + (dt == kFloat32 ? " float32" : " float64"),
          [&, op = op] {
            Tensor x = special_values(1037, dt, 51);
            x.set_requires_grad(true);
            Tensor y = op(x);
            TensorList out = with_grads(y, {x}, 52);
            Tensor xt = special_values(37 * 29, dt, 53).reshape({37, 29}).transpose(0, 1);
            out.push_back(op(xt));
            return out;
          },
          exact);
    }

  using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, BinaryFn>> binary_ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
  };
  for (DType dt : {kFloat32, kFloat64, kInt64})
    for (const auto& [name, op] : binary_ops) {
      if (dt == kInt64 && (name == "div" || name == "pow")) continue;
      check_same_bits_at_every_level(name + " " + std::string(dtype_name(dt)), [&, op = op] {
        // (29, 37): both contiguous; a (1, 37) row and a (29, 1) column broadcast; a scalar on either side
        // (int64: random integers, no special values)
        auto operand = [dt](uint64_t seed) {
          Tensor t = dt == kInt64 ? mul(rand_like_seeded({29 * 37}, kFloat64, seed), 100.0)
                                  : special_values(29 * 37, kFloat64, seed);
          return t.reshape({29, 37}).to(dt);
        };
        const Tensor a = operand(61), b = operand(62);
        Tensor row = b.slice(0, 3, 4), col = b.slice(1, 5, 6), s = b.slice(0, 7, 8).slice(1, 9, 10).reshape({});
        return TensorList{op(a, b), op(a, row), op(col, a),
                          op(a, s), op(s, b),   op(a.transpose(0, 1), b.transpose(0, 1))};
      });
    }
  check_same_bits_at_every_level("logical_and / logical_or", [] {
    Tensor a = gt(special_values(1037, kFloat64, 71), 0.0), b = lt(special_values(1037, kFloat64, 72), 0.5);
    return TensorList{logical_and(a, b), logical_or(a, b)};
  });
}

TEST_CASE("cpu_isa: sums, max / min and logsumexp are the same bits at every level") {
  for (DType dt : {kFloat32, kFloat64, kInt64})
    check_same_bits_at_every_level("sum " + std::string(dtype_name(dt)), [dt] {
      // 40013: three of the full sum's 16384-element blocks and a tail
      Tensor big = rand_like_seeded({40013}, kFloat64, 81), x = rand_like_seeded({37, 129}, kFloat64, 82);
      if (dt == kInt64) big = mul(big, 1000.0), x = mul(x, 1000.0);
      big = big.to(dt), x = x.to(dt);
      return TensorList{
          sum(big), sum(x), sum(x, {0}), sum(x, {1}), sum(x.transpose(0, 1), {1}), sum(x.reshape({37, 3, 43}), {1})};
    });
  for (DType dt : {kFloat32, kFloat64})
    check_same_bits_at_every_level("max / min / logsumexp " + std::string(dtype_name(dt)), [dt] {
      Tensor x = rand_like_seeded({37, 1029}, kFloat64, 91), w = special_values(37 * 1029, kFloat64, 92);
      x = x.to(dt), w = w.reshape({37, 1029}).to(dt);
      Tensor x3 = x.reshape({37, 3, 343});
      auto mx = max(x, 1), mn = min(w, 1), mx3 = max(x3, 1), mn3 = min(w.reshape({37, 3, 343}), 1);
      return TensorList{mx.values,   mx.indices, mn.values,   mn.indices,        mx3.values,
                        mx3.indices, mn3.values, mn3.indices, logsumexp(x, {1}), logsumexp(w, {1})};
    });
}

TEST_CASE("cpu_isa: the optimizers' updates (Adam, AdamW, AMSGrad, RMSprop, SGD) are the same bits at every level") {
  for (DType dt : {kFloat32, kFloat64})
    check_same_bits_at_every_level("optimizer steps " + std::string(dtype_name(dt)), [dt] {
      TensorList out;
      for (int config = 0; config < 5; ++config) {
        Tensor p = rand_like_seeded({1037}, kFloat64, 101).to(dt).set_requires_grad(true);
        std::unique_ptr<optim::Optimizer> opt;
        if (config == 0) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 0.01});
        if (config == 1)
          opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                              optim::AdamOptions{.lr = 0.02, .weight_decay = 0.1, .amsgrad = true});
        if (config == 2)
          opt = std::make_unique<optim::RMSprop>(
              std::vector<Tensor>{p},
              optim::RMSpropOptions{.lr = 0.01, .weight_decay = 0.1, .momentum = 0.7, .centered = true});
        if (config == 3)
          opt = std::make_unique<optim::RMSprop>(std::vector<Tensor>{p}, optim::RMSpropOptions{.lr = 0.01});
        if (config == 4)
          opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                             optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
        for (uint64_t t = 0; t < 3; ++t) {
          p.set_grad(sub(rand_like_seeded({1037}, kFloat64, 200 + t), 0.5).to(dt));
          opt->step();
        }
        out.push_back(p.detach().clone());
      }
      return out;
    });
}

TEST_CASE("cpu_isa: max / min along a dim return the first extreme's own element at every level (signed zeros)") {
  // Zeros of both signs in different vector lanes, everything else below (max) / above (min) them: the value is
  // the first zero's, sign included, and its index.
  for (CpuIsa isa : levels()) {
    CAPTURE(cpu_isa_name(isa));
    IsaScope s(isa);
    for (DType dt : {kFloat32, kFloat64}) {
      std::vector<double> v(40, -1.0);
      v[5] = -0.0, v[22] = 0.0;
      auto mx = max(tensor(v, {1, 40}).to(dt), 1);
      CHECK(mx.indices.item<int64_t>() == 5);
      CHECK(std::signbit(mx.values.to(kFloat64).item<double>()));
      v.assign(40, 1.0);
      v[3] = 0.0, v[30] = -0.0;
      auto mn = min(tensor(v, {1, 40}).to(dt), 1);
      CHECK(mn.indices.item<int64_t>() == 3);
      CHECK_FALSE(std::signbit(mn.values.to(kFloat64).item<double>()));
    }
  }
}

// ---- the op table (tests/op_table.h) at every level ---------------------------------------------------------------

TEST_CASE("cpu_isa: every op-table entry at every level, forward and backward") {
  int entries = 0;
  for (const optable::Family& f : optable::op_table())
    for (const optable::OpCase& c : f.cases) {
      if (c.isa_tol <= 0) continue;  // random draws: float32 and float64 draw different numbers
      // The inputs drawn once in float64 and cast, so both dtypes see the same values; outputs, then the gradients
      // of Σ out·w for fixed random weights w.
      const Workload run = [&c](DType dt) {
        const TensorList drawn = optable::inputs(c, kFloat64, 21);
        TensorList in, leaves;
        for (size_t i = 0; i < drawn.size(); ++i) {
          Tensor t = is_floating(drawn[i].dtype()) ? drawn[i].to(dt) : drawn[i];
          if (c.backward && c.inputs[i].grad && optable::is_float_input(c.inputs[i])) {
            t.set_requires_grad(true);
            leaves.push_back(t);
          }
          in.push_back(t);
        }
        TensorList out;
        Tensor loss;
        uint64_t seed = 100;
        for (const Tensor& o : c.fn(in)) {
          out.push_back(o.detach().to(kFloat64));
          if (!c.backward || !o.requires_grad()) continue;
          Tensor term = sum(mul(o, rand_like_seeded(o.shape(), kFloat64, seed++).to(o.dtype())));
          loss = loss.defined() ? add(loss, term) : term;
        }
        if (loss.defined()) loss.backward();
        for (const Tensor& l : leaves)
          if (l.grad().defined()) out.push_back(l.grad().to(kFloat64));
        return out;
      };
      check_levels(f.name + ": " + c.op, run, c.isa_tol);
      ++entries;
    }
  MESSAGE(fmt::format("{} op-table entries at every level", entries));
}
