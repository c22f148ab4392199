// CUDA entry points of the nn functional kernels: the same signatures and semantics as asc::cpu's
// (ops/kernel_list.inc). Each one validates its tensors (CUDA, one floating dtype: float32 / float64 / bfloat16 /
// float16, contiguous where the kernel reads rows), then calls the launcher of cuda/nn.cu with raw pointers on
// cuda::current_stream(). Outputs are preallocated by the op, exactly as for the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/nn_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {

using nn_launch::Elem;

// A defined tensor on `dev` (a CUDA device) with dtype `dt`.
void check_tensor(const char* op, const char* what, const Tensor& t, Device dev, DType dt) {
  ASC_CHECK(t.defined(), "{} (CUDA): {} is an undefined tensor", op, what);
  ASC_CHECK(t.device() == dev, "{} (CUDA): {} is on {}, expected {}", op, what, t.device(), dev);
  ASC_CHECK(t.dtype() == dt, "{} (CUDA): {} has dtype {}, expected {}", op, what, t.dtype(), dt);
}

// An output: as check_tensor, contiguous and with `numel` elements (the kernels write it as a flat buffer).
void check_out(const char* op, const char* what, const Tensor& t, Device dev, DType dt, int64_t numel) {
  check_tensor(op, what, t, dev, dt);
  ASC_CHECK(t.is_contiguous(), "{} (CUDA): output {} must be contiguous", op, what);
  ASC_CHECK(t.numel() == numel, "{} (CUDA): output {} has {} elements, expected {}", op, what, t.numel(), numel);
}

Device cuda_device_of(const char* op, const Tensor& x) {
  ASC_CHECK(x.defined(), "{} (CUDA): input is an undefined tensor", op);
  ASC_CHECK(x.device().is_cuda(), "{} (CUDA): input is on {}, expected a CUDA tensor", op, x.device());
  return x.device();
}

// Row count and length of x reduced over its last dim (as the CPU kernels' rows_of).
void rows_of(const Tensor& x, int64_t& rows, int64_t& n) {
  n = x.dim() == 0 ? 1 : x.size(-1);
  rows = n == 0 ? 0 : x.numel() / n;
}

const uint8_t* mask_ptr(const char* op, const Tensor& mask, const Tensor& like, Tensor& holder) {
  if (!mask.defined()) return nullptr;
  check_tensor(op, "mask", mask, like.device(), kBool);
  ASC_CHECK(mask.numel() == like.numel(), "{} (CUDA): mask has {} elements, expected {}", op, mask.numel(),
            like.numel());
  holder = mask.contiguous();
  return static_cast<const uint8_t*>(holder.raw_data());
}

void check_launch(const char* op, cudaError_t err) {
  ASC_CHECK(err == cudaSuccess, "{} (CUDA): kernel launch failed: {} ({})", op, cudaGetErrorName(err),
            cudaGetErrorString(err));
}

}  // namespace

void softmax_forward(const Tensor& x_in, const Tensor& mask, bool log, Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  const Device dev = cuda_device_of(op, x_in);
  const Elem et = float_elem_of(op, x_in.dtype());
  int64_t rows, n;
  rows_of(x_in, rows, n);
  check_out(op, "y", y, dev, x_in.dtype(), x_in.numel());
  if (rows == 0) return;
  const Tensor x = x_in.contiguous();
  Tensor mc;
  const uint8_t* mp = mask_ptr(op, mask, x, mc);
  check_launch(op, nn_launch::softmax_forward(et, x.raw_data(), mp, log, y.raw_data(), rows, n, current_stream()));
}

void softmax_backward(const Tensor& g_in, const Tensor& y_in, const Tensor& mask, bool log, Tensor& gx) {
  const char* op = log ? "log_softmax backward" : "softmax backward";
  const Device dev = cuda_device_of(op, y_in);
  const Elem et = float_elem_of(op, y_in.dtype());
  check_tensor(op, "grad", g_in, dev, y_in.dtype());
  ASC_CHECK(g_in.numel() == y_in.numel(), "{} (CUDA): grad has {} elements, expected {}", op, g_in.numel(),
            y_in.numel());
  int64_t rows, n;
  rows_of(y_in, rows, n);
  check_out(op, "grad input", gx, dev, y_in.dtype(), y_in.numel());
  if (rows == 0) return;
  const Tensor g = g_in.contiguous(), y = y_in.contiguous();
  Tensor mc;
  const uint8_t* mp = mask_ptr(op, mask, y, mc);
  check_launch(op, nn_launch::softmax_backward(et, g.raw_data(), y.raw_data(), mp, log, gx.raw_data(), rows, n,
                                               current_stream()));
}

void layer_norm_forward(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps, bool rms, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  const Device dev = cuda_device_of(op, x_in);
  const DType dt = x_in.dtype();
  const Elem et = float_elem_of(op, dt);
  int64_t rows, n;
  rows_of(x_in, rows, n);
  const DType st = accumulate_dtype(dt);
  check_out(op, "y", y, dev, dt, x_in.numel());
  check_out(op, "rstd", rstd, dev, st, rows);
  if (!rms) check_out(op, "mean", mean, dev, st, rows);
  Tensor w, b;
  if (weight.defined()) {
    check_tensor(op, "weight", weight, dev, dt);
    ASC_CHECK(weight.numel() == n, "{} (CUDA): weight has {} elements, expected {}", op, weight.numel(), n);
    w = weight.contiguous();
  }
  if (!rms && bias.defined()) {
    check_tensor(op, "bias", bias, dev, dt);
    ASC_CHECK(bias.numel() == n, "{} (CUDA): bias has {} elements, expected {}", op, bias.numel(), n);
    b = bias.contiguous();
  }
  if (rows == 0) return;
  const Tensor x = x_in.contiguous();
  check_launch(
      op, nn_launch::layer_norm_forward(et, x.raw_data(), w.defined() ? w.raw_data() : nullptr,
                                        b.defined() ? b.raw_data() : nullptr, eps, rms, y.raw_data(),
                                        rms ? nullptr : mean.raw_data(), rstd.raw_data(), rows, n, current_stream()));
}

void layer_norm_backward(const Tensor& g_in, const Tensor& x_in, const Tensor& weight, const Tensor& mean_in,
                         const Tensor& rstd_in, bool rms, Tensor& gx, Tensor& gw, Tensor& gb) {
  const char* op = rms ? "rms_norm backward" : "layer_norm backward";
  const Device dev = cuda_device_of(op, x_in);
  const DType dt = x_in.dtype();
  const Elem et = float_elem_of(op, dt);
  int64_t rows, n;
  rows_of(x_in, rows, n);
  check_tensor(op, "grad", g_in, dev, dt);
  ASC_CHECK(g_in.numel() == x_in.numel(), "{} (CUDA): grad has {} elements, expected {}", op, g_in.numel(),
            x_in.numel());
  check_tensor(op, "rstd", rstd_in, dev, accumulate_dtype(dt));
  ASC_CHECK(rstd_in.numel() == rows, "{} (CUDA): rstd has {} elements, expected {}", op, rstd_in.numel(), rows);
  if (!rms) {
    check_tensor(op, "mean", mean_in, dev, accumulate_dtype(dt));
    ASC_CHECK(mean_in.numel() == rows, "{} (CUDA): mean has {} elements, expected {}", op, mean_in.numel(), rows);
  }
  Tensor w;
  if (weight.defined()) {
    check_tensor(op, "weight", weight, dev, dt);
    ASC_CHECK(weight.numel() == n, "{} (CUDA): weight has {} elements, expected {}", op, weight.numel(), n);
    w = weight.contiguous();
  }
  if (gx.defined()) check_out(op, "grad input", gx, dev, dt, x_in.numel());
  if (gw.defined()) check_out(op, "grad weight", gw, dev, dt, n);
  if (gb.defined()) check_out(op, "grad bias", gb, dev, dt, n);
  if (n == 0 || (!gx.defined() && !gw.defined() && !gb.defined())) return;
  const Tensor g = g_in.contiguous(), x = x_in.contiguous(), rstd = rstd_in.contiguous();
  const Tensor mean = rms ? Tensor() : mean_in.contiguous();
  const size_t ws_bytes = nn_launch::layer_norm_backward_workspace(et, rms, gw.defined(), gb.defined(), rows, n);
  // Scratch memory through the device allocator (float64 elements: 8-byte granules; the launcher aligns sections).
  Tensor ws = ws_bytes > 0
                  ? Tensor::empty({static_cast<int64_t>((ws_bytes + 7) / 8)}, {.dtype = kFloat64, .device = dev})
                  : Tensor();
  check_launch(
      op, nn_launch::layer_norm_backward(et, g.raw_data(), x.raw_data(), w.defined() ? w.raw_data() : nullptr,
                                         mean.defined() ? mean.raw_data() : nullptr, rstd.raw_data(), rms,
                                         gx.defined() ? gx.raw_data() : nullptr, gw.defined() ? gw.raw_data() : nullptr,
                                         gb.defined() ? gb.raw_data() : nullptr, ws.defined() ? ws.raw_data() : nullptr,
                                         rows, n, current_stream()));
}

void cross_entropy_forward(const Tensor& logits_in, const Tensor& target_in, int64_t ignore_index, double smoothing,
                           Tensor& loss, Tensor& stats) {
  const char* op = "cross_entropy";
  const Device dev = cuda_device_of(op, logits_in);
  const DType dt = logits_in.dtype();
  const Elem et = float_elem_of(op, dt);
  ASC_CHECK(logits_in.dim() == 2, "{} (CUDA): logits must be (rows, C), got {} dims", op, logits_in.dim());
  const int64_t rows = logits_in.size(0), C = logits_in.size(1);
  check_tensor(op, "target", target_in, dev, kInt64);
  ASC_CHECK(target_in.numel() == rows, "{} (CUDA): target has {} elements, expected {}", op, target_in.numel(), rows);
  check_out(op, "loss", loss, dev, dt, rows);
  check_out(op, "stats", stats, dev, dt, 2 * rows);
  if (rows == 0) return;
  const Tensor logits = logits_in.contiguous(), target = target_in.contiguous();
  check_launch(op, nn_launch::cross_entropy_forward(
                       et, logits.raw_data(), static_cast<const int64_t*>(target.raw_data()), ignore_index, smoothing,
                       loss.raw_data(), stats.raw_data(), rows, C, current_stream()));
}

void cross_entropy_backward(const Tensor& gloss, double scale, const Tensor& logits_in, const Tensor& target_in,
                            const Tensor& stats_in, int64_t ignore_index, double smoothing, Tensor& gx) {
  const char* op = "cross_entropy backward";
  const Device dev = cuda_device_of(op, logits_in);
  const DType dt = logits_in.dtype();
  const Elem et = float_elem_of(op, dt);
  ASC_CHECK(logits_in.dim() == 2, "{} (CUDA): logits must be (rows, C), got {} dims", op, logits_in.dim());
  const int64_t rows = logits_in.size(0), C = logits_in.size(1);
  check_tensor(op, "grad", gloss, dev, dt);
  ASC_CHECK(gloss.dim() <= 1 && (gloss.dim() == 0 || gloss.size(0) == rows),
            "{} (CUDA): grad of the loss must be (rows) or a scalar, got shape {}", op, gloss.shape());
  check_tensor(op, "target", target_in, dev, kInt64);
  ASC_CHECK(target_in.numel() == rows, "{} (CUDA): target has {} elements, expected {}", op, target_in.numel(), rows);
  check_tensor(op, "stats", stats_in, dev, dt);
  ASC_CHECK(stats_in.numel() == 2 * rows, "{} (CUDA): stats has {} elements, expected {}", op, stats_in.numel(),
            2 * rows);
  check_out(op, "grad logits", gx, dev, dt, rows * C);
  if (rows == 0 || C == 0) return;
  const Tensor logits = logits_in.contiguous(), target = target_in.contiguous(), stats = stats_in.contiguous();
  const int64_t gstride = gloss.dim() == 0 ? 0 : gloss.stride(0);  // any stride (0: a broadcast scalar)
  check_launch(op,
               nn_launch::cross_entropy_backward(et, gloss.raw_data(), gstride, scale, logits.raw_data(),
                                                 static_cast<const int64_t*>(target.raw_data()), stats.raw_data(),
                                                 ignore_index, smoothing, gx.raw_data(), rows, C, current_stream()));
}

}  // namespace asc::cuda
