// Multi-head attention and Transformer blocks against naive float64 loops; gradchecks; masks; pluggability.
#include <cmath>

#include "core/profiler.h"
#include "nn/nn.h"
#include "testing.h"

using namespace asc;
using namespace asc::testing;

namespace {

using Vec = std::vector<double>;

// y (rows, out) = x (rows, in) W^T (out, in) + b
Vec naive_linear(const Vec& x, int64_t rows, int64_t in, const Tensor& W, const Tensor& b) {
  Vec w = W.to_vector<double>(), bias = b.defined() ? b.to_vector<double>() : Vec();
  int64_t out = W.size(0);
  Vec y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

// Rotate-half RoPE on one head vector at position pos.
void naive_rope(double* v, int64_t dh, int64_t pos) {
  int64_t half = dh / 2;
  for (int64_t i = 0; i < half; ++i) {
    double theta = pos * std::pow(10000.0, -2.0 * i / dh);
    double a = v[i], b = v[i + half];
    v[i] = a * std::cos(theta) - b * std::sin(theta);
    v[i + half] = b * std::cos(theta) + a * std::sin(theta);
  }
}

struct NaiveOut {
  Vec y, probs;  // (B, T, D), (B, H, T, S)
};

// keep(b, t, s) and bias(h, t, s) as callables; independent of the library's mask/bias plumbing.
template <class Keep, class Bias>
NaiveOut naive_mha(nn::MultiHeadAttention& m, const Tensor& x, const Tensor& ctx, Keep keep, Bias bias) {
  const int64_t B = x.size(0), T = x.size(1), S = ctx.size(1), D = x.size(2), H = m.options.heads(), Dh = D / H;
  Vec xv = x.to_vector<double>(), cv = ctx.to_vector<double>();
  Vec q = naive_linear(xv, B * T, D, m.q_proj->weight, m.q_proj->bias);
  Vec k = naive_linear(cv, B * S, D, m.k_proj->weight, m.k_proj->bias);
  Vec v = naive_linear(cv, B * S, D, m.v_proj->weight, m.v_proj->bias);
  if (m.options.rope())
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) naive_rope(&q[(b * T + t) * D + h * Dh], Dh, t + S - T);
        for (int64_t s = 0; s < S; ++s) naive_rope(&k[(b * S + s) * D + h * Dh], Dh, s);
      }
  NaiveOut out;
  out.probs.assign(static_cast<size_t>(B * H * T * S), 0.0);
  Vec heads(static_cast<size_t>(B * T * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        Vec sc(static_cast<size_t>(S));
        double mx = -INFINITY;
        bool any = false;
        for (int64_t s = 0; s < S; ++s) {
          if (!keep(b, t, s)) continue;
          double d = 0;
          for (int64_t e = 0; e < Dh; ++e) d += q[(b * T + t) * D + h * Dh + e] * k[(b * S + s) * D + h * Dh + e];
          sc[s] = d / std::sqrt(static_cast<double>(Dh)) + bias(h, t, s);
          mx = std::max(mx, sc[s]);
          any = true;
        }
        if (!any) continue;  // fully masked row: zero probabilities and output
        double z = 0;
        for (int64_t s = 0; s < S; ++s)
          if (keep(b, t, s)) z += std::exp(sc[s] - mx);
        for (int64_t s = 0; s < S; ++s) {
          double p = keep(b, t, s) ? std::exp(sc[s] - mx) / z : 0.0;
          out.probs[((b * H + h) * T + t) * S + s] = p;
          for (int64_t e = 0; e < Dh; ++e) heads[(b * T + t) * D + h * Dh + e] += p * v[(b * S + s) * D + h * Dh + e];
        }
      }
  out.y = naive_linear(heads, B * T, D, m.out_proj->weight, m.out_proj->bias);
  return out;
}

std::shared_ptr<nn::MultiHeadAttention> make_mha(int64_t D, int64_t H, bool rope = false, bool bias = true) {
  manual_seed(3);
  auto m = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(D, H).rope(rope).bias(bias));
  m->to(kFloat64);
  return m;
}

// Kernel events named `kernel` in a stopped profile (which path ran: one product or one per layer).
int kernels_named(const profiler::Profile& prof, const std::string& kernel) {
  int n = 0;
  for (const profiler::Event& e : prof.events()) n += e.kind == profiler::EventKind::Kernel && e.kernel == kernel;
  return n;
}
// Matrix products: matmul kernels and addmm's (a product with its bias, what a Linear with a bias runs).
int products_run(const profiler::Profile& prof) {
  return kernels_named(prof, "matmul") + kernels_named(prof, "matmul_bias");
}

}  // namespace

TEST_CASE("MultiHeadAttention: self-attention forward and weights match naive loops") {
  for (bool rope : {false, true}) {
    auto m = make_mha(8, 2, rope);
    Tensor x = randn64({2, 5, 8});
    Tensor y = m->attend(x, {.need_weights = true});
    auto ref = naive_mha(
        *m, x, x, [](auto...) { return true; }, [](auto...) { return 0.0; });
    check_close(y, ref.y, 1e-10, 1e-9);
    check_close(m->attention_weights(), ref.probs, 1e-12, 1e-9);
    CHECK(m->attention_weights().shape() == Shape{2, 2, 5, 5});
    // A later call without need_weights clears them.
    m->attend(x, {});
    CHECK_FALSE(m->attention_weights().defined());
  }
}

TEST_CASE("MultiHeadAttention: padding mask, causal mask and additive bias match naive loops") {
  auto m = make_mha(12, 3);
  const int64_t B = 2, T = 6, H = 3;
  Tensor x = randn64({B, T, 12}, false, 11);
  // Sample 0: all real; sample 1: last two tokens are padding; plus a causal mask. Sample 1 / key 0 kept so no
  // row is fully masked here (fully masked rows are checked below).
  std::vector<int64_t> len = {6, 4};
  Tensor valid = lt(arange(T).view({1, T}), tensor(std::vector<int64_t>{6, 4}, {2, 1}));
  Tensor bias = randn64({H, T, T}, false, 12);
  Vec bv = bias.to_vector<double>();
  Tensor y = m->attend(x, {.key_padding_mask = valid, .causal = true, .bias = bias, .need_weights = true});
  auto ref = naive_mha(
      *m, x, x, [&](int64_t b, int64_t t, int64_t s) { return s < len[b] && s <= t; },
      [&](int64_t h, int64_t t, int64_t s) { return bv[(h * T + t) * T + s]; });
  check_close(y, ref.y, 1e-10, 1e-9);
  check_close(m->attention_weights(), ref.probs, 1e-12, 1e-9);
}

TEST_CASE("MultiHeadAttention: fully masked rows give a zero attention output, never NaN") {
  auto m = make_mha(4, 1);
  Tensor x = randn64({1, 3, 4});
  Tensor valid = tensor(std::vector<int64_t>{0, 1, 1}, {1, 3}).to(kBool);
  // causal + key 0 padded: query 0 sees nothing.
  Tensor y = m->attend(x, {.key_padding_mask = valid, .causal = true, .need_weights = true});
  auto ref = naive_mha(
      *m, x, x, [&](int64_t, int64_t t, int64_t s) { return s >= 1 && s <= t; }, [](auto...) { return 0.0; });
  check_close(y, ref.y, 1e-10, 1e-9);
  for (double p : m->attention_weights().select(2, 0).to_vector<double>()) CHECK(p == 0.0);
}

TEST_CASE("MultiHeadAttention: cross-attention over a longer context (causal offset S - T)") {
  auto m = make_mha(8, 4, /*rope=*/true);
  Tensor x = randn64({2, 3, 8}, false, 1), ctx = randn64({2, 7, 8}, false, 2);
  Tensor y = m->attend(x, {.causal = true, .context = ctx});
  auto ref = naive_mha(
      *m, x, ctx, [&](int64_t, int64_t t, int64_t s) { return s <= t + 4; }, [](auto...) { return 0.0; });
  check_close(y, ref.y, 1e-10, 1e-9);
}

TEST_CASE("MultiHeadAttention: float64 gradcheck w.r.t. the input and every projection") {
  auto m = make_mha(8, 2, /*rope=*/true);
  Tensor x = randn64({2, 4, 8}, true, 5);
  Tensor valid = tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 0}, {2, 4}).to(kBool);
  TensorList params = m->parameters(), inputs = {x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  check_grad(
      [&](const TensorList& in) -> TensorList {
        // gradcheck evaluates on perturbed copies: point the module's parameters at them.
        for (size_t k = 0; k < params.size(); ++k)
          if (!params[k].is_same(in[k + 1])) params[k].set_data(in[k + 1]);
        return {m->attend(in[0], {.key_padding_mask = valid, .causal = true})};
      },
      inputs);
}

TEST_CASE("linear_group: one product, the same numbers as the layers one by one; hooks and mixed layers run apart") {
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dt);
    manual_seed(31);
    nn::Linear a(12, 5), b(12, 5), c(12, 7);  // unequal widths
    for (nn::Linear* l : {&a, &b, &c}) l->to(dt);
    // 256 rows (kGroupRows): fewer run one by one (below)
    Tensor x = randn64({4, 64, 12}, true, 32).to(dt).detach().set_requires_grad(true);
    const Tensor w = randn64({4, 64, 17}, false, 33).to(dt);  // weights each output's columns in the loss
    auto run = [&](bool grouped, int* matmuls) {
      for (nn::Linear* l : {&a, &b, &c}) l->zero_grad();
      x.zero_grad();
      profiler::Profile prof;
      TensorList y = grouped ? nn::linear_group({&a, &b, &c}, x) : TensorList{a(x), b(x), c(x)};
      prof.stop();
      *matmuls = products_run(prof);
      REQUIRE(y.size() == 3);
      CHECK(y[2].shape() == Shape{4, 64, 7});
      sum(mul(cat(y, -1), w)).backward();
      TensorList out{cat(y, -1).detach(), x.grad().clone()};
      for (nn::Linear* l : {&a, &b, &c}) out.push_back(l->weight.grad().clone()), out.push_back(l->bias.grad().clone());
      return out;
    };
    int grouped_products = 0, apart_products = 0;
    const TensorList grouped = run(true, &grouped_products), apart = run(false, &apart_products);
    CHECK(grouped_products == 1);
    CHECK(apart_products == 3);
    const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    for (size_t i = 0; i < grouped.size(); ++i) check_close(grouped[i], apart[i], tol, tol);
    // A hook on one layer, or a layer without bias beside layers with one: every layer through its own forward.
    int calls = 0, products = 0;
    const int id = b.add_forward_pre_hook([&](nn::Module&, const Tensor&) {
      ++calls;
      return std::nullopt;
    });
    const TensorList hooked = run(true, &products);
    b.remove_hook(id);
    CHECK(calls == 1);
    CHECK(products == 3);
    for (size_t i = 0; i < grouped.size(); ++i) check_close(hooked[i], apart[i], 0, 0);
    nn::Linear no_bias(nn::LinearOptions(12, 5).bias(false));
    no_bias.to(dt);
    profiler::Profile prof;
    const TensorList mixed = nn::linear_group({&a, &no_bias}, x);
    prof.stop();
    CHECK(products_run(prof) == 2);
    check_close(mixed[1], no_bias(x).detach(), 0, 0);
    // Fewer rows than kGroupRows (a token at a time): one product per layer, the layers' own values.
    const Tensor few = x.narrow(1, 0, 63).detach();  // 252 rows
    profiler::Profile prof_few;
    const TensorList small = nn::linear_group({&a, &b, &c}, few);
    prof_few.stop();
    CHECK(products_run(prof_few) == 3);
    check_close(small[2], c(few).detach(), 0, 0);
    check_error([&] { nn::linear_group({&a, &b}, randn({2, 11}).to(dt)); }, {"Linear", "12", "11"});
    check_error([&] { nn::linear_group({}, x); }, {"linear_group", "no layers"});
  }
}

TEST_CASE("Attention layers project q, k, v in one product: the same numbers as with the projections one by one") {
  // A hook on every projection makes linear_group run them through their own forwards: both ways must agree, in
  // the output and every parameter's gradient, for self- and cross-attention and the two mechanisms' layers, and the
  // grouped run must make fewer products. 256 rows (kGroupRows), in the context too.
  for (DType dt : {kFloat32, kFloat64})
    for (const char* kind : {"mha", "mha-cross", "ascender", "asam"}) {
      CAPTURE(dt);
      CAPTURE(kind);
      manual_seed(41);
      std::shared_ptr<nn::Attention> m;
      std::vector<nn::Linear*> projections;
      const std::string k = kind;
      if (k == "mha" || k == "mha-cross") {
        auto mha = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(16, 2).rope(k == "mha"));
        projections = {mha->q_proj.get(), mha->k_proj.get(), mha->v_proj.get()}, m = mha;
      } else if (k == "ascender") {
        auto asc = std::make_shared<nn::AscenderAttention>(nn::AscenderAttentionOptions(16, 2).k({2, 3}));
        projections = {asc->q_proj.get(), asc->k_proj.get(), asc->v_proj.get(), asc->z_proj.get(), asc->e_proj.get()};
        m = asc;
      } else {
        auto asam = std::make_shared<nn::AsamAttention>(nn::AsamAttentionOptions(16, 2).window(2));
        projections = {asam->q_proj.get(), asam->k_proj.get(), asam->v_proj.get()}, m = asam;
      }
      m->to(dt);
      const Tensor x = randn64({2, 128, 16}, false, 42).to(dt), ctx = randn64({2, 130, 16}, false, 43).to(dt);
      nn::AttentionArgs args;
      if (k == "mha-cross") args.context = ctx;
      auto run = [&](int* products) {
        manual_seed(44);  // the same draws both ways, should a layer draw any
        m->zero_grad();
        profiler::Profile prof;
        Tensor y = m->attend(x, args);
        sum(mul(y, y)).backward();
        prof.stop();
        *products = products_run(prof);
        TensorList out{y.detach()};
        for (auto& [name, p] : m->named_parameters())
          if (p.grad().defined()) out.push_back(p.grad().clone());
        return out;
      };
      int grouped_products = 0, apart_products = 0;
      const TensorList grouped = run(&grouped_products);
      std::vector<int> ids;
      for (nn::Linear* l : projections)
        ids.push_back(l->add_forward_pre_hook([](nn::Module&, const Tensor&) { return std::nullopt; }));
      const TensorList apart = run(&apart_products);
      for (size_t i = 0; i < ids.size(); ++i) projections[i]->remove_hook(ids[i]);
      CHECK(grouped_products < apart_products);
      REQUIRE(grouped.size() == apart.size());
      const double tol = dt == kFloat32 ? 2e-4 : 1e-10;
      for (size_t i = 0; i < grouped.size(); ++i) check_close(grouped[i], apart[i], tol, tol);
    }
}

TEST_CASE("MultiHeadAttention: bad configuration and input are clear errors") {
  check_error([] { nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(10, 3)); }, {"MultiHeadAttention", "10", "3"});
  check_error([] { nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(6, 2).rope(true)); }, {"RoPE", "even"});
  auto m = make_mha(8, 2);
  check_error([&] { m->attend(randn64({2, 5, 7}), {}); }, {"MultiHeadAttention", "[2, 5, 7]"});
  check_error(
      [&] {
        m->attend(randn64({2, 5, 8}), {.key_padding_mask = ones({2, 4}).to(kBool)});
      },
      {"key_padding_mask", "[2, 4]"});
  check_error([&] { m->attend(randn64({2, 5, 8}), {.key_padding_mask = ones({2, 5})}); }, {"key_padding_mask", "bool"});
  check_error([&] { m->attend(randn64({2, 5, 8}), {.context = randn64({3, 5, 8})}); }, {"context", "[3, 5, 8]"});
}

namespace {
// Independent block reference: layer norm and GELU/ReLU by hand over rows of the naive attention.
Vec naive_layer_norm(const Vec& x, int64_t rows, int64_t d, const Tensor& w, const Tensor& b, double eps) {
  Vec wv = w.to_vector<double>(), bv = b.to_vector<double>(), y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mu += x[r * d + i] / d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mu) * (x[r * d + i] - mu) / d;
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = (x[r * d + i] - mu) / std::sqrt(var + eps) * wv[i] + bv[i];
  }
  return y;
}

Vec naive_block(nn::TransformerEncoderBlock& blk, const Tensor& x, bool causal) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), F = blk.options.ffn();
  auto& mha = static_cast<nn::MultiHeadAttention&>(*blk.attn);
  auto ln = [&](const Vec& v, nn::LayerNorm& n) { return naive_layer_norm(v, B * T, D, n.weight, n.bias, 1e-5); };
  auto attn = [&](const Vec& v) {
    Tensor t = tensor(v, {B, T, D});
    return naive_mha(
               mha, t, t, [&](int64_t, int64_t tq, int64_t s) { return !causal || s <= tq; },
               [](auto...) { return 0.0; })
        .y;
  };
  auto ffn = [&](const Vec& v) {
    Vec h = naive_linear(v, B * T, D, blk.linear1->weight, blk.linear1->bias);
    for (double& e : h) e = 0.5 * e * (1.0 + std::erf(e / std::sqrt(2.0)));  // exact GELU
    return naive_linear(h, B * T, F, blk.linear2->weight, blk.linear2->bias);
  };
  auto add = [](Vec a, const Vec& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  Vec xv = x.to_vector<double>();
  if (blk.options.norm_first()) {
    Vec h = add(xv, attn(ln(xv, *blk.norm1)));
    return add(h, ffn(ln(h, *blk.norm2)));
  }
  Vec h = ln(add(xv, attn(xv)), *blk.norm1);
  return ln(add(h, ffn(h)), *blk.norm2);
}
}  // namespace

TEST_CASE("Transformer blocks: pre-norm, post-norm and decoder blocks match a naive composition") {
  for (bool pre : {true, false}) {
    manual_seed(9);
    auto opts = nn::TransformerBlockOptions(8, 2).ffn(16).norm_first(pre);
    nn::TransformerEncoderBlock enc(opts);
    enc.to(kFloat64);
    // Non-trivial norm affine parameters, so a swapped norm would show.
    for (auto& [name, p] : enc.named_parameters()) {
      NoGradGuard g;
      if (name.find("norm") != std::string::npos) p.copy_(randn64(p.shape(), false, name.size()));
    }
    Tensor x = randn64({2, 5, 8}, false, 4);
    check_close(enc.forward(x), naive_block(enc, x, false), 1e-9, 1e-8);
    check_close(enc.forward(x, {.causal = true}), naive_block(enc, x, true), 1e-9, 1e-8);

    manual_seed(9);
    nn::TransformerDecoderBlock dec(opts);
    dec.to(kFloat64);
    check_close(dec.forward(x), naive_block(dec, x, true), 1e-9, 1e-8);
  }
}

TEST_CASE("Transformer block in training: the fused feed-forward activation is the modules' composition") {
  // With no hook the block runs linear1's bias, the activation and the dropout as one bias_activation_dropout; a hook
  // on linear1 makes it call the modules one by one. Same default-generator draws, so the same masks: same numbers.
  for (const char* act : {"gelu", "relu", "silu"})
    for (DType dt : {kFloat32, kFloat64}) {
      CAPTURE(act);
      CAPTURE(dt);
      manual_seed(21);
      nn::TransformerEncoderBlock blk(nn::TransformerBlockOptions(16, 2).ffn(40).dropout(0.25).activation(act));
      blk.to(dt);
      blk.train();
      const Tensor x = randn64({3, 6, 16}, false, 5).to(dt);
      auto run = [&] {
        manual_seed(22);
        blk.zero_grad();
        Tensor y = blk.forward(x);
        sum(mul(y, y)).backward();
        TensorList out{y.detach()};
        for (auto& [name, p] : blk.named_parameters()) out.push_back(p.grad().clone());
        return out;
      };
      profiler::Profile prof;
      const TensorList fused = run();
      prof.stop();
      bool fused_kernel = false, activation_op = false;  // the fused kernel ran, the activation op did not
      for (const profiler::Event& e : prof.events()) {
        fused_kernel |= e.kind == profiler::EventKind::Kernel && e.kernel == "bias_act_dropout";
        activation_op |= e.kind == profiler::EventKind::Kernel && e.name == act;
      }
      CHECK(fused_kernel);
      CHECK_FALSE(activation_op);
      const int id = blk.linear1->add_forward_pre_hook([](nn::Module&, const Tensor&) { return std::nullopt; });
      const TensorList plain = run();
      blk.linear1->remove_hook(id);
      REQUIRE(fused.size() == plain.size());
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      for (size_t i = 0; i < fused.size(); ++i) check_close(fused[i], plain[i], tol, tol);
    }
}

TEST_CASE("Transformer decoder block is causal: changing a later token leaves earlier outputs unchanged") {
  manual_seed(1);
  nn::TransformerDecoderBlock dec(nn::TransformerBlockOptions(8, 2).ffn(16).rope(true));
  Tensor x = randn32({1, 6, 8});
  Tensor y1 = dec.forward(x);
  Tensor x2 = x.clone();
  {
    NoGradGuard g;
    x2.narrow(1, 4, 1).fill_(3.0);
  }
  Tensor y2 = dec.forward(x2);
  CHECK(y1.narrow(1, 0, 4).to_vector<float>() == y2.narrow(1, 0, 4).to_vector<float>());
  CHECK(y1.narrow(1, 4, 2).to_vector<float>() != y2.narrow(1, 4, 2).to_vector<float>());
}

namespace {
// A toy attention: every query receives the mean of the (kept) values x Wv. Proves the block takes any Attention.
struct MeanAttention : nn::Attention {
  std::shared_ptr<nn::Linear> v;
  int calls = 0;
  explicit MeanAttention(int64_t d) : nn::Attention("MeanAttention") {
    v = register_module("v", std::make_shared<nn::Linear>(d, d, false));
  }
  Tensor attend(const Tensor& x, const nn::AttentionArgs&) override {
    ++calls;
    return mean((*v)(x), {1}, true).expand(x.shape());
  }
};
}  // namespace

TEST_CASE("Transformer block: attention is pluggable") {
  auto opts = nn::TransformerBlockOptions(8, 2).ffn(16);
  std::shared_ptr<MeanAttention> made;
  nn::TransformerEncoderBlock blk(opts, [&](const nn::TransformerBlockOptions& o) {
    made = std::make_shared<MeanAttention>(o.d_model());
    return made;
  });
  CHECK(blk.attn.get() == made.get());
  Tensor x = randn32({2, 3, 8});
  Tensor y = blk.forward(x);
  CHECK(made->calls == 1);
  // Reference from the block's own pieces: pre-norm residual with the mean attention.
  Tensor h = x + mean((*made->v)((*blk.norm1)(x)), {1}, true);
  Tensor ref = h + (*blk.linear2)(gelu((*blk.linear1)((*blk.norm2)(h))));
  check_close(y, ref, 1e-5, 1e-5);
  // Its parameters are the block's: attn.v.weight is listed.
  bool found = false;
  for (auto& [n, p] : blk.named_parameters()) found |= n == "attn.v.weight";
  CHECK(found);
  check_error([&] { nn::TransformerEncoderBlock(opts, [](const auto&) { return std::shared_ptr<nn::Attention>(); }); },
              {"TransformerEncoderBlock", "null"});
  check_error([&] { nn::TransformerEncoderBlock(nn::TransformerBlockOptions(8, 2).activation("swish")); },
              {"activation", "swish"});
}
