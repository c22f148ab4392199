#include "ops/linalg.h"

#include <optional>

#include "autograd/node.h"
#include "core/autocast.h"
#include "ops/cpu/gemm.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/flops.h"
#include "ops/reduce.h"

namespace asc {

namespace {

// (..., M, K) @ (..., K, N) for operands of at least 2 dims, batch dims broadcast; with bf16, products in bfloat16
// (matmul_bf16). No autograd.
Tensor matmul_nd(const Tensor& a, const Tensor& b, bool bf16 = false) {
  std::optional<cpu::Bf16ProductsScope> bf16_scope;  // read by the CPU matmul kernel on this thread
  if (bf16) bf16_scope.emplace();
  const char* name = bf16 ? "matmul_bf16" : "matmul";
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape ba(std::span<const int64_t>(a.shape().data(), a.dim() - 2));
  Shape bb(std::span<const int64_t>(b.shape().data(), b.dim() - 2));
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  const int64_t nb = numel_of(batch);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out =
      Tensor::empty(out_shape, {.dtype = bf16 ? kFloat32 : a.dtype(), .device = a.device()});  // bf16: float32 sums
  if (out.numel() == 0) return out;  // nothing to compute (and a loop over a huge batch of empty matrices to skip)
  if (K == 0) return out.zero_();
  if (batch.empty()) {
    ASC_KERNEL_COUNTED(a.device(), name, flops::gemm(1, M, N, K), matmul, a, b, out);
    return out;
  }
  // Collapse the batch dims to one: a view when the operand's batch dims are mergeable (always for expand of a
  // contiguous tensor's leading dims), else a contiguous copy.
  auto as3 = [&](const Tensor& t, int64_t rows, int64_t cols) {
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    Tensor e = t.expand(full);
    Tensor v = e.dim() == 3 ? e : e.reshape({nb, rows, cols});
    return v;
  };
  Tensor a3 = as3(a, M, K), b3 = as3(b, K, N);
  Tensor o3 = out.view({nb, M, N});
  ASC_KERNEL_COUNTED(a.device(), name, flops::gemm(nb, M, N, K), matmul, a3, b3, o3);
  return out;
}

// matmul_bf16 / addmm_bf16: float32 CPU operands, on a processor with bfloat16 products.
void check_bf16_operands(const char* op, const Tensor& a) {
  ASC_CHECK(a.device().is_cpu() && a.dtype() == kFloat32,
            "{}: float32 CPU tensors only, got {} on {} (on CUDA, a model in bfloat16 runs its products on tensor "
            "cores)",
            op, a.dtype(), a.device());
  ASC_CHECK(cpu_bf16_supported(),
            "{}: this processor has no bfloat16 products (AVX512-BF16 or AMX-BF16), or the build has no oneDNN", op);
}

// An operand that is a transposed view of a contiguous matrix (W.t() in x Wᵀ) gets its gradient as the transpose of a
// contiguous product, so the transpose's own backward hands W a contiguous gradient and nothing is copied.
bool transposed(const Tensor& t) {
  return t.dim() == 2 && t.size(0) > 1 && t.size(1) > 1 && t.stride(0) == 1 && t.stride(1) == t.size(0);
}

// The gradients of C = A B from G = dC: dA = G Bᵀ (summed over broadcast batch dims to A's shape sa), dB = Aᵀ G (to
// sb); for an operand the forward read transposed (at, bt: see transposed) dA = (B Gᵀ)ᵀ, dB = (Gᵀ A)ᵀ. Only those
// asked for (ga, gb). bf16: the products in bfloat16 (the operands already rounded).
TensorList product_grads(const Tensor& G, const Tensor& A, const Tensor& B, bool ga, bool gb, bool at, bool bt,
                         const Shape& sa, const Shape& sb, bool bf16) {
  Tensor da, db;
  if (ga)
    da = at ? matmul_nd(B, G.transpose(-1, -2), bf16).transpose(-1, -2)
            : sum_to(matmul_nd(G, B.transpose(-1, -2), bf16), sa);
  if (gb)
    db = bt ? matmul_nd(G.transpose(-1, -2), A, bf16).transpose(-1, -2)
            : sum_to(matmul_nd(A.transpose(-1, -2), G, bf16), sb);
  return {da, db};
}

Tensor matmul_impl(const Tensor& a_in, const Tensor& b_in, bool bf16) {
  const char* op = bf16 ? "matmul_bf16" : "matmul";
  check_defined(op, a_in, "first input");
  check_defined(op, b_in, "second input");
  check_same_device(op, {&a_in, &b_in});
  ASC_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "{}: both operands need at least 1 dimension, got {} and {}", op,
            a_in.shape(), b_in.shape());
  ASC_CHECK(is_floating(a_in.dtype()) && a_in.dtype() == b_in.dtype(),
            "{}: operands must share a floating dtype, got {} and {}", op, a_in.dtype(), b_in.dtype());
  if (bf16) check_bf16_operands(op, a_in);
  const bool a_vec = a_in.dim() == 1, b_vec = b_in.dim() == 1;
  Tensor a = a_vec ? a_in.unsqueeze(0) : a_in;   // (K) -> (1, K)
  Tensor b = b_vec ? b_in.unsqueeze(-1) : b_in;  // (K) -> (K, 1)
  ASC_CHECK(a.size(-1) == b.size(-2), "{}: inner dimensions differ: {} @ {} ({} vs {})", op, a_in.shape(), b_in.shape(),
            a.size(-1), b.size(-2));
  Tensor out, ar, br;  // ar, br: matmul_bf16's operands rounded to bfloat16, once for the forward and the backward
  {
    NoGradGuard ng;  // the views above are recorded by autograd on their own; the product node is recorded below
    if (bf16) ar = cpu::round_to_bfloat16(a.detach()), br = cpu::round_to_bfloat16(b.detach());
    out = bf16 ? matmul_nd(ar, br, true) : matmul_nd(a.detach(), b.detach());
  }
  if (autograd::needs_grad(a, b)) {
    bool ga = a.requires_grad(), gb = b.requires_grad();
    Shape sa = a.shape(), sb = b.shape();
    const bool plain = a.dim() == 2 && b.dim() == 2;  // no batch dims to broadcast or sum over
    const bool at = plain && transposed(a), bt = plain && transposed(b);
    // matmul_bf16 keeps its rounded operands instead of the float32 ones (half the memory, no second rounding)
    autograd::record(
        op, {a, b}, {out},
        [=, as = bf16 ? autograd::SavedTensor() : autograd::SavedTensor(a, "matmul"),
         bs = bf16 ? autograd::SavedTensor() : autograd::SavedTensor(b, "matmul")](const TensorList& g) -> TensorList {
          // dA = dC B^T (summed over broadcast batch dims), dB = A^T dC; for a transposed operand
          // dA = (B dCᵀ)ᵀ, dB = (dCᵀ A)ᵀ. matmul_bf16: bfloat16 products of the rounded operands and
          // of dC rounded once.
          const Tensor A = bf16 ? ar : as.get(), B = bf16 ? br : bs.get();
          const Tensor G = bf16 ? cpu::round_to_bfloat16(g[0]) : g[0];
          return product_grads(G, A, B, ga, gb, at, bt, sa, sb, bf16);
        });
  }
  if (a_vec) out = out.squeeze(-2);
  if (b_vec) out = out.squeeze(-1);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_impl(a, b, false); }
Tensor matmul_bf16(const Tensor& a, const Tensor& b) { return matmul_impl(a, b, true); }

namespace {

// addmm and addmm_bf16: bias + a @ b, the bias added to each row block of the product as it is written.
Tensor addmm_impl(const Tensor& bias, const Tensor& a, const Tensor& b, bool bf16) {
  const char* op = bf16 ? "addmm_bf16" : "addmm";
  check_defined(op, bias, "bias");
  check_defined(op, a, "first input");
  check_defined(op, b, "second input");
  check_same_device(op, {&bias, &a, &b});
  ASC_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype() && bias.dtype() == a.dtype(),
            "{}: bias and operands must share a floating dtype, got {}, {} and {}", op, bias.dtype(), a.dtype(),
            b.dtype());
  if (bf16) check_bf16_operands(op, a);
  ASC_CHECK(a.dim() == 2 && b.dim() == 2, "{}: operands must be 2-D (M, K) and (K, N), got {} and {}", op, a.shape(),
            b.shape());
  ASC_CHECK(a.size(1) == b.size(0), "{}: inner dimensions differ: {} @ {} ({} vs {})", op, a.shape(), b.shape(),
            a.size(1), b.size(0));
  ASC_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1), "{}: bias shape {} must be ({}) for {} @ {}", op,
            bias.shape(), b.size(1), a.shape(), b.shape());
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  Tensor out = Tensor::empty({M, N}, {.dtype = a.dtype(), .device = a.device()});
  Tensor ar, br;  // addmm_bf16's operands rounded to bfloat16, once for the forward and the backward
  {
    NoGradGuard ng;
    if (bf16) ar = cpu::round_to_bfloat16(a.detach()), br = cpu::round_to_bfloat16(b.detach());
    if (out.numel() > 0 && K == 0) {
      out.copy_(bias.detach().expand({M, N}));  // an empty sum: the bias alone
    } else if (out.numel() > 0) {
      std::optional<cpu::Bf16ProductsScope> bf16_scope;  // read by the CPU matmul_bias kernel on this thread
      if (bf16) bf16_scope.emplace();
      const Tensor bc = bias.detach().contiguous();
      ASC_KERNEL_COUNTED(a.device(), op, flops::gemm(1, M, N, K), matmul_bias, bf16 ? ar : a.detach(),
                         bf16 ? br : b.detach(), bc, out);
    }
  }
  if (autograd::needs_grad(bias, a, b)) {
    const bool gbias = bias.requires_grad(), ga = a.requires_grad(), gb = b.requires_grad();
    const bool at = transposed(a), bt = transposed(b);
    // addmm_bf16 keeps its rounded operands instead of the float32 ones, as matmul_bf16 does
    autograd::record(
        op, {bias, a, b}, {out},
        [=, sa = a.shape(), sb = b.shape(), as = bf16 ? autograd::SavedTensor() : autograd::SavedTensor(a, op),
         bs = bf16 ? autograd::SavedTensor() : autograd::SavedTensor(b, op)](const TensorList& g) -> TensorList {
          const Tensor A = bf16 ? ar : as.get(), B = bf16 ? br : bs.get();
          // addmm_bf16: dC rounded once for both products, the bias's gradient (from float32 dC) summed in that pass
          Tensor dbias;
          const Tensor G = bf16 && (ga || gb) ? cpu::round_to_bfloat16(g[0], gbias ? &dbias : nullptr) : g[0];
          TensorList d = product_grads(G, A, B, ga, gb, at, bt, sa, sb, bf16);
          if (gbias && !dbias.defined()) dbias = sum(g[0], {0});
          return {dbias, d[0], d[1]};
        });
  }
  return out;
}

}  // namespace

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) { return addmm_impl(bias, a, b, false); }
Tensor addmm_bf16(const Tensor& bias, const Tensor& a, const Tensor& b) { return addmm_impl(bias, a, b, true); }

}  // namespace asc
