// CUDA entry points of fused ASCender attention (ops/ascender.h): check what the kernels of cuda/ascender.cu take,
// pass raw pointers, sizes and the per-head configuration to their launchers, and turn a failed launch into an
// asc::Error. Inputs they do not take (ascender_unsupported says why) run the reference, whose ops all have CUDA
// kernels.
#include <algorithm>
#include <cstdlib>

#include "autograd/node.h"
#include "core/determinism.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/ascender_launch.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/ascender_scalars.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace L = ascender_launch;

namespace {

// Whether the tensor-core kernels (cuda/ascender_mma.cu, cuda/ascender_mma_backward.cu) take these inputs.
bool takes_mma(const AscenderKernelInputs& in, const AscenderConfig& cfg) {
  L::Params p{};
  p.H = in.q.size(1), p.d = in.q.size(3), p.dz = in.z.size(3), p.da = in.e.size(3);
  for (int64_t h = 0; h < p.H && h < L::kMaxHeads; ++h) p.k_nbr[h] = cfg.k[h];
  return L::mma_takes(float_elem_of("ascender_attention", in.q.dtype()), p, allow_tf32());
}

}  // namespace

void ascender_unsupported(const AscenderKernelInputs& in, const AscenderConfig& cfg, std::string& why) {
  why.clear();
  const int64_t B = in.q.size(0), H = in.q.size(1);
  const int64_t dims = std::max({in.q.size(3), in.z.size(3), in.e.size(3)});
  const int64_t kmax = *std::max_element(cfg.k.begin(), cfg.k.end());
  if (H > L::kMaxHeads || kmax > L::kMaxK || dims > L::kMaxDim || B * H > 65535)
    why = fmt::format("heads {}, k {}, head dims {} or batch x heads {} beyond the CUDA kernel's {}, {}, {}, 65535", H,
                      kmax, dims, B * H, L::kMaxHeads, L::kMaxK, L::kMaxDim);
  // The row kernels' backward sums the gradients of k, v, z, e and the scalars over rows with atomicAdd; the
  // tensor-core backward writes each once, in a fixed order.
  else if (deterministic_algorithms_enabled() && !takes_mma(in, cfg) &&
           autograd::needs_grad({&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e, &in.scalars}))
    why =
        "deterministic mode: the CUDA row kernel's backward accumulates with atomicAdd (the tensor-core kernels', "
        "for bfloat16, float16 and float32 as TF32, does not)";
}

namespace {

// The forward's parameters: raw pointers (y's is set by the caller), sizes, the per-head configuration.
L::Params params(const AscenderKernelInputs& in, const AscenderConfig& cfg) {
  std::string why;
  ascender_unsupported(in, cfg, why);
  ASC_CHECK(why.empty(), "ascender_attention (CUDA): the fused kernel cannot run these inputs: {}", why);
  L::Params p{};
  p.q = in.q.raw_data(), p.k_rot = in.k_rot.raw_data(), p.k = in.k.raw_data(), p.v = in.v.raw_data();
  p.z = in.z.raw_data(), p.e = in.e.raw_data(), p.scalars = in.scalars.raw_data();
  if (in.keep.defined()) {
    p.keep = static_cast<const bool*>(in.keep.raw_data());
    for (int s = 0; s < 4; ++s) p.keep_stride[s] = in.keep.stride(s);
  }
  if (in.bias.defined()) {
    p.bias = in.bias.raw_data();
    for (int s = 0; s < 4; ++s) p.bias_stride[s] = in.bias.stride(s);
  }
  p.B = in.q.size(0), p.H = in.q.size(1), p.T = in.q.size(2), p.d = in.q.size(3);
  p.dz = in.z.size(3), p.da = in.e.size(3);
  p.window = cfg.window, p.global_tokens = cfg.global_tokens;
  p.include_self = cfg.include_self, p.select_by_scores = cfg.select_by_scores, p.after_norm = cfg.after_norm();
  p.use_align = cfg.use_align, p.use_sep = cfg.use_sep, p.use_coh = cfg.use_coh;
  p.norm_eps = cfg.norm_eps, p.omega_scale = cfg.omega_scale;
  p.constant_row = ascender::kConstantRow;
  for (int64_t h = 0; h < p.H; ++h) {
    p.k_nbr[h] = cfg.k[h], p.tau_sep[h] = cfg.tau_sep[h], p.tau_coh[h] = cfg.tau_coh[h];
    p.alpha_align[h] = cfg.alpha_align[h], p.alpha_coh[h] = cfg.alpha_coh[h];
  }
  return p;
}

// The long-row workspace's budget in bytes: ASC_ASCENDER_SCRATCH_MB if set (a positive integer), else 256 MiB.
int64_t scratch_budget() {
  int64_t mb = 256;
  if (const char* env = std::getenv("ASC_ASCENDER_SCRATCH_MB")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    ASC_CHECK(end != env && *end == '\0' && v > 0 && v < (int64_t(1) << 40),
              "ascender_attention (CUDA): ASC_ASCENDER_SCRATCH_MB must be a positive number of MiB, got '{}'", env);
    mb = v;
  }
  return mb << 20;
}

// Rows longer than the shared-memory kernel holds (`shared_keys`): a workspace for the rows in flight.
Tensor row_workspace(const AscenderKernelInputs& in, L::Params& p, int64_t shared_keys, int arrays) {
  const FloatElem t = float_elem_of("ascender_attention", in.q.dtype());
  if (p.T <= shared_keys) return {};
  p.rows_in_flight = L::rows_in_flight(t, p.B * p.H, p.T, arrays, scratch_budget());
  const DType acc = in.q.dtype() == kFloat64 ? kFloat64 : kFloat32;  // the kernels' compute type
  Tensor scratch = Tensor::empty({p.rows_in_flight * p.B * p.H * arrays * p.T}, {acc, in.q.device(), false});
  p.scratch = scratch.raw_data();
  return scratch;
}

}  // namespace

// The row kernels (cuda/ascender.cu) keep no state between the passes: the backward recomputes each row. The
// tensor-core forward (cuda/ascender_mma.cu), which runs what it takes, leaves the neighbourhoods it chose in
// state->nbr and its workspace with the rows' records in state->rows, and the tensor-core backward
// (cuda/ascender_mma_backward.cu) runs on those.
void ascender_forward(const AscenderKernelInputs& in, const AscenderConfig& cfg, Tensor& y,
                      AscenderKernelState* state) {
  const FloatElem t = float_elem_of("ascender_attention", in.q.dtype());
  L::Params p = params(in, cfg);
  p.y = y.raw_data();
  if (L::mma_takes(t, p, allow_tf32())) {
    p.constant_row = L::mma_constant_row(t);
    if (state) state->constant_row = p.constant_row;  // the backward standardises with the same threshold
    const int64_t B = in.q.size(0), H = in.q.size(1), T = in.q.size(2);
    const bool records = state != nullptr;  // training: keep what the backward needs
    const Tensor work = Tensor::empty({L::mma_workspace_floats(p, records)}, {kFloat32, in.q.device(), false});
    if (state) state->rows = work;
    int64_t* nbr = nullptr;
    const int64_t kmax = *std::max_element(cfg.k.begin(), cfg.k.end());
    if (state && cfg.use_align) {
      state->nbr = Tensor::empty({B, H, T, kmax}, {kInt64, in.q.device(), false});
      nbr = state->nbr.data_ptr<int64_t>();
    }
    ASC_CUDA_CHECK(L::mma_forward(t, p, work.raw_data(), records, nbr, kmax, current_stream()));
    return;
  }
  const Tensor scratch = row_workspace(in, p, L::max_keys(t), L::kForwardArrays);
  ASC_CUDA_CHECK(L::forward(t, p, current_stream()));
}

void ascender_backward(const AscenderKernelInputs& in, const AscenderConfig& cfg, const AscenderKernelState& state,
                       const Tensor& gy_in, TensorList& grads) {
  const FloatElem t = float_elem_of("ascender_attention backward", in.q.dtype());
  L::BackwardParams p{};
  p.fwd = params(in, cfg);
  if (state.nbr.defined()) p.fwd.saved_nbr = state.nbr.data_ptr<int64_t>(), p.fwd.saved_nbr_k = state.nbr.size(3);
  if (state.constant_row > 0) p.fwd.constant_row = state.constant_row;
  const Tensor gy = gy_in.contiguous();
  const DType acc = in.q.dtype() == kFloat64 ? kFloat64 : kFloat32;  // the kernels' compute type
  const TensorOptions opt{acc, in.q.device(), false};
  // Gradients in the compute type: the op's own where they have it, else (bfloat16 / float16) float32 sums converted
  // into them at the end.
  TensorList sums = grads;
  for (Tensor& s : sums) {
    if (acc != in.q.dtype()) s = Tensor::empty(s.shape(), opt);
    cuda::fill(s, 0.0);  // this backend's fill kernel (a leaf, not the op)
  }
  Tensor &dq = sums[0], &dkr = sums[1], &dk = sums[2], &dv = sums[3], &dz = sums[4], &de = sums[5];
  Tensor& dscalars = sums[6];
  p.gy = gy.raw_data();
  p.dq = dq.raw_data(), p.dkr = dkr.raw_data(), p.dk = dk.raw_data(), p.dv = dv.raw_data();
  p.dz = dz.raw_data(), p.de = de.raw_data(), p.dscalars = dscalars.raw_data();
  auto finish = [&] {
    if (acc != in.q.dtype())
      for (size_t i = 0; i < grads.size(); ++i) cuda::copy(sums[i], grads[i]);  // this backend's casting copy kernel
  };
  if (state.rows.defined()) {  // after the tensor-core forward: its backward, every gradient written once
    Tensor work = Tensor::empty({L::mma_backward_floats(p.fwd)}, opt);
    cuda::fill(work, 0.0);
    ASC_CUDA_CHECK(L::mma_backward(t, p, state.rows.raw_data(), work.raw_data(), current_stream()));
    finish();
    return;
  }
  const Tensor scratch = row_workspace(in, p.fwd, L::max_keys_backward(t), L::kBackwardArrays);
  const int64_t B = in.q.size(0), H = in.q.size(1), T = in.q.size(2);
  auto zeroed = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, opt);
    cuda::fill(t, 0.0);
    return t;
  };
  Tensor dkhat = zeroed(in.q.shape()), dehat = zeroed(in.e.shape());  // workspace
  Tensor knorm = Tensor::empty({B, H, T}, opt), enorm = Tensor::empty({B, H, T}, opt);
  p.dkhat = dkhat.raw_data(), p.dehat = dehat.raw_data(), p.knorm = knorm.raw_data(), p.enorm = enorm.raw_data();
  ASC_CUDA_CHECK(L::backward(t, p, current_stream()));  // the row kernels: accumulated with atomicAdd
  finish();
}

}  // namespace asc::cuda
