#pragma once
// Mixed-precision training: the model computes in bfloat16 / float16 while an optimizer updates float32 master
// copies of its parameters; for float16 a dynamic loss scaler keeps small gradients from flushing to zero.
//
//   model->to(asc::kFloat16);                                    // compute dtype (on the GPU)
//   asc::optim::MasterWeights master(model->parameters());       // float32 copies, same device
//   asc::optim::AdamW opt(master.parameters(), {.lr = 1e-3});
//   asc::optim::GradScaler scaler;                               // {.enabled = false} for bfloat16
//   for (...) {
//     model->zero_grad();
//     scaler.scale(loss_fn(model, batch)).backward();            // gradients of loss * scale
//     master.copy_grads_to_master();                             // float32 .grad of the master copies
//     if (scaler.step(opt)) master.copy_master_to_model();       // unscale; skip the step on inf/NaN
//     scaler.update();                                           // grow or back off the scale
//   }
//
// GradScaler follows torch.cuda.amp.GradScaler: the scale is multiplied by backoff_factor after a step with
// non-finite gradients (which is skipped) and by growth_factor after growth_interval clean steps in a row.
#include <cstdint>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"

namespace asc::optim {

class Optimizer;

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() returns the loss, step() just steps (bfloat16 needs no scaling)
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  // loss * scale (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of `opt`'s parameters by the scale, once per step; returns true when one of them holds
  // an inf or NaN (then step() will skip the optimizer step).
  bool unscale_(Optimizer& opt);
  // Unscales (if unscale_ was not called), then runs opt.step() unless gradients were non-finite. Returns whether
  // the optimizer stepped.
  bool step(Optimizer& opt);
  // Adjusts the scale from what the last step() saw; call once per iteration after step().
  void update();

  double get_scale() const { return scale_; }
  bool enabled() const { return o_.enabled; }
  StateDict state_dict() const;               // "scale" (float64), "growth_tracker" (int64)
  void load_state_dict(const StateDict& sd);  // validates before changing

 private:
  GradScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0;  // clean steps since the last growth or backoff
  bool unscaled_ = false, found_inf_ = false, stepped_ = false;
};

// float32 (or another master dtype) copies of a model's trainable parameters (those of `params` that require a
// gradient), on the same devices, for an optimizer to update while the model computes in a lower precision.
class MasterWeights {
 public:
  explicit MasterWeights(const std::vector<Tensor>& params, DType master_dtype = kFloat32);
  const std::vector<Tensor>& parameters() const { return master_; }
  // master.grad = model.grad converted to the master dtype (undefined where the model parameter has none).
  void copy_grads_to_master();
  // model parameter = master value rounded to the model's dtype (in place: the model's handles stay valid).
  void copy_master_to_model();
  // The master copies, "0", "1", ... in the order of parameters() (handles; a checkpoint saves them as
  // "master.*", train/checkpoint.h). load_state_dict checks every entry (names, shapes; values converted to the master
  // dtype) before it changes anything, then sets the masters and rounds them into the model.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 private:
  std::vector<Tensor> model_, master_;
};

}  // namespace asc::optim
