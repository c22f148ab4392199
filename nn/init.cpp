#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace asc::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  ASC_CHECK(w.defined() && w.dim() >= 2, "init.fans: fan in/out need a tensor with at least 2 dims, got shape {}",
            w.defined() ? w.shape() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "identity" || nl == "sigmoid" || nl == "conv") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nl == "selu") return 0.75;
  ASC_THROW("init.calculate_gain: unknown nonlinearity '{}'", nl);
}

namespace {
// Any floating dtype: the fills are composed from ops that convert.
void check_fillable(const Tensor& t, const char* op) {
  check_defined(op, t, "the tensor");
  check_floating(op, t);
}
}  // namespace

void uniform_(Tensor& t, double low, double high, Generator* gen) {
  check_fillable(t, "init.uniform_");
  ASC_CHECK(low <= high, "init.uniform_: low {} > high {}", low, high);
  NoGradGuard g;
  Tensor u = rand(t.shape(), {t.dtype(), t.device()}, gen);
  t.copy_(u * (high - low) + low);
}

void normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_fillable(t, "init.normal_");
  ASC_CHECK(std >= 0, "init.normal_: std {} < 0", std);
  NoGradGuard g;
  Tensor n = randn(t.shape(), {t.dtype(), t.device()}, gen);
  t.copy_(n * std + mean);
}

void constant_(Tensor& t, double value) {
  check_fillable(t, "init.constant_");
  NoGradGuard g;
  t.fill_(value);
}
void zeros_(Tensor& t) { constant_(t, 0.0); }
void ones_(Tensor& t) { constant_(t, 1.0); }

void xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  auto [fi, fo] = fans(t);
  double a = gain * std::sqrt(6.0 / static_cast<double>(fi + fo));
  uniform_(t, -a, a, gen);
}

void xavier_normal_(Tensor& t, double gain, Generator* gen) {
  auto [fi, fo] = fans(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fi + fo)), gen);
}

namespace {
double kaiming_std(const Tensor& t, const KaimingOptions& o) {
  auto [fi, fo] = fans(t);
  int64_t fan = o.fan_out ? fo : fi;
  ASC_CHECK(fan > 0, "init.kaiming: zero fan for shape {}", t.shape());
  return calculate_gain(o.nonlinearity, o.a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

void kaiming_uniform_(Tensor& t, KaimingOptions opts, Generator* gen) {
  double b = std::sqrt(3.0) * kaiming_std(t, opts);
  uniform_(t, -b, b, gen);
}

void kaiming_normal_(Tensor& t, KaimingOptions opts, Generator* gen) { normal_(t, 0.0, kaiming_std(t, opts), gen); }

}  // namespace asc::nn::init
