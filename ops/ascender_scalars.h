#pragma once
// What the ASCender op (ops/ascender.h) and its kernels on every backend share: the row order of the stacked (9, H)
// learnable scalars and the constant-row threshold of docs/ascender.md §12.3. Plain C++17 without includes: CUDA
// sources include it too.
namespace asc::ascender {

// Rows of AscenderKernelInputs::scalars.
enum Scalar { kOmegaA, kOmegaS, kOmegaC, kLambdaA, kLambdaS, kLambdaC, kDelta, kKappa, kTauScore, kNumScalars };

// σ_i <= kConstantRow · max_j |β_ij|: row i of a bias is constant and its normalised term is 0.
constexpr double kConstantRow = 1e-5;

}  // namespace asc::ascender
