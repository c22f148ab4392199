#pragma once
// Memory overlap between tensors, for ops that write in place. Views share storage, so the tensor an op writes may
// reach the same memory as one it reads (x.add_(x.t()), a.copy_(a shifted view), a kernel given W as both output and
// input) or reach one location through several of its own elements (an expand()ed or unfolded tensor). An op that
// cannot give the result of the non-aliased call in such a case refuses it with these checks:
//
//   check_no_internal_overlap(W, "firing_weight_update_");          // W is written: each element must be its own
//   check_no_partial_overlap(W, X, "firing_weight_update_");        // X is read: W itself (elementwise) or disjoint
//
// The error reads as PyTorch's ("unsupported operation: some elements of the input tensor and the written-to tensor
// refer to a single memory location") and names the op and both tensors' shapes and strides.
#include "core/tensor.h"

namespace asc {

enum class MemOverlap {
  None,     // no memory location in common (different storages, or disjoint byte ranges; empty tensors)
  Full,     // the same elements in the same order: same storage, offset, dtype, shape and strides
  Partial,  // anything else whose byte ranges meet (conservative: interleaved views that never meet count here)
};

// Whether two elements of t may be one memory location: a stride of 0 over a dim of size > 1 (expand), or strides
// that interleave (unfold windows). Conservative: a layout that no view op produces may be reported as overlapping.
bool has_internal_overlap(const Tensor& t);
MemOverlap mem_overlap(const Tensor& a, const Tensor& b);

// For the written-to tensor: asc::Error when has_internal_overlap(out).
void check_no_internal_overlap(const Tensor& out, const char* op);
// For an input of an elementwise in-place op: `in` may be `out` itself (MemOverlap::Full: each element is read
// before it is written), or disjoint from it; a partial overlap is an asc::Error. Undefined tensors pass.
void check_no_partial_overlap(const Tensor& out, const Tensor& in, const char* op);
// For an input read across elements (a matrix product, a reduction): any overlap with `out`, even full, is an error.
void check_no_overlap(const Tensor& out, const Tensor& in, const char* op);

}  // namespace asc
