#pragma once
// Moved to ops/optim_kernel_args.h in 0.2 (kernel arguments live beside the kernels); this forwarding header goes in
// 0.3.
#include "ops/optim_kernel_args.h"
