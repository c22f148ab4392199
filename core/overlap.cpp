// Memory overlap between tensors (core/overlap.h).
#include "core/overlap.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/format.h"

namespace asc {

namespace {

// [first, last) bytes of the storage that t's elements (at least one) occupy. A negative stride (make_view) reaches
// below the offset.
std::pair<int64_t, int64_t> byte_range(const Tensor& t) {
  const int64_t es = static_cast<int64_t>(t.element_size());
  int64_t first = t.offset(), last = t.offset();
  for (int d = 0; d < t.dim(); ++d) (t.stride(d) < 0 ? first : last) += (t.size(d) - 1) * t.stride(d);
  return {first * es, (last + 1) * es};
}

// Same elements in the same order: strides only matter over dims of size > 1.
bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.offset() != b.offset() || a.shape() != b.shape()) return false;
  for (int d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

}  // namespace

bool has_internal_overlap(const Tensor& t) {
  if (t.numel() <= 1) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1)
      dims.emplace_back(t.stride(d) < 0 ? -t.stride(d) : t.stride(d), t.size(d));  // mirrored: same overlap
  std::sort(dims.begin(), dims.end());
  // Dims by increasing stride: each stride must pass the furthest element the smaller dims reach, else two index
  // tuples can meet (or the layout is too tangled to tell, which counts as overlap).
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += (size - 1) * stride;
  }
  return false;
}

MemOverlap mem_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return MemOverlap::None;
  if (!a.shares_storage(b)) return MemOverlap::None;
  if (same_layout(a, b)) return MemOverlap::Full;
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a1 <= b0 || b1 <= a0 ? MemOverlap::None : MemOverlap::Partial;
}

void check_no_internal_overlap(const Tensor& out, const char* op) {
  ASC_CHECK(!out.defined() || !has_internal_overlap(out),
            "{}: unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location (shape {}, strides {}: an expand()ed or overlapping view); write into a clone() of it",
            op, out.shape(), out.strides());
}

void check_no_partial_overlap(const Tensor& out, const Tensor& in, const char* op) {
  ASC_CHECK(mem_overlap(out, in) != MemOverlap::Partial,
            "{}: unsupported operation: some elements of the input tensor (shape {}, strides {}, offset {}) and the "
            "written-to tensor (shape {}, strides {}, offset {}) refer to a single memory location; pass a clone() "
            "of the input",
            op, in.shape(), in.strides(), in.offset(), out.shape(), out.strides(), out.offset());
}

void check_no_overlap(const Tensor& out, const Tensor& in, const char* op) {
  ASC_CHECK(mem_overlap(out, in) == MemOverlap::None,
            "{}: unsupported operation: the input tensor (shape {}, strides {}, offset {}) and the written-to tensor "
            "(shape {}, strides {}, offset {}) share memory, and this op reads other elements than the one it "
            "writes; pass a clone() of the input",
            op, in.shape(), in.strides(), in.offset(), out.shape(), out.strides(), out.offset());
}

}  // namespace asc
