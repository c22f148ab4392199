#pragma once
// Every op of the framework. Include "ascender.h" for the whole public API.
#include "ops/ascender.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/firing.h"
#include "ops/flops.h"
#include "ops/geometry.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/sparse_attention.h"
