#pragma once
// Layers of firing-threshold neurons (docs/firing.md): each of P neurons sums its input, fires when the sum reaches
// its threshold SP, and only then passes f · Z to its α outputs; a silent neuron outputs exactly 0.
//
//   nn::FiringLinear    dense input (..., d), W (P, d):            Z = X Wᵀ
//                       channels(true): input (..., d, P), neuron p reads channel p: Z[b, p] = Σ_c W[p, c] X[b, c, p]
//   nn::FiringEmbedding token input (...) int64 < V, W (P, V):    Z[b, p] = W[p, tok_b]
//   nn::FiringStack     firing layers wired so that neuron g of layer i+1 reads output g of every neuron of layer i
//
// Output (..., P, α), or (..., P) when α = 1; with ssm_rank(R) > 0 the output is the cross-path SSM's F f t̃ over
// the time axis of a (B, T, ·) input (CrossPathSSM, below), while the rules still read the local Y = F f Z.
// The gate's backward is exact (SP gets no gradient) or straight-through
// / a surrogate of the registry (ops/geometry.h). The local learning rules (optim/firing_rules.h) are built from a
// layer's tensors and attach to it in one line (the layer is their FiringRuleHost, ops/firing_rule_link.h):
//
//   auto layer = std::make_shared<asc::nn::FiringLinear>(asc::nn::FiringOptions(64, 128).threshold(0.1));
//   asc::optim::SGD opt(layer->parameters(), {.lr = 1e-2});
//   opt.add_local_rule(asc::optim::rule_b(*layer, {.eta_w = 1e-6, .r_target = 0.1, .w_min = -1,
//                                                  .mask_w = asc::optim::UpdateMask::Active}));
// (a signed range for the signed default initialisation; or FiringOptions::init(FiringInit::NonNegative) with the
// rule's default range [0, 1]: a rule whose range does not hold the layer is refused when attached)
//   auto net = std::make_shared<asc::nn::FiringStack>(std::vector<int64_t>{64, 128, 32});  // (.., 64) -> (.., 32)
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "ops/firing_rule_link.h"
#include "ops/geometry.h"

namespace asc::optim {  // the deprecated FiringLayer::rule_a / rule_b below (defined in train/deprecated.cpp)
struct RuleAOptions;
struct RuleBOptions;
class FiringRuleA;
class FiringRuleB;
}  // namespace asc::optim

namespace asc::nn {

// The low-rank cross-path SSM's options (docs/firing.md §6); the rank is FiringOptions::ssm_rank.
struct SSMOptions {
  double a_min = 0.01, a_max = 0.995;  // clamp of the forget gate a_t
  bool scale_input = true;             // the 1/√P_r on the input term
  bool rms_norm = false;               // s_t <- s_t / RMS(s_t)
  double rms_eps = 1e-6;
  bool learn_s0 = false;  // s_0 a parameter (else zero)
};

// W's initialisation. Signed: uniform in ±1/√d (as nn::Linear), for a rule B with a signed range (w_min = −w_max).
// NonNegative: uniform in [0, 1/√d), for rule A and a rule B with the default range [0, w_max], which would clip
// signed weights to 0 on their first step (attaching such a rule to a signed layer is refused, naming both fixes).
enum class FiringInit { Signed, NonNegative };

struct FiringOptions {
  FiringOptions(int64_t in_features, int64_t neurons) : in_features_(in_features), neurons_(neurons) {}
  ASC_ARG(int64_t, in_features);    // d (dense, channels) or the vocabulary V (FiringEmbedding)
  ASC_ARG(int64_t, neurons);        // P
  ASC_ARG(int64_t, fan_out) = 1;    // α, outputs per neuron (the next firing layer's neuron count)
  ASC_ARG(bool, channels) = false;  // FiringLinear: input (..., d, P), neuron p reads its own channel
  ASC_ARG(GateBackward, backward) = GateBackward::None;  // None: exact gate; StraightThrough; Surrogate
  ASC_ARG(std::string, surrogate) = "sigmoid";           // for GateBackward::Surrogate
  ASC_ARG(double, surrogate_width) = 1.0;
  ASC_ARG(double, threshold) = 0.0;                // initial SP of every neuron
  ASC_ARG(FiringInit, init) = FiringInit::Signed;  // W uniform in ±1/√d, or [0, 1/√d) (NonNegative)
  ASC_ARG(int64_t, ssm_rank) = 0;  // > 0: the output is the cross-path SSM's F f t̃ (input (B, T, ·) needed)
  ASC_ARG(SSMOptions, ssm);
};

// The low-rank cross-path SSM over a time axis (docs/firing.md §6): P firing messages t_t = F_t ⊙ Z_t mix through a
// state of rank R:
//   r_t = t_t V_r,  a_t = clamp(σ(r_t W_λ + b_λ), a_min, a_max),  s_t = a_t ⊙ s_{t-1} + (F_t ⊙ t_t) V_b / √R
//   [s_t <- s_t / RMS(s_t)],  t̃_t = s_t V_o,  Y[t, p, g] = F[t, p] f[p, g] t̃[t, p]
// The recurrence is the ssm_scan op (ops/firing.h); gradients flow through it by a hand-written reverse scan.
class CrossPathSSM : public Module {
 public:
  CrossPathSSM(int64_t neurons, int64_t rank, const SSMOptions& o = {});
  // Z, F (B, T, P) -> t̃ (B, T, P).
  Tensor messages(const Tensor& Z, const Tensor& F);
  // Z, F (B, T, P), f (P, α) -> (B, T, P, α) = F f t̃.
  Tensor forward(const Tensor& Z, const Tensor& F, const Tensor& f);
  std::string extra_repr() const override;

  int64_t neurons, rank;
  SSMOptions options;
  Tensor V_r, W_lambda, b_lambda, V_b, V_o, s0;  // (P, R), (R, R), (R), (P, R), (R, P), (R)
};

// What FiringLinear and FiringEmbedding share: the parameters W (P, ·), SP (P), f (P, α) — f initialised to 1, so
// with α = 1 the output is F ⊙ Z —, the rules' state buffers r_bar, m_bar, f_bar (P, float32; float64 in a float64
// layer; saved with the state_dict), and the rules fed by the forward pass.
class FiringLayer : public Module, public FiringRuleHost {
 public:
  FiringOptions options;
  Tensor W, SP, f;
  Tensor r_bar, m_bar, f_bar;

  // The local rules' side (optim::rule_b / rule_a build a rule from these tensors and attach it): every attached
  // rule receives a snapshot from each training-mode forward pass.
  FiringTensors firing_tensors() const override { return {W, f, SP, r_bar, m_bar, f_bar}; }
  void check_rule(bool takes_w_step) const override;
  void attach_rule(std::shared_ptr<FiringObserver> rule, bool takes_w_step) override;
  // Deprecated (0.2): asc::optim::rule_b(layer, o) / rule_a(layer, o). Kept for one minor version.
  [[deprecated("use asc::optim::rule_b(layer, options)")]] std::shared_ptr<optim::FiringRuleB> rule_b(
      const optim::RuleBOptions& o);
  [[deprecated("use asc::optim::rule_a(layer, options)")]] std::shared_ptr<optim::FiringRuleA> rule_a(
      const optim::RuleAOptions& o);
  [[deprecated("use asc::optim::rule_b(layer)")]] std::shared_ptr<optim::FiringRuleB> rule_b();
  [[deprecated("use asc::optim::rule_a(layer)")]] std::shared_ptr<optim::FiringRuleA> rule_a();
  // The gate of the last forward pass, (N, P) with the batch axes flattened (detached; undefined before any).
  Tensor last_gate() const { return last_F_.get(); }
  std::string extra_repr() const override;
  std::shared_ptr<CrossPathSSM> ssm;  // with options.ssm_rank() > 0

 protected:
  // A loaded state_dict's rule state must be what the rules can produce: r̄, F̄ in [0, 1], m̄ >= 0, SP finite.
  void check_state(const StateDict& incoming) const override;
  // zero_grad() drops W's gradient deferred to a rule B with fuse_sgd, as it drops every .grad.
  void on_zero_grad() override;
  FiringLayer(const char* type, const FiringOptions& o, int64_t w_cols);
  // Z (N, P) -> the output (lead..., P[, α]); feeds the rules in training mode. With the SSM, lead is (B, T).
  // dZ: where the backward pass leaves dL/dZ when W's gradient is deferred to a fuse_sgd rule (else null).
  Tensor fire(const Tensor& Z, const Shape& lead, const Tensor& X, const Tensor& tok,
              std::shared_ptr<Tensor> dZ = nullptr);
  // True when a rule_b(fuse_sgd) takes W's SGD step: the training forward defers W's gradient to it.
  bool defers_w_grad() const { return fused_rule_ != nullptr; }
  std::shared_ptr<FiringObserver> fused_rule_;  // the rule B with fuse_sgd, if any

 private:
  std::vector<std::shared_ptr<FiringObserver>> rules_;
  LastForward<Tensor> last_F_;
};

class FiringLinear : public FiringLayer {
 public:
  explicit FiringLinear(const FiringOptions& o);
  Tensor forward(const Tensor& x) override;  // (..., d) or, with channels, (..., d, P) -> (..., P[, α])
};

class FiringEmbedding : public FiringLayer {
 public:
  explicit FiringEmbedding(const FiringOptions& o);  // in_features = V
  Tensor forward(const Tensor& tok) override;        // (...) int64 in [0, V) -> (..., P[, α])
};

// sizes {d, P1, P2, ..., Pk}: layer 1 reads (..., d) densely, has P1 neurons and P2 outputs each; layer i > 1 has
// P_i neurons, neuron g reading output g of the P_{i-1} neurons before it, and P_{i+1} outputs (1 for the last), so
// the stack maps (..., d) -> (..., Pk). `base` gives the gate options and thresholds of every layer.
class FiringStack : public Module {
 public:
  explicit FiringStack(const std::vector<int64_t>& sizes, const FiringOptions& base = FiringOptions(1, 1));
  Tensor forward(const Tensor& x) override;
  std::vector<std::shared_ptr<FiringLinear>> layers;
};

}  // namespace asc::nn
