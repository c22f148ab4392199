// The op table (tests/op_table.h): the families of entries, the sample inputs they are drawn as.
#include "op_table.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <span>

namespace asc::optable {

Tensor make_leaf(const In& in, View view, DType dt, Generator& gen) {
  Shape s = in.shape;
  if (s.size() >= 2 && view == View::Transposed) std::swap(s[s.size() - 1], s[s.size() - 2]);
  if (s.size() >= 1 && view == View::Sliced) s[s.size() - 1] *= 2;
  switch (in.kind) {
    case Kind::Normal: return randn(s, {.dtype = dt}, &gen);
    case Kind::Positive: return add(rand(s, {.dtype = dt}, &gen), 0.5);
    case Kind::Index:
    case Kind::Int: return randint(0, in.high, s, {.dtype = kInt64}, &gen);
    case Kind::Mask: return lt(rand(s, {.dtype = kFloat64}, &gen), 0.7);
  }
  return {};
}

Tensor view_of(const Tensor& leaf, const In& in, View view) {
  if (in.shape.size() >= 2 && view == View::Transposed) return leaf.transpose(-1, -2);
  if (in.shape.size() >= 1 && view == View::Sliced) return leaf.slice(-1, 0, leaf.size(-1), 2);
  return leaf;
}

bool is_float_input(const In& in) { return in.kind == Kind::Normal || in.kind == Kind::Positive; }

TensorList inputs(const OpCase& c, DType dt, uint64_t seed, Device device, bool grad, View view) {
  Generator gen(seed);
  TensorList out;
  for (const In& in : c.inputs) {
    Tensor leaf = make_leaf(in, view, dt, gen).to(device);
    if (grad && c.backward && in.grad && is_float_input(in)) leaf.set_requires_grad(true);
    out.push_back(view_of(leaf, in, view));
  }
  return out;
}

namespace {

// ---- independent references: plain loops in float64 ----------------------------------------------------------------

// f applied to every element of the first input.
Fn unary_reference(std::function<double(double)> f) {
  return [f](const TensorList& a) {
    const Tensor x = a[0].to(kFloat64).cpu().contiguous();
    std::vector<double> v = x.to_vector<double>();
    for (double& e : v) e = f(e);
    return one(tensor(std::span<const double>(v), x.shape(), {.dtype = kFloat64}));
  };
}

// f(a, b) over the broadcast of the first two inputs: each output index reads a and b at its broadcast positions.
Fn binary_reference(std::function<double(double, double)> f) {
  return [f](const TensorList& t) {
    const Tensor a = t[0].to(kFloat64).cpu().contiguous(), b = t[1].to(kFloat64).cpu().contiguous();
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    const size_t rank = std::max(a.dim(), b.dim());
    std::vector<int64_t> out(rank, 1);
    auto dim = [rank](const Tensor& x, size_t d) { return d + x.dim() < rank ? 1 : x.size(d + x.dim() - rank); };
    for (size_t d = 0; d < rank; ++d) out[d] = std::max(dim(a, d), dim(b, d));
    int64_t n = 1;
    for (int64_t e : out) n *= e;
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int64_t rest = i, ia = 0, ib = 0, sa = 1, sb = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t idx = rest % out[d];
        rest /= out[d];
        if (dim(a, d) > 1) ia += idx * sa;
        if (dim(b, d) > 1) ib += idx * sb;
        sa *= dim(a, d), sb *= dim(b, d);
      }
      r[static_cast<size_t>(i)] = f(av[static_cast<size_t>(ia)], bv[static_cast<size_t>(ib)]);
    }
    return one(tensor(std::span<const double>(r), Shape(out), {.dtype = kFloat64}));
  };
}

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// f over the elements of t along `dim` (every element when dim is nullopt) in float64, each group in order along dim;
// keepdim keeps the reduced dim as size 1. Any dtype (bool and int64 read as 0 / 1 and integers).
Tensor reduce_reference(const Tensor& t, std::optional<int64_t> dim, bool keepdim,
                        const std::function<double(const std::vector<double>&)>& f) {
  const Tensor x = t.to(kFloat64).cpu().contiguous();
  const std::vector<double> v = x.to_vector<double>();
  if (!dim) return scalar_tensor(f(v), {.dtype = kFloat64});
  const Shape s = x.shape();
  const int d = static_cast<int>(*dim < 0 ? *dim + s.size() : *dim);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (int i = d + 1; i < s.size(); ++i) inner *= s[i];
  const int64_t n = s[d];
  std::vector<double> out, group(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < inner; ++k) {
      for (int64_t j = 0; j < n; ++j) group[static_cast<size_t>(j)] = v[static_cast<size_t>((o * n + j) * inner + k)];
      out.push_back(f(group));
    }
  Shape os;
  for (int i = 0; i < s.size(); ++i) {
    if (i != d)
      os.push_back(s[i]);
    else if (keepdim)
      os.push_back(1);
  }
  return tensor(std::span<const double>(out), os, {.dtype = kFloat64});
}

double product(const std::vector<double>& v) {
  double p = 1;
  for (double a : v) p *= a;
  return p;
}
// NaN counts as non-zero (true), as in torch.any / torch.all.
double any_nonzero(const std::vector<double>& v) {
  for (double a : v)
    if (a != 0) return 1;
  return 0;
}
double all_nonzero(const std::vector<double>& v) {
  for (double a : v)
    if (a == 0) return 0;
  return 1;
}

// tril (lower) or triu of t over its last two dims: x[..., i, j] kept where j - i <= diagonal (tril) or >= diagonal
// (triu), 0 elsewhere, whatever x holds there.
Tensor tri_reference(const Tensor& t, int64_t diagonal, bool lower) {
  const Tensor x = t.to(kFloat64).cpu().contiguous();
  std::vector<double> v = x.to_vector<double>();
  const int64_t rows = x.size(-2), cols = x.size(-1);
  for (size_t f = 0; f < v.size(); ++f) {
    const int64_t i = static_cast<int64_t>(f) / cols % rows, j = static_cast<int64_t>(f) % cols;
    if (lower ? j - i > diagonal : j - i < diagonal) v[f] = 0.0;
  }
  return tensor(std::span<const double>(v), x.shape(), {.dtype = kFloat64});
}

// The scatter entry's fixed indices into a (5, 6) x, distinct along the scatter dim so that the result does not
// depend on which of repeated writes wins: dim 0, (3, 6), (2i + j) mod 5; dim 1, (5, 3), (i + 2j) mod 6.
Tensor scatter_index(int dim, Device device) {
  const int64_t rows = dim == 0 ? 3 : 5, cols = dim == 0 ? 6 : 3;
  std::vector<int64_t> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(dim == 0 ? (2 * i + j) % 5 : (i + 2 * j) % 6);
  return tensor(v, {rows, cols}, {.dtype = kInt64, .device = device});
}

// out = x, then out[index[i][j]][j] (dim 0) or out[i][index[i][j]] (dim 1) = src[i][j] (or value): plain loops.
Tensor scatter_reference(const Tensor& x_in, int dim, const Tensor& src_in, double value = 0) {
  const Tensor x = x_in.to(kFloat64).cpu().contiguous();
  const Tensor src = src_in.defined() ? src_in.to(kFloat64).cpu().contiguous() : Tensor();
  const Tensor index = scatter_index(dim, Device::cpu());
  std::vector<double> out = x.to_vector<double>();
  const std::vector<double> sv = src.defined() ? src.to_vector<double>() : std::vector<double>();
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  const int64_t xc = x.size(1), ic = index.size(1);
  for (int64_t i = 0; i < index.size(0); ++i)
    for (int64_t j = 0; j < ic; ++j) {
      const int64_t k = iv[static_cast<size_t>(i * ic + j)];
      const int64_t to = dim == 0 ? k * xc + j : i * xc + k;
      out[static_cast<size_t>(to)] = src.defined() ? sv[static_cast<size_t>(i * src.size(1) + j)] : value;
    }
  return tensor(std::span<const double>(out), x.shape(), {.dtype = kFloat64});
}

// The nll_loss entries' class weights: constants, so that the fuzz test's hostile values reach the input only (a
// zero weight sum is a case of its own).
const std::vector<double> kNllWeights = {0.5, 1.0, 2.0, 0.25, 3.0};

// nll_loss with plain loops: input (N, C, d...), target (N, d...) int64; weight empty: every class 1. The
// per-position losses (0 where target == ignore), or their sum, or their sum over the counted weights.
Tensor nll_reference(const Tensor& input, const Tensor& target, const std::vector<double>& weight, int64_t ignore,
                     Reduction reduction) {
  const Tensor x = input.to(kFloat64).cpu().contiguous();
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<int64_t> tv = target.cpu().contiguous().to_vector<int64_t>();
  const int64_t n = x.size(0), c = x.size(1), inner = x.numel() / (n * c);
  std::vector<double> per(tv.size(), 0.0);
  double sum = 0, weights = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < inner; ++k) {
      const int64_t t = tv[static_cast<size_t>(i * inner + k)];
      if (t == ignore) continue;
      const double w = weight.empty() ? 1.0 : weight[static_cast<size_t>(t)];
      const double l = -w * xv[static_cast<size_t>((i * c + t) * inner + k)];
      per[static_cast<size_t>(i * inner + k)] = l;
      sum += l;
      weights += w;
    }
  if (reduction == Reduction::None) return tensor(std::span<const double>(per), target.shape(), {.dtype = kFloat64});
  if (reduction == Reduction::Sum) return scalar_tensor(sum, {.dtype = kFloat64});
  return scalar_tensor(weights == 0 ? 0.0 : sum / weights, {.dtype = kFloat64});
}

// The nll_loss entry's second target: the first two of the six kept, the others ignored (-100).
Tensor first_two_targets(const Tensor& target) {
  const Tensor position = arange(0, 6, 1, {.dtype = kInt64, .device = target.device()});
  return where(ge(position, 2.0), full({6}, -100.0, {.dtype = kInt64, .device = target.device()}), target);
}

// bias + a @ b in float64 loops: a (M, K), b (K, N), bias (N) over the rows.
Tensor addmm_reference(const Tensor& a, const Tensor& b, const Tensor& bias) {
  const std::vector<double> av = a.to(kFloat64).cpu().contiguous().to_vector<double>(),
                            bv = b.to(kFloat64).cpu().contiguous().to_vector<double>(),
                            cv = bias.to(kFloat64).cpu().contiguous().to_vector<double>();
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = cv[static_cast<size_t>(j)];
      for (int64_t k = 0; k < K; ++k) acc += av[static_cast<size_t>(i * K + k)] * bv[static_cast<size_t>(k * N + j)];
      out[static_cast<size_t>(i * N + j)] = acc;
    }
  return tensor(std::span<const double>(out), {M, N}, {.dtype = kFloat64});
}

OpCase with_reference(OpCase c, Fn reference) {
  c.reference = std::move(reference);
  return c;
}

// ---- families moved from the CUDA parity test: elementwise, reductions, matmul / nn functional, geometry / index --

std::vector<OpCase> unary_cases() {
  const Shape s{5, 7};
  const In x{s}, xp{s, Kind::Positive};
  std::vector<OpCase> cases = {
      {"neg", {x}, [](const TensorList& a) { return one(neg(a[0])); }},
      {"exp", {x}, [](const TensorList& a) { return one(exp(a[0])); }},
      {"log", {xp}, [](const TensorList& a) { return one(log(a[0])); }},
      {"sqrt", {xp}, [](const TensorList& a) { return one(sqrt(a[0])); }},
      {"rsqrt", {xp}, [](const TensorList& a) { return one(rsqrt(a[0])); }},
      {"abs", {x}, [](const TensorList& a) { return one(abs(a[0])); }},
      {"relu", {x}, [](const TensorList& a) { return one(relu(a[0])); }},
      {"gelu", {x}, [](const TensorList& a) { return one(gelu(a[0])); }},
      {"gelu_tanh", {x}, [](const TensorList& a) { return one(gelu(a[0], true)); }},
      {"silu", {x}, [](const TensorList& a) { return one(silu(a[0])); }},
      {"sigmoid", {x}, [](const TensorList& a) { return one(sigmoid(a[0])); }},
      {"tanh", {x}, [](const TensorList& a) { return one(tanh(a[0])); }},
      {"softplus", {x}, [](const TensorList& a) { return one(softplus(a[0], 2.0, 1.5)); }},
      {"clamp", {x}, [](const TensorList& a) { return one(clamp(a[0], -0.5, 0.7)); }},
      {"add_scalar", {x}, [](const TensorList& a) { return one(add(a[0], 1.25)); }},
      {"mul_scalar", {x}, [](const TensorList& a) { return one(mul(a[0], -3.0)); }},
      {"rsub_scalar", {x}, [](const TensorList& a) { return one(rsub(2.0, a[0])); }},
      {"rdiv_scalar", {xp}, [](const TensorList& a) { return one(rdiv(2.0, a[0])); }},
      {"pow_scalar", {xp}, [](const TensorList& a) { return one(pow(a[0], 2.5)); }},
      // not gradchecked: float64 through float32 moves finite differences by float32's rounding
      {"to_dtype_roundtrip",
       {x},
       [](const TensorList& a) {
         DType other = a[0].dtype() == kFloat32 ? kFloat64 : kFloat32;
         return one(a[0].to(other).to(a[0].dtype()));
       },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       false},
      {"sub_scalar", {x}, [](const TensorList& a) { return one(sub(a[0], 1.5)); }},
      {"div_scalar", {x}, [](const TensorList& a) { return one(div(a[0], 4.0)); }},
      {"clamp_lo", {x}, [](const TensorList& a) { return one(clamp(a[0], 0.2, std::nullopt)); }},
      {"pow_square", {x}, [](const TensorList& a) { return one(pow(a[0], 2.0)); }},
      {"softplus threshold", {x}, [](const TensorList& a) { return one(softplus(a[0], 2.0, 1.0)); }},
      {"contiguous", {x}, [](const TensorList& a) { return one(a[0].contiguous()); }},
      {"clone", {x}, [](const TensorList& a) { return one(a[0].clone()); }},
      {"isnan", {x}, [](const TensorList& a) { return one(isnan(log(a[0]))); }, false},
      // tril / triu (ops/elementwise.h): a batched, non-square input; diagonal offsets above and below
      with_reference({"tril/triu",
                      {In{{2, 4, 5}}},
                      [](const TensorList& a) {
                        return TensorList{tril(a[0]), tril(a[0], 1), triu(a[0], -1), triu(a[0], 2)};
                      }},
                     [](const TensorList& a) {
                       return TensorList{tri_reference(a[0], 0, true), tri_reference(a[0], 1, true),
                                         tri_reference(a[0], -1, false), tri_reference(a[0], 2, false)};
                     }),
  };
  const std::map<std::string, std::function<double(double)>> refs = {
      {"neg", [](double v) { return -v; }},
      {"exp", [](double v) { return std::exp(v); }},
      {"log", [](double v) { return std::log(v); }},
      {"sqrt", [](double v) { return std::sqrt(v); }},
      {"rsqrt", [](double v) { return 1 / std::sqrt(v); }},
      {"abs", [](double v) { return std::abs(v); }},
      {"relu", [](double v) { return std::isnan(v) || v > 0 ? v : 0; }},  // relu(NaN) = NaN
      {"gelu", [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {"gelu_tanh",
       [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }},
      {"silu", [](double v) { return v * sigm(v); }},
      {"sigmoid", sigm},
      {"tanh", [](double v) { return std::tanh(v); }},
      {"softplus", [](double v) { return 2 * v > 1.5 ? v : std::log1p(std::exp(2 * v)) / 2; }},
      {"softplus threshold", [](double v) { return 2 * v > 1.0 ? v : std::log1p(std::exp(2 * v)) / 2; }},
      {"clamp", [](double v) { return std::isnan(v) ? v : std::min(0.7, std::max(-0.5, v)); }},
      {"clamp_lo", [](double v) { return std::isnan(v) ? v : std::max(0.2, v); }},
      {"add_scalar", [](double v) { return v + 1.25; }},
      {"sub_scalar", [](double v) { return v - 1.5; }},
      {"mul_scalar", [](double v) { return -3 * v; }},
      {"div_scalar", [](double v) { return v / 4; }},
      {"rsub_scalar", [](double v) { return 2 - v; }},
      {"rdiv_scalar", [](double v) { return 2 / v; }},
      {"pow_scalar", [](double v) { return std::pow(v, 2.5); }},
      {"pow_square", [](double v) { return v * v; }},
      {"contiguous", [](double v) { return v; }},
      {"clone", [](double v) { return v; }},
  };
  for (OpCase& c : cases)
    if (auto it = refs.find(c.op); it != refs.end()) c.reference = unary_reference(it->second);
  return cases;
}

std::vector<OpCase> binary_cases() {
  // Same shapes (35 elements: whole 16-byte packs and a tail, cuda/elementwise.cu), row broadcast, column broadcast,
  // a 3-D outer broadcast, and a 0-d scalar.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{5, 7}, {5, 7}}, {{4, 6}, {1, 6}}, {{4, 6}, {4, 1}}, {{3, 1, 6}, {4, 6}}, {{}, {2, 3}}};
  std::vector<OpCase> cases;
  for (auto& [sa, sb] : shapes) {
    const std::string tag = fmt::format(" {}x{}", sa, sb);
    const In a{sa}, b{sb}, bp{sb, Kind::Positive}, ap{sa, Kind::Positive};
    cases.push_back({"add" + tag, {a, b}, [](const TensorList& t) { return one(add(t[0], t[1])); }});
    cases.push_back({"sub" + tag, {a, b}, [](const TensorList& t) { return one(sub(t[0], t[1])); }});
    cases.push_back({"mul" + tag, {a, b}, [](const TensorList& t) { return one(mul(t[0], t[1])); }});
    cases.push_back({"div" + tag, {a, bp}, [](const TensorList& t) { return one(div(t[0], t[1])); }});
    cases.push_back({"pow" + tag, {ap, b}, [](const TensorList& t) { return one(pow(t[0], t[1])); }});
    cases.push_back({"maximum" + tag, {a, b}, [](const TensorList& t) { return one(maximum(t[0], t[1])); }});
    cases.push_back({"minimum" + tag, {a, b}, [](const TensorList& t) { return one(minimum(t[0], t[1])); }});
    cases.push_back({"eq/ne/lt/le/gt/ge" + tag,
                     {a, b},
                     [](const TensorList& t) {
                       return TensorList{eq(t[0], t[1]), ne(t[0], t[1]), lt(t[0], t[1]),
                                         le(t[0], t[1]), gt(t[0], t[1]), ge(t[0], t[1])};
                     },
                     false});
    cases.push_back(
        {"where" + tag, {In{sa, Kind::Mask}, a, b}, [](const TensorList& t) { return one(where(t[0], t[1], t[2])); }});
  }
  cases.push_back({"logical_and/or/not",
                   {In{{4, 6}, Kind::Mask}, In{{1, 6}, Kind::Mask}},
                   [](const TensorList& t) {
                     return TensorList{logical_and(t[0], t[1]), logical_or(t[0], t[1]), logical_not(t[0])};
                   },
                   false});
  cases.push_back({"masked_fill", {In{{4, 6}}, In{{4, 6}, Kind::Mask}}, [](const TensorList& t) {
                     return one(masked_fill(t[0], t[1], -2.5));
                   }});
  cases.push_back({"expand+copy_", {In{{1, 6}}}, [](const TensorList& t) {
                     Tensor dst = zeros({4, 6}, {.dtype = t[0].dtype(), .device = t[0].device()});
                     {
                       NoGradGuard ng;
                       dst.copy_(t[0].detach());
                     }
                     return TensorList{dst, t[0].expand({4, 6}).contiguous()};
                   }});
  cases.push_back({"fill_",
                   {In{{4, 6}}},
                   [](const TensorList& t) {
                     Tensor d = t[0].detach().clone();
                     d.fill_(0.375);
                     return one(d);
                   },
                   false});
  const std::vector<std::pair<std::string, std::function<double(double, double)>>> refs = {
      {"add ", [](double a, double b) { return a + b; }},
      {"sub ", [](double a, double b) { return a - b; }},
      {"mul ", [](double a, double b) { return a * b; }},
      {"div ", [](double a, double b) { return a / b; }},
      {"pow ", [](double a, double b) { return std::pow(a, b); }},
      {"maximum ", [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }},
      {"minimum ", [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }},
  };
  for (OpCase& c : cases)
    for (const auto& [prefix, f] : refs)
      if (c.op.rfind(prefix, 0) == 0) c.reference = binary_reference(f);
  return cases;
}

std::vector<OpCase> reductions_cases() {
  const In x{{4, 5, 6}};
  std::vector<OpCase> cases = {
      {"sum all", {x}, [](const TensorList& a) { return one(sum(a[0])); }},
      {"sum dim 1", {x}, [](const TensorList& a) { return one(sum(a[0], {1})); }},
      {"sum dims 0,2 keepdim",
       {x},
       [](const TensorList& a) {
         return one(sum(a[0], {0, 2}, true));
       }},
      {"sum large", {In{{3, 3000}}}, [](const TensorList& a) { return one(sum(a[0], {1})); }},
      {"sum all large", {In{{257, 300}}}, [](const TensorList& a) { return one(sum(a[0])); }},
      {"mean", {x}, [](const TensorList& a) { return one(mean(a[0], {-1})); }},
      {"var", {x}, [](const TensorList& a) { return one(var(a[0], {1})); }},
      {"std",
       {x},
       [](const TensorList& a) {
         return one(asc::std(a[0], {0, 2}));
       }},
      {"max dim",
       {x},
       [](const TensorList& a) {
         auto r = max(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"min dim",
       {x},
       [](const TensorList& a) {
         auto r = min(a[0], -1);
         return TensorList{r.values, r.indices};
       }},
      {"amax",
       {x},
       [](const TensorList& a) {
         return one(amax(a[0], {0, 1}));
       }},
      {"amin", {x}, [](const TensorList& a) { return one(amin(a[0])); }},
      {"max/min of all",
       {x},
       [](const TensorList& a) {
         return TensorList{max(a[0]), min(a[0])};
       }},
      {"argmax/argmin of all",
       {x},
       [](const TensorList& a) {
         return TensorList{argmax(a[0]), argmin(a[0])};
       },
       false},
      {"argmax/argmin",
       {x},
       [](const TensorList& a) {
         return TensorList{argmax(a[0], 2), argmin(a[0], 0)};
       },
       false},
      {"logsumexp", {x}, [](const TensorList& a) { return one(logsumexp(a[0], {-1})); }},
      {"norm p=2", {x}, [](const TensorList& a) { return one(norm(a[0], 2.0, {1})); }},
      {"norm p=1", {x}, [](const TensorList& a) { return one(norm(a[0], 1.0, {2})); }},
      {"norm p=inf", {x}, [](const TensorList& a) { return one(norm(a[0], INFINITY, {2})); }},
      // Long rows take the block-per-row kernels (n > 256); a long middle dimension the strided max/min kernel.
      {"max dim large",
       {In{{3, 2000}}},
       [](const TensorList& a) {
         auto r = max(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"min middle dim large",
       {In{{4, 700, 3}}},
       [](const TensorList& a) {
         auto r = min(a[0], 1);
         return TensorList{r.values, r.indices};
       }},
      {"logsumexp large", {In{{3, 2000}}}, [](const TensorList& a) { return one(logsumexp(a[0], {-1})); }},
      // prod: few elements per product. On the fuzz test's values (NaN, ±inf, ±1e300, subnormals) a product of many
      // depends on the order of its multiplications (1e300 · 1e300 · 4e-320 is inf or 4e280), which no reference can
      // follow; with two elements there is one multiplication, and several products rarely meet three such values.
      with_reference({"prod all", {In{{2, 1}}}, [](const TensorList& a) { return one(prod(a[0])); }},
                     [](const TensorList& a) { return one(reduce_reference(a[0], std::nullopt, false, product)); }),
      with_reference({"prod dim 1", {In{{6, 3, 5}}}, [](const TensorList& a) { return one(prod(a[0], 1)); }},
                     [](const TensorList& a) { return one(reduce_reference(a[0], 1, false, product)); }),
      with_reference(
          {"prod dim -1 keepdim", {In{{30, 4}}}, [](const TensorList& a) { return one(prod(a[0], -1, true)); }},
          [](const TensorList& a) { return one(reduce_reference(a[0], -1, true, product)); }),
      // any / all: floating (NaN counts as true), bool and int64 inputs; the bool results as the first input's dtype
      // (the table's outputs are compared in it).
      with_reference({"any/all",
                      {In{{4, 3, 5}, Kind::Normal, 0, false}, In{{4, 3, 5}, Kind::Mask}, In{{4, 3, 5}, Kind::Int, 2}},
                      [](const TensorList& a) {
                        const DType dt = a[0].dtype();
                        return TensorList{any(a[0], 1).to(dt),       all(a[0], -1, true).to(dt), all(a[1], 1).to(dt),
                                          any(a[1], 0, true).to(dt), any(a[2], 1).to(dt),        all(a[2], 0).to(dt),
                                          any(a[0]).to(dt),          all(a[1]).to(dt),           any(a[2]).to(dt)};
                      },
                      false},
                     [](const TensorList& a) {
                       return TensorList{reduce_reference(a[0], 1, false, any_nonzero),
                                         reduce_reference(a[0], -1, true, all_nonzero),
                                         reduce_reference(a[1], 1, false, all_nonzero),
                                         reduce_reference(a[1], 0, true, any_nonzero),
                                         reduce_reference(a[2], 1, false, any_nonzero),
                                         reduce_reference(a[2], 0, false, all_nonzero),
                                         reduce_reference(a[0], std::nullopt, false, any_nonzero),
                                         reduce_reference(a[1], std::nullopt, false, all_nonzero),
                                         reduce_reference(a[2], std::nullopt, false, any_nonzero)};
                     }),
  };
  return cases;
}

std::vector<OpCase> matmul_nn_cases() {
  std::vector<OpCase> cases = {
      {"matmul 2d", {In{{5, 7}}, In{{7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"matmul batched", {In{{2, 5, 7}}, In{{2, 7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"matmul broadcast", {In{{2, 5, 7}}, In{{7, 3}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      {"linear", {In{{4, 6}}, In{{3, 6}}, In{{3}}}, [](const TensorList& a) { return one(linear(a[0], a[1], a[2])); }},
      // bias_activation_dropout outside training: act(x + bias) (the dropout draws are random_cases'); binary_reference
      // broadcasts the (7) bias over x's rows
      {"bias_activation_dropout gelu eval",
       {In{{5, 7}}, In{{7}}},
       [](const TensorList& a) { return one(bias_activation_dropout(a[0], a[1], Activation::Gelu, 0.3, false)); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       true,
       binary_reference([](double x, double b) { return 0.5 * (x + b) * (1 + std::erf((x + b) / std::sqrt(2.0))); })},
      {"bias_activation_dropout relu eval",
       {In{{5, 7}}, In{{7}}},
       [](const TensorList& a) { return one(bias_activation_dropout(a[0], a[1], Activation::Relu, 0.0)); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       true,
       binary_reference([](double x, double b) { return std::isnan(x + b) || x + b > 0 ? x + b : 0.0; })},
      {"bias_activation_dropout gelu_tanh eval",
       {In{{5, 7}}, In{{7}}},
       [](const TensorList& a) { return one(bias_activation_dropout(a[0], a[1], Activation::GeluTanh, 0.5, false)); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       true,
       binary_reference([](double x, double b) {
         const double z = x + b;
         return 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
       })},
      {"bias_activation_dropout silu no bias",
       {In{{5, 7}}},
       [](const TensorList& a) { return one(bias_activation_dropout(a[0], Tensor(), Activation::Silu, 0.2, false)); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       true,
       unary_reference([](double z) { return z / (1 + std::exp(-z)); })},
      {"softmax", {In{{4, 9}}}, [](const TensorList& a) { return one(softmax(a[0], -1)); }},
      {"softmax dim 0", {In{{4, 9}}}, [](const TensorList& a) { return one(softmax(a[0], 0)); }},
      {"softmax masked",
       {In{{4, 9}}, In{{4, 9}, Kind::Mask}},
       [](const TensorList& a) { return one(softmax(a[0], -1, a[1])); }},
      {"log_softmax", {In{{4, 9}}}, [](const TensorList& a) { return one(log_softmax(a[0], -1)); }},
      // not gradchecked: a masked entry's output is -inf, so its finite differences are NaN
      {"log_softmax masked",
       {In{{4, 9}}, In{{4, 9}, Kind::Mask}},
       [](const TensorList& a) { return one(log_softmax(a[0], -1, a[1])); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       false},
      {"cross_entropy",
       {In{{6, 5}}, In{{6}, Kind::Index, 5}},
       [](const TensorList& a) { return one(cross_entropy(a[0], a[1])); }},
      {"cross_entropy smoothing+ignore+sum",
       {In{{6, 5}}, In{{6}, Kind::Index, 5}},
       [](const TensorList& a) {
         Tensor t = where(eq(a[1], 2.0), full({6}, -100.0, {.dtype = kInt64, .device = a[1].device()}), a[1]);
         return one(cross_entropy(a[0], t, {.label_smoothing = 0.1, .reduction = Reduction::Sum}));
       }},
      // nll_loss reads its input as given (log-probabilities in use; any values here). The mean and the sum count
      // two targets (the others ignored), whose two terms add alike in any order, also for the fuzz test's ±1e300.
      with_reference({"nll_loss",
                      {In{{6, 5}}, In{{6}, Kind::Index, 5}},
                      [](const TensorList& a) {
                        const Tensor w = tensor(kNllWeights, {5}).to(a[0].dtype()).to(a[0].device());
                        const Tensor two = first_two_targets(a[1]);
                        return TensorList{nll_loss(a[0], a[1], {.reduction = Reduction::None}),
                                          nll_loss(a[0], two, {.weight = w}),
                                          nll_loss(a[0], two, {.reduction = Reduction::Sum})};
                      }},
                     [](const TensorList& a) {
                       const Tensor two = first_two_targets(a[1]);
                       return TensorList{nll_reference(a[0], a[1], {}, -100, Reduction::None),
                                         nll_reference(a[0], two, kNllWeights, -100, Reduction::Mean),
                                         nll_reference(a[0], two, {}, -100, Reduction::Sum)};
                     }),
      with_reference(
          {"nll_loss (N, C, d) weighted, ignore_index, none",
           {In{{2, 5, 3}}, In{{2, 3}, Kind::Index, 5}},
           [](const TensorList& a) {
             const Tensor w = tensor(kNllWeights, {5}).to(a[0].dtype()).to(a[0].device());
             return one(nll_loss(a[0], a[1], {.weight = w, .ignore_index = 2, .reduction = Reduction::None}));
           }},
          [](const TensorList& a) { return one(nll_reference(a[0], a[1], kNllWeights, 2, Reduction::None)); }),
      {"mse_loss", {In{{4, 6}}, In{{4, 6}}}, [](const TensorList& a) { return one(mse_loss(a[0], a[1])); }},
      {"layer_norm",
       {In{{4, 8}}, In{{8}}, In{{8}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {8}, a[1], a[2])); }},
      {"layer_norm no affine", {In{{3, 4, 8}}}, [](const TensorList& a) { return one(layer_norm(a[0], {8})); }},
      {"rms_norm", {In{{4, 8}}, In{{8}}}, [](const TensorList& a) { return one(rms_norm(a[0], {8}, a[1])); }},
      // Long rows (block per row), many rows (layer norm's weight gradient in several row chunks), a GEMM whose
      // sizes are not multiples of anything.
      {"matmul odd sizes", {In{{33, 65}}, In{{65, 17}}}, [](const TensorList& a) { return one(matmul(a[0], a[1])); }},
      // a product with its bias (the rows start as the bias, the GEMM adds into them), sizes not multiples of
      // anything; its reference in plain loops
      with_reference({"addmm odd sizes",
                      {In{{33, 65}}, In{{65, 17}}, In{{17}}},
                      [](const TensorList& a) { return one(addmm(a[2], a[0], a[1])); }},
                     [](const TensorList& a) { return one(addmm_reference(a[0], a[1], a[2])); }),
      with_reference({"linear 3-d odd sizes",
                      {In{{2, 19, 65}}, In{{17, 65}}, In{{17}}},
                      [](const TensorList& a) { return one(linear(a[0], a[1], a[2])); }},
                     [](const TensorList& a) {
                       return one(addmm_reference(a[0].reshape({38, 65}), a[1].t(), a[2]).reshape({2, 19, 17}));
                     }),
      {"softmax long rows", {In{{3, 700}}}, [](const TensorList& a) { return one(softmax(a[0], -1)); }},
      // past the 8 elements a thread of the CUDA row kernels keeps in registers (4096 with 512 threads)
      {"softmax rows past the register cache",
       {In{{1, 4200}}},
       [](const TensorList& a) { return one(softmax(a[0], -1)); }},
      {"log_softmax masked long rows",
       {In{{3, 700}}, In{{3, 700}, Kind::Mask}},
       [](const TensorList& a) { return one(log_softmax(a[0], -1, a[1])); }},
      {"cross_entropy many classes",
       {In{{4, 600}}, In{{4}, Kind::Index, 600}},
       [](const TensorList& a) { return one(cross_entropy(a[0], a[1])); }},
      {"layer_norm long rows",
       {In{{3, 1000}}, In{{1000}}, In{{1000}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {1000}, a[1], a[2])); }},
      {"layer_norm many rows",
       {In{{600, 24}}, In{{24}}, In{{24}}},
       [](const TensorList& a) { return one(layer_norm(a[0], {24}, a[1], a[2])); }},
      {"rms_norm long rows",
       {In{{3, 1000}}, In{{1000}}},
       [](const TensorList& a) { return one(rms_norm(a[0], {1000}, a[1])); }},
  };
  return cases;
}

std::vector<OpCase> geometry_index_cases() {
  std::vector<OpCase> cases = {
      {"topk",
       {In{{4, 9}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 3);
         return TensorList{r.values, r.indices};
       }},
      {"topk smallest no-diag",
       {In{{2, 6, 6}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 2, {.largest = false, .exclude_diagonal = true});
         return TensorList{r.values, r.indices};
       }},
      {"topk masked",
       {In{{2, 6, 6}}, In{{2, 6, 6}, Kind::Mask}},
       [](const TensorList& a) {
         Tensor m = logical_or(a[1], eye(6, {.dtype = kBool, .device = a[1].device()}));  // >= 1 selectable per row
         auto r = topk(a[0], 1, {.mask = m});
         return TensorList{r.values, r.indices};
       }},
      {"pairwise_sqdist",
       {In{{5, 3}}, In{{4, 3}}},
       [](const TensorList& a) { return one(pairwise_sqdist(a[0], a[1])); }},
      {"cosine_similarity_matrix",
       {In{{5, 3}}, In{{4, 3}}},
       [](const TensorList& a) { return one(cosine_similarity_matrix(a[0], a[1])); }},
      {"normalize_rows", {In{{5, 4}}}, [](const TensorList& a) { return one(normalize_rows(a[0])); }},
      {"row_standardize", {In{{5, 6}}}, [](const TensorList& a) { return one(row_standardize(a[0])); }},
      {"row_standardize masked",
       {In{{5, 6}}, In{{5, 6}, Kind::Mask}},
       [](const TensorList& a) { return one(row_standardize(a[0], a[1])); }},
      // not gradchecked: the surrogate is by design not the step's derivative (0 almost everywhere)
      {"hard_gate surrogate",
       {In{{5, 6}}, In{{1, 6}}},
       [](const TensorList& a) {
         return one(hard_gate(a[0], a[1], {.mode = GateBackward::Surrogate, .surrogate = "sigmoid", .width = 2.0}));
       },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       false},
      // Long rows: 64 / 128 threads per row, lists of 32, and k > 32 in two passes over the row.
      {"topk long rows k=20",
       {In{{3, 1500}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 20);
         return TensorList{r.values, r.indices};
       }},
      {"topk long rows k=40",
       {In{{2, 3000}}},
       [](const TensorList& a) {
         auto r = topk(a[0], 40);
         return TensorList{r.values, r.indices};
       }},
      {"topk masked long rows",
       {In{{2, 1500}}, In{{2, 1500}, Kind::Mask}},
       [](const TensorList& a) {
         auto r = topk(a[0], 5, {.largest = false, .mask = a[1]});
         return TensorList{r.values, r.indices};
       }},
      {"normalize_rows long rows", {In{{4, 700}}}, [](const TensorList& a) { return one(normalize_rows(a[0])); }},
      {"row_standardize masked long rows",
       {In{{4, 700}}, In{{4, 700}, Kind::Mask}},
       [](const TensorList& a) { return one(row_standardize(a[0], a[1])); }},
      {"index_select",
       {In{{5, 6}}, In{{4}, Kind::Index, 5}},
       [](const TensorList& a) { return one(index_select(a[0], 0, a[1])); }},
      {"gather",
       {In{{5, 6}}, In{{5, 3}, Kind::Index, 6}},
       [](const TensorList& a) { return one(gather(a[0], 1, a[1])); }},
      {"scatter_add",
       {In{{5, 6}}, In{{5, 3}, Kind::Index, 6}, In{{5, 3}}},
       [](const TensorList& a) { return one(scatter_add(a[0], 1, a[1], a[2])); }},
      // scatter (out of place), both forms, along both dims; src of the index's shape, the index smaller than x.
      with_reference({"scatter",
                      {In{{5, 6}}, In{{3, 6}}, In{{5, 3}}},
                      [](const TensorList& a) {
                        const Device dev = a[0].device();
                        return TensorList{scatter(a[0], 0, scatter_index(0, dev), a[1]),
                                          scatter(a[0], 1, scatter_index(1, dev), a[2]),
                                          scatter(a[0], 1, scatter_index(1, dev), -1.5)};
                      }},
                     [](const TensorList& a) {
                       return TensorList{scatter_reference(a[0], 0, a[1]), scatter_reference(a[0], 1, a[2]),
                                         scatter_reference(a[0], 1, Tensor(), -1.5)};
                     }),
      {"embedding",
       {In{{7, 4}}, In{{3, 2}, Kind::Index, 7}},
       [](const TensorList& a) { return one(embedding(a[0], a[1])); }},
      // 60 indices into a 4-wide table: the backward's index_add takes the atomic path.
      {"embedding many indices",
       {In{{7, 4}}, In{{10, 6}, Kind::Index, 7}},
       [](const TensorList& a) { return one(embedding(a[0], a[1])); }},
      {"one_hot", {In{{6}, Kind::Index, 4}}, [](const TensorList& a) { return one(one_hot(a[0], 4)); }, false},
      {"cat",
       {In{{3, 4}}, In{{2, 4}}},
       [](const TensorList& a) {
         return one(cat({a[0], a[1]}, 0));
       }},
      {"stack",
       {In{{3, 4}}, In{{3, 4}}},
       [](const TensorList& a) {
         return one(stack({a[0], a[1]}, 1));
       }},
      {"split/chunk",
       {In{{6, 4}}},
       [](const TensorList& a) {
         TensorList s = split(a[0], 2, 0), c = chunk(a[0], 2, 1);
         s.insert(s.end(), c.begin(), c.end());
         return s;
       }},
      {"permute+reshape",
       {In{{2, 3, 4}}},
       [](const TensorList& a) {
         return one(a[0].permute({2, 0, 1}).reshape({4, 6}));
       }},
  };
  return cases;
}

// ---- attention: dense (fused), ASCender, sparse ---------------------------------------------------------------

std::vector<OpCase> attention_cases() {
  const In q{{2, 2, 5, 4}};
  const std::vector<View> two = {View::Contig, View::Transposed};
  std::vector<OpCase> cases = {
      {"sdpa",
       {q, q, q},
       [](const TensorList& a) { return one(scaled_dot_product_attention(a[0], a[1], a[2])); },
       true,
       two},
      {"sdpa causal + bias",
       {q, q, q, In{{1, 2, 5, 5}}},
       [](const TensorList& a) {
         return one(scaled_dot_product_attention(a[0], a[1], a[2], {.bias = a[3], .causal = true}));
       },
       true,
       two},
      {"sdpa key mask",
       {q, q, q, In{{2, 1, 1, 5}, Kind::Mask}},
       [](const TensorList& a) {
         // every row keeps key 0, so no row is empty
         Tensor keep = logical_or(a[3], eq(arange(0, 5, 1, {.dtype = kInt64, .device = a[3].device()}), 0.0));
         return one(scaled_dot_product_attention(a[0], a[1], a[2], {.keep_mask = keep}));
       },
       true,
       two},
  };
  return cases;
}

// ASCender's core with fixed learnable scalars (constants here: test_ascender_attention checks their gradients).
AscenderCoreArgs ascender_args(const Tensor& like, int64_t H, int64_t window) {
  AscenderCoreArgs a;
  a.k = std::vector<int64_t>(H, 3);
  a.tau_sep = std::vector<double>(H, 1.3);
  a.tau_coh = std::vector<double>(H, 0.9);
  a.alpha_align = std::vector<double>(H, 2.0);
  a.alpha_coh = std::vector<double>(H, 1.5);
  auto c = [&](std::vector<double> v) { return tensor(v, {H}).to(like.dtype()).to(like.device()); };
  a.omega_align = c({0.7, 0.6}), a.omega_sep = c({0.5, 0.4}), a.omega_coh = c({0.6, 0.3});
  a.lambda_align = c({1.1, 0.9}), a.lambda_sep = c({0.8, 1.2}), a.lambda_coh = c({1.3, 0.7});
  a.delta = c({0.2, 0.15}), a.kappa = c({2.0, 2.5}), a.tau_score = c({1.0, 0.8});
  a.window = window, a.global_tokens = window > 0 ? 1 : 0;
  a.row_block = 4;  // several of the CPU kernel's row blocks at this short length
  return a;
}

std::vector<OpCase> ascender_cases() {
  const In h{{1, 2, 8, 4}}, l{{1, 2, 8, 3}};
  const std::vector<View> two = {View::Contig, View::Transposed};
  auto run = [](int64_t window) {
    return [window](const TensorList& a) {
      return one(ascender_attention(a[0], a[1], a[2], a[3], a[4], a[5], ascender_args(a[0], 2, window)));
    };
  };
  // half: the neighbourhoods are top-k selections that 16-bit rounding moves (test_ascender_attention checks the
  // tensor-core kernels on inputs whose selections rounding cannot move)
  return {{"ascender_attention", {h, h, h, h, l, l}, run(0), true, two, false},
          {"ascender_attention windowed", {h, h, h, h, l, l}, run(3), true, two, false}};
}

std::vector<OpCase> sparse_cases() {
  const In q{{1, 2, 8, 4}};
  const std::vector<View> two = {View::Contig, View::Transposed};
  return {
      {"sparse_attention window + global",
       {q, q, q},
       [](const TensorList& a) {
         const SparsePattern p = pattern_union({local_window_pattern(8, 2, false), global_tokens_pattern(8, 1, false)});
         return one(sparse_attention(a[0], a[1], a[2], p));
       },
       true,
       two},
      {"sparse_attention causal strided, key padding",
       {q, q, q, In{{1, 8}, Kind::Mask}},
       [](const TensorList& a) {
         Tensor keep = logical_or(a[3], eq(arange(0, 8, 1, {.dtype = kInt64, .device = a[3].device()}), 0.0));
         return one(sparse_attention(a[0], a[1], a[2], strided_pattern(8, 3, true), keep));
       },
       true,
       two},
      // A hierarchical pattern's keys: x and its block means over the real tokens (on the CPU one fused pass, on CUDA
      // the composition), blocks of 4 over 11 tokens (the last of 3).
      {"hierarchical_keys, key padding",
       {In{{2, 2, 11, 3}}, In{{2, 11}, Kind::Mask}},
       [](const TensorList& a) { return one(hierarchical_keys(a[0], 4, a[1])); },
       true,
       {View::Contig, View::Transposed, View::Sliced},
       true,
       1e-3,
       true,
       [](const TensorList& a) {
         const int64_t B = 2, H = 2, T = 11, d = 3, b = 4, nb = 3;
         const auto x = a[0].to(kFloat64).to_vector<double>();
         const auto keep = a[1].to_vector<bool>();
         std::vector<double> out(static_cast<size_t>(B * H * (T + nb) * d), 0.0);
         for (int64_t i = 0; i < B; ++i)
           for (int64_t h = 0; h < H; ++h) {
             const int64_t bh = i * H + h;
             for (int64_t t = 0; t < T; ++t)
               for (int64_t c = 0; c < d; ++c) out[(bh * (T + nb) + t) * d + c] = x[(bh * T + t) * d + c];
             for (int64_t m = 0; m < nb; ++m) {
               int64_t n = 0;
               for (int64_t t = m * b; t < std::min(T, m * b + b); ++t) n += keep[i * T + t];
               for (int64_t c = 0; c < d; ++c) {
                 double s = 0;
                 for (int64_t t = m * b; t < std::min(T, m * b + b); ++t)
                   if (keep[i * T + t]) s += x[(bh * T + t) * d + c];
                 out[(bh * (T + nb) + T + m) * d + c] = s / double(std::max<int64_t>(n, 1));
               }
             }
           }
         return one(tensor(std::span<const double>(out), {B, H, T + nb, d}, {.dtype = kFloat64}));
       }},
      // The clustered pattern built from soft assignments (softmax rows), joined with a window: on the CPU through
      // its block-view kernels, on CUDA through the device's.
      {"sparse_attention clustered union",
       {q, q, q, In{{1, 2, 8, 3}, Kind::Normal, 0, false}},
       [](const TensorList& a) {
         NoGradGuard ng;
         const Tensor assign = softmax(mul(a[3].detach(), 3.0), -1);
         const SparsePattern p = clustered_union(local_window_pattern(8, 1, false), assign, 0.4, false, true);
         return one(sparse_attention(a[0], a[1], a[2], p));
       },
       false,
       two,
       false},
  };
}

// ---- the firing perceptron's ops ----------------------------------------------------------------------------------

std::vector<OpCase> firing_cases() {
  const In Z{{6, 4}}, SP{{4}}, f{{4, 2}};
  auto gate = [](GateBackward mode) {
    return [mode](const TensorList& a) {
      FiringOutput o = firing_output(a[0], a[1], a[2], {.mode = mode, .surrogate = "sigmoid", .width = 2.0});
      return TensorList{o.Y, o.F};
    };
  };
  // A firing layer trained two steps by SGD with rule B (the rule's fused ops, the clips), with and without fuse_sgd;
  // W from the first input (non-negative, in the rule's range), the batch from the second.
  auto rule_b_steps = [](bool fuse) {
    return [fuse](const TensorList& a) {
      auto layer = std::make_shared<nn::FiringLinear>(nn::FiringOptions(6, 4).init(nn::FiringInit::NonNegative));
      layer->to(a[0].dtype());
      layer->to(a[0].device());
      {
        NoGradGuard ng;
        layer->W.copy_(mul(abs(a[0].detach()), 0.3));
      }
      optim::SGD opt(layer->parameters(), {.lr = 0.1});
      opt.add_local_rule(optim::rule_b(*layer, {.eta_w = 0.05, .eta_f = 0.05, .r_target = 0.3, .fuse_sgd = fuse}));
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        Tensor y = (*layer)(a[1].detach());
        sum(mul(y, y)).backward();
        opt.step();
      }
      return TensorList{layer->W.detach(), layer->f.detach(), layer->SP.detach()};
    };
  };
  const std::vector<View> contig = {View::Contig};
  return {
      {"firing_output exact", {Z, SP, f}, gate(GateBackward::None), true, {View::Contig, View::Transposed}, false},
      // not gradchecked: the surrogate is not the step's derivative (the exact gate's backward is)
      {"firing_output surrogate",
       {Z, SP, f},
       gate(GateBackward::Surrogate),
       true,
       {View::Contig, View::Transposed},
       false,
       1e-3,
       false},
      {"firing_batch_sums + rule_b_coef",
       {Z, SP, Z, SP},
       [](const TensorList& a) {
         const Tensor F = ge(a[0], a[1]).to(a[0].dtype());
         const FiringBatchSums s = firing_batch_sums(a[0], F, a[1]);
         return TensorList{s.fz2, s.fired, s.margin, firing_rule_b_coef(a[0], F, 0.1),
                           firing_rule_b_coef(a[0], F, 0.1, a[2], a[3])};
       },
       false,
       contig,
       false},
      {"firing_weight_update_",
       {In{{4, 5}}, In{{4}}, In{{6, 4}}, In{{6, 5}}},
       [](const TensorList& a) {
         Tensor W = a[0].detach().clone();
         firing_weight_update_(W, a[1], a[2], a[3]);
         return one(W);
       },
       false,
       contig,
       false},  // float32 / float64 only: an optimizer-side update of float32 (master) weights
      {"rule B steps", {In{{4, 6}}, In{{5, 6}}}, rule_b_steps(false), false, contig, false},
      {"rule B steps, fuse_sgd", {In{{4, 6}}, In{{5, 6}}}, rule_b_steps(true), false, contig, false},
      {"ssm_scan",
       {In{{2, 5, 3}, Kind::Positive}, In{{2, 5, 3}}, In{{3}}},
       [](const TensorList& a) { return one(ssm_scan(mul(a[0], 0.6), a[1], a[2])); },
       true,
       contig},
      {"ssm_scan rms_norm",
       {In{{2, 5, 3}, Kind::Positive}, In{{2, 5, 3}}, In{{2, 3}}},
       [](const TensorList& a) { return one(ssm_scan(mul(a[0], 0.6), a[1], a[2], true)); },
       true,
       contig},
  };
}

// ---- random draws and optimizer steps
// --------------------------------------------------------------------------------

std::vector<OpCase> random_cases() {
  // The first input gives the dtype, device and shape; each call seeds its own generator, so CPU and GPU draw the
  // same numbers (the CUDA stream is the CPU's) and a gradcheck's repeated calls draw the same mask.
  const In x{{4, 6}, Kind::Normal, 0, false};
  const std::vector<View> contig = {View::Contig};
  auto opts = [](const Tensor& t) { return TensorOptions{.dtype = t.dtype(), .device = t.device()}; };
  return {
      {"rand",
       {x},
       [=](const TensorList& a) {
         Generator g(5);
         return one(rand(a[0].shape(), opts(a[0]), &g));
       },
       false,
       contig,
       false,
       0},
      {"randn",
       {x},
       [=](const TensorList& a) {
         Generator g(6);
         return one(randn(a[0].shape(), opts(a[0]), &g));
       },
       false,
       contig,
       false,
       0},
      {"randint",
       {x},
       [](const TensorList& a) {
         Generator g(7);
         return one(randint(-3, 50, a[0].shape(), {.dtype = kInt64, .device = a[0].device()}, &g));
       },
       false,
       contig,
       false,
       0},
      {"dropout",
       {In{{4, 6}}},
       [](const TensorList& a) {
         Generator g(8);
         return one(dropout(a[0], 0.3, true, &g));
       },
       true,
       contig,
       false,
       0},
      // dropout(gelu(x + bias)) with the same generator state is the same mask (tests/test_nn_functional.cpp)
      {"bias_activation_dropout",
       {In{{5, 7}}, In{{7}}},
       [](const TensorList& a) {
         Generator g(9);
         return one(bias_activation_dropout(a[0], a[1], Activation::Gelu, 0.3, true, &g));
       },
       true,
       contig,
       false,
       0},
      {"bias_activation_dropout silu no bias",
       {In{{5, 7}}},
       [](const TensorList& a) {
         Generator g(10);
         return one(bias_activation_dropout(a[0], Tensor(), Activation::Silu, 0.5, true, &g));
       },
       true,
       contig,
       false,
       0},
  };
}

std::vector<OpCase> optimizer_cases() {
  const In p{{4, 6}, Kind::Normal, 0, false};
  const std::vector<View> contig = {View::Contig};
  // half false below: optimizers update float32 / float64 parameters (a 16-bit model trains through float32 masters)
  // Three steps from the first input with gradients (step + 1) times the second.
  auto steps = [](auto make) {
    return [make](const TensorList& a) {
      Tensor w = a[0].detach().clone().set_requires_grad(true);
      auto opt = make(std::vector<Tensor>{w});
      for (int step = 0; step < 3; ++step) {
        w.set_grad(mul(a[1].detach(), double(step + 1)));
        opt.step();
      }
      return one(w.detach());
    };
  };
  return {
      {"SGD momentum + weight decay",
       {p, p},
       steps([](std::vector<Tensor> w) { return optim::SGD(w, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}); }),
       false,
       contig,
       false},
      {"Adam amsgrad",
       {p, p},
       steps([](std::vector<Tensor> w) { return optim::Adam(w, {.lr = 0.01, .amsgrad = true}); }),
       false,
       contig,
       false},
      {"AdamW",
       {p, p},
       steps([](std::vector<Tensor> w) { return optim::AdamW(w, {.lr = 0.01}); }),
       false,
       contig,
       false},
      {"RMSprop centered",
       {p, p},
       steps([](std::vector<Tensor> w) { return optim::RMSprop(w, {.lr = 0.01, .momentum = 0.5, .centered = true}); }),
       false,
       contig,
       false},
  };
}

}  // namespace

const std::vector<Family>& op_table() {
  static const std::vector<Family> table = {
      {"unary", unary_cases()},
      {"binary", binary_cases()},
      {"reductions", reductions_cases()},
      {"matmul/nn", matmul_nn_cases()},
      {"geometry/index", geometry_index_cases()},
      {"attention", attention_cases()},
      {"ascender", ascender_cases()},
      {"sparse", sparse_cases()},
      {"firing", firing_cases()},
      {"random", random_cases()},
      {"optimizers", optimizer_cases()},
  };
  return table;
}

const Family& family(const std::string& name) {
  for (const Family& f : op_table())
    if (f.name == name) return f;
  ASC_THROW("op table: no family '{}'", name);
}

}  // namespace asc::optable
