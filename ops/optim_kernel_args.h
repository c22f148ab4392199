#pragma once
// The hyper-parameters of the fused optimizer kernels, as plain data: shared by the CPU kernels
// (ops/kernel_list.inc, ops/cpu/optim.cpp) and the CUDA launchers (cuda/optim_launch.h), so this header stays
// C++17-clean (no core/).
namespace asc::optim {

// SGD (torch.optim.SGD): d = g + wd p; with momentum, buf = init_buf ? d : momentum buf + (1 - dampening) d and
// d = nesterov ? d + momentum buf : buf; p -= lr d.
struct SGDKernelArgs {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool init_buf = false;  // the momentum buffer is set to d (its first step) instead of being decayed
};

// Adam / AdamW (torch.optim.Adam, AdamW). decoupled: p *= 1 - lr wd first (AdamW); else g += wd p (Adam).
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; amsgrad: vmax = max(vmax, v) and v -> vmax below;
// p -= (lr / bias_correction1) m / (sqrt(v) / sqrt(bias_correction2) + eps).
struct AdamKernelArgs {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool decoupled = false, amsgrad = false;
  double bias_correction1 = 1, bias_correction2 = 1;  // 1 - beta^step, computed on the host in float64
};

// RMSprop (torch.optim.RMSprop): g += wd p; sq = alpha sq + (1 - alpha) g^2; centered: ga = alpha ga +
// (1 - alpha) g and avg = sqrt(sq - ga^2) + eps, else avg = sqrt(sq) + eps; with momentum buf = momentum buf +
// g / avg and p -= lr buf, else p -= lr g / avg.
struct RMSpropKernelArgs {
  double lr = 0, alpha = 0, eps = 0, weight_decay = 0, momentum = 0;
  bool centered = false;
};

}  // namespace asc::optim
