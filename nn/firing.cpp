#include "nn/firing.h"

#include <cmath>
#include <limits>
#include <span>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/init.h"
#include "ops/firing.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {
const char* backward_name(GateBackward b) {
  switch (b) {
    case GateBackward::None: return "exact";
    case GateBackward::StraightThrough: return "straight_through";
    case GateBackward::Surrogate: return "surrogate";
  }
  return "?";
}
}  // namespace

FiringLayer::FiringLayer(const char* type, const FiringOptions& o, int64_t w_cols) : Module(type), options(o) {
  ASC_CHECK(o.in_features() > 0 && o.neurons() > 0 && o.fan_out() > 0,
            "{}: in_features {}, neurons {} and fan_out {} must be positive", type, o.in_features(), o.neurons(),
            o.fan_out());
  ASC_CHECK(std::isfinite(o.surrogate_width()) && o.surrogate_width() > 0,
            "{}: surrogate_width must be positive and finite, got {}", type, o.surrogate_width());
  // SP is made in float32: a threshold beyond float32's range would become ±Inf there.
  ASC_CHECK(std::abs(o.threshold()) <= std::numeric_limits<float>::max(),
            "{}: threshold must be finite (in float32, SP's dtype), got {}", type, o.threshold());
  ASC_CHECK(o.backward() == GateBackward::None || o.backward() == GateBackward::StraightThrough ||
                o.backward() == GateBackward::Surrogate,
            "{}: unknown backward mode {} (None, StraightThrough or Surrogate)", type, static_cast<int>(o.backward()));
  // W (P, in_features) and f (P, fan_out) must have element and byte counts that fit in 64 bits (in float64 too).
  checked_nbytes(checked_numel({o.neurons(), w_cols}, type), sizeof(double), type);
  checked_nbytes(checked_numel({o.neurons(), o.fan_out()}, type), sizeof(double), type);
  if (o.backward() == GateBackward::Surrogate) surrogate(o.surrogate());  // an unknown name fails here, not later
  const int64_t P = o.neurons();
  W = register_parameter("W", empty({P, w_cols}));
  ASC_CHECK(o.init() == FiringInit::Signed || o.init() == FiringInit::NonNegative,
            "{}: unknown FiringInit {} (Signed or NonNegative)", type, static_cast<int>(o.init()));
  const double bound = 1.0 / std::sqrt(static_cast<double>(o.in_features()));
  init::uniform_(W, o.init() == FiringInit::NonNegative ? 0.0 : -bound, bound);
  // The exact gate gives SP no gradient: then it is not trained by the optimizer (no weight decay or momentum on
  // it); only the homeostatic rule moves it.
  SP = register_parameter("SP", full({P}, o.threshold()), o.backward() != GateBackward::None);
  f = register_parameter("f", ones({P, o.fan_out()}));
  ASC_CHECK(o.ssm_rank() >= 0, "{}: ssm_rank must be >= 0 (0: no SSM), got {}", type, o.ssm_rank());
  if (o.ssm_rank() > 0) ssm = register_module("ssm", std::make_shared<CrossPathSSM>(P, o.ssm_rank(), o.ssm()));
  r_bar = register_buffer("r_bar", zeros({P}));
  m_bar = register_buffer("m_bar", zeros({P}));
  f_bar = register_buffer("f_bar", zeros({P}));
}

CrossPathSSM::CrossPathSSM(int64_t P, int64_t R, const SSMOptions& o)
    : Module("CrossPathSSM"), neurons(P), rank(R), options(o) {
  ASC_CHECK(P > 0 && R > 0, "CrossPathSSM: neurons {} and rank {} must be positive", P, R);
  ASC_CHECK(R <= P, "CrossPathSSM: rank {} exceeds the number of neurons {} (the state is low-rank: P_r <= P)", R, P);
  checked_nbytes(checked_numel({P, R}, "CrossPathSSM"), sizeof(double), "CrossPathSSM");  // V_r, V_b, V_o
  ASC_CHECK(0 <= o.a_min && o.a_min <= o.a_max && o.a_max <= 1 && std::isfinite(o.rms_eps) && o.rms_eps > 0,
            "CrossPathSSM: needs 0 <= a_min <= a_max <= 1 and a finite rms_eps > 0; got a_min {}, a_max {}, rms_eps {}",
            o.a_min, o.a_max, o.rms_eps);
  auto init = [](Tensor t, int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(t, -bound, bound);
    return t;
  };
  V_r = register_parameter("V_r", init(empty({P, R}), P));
  W_lambda = register_parameter("W_lambda", init(empty({R, R}), R));
  b_lambda = register_parameter("b_lambda", zeros({R}));
  V_b = register_parameter("V_b", init(empty({P, R}), P));
  V_o = register_parameter("V_o", init(empty({R, P}), R));
  s0 = o.learn_s0 ? register_parameter("s0", zeros({R})) : register_buffer("s0", zeros({R}));
}

Tensor CrossPathSSM::messages(const Tensor& Z, const Tensor& F) {
  ASC_CHECK(Z.defined() && F.defined() && Z.dim() == 3 && Z.size(2) == neurons && F.shape() == Z.shape(),
            "CrossPathSSM: expects Z and F (B, T, {}); got {}, {}", neurons, Z.defined() ? Z.shape() : Shape{},
            F.defined() ? F.shape() : Shape{});
  const Tensor t = F * Z;  // t_t = F_t ⊙ Z_t
  const Tensor a = clamp(sigmoid(matmul(matmul(t, V_r), W_lambda) + b_lambda), options.a_min, options.a_max);
  Tensor u = matmul(F * t, V_b);  // (B, T, R)
  if (options.scale_input) u = u / std::sqrt(static_cast<double>(rank));
  const Tensor s = ssm_scan(a, u, s0.to(a.dtype()), options.rms_norm, options.rms_eps);  // (B, T, R)
  return matmul(s, V_o);                                                                 // t̃ (B, T, P)
}

Tensor CrossPathSSM::forward(const Tensor& Z, const Tensor& F, const Tensor& f) {
  ASC_CHECK(f.defined() && f.dim() == 2 && f.size(0) == neurons, "CrossPathSSM: expects f ({}, alpha), got {}", neurons,
            f.defined() ? f.shape() : Shape{});
  const Tensor tt = messages(Z, F);
  const int64_t B = Z.size(0), T = Z.size(1), P = neurons, A = f.size(1);
  return (F * tt).view({B, T, P, 1}) * f.view({1, 1, P, A});  // F f t̃
}

std::string CrossPathSSM::extra_repr() const {
  return fmt::format("neurons={}, rank={}, a=[{}, {}], scale_input={}, rms_norm={}, learn_s0={}", neurons, rank,
                     options.a_min, options.a_max, options.scale_input, options.rms_norm, options.learn_s0);
}

void FiringLayer::check_rule(bool takes_w_step) const {
  if (!takes_w_step) return;
  ASC_CHECK(type_name() == "FiringLinear" && !options.channels(),
            "{}: rule B's fuse_sgd folds W's gradient dZᵀX into the Oja product; it needs a FiringLinear with "
            "dense input (not channels, not the index path)",
            type_name());
  ASC_CHECK(fused_rule_ == nullptr,
            "{}: a rule B with fuse_sgd is already attached; W's SGD step can be taken "
            "by one rule only",
            type_name());
}

void FiringLayer::attach_rule(std::shared_ptr<FiringObserver> rule, bool takes_w_step) {
  ASC_CHECK(rule != nullptr, "{}: attach_rule: no rule", type_name());
  check_rule(takes_w_step);
  rules_.push_back(rule);
  if (takes_w_step) fused_rule_ = std::move(rule);
}

void FiringLayer::check_state(const StateDict& incoming) const {
  NoGradGuard ng;
  // name, lowest, highest accepted value (NaN and ±Inf never).
  const struct {
    const char* name;
    double lo, hi;
    const char* why;
  } checks[] = {{"r_bar", 0.0, 1.0, "an EMA of firing rates"},
                {"f_bar", 0.0, 1.0, "an EMA of firing rates"},
                {"m_bar", 0.0, HUGE_VAL, "an EMA of non-negative firing margins"},
                {"SP", -HUGE_VAL, HUGE_VAL, "the thresholds"}};
  for (const auto& c : checks) {
    const Tensor* t = incoming.find(c.name);
    if (!t || t->numel() == 0) continue;
    const Tensor v = t->to(kFloat64);
    ASC_CHECK(!has_non_finite(v), "{}.load_state_dict: '{}' ({}) holds NaN or Inf", type_name(), c.name, c.why);
    const double lo = amin(v).item<double>(), hi = amax(v).item<double>();
    ASC_CHECK(lo >= c.lo && hi <= c.hi, "{}.load_state_dict: '{}' ({}) must lie in [{}, {}], got values in [{}, {}]",
              type_name(), c.name, c.why, c.lo, c.hi, lo, hi);
  }
}

void FiringLayer::on_zero_grad() {
  for (const auto& rule : rules_) rule->drop_deferred_gradient();
}

Tensor FiringLayer::fire(const Tensor& Z, const Shape& lead, const Tensor& X, const Tensor& tok,
                         std::shared_ptr<Tensor> dZ) {
  const GateOptions gate{
      .mode = options.backward(), .surrogate = options.surrogate(), .width = options.surrogate_width()};
  Tensor Y;  // (N, P, α), or with the SSM (B, T, P, α)
  Tensor F;  // (N, P), detached
  if (ssm) {
    ASC_CHECK(lead.size() == 2,
              "{}: with the cross-path SSM the input needs a time axis: (B, T, ...), got leading "
              "axes {}",
              type_name(), lead);
    const Tensor Z3 = Z.view({lead[0], lead[1], options.neurons()});
    const Tensor F3 = hard_gate(Z3, SP, gate);  // the gate with this layer's backward
    Y = ssm->forward(Z3, F3, f);
    F = F3.detach().view(Z.shape());
  } else {
    FiringOutput o = firing_output(Z, SP, f, gate);
    Y = o.Y;
    F = o.F;
  }
  last_F_.set(F);
  if (is_training() && !rules_.empty()) {
    // Copies of f and SP: the optimizer moves them before the rule reads the snapshot.
    FiringSnapshot s{X.defined() ? X.detach() : Tensor(),
                     tok,
                     Z.detach(),
                     F,
                     f.detach().clone(),
                     SP.detach().clone(),
                     std::move(dZ)};
    for (const auto& rule : rules_) rule->observe(s);
  }
  Shape out = lead;
  out.push_back(options.neurons());
  if (options.fan_out() > 1) out.push_back(options.fan_out());
  return Y.reshape(out);
}

std::string FiringLayer::extra_repr() const {
  return fmt::format("in_features={}, neurons={}, fan_out={}{}, backward={}{}", options.in_features(),
                     options.neurons(), options.fan_out(), options.channels() ? ", channels" : "",
                     backward_name(options.backward()),
                     options.backward() == GateBackward::Surrogate
                         ? fmt::format(" ({}, width {})", options.surrogate(), options.surrogate_width())
                         : std::string());
}

FiringLinear::FiringLinear(const FiringOptions& o) : FiringLayer("FiringLinear", o, o.in_features()) {}

Tensor FiringLinear::forward(const Tensor& x) {
  const int64_t d = options.in_features(), P = options.neurons();
  if (options.channels()) {
    ASC_CHECK(x.defined() && x.dim() >= 3 && x.size(-2) == d && x.size(-1) == P,
              "FiringLinear: with channels, expected input (..., {}, {}) (neuron p reads channel p), got {}", d, P,
              x.defined() ? x.shape() : Shape{});
    const Shape lead(std::span<const int64_t>(x.shape().begin(), x.shape().end() - 2));
    const Tensor X = x.reshape({-1, d, P});                   // (N, d, P)
    const Tensor Z = sum(X * W.t().reshape({1, d, P}), {1});  // (N, P): Σ_c W[p, c] X[b, c, p]
    return fire(Z, lead, X, Tensor());
  }
  ASC_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == d, "FiringLinear: expected input (..., {}), got {}", d,
            x.defined() ? x.shape() : Shape{});
  const Shape lead(std::span<const int64_t>(x.shape().begin(), x.shape().end() - 1));
  const Tensor X = x.reshape({-1, d});  // (N, d)
  if (defers_w_grad() && is_training() && GradMode::is_enabled() && W.requires_grad()) {
    ASC_CHECK(!fused_rule_->holds_deferred_gradient(),
              "FiringLinear: a second training forward pass after a backward pass, before optimizer.step(): with "
              "rule B's fuse_sgd, W's gradient waits in the rule for the step and would be lost (fuse_sgd does not "
              "support gradient accumulation over several forward passes)");
    auto dZ = std::make_shared<Tensor>();
    return fire(linear_deferred_weight_grad(X, W, dZ), lead, X, Tensor(), dZ);
  }
  return fire(linear(X, W), lead, X, Tensor());  // Z = X Wᵀ (linear's backward writes dW without a transpose)
}

FiringEmbedding::FiringEmbedding(const FiringOptions& o) : FiringLayer("FiringEmbedding", o, o.in_features()) {
  ASC_CHECK(!o.channels(), "FiringEmbedding: channels applies to FiringLinear only");
}

Tensor FiringEmbedding::forward(const Tensor& tok) {
  ASC_CHECK(tok.defined() && tok.dtype() == kInt64, "FiringEmbedding: expected int64 token ids, got {}",
            tok.defined() ? fmt::format("{} {}", tok.dtype(), tok.shape()) : std::string("an undefined tensor"));
  const Tensor ids = tok.reshape({-1}).contiguous();  // (N)
  if (ids.numel() > 0) {
    const int64_t lo = amin(ids).item<int64_t>(), hi = amax(ids).item<int64_t>(), V = options.in_features();
    ASC_CHECK(lo >= 0 && hi < V, "FiringEmbedding: token {} out of range [0, {})", lo < 0 ? lo : hi, V);
  }
  const Tensor Z = index_select(W, 1, ids).t();  // (N, P): W[p, tok_b]; ids are bounds-checked
  return fire(Z, tok.shape(), Tensor(), ids.detach());
}

FiringStack::FiringStack(const std::vector<int64_t>& sizes, const FiringOptions& base) : Module("FiringStack") {
  ASC_CHECK(sizes.size() >= 2, "FiringStack: needs at least {{d, P1}}, got {} sizes", sizes.size());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    FiringOptions o = base;
    o.in_features(sizes[i]).neurons(sizes[i + 1]).fan_out(i + 2 < sizes.size() ? sizes[i + 2] : 1).channels(i > 0);
    layers.push_back(register_module("layer" + std::to_string(i), std::make_shared<FiringLinear>(o)));
  }
}

Tensor FiringStack::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& layer : layers) h = (*layer)(h);
  return h;
}

}  // namespace asc::nn
