#pragma once
// optim/: optimizers, learning-rate schedulers, gradient clipping and local-learning-rule hooks in one include.
//   #include "optim/optim.h"
//   asc::optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.01});
//   asc::optim::WarmupCosine sched(opt, {.warmup_steps = 100, .total_steps = 5000});
//   loss.backward(); asc::optim::clip_grad_norm(params, 1.0); opt.step(); sched.step(); opt.zero_grad();
#include "optim/amp.h"
#include "optim/clip.h"
#include "optim/firing_rules.h"
#include "optim/local_rule.h"
#include "optim/optimizer.h"
#include "optim/optimizers.h"
#include "optim/scheduler.h"
