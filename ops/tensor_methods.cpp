// Tensor's op methods and operators: thin forwards to the free functions.
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/reduce.h"

namespace asc {

Tensor Tensor::operator-() const { return neg(*this); }
Tensor Tensor::add(const Tensor& o) const { return asc::add(*this, o); }
Tensor Tensor::sub(const Tensor& o) const { return asc::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return asc::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return asc::div(*this, o); }
Tensor Tensor::pow(double e) const { return asc::pow(*this, e); }
Tensor Tensor::exp() const { return asc::exp(*this); }
Tensor Tensor::log() const { return asc::log(*this); }
Tensor Tensor::sqrt() const { return asc::sqrt(*this); }
Tensor Tensor::abs() const { return asc::abs(*this); }
Tensor Tensor::relu() const { return asc::relu(*this); }
Tensor Tensor::sigmoid() const { return asc::sigmoid(*this); }
Tensor Tensor::tanh() const { return asc::tanh(*this); }
Tensor Tensor::sum() const { return asc::sum(*this); }
Tensor Tensor::sum(const Dims& dims, bool keepdim) const { return asc::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return asc::mean(*this); }
Tensor Tensor::mean(const Dims& dims, bool keepdim) const { return asc::mean(*this, dims, keepdim); }
Tensor Tensor::matmul(const Tensor& o) const { return asc::matmul(*this, o); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return rdiv(a, b); }

}  // namespace asc
