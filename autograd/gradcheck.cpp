#include "autograd/gradcheck.h"

#include <cmath>

#include "core/format.h"
#include "core/generator.h"

namespace asc::autograd {

GradcheckResult gradcheck(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad())
      ASC_CHECK(inputs[i].dtype() == kFloat64, "gradcheck: input {} must be float64 (got {})", i, inputs[i].dtype());

  TensorList outs = fn(inputs);
  Generator gen(opts.seed);
  TensorList cot, roots;
  std::vector<size_t> root_index;
  for (size_t j = 0; j < outs.size(); ++j) {
    const Tensor& o = outs[j];
    if (!o.defined() || !o.requires_grad()) continue;
    roots.push_back(o);
    root_index.push_back(j);
    cot.push_back(randn(o.shape(), {.dtype = kFloat64, .device = o.device()}, &gen));
  }
  ASC_CHECK(!roots.empty(), "gradcheck: no output requires grad");
  TensorList wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      wrt.push_back(inputs[i]);
      wrt_index.push_back(i);
    }
  TensorList analytical = grad(roots, wrt, cot);

  // <v, f(x)> with x's element perturbed; evaluated with grad mode off on perturbed copies.
  auto objective = [&](const TensorList& in) {
    NoGradGuard ng;
    TensorList o = fn(in);
    double s = 0;
    for (size_t k = 0; k < root_index.size(); ++k) s += (o[root_index[k]].to(kFloat64) * cot[k]).sum().item<double>();
    return s;
  };

  for (size_t w = 0; w < wrt.size(); ++w) {
    size_t i = wrt_index[w];
    Tensor base = inputs[i].detach().contiguous().clone();
    std::vector<double> an = analytical[w].to_vector<double>();
    double* p = base.data_ptr<double>();
    for (int64_t e = 0; e < base.numel(); ++e) {
      TensorList in = inputs;
      const double orig = p[e];
      p[e] = orig + opts.eps;
      in[i] = base.clone();
      double fp = objective(in);
      p[e] = orig - opts.eps;
      in[i] = base.clone();
      double fm = objective(in);
      p[e] = orig;
      double num = (fp - fm) / (2 * opts.eps);
      double a = an[static_cast<size_t>(e)];
      if (!(std::abs(a - num) <= opts.atol + opts.rtol * std::abs(num))) {
        return {false,
                fmt::format("gradcheck: input {} (shape {}), element {}: analytical {:.10g} vs numerical {:.10g}", i,
                            inputs[i].shape(), e, a, num)};
      }
    }
  }
  return {};
}

}  // namespace asc::autograd
