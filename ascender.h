#pragma once
// The public API of ascender in one include: tensors, ops, autograd, nn layers, optimizers, checkpoints, distributed
// data-parallel training.
//   #include "ascender.h"
//   asc::Tensor x = asc::randn({2, 3}, {.requires_grad = true});
//   asc::sum(asc::tanh(x)).backward();
#include "autograd/anomaly.h"
#include "autograd/checkpoint.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/cpu_isa.h"
#include "core/cpu_peak.h"
#include "core/determinism.h"
#include "core/format.h"
#include "core/generator.h"
#include "core/profiler.h"
#include "core/tensor.h"
#include "cuda/cuda.h"
#include "nn/nn.h"
#include "nn/safetensors.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
