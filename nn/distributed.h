#pragma once
// Deprecated: this header moved to train/distributed.h (the trainer layer, above nn/ and optim/: docs/architecture.md).
// It forwards there for one minor version and goes in 0.3.
#include "train/distributed.h"  // NOLINT: the one include of nn/ against the layers (tools/check_layers.py)
