// ASCender under bad input and at the edges (docs/ascender.md, "Accepted options" and §13): every option of the op
// and of the layer at each bound, on each side; checks before any parallel region and before dispatch (the same
// errors from the reference, the CPU kernel and the CUDA kernel); NaN that reaches exactly the rows that read it;
// the isolated-token precision of ρ; S = -inf outside the attended set; γ_align = 1/2 without neighbours; and
// bit-identical CPU results for any thread count in deterministic mode.
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "nn/nn.h"
#include "testing.h"

#ifdef ASC_HAVE_OPENMP
#include <omp.h>
#endif

using namespace asc;
using namespace asc::testing;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

struct Heads {
  int64_t B, H, T, d = 4, dz = 3, da = 3;
  Tensor q, k_rot, k, v, z, e;
};

Heads make_heads(int64_t B, int64_t H, int64_t T, uint64_t seed, DType dt = kFloat64, Device dev = Device::cpu()) {
  Heads x{B, H, T};
  x.q = randn64({B, H, T, x.d}, false, seed).to(dt).to(dev);
  x.k_rot = randn64({B, H, T, x.d}, false, seed + 1).to(dt).to(dev);
  x.k = randn64({B, H, T, x.d}, false, seed + 2).to(dt).to(dev);
  x.v = randn64({B, H, T, x.d}, false, seed + 3).to(dt).to(dev);
  x.z = (randn64({B, H, T, x.dz}, false, seed + 4) * 0.7).to(dt).to(dev);
  x.e = randn64({B, H, T, x.da}, false, seed + 5).to(dt).to(dev);
  return x;
}

AscenderCoreArgs make_args(int64_t H, DType dt = kFloat64, Device dev = Device::cpu()) {
  AscenderCoreArgs a;
  a.k = std::vector<int64_t>(H, 3);
  a.tau_sep = std::vector<double>(H, 1.3);
  a.tau_coh = std::vector<double>(H, 0.9);
  a.alpha_align = std::vector<double>(H, 2.0);
  a.alpha_coh = std::vector<double>(H, 1.5);
  auto val = [&](double x) { return full({H}, x, {.dtype = dt, .device = dev}); };
  a.omega_align = val(0.7), a.omega_sep = val(0.6), a.omega_coh = val(0.5);
  a.lambda_align = val(1.2), a.lambda_sep = val(0.8), a.lambda_coh = val(1.1);
  a.delta = val(0.2), a.kappa = val(2.0), a.tau_score = val(0.9);
  a.gate_position = GatePosition::AfterNorm;  // the gates act (and so can carry a NaN into S)
  return a;
}

struct BackendScope {
  AscenderBackend saved = ascender_backend();
  explicit BackendScope(AscenderBackend b) { set_ascender_backend(b); }
  ~BackendScope() { set_ascender_backend(saved); }
};

Tensor run(const Heads& x, const AscenderCoreArgs& a, AscenderBackend backend) {
  BackendScope s(backend);
  return ascender_attention(x.q, x.k_rot, x.k, x.v, x.z, x.e, a);
}

// The same call through the op (Fused and Auto backends), the reference entry point and ascender_choice: all
// must refuse with an error containing `fragment`.
void check_refused(const Heads& x, const AscenderCoreArgs& a, const char* fragment) {
  CAPTURE(std::string(fragment));
  check_error([&] { run(x, a, AscenderBackend::Fused); }, {fragment});
  check_error([&] { run(x, a, AscenderBackend::Auto); }, {fragment});
  check_error([&] { ascender_attention_reference(x.q, x.k_rot, x.k, x.v, x.z, x.e, a); }, {fragment});
  check_error([&] { ascender_choice(x.q, x.k_rot, x.k, x.v, x.z, x.e, a); }, {fragment});
}

// Accepted: the fused kernel and the reference agree.
Tensor check_accepted(const Heads& x, const AscenderCoreArgs& a, double tol = 1e-10) {
  Tensor fused = run(x, a, AscenderBackend::Fused);
  Tensor ref = run(x, a, AscenderBackend::Reference);
  check_close(fused, ref, tol, tol);
  return fused;
}

}  // namespace

// ---- the op's options, the "Accepted options" table of docs/ascender.md, bound by bound ----------------------------

TEST_CASE("ASCender op: integer options at 0, 1, n, n + 1 and INT64_MAX (clamped to what they can mean, or refused)") {
  const int64_t T = 9;
  const Heads x = make_heads(1, 2, T, 10);
  AscenderCoreArgs base = make_args(2);
  base.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
  const Tensor y0 = check_accepted(x, base);
  SUBCASE("k: 0 refused; 1, n - 1 (every other key), n, n + 1, INT64_MAX select every selectable key") {
    AscenderCoreArgs a = base;
    a.k = {0, 3};
    check_refused(x, a, "needs k >= 1");
    a.k = {-5, 3};
    check_refused(x, a, "needs k >= 1");
    a.k = {1, 1};
    check_accepted(x, a);
    a.k = {T - 1, T - 1};
    const Tensor all = check_accepted(x, a);
    for (int64_t k : {T, T + 1, kMax}) {
      a.k = {k, k};
      check_close(check_accepted(x, a), all, 1e-12, 1e-12);
    }
  }
  SUBCASE("row_block: negative refused; 0 (default), 1, n, n + 1, INT64_MAX give the same result") {
    AscenderCoreArgs a = base;
    a.row_block = -1;
    check_refused(x, a, "row_block must be >= 0");
    a.row_block = std::numeric_limits<int64_t>::min();
    check_refused(x, a, "row_block must be >= 0");
    for (int64_t rb : {int64_t(0), int64_t(1), T, T + 1, kMax}) {
      CAPTURE(rb);
      a.row_block = rb;
      check_close(check_accepted(x, a), y0, 1e-12, 1e-12);
    }
  }
  SUBCASE("window / global_tokens: negative refused; window >= n and global_tokens >= n mean every key") {
    AscenderCoreArgs a = base;
    a.window = -1;
    check_refused(x, a, "must be >= 0 (window 0: none)");
    a.window = 2, a.global_tokens = -1;
    check_refused(x, a, "must be >= 0 (window 0: none)");
    a.global_tokens = 0;
    for (int64_t w : {int64_t(1), int64_t(2)}) {
      a.window = w;
      check_accepted(x, a);
    }
    for (int64_t w : {T, T + 1, kMax}) {
      CAPTURE(w);
      a.window = w, a.global_tokens = 0;
      check_close(check_accepted(x, a), y0, 1e-12, 1e-12);
      a.window = 1, a.global_tokens = w == kMax ? kMax : T;  // every token global: every key
      check_close(check_accepted(x, a), y0, 1e-12, 1e-12);
    }
    a.window = kMax, a.global_tokens = kMax, a.row_block = kMax;
    a.k = {kMax, kMax};
    check_accepted(x, a);
  }
}

TEST_CASE("ASCender op: floating options refuse NaN, +-Inf and out-of-range values; the bounds themselves") {
  const Heads x = make_heads(1, 2, 6, 20);
  const AscenderCoreArgs base = make_args(2);
  // τ below 1e-6 (the kernels would be decided by the rounding of |z_i - z_j|²), norm_eps below 1e-12 (a term's σ
  // whose square underflows), omega_scale above 1e6 (the scores overflow): meaningless in floating point, refused.
  for (double bad : {0.0, -1.0, 0.99e-6, kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    AscenderCoreArgs a = base;
    a.tau_sep[1] = bad;
    check_refused(x, a, "finite tau_sep and tau_coh >= 1e-6");
    a = base, a.tau_coh[0] = bad;
    check_refused(x, a, "finite tau_sep and tau_coh >= 1e-6");
  }
  for (double bad : {0.0, -1.0, 0.99e-12, kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    AscenderCoreArgs a = base;
    a.norm_eps = bad;
    check_refused(x, a, "norm_eps must be finite and >= 1e-12");
  }
  // α above 1e6: the gates σ(-α Var) would be decided by the rounding of Var.
  for (double bad : {-1e-300, -1.0, 1.01e6, 1e300, kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    AscenderCoreArgs a = base;
    a.alpha_align[0] = bad;
    check_refused(x, a, "alpha_align and alpha_coh in [0, 1e6]");
    a = base, a.alpha_coh[1] = bad;
    check_refused(x, a, "alpha_align and alpha_coh in [0, 1e6]");
  }
  for (double bad : {-1e-300, -1.0, 1.01e6, 1e300, kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    AscenderCoreArgs a = base;
    a.omega_scale = bad;
    check_refused(x, a, "omega_scale must be in [0, 1e6]");
  }
  for (double bad : {-0.1, 1.0, kNaN, kInf}) {
    AscenderCoreArgs a = base;
    a.dropout = bad;
    check_refused(x, a, "dropout");
  }
  // The bounds themselves are accepted, and so are huge τ and norm_eps (harmless: the term tends to 0).
  AscenderCoreArgs a = base;
  a.alpha_align = {0.0, 0.0}, a.alpha_coh = {0.0, 0.0}, a.omega_scale = 0.0, a.dropout = 0.0;
  a.tau_sep = {1e-6, 1e300}, a.tau_coh = {1e300, 1e-6}, a.norm_eps = 1e-12;
  check_accepted(x, a, 1e-9);
  a = base, a.omega_scale = 1e6, a.norm_eps = 1e300, a.alpha_align = {1e6, 1e6}, a.alpha_coh = {1e6, 1e6};
  check_accepted(x, a, 1e-9);
  a = base, a.gate_position = GatePosition::BeforeNorm, a.tau_coh = {1e300, 1e300}, a.norm_eps = 1e-12;
  a.alpha_coh = {1e6, 0.0};
  check_accepted(x, a, 1e-9);
}

// Headings that cancel: with d = 1 every unit key is ±1 up to rounding, and an even neighbourhood of two +1 and two -1
// sums to rounding, whose sign would decide u_i. Such rows get u_i = 0 (docs §3), in the kernel and the reference.
TEST_CASE("ASCender op: neighbour headings that cancel give u_i = 0, not a direction of rounding noise") {
  const int64_t T = 5;
  Heads x = make_heads(1, 1, T, 40);
  x.d = 1;
  // The other four keys of rows 0 and 4 hold two positive and two negative ones of different sizes.
  x.k = tensor(std::vector<double>{0.3, -0.7, 1.1, -1.3, 0.9}, {1, 1, T, 1});
  x.q = randn64({1, 1, T, 1}, false, 41), x.k_rot = randn64({1, 1, T, 1}, false, 42);
  x.v = randn64({1, 1, T, 1}, false, 43);
  AscenderCoreArgs a = make_args(1);
  a.k = {4}, a.use_sep = false, a.use_coh = false;  // every other key is a neighbour; alignment only
  const Tensor y = check_accepted(x, a, 1e-12);
  AscenderDecomposition dec;
  ascender_attention_reference(x.q, x.k_rot, x.k, x.v, x.z, x.e, a, &dec);
  const std::vector<double> raw = dec.raw_align.to_vector<double>();  // after_norm: raw = r = u_i · k̂_j
  for (int64_t i : {0, 4})
    for (int64_t j = 0; j < T; ++j) CHECK(raw[i * T + j] == 0.0);
  CHECK(std::abs(raw[1 * T + 0]) > 0.5);  // row 1: three positive neighbours, one negative
  // Rows 0 and 4 are then those of attention without alignment.
  AscenderCoreArgs off = a;
  off.use_align = false;
  const std::vector<double> y_off = run(x, off, AscenderBackend::Reference).to_vector<double>(),
                            yv = y.to_vector<double>();
  for (int64_t i : {0, 4}) CHECK(yv[i] == doctest::Approx(y_off[i]).epsilon(1e-14));
  // The backward: the kernel's gradients are the reference's (no gradient through the cancelled u_i).
  std::vector<Tensor> grads[2];
  for (int which = 0; which < 2; ++which) {
    Tensor q = x.q.clone(), k = x.k.clone();
    q.set_requires_grad(true), k.set_requires_grad(true);
    BackendScope s(which == 0 ? AscenderBackend::Fused : AscenderBackend::Reference);
    Tensor out = ascender_attention(q, x.k_rot, k, x.v, x.z, x.e, a);
    (out * x.v).sum().backward();
    grads[which] = {q.grad(), k.grad()};
  }
  check_close(grads[0][0], grads[1][0], 1e-10, 1e-10);
  check_close(grads[0][1], grads[1][1], 1e-10, 1e-10);
  if (!cuda::is_available()) return;
  // The CUDA kernel (float64) agrees, forward and backward.
  const Device dev = Device::cuda();
  AscenderCoreArgs ac = make_args(1, kFloat64, dev);
  ac.k = {4}, ac.use_sep = false, ac.use_coh = false;
  Tensor q = x.q.to(dev), k = x.k.to(dev);
  q.set_requires_grad(true), k.set_requires_grad(true);
  BackendScope s(AscenderBackend::Fused);
  Tensor out = ascender_attention(q, x.k_rot.to(dev), k, x.v.to(dev), x.z.to(dev), x.e.to(dev), ac);
  check_close(out.to(Device::cpu()), y, 1e-12, 1e-12);
  (out * x.v.to(dev)).sum().backward();
  check_close(q.grad().to(Device::cpu()), grads[1][0], 1e-10, 1e-10);
  check_close(k.grad().to(Device::cpu()), grads[1][1], 1e-10, 1e-10);
}

TEST_CASE("ASCender op: masks, biases, per-head lists and scalars of the wrong kind are refused before any kernel") {
  const int64_t B = 4, H = 4, T = 48;  // large enough for the kernel to go parallel
  const Heads x = make_heads(B, H, T, 30);
  const AscenderCoreArgs base = make_args(H);
  AscenderCoreArgs a = base;
  a.keep_mask = ones({B, H, T, T});  // float: must not be read as bool (nor throw inside a parallel region)
  check_refused(x, a, "keep_mask must be bool");
  a.keep_mask = ones({B, 1, 1, T}).to(kInt64);
  check_refused(x, a, "keep_mask must be bool");
  a.keep_mask = ones({B, 1, 1, T + 1}).to(kBool);
  check_refused(x, a, "keep_mask of shape");
  a.keep_mask = ones({2, B, H, T, T}).to(kBool);  // would broadcast the output to 5 dimensions
  check_refused(x, a, "keep_mask of shape");
  a = base, a.bias = ones({1, H, T, T}).to(kInt64);
  check_refused(x, a, "bias must be floating-point");
  a.bias = ones({1, H + 1, T, T});
  check_refused(x, a, "bias of shape");
  a = base, a.k = {3};
  check_refused(x, a, "k has 1 values for 4 heads");
  a = base, a.alpha_coh = {1, 1, 1, 1, 1};
  check_refused(x, a, "alpha_coh has 5 values for 4 heads");
  a = base, a.kappa = ones({H + 1});
  check_refused(x, a, "every learnable scalar");
  a = base, a.delta = Tensor();
  check_refused(x, a, "every learnable scalar");
  a = base, a.tau_score = ones({H}).to(kInt64);
  check_refused(x, a, "every learnable scalar");
  Heads bad = x;
  bad.q = bad.q.to(kInt64), bad.k_rot = bad.k_rot.to(kInt64), bad.k = bad.k.to(kInt64);
  bad.v = bad.v.to(kInt64), bad.z = bad.z.to(kInt64), bad.e = bad.e.to(kInt64);
  check_refused(bad, base, "must be floating-point");
  // the public helpers validate too
  check_error([] { ascender_window_mask(-1, 2, 0, Device::cpu()); }, {"ascender_window_mask"});
  check_error([] { ascender_window_mask(5, 0, 0, Device::cpu()); }, {"ascender_window_mask"});
  check_error([] { ascender_normalize(randn64({2, 3}), ones({2, 3}), 1e-6); }, {"ascender_normalize", "bool"});
  check_error([] { ascender_normalize(randn64({2, 3}), Tensor(), kNaN); }, {"ascender_normalize", "eps"});
}

// ---- the layer's options ----------------------------------------------------------------------------------------

TEST_CASE("AscenderAttention options: the Accepted options table, each bound on each side") {
  using O = nn::AscenderAttentionOptions;
  auto ok = [](const O& o) {
    nn::AscenderAttention attn(o);
    Tensor y = attn.attend(randn32({2, 5, o.d_model()}), {.causal = true});
    CHECK(sum(isnan(y).to(kFloat64)).item<double>() == 0.0);
  };
  auto refused = [](const O& o, const char* fragment) {
    check_error([&] { nn::AscenderAttention{o}; }, {"AscenderAttention", fragment});
  };
  const O o(8, 2);
  ok(o);
  // sizes
  refused(O(0, 2), "positive multiple of heads");
  refused(O(8, 0), "positive multiple of heads");
  refused(O(8, 3), "positive multiple of heads");
  refused(O(8, -2), "positive multiple of heads");
  refused(O(8, 2).d_z(-1), "d_z -1 and d_a 0 must be >= 0");
  refused(O(8, 2).d_a(-1), "must be >= 0");
  refused(O(8, 2).d_z(kMax), "heads·d_z");
  refused(O(8, 2).d_a(kMax / 2 + 1), "heads·d_a");
  refused(O(8, 1).d_z(kMax / 4), "d_model·heads·d_z");
  refused(O(kMax - 1, 1), "d_model·d_model");
  ok(O(8, 2).d_z(1).d_a(1));
  ok(O(8, 8));  // d_head 1: d_z = d_a = 1
  // per-head lists
  refused(O(8, 2).k({}), "k needs 1 or 2 (heads) values, got 0");
  refused(O(8, 2).k({0}), "k must be >= 1");
  refused(O(8, 2).k({std::numeric_limits<int64_t>::min()}), "k must be >= 1");
  ok(O(8, 2).k({1}));
  ok(O(8, 2).k({5, 6}));  // n, n + 1 at n = 5
  ok(O(8, 2).k({kMax}));
  for (double bad : {0.0, -1.0, 0.99e-6, kNaN, kInf}) {
    refused(O(8, 2).tau_sep({bad}), "tau_sep must be > 0 (at least 1e-6) and finite");
    refused(O(8, 2).tau_coh({1.0, bad}), "tau_coh must be > 0 (at least 1e-6) and finite");
  }
  for (double bad : {-1.0, 1.01e6, kNaN, kInf}) {
    refused(O(8, 2).alpha_align({bad}), "alpha_align must be >= 0 (at most 1e6)");
    refused(O(8, 2).alpha_coh({bad}), "alpha_coh must be >= 0 (at most 1e6)");
  }
  ok(O(8, 2).alpha_align({0.0}).alpha_coh({0.0}).tau_sep({1e-6}).tau_coh({1e300}));
  ok(O(8, 2).alpha_align({1e6}).alpha_coh({1e6}));
  // initial values of the learnable scalars
  for (double bad : {kNaN, kInf, -kInf, 1.1e30, -1.1e30}) {
    refused(O(8, 2).omega_init(bad), "omega_init");
    refused(O(8, 2).delta_init(bad), "delta_init");
  }
  ok(O(8, 2).omega_init(0.0).delta_init(-1.0));
  ok(O(8, 2).omega_init(-1e30).delta_init(1e30));
  for (double bad : {0.0, -1.0, 0.9e-30, 1.1e30, kNaN, kInf}) {
    refused(O(8, 2).lambda_init(bad), "lambda_init must be in [1e-30, 1e30]");
    refused(O(8, 2).kappa_init(bad), "kappa_init must be in [1e-30, 1e30]");
    refused(O(8, 2).tau_score_init(bad), "tau_score_init must be in [1e-30, 1e30]");
  }
  ok(O(8, 2).lambda_init(1e-30).kappa_init(1e-30).tau_score_init(1e30));
  ok(O(8, 2).lambda_init(1e30).kappa_init(1e30).tau_score_init(1e-3));
  // modes
  refused(O(8, 2).window(0), "window 0 must be >= 1");
  refused(O(8, 2).window(-1), "must be >= 1");
  refused(O(8, 2).global_tokens(-1), "global_tokens -1 >= 0");
  for (int64_t w : {int64_t(1), int64_t(5), int64_t(6), kMax})
    for (int64_t g : {int64_t(0), int64_t(1), int64_t(5), int64_t(6), kMax})
      ok(O(8, 2).mode(nn::AscenderMode::Windowed).window(w).global_tokens(g));
  // normalisation, dropout, RoPE, auxiliary losses, schedule
  for (double bad : {0.0, -1.0, 0.99e-12, kNaN, kInf})
    refused(O(8, 2).norm_eps(bad), "norm_eps must be finite and >= 1e-12");
  for (double bad : {-0.1, 1.0, kNaN, kInf}) refused(O(8, 2).dropout(bad), "dropout");
  ok(O(8, 2).dropout(0.0).norm_eps(1e-12));
  refused(O(8, 2).rope(true).rope_max_len(0), "rope_max_len must be in [1, 16777216]");
  refused(O(8, 2).rope(true).rope_max_len(kMax), "rope_max_len must be in [1, 16777216]");
  refused(O(6, 2).rope(true), "RoPE needs an even head dim");
  ok(O(8, 2).rope(true).rope_max_len(5));
  for (double bad : {-1.0, kNaN, kInf}) {
    refused(O(8, 2).aux_coh(bad), "auxiliary loss weights must be finite and >= 0");
    refused(O(8, 2).aux_sep(bad), "auxiliary loss weights");
    refused(O(8, 2).aux_align(bad), "auxiliary loss weights");
  }
  ok(O(8, 2).aux_coh(0.0).aux_sep(1e3).aux_align(1.0));
  refused(O(8, 2).warmup_steps(-1), "warmup_steps -1");
  refused(O(8, 2).sep_start_step(-1), "sep_start_step -1");
  refused(O(8, 2).aux_start_step(-2), "aux_start_step -2 >= -1");
  ok(O(8, 2).warmup_steps(kMax).sep_start_step(kMax).aux_start_step(kMax).aux_coh(1.0));
  ok(O(8, 2).warmup_steps(0).sep_start_step(0).aux_start_step(-1).aux_coh(1.0));
}

TEST_CASE("AscenderAttention step: exact to INT64_MAX, saturating, and a loaded step passes the setter's check") {
  nn::AscenderAttention attn(nn::AscenderAttentionOptions(8, 2).warmup_steps(10));
  check_error([&] { attn.set_step(-1); }, {"step must be >= 0"});
  const int64_t big = (int64_t(1) << 53) + 1;  // not a double
  attn.set_step(big);
  CHECK(attn.step() == big);
  attn.set_step(kMax);
  CHECK(attn.step() == kMax);
  attn.train();
  attn.attend(randn32({1, 4, 8}), {});  // one training step: saturates instead of overflowing
  CHECK(attn.step() == kMax);
  CHECK(attn.omega_scale() == 1.0);
  // load_state_dict: a negative step is refused like the setter, and nothing is loaded
  attn.set_step(3);
  StateDict sd = attn.state_dict();
  StateDict bad;
  for (const auto& [name, t] : sd) bad.set(name, name == "step" ? full({}, -1.0, {.dtype = kInt64}) : zeros_like(t));
  check_error([&] { attn.load_state_dict(bad); }, {"AscenderAttention", "loaded step must be >= 0"});
  CHECK(attn.step() == 3);
  CHECK(same_bits(attn.omega_align, sd.at("omega_align")));
  bad.set("step", full({}, 7.0, {.dtype = kInt64}));
  attn.load_state_dict(bad);
  CHECK(attn.step() == 7);
}

// ---- NaN propagation (docs §13) -----------------------------------------------------------------------------------

namespace {

// Row i of (B, H, T, d): every component NaN / none NaN.
std::vector<int> row_kinds(const Tensor& y) {  // 1: all NaN, 0: all finite, -1: mixed
  const std::vector<double> v = y.to(kFloat64).to(Device::cpu()).to_vector<double>();
  const int64_t d = y.size(3), rows = y.numel() / d;
  std::vector<int> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int nan = 0, fin = 0;
    for (int64_t c = 0; c < d; ++c) std::isnan(v[r * d + c]) ? ++nan : std::isfinite(v[r * d + c]) ? ++fin : 0;
    out[r] = nan == d ? 1 : fin == d ? 0 : -1;
  }
  return out;
}

// A NaN put into one place, and the rows of the (B = 2, H = 2, T) output that must be NaN by docs §13.
struct NanCase {
  const char* what;
  bool may_leak;  // v and (with cohesion) z: rows that mask the key may be NaN too (0 · NaN in A V and Σ w' z)
};

}  // namespace

TEST_CASE("ASCender NaN: a NaN reaches exactly the rows that read it, in the kernel and the reference") {
  const int64_t B = 2, H = 2, T = 21, b0 = 1, h0 = 0, tok = 6;
  // keep: causal, and batch 1 pads from token 17 on; so row i of (b0, h0) keeps key tok iff tok <= i < 17 (and the
  // padded rows 17.. keep 0..16, so tok too).
  Tensor keep = logical_and(causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T}),
                            lt(arange(0, double(T), 1.0, {.dtype = kFloat64}).view({1, 1, 1, T}),
                               tensor(std::vector<double>{double(T), 17.0}, {2, 1, 1, 1})));
  const std::vector<int64_t> keep_v = keep.expand({B, H, T, T}).to(kInt64).contiguous().to_vector<int64_t>();
  auto kept = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return keep_v[((b * H + h) * T + i) * T + j] != 0; };
  auto any_kept = [&](int64_t b, int64_t h, int64_t i) {
    for (int64_t j = 0; j < T; ++j)
      if (kept(b, h, i, j)) return true;
    return false;
  };
  for (DType dt : {kFloat64, kFloat32})
    for (int64_t window : {int64_t(0), int64_t(4)})
      for (int which = 0; which < 10; ++which) {
        CAPTURE(dt);
        CAPTURE(window);
        CAPTURE(which);
        Heads x = make_heads(B, H, T, 40 + which, dt);
        AscenderCoreArgs a = make_args(H, dt);
        a.keep_mask = keep, a.window = window, a.global_tokens = window > 0 ? 1 : 0, a.row_block = 8;
        auto kept_w = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
          const bool in_w = window <= 0 || std::abs(i - j) < window || i < a.global_tokens || j < a.global_tokens;
          return kept(b, h, i, j) && in_w;
        };
        auto poison = [&](Tensor& t, int64_t i) {  // token i of (b0, h0), every component
          Tensor c = t.clone();
          c.select(0, b0).select(0, h0).select(0, i).fill_(kNaN);
          t = c;
        };
        // expected(b, h, i): row i must be NaN
        std::function<bool(int64_t, int64_t, int64_t)> expected;
        bool may_leak = false;
        auto key_rows = [&](int64_t b, int64_t h, int64_t i) { return b == b0 && h == h0 && kept_w(b, h, i, tok); };
        auto own_row = [&](int64_t b, int64_t h, int64_t i) { return b == b0 && h == h0 && i == tok; };
        switch (which) {
          case 0: poison(x.q, tok), expected = own_row; break;       // q_i: its own row
          case 1: poison(x.k_rot, tok), expected = key_rows; break;  // k_rot_j: the rows that keep j
          case 2: poison(x.k, tok), expected = key_rows; break;      // k_j (alignment's r_ij)
          case 3: poison(x.v, tok), expected = key_rows, may_leak = true; break;
          case 4:  // z_j: separation and cohesion
            poison(x.z, tok),
                expected = [&](int64_t b, int64_t h, int64_t i) { return key_rows(b, h, i) || own_row(b, h, i); };
            may_leak = true;
            break;
          case 5:  // e_j: the affinities of the rows that keep j, and every affinity of row j
            poison(x.e, tok),
                expected = [&](int64_t b, int64_t h, int64_t i) { return key_rows(b, h, i) || own_row(b, h, i); };
            break;
          case 6: {  // a whole token: its row and the rows that keep it
            for (Tensor* t : {&x.q, &x.k_rot, &x.k, &x.v, &x.z, &x.e}) poison(*t, tok);
            expected = [&](int64_t b, int64_t h, int64_t i) { return key_rows(b, h, i) || own_row(b, h, i); };
            may_leak = true;
            break;
          }
          case 7: {  // one bias entry (b0, h0, i = 12, j = tok): that row only
            Tensor bias = zeros({B, H, T, T}, {.dtype = dt});
            bias.select(0, b0).select(0, h0).select(0, 12).select(0, tok).fill_(kNaN);
            a.bias = bias;
            expected = [&](int64_t b, int64_t h, int64_t i) {
              return b == b0 && h == h0 && i == 12 && kept_w(b, h, i, tok);
            };
            break;
          }
          case 8: {  // κ of head 1: every row of head 1 with a key (η is NaN; after_norm multiplies it in)
            std::vector<double> kv{2.0, kNaN};
            a.kappa = tensor(kv, {2}).to(dt);
            expected = [&](int64_t b, int64_t h, int64_t i) { return h == 1 && any_kept(b, h, i); };
            break;
          }
          case 9: {  // δ of head 0
            std::vector<double> dv{kNaN, 0.2};
            a.delta = tensor(dv, {2}).to(dt);
            expected = [&](int64_t b, int64_t h, int64_t i) { return h == 0 && any_kept(b, h, i); };
            break;
          }
        }
        if (window > 0 && which == 7) continue;  // (12, tok) lies outside the window: nothing to see
        for (AscenderBackend backend : {AscenderBackend::Fused, AscenderBackend::Reference}) {
          CAPTURE(static_cast<int>(backend));
          const std::vector<int> kinds = row_kinds(run(x, a, backend));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < T; ++i) {
                CAPTURE(b);
                CAPTURE(h);
                CAPTURE(i);
                const int got = kinds[(b * H + h) * T + i];
                if (expected(b, h, i))
                  CHECK(got == 1);
                else if (!may_leak || b != b0 || h != h0)
                  CHECK(got == 0);
                else
                  CHECK(got != -1);
              }
        }
      }
}

TEST_CASE("ASCender NaN: gradients of the rows that are NaN are NaN (fused and reference), the others' stay finite") {
  const int64_t B = 1, H = 2, T = 12, tok = 4;
  for (AscenderBackend backend : {AscenderBackend::Fused, AscenderBackend::Reference}) {
    CAPTURE(static_cast<int>(backend));
    Heads x = make_heads(B, H, T, 60);
    Tensor zc = x.z.clone();
    zc.select(0, 0).select(0, 0).select(0, tok).fill_(kNaN);
    x.z = zc;
    for (Tensor* t : {&x.q, &x.k_rot, &x.k, &x.v, &x.z, &x.e}) t->set_requires_grad(true);
    AscenderCoreArgs a = make_args(H);
    a.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
    a.use_coh = false;  // separation only reads z: no 0 · NaN products
    BackendScope s(backend);
    Tensor y = ascender_attention(x.q, x.k_rot, x.k, x.v, x.z, x.e, a);
    y.sum().backward();
    const std::vector<int> kinds = row_kinds(x.q.grad());
    for (int64_t i = 0; i < T; ++i) {
      CAPTURE(i);
      CHECK(kinds[i] == (i >= tok ? 1 : 0));  // head 0: rows tok.. read z_tok
      CHECK(kinds[T + i] == 0);               // head 1 never reads it
    }
  }
}

// ---- numerical findings -------------------------------------------------------------------------------------------

TEST_CASE("ASCender isolated token: float32 ρ keeps its relative precision (Y and dL/dκ against float64)") {
  // Two tokens far apart in z: ρ_i = w_12 ≈ 1.7e-5 << w_ii = 1, and κ of the same order so η = ρ / κ < 1 acts
  // (after_norm). Summing w over all kept keys and subtracting w_ii would leave ρ with no correct digit in float32.
  const int64_t T = 2;
  Heads x = make_heads(1, 1, T, 70);
  x.z = tensor(std::vector<double>{0.0, 0.0, 0.0, std::sqrt(11.0), 0.0, 0.0}, {1, 1, T, 3});  // d² = 11: w = e^-11
  AscenderCoreArgs a = make_args(1);
  a.use_align = false, a.use_coh = false, a.tau_sep = {1.0};
  a.kappa = full({1}, 2e-5, {.dtype = kFloat64}), a.omega_sep = full({1}, 0.5, {.dtype = kFloat64});
  a.lambda_sep = full({1}, 1.0, {.dtype = kFloat64}), a.delta = full({1}, -0.9, {.dtype = kFloat64});
  auto go = [&](DType dt, AscenderBackend backend) {
    Heads h = x;
    for (Tensor* t : {&h.q, &h.k_rot, &h.k, &h.v, &h.z, &h.e}) *t = t->to(kFloat32).to(dt);  // the same values
    AscenderCoreArgs p = a;
    p.kappa = a.kappa.to(kFloat32).to(dt).set_requires_grad(true);
    for (Tensor* t : {&p.omega_align, &p.omega_sep, &p.omega_coh, &p.lambda_align, &p.lambda_sep, &p.lambda_coh,
                      &p.delta, &p.tau_score})
      *t = t->to(kFloat32).to(dt);
    BackendScope s(backend);
    Tensor y = ascender_attention(h.q, h.k_rot, h.k, h.v, h.z, h.e, p);
    (y * randn64(y.shape(), false, 71).to(dt)).sum().backward();
    return std::pair{y.to(kFloat64), p.kappa.grad().to(kFloat64)};
  };
  const auto [y64, dk64] = go(kFloat64, AscenderBackend::Reference);
  const double dk = dk64.item<double>();
  REQUIRE(std::abs(dk) > 1e2);  // η acts: dL/dκ is large (1 / κ)
  for (AscenderBackend backend : {AscenderBackend::Fused, AscenderBackend::Reference}) {
    CAPTURE(static_cast<int>(backend));
    const auto [y32, dk32] = go(kFloat32, backend);
    check_close(y32, y64, 2e-6, 2e-6);
    CHECK(std::abs(dk32.item<double>() - dk) <= 1e-4 * std::abs(dk));
  }
}

TEST_CASE("ASCender decomposition: S is -inf outside the attended set; γ_align = 1/2 on a row with no neighbour") {
  const int64_t T = 7;
  const Heads x = make_heads(1, 2, T, 80);
  AscenderCoreArgs a = make_args(2);
  a.gate_position = GatePosition::BeforeNorm;
  a.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
  AscenderDecomposition dec;
  ascender_attention(x.q, x.k_rot, x.k, x.v, x.z, x.e, a, &dec);
  const std::vector<double> S = dec.S.to_vector<double>(), g = dec.gamma_align.to_vector<double>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const double s = S[(h * T + i) * T + j];
        CHECK((j <= i ? std::isfinite(s) : s == -kInf));
      }
  // Row 0 keeps only itself (self excluded): N(0) is empty, Var = 0, γ = σ(0) = 1/2 whatever α (2 here);
  // row 1 has one neighbour: Var = 0 too (one unit key), γ = 1/2; row 2 has two: γ < 1/2 unless they coincide.
  for (int64_t h = 0; h < 2; ++h) {
    CHECK(g[h * T + 0] == 0.5);
    CHECK(g[h * T + 1] == doctest::Approx(0.5).epsilon(1e-12));
    CHECK(g[h * T + 2] < 0.5);
  }
  // The windowed mode too: S is -inf outside the window.
  a.keep_mask = Tensor(), a.window = 2, a.global_tokens = 1;
  ascender_attention(x.q, x.k_rot, x.k, x.v, x.z, x.e, a, &dec);
  const std::vector<double> Sw = dec.S.to_vector<double>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) {
      const bool in = std::abs(i - j) < 2 || i < 1 || j < 1;
      CHECK((in ? std::isfinite(Sw[i * T + j]) : Sw[i * T + j] == -kInf));
    }
}

// ---- determinism across thread counts -------------------------------------------------------------------------------

TEST_CASE("ASCender CPU kernel in deterministic mode: forward and backward bit-identical for 1, 2 and 3 threads") {
#ifdef ASC_HAVE_OPENMP
  struct DetScope {
    bool saved = deterministic_algorithms_enabled();
    DetScope() { use_deterministic_algorithms(true); }
    ~DetScope() { use_deterministic_algorithms(saved); }
  } det;
  for (DType dt : {kFloat32, kFloat64})
    for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 150}, {2, 3, 70}})
      for (int64_t window : {int64_t(0), int64_t(9)}) {
        CAPTURE(dt);
        CAPTURE(B * H);
        CAPTURE(window);
        std::vector<TensorList> results;
        for (int threads : {1, 2, 3}) {
          ThreadCount tc(threads);
          Heads x = make_heads(B, H, T, 90, dt);
          for (Tensor* t : {&x.q, &x.k_rot, &x.k, &x.v, &x.z, &x.e}) t->set_requires_grad(true);
          AscenderCoreArgs a = make_args(H, dt);
          a.keep_mask = causal_keep_mask(T, T, Device::cpu()).view({1, 1, T, T});
          a.window = window, a.global_tokens = window > 0 ? 2 : 0;
          a.kappa.set_requires_grad(true), a.omega_sep.set_requires_grad(true);
          BackendScope s(AscenderBackend::Fused);
          Tensor y = ascender_attention(x.q, x.k_rot, x.k, x.v, x.z, x.e, a);
          (y * randn64(y.shape(), false, 91).to(dt)).sum().backward();
          results.push_back({y, x.q.grad(), x.k_rot.grad(), x.k.grad(), x.v.grad(), x.z.grad(), x.e.grad(),
                             a.kappa.grad(), a.omega_sep.grad()});
        }
        for (size_t r = 1; r < results.size(); ++r)
          for (size_t i = 0; i < results[0].size(); ++i) {
            CAPTURE(r);
            CAPTURE(i);
            CHECK(same_bits(results[r][i], results[0][i]));
          }
      }
#else
  MESSAGE("no OpenMP: one thread only");
#endif
}

// ---- the CUDA kernel sees the same checks (the emulator build runs these) -------------------------------------------

TEST_CASE("ASCender on CUDA: the op's checks before dispatch, NaN rows, γ_align = 1/2") {
  if (!gpu_or_skip()) return;
  const Device dev = Device::cuda();
  const int64_t T = 10;
  Heads x = make_heads(1, 2, T, 100, kFloat32, dev);
  AscenderCoreArgs a = make_args(2, kFloat32, dev);
  a.keep_mask = ones({1, 1, T, T}, {.device = dev});  // float
  check_refused(x, a, "keep_mask must be bool");
  a.keep_mask = causal_keep_mask(T, T, dev).view({1, 1, T, T});
  AscenderCoreArgs bad = a;
  bad.tau_sep = {1.0, kNaN};
  check_refused(x, bad, "finite tau_sep and tau_coh >= 1e-6");
  bad = a, bad.k = {0, 2};
  check_refused(x, bad, "needs k >= 1");
  bad = a, bad.row_block = -1;
  check_refused(x, bad, "row_block must be >= 0");
  // integer extremes clamp the same way on CUDA
  bad = a, bad.k = {kMax, kMax}, bad.window = kMax, bad.global_tokens = kMax;
  AscenderCoreArgs full_k = a;
  full_k.k = {T, T};
  check_close(run(x, bad, AscenderBackend::Fused).to(Device::cpu()),
              run(x, full_k, AscenderBackend::Fused).to(Device::cpu()), 1e-6, 1e-6);
  // a NaN token (all but v, whose NaN may also reach the rows that mask it: 0 · NaN in A V): the same rows as on
  // the CPU
  const int64_t tok = 3;
  Heads xn = x;
  for (Tensor* t : {&xn.q, &xn.k_rot, &xn.k, &xn.z, &xn.e}) {
    Tensor c = t->clone();
    c.select(0, 0).select(0, 1).select(0, tok).fill_(kNaN);
    *t = c;
  }
  const std::vector<int> kinds = row_kinds(run(xn, a, AscenderBackend::Fused));
  for (int64_t i = 0; i < T; ++i) {
    CAPTURE(i);
    CHECK(kinds[i] == 0);                       // head 0: clean
    CHECK(kinds[T + i] == (i >= tok ? 1 : 0));  // head 1: the token's row and the rows that keep it
  }
}
