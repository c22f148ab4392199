// CUDA entry points of fused ASCender attention (ops/ascender.h): check what the kernel of cuda/ascender.cu takes,
// pass raw pointers, sizes and the per-head configuration to its launcher, and turn a failed launch into an
// asc::Error. The kernel is forward only so far: ascender_unsupported refuses inputs that need a gradient (the op
// then runs the reference, whose ops all have CUDA kernels), so ascender_backward is never reached.
#include <algorithm>

#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/ascender_launch.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace L = ascender_launch;

void ascender_unsupported(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, std::string& why) {
  why.clear();
  const int64_t B = in.q.size(0), H = in.q.size(1), T = in.q.size(2);
  const int64_t dims = std::max({in.q.size(3), in.z.size(3), in.e.size(3)});
  const int64_t kmax = *std::max_element(cfg.k.begin(), cfg.k.end());
  if (in.q.dtype() != kFloat32 && in.q.dtype() != kFloat64)
    why = fmt::format("dtype {} (the CUDA kernel computes in float32 / float64)", in.q.dtype());
  else if (autograd::needs_grad({&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e, &in.scalars}))
    why = "the fused CUDA kernel has no backward yet (inputs that need a gradient run the reference)";
  else if (T > L::max_keys(float_elem_of("ascender_attention", in.q.dtype())))
    why = fmt::format("{} keys per row (the CUDA kernel holds at most {} in shared memory)", T,
                      L::max_keys(float_elem_of("ascender_attention", in.q.dtype())));
  else if (H > L::kMaxHeads || kmax > L::kMaxK || dims > L::kMaxDim || B * H > 65535)
    why = fmt::format("heads {}, k {}, head dims {} or batch x heads {} beyond the CUDA kernel's {}, {}, {}, 65535", H,
                      kmax, dims, B * H, L::kMaxHeads, L::kMaxK, L::kMaxDim);
}

void ascender_forward(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, Tensor& y) {
  std::string why;
  ascender_unsupported(in, cfg, why);
  ASC_CHECK(why.empty(), "ascender_attention (CUDA): the fused kernel cannot run these inputs: {}", why);
  const int64_t B = in.q.size(0), H = in.q.size(1), T = in.q.size(2), d = in.q.size(3);
  y = Tensor::empty({B, H, T, d}, in.q.options());
  L::Params p{};
  p.q = in.q.raw_data(), p.k_rot = in.k_rot.raw_data(), p.k = in.k.raw_data(), p.v = in.v.raw_data();
  p.z = in.z.raw_data(), p.e = in.e.raw_data(), p.scalars = in.scalars.raw_data(), p.y = y.raw_data();
  if (in.keep.defined()) {
    p.keep = static_cast<const bool*>(in.keep.raw_data());
    for (int s = 0; s < 4; ++s) p.keep_stride[s] = in.keep.stride(s);
  }
  if (in.bias.defined()) {
    p.bias = in.bias.raw_data();
    for (int s = 0; s < 4; ++s) p.bias_stride[s] = in.bias.stride(s);
  }
  p.B = B, p.H = H, p.T = T, p.d = d, p.dz = in.z.size(3), p.da = in.e.size(3);
  p.window = cfg.window, p.global_tokens = cfg.global_tokens;
  p.include_self = cfg.include_self, p.select_by_scores = cfg.select_by_scores, p.after_norm = cfg.after_norm;
  p.use_align = cfg.use_align, p.use_sep = cfg.use_sep, p.use_coh = cfg.use_coh;
  p.norm_eps = cfg.norm_eps, p.omega_scale = cfg.omega_scale;
  for (int64_t h = 0; h < H; ++h) {
    p.k_nbr[h] = cfg.k[h], p.tau_sep[h] = cfg.tau_sep[h], p.tau_coh[h] = cfg.tau_coh[h];
    p.alpha_align[h] = cfg.alpha_align[h], p.alpha_coh[h] = cfg.alpha_coh[h];
  }
  ASC_CUDA_CHECK(L::forward(float_elem_of("ascender_attention", in.q.dtype()), p, current_stream()));
}

void ascender_backward(const AscenderKernelInputs&, const AscenderKernelConfig&, const Tensor&, TensorList&) {
  ASC_THROW("ascender_attention (CUDA): the fused CUDA kernel has no backward yet (ascender_unsupported refuses "
            "inputs that need a gradient)");
}

}  // namespace asc::cuda
