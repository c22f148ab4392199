// Exports nn::AscenderAttention cases for the cross-implementation check (tools/ascender_torch_check.py, run by the
// CTest test ascender_torch_crosscheck): per case, a float64 layer with every parameter set to random values, an
// input x, masks, a cotangent g, and what the layer computes — y and the gradient of sum(y · g) with respect to x
// and every parameter — once through the fused kernel and once through the composed reference. The script
// recomputes all of it from docs/ascender.md in PyTorch, independently, and compares to 1e-9.
//   ascender_export OUT_DIR      # writes OUT_DIR/<case>.safetensors, one per case
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "ascender.h"

using namespace asc;

namespace {

struct Case {
  std::string name;
  nn::AscenderAttentionOptions opts;
  bool padding = false, causal = false, bias = false;
  double omega_scale_steps = 0;  // > 0: a warm-up of this many steps, run at step 1 (m_ω = 1 / steps)
};

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ",") + fmt::format("{:.17g}", x);
  return s;
}
std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Everything the script needs to rebuild the layer, as safetensors metadata strings.
std::map<std::string, std::string> metadata(const Case& c, const nn::AscenderAttention& layer, int64_t B, int64_t T) {
  const auto& o = c.opts;
  const char* mode = o.mode() == nn::AscenderMode::Full       ? "full"
                     : o.mode() == nn::AscenderMode::Windowed ? "windowed"
                                                              : "reuse";
  return {{"B", std::to_string(B)},
          {"T", std::to_string(T)},
          {"d_model", std::to_string(o.d_model())},
          {"heads", std::to_string(o.heads())},
          {"d_z", std::to_string(layer.d_z)},
          {"d_a", std::to_string(layer.d_a)},
          {"k", join(o.k())},
          {"tau_sep", join(o.tau_sep())},
          {"tau_coh", join(o.tau_coh())},
          {"alpha_align", join(o.alpha_align())},
          {"alpha_coh", join(o.alpha_coh())},
          {"include_self", o.neighbors_include_self() ? "1" : "0"},
          {"gate_position", o.gate_position() == nn::GatePosition::AfterNorm ? "after_norm" : "before_norm"},
          {"mode", mode},
          {"window", std::to_string(o.window())},
          {"global_tokens", std::to_string(o.global_tokens())},
          {"use_align", o.use_align() ? "1" : "0"},
          {"use_sep", o.use_sep() ? "1" : "0"},
          {"use_coh", o.use_coh() ? "1" : "0"},
          {"rope", o.rope() ? "1" : "0"},
          {"norm_eps", fmt::format("{:.17g}", o.norm_eps())},
          {"omega_scale", fmt::format("{:.17g}", layer.omega_scale())},
          {"causal", c.causal ? "1" : "0"}};
}

void export_case(const Case& c, const std::string& dir) {
  manual_seed(1234);
  auto layer = std::make_shared<nn::AscenderAttention>(c.opts);
  layer->to(kFloat64);
  const int64_t B = 2, T = 21, D = c.opts.d_model(), H = c.opts.heads();
  {
    // Random values everywhere, in ranges where every term and gate is active: ω of both signs, δ around the
    // affinities' spread, κ near the densities (so η = min(1, ρ/κ) takes both branches), τ_score near 1.
    NoGradGuard ng;
    for (auto& [name, p] : layer->named_parameters()) p.copy_(randn(p.shape(), {.dtype = kFloat64}) * 0.4);
    layer->omega_align.copy_(randn({H}, {.dtype = kFloat64}) * 0.5);
    layer->omega_sep.copy_(randn({H}, {.dtype = kFloat64}) * 0.5);
    layer->omega_coh.copy_(randn({H}, {.dtype = kFloat64}) * 0.5);
    layer->delta.copy_(rand({H}, {.dtype = kFloat64}) * 0.4 - 0.2);
    layer->kappa_raw.copy_(rand({H}, {.dtype = kFloat64}) * 2 + 0.5);
    layer->tau_score_raw.copy_(rand({H}, {.dtype = kFloat64}) + 0.2);
  }
  if (c.omega_scale_steps > 0) layer->set_step(1);
  Tensor x = randn({B, T, D}, {.dtype = kFloat64});
  Tensor g = randn({B, T, D}, {.dtype = kFloat64});
  nn::AttentionArgs args;
  Tensor valid = ones({B, T}, {.dtype = kBool});
  if (c.padding) {
    NoGradGuard ng;
    valid.narrow(0, 1, 1).narrow(1, T - 6, 6).fill_(0.0);  // batch 1: the last 6 tokens are padding
    args.key_padding_mask = valid;
  }
  args.causal = c.causal;
  Tensor bias;
  if (c.bias) {
    bias = randn({1, H, T, T}, {.dtype = kFloat64});
    args.bias = bias;
  }
  StateDict out;
  for (auto& [name, p] : layer->named_parameters()) out.set("p." + name, p.detach().clone());
  out.set("x", x), out.set("g", g), out.set("valid", valid.to(kFloat64));
  if (c.bias) out.set("bias", bias);
  auto meta = metadata(c, *layer, B, T);
  for (auto [backend, tag] : {std::pair{AscenderBackend::Fused, ""}, std::pair{AscenderBackend::Reference, "ref."}}) {
    set_ascender_backend(backend);
    layer->eval();  // no step advance: both runs see the same schedule factor
    Tensor xi = x.detach().clone();
    xi.set_requires_grad(true);
    layer->zero_grad();
    Tensor y = (*layer)(xi, args);
    (y * g).sum().backward();
    out.set(std::string(tag) + "y", y.detach());
    out.set(std::string(tag) + "grad.x", xi.grad());
    for (auto& [name, p] : layer->named_parameters())
      out.set(std::string(tag) + "grad.p." + name, p.grad().defined() ? p.grad() : zeros_like(p));
  }
  set_ascender_backend(AscenderBackend::Auto);
  save_safetensors(dir + "/" + c.name + ".safetensors", out, meta);
  std::printf("%s: %zu tensors\n", c.name.c_str(), out.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ascender_export OUT_DIR\n");
    return 2;
  }
  using nn::AscenderMode;
  using nn::GatePosition;
  auto base = [] { return nn::AscenderAttentionOptions(16, 2).d_z(3).d_a(4); };
  std::vector<Case> cases = {
      {"full_before_padding", base().k({3, 5}).tau_sep({0.7, 1.6}).tau_coh({1.3, 0.6}), true, false, false},
      {"full_after_causal_rope_self",
       base()
           .k({4})
           .gate_position(GatePosition::AfterNorm)
           .neighbors_include_self(true)
           .rope(true)
           .alpha_align({0.5, 2.0})
           .alpha_coh({1.5, 0.3})
           .tau_sep({0.8})
           .tau_coh({1.1}),
       true, true, false},
      {"windowed_after",
       base()
           .k({3})
           .mode(AscenderMode::Windowed)
           .window(4)
           .global_tokens(2)
           .gate_position(GatePosition::AfterNorm)
           .tau_sep({0.9})
           .tau_coh({0.8}),
       true, false, false},
      {"reuse_bias_warmup", base().k({2, 6}).mode(AscenderMode::Reuse).warmup_steps(4).tau_sep({1.2}).tau_coh({0.9}),
       false, false, true, 4},
      {"ablation_no_sep_after", base().k({5}).use_sep(false).gate_position(GatePosition::AfterNorm).bias(false), true,
       true, false},
  };
  for (const Case& c : cases) export_case(c, argv[1]);
  return 0;
}
