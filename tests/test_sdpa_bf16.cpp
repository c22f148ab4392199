// scaled_dot_product_attention under CpuAutocast: its products in bfloat16 (ops/cpu/attention_bf16.cpp for the fused
// kernel, matmul_bf16 for the composed path), as torch.autocast("cpu") runs it. The output and the gradients against
// float64 loops that round to bfloat16 where the kernels do (Q, K, V, P in the forward; dO, P, V, dS, K, Q in the
// backward) and keep everything else exact: the largest error within a bound a wrong product cannot meet, and the
// typical error a small fraction of how far the exact float64 attention lies, so that a product left in float32 (or
// rounded where it should not be) fails. Odd head widths and key counts (the half pairs of vdpbf16ps), two row
// blocks, causality with S != T, masks, bias, strided views, NaN, dead rows, the same bits at every thread count, and
// the float32 path untouched. Without bfloat16 products on the processor the cases return at once (test_autocast.cpp
// checks the refusals).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ascender.h"
#include "testing.h"

#include "ops/cpu/bfloat16.h"

using namespace asc;
using namespace asc::testing;

namespace {

// float32 -> bfloat16 -> float64, a denormal to zero as the kernels' instruction rounds it (round_to_bfloat16)
double bf(double x) {
  const float f = static_cast<float>(x);
  if (std::fpclassify(f) == FP_SUBNORMAL) return std::signbit(f) ? -0.0 : 0.0;
  return cpu::bfloat16_value(cpu::bfloat16_bits(f));
}

std::vector<double> values(const Tensor& t, bool round) {
  std::vector<double> v = t.contiguous().to_vector<double>();
  if (round)
    for (double& e : v) e = bf(e);
  return v;
}

// Attention of q (B, H, T, D), k, v (B, H, S, D) with cotangent g (B, H, T, D) in float64 loops: round = true rounds
// every product's operands to bfloat16 where the kernels do, false gives exact attention. keep: (B, H, T, S) as 0/1
// (empty: all kept); bias (B, H, T, S) or empty. Each row's delta in dS = scale · P ∘ (dP - delta): rowsum(dO ∘ O)
// with dO unrounded, as the fused kernels take it, or (softmax_delta) rowsum(P ∘ dP), as the composed path's softmax
// backward does — the same number exactly, not once the products are rounded.
struct Result {
  std::vector<double> o, dq, dk, dv;
};
Result reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const std::vector<double>& keep,
                 const std::vector<double>& bias, bool causal, bool round, bool softmax_delta = false) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), D = q.size(3);
  const std::vector<double> Q = values(q, round), K = values(k, round), V = values(v, round), G = values(g, round),
                            G32 = values(g, false);
  const auto r = [round](double x) { return round ? bf(x) : x; };
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Result out{
      std::vector<double>(static_cast<size_t>(B * H * T * D)), std::vector<double>(static_cast<size_t>(B * H * T * D)),
      std::vector<double>(static_cast<size_t>(B * H * S * D)), std::vector<double>(static_cast<size_t>(B * H * S * D))};
  std::vector<double> P(static_cast<size_t>(T * S)), dS(static_cast<size_t>(T * S));
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const auto at = [&](int64_t t, int64_t s) { return static_cast<size_t>((bh * T + t) * S + s); };
    const double* Qh = Q.data() + bh * T * D;
    const double* Kh = K.data() + bh * S * D;
    const double* Vh = V.data() + bh * S * D;
    const double* Gh = G.data() + bh * T * D;
    const double* G32h = G32.data() + bh * T * D;
    double* Oh = out.o.data() + bh * T * D;
    for (int64_t t = 0; t < T; ++t) {  // P, O
      double m = -INFINITY;
      std::vector<double> x(static_cast<size_t>(S));
      for (int64_t s = 0; s < S; ++s) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += Qh[t * D + d] * Kh[s * D + d];
        const bool kept = (keep.empty() || keep[at(t, s)] != 0) && (!causal || s <= t + (S - T));
        x[s] = kept ? dot * scale + (bias.empty() ? 0.0 : bias[at(t, s)]) : -INFINITY;
        m = std::max(m, x[s]);
      }
      double z = 0;
      for (int64_t s = 0; s < S; ++s) z += m == -INFINITY ? 0.0 : std::exp(x[s] - m);
      for (int64_t s = 0; s < S; ++s) P[t * S + s] = m == -INFINITY ? 0.0 : std::exp(x[s] - m) / z;
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t s = 0; s < S; ++s) o += r(P[t * S + s]) * Vh[s * D + d];
        Oh[t * D + d] = o;
      }
    }
    for (int64_t t = 0; t < T; ++t) {  // dS = scale · P ∘ (dP - delta)
      std::vector<double> dp(static_cast<size_t>(S));
      double delta = 0;
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t d = 0; d < D; ++d) dp[s] += Gh[t * D + d] * Vh[s * D + d];
        if (softmax_delta) delta += P[t * S + s] * dp[s];
      }
      if (!softmax_delta)
        for (int64_t d = 0; d < D; ++d) delta += G32h[t * D + d] * Oh[t * D + d];
      for (int64_t s = 0; s < S; ++s) dS[t * S + s] = r(scale * P[t * S + s] * (dp[s] - delta));
    }
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t t = 0; t < T; ++t) {
        double dq = 0;
        for (int64_t s = 0; s < S; ++s) dq += dS[t * S + s] * Kh[s * D + d];
        out.dq[static_cast<size_t>((bh * T + t) * D + d)] = dq;
      }
      for (int64_t s = 0; s < S; ++s) {
        double dk = 0, dv = 0;
        for (int64_t t = 0; t < T; ++t) dk += dS[t * S + s] * Qh[t * D + d], dv += r(P[t * S + s]) * Gh[t * D + d];
        out.dk[static_cast<size_t>((bh * S + s) * D + d)] = dk;
        out.dv[static_cast<size_t>((bh * S + s) * D + d)] = dv;
      }
    }
  }
  return out;
}

// got against the rounded reference: every entry within 2 % of the tensor's largest magnitude (a wrong pair or
// product is off by the magnitude itself), and the median error under a twentieth of the median distance between the
// rounded and the exact reference (a product left unrounded, or rounded once too often, lands near that distance).
void check_rounded(const std::string& what, const Tensor& got, const std::vector<double>& ref,
                   const std::vector<double>& exact) {
  CAPTURE(what);
  const std::vector<double> y = got.contiguous().to_vector<double>();
  REQUIRE(y.size() == ref.size());
  double big = 0;
  for (double e : ref) big = std::max(big, std::fabs(e));
  std::vector<double> err, spread;
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    err.push_back(std::fabs(y[i] - ref[i])), spread.push_back(std::fabs(ref[i] - exact[i]));
    if (!(err.back() <= 0.02 * big) && bad++ < 5) FAIL_CHECK("entry " << i << ": " << y[i] << " vs " << ref[i]);
  }
  CHECK(bad == 0);
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  CHECK(median(err) < 0.05 * median(spread));
  CHECK(median(spread) > 0);
}

// Output and gradients of q, k, v with cotangent g, through contiguous leaf copies of q, k, v.
struct Run {
  Tensor o, dq, dk, dv;
};
Run run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const SdpaOptions& o) {
  Tensor ql = q.detach().clone().set_requires_grad(), kl = k.detach().clone().set_requires_grad(),
         vl = v.detach().clone().set_requires_grad();
  Tensor y = scaled_dot_product_attention(ql, kl, vl, o);
  sum(y * g).backward();
  return {y.detach(), ql.grad(), kl.grad(), vl.grad()};
}

// Each of a run's tensors by check_rounded, labelled "o", "dq", ... plus `label`.
void check_run(const Run& got, const Result& ref, const Result& exact, const std::string& label = "") {
  check_rounded("o" + label, got.o, ref.o, exact.o);
  check_rounded("dq" + label, got.dq, ref.dq, exact.dq);
  check_rounded("dk" + label, got.dk, ref.dk, exact.dk);
  check_rounded("dv" + label, got.dv, ref.dv, exact.dv);
}

Tensor f32(const Shape& s, uint64_t seed) { return randn64(s, false, seed).to(kFloat32); }

}  // namespace

TEST_CASE("sdpa under CpuAutocast: the fused kernel's bfloat16 products against rounded float64 loops") {
  if (!cpu_bf16_supported()) return;
  struct Case {
    int64_t T, S, D;
    bool causal, masked;
  };
  // D odd (a half pair in Q Kᵀ and dO Vᵀ), S odd (in P V and dS K), T = 80 two row blocks; causal with S = T + 1: the
  // first block's 65 keys end in a half pair whose other key it must not read.
  // S = 301: P V and dS K over more than one block of 128 pairs (the second ending in a half pair), Q Kᵀ and dO Vᵀ
  // over ten 32-key strips, the last one partial. D = 1: the products over D are one half pair.
  for (const Case c : {Case{37, 45, 24, false, true}, Case{80, 80, 33, true, false}, Case{80, 81, 16, true, true},
                       Case{5, 3, 64, false, false}, Case{70, 301, 24, false, true}, Case{9, 7, 1, true, false}}) {
    CAPTURE(c.T);
    CAPTURE(c.S);
    CAPTURE(c.D);
    CAPTURE(c.causal);
    CAPTURE(c.masked);
    const int64_t B = 2, H = 2;
    const Tensor q = f32({B, H, c.T, c.D}, 1), k = f32({B, H, c.S, c.D}, 2), v = f32({B, H, c.S, c.D}, 3);
    const Tensor g = f32({B, H, c.T, c.D}, 4), bias = f32({1, H, 1, c.S}, 5) * 0.5;
    Tensor keep = c.masked ? gt(randn64({B, 1, c.T, c.S}, false, 6), -0.8) : Tensor();
    const SdpaOptions o{.keep_mask = keep, .bias = bias, .causal = c.causal};
    const Shape sc{B, H, c.T, c.S};
    const std::vector<double> keep64 = c.masked ? keep.to(kFloat64).expand(sc).contiguous().to_vector<double>()
                                                : std::vector<double>(),
                              bias64 = values(bias.expand(sc), false);
    const Result ref = reference(q, k, v, g, keep64, bias64, c.causal, true),
                 exact = reference(q, k, v, g, keep64, bias64, c.causal, false),
                 composed = reference(q, k, v, g, keep64, bias64, c.causal, true, /*softmax_delta=*/true);
    REQUIRE(sdpa_choice(q, k, v, o) == "fused (CPU)");
    CpuAutocast on;
    REQUIRE(sdpa_choice(q, k, v, o) == "fused (CPU, bfloat16 products)");
    const Run f = run(q, k, v, g, o);
    check_run(f, ref, exact);
    // the composed path (matmul_bf16 for its two products) rounds at the same places
    SdpaBackendScope math(SdpaBackend::Math);
    const Run m = run(q, k, v, g, o);
    check_run(m, composed, exact, " (composed)");
  }
}

TEST_CASE("sdpa under CpuAutocast: strided views as the attention layers pass them, and packed copies") {
  if (!cpu_bf16_supported()) return;
  const int64_t B = 2, T = 70, H = 3, D = 20;
  // Leaves in the layouts the kernels receive (run() would hand them contiguous copies): q and v views of a fused
  // q/k/v projection per head (no copy), k and the cotangent with a strided head dim (the kernels pack copies).
  Tensor x = f32({B, T, 3, H, D}, 11).set_requires_grad(), kt = f32({B, H, D, T}, 12).set_requires_grad();
  const auto heads = [](const Tensor& t, int64_t i) { return t.select(2, i).permute({0, 2, 1, 3}); };
  const Tensor q = heads(x, 0), v = heads(x, 2), k = kt.transpose(-2, -1);
  const Tensor g = f32({B, H, D, T}, 13).transpose(-2, -1);
  REQUIRE(q.stride(3) == 1);
  REQUIRE(q.stride(2) == 3 * H * D);
  REQUIRE(k.stride(3) == T);
  REQUIRE(g.stride(3) == T);
  const Result ref = reference(q, k, v, g, {}, {}, true, true), exact = reference(q, k, v, g, {}, {}, true, false);
  CpuAutocast on;
  const Tensor y = scaled_dot_product_attention(q, k, v, {.causal = true});
  sum(y * g).backward();
  check_run({y.detach(), heads(x.grad(), 0), kt.grad().transpose(-2, -1), heads(x.grad(), 2)}, ref, exact);
}

TEST_CASE("sdpa under CpuAutocast: NaN stays in its rows, dead rows are zero, keys past a block stay unread") {
  if (!cpu_bf16_supported()) return;
  const int64_t B = 1, H = 2, T = 80, S = 81, D = 17;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor q = f32({B, H, T, D}, 21), k = f32({B, H, S, D}, 22), v = f32({B, H, S, D}, 23);
  q.data_ptr<float>()[(0 * T + 5) * D + 3] = nan;  // head 0, query 5
  // key 65: causal, the first row block (queries 0-63) sees keys 0-64 and never key 65, though 64 and 65 share a pair
  k.data_ptr<float>()[(1 * S + 65) * D + 2] = nan, v.data_ptr<float>()[(1 * S + 65) * D + 4] = nan;
  Tensor keep = ones({B, H, T, S}, {.dtype = kBool});
  bool* kp = keep.data_ptr<bool>();
  std::fill(kp + (1 * T + 9) * S, kp + (1 * T + 10) * S, false);  // head 1, query 9 attends to nothing
  const Tensor g = f32({B, H, T, D}, 24);
  CpuAutocast on;
  const Run f = run(q, k, v, g, {.keep_mask = keep, .causal = true});
  const Tensor oc = f.o.contiguous(), dqc = f.dq.contiguous();  // o is stored heads-last
  const float* o = oc.data_ptr<float>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t) {
      CAPTURE(h);
      CAPTURE(t);
      bool any_nan = false, all_zero = true;
      for (int64_t d = 0; d < D; ++d) {
        const float e = o[(h * T + t) * D + d];
        any_nan |= std::isnan(e), all_zero &= e == 0.0f;
      }
      if (h == 0) CHECK(any_nan == (t == 5));
      if (h == 1 && t < 64) CHECK(!any_nan);  // the first block's queries do not see key 65
      if (h == 1 && t == 9) CHECK(all_zero);
    }
  // head 1's first block: dQ finite (dS K over keys 0-64), as in float32
  const float* dq = dqc.data_ptr<float>();
  for (int64_t t = 0; t < 64; ++t)
    for (int64_t d = 0; d < D; ++d) CHECK(std::isfinite(dq[(1 * T + t) * D + d]));
}

TEST_CASE("sdpa under CpuAutocast: the same bits at every thread count; float64 and the float32 path untouched") {
  if (!cpu_bf16_supported()) return;
  const Tensor q = f32({2, 3, 70, 24}, 31), k = f32({2, 3, 70, 24}, 32), v = f32({2, 3, 70, 24}, 33);
  const Tensor g = f32({2, 3, 70, 24}, 34);
  Run first;
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    CpuAutocast on;
    const Run r = run(q, k, v, g, {.causal = true});
    if (!first.o.defined()) first = r;
    CHECK_MESSAGE(same_bits(r.o, first.o), threads, " threads");
    CHECK_MESSAGE(same_bits(r.dq, first.dq), threads, " threads");
    CHECK_MESSAGE(same_bits(r.dk, first.dk), threads, " threads");
    CHECK_MESSAGE(same_bits(r.dv, first.dv), threads, " threads");
  }
  const Tensor y32 = scaled_dot_product_attention(q, k, v, {.causal = true});
  CHECK(!same_bits(first.o, y32));  // autocast changed the products...
  CHECK(amax(abs(first.o - y32)).item<double>() < 0.05);
  {
    CpuAutocast on;
    CpuAutocast off(false);  // ...and only while it is on
    CHECK(same_bits(scaled_dot_product_attention(q, k, v, {.causal = true}), y32));
    const Tensor q64 = q.to(kFloat64), k64 = k.to(kFloat64), v64 = v.to(kFloat64);
    const Tensor y64 = scaled_dot_product_attention(q64, k64, v64, {.causal = true});
    CpuAutocast on_again;
    CHECK(same_bits(scaled_dot_product_attention(q64, k64, v64, {.causal = true}), y64));  // float32 only
  }
}
