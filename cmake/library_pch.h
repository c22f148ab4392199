// The library's precompiled header (CMakeLists.txt: target_precompile_headers). A third of a library file's compile
// time was spent parsing these headers again, in each of the four builds CI makes (Release, CUDA emulator, ASan,
// TSan). What is listed here is what most of the library's files include anyway, before anything of their own:
// adding it to a file that did not include it changes no behaviour (every header has its include guard). Headers
// that must be read inside a region of other compiler options (ops/cpu/vec_region_begin.h) are not listed.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "core/generator.h"
#include "ops/dispatch.h"
#include "ops/kernels.h"
#include "ops/ops.h"
