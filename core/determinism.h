#pragma once
// Deterministic mode, like torch.use_deterministic_algorithms: when on, every op gives bit-identical results from
// run to run on the same device and inputs. The CPU backend always does (its reductions split work by a fixed
// plan, never by atomics). On CUDA the mode changes what runs:
//   * index_add (embedding / index_select backward) always takes its column loop, never atomicAdd;
//   * scatter_add (gather backward) of floating dtypes sums each output fibre in index order in one thread;
//   * scaled_dot_product_attention does not use cuDNN's fused kernels when a backward is needed (their backward
//     may accumulate in an unspecified order); it runs its own kernels;
//   * ascender_attention does not use the fused CUDA row kernels when a gradient is needed (their backward
//     accumulates with atomicAdd): the Auto backend runs the reference, the Fused backend throws. The tensor-core
//     kernels (bfloat16, float16, float32 as TF32), whose backward writes each gradient once, still run.
//
//   asc::use_deterministic_algorithms(true);
//   train(model);   // same losses and weights on every run
namespace asc {

void use_deterministic_algorithms(bool enabled);  // process-wide
bool deterministic_algorithms_enabled();

}  // namespace asc
