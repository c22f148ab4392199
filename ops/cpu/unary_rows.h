#pragma once
// The float32 rows of the transcendental unary ops on the CPU (exp, log, GELU, GELU-tanh, SiLU, sigmoid, tanh,
// softplus), forward and backward, vectorised at every instruction set level (ops/cpu/unary_rows.cpp). libm has no
// vector calls GCC would use: std::exp, std::log, std::tanh run one element at a time (a float32 tanh of 2^20
// elements took 8 ms on two cores, 20x PyTorch's), so these rows run ops/cpu/vec_math.h's branch-free functions
// instead. ops/cpu/elementwise.cpp calls them for float32; float64 keeps ops/math.h's functors (libm).
//
//   if (vec_unary_float(Unary::Tanh)) vec_unary_rows(Unary::Tanh, x, 1, y, 1, n, 0, 0);   // y = tanh(x), n floats
#include <cstdint>

#include "core/error.h"
#include "ops/math.h"

namespace asc::cpu {

// Whether op's float32 rows run here.
constexpr bool vec_unary_float(math::Unary op) {
  using math::Unary;
  return op == Unary::Exp || op == Unary::Log || op == Unary::Gelu || op == Unary::GeluTanh || op == Unary::Silu ||
         op == Unary::Sigmoid || op == Unary::Tanh || op == Unary::Softplus;
}

// y[i sy] = op(x[i sx]) for i < n; a, b: softplus's β and threshold (the others ignore them). A strided row gets the
// bits a contiguous one would.
void vec_unary_rows(math::Unary op, const float* x, int64_t sx, float* y, int64_t sy, int64_t n, float a, float b);

// gx[i sgx] = g[i sg] · op'(x[i sx]), given y = op(x) (read by exp, sigmoid and tanh).
void vec_unary_backward_rows(math::Unary op, const float* g, int64_t sg, const float* x, int64_t sx, const float* y,
                             int64_t sy, float* gx, int64_t sgx, int64_t n, float a, float b);

// Calls f.template operator()<U>() with U the compile-time value of op, one of bias_act_dropout's activations (relu,
// GELU, GELU-tanh, SiLU): the float32 rows below and ops/cpu/elementwise.cpp's float64 loop both pick U with it.
template <class F>
void visit_ffn_activation(math::Unary op, F&& f) {
  using math::Unary;
  switch (op) {
    case Unary::Relu: return f.template operator()<Unary::Relu>();
    case Unary::Gelu: return f.template operator()<Unary::Gelu>();
    case Unary::GeluTanh: return f.template operator()<Unary::GeluTanh>();
    case Unary::Silu: return f.template operator()<Unary::Silu>();
    default: ASC_THROW("bias_act_dropout: activation {} is not relu, gelu, gelu_tanh or silu", static_cast<int>(op));
  }
}

// One row segment of bias_act_dropout (act: Relu, Gelu, GeluTanh or Silu): y[i] = act(x[i] + b[i]) · m[i] with
// m[i] = (u[i] >= p ? scale : 0) and keep[i] = u[i] >= p; b null: no bias; u null: no dropout (m = 1, keep unused);
// slope non-null: slope[i] = act'(x[i] + b[i]) as well.
void vec_bias_act_rows(math::Unary act, const float* x, const float* b, const float* u, float p, float scale, float* y,
                       bool* keep, float* slope, int64_t n);
// Its backward: gx[i] = (g[i] · (keep[i] ? scale : 0)) · slope[i]; keep null: no dropout.
void vec_bias_act_backward_rows(const float* g, const float* slope, const bool* keep, float scale, float* gx,
                                int64_t n);

}  // namespace asc::cpu
