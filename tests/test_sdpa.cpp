// scaled_dot_product_attention (ops/attention.h) on the CPU: the fused kernel (ops/cpu/attention.cpp) against
// independent float64 loops and against the composed ops, its float64 gradcheck, when it is chosen, and bad input.
#include <cmath>
#include <limits>
#include <vector>

#include "ascender.h"
#include "testing.h"

using namespace asc;
using asc::testing::check_error;
using asc::testing::check_grad;
using asc::testing::randn64;
using asc::testing::SdpaBackendScope;

namespace {

double max_diff(const Tensor& a, const Tensor& b) { return amax(abs(a.to(kFloat64) - b.to(kFloat64))).item<double>(); }

// O[b,h,t] = Σ_s p_s v_s with p = softmax over kept s of q·k_s/√D + bias, in plain loops (zero row if none kept).
Tensor naive_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep, const Tensor& bias,
                  bool causal) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), D = q.size(3);
  const Shape sc{B, H, T, S};
  std::vector<double> Q = q.to(kFloat64).to_vector<double>(), K = k.to(kFloat64).to_vector<double>(),
                      V = v.to(kFloat64).to_vector<double>();
  std::vector<double> Bi = bias.defined() ? bias.to(kFloat64).expand(sc).contiguous().to_vector<double>()
                                          : std::vector<double>(B * H * T * S, 0.0);
  std::vector<double> M = keep.defined() ? keep.to(kFloat64).expand(sc).contiguous().to_vector<double>()
                                         : std::vector<double>(B * H * T * S, 1.0);
  std::vector<double> out(B * H * T * D, 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> x(S);
      double m = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += Q[(bh * T + t) * D + d] * K[(bh * S + s) * D + d];
        const bool kept = M[(bh * T + t) * S + s] != 0 && (!causal || s <= t + (S - T));
        x[s] = kept ? dot / std::sqrt(double(D)) + Bi[(bh * T + t) * S + s] : -INFINITY;
        m = std::max(m, x[s]);
      }
      if (m == -INFINITY) continue;
      double z = 0;
      for (int64_t s = 0; s < S; ++s) z += std::exp(x[s] - m);
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) out[(bh * T + t) * D + d] += std::exp(x[s] - m) / z * V[(bh * S + s) * D + d];
    }
  return tensor(out, {B, H, T, D});
}

// Each of fused's tensors (output, gradients) against math's, within tol relative to math's largest magnitude.
void check_close_scaled(const TensorList& fused, const TensorList& math, double tol) {
  REQUIRE(fused.size() == math.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    const double scale = std::max(1.0, amax(abs(math[i].to(kFloat64))).item<double>());
    CHECK(max_diff(fused[i], math[i]) < tol * scale);
  }
}

}  // namespace

TEST_CASE("sdpa CPU: the fused kernel equals float64 loops and the composed ops (masks, bias, causal, T != S)") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
    for (int64_t T : {1, 5, 70})  // 70 > the kernel's 64-row block: two tiles
      for (int64_t S : {1, 7, 70})
        for (bool causal : {false, true}) {
          CAPTURE(T);
          CAPTURE(S);
          CAPTURE(causal);
          Tensor q = randn64({2, 3, T, 8}, false, 1).to(dt), k = randn64({2, 3, S, 8}, false, 2).to(dt);
          Tensor v = randn64({2, 3, S, 8}, false, 3).to(dt);
          Tensor bias = randn64({1, 3, 1, S}, false, 5).to(dt);  // broadcast over batch and queries
          // The mask broadcast over heads (some rows die), its keys consecutive, strided (a transposed view) or
          // broadcast (one flag per query row): the kernel reads each layout its own way.
          for (const Tensor& keep :
               {gt(randn64({2, 1, T, S}, false, 4), -0.7), gt(randn64({2, 1, S, T}, false, 4), -0.7).transpose(-2, -1),
                gt(randn64({2, 1, T, 1}, false, 4), -0.7)}) {
            CAPTURE(keep.strides());
            SdpaOptions o{.keep_mask = keep, .bias = bias, .causal = causal};
            REQUIRE(sdpa_choice(q, k, v, o) == "fused (CPU)");
            Tensor fused = scaled_dot_product_attention(q, k, v, o);
            CHECK(max_diff(fused, naive_sdpa(q, k, v, keep, bias, causal)) < tol);
            SdpaBackendScope math(SdpaBackend::Math);
            CHECK(max_diff(fused, scaled_dot_product_attention(q, k, v, o)) < tol);
          }
        }
  }
}

TEST_CASE("sdpa CPU: strided views (a permuted projection) need no copy and give the same result") {
  Tensor x = randn64({2, 9, 4, 6}, false, 11);                    // (B, T, H, D) as a projection leaves it
  Tensor q = x.permute({0, 2, 1, 3});                             // (B, H, T, D) view, head dim contiguous
  Tensor k = randn64({2, 4, 6, 9}, false, 12).transpose(-2, -1);  // (B, H, 9, 6) with a strided head dim
  Tensor v = randn64({2, 4, 9, 6}, false, 13);
  Tensor y = scaled_dot_product_attention(q, k, v, {.causal = true});
  CHECK(max_diff(y, naive_sdpa(q.contiguous(), k.contiguous(), v, {}, {}, true)) < 1e-12);
}

TEST_CASE("sdpa CPU: long keys, wide heads and strided operands — forward and gradients against the composed ops") {
  // S = 600 > 256 cuts the products over keys into blocks (small_gemm.h's gemm_narrow_blocked); D = 40 is two
  // 16-float vector blocks plus a tail; K and V have strided head dims (packed copies), and the gradient reaching
  // the kernel is a transposed view (dO with a strided head dim).
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-11 : 3e-5;
    for (bool causal : {false, true}) {
      CAPTURE(dt);
      CAPTURE(causal);
      const int64_t B = 1, H = 2, T = 70, S = 600, D = 40;
      Tensor xq = randn64({B, T, H, D}, false, 31).to(dt).set_requires_grad();
      Tensor xk = randn64({B, H, D, S}, false, 32).to(dt).set_requires_grad();
      Tensor xv = randn64({B, H, D, S}, false, 33).to(dt).set_requires_grad();
      Tensor keep = gt(randn64({B, 1, T, S}, false, 34), -1.5);
      Tensor w = randn64({B, H, D, T}, false, 35).to(dt);
      SdpaOptions o{.keep_mask = keep, .causal = causal};
      auto run = [&](SdpaBackend backend) {
        SdpaBackendScope scope(backend);
        Tensor q = xq.permute({0, 2, 1, 3}), k = xk.transpose(-2, -1), v = xv.transpose(-2, -1);
        if (backend == SdpaBackend::Auto) REQUIRE(sdpa_choice(q, k, v, o) == "fused (CPU)");
        Tensor y = scaled_dot_product_attention(q, k, v, o);
        (y.transpose(-2, -1).contiguous() * w).sum().backward();
        TensorList out{y.detach(), xq.grad(), xk.grad(), xv.grad()};
        xq.zero_grad(), xk.zero_grad(), xv.zero_grad();
        return out;
      };
      const TensorList fused = run(SdpaBackend::Auto), math = run(SdpaBackend::Math);
      check_close_scaled(fused, math, tol);
    }
  }
}

TEST_CASE("sdpa CPU: contiguous gradients — the row statistics in vector lanes — against the composed ops") {
  // dO and O with contiguous head dims take the backward's 16-row (8 for float64) dot products of dO · O at
  // x86-64-v4: T = 70 is four groups of 16 rows and a 6-row rest in the first tile and a 6-row second tile; D = 40
  // leaves 8 columns past the vector lanes; S = 37 leaves 5 keys past the forward's row max and sum lanes. Dead rows
  // (no key kept), a bias and a causal mask go through the same rows.
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-11 : 3e-5;
    for (bool causal : {false, true}) {
      CAPTURE(dt);
      CAPTURE(causal);
      const int64_t B = 2, H = 2, T = 70, S = 37, D = 40;
      Tensor q = randn64({B, H, T, D}, false, 41).to(dt).set_requires_grad();
      Tensor k = randn64({B, H, S, D}, false, 42).to(dt).set_requires_grad();
      Tensor v = randn64({B, H, S, D}, false, 43).to(dt).set_requires_grad();
      Tensor bias = randn64({1, H, T, S}, false, 44).to(dt);
      Tensor keep = gt(randn64({B, 1, T, S}, false, 45), -0.3);
      Tensor g = randn64({B, H, T, D}, false, 46).to(dt);
      SdpaOptions o{.keep_mask = keep, .bias = bias, .causal = causal};
      auto run = [&](SdpaBackend backend) {
        SdpaBackendScope scope(backend);
        if (backend == SdpaBackend::Auto) REQUIRE(sdpa_choice(q, k, v, o) == "fused (CPU)");
        Tensor y = scaled_dot_product_attention(q, k, v, o);
        y.backward(g);
        TensorList out{y.detach(), q.grad(), k.grad(), v.grad()};
        q.zero_grad(), k.zero_grad(), v.zero_grad();
        return out;
      };
      const TensorList fused = run(SdpaBackend::Auto), math = run(SdpaBackend::Math);
      CHECK(max_diff(fused[0], naive_sdpa(q.detach(), k.detach(), v.detach(), keep, bias, causal)) < tol);
      check_close_scaled(fused, math, tol);
    }
  }
}

TEST_CASE("sdpa CPU: a row with no kept key gives zeros, no NaN, and no gradient") {
  Tensor q = randn64({1, 1, 3, 4}, true, 1), k = randn64({1, 1, 5, 4}, true, 2), v = randn64({1, 1, 5, 4}, true, 3);
  std::vector<int64_t> m(15, 1);
  for (int s = 0; s < 5; ++s) m[5 + s] = 0;  // query 1 sees nothing
  Tensor keep = tensor(m, {1, 1, 3, 5}).to(kBool);
  Tensor y = scaled_dot_product_attention(q, k, v, keep);
  CHECK(amax(abs(y.select(2, 1))).item<double>() == 0.0);
  CHECK(sum(isnan(y).to(kFloat64)).item<double>() == 0.0);
  y.sum().backward();
  CHECK(amax(abs(q.grad().select(2, 1))).item<double>() == 0.0);
  CHECK(sum(isnan(k.grad()).to(kFloat64)).item<double>() == 0.0);
}

TEST_CASE("sdpa CPU: float64 gradcheck of the fused backward (mask, bias, causal, two row tiles)") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    Tensor q = randn64({1, 2, 66, 3}, true, 21), k = randn64({1, 2, 67, 3}, true, 22);
    Tensor v = randn64({1, 2, 67, 3}, true, 23);
    Tensor keep = gt(randn64({1, 2, 66, 67}, false, 24), -1.0);
    Tensor bias = randn64({1, 1, 66, 67}, false, 25);
    REQUIRE(sdpa_choice(q, k, v, {.keep_mask = keep, .bias = bias, .causal = causal}) == "fused (CPU)");
    check_grad(
        [&](const TensorList& in) {
          return TensorList{
              scaled_dot_product_attention(in[0], in[1], in[2], {.keep_mask = keep, .bias = bias, .causal = causal})};
        },
        {q, k, v});
  }
}

TEST_CASE("sdpa CPU: what the fused kernel does not take runs the composed ops, and says why") {
  Tensor q = randn64({1, 2, 4, 8}, true, 1);
  Tensor w;
  CHECK(sdpa_choice(q, q, q, {.dropout = 0.1, .training = true}) == "math: dropout");
  CHECK(sdpa_choice(q, q, q, {.dropout = 0.1, .training = false}) == "fused (CPU)");
  CHECK(sdpa_choice(q, q, q, {.weights = &w}) == "math: the probabilities were requested");
  Tensor bias = randn64({1, 2, 4, 4}, true, 2);
  CHECK(sdpa_choice(q, q, q, {.bias = bias}) == "math: a bias that needs a gradient");
  // ... and that path still differentiates the bias.
  scaled_dot_product_attention(q, q, q, {.bias = bias}).sum().backward();
  CHECK(bias.grad().defined());
  {
    SdpaBackendScope fused(SdpaBackend::Fused);
    CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, q, q, {.weights = &w}),
                         doctest::Contains("the Fused backend cannot run q [1, 2, 4, 8] float64"), Error);
  }
  SdpaBackendScope math(SdpaBackend::Math);
  CHECK(sdpa_choice(q, q, q) == "math: the Math backend is selected");
}

TEST_CASE("sdpa: bad input is a clear error") {
  Tensor q = randn64({1, 2, 4, 8});
  check_error(
      [&] {
        scaled_dot_product_attention(q, randn64({1, 2, 4, 6}), q);
      },
      {"scaled_dot_product_attention", "incompatible q"});
  check_error([&] { scaled_dot_product_attention(q.view({2, 4, 8}), q, q); }, {"rank 4"});
  check_error([&] { scaled_dot_product_attention(q, q.to(kFloat32), q); }, {"dtypes float64, float32"});
  check_error([&] { scaled_dot_product_attention(q, q, q, ones({1, 2, 4, 4})); }, {"keep_mask must be bool"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, q, q, ones({1, 2, 4, 3}).to(kBool));
      },
      {"broadcastable to the scores [1, 2, 4, 4]"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, q, q, {}, ones({3, 4}, {.dtype = kFloat64}));
      },
      {"bias must be floating and broadcastable"});
  check_error([&] { scaled_dot_product_attention(q, q, q, {.dropout = 1.0}); }, {"dropout 1 not in [0, 1)"});
}

TEST_CASE("causal_keep_mask: key s is kept for query t iff s <= t + (S - T)") {
  Tensor m = causal_keep_mask(2, 4, Device::cpu());
  CHECK(m.shape() == Shape{2, 4});
  CHECK(m.to(kInt64).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 1});
}
