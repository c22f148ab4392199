#pragma once
// Everything in nn/: the Module base, Linear, init functions, layers and containers, positional encodings and
// losses.
//
//   #include "nn/nn.h"
//   auto mlp = std::make_shared<asc::nn::MLP>(asc::nn::MLPOptions({784, 256, 10}));
//   asc::nn::CrossEntropyLoss ce;
//   asc::Tensor loss = ce((*mlp)(x), labels);
#include "nn/asam_attention.h"
#include "nn/ascender_attention.h"
#include "nn/attention.h"
#include "nn/firing.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/positional.h"
#include "nn/transformer.h"
