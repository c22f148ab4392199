#pragma once
// Neural-network functional ops (the building blocks of nn/ layers).
//
//   Tensor p = asc::softmax(scores, -1, mask);   // mask: bool, true = keep; fully masked rows give zeros
//   Tensor loss = asc::cross_entropy(logits, targets, {.ignore_index = -100, .label_smoothing = 0.1});
#include <optional>

#include "core/generator.h"
#include "core/tensor.h"

namespace asc {

// Softmax / log-softmax along `dim`. `mask` (bool, broadcastable to x; true = keep) excludes entries: they get
// probability 0 (log-prob -inf). A row with no kept entry gives all zeros and a zero gradient, never NaN; a row
// whose kept entries are all -inf counts as fully masked. Over a non-last dim the result is still contiguous.
Tensor softmax(const Tensor& x, int64_t dim, const Tensor& mask = {});
// For fully masked rows log_softmax returns 0 (not -inf), so that losses built on it stay finite.
Tensor log_softmax(const Tensor& x, int64_t dim, const Tensor& mask = {});

enum class Reduction { None, Mean, Sum };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // targets equal to this contribute nothing (and are not counted in the mean)
  double label_smoothing = 0.0;  // in [0, 1]: target distribution (1 - s) one-hot + s / C uniform
  Reduction reduction = Reduction::Mean;
};
// logits (N, C) or (N, C, d...) with targets (N) / (N, d...) int64 in [0, C) (or ignore_index).
// Mean over non-ignored targets; all ignored gives 0.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, CrossEntropyOptions opts = {});
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
struct NLLLossOptions {
  Tensor weight;                // (C) per-class weights, floating; undefined: every class 1
  int64_t ignore_index = -100;  // targets equal to this contribute nothing
  Reduction reduction = Reduction::Mean;
};
// torch.nn.functional.nll_loss: input log-probabilities (N, C) or (N, C, d...), target int64 (N) / (N, d...) in
// [0, C) or ignore_index; loss_n = -weight[target_n] * input[n, target_n]; Mean divides the sum by the sum of the
// weights of the non-ignored targets (0 when all are ignored), Sum adds, None keeps target's shape (0 at ignored
// places). Differentiable in input (not in weight, which is converted to input's dtype).
// cross_entropy(x, t) == nll_loss(log_softmax(x, 1), t).
//   asc::Tensor loss = asc::nll_loss(asc::log_softmax(logits, 1), targets);
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& opts = {});

// Normalises over the trailing dims `normalized_shape`; weight/bias (that shape) optional. Population variance.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) * weight over the trailing dims.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, double eps = 1e-6);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p), when training. The mask is drawn
// from `gen` (default generator when null): same seed, same mask. Element i is kept when
// rand(x.shape(), {x.dtype(), x.device()}, gen)[i] >= p. p = 1 gives zeros; p = 0 or !training returns x itself.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);
// The activations of a feed-forward block (bias_activation_dropout).
enum class Activation { Relu, Gelu, GeluTanh, Silu };
// dropout(act(x + bias), p, training, gen) in one pass, with a one-pass backward: a Transformer's feed-forward
// hidden layer after its bias-free product (Megatron-LM fuses the same three). bias: (x.size(-1)) or undefined (no
// bias). Gives what the three ops composed give with the generator in the same state — the same values and the same
// mask, drawn as dropout draws it — and leaves the generator where they leave it; it keeps the mask as bool (a
// quarter of dropout's) and no activation input. NaN in x stays NaN where dropped, as in dropout.
//   Tensor h = bias_activation_dropout(matmul(x, w1.t()), b1, Activation::Gelu, 0.1);   // x (N, d), h (N, ffn)
Tensor bias_activation_dropout(const Tensor& x, const Tensor& bias, Activation act, double p, bool training = true,
                               Generator* gen = nullptr);
// x (..., in) @ weight^T (out, in) + bias (out).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace asc
