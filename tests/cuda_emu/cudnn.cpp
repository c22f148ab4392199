// The CUDA emulator's cuDNN: the backend (graph) API as a small interpreter on the CPU. Descriptors copy what they
// are given (as the library does, so operation and tensor descriptors may be destroyed once the plan exists), the
// operation graph is checked and topologically sorted when it is finalized, and cudnnBackendExecute runs the
// operations one after another inside one device operation. See tests/cuda_emu/include/cudnn.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "emulator.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace {

using namespace asc::cuda::emu;

constexpr int kMaxDims = 8;
constexpr int64_t kPointerAlignment = 16;  // what the fused attention engines need of every device pointer

thread_local std::string t_last_error;

cudnnStatus_t fail(cudnnStatus_t status, const std::string& why) {
  t_last_error = why;
  return status;
}

// ---- names for messages --------------------------------------------------------------------------------------------

std::string descriptor_name(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "MATMUL";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "REDUCTION";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "OPERATION_RESHAPE";
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR: return "DEVICEPROP";
  }
  return "descriptor type " + std::to_string(static_cast<int>(t));
}

std::string type_name(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return "CUDNN_TYPE_HANDLE";
    case CUDNN_TYPE_DATA_TYPE: return "CUDNN_TYPE_DATA_TYPE";
    case CUDNN_TYPE_BOOLEAN: return "CUDNN_TYPE_BOOLEAN";
    case CUDNN_TYPE_INT64: return "CUDNN_TYPE_INT64";
    case CUDNN_TYPE_FLOAT: return "CUDNN_TYPE_FLOAT";
    case CUDNN_TYPE_DOUBLE: return "CUDNN_TYPE_DOUBLE";
    case CUDNN_TYPE_VOID_PTR: return "CUDNN_TYPE_VOID_PTR";
    case CUDNN_TYPE_HEUR_MODE: return "CUDNN_TYPE_HEUR_MODE";
    case CUDNN_TYPE_POINTWISE_MODE: return "CUDNN_TYPE_POINTWISE_MODE";
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return "CUDNN_TYPE_BACKEND_DESCRIPTOR";
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: return "CUDNN_TYPE_REDUCTION_OPERATOR_TYPE";
    case CUDNN_TYPE_CHAR: return "CUDNN_TYPE_CHAR";
  }
  return "attribute type " + std::to_string(static_cast<int>(t));
}

std::string data_type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_INT32: return "INT32";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
    case CUDNN_DATA_BOOLEAN: return "BOOLEAN";
  }
  return "data type " + std::to_string(static_cast<int>(t));
}

bool data_type_ok(cudnnDataType_t t) { return data_type_name(t).find(' ') == std::string::npos; }

std::string pointwise_name(cudnnPointwiseMode_t m) {
  switch (m) {
    case CUDNN_POINTWISE_ADD: return "ADD";
    case CUDNN_POINTWISE_MUL: return "MUL";
    case CUDNN_POINTWISE_DIV: return "DIV";
    case CUDNN_POINTWISE_SUB: return "SUB";
    case CUDNN_POINTWISE_EXP: return "EXP";
    case CUDNN_POINTWISE_LOG: return "LOG";
    case CUDNN_POINTWISE_IDENTITY: return "IDENTITY";
    case CUDNN_POINTWISE_CMP_GE: return "CMP_GE";
    case CUDNN_POINTWISE_GEN_INDEX: return "GEN_INDEX";
    case CUDNN_POINTWISE_BINARY_SELECT: return "BINARY_SELECT";
  }
  return "";
}

// Inputs besides X: 0 (unary), 1 (B) or 2 (B and the predicate T).
int pointwise_extra_inputs(cudnnPointwiseMode_t m) {
  switch (m) {
    case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_LOG:
    case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_GEN_INDEX: return 0;
    case CUDNN_POINTWISE_BINARY_SELECT: return 2;
    default: return 1;
  }
}

size_t element_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 4;
  }
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + ")";
}

// ---- graph contents (values: descriptors copy them, so the originals may be destroyed) -----------------------------

struct TensorInfo {
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t uid = 0, alignment = 0;
  bool is_virtual = false, by_value = false;
  bool operator==(const TensorInfo&) const = default;

  int rank() const { return static_cast<int>(dims.size()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  // Elements from the first to one past the last addressed by dims and strides.
  int64_t extent() const {
    int64_t e = 1;
    for (int i = 0; i < rank(); ++i) e += (dims[i] - 1) * strides[i];
    return e;
  }
  std::string str() const {
    return "uid " + std::to_string(uid) + " " + shape_str(dims) + " strides " + shape_str(strides) + " " +
           data_type_name(dtype) + (is_virtual ? " virtual" : "") + (by_value ? " by-value" : "");
  }
};

// The memory layout of a tensor as (stride, dim) pairs of its dims > 1, by increasing stride, with neighbours that
// are contiguous merged. Two tensors with the same layout address the same set of offsets, element for element, in
// memory order; nullopt when the strides overlap (two indices at one offset).
std::optional<std::vector<std::pair<int64_t, int64_t>>> memory_layout(const TensorInfo& t) {
  std::vector<std::pair<int64_t, int64_t>> l;
  for (int i = 0; i < t.rank(); ++i)
    if (t.dims[i] > 1) l.push_back({t.strides[i], t.dims[i]});
  std::sort(l.begin(), l.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [s, d] : l) {
    if (!merged.empty() && s < merged.back().first * merged.back().second) return std::nullopt;
    if (!merged.empty() && s == merged.back().first * merged.back().second)
      merged.back().second *= d;
    else
      merged.push_back({s, d});
  }
  return merged;
}

enum class OpKind { Pointwise, Reduction, Matmul, Reshape };

struct Op {
  OpKind kind = OpKind::Pointwise;
  std::string name;  // for messages: "POINTWISE MUL (output uid 7)"
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY;
  int64_t axis = 0;
  cudnnReduceTensorOp_t reduce = CUDNN_REDUCE_TENSOR_ADD;
  std::vector<TensorInfo> in;  // pointwise X[, B[, T]]; reduction X; matmul A, B; reshape X
  TensorInfo out;
};

struct Graph {
  std::vector<Op> ops;                    // in execution (dependency) order
  std::map<int64_t, TensorInfo> tensors;  // every tensor by UID
};

// ---- descriptors ---------------------------------------------------------------------------------------------------

struct Attr {
  cudnnBackendAttributeName_t name;
  cudnnBackendAttributeType_t type;
  int64_t count;
  const void* data;
};

struct Descriptor {
  explicit Descriptor(cudnnBackendDescriptorType_t t) : type(t) {}
  virtual ~Descriptor() = default;
  std::string name() const { return descriptor_name(type); }
  virtual cudnnStatus_t set(const Attr& a) = 0;
  virtual cudnnStatus_t finalize() = 0;
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<const void*>& live_descriptors() {
  static std::set<const void*> s;
  return s;
}
std::set<const void*>& live_handles() {
  static std::set<const void*> s;
  return s;
}

Descriptor* find_descriptor(const void* p) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return live_descriptors().count(p) ? static_cast<Descriptor*>(const_cast<void*>(p)) : nullptr;
}
bool handle_ok(cudnnHandle_t h) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return h && live_handles().count(h);
}

std::string attr_str(const Descriptor& d, cudnnBackendAttributeName_t n) {
  return d.name() + " attribute " + std::to_string(static_cast<int>(n));
}

// The attribute has type `want` and lo..hi elements.
cudnnStatus_t expect(const Descriptor& d, const Attr& a, cudnnBackendAttributeType_t want, int64_t lo, int64_t hi) {
  if (a.type != want)
    return fail(CUDNN_STATUS_BAD_PARAM,
                attr_str(d, a.name) + ": given as " + type_name(a.type) + ", expected " + type_name(want));
  if (a.count < lo || a.count > hi)
    return fail(CUDNN_STATUS_BAD_PARAM,
                attr_str(d, a.name) + ": " + std::to_string(a.count) + " elements, expected " +
                    (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi)));
  if (a.count > 0 && !a.data) return fail(CUDNN_STATUS_BAD_PARAM, attr_str(d, a.name) + ": null array");
  return CUDNN_STATUS_SUCCESS;
}

template <class T>
T value(const Attr& a) {
  T v;
  std::memcpy(&v, a.data, sizeof(T));
  return v;
}
template <class T>
std::vector<T> values(const Attr& a) {
  std::vector<T> v(static_cast<size_t>(a.count));
  if (a.count > 0) std::memcpy(v.data(), a.data, v.size() * sizeof(T));
  return v;
}

// A BACKEND_DESCRIPTOR element: a live, finalized descriptor of type `want`.
cudnnStatus_t descriptor_arg(const Descriptor& d, const Attr& a, const void* p, cudnnBackendDescriptorType_t want,
                             Descriptor** out) {
  Descriptor* x = find_descriptor(p);
  if (!x) return fail(CUDNN_STATUS_BAD_PARAM, attr_str(d, a.name) + ": not a live backend descriptor");
  if (x->type != want)
    return fail(CUDNN_STATUS_BAD_PARAM,
                attr_str(d, a.name) + ": a " + x->name() + " descriptor, expected " + descriptor_name(want));
  if (!x->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, attr_str(d, a.name) + ": the " + x->name() + " descriptor is not finalized");
  *out = x;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t unknown_attr(const Descriptor& d, const Attr& a) {
  return fail(CUDNN_STATUS_BAD_PARAM, attr_str(d, a.name) + ": not an attribute of this descriptor (or not emulated)");
}

#define ASC_CUDNN_TRY(expr)                              \
  do {                                                   \
    const cudnnStatus_t asc_st_ = (expr);                \
    if (asc_st_ != CUDNN_STATUS_SUCCESS) return asc_st_; \
  } while (0)

struct TensorDesc : Descriptor {
  TensorDesc() : Descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR) {}
  TensorInfo t;
  bool has_type = false, has_dims = false, has_strides = false, has_uid = false, has_alignment = false;

  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_TENSOR_DATA_TYPE:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_DATA_TYPE, 1, 1));
        t.dtype = values<cudnnDataType_t>(a)[0];
        has_type = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_DIMENSIONS:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_INT64, 1, kMaxDims));
        t.dims = values<int64_t>(a);
        has_dims = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_STRIDES:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_INT64, 1, kMaxDims));
        t.strides = values<int64_t>(a);
        has_strides = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_UNIQUE_ID:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_INT64, 1, 1));
        t.uid = values<int64_t>(a)[0];
        has_uid = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_INT64, 1, 1));
        t.alignment = values<int64_t>(a)[0];
        has_alignment = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BOOLEAN, 1, 1));
        t.is_virtual = value<bool>(a);
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BOOLEAN, 1, 1));
        t.by_value = value<bool>(a);
        return CUDNN_STATUS_SUCCESS;
      default: return unknown_attr(*this, a);
    }
  }

  cudnnStatus_t finalize() override {
    const std::string who = "TENSOR uid " + (has_uid ? std::to_string(t.uid) : std::string("(unset)"));
    const char* missing = !has_type        ? "CUDNN_ATTR_TENSOR_DATA_TYPE"
                          : !has_dims      ? "CUDNN_ATTR_TENSOR_DIMENSIONS"
                          : !has_strides   ? "CUDNN_ATTR_TENSOR_STRIDES"
                          : !has_uid       ? "CUDNN_ATTR_TENSOR_UNIQUE_ID"
                          : !has_alignment ? "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"
                                           : nullptr;
    if (missing) return fail(CUDNN_STATUS_BAD_PARAM, who + ": " + missing + " was not set");
    if (!data_type_ok(t.dtype))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, who + ": " + data_type_name(t.dtype) + " is not emulated");
    if (t.dims.size() != t.strides.size())
      return fail(CUDNN_STATUS_BAD_PARAM, who + ": " + std::to_string(t.dims.size()) + " dimensions but " +
                                              std::to_string(t.strides.size()) + " strides");
    for (int i = 0; i < t.rank(); ++i)
      if (t.dims[i] < 1 || t.strides[i] < 1)
        return fail(CUDNN_STATUS_BAD_PARAM, who + ": dimensions " + shape_str(t.dims) + " and strides " +
                                                shape_str(t.strides) + " must be positive");
    if (t.alignment < 1 || (t.alignment & (t.alignment - 1)) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM,
                  who + ": byte alignment " + std::to_string(t.alignment) + " is not a power of two");
    if (t.is_virtual && t.by_value)
      return fail(CUDNN_STATUS_BAD_PARAM, who + ": a tensor cannot be both virtual and by-value");
    if (t.by_value && (t.numel() != 1 || t.dtype != CUDNN_DATA_FLOAT))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, who + ": the emulator's by-value tensors are one FLOAT (a host float)");
    // The library bit-packs booleans in memory; only virtual booleans (masks between operations) are emulated.
    if (t.dtype == CUDNN_DATA_BOOLEAN && !t.is_virtual)
      return fail(CUDNN_STATUS_NOT_SUPPORTED, who + ": non-virtual BOOLEAN tensors are not emulated");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

// A setting that holds one value of an enum or scalar type.
template <class T>
cudnnStatus_t set_one(const Descriptor& d, const Attr& a, cudnnBackendAttributeType_t type, std::optional<T>* out) {
  ASC_CUDNN_TRY(expect(d, a, type, 1, 1));
  *out = value<T>(a);
  return CUDNN_STATUS_SUCCESS;
}

bool compute_type_ok(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT; }

struct PointwiseDesc : Descriptor {
  PointwiseDesc() : Descriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR) {}
  std::optional<cudnnPointwiseMode_t> mode;
  std::optional<cudnnDataType_t> prec;
  std::optional<int64_t> axis;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_POINTWISE_MODE: return set_one(*this, a, CUDNN_TYPE_POINTWISE_MODE, &mode);
      case CUDNN_ATTR_POINTWISE_MATH_PREC: return set_one(*this, a, CUDNN_TYPE_DATA_TYPE, &prec);
      case CUDNN_ATTR_POINTWISE_AXIS: return set_one(*this, a, CUDNN_TYPE_INT64, &axis);
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!mode) return fail(CUDNN_STATUS_BAD_PARAM, "POINTWISE: CUDNN_ATTR_POINTWISE_MODE was not set");
    if (pointwise_name(*mode).empty())
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  "POINTWISE: mode " + std::to_string(static_cast<int>(*mode)) + " is not emulated");
    if (!prec) return fail(CUDNN_STATUS_BAD_PARAM, "POINTWISE: CUDNN_ATTR_POINTWISE_MATH_PREC was not set");
    // Everything is computed in double; 16-bit math precisions would round in between, which is not emulated.
    if (*prec != CUDNN_DATA_FLOAT && *prec != CUDNN_DATA_INT32 && *prec != CUDNN_DATA_BOOLEAN)
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  "POINTWISE " + pointwise_name(*mode) + ": math precision " + data_type_name(*prec) + " not emulated");
    if (*mode == CUDNN_POINTWISE_GEN_INDEX && !axis)
      return fail(CUDNN_STATUS_BAD_PARAM, "POINTWISE GEN_INDEX: CUDNN_ATTR_POINTWISE_AXIS was not set");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct ReductionDesc : Descriptor {
  ReductionDesc() : Descriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR) {}
  std::optional<cudnnReduceTensorOp_t> op;
  std::optional<cudnnDataType_t> comp;
  std::optional<bool> deterministic;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_REDUCTION_OPERATOR: return set_one(*this, a, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &op);
      case CUDNN_ATTR_REDUCTION_COMP_TYPE: return set_one(*this, a, CUDNN_TYPE_DATA_TYPE, &comp);
      case CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC:  // the emulator always is
        return set_one(*this, a, CUDNN_TYPE_BOOLEAN, &deterministic);
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!op) return fail(CUDNN_STATUS_BAD_PARAM, "REDUCTION: CUDNN_ATTR_REDUCTION_OPERATOR was not set");
    if (*op != CUDNN_REDUCE_TENSOR_ADD && *op != CUDNN_REDUCE_TENSOR_MAX)
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  "REDUCTION: operator " + std::to_string(static_cast<int>(*op)) + " is not emulated (ADD, MAX are)");
    if (!comp) return fail(CUDNN_STATUS_BAD_PARAM, "REDUCTION: CUDNN_ATTR_REDUCTION_COMP_TYPE was not set");
    if (!compute_type_ok(*comp))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, "REDUCTION: compute type " + data_type_name(*comp) + " not emulated");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct MatmulDesc : Descriptor {
  MatmulDesc() : Descriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR) {}
  std::optional<cudnnDataType_t> comp;
  std::optional<double> padding;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_MATMUL_COMP_TYPE: return set_one(*this, a, CUDNN_TYPE_DATA_TYPE, &comp);
      case CUDNN_ATTR_MATMUL_PADDING_VALUE: return set_one(*this, a, CUDNN_TYPE_DOUBLE, &padding);
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!comp) return fail(CUDNN_STATUS_BAD_PARAM, "MATMUL: CUDNN_ATTR_MATMUL_COMP_TYPE was not set");
    if (!compute_type_ok(*comp))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, "MATMUL: compute type " + data_type_name(*comp) + " not emulated");
    // Padding only matters with GEMM M/N/K overrides, which are not emulated.
    if (padding && *padding != 0.0)
      return fail(CUDNN_STATUS_NOT_SUPPORTED, "MATMUL: a nonzero padding value is not emulated");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

// Y's dims and each input's: equal, or the input's is 1 (broadcast).
cudnnStatus_t check_broadcast(const std::string& op, const char* port, const TensorInfo& x, const TensorInfo& y) {
  bool ok = x.rank() == y.rank();
  for (int i = 0; ok && i < x.rank(); ++i) ok = x.dims[i] == y.dims[i] || x.dims[i] == 1;
  if (!ok)
    return fail(CUDNN_STATUS_BAD_PARAM,
                op + ": operand " + port + " " + x.str() + " does not match or broadcast to the output " + y.str());
  return CUDNN_STATUS_SUCCESS;
}

struct OperationDesc : Descriptor {
  explicit OperationDesc(cudnnBackendDescriptorType_t t) : Descriptor(t) {}
  std::map<int, TensorInfo> ports;  // by attribute name
  std::optional<PointwiseDesc> pw;
  std::optional<ReductionDesc> red;
  std::optional<MatmulDesc> mm;
  std::optional<double> alpha1, alpha2;
  Op op;

  cudnnStatus_t set_port(const Attr& a) {
    ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
    Descriptor* d = nullptr;
    ASC_CUDNN_TRY(descriptor_arg(*this, a, values<const void*>(a)[0], CUDNN_BACKEND_TENSOR_DESCRIPTOR, &d));
    ports[a.name] = static_cast<TensorDesc*>(d)->t;
    return CUDNN_STATUS_SUCCESS;
  }
  template <class D>
  cudnnStatus_t set_desc(const Attr& a, cudnnBackendDescriptorType_t want, std::optional<D>* out) {
    ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
    Descriptor* d = nullptr;
    ASC_CUDNN_TRY(descriptor_arg(*this, a, values<const void*>(a)[0], want, &d));
    *out = *static_cast<D*>(d);
    return CUDNN_STATUS_SUCCESS;
  }
  cudnnStatus_t set_alpha(const Attr& a, std::optional<double>* out) {
    if (a.type == CUDNN_TYPE_DOUBLE) {
      ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_DOUBLE, 1, 1));
      *out = values<double>(a)[0];
    } else {
      ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_FLOAT, 1, 1));
      *out = values<float>(a)[0];
    }
    return CUDNN_STATUS_SUCCESS;
  }

  cudnnStatus_t set(const Attr& a) override {
    switch (type) {
      case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        switch (a.name) {
          case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
            return set_desc(a, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw);
          case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
          case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
          case CUDNN_ATTR_OPERATION_POINTWISE_TDESC:
          case CUDNN_ATTR_OPERATION_POINTWISE_YDESC: return set_port(a);
          case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1: return set_alpha(a, &alpha1);
          case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2: return set_alpha(a, &alpha2);
          default: return unknown_attr(*this, a);
        }
      case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        switch (a.name) {
          case CUDNN_ATTR_OPERATION_REDUCTION_DESC: return set_desc(a, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &red);
          case CUDNN_ATTR_OPERATION_REDUCTION_XDESC:
          case CUDNN_ATTR_OPERATION_REDUCTION_YDESC: return set_port(a);
          default: return unknown_attr(*this, a);
        }
      case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        switch (a.name) {
          case CUDNN_ATTR_OPERATION_MATMUL_DESC: return set_desc(a, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm);
          case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
          case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
          case CUDNN_ATTR_OPERATION_MATMUL_CDESC: return set_port(a);
          default: return unknown_attr(*this, a);
        }
      default:  // reshape
        switch (a.name) {
          case CUDNN_ATTR_OPERATION_RESHAPE_XDESC:
          case CUDNN_ATTR_OPERATION_RESHAPE_YDESC: return set_port(a);
          default: return unknown_attr(*this, a);
        }
    }
  }

  // The tensor at `port`, which must be set (required) or may be (optional); by-value only where allowed.
  cudnnStatus_t port(int name, const char* what, bool required, bool by_value_ok, std::optional<TensorInfo>* out) {
    auto it = ports.find(name);
    if (it == ports.end()) {
      if (required) return fail(CUDNN_STATUS_BAD_PARAM, this->name() + ": " + what + " was not set");
      return CUDNN_STATUS_SUCCESS;
    }
    // The library crashes or mis-executes with a scalar where it expects a tensor (SDPA recipe: never in XDESC).
    if (it->second.by_value && !by_value_ok)
      return fail(CUDNN_STATUS_BAD_PARAM,
                  this->name() + ": " + what + " is the by-value tensor " + it->second.str() + ", not allowed there");
    *out = it->second;
    return CUDNN_STATUS_SUCCESS;
  }

  cudnnStatus_t finalize() override {
    std::optional<TensorInfo> x, b, t, y;
    op = Op{};
    switch (type) {
      case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        if (!pw)
          return fail(CUDNN_STATUS_BAD_PARAM,
                      "OPERATION_POINTWISE: CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR "
                      "was not set");
        const cudnnPointwiseMode_t m = *pw->mode;
        const int extra = pointwise_extra_inputs(m);
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "XDESC", true, false, &x));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "YDESC", true, false, &y));
        op.kind = OpKind::Pointwise;
        op.mode = m;
        op.name = "OPERATION_POINTWISE " + pointwise_name(m) + " (output uid " + std::to_string(y->uid) + ")";
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "BDESC", extra >= 1, true, &b));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, "TDESC", extra >= 2, false, &t));
        if ((extra < 1 && b) || (extra < 2 && t))
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": " + (extra < 1 && b ? "BDESC" : "TDESC") +
                                                  " given to a mode that has no such input");
        for (auto [alpha, nm] : {std::pair{alpha1, "ALPHA1"}, std::pair{alpha2, "ALPHA2"}})
          if (alpha && *alpha != 1.0)
            return fail(CUDNN_STATUS_NOT_SUPPORTED,
                        op.name + ": " + nm + " = " + std::to_string(*alpha) + " is not emulated (only 1.0)");
        op.in = {*x};
        if (b) op.in.push_back(*b);
        if (t) op.in.push_back(*t);
        const char* names[] = {"X", "B", "T"};
        for (size_t i = 0; i < op.in.size(); ++i) ASC_CUDNN_TRY(check_broadcast(op.name, names[i], op.in[i], *y));
        if (m == CUDNN_POINTWISE_GEN_INDEX && (*pw->axis < 0 || *pw->axis >= y->rank()))
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": axis " + std::to_string(*pw->axis) +
                                                  " outside the output's rank " + std::to_string(y->rank()));
        op.axis = pw->axis.value_or(0);
        break;
      }
      case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        if (!red)
          return fail(CUDNN_STATUS_BAD_PARAM,
                      "OPERATION_REDUCTION: CUDNN_ATTR_OPERATION_REDUCTION_DESC "
                      "was not set");
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, "XDESC", true, false, &x));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, "YDESC", true, false, &y));
        op.kind = OpKind::Reduction;
        op.reduce = *red->op;
        op.name = std::string("OPERATION_REDUCTION ") + (op.reduce == CUDNN_REDUCE_TENSOR_ADD ? "ADD" : "MAX") +
                  " (output uid " + std::to_string(y->uid) + ")";
        bool ok = x->rank() == y->rank();
        for (int i = 0; ok && i < x->rank(); ++i) ok = y->dims[i] == x->dims[i] || y->dims[i] == 1;
        if (!ok)
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": output " + y->str() + " is not the input " + x->str() +
                                                  " with some dims reduced to 1");
        op.in = {*x};
        break;
      }
      case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        if (!mm) return fail(CUDNN_STATUS_BAD_PARAM, "OPERATION_MATMUL: CUDNN_ATTR_OPERATION_MATMUL_DESC was not set");
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_MATMUL_ADESC, "ADESC", true, false, &x));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_MATMUL_BDESC, "BDESC", true, false, &b));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_MATMUL_CDESC, "CDESC", true, false, &y));
        op.kind = OpKind::Matmul;
        op.name = "OPERATION_MATMUL (output uid " + std::to_string(y->uid) + ")";
        const int r = y->rank();
        if (r < 2 || x->rank() != r || b->rank() != r)
          return fail(CUDNN_STATUS_BAD_PARAM,
                      op.name + ": A " + x->str() + ", B " + b->str() + " and C " + y->str() + " need one rank >= 2");
        if (x->dims[r - 1] != b->dims[r - 2])
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": inner dimensions differ: A " + x->str() + ", B " + b->str());
        bool ok = y->dims[r - 2] == x->dims[r - 2] && y->dims[r - 1] == b->dims[r - 1];
        for (int i = 0; ok && i < r - 2; ++i)
          ok = (x->dims[i] == y->dims[i] || x->dims[i] == 1) && (b->dims[i] == y->dims[i] || b->dims[i] == 1);
        if (!ok)
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": C " + y->str() + " is not A " + x->str() + " @ B " +
                                                  b->str() + " (batch dims broadcast)");
        op.in = {*x, *b};
        break;
      }
      default: {
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, "XDESC", true, false, &x));
        ASC_CUDNN_TRY(port(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, "YDESC", true, false, &y));
        op.kind = OpKind::Reshape;
        op.name = "OPERATION_RESHAPE (output uid " + std::to_string(y->uid) + ")";
        // Y views X's memory through its own dims and strides: a transpose when Y permutes X's strides, a reshape
        // when both are the same contiguous run. Anything else would read memory X does not describe.
        const auto lx = memory_layout(*x), ly = memory_layout(*y);
        if (!lx || !ly || *lx != *ly)
          return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": Y " + y->str() + " does not view the same elements as X " +
                                                  x->str() + " (reshape reinterprets X's memory with Y's strides)");
        op.in = {*x};
        break;
      }
    }
    if (y->by_value) return fail(CUDNN_STATUS_BAD_PARAM, op.name + ": the output is the by-value tensor " + y->str());
    op.out = *y;
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct GraphDesc : Descriptor {
  GraphDesc() : Descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) {}
  std::vector<Op> ops;
  bool has_ops = false;
  std::shared_ptr<const Graph> graph;

  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_OPERATIONGRAPH_HANDLE: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_HANDLE, 1, 1));
        if (!handle_ok(values<cudnnHandle_t>(a)[0]))
          return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: CUDNN_ATTR_OPERATIONGRAPH_HANDLE is not a live handle");
        return CUDNN_STATUS_SUCCESS;
      }
      case CUDNN_ATTR_OPERATIONGRAPH_OPS: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1 << 20));
        std::vector<Op> got;
        for (const void* p : values<const void*>(a)) {
          Descriptor* d = find_descriptor(p);
          if (!d || (d->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
                     d->type != CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR &&
                     d->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR &&
                     d->type != CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR))
            return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: element " + std::to_string(got.size()) +
                                                    " of CUDNN_ATTR_OPERATIONGRAPH_OPS is not a live operation "
                                                    "descriptor of an emulated kind");
          if (!d->finalized)
            return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: element " + std::to_string(got.size()) + " (" +
                                                    d->name() + ") is not finalized");
          got.push_back(static_cast<OperationDesc*>(d)->op);
        }
        ops = std::move(got);
        has_ops = true;
        return CUDNN_STATUS_SUCCESS;
      }
      default: return unknown_attr(*this, a);
    }
  }

  cudnnStatus_t finalize() override {
    if (!has_ops) return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: CUDNN_ATTR_OPERATIONGRAPH_OPS was not set");
    auto g = std::make_shared<Graph>();
    std::map<int64_t, size_t> producer;
    for (size_t i = 0; i < ops.size(); ++i) {
      std::vector<const TensorInfo*> all;
      for (const TensorInfo& t : ops[i].in) all.push_back(&t);
      all.push_back(&ops[i].out);
      for (const TensorInfo* t : all) {
        auto [it, fresh] = g->tensors.emplace(t->uid, *t);
        if (!fresh && !(it->second == *t))
          return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: UID " + std::to_string(t->uid) +
                                                  " names two different tensors: " + it->second.str() + " and " +
                                                  t->str() + " (in " + ops[i].name + ")");
      }
      auto [it, fresh] = producer.emplace(ops[i].out.uid, i);
      if (!fresh)
        return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: tensor uid " + std::to_string(ops[i].out.uid) +
                                                " is written by two operations: " + ops[it->second].name + " and " +
                                                ops[i].name);
    }
    for (const auto& [uid, t] : g->tensors) {
      if (t.is_virtual && !producer.count(uid))
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "OPERATIONGRAPH: virtual tensor " + t.str() + " is read but no operation writes it");
      // Two output elements at one address would make the result depend on the order they are written in.
      if (!t.is_virtual && producer.count(uid) && !memory_layout(t))
        return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: output tensor " + t.str() + " has overlapping strides");
    }
    // Kahn's algorithm, the array order breaking ties: the OPS array need not be topological.
    std::vector<std::vector<size_t>> users(ops.size());
    std::vector<int> pending(ops.size(), 0);
    for (size_t i = 0; i < ops.size(); ++i)
      for (const TensorInfo& t : ops[i].in) {
        auto it = producer.find(t.uid);
        if (it == producer.end()) continue;
        users[it->second].push_back(i);
        ++pending[i];
      }
    std::set<size_t> ready;
    for (size_t i = 0; i < ops.size(); ++i)
      if (pending[i] == 0) ready.insert(i);
    while (!ready.empty()) {
      const size_t i = *ready.begin();
      ready.erase(ready.begin());
      g->ops.push_back(ops[i]);
      for (size_t u : users[i])
        if (--pending[u] == 0) ready.insert(u);
    }
    if (g->ops.size() != ops.size())
      for (size_t i = 0; i < ops.size(); ++i)
        if (pending[i] > 0)
          return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: the operations form a cycle through " + ops[i].name);
    graph = std::move(g);
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

// Device properties for planning without a handle (the offline support check). The JSON is kept, not interpreted:
// the emulator plans every graph the same way.
struct DevicePropDesc : Descriptor {
  DevicePropDesc() : Descriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR) {}
  std::string json;
  cudnnStatus_t set(const Attr& a) override {
    if (a.name != CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION) return unknown_attr(*this, a);
    ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_CHAR, 1, int64_t{1} << 30));
    json.assign(static_cast<const char*>(a.data), strnlen(static_cast<const char*>(a.data), a.count));
    return CUDNN_STATUS_SUCCESS;
  }
  cudnnStatus_t finalize() override {
    const size_t first = json.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || json[first] != '{')
      return fail(CUDNN_STATUS_BAD_PARAM, "DEVICEPROP: CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION is not a JSON object");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct HeurDesc : Descriptor {
  HeurDesc() : Descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR) {}
  std::shared_ptr<const Graph> graph;
  std::optional<cudnnBackendHeurMode_t> mode;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
        Descriptor* d = nullptr;
        ASC_CUDNN_TRY(descriptor_arg(*this, a, values<const void*>(a)[0], CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &d));
        graph = static_cast<GraphDesc*>(d)->graph;
        return CUDNN_STATUS_SUCCESS;
      }
      case CUDNN_ATTR_ENGINEHEUR_MODE: return set_one(*this, a, CUDNN_TYPE_HEUR_MODE, &mode);
      case CUDNN_ATTR_ENGINEHEUR_DEVICEPROP: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
        Descriptor* d = nullptr;
        return descriptor_arg(*this, a, values<const void*>(a)[0], CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d);
      }
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!graph) return fail(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH was not set");
    if (!mode) return fail(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: CUDNN_ATTR_ENGINEHEUR_MODE was not set");
    if (*mode < CUDNN_HEUR_MODE_INSTANT || *mode > CUDNN_HEUR_MODE_A)
      return fail(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: unknown heuristics mode " + std::to_string(*mode));
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct EngineCfgDesc : Descriptor {
  EngineCfgDesc() : Descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) {}
  std::shared_ptr<const Graph> graph;
  cudnnStatus_t set(const Attr& a) override { return unknown_attr(*this, a); }
  cudnnStatus_t finalize() override {
    // Engines and knobs are not emulated: the one config comes filled in from CUDNN_ATTR_ENGINEHEUR_RESULTS.
    if (!graph)
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  "ENGINECFG: only configs from CUDNN_ATTR_ENGINEHEUR_RESULTS "
                  "are emulated");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct PlanDesc : Descriptor {
  PlanDesc() : Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {}
  std::shared_ptr<const Graph> graph;
  bool has_handle = false, has_device = false;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_HANDLE, 1, 1));
        if (!handle_ok(values<cudnnHandle_t>(a)[0]))
          return fail(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN: CUDNN_ATTR_EXECUTION_PLAN_HANDLE is not a live handle");
        has_handle = true;
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
        Descriptor* d = nullptr;
        ASC_CUDNN_TRY(descriptor_arg(*this, a, values<const void*>(a)[0], CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d));
        has_device = true;
        return CUDNN_STATUS_SUCCESS;
      }
      case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: {
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
        Descriptor* d = nullptr;
        ASC_CUDNN_TRY(descriptor_arg(*this, a, values<const void*>(a)[0], CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &d));
        graph = static_cast<EngineCfgDesc*>(d)->graph;
        return CUDNN_STATUS_SUCCESS;
      }
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!has_handle && !has_device)
      return fail(CUDNN_STATUS_BAD_PARAM,
                  "EXECUTION_PLAN: neither CUDNN_ATTR_EXECUTION_PLAN_HANDLE nor "
                  "CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP was set");
    if (!graph)
      return fail(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN: CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG was not set");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

struct VariantPackDesc : Descriptor {
  VariantPackDesc() : Descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {}
  std::optional<std::vector<int64_t>> uids;
  std::optional<std::vector<void*>> pointers;
  void* workspace = nullptr;
  cudnnStatus_t set(const Attr& a) override {
    switch (a.name) {
      case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_INT64, 0, 1 << 20));
        uids = values<int64_t>(a);
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_VOID_PTR, 0, 1 << 20));
        pointers = values<void*>(a);
        return CUDNN_STATUS_SUCCESS;
      case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
        ASC_CUDNN_TRY(expect(*this, a, CUDNN_TYPE_VOID_PTR, 1, 1));
        workspace = values<void*>(a)[0];
        return CUDNN_STATUS_SUCCESS;
      default: return unknown_attr(*this, a);
    }
  }
  cudnnStatus_t finalize() override {
    if (!uids) return fail(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS was not set");
    if (!pointers)
      return fail(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS was not set");
    if (uids->size() != pointers->size())
      return fail(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: " + std::to_string(uids->size()) + " unique ids but " +
                                              std::to_string(pointers->size()) + " data pointers");
    std::set<int64_t> seen;
    for (int64_t u : *uids)
      if (!seen.insert(u).second)
        return fail(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: unique id " + std::to_string(u) + " appears twice");
    finalized = true;
    return CUDNN_STATUS_SUCCESS;
  }
};

// ---- execution -----------------------------------------------------------------------------------------------------

// A tensor during execution: a virtual one is float scratch in row-major order of its dims, a non-virtual one lives
// at its variant-pack pointer with its declared strides, a by-value one is a host float.
struct Bound {
  const TensorInfo* t = nullptr;
  std::vector<float> scratch;
  char* ptr = nullptr;
  double scalar = 0;
  std::vector<int64_t> step;  // element strides used to address it (row-major for scratch)

  double read(int64_t off) const {
    if (t->by_value) return scalar;
    if (t->is_virtual) return scratch[static_cast<size_t>(off)];
    switch (t->dtype) {
      case CUDNN_DATA_FLOAT: return reinterpret_cast<const float*>(ptr)[off];
      case CUDNN_DATA_HALF: return static_cast<float>(reinterpret_cast<const __half*>(ptr)[off]);
      case CUDNN_DATA_BFLOAT16: return static_cast<float>(reinterpret_cast<const __nv_bfloat16*>(ptr)[off]);
      default: return reinterpret_cast<const int32_t*>(ptr)[off];
    }
  }
  // Rounded once, from double, to the declared type; virtual tensors too, as the library's kernels store them so.
  void write(int64_t off, double v) {
    switch (t->dtype) {
      case CUDNN_DATA_HALF: {
        const __half h(v);
        if (t->is_virtual)
          scratch[static_cast<size_t>(off)] = static_cast<float>(h);
        else
          reinterpret_cast<__half*>(ptr)[off] = h;
        return;
      }
      case CUDNN_DATA_BFLOAT16: {
        const __nv_bfloat16 h(v);
        if (t->is_virtual)
          scratch[static_cast<size_t>(off)] = static_cast<float>(h);
        else
          reinterpret_cast<__nv_bfloat16*>(ptr)[off] = h;
        return;
      }
      case CUDNN_DATA_INT32: {  // round to nearest, saturating (NaN becomes 0)
        const double r = std::isnan(v) ? 0.0 : std::clamp(std::nearbyint(v), -2147483648.0, 2147483647.0);
        if (t->is_virtual)
          scratch[static_cast<size_t>(off)] = static_cast<float>(r);
        else
          reinterpret_cast<int32_t*>(ptr)[off] = static_cast<int32_t>(r);
        return;
      }
      case CUDNN_DATA_BOOLEAN:  // virtual only
        scratch[static_cast<size_t>(off)] = v != 0.0 ? 1.0f : 0.0f;
        return;
      default:
        if (t->is_virtual)
          scratch[static_cast<size_t>(off)] = static_cast<float>(v);
        else
          reinterpret_cast<float*>(ptr)[off] = static_cast<float>(v);
        return;
    }
  }
  // The offset of the element at index `idx` of a tensor this one broadcasts to (its dims of 1 repeat).
  int64_t offset(const std::vector<int64_t>& idx) const {
    int64_t o = 0;
    for (int i = 0; i < t->rank(); ++i)
      if (t->dims[i] != 1) o += idx[i] * step[i];
    return o;
  }
};

// Calls fn(idx) for every index of dims in row-major order.
template <class F>
void for_each_index(const std::vector<int64_t>& dims, F fn) {
  std::vector<int64_t> idx(dims.size(), 0);
  for (;;) {
    fn(idx);
    int i = static_cast<int>(dims.size()) - 1;
    while (i >= 0 && ++idx[i] == dims[i]) idx[i--] = 0;
    if (i < 0) return;
  }
}

void run_op(const Op& op, std::map<int64_t, Bound>& b) {
  Bound& y = b.at(op.out.uid);
  std::vector<const Bound*> in;
  for (const TensorInfo& t : op.in) in.push_back(&b.at(t.uid));
  // Results go to a temporary first, so an output aliasing an input is read before it is overwritten.
  std::vector<std::pair<int64_t, double>> out;
  out.reserve(static_cast<size_t>(op.out.numel()));
  switch (op.kind) {
    case OpKind::Pointwise:
      for_each_index(op.out.dims, [&](const std::vector<int64_t>& idx) {
        const double x = in[0]->read(in[0]->offset(idx));
        const double bb = in.size() > 1 ? in[1]->read(in[1]->offset(idx)) : 0.0;
        double v = 0;
        switch (op.mode) {
          case CUDNN_POINTWISE_ADD: v = x + bb; break;
          case CUDNN_POINTWISE_MUL: v = x * bb; break;
          case CUDNN_POINTWISE_DIV: v = x / bb; break;
          case CUDNN_POINTWISE_SUB: v = x - bb; break;
          case CUDNN_POINTWISE_EXP: v = std::exp(x); break;
          case CUDNN_POINTWISE_LOG: v = std::log(x); break;
          case CUDNN_POINTWISE_IDENTITY: v = x; break;
          case CUDNN_POINTWISE_CMP_GE: v = x >= bb ? 1.0 : 0.0; break;
          case CUDNN_POINTWISE_GEN_INDEX: v = static_cast<double>(idx[static_cast<size_t>(op.axis)]); break;
          case CUDNN_POINTWISE_BINARY_SELECT: v = in[2]->read(in[2]->offset(idx)) != 0.0 ? x : bb; break;
        }
        out.push_back({y.offset(idx), v});
      });
      break;
    case OpKind::Reduction: {
      // The output's own row-major index is its scratch position; accumulate there in double.
      std::vector<double> acc(static_cast<size_t>(op.out.numel()),
                              op.reduce == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
      std::vector<int64_t> ystep(static_cast<size_t>(op.out.rank()), 1);
      for (int i = op.out.rank() - 2; i >= 0; --i) ystep[i] = ystep[i + 1] * op.out.dims[i + 1];
      for_each_index(op.in[0].dims, [&](const std::vector<int64_t>& idx) {
        int64_t k = 0;
        for (int i = 0; i < op.out.rank(); ++i)
          if (op.out.dims[i] != 1) k += idx[i] * ystep[i];
        const double v = in[0]->read(in[0]->offset(idx));
        double& a = acc[static_cast<size_t>(k)];
        if (op.reduce == CUDNN_REDUCE_TENSOR_ADD)
          a += v;
        else if (v > a || std::isnan(v))
          a = v;  // NaN propagates
      });
      int64_t k = 0;
      for_each_index(op.out.dims, [&](const std::vector<int64_t>& idx) {
        out.push_back({y.offset(idx), acc[static_cast<size_t>(k++)]});
      });
      break;
    }
    case OpKind::Matmul: {
      const int r = op.out.rank();
      const int64_t kk = op.in[0].dims[r - 1];
      const Bound &A = *in[0], &B = *in[1];
      for_each_index(op.out.dims, [&](const std::vector<int64_t>& idx) {
        std::vector<int64_t> ia = idx, ib = idx;
        double s = 0;
        for (int64_t l = 0; l < kk; ++l) {
          ia[r - 1] = l;
          ib[r - 2] = l;
          s += A.read(A.offset(ia)) * B.read(B.offset(ib));
        }
        out.push_back({y.offset(idx), s});
      });
      break;
    }
    case OpKind::Reshape: {
      // X's dims > 1 by decreasing stride: an offset of Y splits greedily into X's index (X does not overlap).
      const TensorInfo& xt = op.in[0];
      std::vector<int> order;
      for (int i = 0; i < xt.rank(); ++i)
        if (xt.dims[i] > 1) order.push_back(i);
      std::sort(order.begin(), order.end(), [&](int p, int q) { return xt.strides[p] > xt.strides[q]; });
      std::vector<int64_t> xi(static_cast<size_t>(xt.rank()), 0);
      for_each_index(op.out.dims, [&](const std::vector<int64_t>& idx) {
        int64_t o = 0;
        for (int i = 0; i < op.out.rank(); ++i) o += idx[i] * op.out.strides[i];
        for (int i : order) {
          xi[i] = o / xt.strides[i];
          o %= xt.strides[i];
        }
        out.push_back({y.offset(idx), in[0]->read(in[0]->offset(xi))});
      });
      break;
    }
  }
  for (const auto& [off, v] : out) y.write(off, v);
}

std::mutex& cudnn_mutex() {
  static std::mutex m;
  return m;
}

cudnnStatus_t execute(const Graph& g, const VariantPackDesc& vp) {
  std::map<int64_t, void*> given;
  for (size_t i = 0; i < vp.uids->size(); ++i) given[(*vp.uids)[i]] = (*vp.pointers)[i];
  for (const auto& [uid, p] : given) {
    auto it = g.tensors.find(uid);
    if (it == g.tensors.end())
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack names uid " + std::to_string(uid) +
                                              ", which is no tensor of the graph");
    if (it->second.is_virtual)
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack names the virtual tensor " +
                                              it->second.str() + " (virtual tensors have no memory)");
  }
  std::lock_guard<std::recursive_mutex> lock(device_mutex());
  std::map<int64_t, Bound> bound;
  for (const auto& [uid, t] : g.tensors) {
    Bound& b = bound[uid];
    b.t = &t;
    if (t.is_virtual) {
      b.scratch.assign(static_cast<size_t>(t.numel()), NAN);
      b.step.assign(static_cast<size_t>(t.rank()), 1);
      for (int i = t.rank() - 2; i >= 0; --i) b.step[i] = b.step[i + 1] * t.dims[i + 1];
      continue;
    }
    auto it = given.find(uid);
    if (it == given.end())
      return fail(CUDNN_STATUS_BAD_PARAM,
                  "cudnnBackendExecute: the variant pack has no pointer for the graph's tensor " + t.str());
    if (!it->second)
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: null data pointer for tensor " + t.str());
    if (t.by_value) {
      if (is_device_pointer(it->second))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: by-value tensor " + t.str() +
                                                " was given a device pointer (it takes a host float)");
      b.scalar = *static_cast<const float*>(it->second);
      b.step.assign(static_cast<size_t>(t.rank()), 0);
      continue;
    }
    const int64_t align = std::max(kPointerAlignment, t.alignment);
    if (reinterpret_cast<uintptr_t>(it->second) % static_cast<uintptr_t>(align) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: data pointer of tensor " + t.str() + " is not " +
                                              std::to_string(align) + "-byte aligned");
    std::string why;
    const std::string what = "tensor " + t.str();
    if (!device_range_ok(it->second, static_cast<size_t>(t.extent()) * element_size(t.dtype), what.c_str(), &why))
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: " + why);
    b.ptr = static_cast<char*>(it->second);
    b.step = t.strides;
  }
  DeviceAccess access;
  for (const Op& op : g.ops) run_op(op, bound);
  return CUDNN_STATUS_SUCCESS;
}

template <class T>
cudnnStatus_t get_values(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                         cudnnBackendAttributeType_t want, int64_t requested, int64_t* count, void* array,
                         const std::vector<T>& v) {
  if (type != want)
    return fail(CUDNN_STATUS_BAD_PARAM,
                attr_str(d, name) + ": read as " + type_name(type) + ", it is " + type_name(want));
  if (requested < 0 || (requested > 0 && !array))
    return fail(CUDNN_STATUS_BAD_PARAM, attr_str(d, name) + ": bad requested count or null array");
  if (count) *count = static_cast<int64_t>(v.size());
  if (array && requested > 0)
    std::memcpy(array, v.data(), std::min(static_cast<size_t>(requested), v.size()) * sizeof(T));
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// ---- API -----------------------------------------------------------------------------------------------------------

size_t cudnnGetVersion() { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  const size_t n = std::min(max_size - 1, t_last_error.size());
  std::memcpy(message, t_last_error.data(), n);
  message[n] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: null handle pointer");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return fail(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate: no CUDA device");
  }
  *handle = new cudnnContext{};
  std::lock_guard<std::mutex> lock(registry_mutex());
  live_handles().insert(*handle);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (!handle || !live_handles().erase(handle))
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: not a live handle");
  }
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle_ok(handle)) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a live handle");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor) {
  if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: null descriptor pointer");
  Descriptor* d = nullptr;
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: d = new TensorDesc; break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: d = new PointwiseDesc; break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: d = new ReductionDesc; break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: d = new MatmulDesc; break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: d = new OperationDesc(type); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: d = new GraphDesc; break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: d = new HeurDesc; break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: d = new EngineCfgDesc; break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: d = new PlanDesc; break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: d = new VariantPackDesc; break;
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR: d = new DevicePropDesc; break;
    default:
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  "cudnnBackendCreateDescriptor: " + descriptor_name(type) + " is not emulated");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  live_descriptors().insert(d);
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (!live_descriptors().erase(descriptor))
      return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a live backend descriptor");
  }
  delete static_cast<Descriptor*>(descriptor);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void* arrayOfElements) {
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  Descriptor* d = find_descriptor(descriptor);
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: not a live backend descriptor");
  if (d->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, attr_str(*d, attributeName) + ": the descriptor is already finalized");
  return d->set({attributeName, attributeType, elementCount, arrayOfElements});
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  Descriptor* d = find_descriptor(descriptor);
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a live backend descriptor");
  if (d->finalized) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: " + d->name() + " is finalized already");
  return d->finalize();
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                       int64_t* elementCount, void* arrayOfElements) {
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  Descriptor* d = find_descriptor(descriptor);
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: not a live backend descriptor");
  if (!d->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, attr_str(*d, attributeName) + ": read before the descriptor is finalized");
  auto get = [&](cudnnBackendAttributeType_t want, const auto& v) {
    return get_values(*d, attributeName, attributeType, want, requestedElementCount, elementCount, arrayOfElements, v);
  };
  const std::vector<int64_t> zero{0}, one{1};
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      const TensorInfo& t = static_cast<TensorDesc*>(d)->t;
      switch (attributeName) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE: return get(CUDNN_TYPE_DATA_TYPE, std::vector<cudnnDataType_t>{t.dtype});
        case CUDNN_ATTR_TENSOR_DIMENSIONS: return get(CUDNN_TYPE_INT64, t.dims);
        case CUDNN_ATTR_TENSOR_STRIDES: return get(CUDNN_TYPE_INT64, t.strides);
        case CUDNN_ATTR_TENSOR_UNIQUE_ID: return get(CUDNN_TYPE_INT64, std::vector<int64_t>{t.uid});
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: return get(CUDNN_TYPE_INT64, std::vector<int64_t>{t.alignment});
        default: break;
      }
      break;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (attributeName == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) return get(CUDNN_TYPE_INT64, one);
      break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (attributeName == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) return get(CUDNN_TYPE_INT64, zero);
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) return get(CUDNN_TYPE_INT64, zero);
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        // One config per graph; the caller preallocates ENGINECFG descriptors, which are filled and finalized.
        if (attributeType != CUDNN_TYPE_BACKEND_DESCRIPTOR)
          return fail(CUDNN_STATUS_BAD_PARAM, attr_str(*d, attributeName) + ": read as " + type_name(attributeType) +
                                                  ", it is CUDNN_TYPE_BACKEND_DESCRIPTOR");
        if (requestedElementCount < 0 || (requestedElementCount > 0 && !arrayOfElements))
          return fail(CUDNN_STATUS_BAD_PARAM, attr_str(*d, attributeName) + ": bad requested count or null array");
        if (requestedElementCount > 0) {
          auto* c = find_descriptor(static_cast<void* const*>(arrayOfElements)[0]);
          if (!c || c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
            return fail(CUDNN_STATUS_BAD_PARAM,
                        "ENGINEHEUR: CUDNN_ATTR_ENGINEHEUR_RESULTS must be given "
                        "preallocated ENGINECFG descriptors");
          static_cast<EngineCfgDesc*>(c)->graph = static_cast<HeurDesc*>(d)->graph;
          c->finalized = true;
        }
        if (elementCount) *elementCount = 1;
        return CUDNN_STATUS_SUCCESS;
      }
      break;
    default: break;
  }
  return fail(CUDNN_STATUS_BAD_PARAM, attr_str(*d, attributeName) + ": cannot be read (or not emulated)");
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  if (!handle_ok(handle)) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a live handle");
  Descriptor* p = find_descriptor(executionPlan);
  Descriptor* v = find_descriptor(variantPack);
  if (!p || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !p->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan is not a finalized EXECUTION_PLAN descriptor");
  if (!v || v->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !v->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendExecute: the variant pack is not a finalized VARIANT_PACK descriptor");
  return execute(*static_cast<PlanDesc*>(p)->graph, *static_cast<VariantPackDesc*>(v));
}
