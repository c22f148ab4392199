// Hardening of sparse attention and ASAM (docs/asam.md, "Accepted options"): a SparsePattern cannot be built or used
// in an invalid state (every size product checked, the lists read-only); every integer option of the pattern
// builders and the layer at 0, 1, n, n + 1, negative and INT64_MAX (clamped or refused, never overflowed); every
// float option at NaN, ±inf and each side of its bounds; the op validates before dispatch and before any parallel
// region (CPU and, where a device is present, CUDA alike); NaN propagates through sparse attention and the layer;
// the layer's defaults on short sequences, the one rule for g > T, and the centroid loss over real tokens only.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

using Pred = std::function<bool(int64_t i, int64_t j)>;

// The pattern's rows equal {j < keys : pred(i, j)} for every query i.
void check_rows(const SparsePattern& p, const Pred& pred) {
  for (int64_t i = 0; i < p.queries(); ++i) {
    std::vector<int64_t> want;
    for (int64_t j = 0; j < p.keys(); ++j)
      if (pred(i, j)) want.push_back(j);
    CAPTURE(i);
    CHECK(p.row(0, i) == want);
  }
}

bool same_pattern(const SparsePattern& a, const SparsePattern& b) {
  if (a.groups() != b.groups() || a.queries() != b.queries() || a.keys() != b.keys()) return false;
  for (int64_t g = 0; g < a.groups(); ++g)
    for (int64_t i = 0; i < a.queries(); ++i)
      if (a.row(g, i) != b.row(g, i)) return false;
  return true;
}

// A compile-time proof that the pattern's sizes cannot be assigned: they are member functions, not fields.
template <class P>
constexpr bool sizes_assignable = requires(P p) {
  p.groups = int64_t{5};
}
|| requires(P p) { p.keys = int64_t{5}; }
|| requires(P p) { p.queries = int64_t{5}; }
|| requires(P p) { p.cols = Tensor(); };
static_assert(!sizes_assignable<SparsePattern>, "a SparsePattern's sizes and lists must not be writable");

// Every NaN position of t, row by row: rows (of the last dim) that are all NaN, and whether any other element is.
std::vector<bool> nan_rows(const Tensor& t) {
  const auto v = t.to(kFloat64).to(Device::cpu()).to_vector<double>();
  const int64_t D = t.size(-1);
  std::vector<bool> rows(v.size() / static_cast<size_t>(D));
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t n = 0;
    for (int64_t c = 0; c < D; ++c) n += std::isnan(v[r * static_cast<size_t>(D) + static_cast<size_t>(c)]);
    CHECK_MESSAGE((n == 0 || n == D), "row " << r << " is partly NaN");
    rows[r] = n == D;
  }
  return rows;
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (cuda::is_available()) d.push_back(Device::cuda());
  return d;
}

}  // namespace

// ---- 1. SparsePattern: validated at construction, immutable ------------------------------------------------------

TEST_CASE("SparsePattern::from_rows refuses sizes whose products overflow, before allocating anything") {
  check_error([] { SparsePattern::from_rows(int64_t{1} << 62, 4, 4, {}); },
              {"SparsePattern", "groups x queries", "overflow"});
  check_error([] { SparsePattern::from_rows(4, int64_t{1} << 62, 4, {}); }, {"SparsePattern", "overflow"});
  check_error([] { SparsePattern::from_rows(kMax, kMax, 1, {}); }, {"SparsePattern", "overflow"});
  // groups · keys (the transpose's size) overflows while groups · queries does not.
  check_error([] { SparsePattern::from_rows(int64_t{1} << 40, 1, int64_t{1} << 30, {}); },
              {"SparsePattern", "groups x keys", "overflow"});
  check_error([] { SparsePattern::from_rows(1, 1, int64_t{1} << 31, {{}}); }, {"SparsePattern", "2^31 - 1"});
  check_error([] { SparsePattern::from_rows(1, 1, kMax, {{}}); }, {"SparsePattern", "2^31 - 1"});
  for (int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    CAPTURE(bad);
    check_error([&] { SparsePattern::from_rows(bad, 1, 1, {{}}); }, {"SparsePattern", ">= 1"});
    check_error([&] { SparsePattern::from_rows(1, bad, 1, {{}}); }, {"SparsePattern", ">= 1"});
    check_error([&] { SparsePattern::from_rows(1, 1, bad, {{}}); }, {"SparsePattern", ">= 1"});
  }
  check_error([] { SparsePattern::from_rows(2, 3, 4, std::vector<std::vector<int64_t>>(5)); },
              {"SparsePattern", "expected 6 row lists", "got 5"});
  check_error([] { SparsePattern::from_rows(1, 2, 3, {{0}, {3}}); }, {"SparsePattern", "3", "[0, 3)"});
  check_error([] { SparsePattern::from_rows(1, 2, 3, {{-1}, {0}}); }, {"SparsePattern", "-1", "[0, 3)"});
  check_error([] { SparsePattern::from_rows(1, 1, 3, {{0, kMax}}); }, {"SparsePattern", "[0, 3)"});
  // The largest accepted key count builds (one query, one key: the transpose's 2^31 entries are not needed here,
  // so a smaller bound stands in for it) and the boundary of every size is 1.
  const SparsePattern one = SparsePattern::from_rows(1, 1, 1, {{0}});
  CHECK(one.nnz() == 1);
  CHECK(one.max_row() == 1);
  const SparsePattern dup = SparsePattern::from_rows(1, 2, 5, {{4, 1, 4, 1}, {}});
  CHECK(dup.row(0, 0) == std::vector<int64_t>{1, 4});  // sorted, deduplicated
  CHECK(dup.row(0, 1).empty());
  CHECK(dup.max_row() == 2);
}

TEST_CASE("SparsePattern is read-only: its accessors return copies, editing one changes nothing") {
  const int64_t T = 6, D = 3;
  const SparsePattern p = local_window_pattern(T, 3, true);
  Tensor q = randn64({1, 1, T, D}, false, 1), k = randn64({1, 1, T, D}, false, 2), v = randn64({1, 1, T, D}, false, 3);
  const Tensor before = sparse_attention(q, k, v, p);
  // Scribble over every copy: out-of-range keys, raised row ends (the edits that used to overflow the heap).
  for (Tensor t : {p.row_ptr(), p.cols(), p.col_ptr(), p.col_rows(), p.col_pos()}) t.fill_(int64_t{1} << 40);
  CHECK(p.row(0, 5) == std::vector<int64_t>{3, 4, 5});
  CHECK(same_bits(sparse_attention(q, k, v, p), before));
  // The copies are right: row_ptr ends at nnz, cols are the rows' keys.
  CHECK(p.row_ptr().to_vector<int64_t>().back() == p.nnz());
  CHECK(p.cols().numel() == p.nnz());
  // The empty pattern: every use is a clear error, never a read of missing lists.
  const SparsePattern empty;
  CHECK(!empty.defined());
  CHECK(empty.groups() == 0);
  CHECK(!empty.to(Device::cpu()).defined());
  check_error([&] { sparse_attention(q, k, v, empty); }, {"sparse_attention", "pattern is empty"});
  check_error([&] { (void)empty.row(0, 0); }, {"SparsePattern::row", "empty"});
  check_error([&] { (void)empty.dense_mask(); }, {"dense_mask", "empty"});
  check_error([&] { (void)empty.lists(); }, {"SparsePattern", "empty"});
  check_error([&] { pattern_union({p, empty}); }, {"pattern_union", "pattern 1 is empty"});
  check_error([&] { (void)p.block_view(); }, {"SparsePattern", "no block view"});
  check_error([&] { (void)p.row(1, 0); }, {"SparsePattern::row", "(1, 0)"});
  check_error([&] { (void)p.row(0, T); }, {"SparsePattern::row"});
}

// ---- 2. integer options of the builders at 0, 1, n, n + 1, INT64_MAX ---------------------------------------------

TEST_CASE("pattern builders: every integer argument at 0, 1, n, n + 1, negative and INT64_MAX") {
  const int64_t T = 7;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    auto in_causal = [&](int64_t i, int64_t j) { return !causal || j <= i; };
    // The sequence length: [1, 2^30).
    for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 30, kMax})
      check_error([&] { local_window_pattern(bad, 1, causal); }, {"local_window_pattern", "[1, 2^30)"});
    check_rows(local_window_pattern(1, 1, causal), [](int64_t, int64_t j) { return j == 0; });

    // window w >= 1; w >= 2T holds every key (non-causal r = w / 2), w >= T every earlier key (causal).
    for (int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()})
      check_error([&] { local_window_pattern(T, bad, causal); }, {"local_window_pattern", "w must be >= 1"});
    for (int64_t w : {int64_t{1}, T, T + 1, 2 * T, kMax}) {
      CAPTURE(w);
      const double r = static_cast<double>(w / 2);  // double: |i - j| <= w / 2 without integer tricks
      check_rows(local_window_pattern(T, w, causal), [&](int64_t i, int64_t j) {
        return causal ? (j <= i && static_cast<double>(i - j) < static_cast<double>(w))
                      : std::abs(static_cast<double>(i - j)) <= r;
      });
    }
    // stride s >= 1; s >= T: each query its own key.
    for (int64_t bad : {int64_t{0}, int64_t{-1}})
      check_error([&] { strided_pattern(T, bad, causal); }, {"strided_pattern", "stride s must be >= 1"});
    for (int64_t s : {int64_t{1}, T, T + 1, kMax}) {
      CAPTURE(s);
      check_rows(strided_pattern(T, s, causal), [&](int64_t i, int64_t j) {
        const int64_t d = i > j ? i - j : j - i;
        return in_causal(i, j) && d % s == 0;
      });
    }
    // global g >= 0; g > T: every token global, the same as g = T (the layer's rule too).
    check_error([&] { global_tokens_pattern(T, -1, causal); }, {"global_tokens_pattern", "g must be >= 0", "-1"});
    for (int64_t g : {int64_t{0}, int64_t{1}, T, T + 1, kMax}) {
      CAPTURE(g);
      check_rows(global_tokens_pattern(T, g, causal),
                 [&](int64_t i, int64_t j) { return in_causal(i, j) && (j < g || i < g); });
    }
    CHECK(same_pattern(global_tokens_pattern(T, kMax, causal), global_tokens_pattern(T, T, causal)));
    // random r >= 1; a row takes min(r, its candidates).
    for (int64_t bad : {int64_t{0}, int64_t{-1}})
      check_error([&] { random_keys_pattern(T, bad, 1, causal); }, {"random_keys_pattern", ">= 1"});
    for (int64_t r : {int64_t{1}, T - 1, T, T + 1, kMax}) {
      CAPTURE(r);
      const SparsePattern p = random_keys_pattern(T, r, 5, causal);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t candidates = causal ? i + 1 : T;
        const auto row = p.row(0, i);
        CHECK(static_cast<int64_t>(row.size()) == std::min(r, candidates));
        for (int64_t j : row) CHECK(in_causal(i, j));
      }
    }
    CHECK(same_pattern(random_keys_pattern(T, kMax, 5, causal), random_keys_pattern(T, T, 5, causal)));
    // hierarchical b >= 1; b >= T: one block (keys T + 1, the summary never visible to the block's own rows).
    for (int64_t bad : {int64_t{0}, int64_t{-1}})
      check_error([&] { hierarchical_pattern(T, bad, causal); }, {"hierarchical_pattern", "block size b must be >= 1"});
    for (int64_t b : {int64_t{1}, T - 1, T, T + 1, kMax}) {
      CAPTURE(b);
      const int64_t nb = b >= T ? 1 : (T + b - 1) / b;
      const SparsePattern p = hierarchical_pattern(T, b, causal);
      CHECK(p.keys() == T + nb);
      CHECK(hierarchical_blocks(T, b) == nb);
      check_rows(p, [&](int64_t i, int64_t j) {
        const int64_t bi = i / std::min(b, T);
        if (j < T) return j / std::min(b, T) == bi && in_causal(i, j);
        const int64_t m = j - T;
        return m != bi && (causal ? m < bi : true);
      });
    }
    CHECK(same_pattern(hierarchical_pattern(T, kMax, causal), hierarchical_pattern(T, T, causal)));
  }
  check_error([] { hierarchical_blocks(0, 3); }, {"hierarchical_blocks", "T = 0"});
  check_error([] { hierarchical_blocks(3, 0); }, {"hierarchical_blocks", "b = 0"});
  CHECK(hierarchical_blocks(kMax, kMax) == 1);
  CHECK(hierarchical_blocks(kMax, 1) == kMax);
  CHECK(hierarchical_blocks(kMax, 2) == kMax / 2 + 1);
  // hierarchical_summaries clamps its b the same way.
  Tensor x = randn64({1, 2, 5, 3}, false, 4);
  check_close(hierarchical_summaries(x, kMax).means, hierarchical_summaries(x, 5).means, 0, 0);
  check_close(hierarchical_summaries(x, kMax).means, mean(x, {2}, true), 1e-15, 1e-15);
  check_error([&] { hierarchical_summaries(x, 0); }, {"hierarchical_summaries", "b must be >= 1"});
  check_error([&] { hierarchical_summaries(x.to(kInt64), 2); }, {"hierarchical_summaries"});
}

TEST_CASE("clustered_pattern: theta and the assignments at their bounds; non-normalised rows miss no pair") {
  Tensor a = softmax(randn64({1, 1, 9, 3}, false, 2) * 3.0, -1);
  for (double bad : {kNaN, kInf, -kInf, -1e-300}) {
    CAPTURE(bad);
    check_error([&] { clustered_pattern(a, bad, false); }, {"clustered_pattern", "theta must be finite and >= 0"});
  }
  // θ = 0: every pair with a positive overlap (all of them for a softmax); θ >= 1: none for rows summing to 1.
  CHECK(clustered_pattern(a, 0, false).nnz() == 81);
  CHECK(clustered_pattern(a, 1.0, false).nnz() == 0);
  CHECK(clustered_pattern(a, 1e300, false).nnz() == 0);
  check_error([&] { clustered_pattern(a * -1.0, 0.5, false); }, {"clustered_pattern", ">= 0"});
  // Rows summing to more than 1 (here 3): the bucketing still misses no pair a_i · a_j > θ.
  Tensor a3 = a * 3.0;
  const auto av = a3.to_vector<double>();
  for (double theta : {0.5, 1.5, 3.0}) {
    CAPTURE(theta);
    check_rows(clustered_pattern(a3, theta, false), [&](int64_t i, int64_t j) {
      double d = 0;
      for (int64_t m = 0; m < 3; ++m) d += av[i * 3 + m] * av[j * 3 + m];
      return d > theta;
    });
  }
}

// ---- 3, 4. validation before dispatch and before parallel regions ------------------------------------------------

TEST_CASE("sparse_attention validates every input before dispatch, identically on every device") {
  const int64_t B = 2, H = 2, T = 64, D = 8;
  const SparsePattern p = local_window_pattern(T, 64, false);
  for (Device dev : devices()) {
    CAPTURE(dev);
    Tensor q = randn32({B, H, T, D}, 1).to(dev), k = randn32({B, H, T, D}, 2).to(dev);
    // A float mask, large enough for the CPU op to go parallel: a clear error, never an abort.
    check_error(
        [&] {
          sparse_attention(q, k, k, p, ones({B, T}, {.device = dev}));
        },
        {"sparse_attention", "key_keep must be bool"});
    check_error(
        [&] {
          sparse_attention(q, k, k, p, ones({B, T}, {.dtype = kInt64, .device = dev}));
        },
        {"sparse_attention", "key_keep must be bool"});
    check_error(
        [&] {
          sparse_attention(q, k, k, p, ones({B, T + 1}, {.dtype = kBool, .device = dev}));
        },
        {"sparse_attention", "key_keep"});
    for (double s : {kNaN, kInf, -1.0})
      check_error([&] { sparse_attention(q, k, k, p, {}, s); }, {"sparse_attention", "scale"});
    check_error([&] { sparse_attention(q.to(kInt64), k.to(kInt64), k.to(kInt64), p); }, {"sparse_attention"});
    check_error([&] { sparse_attention(q, k, k, local_window_pattern(T - 1, 3, false)); },
                {"sparse_attention", "63 queries"});
    check_error([&] { sparse_attention(q, k.narrow(3, 0, 4), k.narrow(3, 0, 4), p); }, {"sparse_attention"});
    check_error([&] { sparse_attention(q.narrow(0, 0, 0), k.narrow(0, 0, 0), k.narrow(0, 0, 0), p); },
                {"sparse_attention", "empty"});
    if (dev.is_cuda()) {
      check_error([&] { sparse_attention(q, k.cpu(), k, p); }, {"sparse_attention"});
      check_error(
          [&] {
            sparse_attention(q, k, k, p, ones({B, T}, {.dtype = kBool}));
          },
          {"sparse_attention", "key_keep is on"});
    }
  }
}

// ---- 6. NaN propagates ---------------------------------------------------------------------------------------------

TEST_CASE("sparse_attention: a NaN query, key or value makes exactly the rows that attend it NaN (CPU, CUDA)") {
  const int64_t B = 1, H = 2, T = 37, D = 5;  // several query blocks and key tiles on the device
  const SparsePattern p = pattern_union({local_window_pattern(T, 5, false), global_tokens_pattern(T, 1, false)});
  Tensor keep = ones({B, T}, {.dtype = kBool});
  keep.data_ptr<bool>()[30] = false;  // key 30 is padding
  // Row 20 attends only key 30 (padding): genuinely masked, it outputs 0 even with a NaN query.
  std::vector<std::vector<int64_t>> lists(T);
  for (int64_t i = 0; i < T; ++i) lists[i] = p.row(0, i);
  lists[20] = {30};
  const SparsePattern pm = SparsePattern::from_rows(1, T, T, lists);
  const Tensor q0 = randn64({B, H, T, D}, false, 1), k0 = randn64({B, H, T, D}, false, 2),
               v0 = randn64({B, H, T, D}, false, 3);
  auto poison = [](const Tensor& t, int64_t h, int64_t row) {
    Tensor c = t.clone();
    c.narrow(1, h, 1).narrow(2, row, 1).fill_(kNaN);
    return c;
  };
  struct Case {
    const char* what;
    Tensor q, k, v;
    std::vector<int64_t> nan_rows;  // of head 1; head 0 stays finite
  };
  auto attending = [&](int64_t j) {  // the rows that attend key j (kept)
    std::vector<int64_t> r;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t x : lists[i])
        if (x == j) r.push_back(i);
    return r;
  };
  const std::vector<Case> cases = {
      {"query 7", poison(q0, 1, 7), k0, v0, {7}},
      {"query 20 (no kept key)", poison(q0, 1, 20), k0, v0, {}},
      {"key 9", q0, poison(k0, 1, 9), v0, attending(9)},
      {"value 12", q0, k0, poison(v0, 1, 12), attending(12)},
      {"value 0 (global)", q0, k0, poison(v0, 1, 0), attending(0)},
      {"key and value 30 (padding)", q0, poison(k0, 1, 30), poison(v0, 1, 30), {}},
  };
  for (const Case& c : cases)
    for (Device dev : devices())
      for (DType dt : {kFloat64, kFloat32}) {
        CAPTURE(c.what);
        CAPTURE(dev);
        CAPTURE(dt);
        Tensor q = c.q.to(dt).to(dev).detach(), k = c.k.to(dt).to(dev).detach(), v = c.v.to(dt).to(dev).detach();
        for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
        const Tensor o = sparse_attention(q, k, v, pm, keep.to(dev));
        const auto rows = nan_rows(o);
        for (int64_t i = 0; i < T; ++i) {
          CAPTURE(i);
          CHECK(!rows[i]);  // head 0
          const bool want = std::find(c.nan_rows.begin(), c.nan_rows.end(), i) != c.nan_rows.end();
          CHECK(rows[T + i] == want);
        }
        // The masked row outputs exact zeros, NaN query or not.
        for (double x : o.narrow(2, 20, 1).to(kFloat64).cpu().to_vector<double>()) CHECK(x == 0.0);
        // The finite rows equal the run without the NaN.
        const Tensor clean =
            sparse_attention(q0.to(dt).to(dev), k0.to(dt).to(dev), v0.to(dt).to(dev), pm, keep.to(dev));
        const auto ov = o.to(kFloat64).cpu().to_vector<double>(), cv = clean.to(kFloat64).cpu().to_vector<double>();
        for (size_t x = 0; x < ov.size(); ++x)
          if (!std::isnan(ov[x])) CHECK(ov[x] == doctest::Approx(cv[x]).epsilon(1e-5));
        // Gradients: a NaN row's dq is NaN; the masked row's dq is 0.
        o.sum().backward();
        const auto dq = q.grad().to(kFloat64).cpu();
        const auto dq_nan = nan_rows(dq);
        for (int64_t i : c.nan_rows)
          if (std::string(c.what).starts_with("query")) CHECK(dq_nan[T + i]);
        for (double x : dq.narrow(2, 20, 1).to_vector<double>()) CHECK(x == 0.0);
        for (int64_t i = 0; i < T; ++i) CHECK(!dq_nan[i]);  // head 0 untouched
      }
}

// ---- 5, 10. the layer's options: the "Accepted options" table of docs/asam.md, each bound, each side -------------

namespace {

using Opt = nn::AsamAttentionOptions;
using Set = std::function<void(Opt&)>;

// Builds the layer from `base` with `set` applied and runs it on a short sequence (T = 3, shorter than the default 4
// random keys) with padding and both causalities: accepted means both succeed with a finite output.
void expect_accepted(const Set& set, const std::vector<std::string>& patterns = {
                                         "window", "strided", "global", "random", "hierarchical", "clustered"}) {
  Opt o(8, 2);
  o.patterns(patterns);
  set(o);
  manual_seed(3);
  nn::AsamAttention m(o);
  for (int64_t T : {1, 3, 6})
    for (bool causal : {false, true}) {
      CAPTURE(T);
      CAPTURE(causal);
      Tensor valid = ones({2, T}, {.dtype = kBool});
      if (T > 1) valid.data_ptr<bool>()[2 * T - 1] = false;
      const Tensor y = m.attend(randn({2, T, 8}), {.key_padding_mask = valid, .causal = causal});
      for (double x : y.to_vector<double>()) REQUIRE(std::isfinite(x));
      REQUIRE(std::isfinite(m.aux_loss().item<double>()));
    }
}
void expect_refused(const Set& set, std::initializer_list<const char*> fragments) {
  Opt o(8, 2);
  set(o);
  check_error([&] { nn::AsamAttention m(o); }, fragments);
}

}  // namespace

TEST_CASE("AsamAttention options: integer options at 0, 1, n, n + 1, negative and INT64_MAX") {
  // d_model, heads: d_model a positive multiple of heads, d_model² representable.
  expect_refused([](Opt& o) { o.d_model(0); }, {"AsamAttention", "multiple of heads"});
  expect_refused([](Opt& o) { o.d_model(-8); }, {"AsamAttention", "multiple of heads"});
  expect_refused([](Opt& o) { o.heads(0); }, {"AsamAttention", "multiple of heads"});
  expect_refused([](Opt& o) { o.heads(3); }, {"AsamAttention", "multiple of heads"});
  expect_refused([](Opt& o) { o.heads(kMax); }, {"AsamAttention", "multiple of heads"});
  expect_refused([](Opt& o) { o.d_model(kMax).heads(kMax); }, {"AsamAttention", "overflow"});
  expect_refused([](Opt& o) { o.d_model(int64_t{1} << 32).heads(1); }, {"AsamAttention", "overflow"});
  expect_accepted([](Opt& o) { o.heads(1); });
  expect_accepted([](Opt& o) { o.heads(8); });
  // window, stride, global_tokens, random_keys, block: any value >= their minimum, clamped to the sequence.
  expect_refused([](Opt& o) { o.window(0); }, {"AsamAttention", "window", "0"});
  expect_refused([](Opt& o) { o.window(-1); }, {"AsamAttention", "window"});
  expect_refused([](Opt& o) { o.stride(0); }, {"AsamAttention", "stride"});
  expect_refused([](Opt& o) { o.global_tokens(-1); }, {"AsamAttention", "global_tokens"});
  expect_refused([](Opt& o) { o.random_keys(0); }, {"AsamAttention", "random_keys"});
  expect_refused([](Opt& o) { o.block(-1); }, {"AsamAttention", "block"});
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, kMax}) {
    CAPTURE(n);
    expect_accepted([&](Opt& o) { o.window(n).stride(n).global_tokens(n).random_keys(n).block(n); });
  }
  expect_accepted([](Opt& o) { o.global_tokens(0).block(0); });
  // clusters >= 1, heads · clusters · d_head representable.
  expect_refused([](Opt& o) { o.clusters(0); }, {"AsamAttention", "clusters"});
  expect_refused([](Opt& o) { o.clusters(kMax); }, {"AsamAttention", "overflow"});
  expect_accepted([](Opt& o) { o.clusters(1); });
  // pool_scales: non-empty, each >= 1, d_model · Σ scales · heads representable.
  expect_refused([](Opt& o) { o.pool_scales({}); }, {"AsamAttention", "pool_scales"});
  expect_refused([](Opt& o) { o.pool_scales({1, 0}); }, {"AsamAttention", "pool scales must be >= 1", "0"});
  expect_refused([](Opt& o) { o.pool_scales({-1}); }, {"AsamAttention", "pool scales"});
  expect_refused([](Opt& o) { o.pool_scales({kMax}); }, {"AsamAttention", "overflow"});
  expect_refused([](Opt& o) { o.pool_scales({kMax, kMax}); }, {"AsamAttention", "sum of pool_scales", "overflow"});
  expect_accepted([](Opt& o) { o.pool_scales({1}); });
  expect_accepted([](Opt& o) { o.pool_scales({7}); });  // more segments than tokens: each keeps one token
  // seed: every value.
  expect_accepted([](Opt& o) { o.seed(std::numeric_limits<uint64_t>::max()); });
}

TEST_CASE("AsamAttention options: float options at NaN, ±inf and each side of their bounds") {
  for (double bad : {kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    expect_refused([&](Opt& o) { o.threshold_init(bad); }, {"AsamAttention", "threshold_init must be finite"});
    expect_refused([&](Opt& o) { o.gate_tau(bad); }, {"AsamAttention", "gate_tau"});
    expect_refused([&](Opt& o) { o.cluster_tau(bad); }, {"AsamAttention", "cluster_tau"});
    expect_refused([&](Opt& o) { o.cluster_theta(bad); }, {"AsamAttention", "cluster_theta"});
    expect_refused([&](Opt& o) { o.cluster_loss_weight(bad); }, {"AsamAttention", "cluster_loss_weight"});
    expect_refused([&](Opt& o) { o.fixed_gate(bad); }, {"AsamAttention", "fixed_gate"});
    expect_refused([&](Opt& o) { o.skip_dense_above(bad); }, {"AsamAttention", "skip_dense_above"});
  }
  // threshold_init: any finite value.
  for (double t : {-1e300, 0.0, 1e300}) expect_accepted([&](Opt& o) { o.threshold_init(t); });
  // gate_tau, cluster_tau > 0.
  expect_refused([](Opt& o) { o.gate_tau(0); }, {"AsamAttention", "gate_tau must be > 0"});
  expect_refused([](Opt& o) { o.cluster_tau(-1e-300); }, {"AsamAttention", "cluster_tau must be > 0"});
  expect_accepted([](Opt& o) { o.gate_tau(1e-300).cluster_tau(1e-3); });
  // cluster_theta in [0, 1).
  expect_refused([](Opt& o) { o.cluster_theta(-1e-300); }, {"AsamAttention", "cluster_theta must be in [0, 1)"});
  expect_refused([](Opt& o) { o.cluster_theta(1.0); }, {"AsamAttention", "cluster_theta must be in [0, 1)"});
  expect_accepted([](Opt& o) { o.cluster_theta(0.0); });
  expect_accepted([](Opt& o) { o.cluster_theta(std::nextafter(1.0, 0.0)); });
  // cluster_loss_weight >= 0.
  expect_refused([](Opt& o) { o.cluster_loss_weight(-1e-300); }, {"AsamAttention", "cluster_loss_weight"});
  expect_accepted([](Opt& o) { o.cluster_loss_weight(0); });
  expect_accepted([](Opt& o) { o.cluster_loss_weight(1e30); });  // (1e300 is accepted too; the loss is then inf)
  // fixed_gate: -1 or [0, 1].
  expect_refused([](Opt& o) { o.fixed_gate(-0.5); }, {"AsamAttention", "fixed_gate"});
  expect_refused([](Opt& o) { o.fixed_gate(std::nextafter(1.0, 2.0)); }, {"AsamAttention", "fixed_gate"});
  for (double g : {-1.0, 0.0, 0.5, 1.0}) expect_accepted([&](Opt& o) { o.fixed_gate(g); });
  // skip_dense_above in [0, 0.99].
  expect_refused([](Opt& o) { o.skip_dense_above(-1e-300); }, {"AsamAttention", "skip_dense_above"});
  expect_refused([](Opt& o) { o.skip_dense_above(std::nextafter(0.99, 1.0)); }, {"AsamAttention", "skip_dense_above"});
  expect_accepted([](Opt& o) { o.skip_dense_above(0.99); });
  // patterns: non-empty, known names.
  expect_refused([](Opt& o) { o.patterns({}); }, {"AsamAttention", "at least one pattern"});
  expect_refused([](Opt& o) { o.patterns({"window", ""}); }, {"AsamAttention", "unknown pattern ''"});
}

// ---- 10. defaults that do no harm ----------------------------------------------------------------------------------

TEST_CASE("AsamAttention defaults: sequences shorter than the 4 random keys; g > T is the g = T pattern") {
  for (int64_t T : {1, 2, 3, 4, 5}) {
    for (bool causal : {false, true}) {
      CAPTURE(T);
      CAPTURE(causal);
      manual_seed(5);
      nn::AsamAttention dflt(nn::AsamAttentionOptions(8, 2));  // random_keys 4, global_tokens 2
      manual_seed(5);
      nn::AsamAttention clamped(
          nn::AsamAttentionOptions(8, 2).random_keys(std::min<int64_t>(4, T)).global_tokens(std::min<int64_t>(2, T)));
      CHECK(same_pattern(dflt.pattern(T, causal), clamped.pattern(T, causal)));
      Tensor x = randn({2, T, 8});
      check_close(dflt.attend(x, {.causal = causal}), clamped.attend(x, {.causal = causal}), 0, 0);
    }
  }
  // One rule for g > T in the layer and the builder: clamped to T.
  manual_seed(6);
  nn::AsamAttention big(nn::AsamAttentionOptions(8, 2).patterns({"global"}).global_tokens(50));
  CHECK(same_pattern(big.pattern(5, false), global_tokens_pattern(5, 5, false)));
  CHECK(same_pattern(global_tokens_pattern(5, 50, true), global_tokens_pattern(5, 5, true)));
}

TEST_CASE("AsamAttention centroid loss averages over real tokens only: padding does not train the centroids") {
  const int64_t B = 2, T = 7, D = 6, H = 2, c = 3;
  manual_seed(8);
  auto m = std::make_shared<nn::AsamAttention>(
      nn::AsamAttentionOptions(D, H).patterns({"window", "clustered"}).clusters(c).cluster_loss_weight(0.5));
  m->to(kFloat64);
  Tensor valid = ones({B, T}, {.dtype = kBool});
  for (int64_t j : {4, 5, 6}) valid.data_ptr<bool>()[T + j] = false;  // batch 1: 3 padding tokens
  Tensor x = randn64({B, T, D}, false, 9);
  m->attend(x, {.key_padding_mask = valid});
  const double got = m->aux_loss().item<double>();
  // By loops in float64: a = softmax(q C^T / τ), Σ_m a_m |q − C_m|², over the real (b, i) and every h.
  const Tensor q = matmul(x, m->q_proj->weight.transpose(0, 1)) + m->q_proj->bias;  // (B, T, D)
  const auto qv = q.to_vector<double>(), C = m->centroids.to_vector<double>();
  const auto val = valid.to_vector<bool>();
  const int64_t Dh = D / H;
  double total = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        if (!val[b * T + i]) continue;
        std::vector<double> s(c), d2(c, 0);
        double mx = -kInf, z = 0;
        for (int64_t mm = 0; mm < c; ++mm) {
          double dot = 0;
          for (int64_t e = 0; e < Dh; ++e) {
            const double qe = qv[(b * T + i) * D + h * Dh + e], ce = C[(h * c + mm) * Dh + e];
            dot += qe * ce;
            d2[mm] += (qe - ce) * (qe - ce);
          }
          s[mm] = dot / m->options.cluster_tau();
          mx = std::max(mx, s[mm]);
        }
        for (int64_t mm = 0; mm < c; ++mm) z += std::exp(s[mm] - mx);
        for (int64_t mm = 0; mm < c; ++mm) total += std::exp(s[mm] - mx) / z * d2[mm];
        ++n;
      }
  CHECK(n == (B * T - 3) * H);
  CHECK(got == doctest::Approx(0.5 * total / static_cast<double>(n)).epsilon(1e-12));
  // Changing (even poisoning) the padded tokens changes neither the loss nor its gradient in C.
  Tensor x2 = x.clone();
  x2.narrow(0, 1, 1).narrow(1, 4, 3).fill_(kNaN);
  m->zero_grad();
  m->attend(x, {.key_padding_mask = valid});
  m->aux_loss().backward();
  const Tensor g1 = m->centroids.grad().clone();
  m->zero_grad();
  m->attend(x2, {.key_padding_mask = valid});
  CHECK(m->aux_loss().item<double>() == doctest::Approx(got).epsilon(1e-12));
  m->aux_loss().backward();
  check_close(m->centroids.grad(), g1, 1e-12, 1e-12);
  // No real token at all: the loss is 0, not 0 / 0.
  m->attend(x, {.key_padding_mask = zeros({B, T}, {.dtype = kBool})});
  CHECK(m->aux_loss().item<double>() == 0.0);
}

TEST_CASE("AsamAttention: a NaN token gives NaN where it is attended, without an error (every pattern)") {
  const int64_t B = 2, T = 9, D = 8, H = 2;
  manual_seed(10);
  nn::AsamAttention m(nn::AsamAttentionOptions(D, H).patterns({"clustered"}).fixed_gate(1.0));
  Tensor x = randn({B, T, D});
  x.narrow(0, 1, 1).narrow(1, 4, 1).fill_(kNaN);
  const Tensor y = m.attend(x, {});
  // Sample 0 is finite; in sample 1 token 4's own output is NaN (it attends itself) and the finite tokens of
  // sample 1 do not see it (its assignment row joins no bucket).
  const auto rows = nan_rows(y);
  for (int64_t i = 0; i < T; ++i) CHECK(!rows[i]);
  CHECK(rows[T + 4]);
  for (int64_t i = 0; i < T; ++i)
    if (i != 4) CHECK(!rows[T + i]);
  // The full layer (dense branch, gate): the NaN reaches the output, no error.
  manual_seed(10);
  nn::AsamAttention full(
      nn::AsamAttentionOptions(D, H).patterns({"window", "global", "random", "clustered", "hierarchical", "strided"}));
  const auto yv = full.attend(x, {}).to_vector<double>();
  CHECK(std::any_of(yv.begin(), yv.end(), [](double v) { return std::isnan(v); }));
}

TEST_CASE("AsamAttention: a padding token's content, even NaN, never reaches the real tokens (sparse branch, gate)") {
  const int64_t B = 2, T = 11, D = 8, H = 2;
  manual_seed(12);
  auto m = std::make_shared<nn::AsamAttention>(
      nn::AsamAttentionOptions(D, H)
          .patterns({"window", "strided", "global", "random", "clustered", "hierarchical"})
          .window(3)
          .stride(4)
          .global_tokens(1)
          .random_keys(2)
          .block(3)
          .clusters(2)
          .cluster_theta(0.3)
          .fixed_gate(1.0));  // the sparse branch alone: the dense one is ops/attention's
  m->to(kFloat64);
  Tensor valid = ones({B, T}, {.dtype = kBool});
  valid.data_ptr<bool>()[T + 5] = false;  // sample 1, token 5 (inside a hierarchical block) is padding
  const Tensor x = randn64({B, T, D}, false, 13);
  const Tensor y = m->attend(x, {.key_padding_mask = valid});
  Tensor xn = x.clone();
  xn.narrow(0, 1, 1).narrow(1, 5, 1).fill_(kNaN);
  const Tensor yn = m->attend(xn, {.key_padding_mask = valid});
  const auto a = y.to_vector<double>(), b = yn.to_vector<double>();
  for (int64_t r = 0; r < B * T; ++r) {
    if (r == T + 5) continue;  // the padding token's own output is not used
    for (int64_t c = 0; c < D; ++c) CHECK(b[r * D + c] == doctest::Approx(a[r * D + c]).epsilon(1e-12));
  }
  // The learned gate reads the real tokens only too.
  manual_seed(12);
  nn::AsamAttention g(nn::AsamAttentionOptions(D, H));
  check_close(g.gate(xn.to(kFloat32), valid), g.gate(x.to(kFloat32), valid), 0, 0);
}

TEST_CASE("AsamAttention load_state_dict: a non-finite threshold or centroid is refused, the layer left untouched") {
  manual_seed(14);
  nn::AsamAttention m(nn::AsamAttentionOptions(8, 2).patterns({"window", "clustered"}));
  StateDict good;  // a deep copy: state_dict() shares the parameters' storage
  for (const auto& [n, t] : m.state_dict()) good.set(n, t.detach().clone());
  for (const char* name : {"threshold", "centroids"})
    for (double bad : {kNaN, kInf, -kInf}) {
      CAPTURE(name);
      CAPTURE(bad);
      StateDict sd;
      for (const auto& [n, t] : good) sd.set(n, t.clone());
      Tensor poisoned = sd.at(name).clone();
      poisoned.view({-1}).narrow(0, 1, 1).fill_(bad);
      sd.set(name, poisoned);
      sd.set("q_proj.weight", zeros_like(sd.at("q_proj.weight")));  // would change the layer if anything loaded
      check_error([&] { m.load_state_dict(sd); }, {"AsamAttention", name, "finite"});
      CHECK(same_bits(m.q_proj->weight, good.at("q_proj.weight")));
      CHECK(same_bits(m.threshold, good.at("threshold")));
    }
  // A finite state loads.
  StateDict sd;
  for (const auto& [n, t] : good) sd.set(n, t.clone());
  sd.set("threshold", full({2}, 0.25));
  m.load_state_dict(sd);
  CHECK(m.threshold.to_vector<double>() == std::vector<double>{0.25, 0.25});
}
