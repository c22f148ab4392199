// ASAM's sparse attention (docs/asam.md): each pattern builder against its definition written as a predicate over
// every (i, j), clustered bucketing against the exhaustive pair test, unions; the sparse attention op against
// float64 loops over an explicit dense mask (forward and every gradient), finite differences, the composed
// reference, the CUDA kernels against the CPU's, and the memory of the sparse path at n = 4096. The layer built
// on it, nn::AsamAttention, is tests/test_asam_attention.cpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/transformer_classifier.h"
#include "ops/cpu/sparse_attention.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

using Pred = std::function<bool(int64_t i, int64_t j)>;

// The pattern's rows equal {j : pred(i, j)} for every query i (group g).
void check_pattern(const SparsePattern& p, const Pred& pred, int64_t group = 0) {
  for (int64_t i = 0; i < p.queries(); ++i) {
    std::vector<int64_t> want;
    for (int64_t j = 0; j < p.keys(); ++j)
      if (pred(i, j)) want.push_back(j);
    CAPTURE(i);
    CHECK(p.row(group, i) == want);
  }
}

// The attention of one (b, h) row by definition: scores over the allowed, kept keys, softmax, weighted sum. float64.
struct Naive {
  Tensor o, dq, dk, dv;
};
Naive naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& allowed /* (B,H,T,S) bool */,
                      const Tensor& dout, double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), D = q.size(3);
  auto Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>(), G = dout.to_vector<double>();
  auto M = allowed.to_vector<bool>();
  std::vector<double> O(B * H * T * D, 0), dQ(O.size(), 0), dK(B * H * S * D, 0), dV(dK.size(), 0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> s(S, 0), p(S, 0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        if (!M[(bh * T + i) * S + j]) continue;
        for (int64_t c = 0; c < D; ++c) s[j] += Q[(bh * T + i) * D + c] * K[(bh * S + j) * D + c];
        s[j] *= scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;  // no allowed key: o = 0, no gradient
      double sum = 0;
      for (int64_t j = 0; j < S; ++j)
        if (M[(bh * T + i) * S + j]) sum += (p[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < S; ++j) p[j] /= sum;
      for (int64_t j = 0; j < S; ++j)
        for (int64_t c = 0; c < D; ++c) O[(bh * T + i) * D + c] += p[j] * V[(bh * S + j) * D + c];
      // dP_j = dO·v_j; dS_j = P_j (dP_j - Σ_l P_l dP_l)
      std::vector<double> dp(S, 0);
      double avg = 0;
      for (int64_t j = 0; j < S; ++j) {
        for (int64_t c = 0; c < D; ++c) dp[j] += G[(bh * T + i) * D + c] * V[(bh * S + j) * D + c];
        avg += p[j] * dp[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        const double ds = p[j] * (dp[j] - avg) * scale;
        for (int64_t c = 0; c < D; ++c) {
          dQ[(bh * T + i) * D + c] += ds * K[(bh * S + j) * D + c];
          dK[(bh * S + j) * D + c] += ds * Q[(bh * T + i) * D + c];
          dV[(bh * S + j) * D + c] += p[j] * G[(bh * T + i) * D + c];
        }
      }
    }
  auto t = [](const std::vector<double>& x, const Shape& s) { return tensor(x, s); };
  return {t(O, q.shape()), t(dQ, q.shape()), t(dK, k.shape()), t(dV, k.shape())};
}

// The allowed mask (B, H, T, S) of a pattern with padding, by the pattern's rows and the keep mask.
Tensor allowed_mask(const SparsePattern& p, const Tensor& keep, int64_t B, int64_t H) {
  std::vector<bool> m(B * H * p.queries() * p.keys(), false);
  auto kv = keep.defined() ? keep.to_vector<bool>() : std::vector<bool>(B * p.keys(), true);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < p.queries(); ++i)
      for (int64_t j : p.row(p.groups() == 1 ? 0 : bh, i))
        if (kv[(bh / H) * p.keys() + j]) m[(bh * p.queries() + i) * p.keys() + j] = true;
  Tensor t = zeros({B, H, p.queries(), p.keys()}, {.dtype = kBool});
  bool* tp = t.data_ptr<bool>();
  for (size_t x = 0; x < m.size(); ++x) tp[x] = m[x];
  return t;
}

struct OpRun {
  Tensor o, dq, dk, dv;
};
OpRun run_sparse(const Tensor& q0, const Tensor& k0, const Tensor& v0, const SparsePattern& p, const Tensor& keep,
                 const Tensor& dout, DType dt = kFloat64, Device dev = Device::cpu()) {
  Tensor q = q0.to(dev).to(dt).detach(), k = k0.to(dev).to(dt).detach(), v = v0.to(dev).to(dt).detach();
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor o = sparse_attention(q, k, v, p, keep.defined() ? keep.to(dev) : keep);
  (o * dout.to(dev).to(dt)).sum().backward();
  auto back = [](const Tensor& t) { return t.to(kFloat64).to(Device::cpu()); };
  return {back(o), back(q.grad()), back(k.grad()), back(v.grad())};
}

}  // namespace

TEST_CASE("pattern builders allow exactly the pairs of their definitions") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const int64_t T = 19;
    for (int64_t w : {1, 4, 5, 40}) {
      CAPTURE(w);
      check_pattern(local_window_pattern(T, w, causal),
                    [&](int64_t i, int64_t j) { return causal ? (j <= i && j > i - w) : std::abs(i - j) <= w / 2; });
    }
    for (int64_t s : {1, 3, 7}) {
      CAPTURE(s);
      check_pattern(strided_pattern(T, s, causal),
                    [&](int64_t i, int64_t j) { return (i - j) % s == 0 && (!causal || j <= i); });
    }
    for (int64_t g : {0, 1, 3}) {
      CAPTURE(g);
      check_pattern(global_tokens_pattern(T, g, causal),
                    [&](int64_t i, int64_t j) { return (j < g || i < g) && (!causal || j <= i); });
    }
    for (int64_t b : {1, 4, 5, 19}) {
      CAPTURE(b);
      const int64_t nb = (T + b - 1) / b;
      SparsePattern h = hierarchical_pattern(T, b, causal);
      CHECK(h.keys() == T + nb);
      check_pattern(h, [&](int64_t i, int64_t j) {
        if (j < T) return j / b == i / b && (!causal || j <= i);
        const int64_t m = j - T;
        return m != i / b && (!causal || m < i / b);
      });
    }
    // Random: r distinct keys per row (all of them when fewer are allowed), inside the causal range, reproducible
    // from the seed, different for another seed.
    SparsePattern r1 = random_keys_pattern(T, 5, 11, causal), r2 = random_keys_pattern(T, 5, 11, causal),
                  r3 = random_keys_pattern(T, 5, 12, causal);
    bool differs = false;
    for (int64_t i = 0; i < T; ++i) {
      const auto row = r1.row(0, i);
      CHECK(static_cast<int64_t>(row.size()) == (causal ? std::min<int64_t>(5, i + 1) : 5));
      CHECK(std::set<int64_t>(row.begin(), row.end()).size() == row.size());
      for (int64_t j : row) CHECK((j >= 0 && j < T && (!causal || j <= i)));
      CHECK(row == r2.row(0, i));
      differs = differs || row != r3.row(0, i);
    }
    CHECK(differs);
  }
  // The transpose lists, for each key, the queries that see it and where.
  SparsePattern u = pattern_union({local_window_pattern(11, 3, false), strided_pattern(11, 4, false)});
  auto rp = u.row_ptr().to_vector<int64_t>(), cols = u.cols().to_vector<int64_t>(),
       cp = u.col_ptr().to_vector<int64_t>(), cr = u.col_rows().to_vector<int64_t>(),
       cpos = u.col_pos().to_vector<int64_t>();
  CHECK(cp.back() == u.nnz());
  for (int64_t j = 0; j < 11; ++j)
    for (int64_t y = cp[j]; y < cp[j + 1]; ++y) {
      CHECK(cols[cpos[y]] == j);
      CHECK((cpos[y] >= rp[cr[y]] && cpos[y] < rp[cr[y] + 1]));
    }
}

TEST_CASE("hierarchical_summaries: block means over real tokens (loops), a padding-only block is not kept; gradcheck") {
  const int64_t B = 2, H = 2, T = 11, d = 3, b = 4, nb = 3;  // the last block has 3 tokens
  Tensor x = randn64({B, H, T, d}, true, 5);
  Tensor keep = ones({B, T}, {.dtype = kBool});
  for (int64_t t = 4; t < 8; ++t) keep.data_ptr<bool>()[T + t] = false;  // batch 1: block 1 is all padding
  keep.data_ptr<bool>()[T + 9] = false;
  for (bool masked : {false, true}) {
    CAPTURE(masked);
    const BlockMeans s = hierarchical_summaries(x, b, masked ? keep : Tensor());
    const auto xv = x.to_vector<double>();
    const auto kv = keep.to_vector<bool>();
    std::vector<double> want(B * H * nb * d, 0);
    std::vector<bool> kept(B * nb, false);
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t m = 0; m < nb; ++m) {
        int64_t n = 0;
        for (int64_t t = m * b; t < std::min(T, m * b + b); ++t) n += !masked || kv[bb * T + t];
        kept[bb * nb + m] = n > 0;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = m * b; t < std::min(T, m * b + b); ++t)
            if (!masked || kv[bb * T + t])
              for (int64_t c = 0; c < d; ++c)
                want[((bb * H + h) * nb + m) * d + c] += xv[((bb * H + h) * T + t) * d + c] / n;
      }
    check_close(s.means, want, 1e-14, 1e-14);
    CHECK(s.kept.to_vector<bool>() == kept);
  }
  check_grad([&](const TensorList& in) { return TensorList{hierarchical_summaries(in[0], b, keep).means}; }, {x});
  check_error([&] { hierarchical_summaries(x, 0); }, {"hierarchical_summaries", "block size"});
  check_error(
      [&] {
        hierarchical_summaries(x, b, ones({B, T + 1}, {.dtype = kBool}));
      },
      {"hierarchical_summaries", "key_keep", "[2, 12]"});
  check_error([&] { hierarchical_summaries(randn64({B, T, d}), b); }, {"hierarchical_summaries", "(B, H, T, d)"});
}

TEST_CASE("hierarchical_keys: x then its block means in one pass, as the composition; its gradient; NaN stays put") {
  const int64_t B = 2, H = 3, T = 11, d = 5, b = 4;  // the last block has 3 tokens
  Tensor keep = ones({B, T}, {.dtype = kBool});
  for (int64_t t = 4; t < 8; ++t) keep.data_ptr<bool>()[T + t] = false;  // batch 1: block 1 is all padding
  keep.data_ptr<bool>()[T + 9] = false;
  // x a permuted view (as the layer's heads are), float64 and float32, with and without padding
  const Tensor x64 = randn64({B, T, H, d}, false, 6).permute({0, 2, 1, 3}).detach().set_requires_grad(true);
  for (bool masked : {false, true}) {
    CAPTURE(masked);
    const Tensor kp = masked ? keep : Tensor();
    const Tensor want = cat({x64, hierarchical_summaries(x64, b, kp).means}, 2);
    const Tensor got = hierarchical_keys(x64, b, kp);
    CHECK(got.shape() == Shape{B, H, T + 3, d});
    check_close(got, want, 1e-15, 1e-15);
    const Tensor x32 = x64.detach().to(kFloat32);
    check_close(hierarchical_keys(x32, b, kp), cat({x32, hierarchical_summaries(x32, b, kp).means}, 2), 1e-6, 1e-6);
    // the gradient: of a random cotangent, against the composition's
    const Tensor cot = randn64({B, H, T + 3, d}, false, 7);
    const Tensor g_got = autograd::grad({sum(hierarchical_keys(x64, b, kp) * cot)}, {x64}, {})[0];
    const Tensor g_want =
        autograd::grad({sum(cat({x64, hierarchical_summaries(x64, b, kp).means}, 2) * cot)}, {x64}, {})[0];
    check_close(g_got, g_want, 1e-15, 1e-15);
    check_grad([&](const TensorList& in) { return TensorList{hierarchical_keys(in[0], b, kp)}; }, {x64});
  }
  CHECK(hierarchical_keep(keep, b).to_vector<bool>() ==
        cat({keep, hierarchical_summaries(x64, b, keep).kept}, 1).to_vector<bool>());
  // b >= T: one block; b == 1: every token its own summary
  check_close(hierarchical_keys(x64, 100), cat({x64, mean(x64, {2}, true)}, 2), 1e-15, 1e-15);
  check_close(hierarchical_keys(x64, 1), cat({x64, x64}, 2), 0, 0);
  // A padding token's NaN reaches neither its block's mean nor, backwards, a real token's gradient; a real token's
  // NaN reaches its block's mean only.
  Tensor xn = randn64({B, H, T, d}, false, 8);
  xn.data_ptr<double>()[(1 * H + 0) * T * d + 9 * d] = std::nan("");  // batch 1, token 9: padding
  xn.data_ptr<double>()[0] = std::nan("");                            // batch 0, token 0: real, block 0
  const Tensor out = hierarchical_keys(xn, b, keep);
  const auto isn = isnan(out).to_vector<bool>();
  auto at = [&](int64_t bb, int64_t h, int64_t row, int64_t c) { return isn[((bb * H + h) * (T + 3) + row) * d + c]; };
  CHECK(at(0, 0, 0, 0));
  CHECK(at(0, 0, T + 0, 0));   // block 0's mean of batch 0, head 0
  CHECK(!at(0, 0, T + 1, 0));  // another block
  CHECK(!at(0, 1, T + 0, 0));  // another head
  CHECK(at(1, 0, 9, 0));       // the padding token is copied as it is
  CHECK(!at(1, 0, T + 2, 0));  // but not averaged
  Tensor xg = randn64({B, H, T, d}, true, 9);
  Tensor gcot = zeros({B, H, T + 3, d}, {.dtype = kFloat64});
  gcot.data_ptr<double>()[((1 * H + 0) * (T + 3) + T + 2) * d] =
      std::nan("");  // the mean's gradient of batch 1's block 2
  const auto gx = autograd::grad({sum(hierarchical_keys(xg, b, keep) * gcot)}, {xg}, {})[0].to_vector<double>();
  for (int64_t t = 8; t < T; ++t) CHECK(std::isnan(gx[((1 * H + 0) * T + t) * d]) == (t != 9));  // 9 is padding
  // errors: as hierarchical_summaries'
  check_error([&] { hierarchical_keys(x64, 0); }, {"hierarchical_keys", "block size b must be >= 1"});
  check_error(
      [&] {
        hierarchical_keys(x64, b, ones({B, T + 1}, {.dtype = kBool}));
      },
      {"hierarchical_keys", "key_keep", "[2, 12]"});
  check_error([&] { hierarchical_keys(randn64({B, T, d}), b); }, {"hierarchical_keys", "(B, H, T, d)"});
  check_error([&] { hierarchical_keep(keep, 0); }, {"hierarchical_keep", "block size b must be >= 1"});
  check_error([&] { hierarchical_keys(x64.to(kInt64), b); }, {"hierarchical_keys"});  // its own name on every path
  // the backward reads the mask as it was at the forward
  Tensor keep2 = keep.clone();
  Tensor xk = randn64({B, H, T, d}, true, 10);
  const Tensor yk = hierarchical_keys(xk, b, keep2);
  keep2.fill_(0.0);
  const Tensor cot2 = randn64({B, H, T + 3, d}, false, 11);
  check_close(autograd::grad({sum(yk * cot2)}, {xk}, {})[0],
              autograd::grad({sum(hierarchical_keys(xk, b, keep) * cot2)}, {xk}, {})[0], 0, 0);
}

TEST_CASE("pattern_union is the set union; a shared pattern joins every group of a per-head one") {
  const int64_t T = 23;
  SparsePattern u = pattern_union({local_window_pattern(T, 6, true), global_tokens_pattern(T, 2, true),
                                   random_keys_pattern(T, 3, 5, true), hierarchical_pattern(T, 5, true)});
  SparsePattern r = random_keys_pattern(T, 3, 5, true);
  CHECK(u.keys() == T + 5);
  check_pattern(u, [&](int64_t i, int64_t j) {
    const auto rr = r.row(0, i);
    const bool tok = j < T && j <= i;
    return (tok && j > i - 6) || (tok && (j < 2 || i < 2)) || std::count(rr.begin(), rr.end(), j) > 0 ||
           (j < T ? (j / 5 == i / 5 && j <= i) : (j - T) < i / 5);
  });
  // Per-head clustered groups plus a shared window.
  Generator gen(3);
  Tensor a = softmax(randn({2, 2, T, 4}, {.dtype = kFloat64}, &gen) * 3.0, -1);
  SparsePattern c = clustered_pattern(a, 0.5, false), cw = pattern_union({c, local_window_pattern(T, 2, false)});
  CHECK(cw.groups() == 4);
  for (int64_t g = 0; g < 4; ++g)
    check_pattern(
        cw,
        [&](int64_t i, int64_t j) {
          const auto cr = c.row(g, i);
          return std::abs(i - j) <= 1 || std::count(cr.begin(), cr.end(), j) > 0;
        },
        g);
  // The union writes its lists directly (a merge of sorted rows): every array, the transpose too, equals what
  // from_rows builds from the same rows.
  for (const SparsePattern* x : {&u, &cw}) {
    std::vector<std::vector<int64_t>> rows;
    for (int64_t g = 0; g < x->groups(); ++g)
      for (int64_t i = 0; i < T; ++i) rows.push_back(x->row(g, i));
    const SparsePattern ref = SparsePattern::from_rows(x->groups(), T, x->keys(), rows);
    CHECK(x->nnz() == ref.nnz());
    CHECK(x->max_row() == ref.max_row());
    for (auto part : {&SparsePattern::row_ptr, &SparsePattern::cols, &SparsePattern::col_ptr, &SparsePattern::col_rows,
                      &SparsePattern::col_pos})
      CHECK(same_bits((x->*part)(), (ref.*part)()));
  }
}

TEST_CASE("clustered_pattern: bucketing finds exactly the pairs with a_i · a_j > θ") {
  // T 37, c 5: soft assignments put rows in most buckets (the pass over every key), sharp ones in a few; T 300, c 24
  // with sharp assignments: rows of one bucket and, at θ 0.05 (bucket bound 0.025), of several, tested bucket by bucket
  // (four member rows at a time, the last block of a bucket shorter); T 700, c 6, sharp: buckets of more than 64
  // members (a row's bits over them span several words)
  const int64_t B = 2, H = 3;
  Generator gen(21);
  for (auto [T, c] : {std::pair<int64_t, int64_t>{37, 5}, {300, 24}, {700, 6}})
    for (double temp : {0.5, 3.0, 6.0})  // soft and sharp assignments
      for (double theta : {0.05, 0.3, 0.7})
        for (bool causal : {false, true}) {
          if (T == 700 && temp < 6) continue;
          CAPTURE(T);
          CAPTURE(temp);
          CAPTURE(theta);
          CAPTURE(causal);
          Tensor a = softmax(randn({B, H, T, c}, {.dtype = kFloat64}, &gen) * temp, -1);
          SparsePattern p = clustered_pattern(a, theta, causal);
          CHECK(p.groups() == B * H);
          auto av = a.to_vector<double>();
          for (int64_t g = 0; g < B * H; ++g)
            check_pattern(
                p,
                [&](int64_t i, int64_t j) {
                  double d = 0;
                  for (int64_t m = 0; m < c; ++m) d += av[(g * T + i) * c + m] * av[(g * T + j) * c + m];
                  return d > theta && (!causal || j <= i);
                },
                g);
        }
}

TEST_CASE("clustered_pattern: rows in several buckets of more than 64 members each") {
  // T 1500, c 24, sharp: buckets of about 90-135 members (bucket bound θ / 2 = 0.025); about half the rows sit in two
  // or more of them and still test only their members (at most T / 4 candidates): each row's bits span several words
  // per bucket, and a key in two of its buckets is taken once. The others are in one bucket, or test every key.
  const int64_t T = 1500, c = 24;
  Generator gen(23);
  const Tensor a = softmax(randn({1, 1, T, c}, {.dtype = kFloat64}, &gen) * 10.0, -1);
  const auto av = a.to_vector<double>();
  std::vector<int64_t> size(c);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t m = 0; m < c; ++m) size[m] += av[i * c + m] > 0.025;
  int64_t several = 0;  // rows in several buckets that test their members only
  for (int64_t i = 0; i < T; ++i) {
    int64_t buckets = 0, candidates = 0;
    for (int64_t m = 0; m < c; ++m)
      if (av[i * c + m] > 0.025) ++buckets, candidates += size[m];
    several += buckets > 1 && 4 * candidates <= T;
  }
  CHECK(*std::min_element(size.begin(), size.end()) > 64);
  CHECK(several > T / 4);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    check_pattern(
        clustered_pattern(a, 0.05, causal),
        [&](int64_t i, int64_t j) {
          double d = 0;
          for (int64_t m = 0; m < c; ++m) d += av[i * c + m] * av[j * c + m];
          return d > 0.05 && (!causal || j <= i);
        },
        0);
  }
}

TEST_CASE("pattern builders reject bad arguments with clear errors") {
  check_error([] { local_window_pattern(8, 0, false); }, {"local_window_pattern", "w must be >= 1", "0"});
  check_error([] { strided_pattern(8, 0, false); }, {"strided_pattern", "stride"});
  check_error([] { random_keys_pattern(8, 0, 1, false); }, {"random_keys_pattern", ">= 1", "0"});
  check_error([] { global_tokens_pattern(8, -1, false); }, {"global_tokens_pattern", ">= 0", "-1"});
  check_error([] { hierarchical_pattern(8, 0, false); }, {"hierarchical_pattern", "block size"});
  check_error([] { local_window_pattern(0, 3, false); }, {"local_window_pattern", "sequence length", "0"});
  check_error(
      [] {
        clustered_pattern(zeros({2, 3, 4}, {.dtype = kFloat64}), 0.5, false);
      },
      {"clustered_pattern", "(B, H, T, c)", "[2, 3, 4]"});
  Tensor nan_a = full({1, 1, 3, 2}, std::nan(""), {.dtype = kFloat64});
  check_error([&] { clustered_pattern(nan_a, 0.5, false); }, {"clustered_pattern", "non-finite"});
  check_error(
      [&] {
        clustered_pattern(zeros({0, 2, 4, 3}, {.dtype = kFloat64}), 0.5, false);
      },
      {"clustered_pattern", "B, H >= 1"});
  check_error(
      [] {
        pattern_union({local_window_pattern(8, 3, false), local_window_pattern(9, 3, false)});
      },
      {"pattern_union", "8", "9"});
  check_error([] { SparsePattern::from_rows(1, 2, 3, {{0, 5}, {1}}); }, {"SparsePattern", "5", "[0, 3)"});
}

namespace {

// The float64 kernel to 1e-12 and the float32 one to 1e-5 (relative 1e-4) against float64 loops over the dense mask
// of the pattern: the output and every gradient.
// The rows that see a non-finite input (sees(bh, i)) come out non-finite; every other row's o and dq as in the clean
// run. Returns how many rows were clean.
int64_t check_only_bad_rows(const OpRun& clean, const OpRun& bad, int64_t BH, int64_t T, int64_t D,
                            const std::function<bool(int64_t, int64_t)>& sees) {
  const auto o = bad.o.to_vector<double>(), o_ref = clean.o.to_vector<double>();
  const auto dq = bad.dq.to_vector<double>(), dq_ref = clean.dq.to_vector<double>();
  int64_t clean_rows = 0;
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      const bool bad_row = sees(bh, i);
      for (int64_t e = 0; e < D; ++e) {
        const size_t x = static_cast<size_t>((bh * T + i) * D + e);
        if (bad_row) {
          CHECK_FALSE(std::isfinite(o[x]));
        } else {
          CHECK(o[x] == doctest::Approx(o_ref[x]).epsilon(1e-5));
          CHECK(dq[x] == doctest::Approx(dq_ref[x]).epsilon(1e-5));
        }
      }
      clean_rows += !bad_row;
    }
  return clean_rows;
}

void check_against_loops(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& p, const Tensor& keep,
                         const Tensor& dout) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const Naive want = naive_attention(q, k, v, allowed_mask(p, keep, B, H), dout, 1 / std::sqrt(double(D)));
  const OpRun got = run_sparse(q, k, v, p, keep, dout);
  check_close(got.o, want.o, 1e-12, 1e-12);
  check_close(got.dq, want.dq, 1e-12, 1e-12);
  check_close(got.dk, want.dk, 1e-12, 1e-12);
  check_close(got.dv, want.dv, 1e-12, 1e-12);
  const OpRun f32 = run_sparse(q, k, v, p, keep, dout, kFloat32);
  check_close(f32.o, want.o, 1e-5, 1e-4);
  check_close(f32.dq, want.dq, 1e-5, 1e-4);
  check_close(f32.dk, want.dk, 1e-5, 1e-4);
  check_close(f32.dv, want.dv, 1e-5, 1e-4);
}

}  // namespace

TEST_CASE("sparse_attention equals float64 loops over the dense mask: forward and every gradient") {
  const int64_t B = 2, H = 2, T = 29, D = 8;
  struct Case {
    const char* name;
    SparsePattern p;
    bool padding;
  };
  Generator gen(5);
  Tensor a = softmax(randn({B, H, T, 3}, {.dtype = kFloat64}, &gen) * 2.0, -1);
  std::vector<Case> cases = {
      {"window", local_window_pattern(T, 6, false), false},
      {"causal window + global + random",
       pattern_union(
           {local_window_pattern(T, 4, true), global_tokens_pattern(T, 2, true), random_keys_pattern(T, 3, 9, true)}),
       true},
      {"strided", strided_pattern(T, 5, false), true},
      {"hierarchical", hierarchical_pattern(T, 6, false), false},
      {"causal hierarchical", hierarchical_pattern(T, 5, true), true},
      {"clustered (per head)", clustered_pattern(a, 0.4, false), true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const int64_t S = c.p.keys();
    Tensor q = randn64({B, H, T, D}, false, 1), k = randn64({B, H, S, D}, false, 2),
           v = randn64({B, H, S, D}, false, 3);
    Tensor dout = randn64({B, H, T, D}, false, 4);
    Tensor keep;
    if (c.padding) {  // batch 1: its last 7 tokens are padding (and, for summaries, their block stays kept)
      std::vector<bool> kv(B * S, true);
      for (int64_t j = T - 7; j < T; ++j) kv[S + j] = false;
      keep = zeros({B, S}, {.dtype = kBool});
      for (int64_t x = 0; x < B * S; ++x) keep.data_ptr<bool>()[x] = kv[x];
    }
    check_against_loops(q, k, v, c.p, keep, dout);
    // The composed reference gives the same output as the kernel.
    check_close(sparse_attention_reference(q, k, v, c.p, keep), sparse_attention(q, k, v, c.p, keep), 1e-12, 1e-12);
  }
}

TEST_CASE("sparse_attention CPU tiles: blocks of rows over the union of their keys, rare keys, padding, one head") {
  // T = 150: ten blocks of 16 rows, the last partial; D = 20: vector blocks and a tail (72: the rare keys' sums over
  // 64 float / 32 double columns in registers, and a tail). A window gives each block one run of keys, global tokens
  // a second; random keys are rare (pair by pair); padding plans each block by marks; B = H = 1 takes the two-pass
  // backward. Keys a few apart join one run over the gap, whose columns no row attends (a hierarchical block's
  // summaries skip its own; a window with holes), but never over padding. A head's dK and dV are zeroed as its blocks
  // reach them, and the keys no row attends at its end. Forward and every gradient against float64 loops over the
  // dense mask.
  const int64_t T = 150;
  struct Case {
    const char* name;
    SparsePattern p;
    bool padding;
    int64_t B, H, D;
    std::vector<int64_t> pad_keys = {};  // more padding keys of the last batch row (with padding)
  };
  // A window of ±12 keys around each row, keeping the keys j with kept(i, j), over `keys` columns
  auto window_where = [&](int64_t keys, auto kept) {
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = std::max<int64_t>(0, i - 12); j <= std::min<int64_t>(T - 1, i + 12); ++j)
        if (kept(i, j)) rows[static_cast<size_t>(i)].push_back(j);
    return SparsePattern::from_rows(1, T, keys, std::move(rows));
  };
  // without the multiples of 5 (each row keeps its own key)
  const SparsePattern holes = window_where(T, [](int64_t i, int64_t j) { return j % 5 != 0 || j == i; });
  // without the multiples of 7, over 2 T keys: no row sees those keys nor the second T (a chunk of keys the blocks
  // never reach), whose dk and dv must be 0
  const SparsePattern unseen = window_where(2 * T, [](int64_t, int64_t j) { return j % 7 != 0; });
  // i - 1, i, i + 1 and the last of 2 T keys: a block's union spans far more keys than its rows hold, so with padding
  // the early blocks gather their keys and sort them (the later ones, with a shorter span, read them off marks)
  std::vector<std::vector<int64_t>> far_rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = std::max<int64_t>(0, i - 1); j <= i + 1; ++j) far_rows[static_cast<size_t>(i)].push_back(j);
    far_rows[static_cast<size_t>(i)].push_back(2 * T - 1);
  }
  const SparsePattern far = SparsePattern::from_rows(1, T, 2 * T, std::move(far_rows));
  const SparsePattern scattered = scattered_rare_keys_pattern(T);  // 0 to 20 rare keys a row
  for (int64_t D : {20, 64}) CHECK(cpu::sparse_attention_plan_summary(scattered.view(), D).row_path_rows == 0);
  const std::vector<Case> cases = {
      {"window", local_window_pattern(T, 24, false), false, 1, 2, 20},
      {"three keys and a far one, padding", far, true, 2, 2, 20, {T + 10, 60}},
      {"three keys and a far one", far, false, 2, 1, 20},
      {"window + global + random",
       pattern_union({local_window_pattern(T, 20, false), global_tokens_pattern(T, 9, false),
                      random_keys_pattern(T, 6, 3, false)}),
       false, 2, 1, 20},
      {"window + global + random, D = 72",
       pattern_union({local_window_pattern(T, 20, false), global_tokens_pattern(T, 9, false),
                      random_keys_pattern(T, 6, 5, false)}),
       false, 2, 2, 72},
      {"causal window + global + random, padding",
       pattern_union(
           {local_window_pattern(T, 20, true), global_tokens_pattern(T, 9, true), random_keys_pattern(T, 6, 4, true)}),
       true, 2, 2, 20},
      {"hierarchical", hierarchical_pattern(T, 12, false), false, 1, 3, 20},
      {"hierarchical, padding (a summary column too)", hierarchical_pattern(T, 12, false), true, 2, 2, 20, {T + 5}},
      {"window with holes", holes, false, 2, 1, 20},
      {"window with holes, padding", holes, true, 2, 2, 20, {40, 41, 77}},
      {"window, keys no row attends", unseen, false, 2, 2, 20},
      {"window, one head", local_window_pattern(T, 24, false), false, 1, 1, 20},
      {"window and 0 to 20 rare keys a row", scattered, false, 2, 2, 20},
      {"window and 0 to 20 rare keys a row, D = 64", scattered, false, 2, 1, 64},
      // Every 8th key: a block's tile would be 1/8 full, so rows go one by one — 19 keys each, the dot products 16
      // float (8 double) keys at a time at x86-64-v4, and the weighted sums in registers.
      {"strided (row by row), D = 72", strided_pattern(T, 8, false), false, 2, 2, 72},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const int64_t S = c.p.keys(), B = c.B, H = c.H, D = c.D;
    Tensor q = randn64({B, H, T, D}, false, 11), k = randn64({B, H, S, D}, false, 12),
           v = randn64({B, H, S, D}, false, 13), dout = randn64({B, H, T, D}, false, 14);
    Tensor keep;
    if (c.padding) {  // the last batch's last 23 tokens are padding
      keep = ones({B, S}, {.dtype = kBool});
      for (int64_t j = T - 23; j < T; ++j) keep.data_ptr<bool>()[(B - 1) * S + j] = false;
      for (int64_t j : c.pad_keys) keep.data_ptr<bool>()[(B - 1) * S + j] = false;
    }
    check_against_loops(q, k, v, c.p, keep, dout);
  }
}

TEST_CASE(
    "sparse_attention CPU tiles: the plans a pattern keeps serve every later call, copy, head layout and padding") {
  // The CPU kernels keep a call's plans in the pattern: without padding made once, with padding the last table and
  // the key_keep it was made for. One pattern object through calls that must each see the right plans: padding A
  // (planned and kept), no padding (planned once) for two head layouts, new inputs, a copy of the pattern, padding B
  // (a different mask: planned again), padding A again, A with other head counts (the same mask bytes, another
  // layout); a per-head pattern (groups = B · H) with and without padding. Each call's forward and backward (which
  // reads the forward's plans) against float64 loops over the dense mask.
  const int64_t T = 150, D = 20, B = 2, H = 2;
  const SparsePattern shared = pattern_union(
      {local_window_pattern(T, 20, false), global_tokens_pattern(T, 9, false), random_keys_pattern(T, 6, 7, false)});
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B * H * T));  // a different window per group
  for (int64_t g = 0; g < B * H; ++g)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = std::max<int64_t>(0, i - 10 - 4 * g); j <= std::min<int64_t>(T - 1, i + 10 + 4 * g); ++j)
        rows[static_cast<size_t>(g * T + i)].push_back(j);
  const SparsePattern per_head = SparsePattern::from_rows(B * H, T, T, rows);
  auto padding = [&](int64_t b_count, int64_t from) {  // batch b's tokens from + 7 b on are padding
    Tensor keep = ones({b_count, T}, {.dtype = kBool});
    for (int64_t b = 0; b < b_count; ++b)
      for (int64_t j = from + 7 * b; j < T; ++j) keep.data_ptr<bool>()[b * T + j] = false;
    return keep;
  };
  struct Call {
    const char* name;
    const SparsePattern* p;
    int64_t B, H;
    int64_t pad_from;  // -1: no padding
  };
  const SparsePattern copy = shared;
  const std::vector<Call> calls = {
      {"shared, padding A", &shared, B, H, 120},
      {"shared, no padding", &shared, B, H, -1},
      {"shared, one head", &shared, 1, 1, -1},
      {"shared, other heads", &shared, 1, 3, -1},
      {"copy of shared", &copy, B, H, -1},
      {"shared, padding B", &shared, B, H, 90},
      {"shared, padding A again", &shared, B, H, 120},
      {"copy, padding A, three heads", &copy, B, 3, 120},
      {"shared, padding A's first row, four heads", &shared, 1, 4, 120},
      {"per head, no padding", &per_head, B, H, -1},
      {"per head, padding A", &per_head, B, H, 120},
      {"per head, padding B", &per_head, B, H, 90},
      {"per head, again", &per_head, B, H, -1},
  };
  uint64_t seed = 20;
  for (const Call& c : calls) {
    INFO(c.name);
    ++seed;
    Tensor q = randn64({c.B, c.H, T, D}, false, seed), k = randn64({c.B, c.H, T, D}, false, seed + 100),
           v = randn64({c.B, c.H, T, D}, false, seed + 200), dout = randn64({c.B, c.H, T, D}, false, seed + 300);
    check_against_loops(q, k, v, *c.p, c.pad_from < 0 ? Tensor() : padding(c.B, c.pad_from), dout);
  }
}

TEST_CASE("sparse_attention CPU tiles: a NaN key and an infinite value just past a block's run stay out of it") {
  // Window 24 over T = 150 (as above): rows 0-15 attend keys 0-38, and the score product's tail tile reads keys
  // 32-47 into the tile's room (ops/cpu/small_gemm.h); key 45 is NaN, value 46 +inf. A row that attends neither must
  // come out as with finite ones there (its dq too); a row that attends one is non-finite.
  const int64_t T = 150, D = 20, B = 1, H = 2;
  const SparsePattern p = local_window_pattern(T, 24, false);
  Tensor q = randn64({B, H, T, D}, false, 11), k = randn64({B, H, T, D}, false, 12),
         v = randn64({B, H, T, D}, false, 13), dout = randn64({B, H, T, D}, false, 14);
  Tensor kp = k.clone(), vp = v.clone();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t e = 0; e < D; ++e) {
      kp.data_ptr<double>()[(bh * T + 45) * D + e] = std::nan("");
      vp.data_ptr<double>()[(bh * T + 46) * D + e] = INFINITY;
    }
  const std::vector<bool> allowed = allowed_mask(p, Tensor(), B, H).to_vector<bool>();
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dt);
    const OpRun clean = run_sparse(q, k, v, p, Tensor(), dout, dt), bad = run_sparse(q, kp, vp, p, Tensor(), dout, dt);
    const int64_t clean_rows = check_only_bad_rows(clean, bad, B * H, T, D, [&](int64_t bh, int64_t i) {
      const int64_t row = bh * T + i;
      return allowed[row * T + 45] || allowed[row * T + 46];
    });
    CHECK(clean_rows > 16 * B * H);  // the first block's rows at least
  }
}

namespace {

// Row i attends the keys of its class i % m (every m-th key) and the keys of extra(i): 16 consecutive rows share an
// m-th of their union, as a clustered pattern's neighbouring tokens (which fall in different clusters) do.
SparsePattern classes_pattern(int64_t T, int64_t m, const std::function<std::vector<int64_t>(int64_t)>& extra = {}) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = i % m; j < T; j += m) rows[static_cast<size_t>(i)].push_back(j);
    if (extra)
      for (const int64_t j : extra(i)) rows[static_cast<size_t>(i)].push_back(j);
  }
  return SparsePattern::from_rows(1, T, T, std::move(rows));
}

}  // namespace

TEST_CASE("sparse_attention CPU row groups: a class's rows, not neighbours, on one gathered tile") {
  // Classes of 5 over T = 150: a block's tile would be a fifth full. At D = 20 that pays (a tile pays off from
  // D / (D + 128) full) and the blocks are tiled; at D = 72 it does not, and the rows are regrouped by their first
  // key — a class's 30 rows in groups of 16 and 14 over a gathered tile of its 30 keys (plan_summary says which).
  // Variants: three rows of their own two keys (too few for a group: the row path), an extra key per row (the sets
  // differ a little), padding (in the classes' keys too), per-head classes, one head (the two-pass backward).
  // Forward and every gradient against float64 loops over the dense mask.
  const int64_t T = 150;
  // two pattern objects: a pattern keeps the plans of its first call, whatever the head width of later ones
  const SparsePattern five20 = classes_pattern(T, 5), five = classes_pattern(T, 5);
  {
    const auto at20 = cpu::sparse_attention_plan_summary(five20.view(), 20);
    CHECK(at20.tiled_blocks == 10);
    CHECK(at20.row_groups == 0);
    const auto at72 = cpu::sparse_attention_plan_summary(five.view(), 72);
    CHECK(at72.tiled_blocks == 0);
    CHECK(at72.row_groups == 10);
    CHECK(at72.grouped_rows == T);
    CHECK(at72.row_path_rows == 0);
  }
  auto odd3 = [](int64_t i) { return i == 7 || i == 50 || i == 99; };
  std::vector<std::vector<int64_t>> odd_rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    if (odd3(i)) {
      odd_rows[static_cast<size_t>(i)] = {148, 149};
    } else {
      for (int64_t j = i % 5; j < T; j += 5) odd_rows[static_cast<size_t>(i)].push_back(j);
    }
  }
  const SparsePattern odd = SparsePattern::from_rows(1, T, T, std::move(odd_rows));
  {
    const auto s = cpu::sparse_attention_plan_summary(odd.view(), 72);
    CHECK(s.row_groups == 10);
    CHECK(s.grouped_rows == T - 3);
    CHECK(s.row_path_rows == 3);
  }
  const SparsePattern extra = classes_pattern(T, 5, [](int64_t i) { return std::vector<int64_t>{(7 * i + 3) % 150}; });
  CHECK(cpu::sparse_attention_plan_summary(extra.view(), 72).grouped_rows > 100);
  const int64_t B = 2, H = 2;
  std::vector<std::vector<int64_t>> head_rows(static_cast<size_t>(B * H * T));  // classes of 4 + g in group g
  for (int64_t g = 0; g < B * H; ++g)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i % (4 + g); j < T; j += 4 + g) head_rows[static_cast<size_t>(g * T + i)].push_back(j);
  const SparsePattern per_head = SparsePattern::from_rows(B * H, T, T, std::move(head_rows));
  CHECK(cpu::sparse_attention_plan_summary(per_head.view(), 72).grouped_rows == B * H * T);
  struct Case {
    const char* name;
    const SparsePattern* p;
    bool padding;
    int64_t B, H, D;
  };
  const std::vector<Case> cases = {
      {"classes of 5, tiled blocks", &five20, false, B, H, 20},
      {"classes of 5, row groups", &five, false, B, H, 72},
      {"classes of 5, row groups, padding", &five, true, B, H, 72},
      {"three rows of their own", &odd, false, B, H, 72},
      {"an extra key per row", &extra, false, B, H, 72},
      {"an extra key per row, padding", &extra, true, B, H, 72},
      {"per-head classes", &per_head, false, B, H, 72},
      {"per-head classes, padding", &per_head, true, B, H, 72},
      {"classes of 5, one head", &five, false, 1, 1, 72},
  };
  {
    // 33 blocks: the planner samples 8 of a group's blocks first, and plans none of them where none of those is
    // tiled (classes of 5); a window's blocks are all tiled
    const int64_t T2 = 520;
    const SparsePattern many = classes_pattern(T2, 5);
    const auto s = cpu::sparse_attention_plan_summary(many.view(), 72);
    CHECK(s.tiled_blocks == 0);
    CHECK(s.grouped_rows == T2);
    CHECK(cpu::sparse_attention_plan_summary(local_window_pattern(T2, 24, false).view(), 72).tiled_blocks == 33);
    check_against_loops(randn64({1, 2, T2, 72}, false, 41), randn64({1, 2, T2, 72}, false, 42),
                        randn64({1, 2, T2, 72}, false, 43), many, Tensor(), randn64({1, 2, T2, 72}, false, 44));
  }
  for (const Case& c : cases) {
    INFO(c.name);
    Tensor q = randn64({c.B, c.H, T, c.D}, false, 31), k = randn64({c.B, c.H, T, c.D}, false, 32),
           v = randn64({c.B, c.H, T, c.D}, false, 33), dout = randn64({c.B, c.H, T, c.D}, false, 34);
    Tensor keep;
    if (c.padding) {  // the last batch row's last 23 tokens and two of class 0's keys are padding
      keep = ones({c.B, T}, {.dtype = kBool});
      for (int64_t j = T - 23; j < T; ++j) keep.data_ptr<bool>()[(c.B - 1) * T + j] = false;
      for (int64_t j : {10, 40}) keep.data_ptr<bool>()[(c.B - 1) * T + j] = false;
    }
    check_against_loops(q, k, v, *c.p, keep, dout);
  }
}

TEST_CASE("sparse_attention CPU row groups: a NaN key, an infinite value or a NaN query reach only their rows") {
  // Classes of 5 at D = 72 (row groups, as above). Key 10 (class 0) is NaN, value 21 (class 1) +inf, query row 12
  // (class 2) NaN: the rows that attend one of them come out non-finite; every other row as with finite inputs, its
  // dq too (a gathered tile holding a non-finite key, or a group with a non-finite query, goes row by row).
  const int64_t T = 150, D = 72, B = 1, H = 2;
  const SparsePattern p = classes_pattern(T, 5);
  Tensor q = randn64({B, H, T, D}, false, 11), k = randn64({B, H, T, D}, false, 12),
         v = randn64({B, H, T, D}, false, 13), dout = randn64({B, H, T, D}, false, 14);
  Tensor qp = q.clone(), kp = k.clone(), vp = v.clone();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t e = 0; e < D; ++e) {
      kp.data_ptr<double>()[(bh * T + 10) * D + e] = std::nan("");
      vp.data_ptr<double>()[(bh * T + 21) * D + e] = INFINITY;
      qp.data_ptr<double>()[(bh * T + 12) * D + e] = std::nan("");
    }
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dt);
    const OpRun clean = run_sparse(q, k, v, p, Tensor(), dout, dt), bad = run_sparse(qp, kp, vp, p, Tensor(), dout, dt);
    const int64_t clean_rows = check_only_bad_rows(
        clean, bad, B * H, T, D, [](int64_t, int64_t i) { return i % 5 == 0 || i % 5 == 1 || i == 12; });
    CHECK(clean_rows == 2 * (T * 3 / 5 - 1));
  }
}

TEST_CASE("sparse_attention: rows with no kept key give zeros and no gradient, never NaN") {
  const int64_t T = 6, D = 4;
  // Row 0 sees only key 0, which is padding; rows 1.. see keys 1..i.
  std::vector<std::vector<int64_t>> rows(T);
  rows[0] = {0};
  for (int64_t i = 1; i < T; ++i)
    for (int64_t j = 1; j <= i; ++j) rows[i].push_back(j);
  rows[3].clear();  // and row 3 sees nothing at all
  SparsePattern p = SparsePattern::from_rows(1, T, T, rows);
  Tensor keep = ones({1, T}, {.dtype = kBool});
  keep.data_ptr<bool>()[0] = false;
  Tensor q = randn64({1, 1, T, D}), k = randn64({1, 1, T, D}, false, 8), v = randn64({1, 1, T, D}, false, 9);
  OpRun r = run_sparse(q, k, v, p, keep, ones({1, 1, T, D}, {.dtype = kFloat64}));
  auto o = r.o.to_vector<double>(), dq = r.dq.to_vector<double>();
  for (double x : o) CHECK(std::isfinite(x));
  for (int64_t c = 0; c < D; ++c) {
    CHECK(o[c] == 0.0);
    CHECK(o[3 * D + c] == 0.0);
    CHECK(dq[c] == 0.0);
    CHECK(dq[3 * D + c] == 0.0);
  }
  for (double x : r.dk.to_vector<double>()) CHECK(std::isfinite(x));
}

TEST_CASE("sparse_attention gradcheck (float64 finite differences) in q, k and v") {
  const int64_t T = 13, D = 5;
  SparsePattern p = pattern_union(
      {local_window_pattern(T, 4, true), hierarchical_pattern(T, 4, true), random_keys_pattern(T, 2, 3, true)});
  Tensor q = randn64({1, 2, T, D}, true, 1), k = randn64({1, 2, p.keys(), D}, true, 2),
         v = randn64({1, 2, p.keys(), D}, true, 3);
  Tensor keep = ones({1, p.keys()}, {.dtype = kBool});
  keep.data_ptr<bool>()[2] = false;
  check_grad([&](const TensorList& x) { return TensorList{sparse_attention(x[0], x[1], x[2], p, keep)}; }, {q, k, v});
}

TEST_CASE("sparse_attention rejects bad inputs with clear errors") {
  SparsePattern p = local_window_pattern(8, 3, false);
  Tensor q = randn64({1, 2, 8, 4}), k = randn64({1, 2, 8, 4});
  check_error([&] { sparse_attention(q, k, randn64({1, 2, 7, 4}), p); }, {"sparse_attention", "[1, 2, 7, 4]"});
  check_error(
      [&] {
        sparse_attention(randn64({1, 2, 9, 4}), randn64({1, 2, 9, 4}), randn64({1, 2, 9, 4}), p);
      },
      {"sparse_attention", "8 queries", "T = 9"});
  check_error(
      [&] {
        sparse_attention(q, k, k, p, ones({1, 7}, {.dtype = kBool}));
      },
      {"sparse_attention", "key_keep", "[1, 7]"});
  check_error([&] { sparse_attention(q, k, k, p, ones({1, 8})); }, {"sparse_attention", "key_keep"});
  check_error([&] { sparse_attention(q, k.to(kFloat32), k, p); }, {"sparse_attention", "dtype"});
  check_error([&] { sparse_attention(q, k, k, SparsePattern{}); }, {"sparse_attention", "pattern is empty"});
  Tensor a = softmax(randn64({3, 2, 8, 2}), -1);
  check_error([&] { sparse_attention(q, k, k, clustered_pattern(a, 0.5, false)); },
              {"sparse_attention", "6 groups", "B·H = 2"});
}

TEST_CASE("sparse_attention CUDA kernels equal the CPU kernel (float64, float32, bfloat16, float16)") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t B = 2, H = 2, T = 45, D = 40;  // D not a multiple of 32: partial lanes
  Generator gen(8);
  Tensor a = softmax(randn({B, H, T, 3}, {.dtype = kFloat64}, &gen) * 2.0, -1);
  for (const SparsePattern& p : {pattern_union({local_window_pattern(T, 8, true), global_tokens_pattern(T, 2, true),
                                                hierarchical_pattern(T, 7, true)}),
                                 pattern_union({clustered_pattern(a, 0.4, false), strided_pattern(T, 4, false)})}) {
    const int64_t S = p.keys();
    Tensor q = randn64({B, H, T, D}, false, 1), k = randn64({B, H, S, D}, false, 2),
           v = randn64({B, H, S, D}, false, 3);
    Tensor dout = randn64({B, H, T, D}, false, 4);
    Tensor keep = ones({B, S}, {.dtype = kBool});
    for (int64_t j = T - 5; j < T; ++j) keep.data_ptr<bool>()[S + j] = false;
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(dtype_name(dt));
      OpRun c = run_sparse(q, k, v, p, keep, dout, dt), g = run_sparse(q, k, v, p, keep, dout, dt, gpu);
      const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
      check_close(g.o, c.o, tol, tol);
      check_close(g.dq, c.dq, tol, tol);
      check_close(g.dk, c.dk, tol, tol);
      check_close(g.dv, c.dv, tol, tol);
    }
    // bfloat16 / float16 on the device against float32 on the CPU on the same rounded values: head dim 40 on tensor
    // cores (cuda/sparse_mma.cu), 96 on the CUDA-core kernel.
    for (int64_t Dh : {D, int64_t{96}})
      for (DType half : {kBFloat16, kFloat16}) {
        CAPTURE(Dh);
        CAPTURE(dtype_name(half));
        auto rounded = [&](const Tensor& t, uint64_t seed) {
          const Tensor x = Dh == D ? t : randn64({B, H, t.size(2), Dh}, false, seed);
          return x.to(gpu).to(half).to(kFloat64).to(Device::cpu());
        };
        Tensor qr = rounded(q, 5), kr = rounded(k, 6), vr = rounded(v, 7), gr = rounded(dout, 8);
        OpRun c = run_sparse(qr, kr, vr, p, keep, gr, kFloat32), g = run_sparse(qr, kr, vr, p, keep, gr, half, gpu);
        const double tol = half == kBFloat16 ? 1.0 : 0.125;  // the output's rounding: 2^-8 against 2^-11
        check_close(g.o, c.o, 2e-2 * tol, 2e-2 * tol);
        check_close(g.dq, c.dq, 5e-2 * tol, 3e-2 * tol);
        check_close(g.dk, c.dk, 5e-2 * tol, 3e-2 * tol);
        check_close(g.dv, c.dv, 5e-2 * tol, 3e-2 * tol);
      }
  }
}

// The tensor-core kernels (cuda/sparse_mma.cu) take bfloat16, float16 and float32 when TF32 is allowed, head dims
// up to 64: each against the CPU kernel in float64 on the same (rounded) values, for a pattern per kind of union —
// window + global + random (one list for every head), clustered + strided per head (unions over several tiles),
// hierarchical (summary columns past T) — with padding. T = 70: five row blocks, so the last thread block has a warp
// without one.
TEST_CASE("sparse_attention on tensor cores: bfloat16, float16, TF32 against float64, every kind of pattern") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t B = 2, H = 2, T = 70;
  Generator gen(21);
  Tensor a = softmax(randn({B, H, T, 3}, {.dtype = kFloat64}, &gen) * 2.0, -1);
  const std::vector<SparsePattern> patterns = {
      pattern_union(
          {local_window_pattern(T, 16, true), global_tokens_pattern(T, 2, true), random_keys_pattern(T, 3, 5, true)}),
      pattern_union({clustered_pattern(a, 0.4, false), strided_pattern(T, 3, false)}),
      hierarchical_pattern(T, 8, false)};
  for (size_t pi = 0; pi < patterns.size(); ++pi) {
    const SparsePattern& p = patterns[pi];
    const int64_t S = p.keys();
    Tensor keep = ones({B, S}, {.dtype = kBool});
    for (int64_t j = T - 6; j < T; ++j) keep.data_ptr<bool>()[S + j] = false;
    for (int64_t D : {16, 40, 64}) {
      const uint64_t seed = 40 + 4 * D + 100 * pi;
      Tensor q = randn64({B, H, T, D}, false, seed), k = randn64({B, H, S, D}, false, seed + 1),
             v = randn64({B, H, S, D}, false, seed + 2), dout = randn64({B, H, T, D}, false, seed + 3);
      for (DType dt : {kBFloat16, kFloat16, kFloat32}) {
        CAPTURE(pi);
        CAPTURE(D);
        CAPTURE(dtype_name(dt));
        const Tf32Scope tf32(dt == kFloat32);
        auto rounded = [&](const Tensor& t) { return t.to(dt).to(kFloat64); };  // float32: TF32 rounds in-kernel
        Tensor qr = rounded(q), kr = rounded(k), vr = rounded(v), gr = rounded(dout);
        OpRun c = run_sparse(qr, kr, vr, p, keep, gr, kFloat64), g = run_sparse(qr, kr, vr, p, keep, gr, dt, gpu);
        // P (and dS) enter the second product rounded to the operand kind: 2^-8 bfloat16, 2^-11 float16 and TF32
        // (whose inputs are also rounded in the kernel).
        const double tol = dt == kBFloat16 ? 1.0 : dt == kFloat16 ? 0.125 : 0.25;
        check_close(g.o, c.o, 2e-2 * tol, 2e-2 * tol);
        check_close(g.dq, c.dq, 5e-2 * tol, 3e-2 * tol);
        check_close(g.dk, c.dk, 5e-2 * tol, 3e-2 * tol);
        check_close(g.dv, c.dv, 5e-2 * tol, 3e-2 * tol);
      }
    }
  }
  // float32 takes the tensor cores only where TF32 is allowed: otherwise the CUDA-core kernel, exact to float32.
  const SparsePattern& p = patterns[0];
  Tensor q = randn64({1, 1, T, 32}, false, 90), k = randn64({1, 1, T, 32}, false, 91),
         v = randn64({1, 1, T, 32}, false, 92);
  Tensor o64 = sparse_attention(q, k, v, p);
  auto run32 = [&](bool allow) {
    const Tf32Scope tf32(allow);
    return sparse_attention(q.to(gpu).to(kFloat32), k.to(gpu).to(kFloat32), v.to(gpu).to(kFloat32), p)
        .to(Device::cpu())
        .to(kFloat64);
  };
  const double err32 = amax((run32(false) - o64).abs()).item<double>(),
               err_tf32 = amax((run32(true) - o64).abs()).item<double>();
  CHECK(err32 < 1e-5);
  CHECK(err_tf32 > 1e-5);  // TF32 keeps 10 fraction bits: the tensor cores ran
  CHECK(err_tf32 < 1e-2);
}

// A masked pair has P = 0, but a tensor core still adds 0 · x for it: a tile whose gathered values hold a NaN or an
// infinity takes that product on CUDA cores over the attended pairs only, so the NaN reaches exactly the rows that
// attend it — the CPU kernel's semantics, compared here NaN for NaN (check_close equates NaN with NaN only).
TEST_CASE("sparse_attention on tensor cores: a NaN or infinite key, value, query or gradient reaches only its rows") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t B = 2, H = 1, T = 64, D = 16;
  // A causal window of 4: key j is attended by rows j .. j + 3 only, so rows of the same 16-row block (and tile) do
  // not attend it. Batch 1 pads its last 5 keys.
  const SparsePattern p = pattern_union({local_window_pattern(T, 4, true), global_tokens_pattern(T, 1, true)});
  Tensor keep = ones({B, T}, {.dtype = kBool});
  for (int64_t j = T - 5; j < T; ++j) keep.data_ptr<bool>()[T + j] = false;
  struct Poison {
    const char* what;
    int which;  // 0 q, 1 k, 2 v, 3 dO
    int64_t b, t, c;
    double value;
  };
  for (const Poison& x :
       {Poison{"NaN value", 2, 0, 20, 3, NAN}, Poison{"infinite key", 1, 0, 37, 0, INFINITY},
        Poison{"NaN query", 0, 0, 41, 5, NAN}, Poison{"NaN gradient", 3, 0, 50, 1, NAN},
        Poison{"NaN value of a padding key", 2, 1, T - 2, 2, NAN}, Poison{"infinite value", 2, 1, 9, 7, -INFINITY}}) {
    const std::string what = x.what;
    CAPTURE(what);
    Tensor t[4] = {randn64({B, H, T, D}, false, 61), randn64({B, H, T, D}, false, 62), randn64({B, H, T, D}, false, 63),
                   randn64({B, H, T, D}, false, 64)};
    for (Tensor& u : t) u = u.to(kBFloat16).to(kFloat64);
    t[x.which].data_ptr<double>()[((x.b * H) * T + x.t) * D + x.c] = x.value;
    for (DType dt : {kBFloat16, kFloat32}) {
      CAPTURE(dtype_name(dt));
      const Tf32Scope tf32(dt == kFloat32);
      OpRun c = run_sparse(t[0], t[1], t[2], p, keep, t[3], kFloat64),
            g = run_sparse(t[0], t[1], t[2], p, keep, t[3], dt, gpu);
      const double tol = dt == kBFloat16 ? 1.0 : 0.25;
      check_close(g.o, c.o, 2e-2 * tol, 2e-2 * tol);
      check_close(g.dq, c.dq, 5e-2 * tol, 3e-2 * tol);
      check_close(g.dk, c.dk, 5e-2 * tol, 3e-2 * tol);
      check_close(g.dv, c.dv, 5e-2 * tol, 3e-2 * tol);
      // The poison stays local: most of the output is finite.
      const std::vector<double> ov = g.o.to_vector<double>();
      CHECK(std::count_if(ov.begin(), ov.end(), [](double x) { return !std::isfinite(x); }) < B * T * D / 8);
    }
  }
}

namespace {

// The (G, T, S) mask rebuilt from each side of d's block view equals `mask`; unions ascend, no entry without bits.
void check_view_holds(const SparsePattern& d, const std::vector<bool>& mask) {
  REQUIRE(d.has_block_view());
  auto vec = [](const Tensor& t) { return t.to(Device::cpu()).to_vector<int64_t>(); };
  const auto rp = vec(d.rblk_ptr()), rk = vec(d.rblk_keys()), rb = vec(d.rblk_bits());
  const auto kp = vec(d.kblk_ptr()), kr = vec(d.kblk_rows()), kb = vec(d.kblk_bits());
  const int64_t G = d.groups(), T = d.queries(), S = d.keys(), nr = (T + 15) / 16, nk = (S + 15) / 16;
  REQUIRE(rp.size() == size_t(G * nr + 1));
  REQUIRE(kp.size() == size_t(G * nk + 1));
  REQUIRE(mask.size() == size_t(G * T * S));
  std::vector<bool> from_rows(mask.size(), false), from_keys(mask.size(), false);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t m = 0; m < nr; ++m)
      for (int64_t e = rp[g * nr + m]; e < rp[g * nr + m + 1]; ++e) {
        CHECK(rb[e] != 0);
        if (e > rp[g * nr + m]) CHECK(rk[e] > rk[e - 1]);
        for (int64_t r = 0; r < 16; ++r)
          if (rb[e] >> r & 1) from_rows[(g * T + m * 16 + r) * S + rk[e]] = true;
      }
    for (int64_t m = 0; m < nk; ++m)
      for (int64_t e = kp[g * nk + m]; e < kp[g * nk + m + 1]; ++e) {
        CHECK(kb[e] != 0);
        if (e > kp[g * nk + m]) CHECK(kr[e] > kr[e - 1]);
        for (int64_t c = 0; c < 16; ++c)
          if (kb[e] >> c & 1) from_keys[(g * T + kr[e]) * S + m * 16 + c] = true;
      }
  }
  CHECK(from_rows == mask);
  CHECK(from_keys == mask);
}

}  // namespace

TEST_CASE("the block view of a pattern on a CUDA device holds exactly the pattern's pairs") {
  if (!gpu_or_skip()) return;
  Generator gen(9);
  Tensor a = softmax(randn({2, 1, 37, 3}, {.dtype = kFloat64}, &gen) * 2.0, -1);
  for (const SparsePattern& p : {pattern_union({local_window_pattern(37, 5, true), strided_pattern(37, 3, true)}),
                                 hierarchical_pattern(37, 6, false), clustered_pattern(a, 0.4, true)}) {
    const SparsePattern d = p.to(Device::cuda());
    CHECK_FALSE(p.has_block_view());  // the CPU pattern is untouched
    check_view_holds(d, p.dense_mask().to_vector<bool>());
    // Back on the CPU: the same lists.
    CHECK(d.to(Device::cpu()).row(p.groups() - 1, p.queries() - 1) == p.row(p.groups() - 1, p.queries() - 1));
    // Moved again (as sparse_attention does at every call with a CPU pattern): the kept copy, not a new one — and a
    // copy of the pattern shares it.
    const SparsePattern again = p.to(Device::cuda()), via_copy = SparsePattern(p).to(Device::cuda());
    CHECK(again.block_view().rblk_ptr == d.block_view().rblk_ptr);
    CHECK(via_copy.block_view().kblk_bits == d.block_view().kblk_bits);
  }
  // A pattern built afresh gets a copy of its own.
  const SparsePattern w1 = local_window_pattern(37, 5, true), w2 = local_window_pattern(37, 5, true);
  CHECK(w1.to(Device::cuda()).block_view().rblk_ptr != w2.to(Device::cuda()).block_view().rblk_ptr);
}

namespace {

// clustered_union's budget for a view it does not size by a read back, while the scope lives.
struct ViewBudget {
  int64_t saved = detail::clustered_view_budget();
  explicit ViewBudget(int64_t bytes) { detail::set_clustered_view_budget(bytes); }
  ~ViewBudget() { detail::set_clustered_view_budget(saved); }
  ViewBudget(const ViewBudget&) = delete;
  ViewBudget& operator=(const ViewBudget&) = delete;
};

// clustered_union's pairs by their definition (ops/sparse_attention.h), from the base's dense mask and a's rows.
std::vector<bool> clustered_union_mask(const SparsePattern& base, const Tensor& a, double theta, bool causal) {
  const int64_t B = a.size(0), H = a.size(1), T = a.size(2), c = a.size(3), G = B * H, S = base.keys();
  const auto bm = base.dense_mask().to_vector<bool>();
  const auto av = a.to(kFloat64).to_vector<double>();
  auto finite_row = [&](int64_t g, int64_t i) {
    for (int64_t m = 0; m < c; ++m)
      if (!std::isfinite(av[(g * T + i) * c + m])) return false;
    return true;
  };
  std::vector<bool> mask(G * T * S);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) {
        bool in = bm[((base.groups() == 1 ? 0 : g) * T + i) * S + j];
        if (j < T && (!causal || j <= i)) {
          if (!finite_row(g, i)) {
            in = in || i == j;
          } else if (finite_row(g, j)) {
            double d = 0;
            for (int64_t m = 0; m < c; ++m) d += av[(g * T + i) * c + m] * av[(g * T + j) * c + m];
            in = in || d > theta;
          }
        }
        mask[(g * T + i) * S + j] = in;
      }
  return mask;
}

}  // namespace

TEST_CASE(
    "clustered_union: base ∪ {a_i · a_j > θ} as lists (CPU), as the CPU kernels' block view, and by CUDA kernels") {
  const int64_t B = 2, H = 2, T = 37, G = B * H;  // T: two full query blocks and a partial one
  const int64_t default_budget = detail::clustered_view_budget();
  Generator gen(31);
  // c 3; 8 with uniform rows (every entry 1/8 <= θ/2 at θ 0.35, 0.8: in no bucket); 70 (> 64: no bucket masks)
  for (int64_t c : {3, 8, 70}) {
    CAPTURE(c);
    Tensor a = softmax(randn({B, H, T, c}, {.dtype = kFloat64}, &gen) * 2.5, -1);
    a.data_ptr<double>()[(1 * T + 5) * c + 1] = std::nan("");  // a NaN row (group 1, row 5) and an infinite one
    a.data_ptr<double>()[(2 * T + 36) * c + 0] = INFINITY;
    if (c == 8)
      for (int64_t x = 0; x < 4 * c; ++x) a.data_ptr<double>()[(3 * T + 10) * c + x] = 1.0 / 8;  // group 3, rows 10-13
    if (c == 3) a.data_ptr<double>()[(0 * T + 3) * c + 2] = -0.5;  // a negative entry: group 0 has every pair tested
    Tensor a_other = softmax(randn({B, H, T, c}, {.dtype = kFloat64}, &gen), -1);
    Tensor a_clean = softmax(randn({B, H, T, c}, {.dtype = kFloat64}, &gen) * 2.5, -1);
    for (bool causal : {false, true}) {
      for (const SparsePattern& base :
           {pattern_union({local_window_pattern(T, 4, causal), global_tokens_pattern(T, 2, causal)}),
            hierarchical_pattern(T, 6, causal),          // keys T + 7: summary columns stay base-only
            clustered_pattern(a_other, 0.6, causal)}) {  // a base of B·H groups
        for (double theta : {0.0, 0.35, 0.8}) {
          CAPTURE(causal);
          CAPTURE(base.keys());
          CAPTURE(base.groups());
          CAPTURE(theta);
          const auto want = clustered_union_mask(base, a, theta, causal);
          const SparsePattern lists = clustered_union(base, a, theta, causal);
          CHECK(lists.has_lists());
          CHECK(lists.groups() == G);
          CHECK(lists.keys() == base.keys());
          CHECK(lists.dense_mask().to_vector<bool>() == want);
          // The CPU kernels: the block view alone; its lists derived on demand are the same lists.
          const SparsePattern view = clustered_union(base, a, theta, causal, /*with_block_view=*/true);
          CHECK_FALSE(view.has_lists());
          CHECK(view.nnz() == lists.nnz());
          CHECK(view.max_row() == lists.max_row());
          check_view_holds(view, want);
          CHECK(same_bits(view.row_ptr(), lists.row_ptr()));
          CHECK(same_bits(view.cols(), lists.cols()));
          CHECK(same_bits(view.col_pos(), lists.col_pos()));
          CHECK(view.row(1, 5) == lists.row(1, 5));
          // Finite, non-negative assignments: the one pass that writes the union's rows (both of its row paths: the
          // bucket walk, and every key at once where a row's buckets hold more than a quarter of the keys).
          {
            const auto want_clean = clustered_union_mask(base, a_clean, theta, causal);
            const SparsePattern u = clustered_union(base, a_clean, theta, causal);
            CHECK(u.dense_mask().to_vector<bool>() == want_clean);
            const SparsePattern composed = pattern_union({base, clustered_pattern(a_clean, theta, causal)});
            CHECK(same_bits(u.row_ptr(), composed.row_ptr()));
            CHECK(same_bits(u.cols(), composed.cols()));
            CHECK(u.max_row() == composed.max_row());
          }
          if (!cuda::is_available()) continue;
          // The CUDA kernels: the same view, entry for entry, for every dtype of a; no lists on the device.
          // Both ways of sizing the view: without a read back (the default budget), and read back (budget 0).
          for (auto [dt, budget] : {std::pair{kFloat64, default_budget}, std::pair{kFloat64, int64_t{0}},
                                    std::pair{kFloat32, default_budget}, std::pair{kBFloat16, int64_t{0}}}) {
            CAPTURE(dtype_name(dt));
            CAPTURE(budget);
            const SparsePattern ref = clustered_union(base, a.to(dt).to(kFloat64), theta, causal, true);  // exact
            const SparsePattern d = [&] {
              const ViewBudget scope(budget);
              return clustered_union(base.to(Device::cuda()), a.to(dt).to(Device::cuda()), theta, causal);
            }();
            CHECK_FALSE(d.has_lists());
            CHECK(d.device() == Device::cuda());
            CHECK(d.nnz() == ref.nnz());
            CHECK(d.max_row() == ref.max_row());
            for (auto part : {&SparsePattern::rblk_ptr, &SparsePattern::rblk_keys, &SparsePattern::rblk_bits,
                              &SparsePattern::kblk_ptr, &SparsePattern::kblk_rows, &SparsePattern::kblk_bits})
              CHECK(same_bits((d.*part)().to(Device::cpu()), (ref.*part)()));
            if (dt == kFloat64) CHECK(d.dense_mask().to_vector<bool>() == want);
          }
        }
      }
    }
  }
}

TEST_CASE("clustered_union on CUDA: sparse attention over the device-built pattern equals the CPU's over the lists") {
  if (!gpu_or_skip()) return;
  const int64_t B = 2, H = 2, T = 29, D = 16;
  Generator gen(32);
  Tensor a = softmax(randn({B, H, T, 4}, {.dtype = kFloat64}, &gen) * 2.0, -1);
  const SparsePattern base = pattern_union({local_window_pattern(T, 6, true), hierarchical_pattern(T, 5, true)});
  const SparsePattern lists = clustered_union(base, a, 0.4, true);
  const int64_t default_budget = detail::clustered_view_budget();
  for (int64_t budget : {default_budget, int64_t{0}}) {  // the view sized on the device, and by a read back
    CAPTURE(budget);
    const SparsePattern d = [&] {
      const ViewBudget scope(budget);
      return clustered_union(base.to(Device::cuda()), a.to(Device::cuda()), 0.4, true);
    }();
    const int64_t S = base.keys();
    Tensor q = randn64({B, H, T, D}, true, 1), k = randn64({B, H, S, D}, true, 2), v = randn64({B, H, S, D}, true, 3);
    Tensor qd = q.detach().to(Device::cuda()), kd = k.detach().to(Device::cuda()), vd = v.detach().to(Device::cuda());
    for (Tensor* t : {&qd, &kd, &vd}) t->set_requires_grad(true);
    Tensor o = sparse_attention(q, k, v, lists), od = sparse_attention(qd, kd, vd, d);
    check_close(od.to(Device::cpu()), o, 1e-12, 1e-12);
    (o * o).sum().backward();
    (od * od).sum().backward();
    check_close(qd.grad().to(Device::cpu()), q.grad(), 1e-11, 1e-11);
    check_close(kd.grad().to(Device::cpu()), k.grad(), 1e-11, 1e-11);
    check_close(vd.grad().to(Device::cpu()), v.grad(), 1e-11, 1e-11);
    // The device pattern's lists, derived on the host, are the CPU's; so are its counts, read when asked.
    CHECK(same_bits(d.to(Device::cpu()).cols(), lists.cols()));
    CHECK(d.nnz() == lists.nnz());
    CHECK(d.max_row() == lists.max_row());
  }
}

TEST_CASE("clustered_union rejects bad inputs with clear errors, on every path") {
  const SparsePattern base = local_window_pattern(8, 3, false);
  Tensor a = softmax(randn64({1, 2, 8, 3}), -1);
  std::vector<Device> devices{Device::cpu()};
  if (cuda::is_available()) devices.push_back(Device::cuda());
  for (Device dev : devices)
    for (bool view : {false, true}) {
      if (dev.is_cuda() && view) continue;  // the option is for CPU tensors; CUDA builds the view anyway
      CAPTURE(dev);
      CAPTURE(view);
      const Tensor ad = a.to(dev);
      check_error([&] { clustered_union(base, ad, std::nan(""), false, view); }, {"clustered_union", "theta"});
      check_error([&] { clustered_union(base, ad, -0.1, false, view); }, {"clustered_union", "theta", ">= 0"});
      check_error([&] { clustered_union(local_window_pattern(9, 3, false), ad, 0.5, false, view); },
                  {"clustered_union", "9 queries", "T = 8"});
      check_error(
          [&] {
            clustered_union(clustered_pattern(softmax(randn64({3, 1, 8, 2}), -1), 0.5, false), ad, 0.5, false, view);
          },
          {"clustered_union", "3 groups", "B·H = 2"});
      check_error([&] { clustered_union(SparsePattern{}, ad, 0.5, false, view); }, {"clustered_union", "empty"});
      check_error(
          [&] {
            clustered_union(base, ad.view({2, 8, 3}), 0.5, false, view);
          },
          {"clustered_union", "(B, H, T, c)"});
    }
  // A pattern that holds only its block view says how to get its lists.
  const SparsePattern v = clustered_union(base, a, 0.5, false, true);
  check_error([&] { v.lists(); }, {"SparsePattern", "block view", "to(Device::cpu())"});
}

TEST_CASE("sparse_attention CUDA kernels: unions over several tiles, rows without a kept key, head dims") {
  if (!gpu_or_skip()) return;
  const Device gpu = Device::cuda();
  const int64_t B = 2, H = 1, T = 100;
  // Strided rows of 34 keys: a block of 16 rows has a union of 100 keys (4 tiles of 32). Batch 0 pads its first 6
  // tokens, so the causal window rows 0 .. 5 keep no key at all (o = 0, no gradient).
  const SparsePattern p = pattern_union({strided_pattern(T, 3, false), local_window_pattern(T, 4, true)});
  Tensor keep = ones({B, T}, {.dtype = kBool});
  for (int64_t j = 0; j < 6; ++j) keep.data_ptr<bool>()[j] = false;
  const SparsePattern causal = local_window_pattern(T, 4, true);
  for (int64_t D : {16, 64, 128}) {
    CAPTURE(D);
    Tensor q = randn64({B, H, T, D}, false, 11), k = randn64({B, H, T, D}, false, 12);
    Tensor v = randn64({B, H, T, D}, false, 13), dout = randn64({B, H, T, D}, false, 14);
    for (const SparsePattern* pp : {&p, &causal}) {
      const DType dt = D <= 64 ? kFloat64 : kFloat32;  // float64 tiles take D <= 64
      OpRun c = run_sparse(q, k, v, *pp, keep, dout, dt), g = run_sparse(q, k, v, *pp, keep, dout, dt, gpu);
      const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
      check_close(g.o, c.o, tol, tol);
      check_close(g.dq, c.dq, tol, tol);
      check_close(g.dk, c.dk, tol, tol);
      check_close(g.dv, c.dv, tol, tol);
    }
  }
  {  // the causal window's rows 0 .. 5 of batch 0 see only padding: zero output and zero dq
    Tensor q = randn64({B, H, T, 8}, false, 15);
    OpRun g = run_sparse(q, q, q, causal, keep, ones({B, H, T, 8}, {.dtype = kFloat64}), kFloat64, gpu);
    CHECK(g.o.narrow(2, 0, 6).narrow(0, 0, 1).abs().sum().item<double>() == 0.0);
    CHECK(g.dq.narrow(2, 0, 6).narrow(0, 0, 1).abs().sum().item<double>() == 0.0);
  }
  Tensor big = zeros({1, 1, 4, 72}, {.dtype = kFloat64, .device = gpu});
  check_error([&] { sparse_attention(big, big, big, local_window_pattern(4, 2, false)); },
              {"sparse_attention", "head dimension 72", "64"});
}

TEST_CASE("sparse attention at n = 4096 allocates no n × n buffer (CPU allocator peak)") {
  const int64_t T = 4096, D = 32;
  SparsePattern p = pattern_union(
      {local_window_pattern(T, 64, true), global_tokens_pattern(T, 2, true), random_keys_pattern(T, 4, 1, true)});
  Tensor q = randn({1, 2, T, D}, {.requires_grad = true}), k = randn({1, 2, T, D}, {.requires_grad = true}),
         v = randn({1, 2, T, D}, {.requires_grad = true});
  const size_t before = cpu_memory_stats().allocated;
  reset_cpu_peak_memory();
  sparse_attention(q, k, v, p).sum().backward();
  const double peak = static_cast<double>(cpu_memory_stats().peak_allocated - before);
  const double n2 = 4.0 * T * T;  // one float32 (T, T) score matrix: 64 MiB
  MESSAGE("peak above baseline " << peak / (1 << 20) << " MiB; an n x n float32 matrix is " << n2 / (1 << 20)
                                 << " MiB");
  CHECK(peak < n2 / 8);
}
