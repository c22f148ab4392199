// Entry points of the tensor-core check kernels (cuda/mma_check.h): validate, allocate, launch.
#include "cuda/mma_check.h"

#include <cstdint>

#include "core/device.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/mma_check_launch.h"

namespace asc::cuda {
namespace {

void check_operand(const char* op, const char* name, const Tensor& t, bool chain) {
  ASC_CHECK(t.defined() && t.dim() == 2, "{}: {} must be a 2-D tensor", op, name);
  ASC_CHECK(t.device().is_cuda(), "{}: {} must be a CUDA tensor, got {}", op, name, t.device());
  const bool ok = t.dtype() == kBFloat16 || t.dtype() == kFloat16 || (!chain && t.dtype() == kFloat32);
  ASC_CHECK(ok, "{}: {} must be {}, got {}", op, name, chain ? "bfloat16 or float16" : "float32, bfloat16 or float16",
            t.dtype());
}

}  // namespace

namespace {
// The operand as the kernels read it: contiguous and starting on 16 bytes (the fragment loaders read a pair of 16-bit
// operands in one 4-byte load; a view at an odd element offset would be a misaligned address).
Tensor aligned(const Tensor& t) {
  const Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.raw_data()) % 16 == 0 ? c : c.clone();
}
}  // namespace

Tensor mma_product(const Tensor& a, const Tensor& b, bool b_nk) {
  constexpr const char* kOp = "mma_product";
  check_operand(kOp, "a", a, false);
  check_operand(kOp, "b", b, false);
  ASC_CHECK(a.dtype() == b.dtype() && a.device() == b.device(), "{}: a ({}, {}) and b ({}, {}) differ", kOp, a.dtype(),
            a.device(), b.dtype(), b.device());
  const int64_t M = a.size(0), K = a.size(1), N = b_nk ? b.size(0) : b.size(1);
  ASC_CHECK((b_nk ? b.size(1) : b.size(0)) == K, "{}: a {} and b {} do not chain (b_nk {})", kOp, a.shape(), b.shape(),
            b_nk);
  ASC_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 8 == 0 && K % 16 == 0,
            "{}: M {}, N {}, K {} must be positive multiples of 16, 8, 16", kOp, M, N, K);
  const DeviceScope scope(a.device());
  const Tensor ac = aligned(a), bc = aligned(b);
  Tensor c = Tensor::empty({M, N}, {kFloat32, a.device(), false});
  ASC_CUDA_CHECK(mma_check_launch::product(float_elem_of(kOp, a.dtype()), b_nk, M, N, K, ac.raw_data(), bc.raw_data(),
                                           static_cast<float*>(c.raw_data()), current_stream()));
  return c;
}

Tensor mma_chain(const Tensor& a, const Tensor& b, const Tensor& w) {
  constexpr const char* kOp = "mma_chain";
  check_operand(kOp, "a", a, true);
  check_operand(kOp, "b", b, true);
  check_operand(kOp, "w", w, true);
  ASC_CHECK(a.dtype() == b.dtype() && a.dtype() == w.dtype() && a.device() == b.device() && a.device() == w.device(),
            "{}: a, b and w must share dtype and device", kOp);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0), P = w.size(1);
  ASC_CHECK(b.size(1) == K && w.size(0) == N, "{}: a {}, b {}, w {} do not chain", kOp, a.shape(), b.shape(),
            w.shape());
  ASC_CHECK(M > 0 && N > 0 && K > 0 && P > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0 && P % 8 == 0 && P <= 64,
            "{}: M {}, N {}, K {} must be positive multiples of 16, P {} a multiple of 8 up to 64", kOp, M, N, K, P);
  const DeviceScope scope(a.device());
  const Tensor ac = aligned(a), bc = aligned(b), wc = aligned(w);
  Tensor d = Tensor::empty({M, P}, {kFloat32, a.device(), false});
  ASC_CUDA_CHECK(mma_check_launch::chain(float_elem_of(kOp, a.dtype()), M, N, K, P, ac.raw_data(), bc.raw_data(),
                                         wc.raw_data(), static_cast<float*>(d.raw_data()), current_stream()));
  return d;
}

}  // namespace asc::cuda
