#pragma once
// Anomaly detection, like torch.autograd.detect_anomaly: a debugging mode in which the first op whose forward
// output or backward gradient contains NaN or Inf throws asc::Error naming the op and where it was created: the
// modules whose forward was running when it was recorded (outermost first), any user scopes, and the op's number
// among the ops recorded since the mode was switched on.
//
//   asc::autograd::DetectAnomalyGuard anomaly;                // on until the end of the scope (process-wide)
//   asc::Tensor loss = model(x).log().mean();                 // x <= 0 somewhere:
//   // anomaly: the forward of 'log' produced NaN/Inf in output 0 (shape [8, 10]); op #57, created in
//   //   TransformerClassifier > Linear
//
// Checked are the outputs of ops that record a graph node (grad mode on, an input requires grad) and every
// gradient a node returns during backward. Slow by design: each such tensor is copied to the host and scanned.
// A backward that throws has already accumulated the gradients of the nodes that ran before the anomalous one.
#include <string>

#include "core/tensor.h"

namespace asc::autograd {

bool anomaly_enabled();
void set_anomaly_enabled(bool enabled);

class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true) : prev_(anomaly_enabled()) { set_anomaly_enabled(enabled); }
  ~DetectAnomalyGuard() { set_anomaly_enabled(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// Names a region of the forward pass in anomaly reports (per thread; scopes nest). Module::operator() opens one
// with the module's type name. Costs one flag test when anomaly mode is off.
//   { asc::autograd::AnomalyScope scope("loss"); loss = criterion(y, target); }
class AnomalyScope {
 public:
  explicit AnomalyScope(const std::string& name);
  ~AnomalyScope();
  AnomalyScope(const AnomalyScope&) = delete;
  AnomalyScope& operator=(const AnomalyScope&) = delete;

 private:
  bool active_ = false;
};

// Where an op recorded now was created: "op #N, created in A > B" (used by record()).
std::string anomaly_creation_context();
// True when every element of a floating tensor is finite (non-floating tensors: always). Any device and dtype.
bool all_finite(const Tensor& t);

}  // namespace asc::autograd
