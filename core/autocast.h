#pragma once
// CPU autocast to bfloat16, as torch.autocast("cpu", dtype=torch.bfloat16) treats linear layers. While a CpuAutocast
// is alive on a thread, linear() on float32 CPU tensors — every nn::Linear, so the Transformer's projections and FFN,
// the attention layers' q / k / v / latent projections and the firing layer's Z = X Wᵀ — rounds its two operands to
// bfloat16 (to nearest even; NaN stays NaN) and multiplies them with float32 accumulation into a float32 result,
// through oneDNN's matmul primitive (AMX tiles, or AVX512-BF16's vdpbf16ps). The products of that op's backward run
// the same way, whenever the backward runs. Everything else stays float32: the parameters (the optimizer updates the
// model's own float32 weights, so there is no separate master copy and no loss scaling: bfloat16 has float32's
// range), the activations between ops, normalisation, softmax, losses, and the products inside ASCender's and sparse
// attention's fused kernels. scaled_dot_product_attention on float32 CPU tensors is autocast as PyTorch's is: its
// products in bfloat16 with float32 sums (the fused kernel's own AVX512-BF16 tiles, ops/cpu/attention_bf16.cpp, or
// matmul_bf16 in its composed path), its softmax in float32. matmul() itself is not autocast: the library's composed
// ops (pairwise distances, the mechanisms' reference paths) call it and keep float32.
//
//   if (asc::cpu_bf16_supported()) {
//     asc::CpuAutocast bf16;              // this thread, until the end of the scope
//     Tensor loss = cross_entropy(model.forward(x), y);
//     loss.backward();                    // the products recorded under it run in bfloat16 here too
//   }
//
// Whether it is faster: with AMX (cpu_bf16_amx()) a bfloat16 product runs several times faster than a float32 one;
// with AVX512-BF16 alone (no AMX) it can be slower — some processors issue vdpbf16ps every other cycle
// (asc::cpu_peak().bf16_flops says).
namespace asc {

// The build has oneDNN and the processor multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16, as oneDNN reports
// its effective instruction set).
bool cpu_bf16_supported();
// The processor has AMX-BF16 tiles and oneDNN uses them.
bool cpu_bf16_amx();

// Turns CPU autocast on (or, with enabled = false, off) for the calling thread until it is destroyed; scopes nest,
// each restoring the state it found. Throws asc::Error when enabled and !cpu_bf16_supported().
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled = true);
  ~CpuAutocast();
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool prev_;
};
bool cpu_autocast_enabled();  // on the calling thread

}  // namespace asc
