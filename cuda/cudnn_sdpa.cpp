// Fused scaled-dot-product attention through the cuDNN backend (graph) API. cuDNN 9 runs attention as one
// flash-attention kernel when an operation graph has the shape its runtime-fusion engines recognise, so this
// file builds exactly those graphs, op by op (the backend C API; no cudnn-frontend):
//
// forward  (14 ops)  S = Q·Kᵀ · scale; [causal: S = row >= col ? S : -inf]; M = max_s S; E = exp(S - M);
//                    Z = Σ_s E; stats = M + log Z; P = E / Z (in the I/O dtype); O = P·V
// backward (22 ops)  softmax_sum = Σ_d dO∘O; P = exp(Q·Kᵀ·scale - stats) [masked]; dV = Pᵀ·dO;
//                    dP = dO·Vᵀ; dS = P∘(dP - softmax_sum)·scale; dK = dSᵀ·Q; dQ = dS·K (float32 accumulator,
//                    then copied to dQ's dtype)
//
// Kᵀ and Vᵀ are K's and V's own memory described with the last two dims and strides swapped; the transposes of
// virtual tensors are RESHAPE ops. Scalars (scale, -inf, 1) are by-value float32 tensors. What cuDNN 9.19's
// engines need and what they silently get wrong (stats and scratch tensors must be packed; P must be in the I/O
// dtype; the by-value scalar goes in BDESC) is noted where the tensors are made.
//
// Building a plan is slow (the engines are compiled at run time), so plans are cached per device, dtype, shape,
// strides and mask. Not run on a real GPU yet: the CUDA emulator (tests/cuda_emu/cudnn.cpp) interprets these graphs
// op by op, which checks their wiring and math, not that a given cuDNN release accepts them.
#include "cuda/cudnn_sdpa.h"

#ifdef ASC_HAVE_CUDNN

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/determinism.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"

namespace asc::cuda {
namespace {

// A failed cuDNN call while building a graph: the graph is not supported (the caller falls back).
struct BuildError {
  std::string what;
};

std::string status_text(cudnnStatus_t s) {
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  return fmt::format("{} ({})", cudnnGetErrorString(s), last[0] ? last : "no detail");
}

// Calls that only fail on a bad graph throw BuildError; calls at execution throw asc::Error.
void build_check(cudnnStatus_t s, const char* call) {
  if (s != CUDNN_STATUS_SUCCESS) throw BuildError{fmt::format("{}: {}", call, status_text(s))};
}
void run_check(cudnnStatus_t s, const char* call) {
  ASC_CHECK(s == CUDNN_STATUS_SUCCESS, "scaled_dot_product_attention (cuDNN): {} failed: {}", call, status_text(s));
}

// One cuDNN handle per device (created lazily, never destroyed: teardown at exit races the driver). The cached
// plans are finalized against it. `mu` makes "set the stream, execute" one step: cuDNN forbids changing a handle's
// stream while another thread issues work through it.
struct DeviceHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
};
DeviceHandle& handle_of(int device) {
  static std::mutex mu;
  static std::map<int, DeviceHandle> handles;  // map: stable addresses
  std::lock_guard<std::mutex> lock(mu);
  DeviceHandle& h = handles[device];
  if (!h.handle) {
    DeviceScope on(Device::cuda(device));
    run_check(cudnnCreate(&h.handle), "cudnnCreate");
  }
  return h;
}

using Dims4 = std::array<int64_t, 4>;

// Unique ids of the graphs' non-virtual tensors (the variant pack binds pointers to them); virtuals count from 100.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kdO, kdQ, kdK, kdV, kSoftmaxSum, kdQAccum, kOne };

// Descriptors of one operation graph under construction; all destroyed with it except the plan it returns.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnDataType_t io) : io_(io) {}
  ~GraphBuilder() {
    for (cudnnBackendDescriptor_t d : owned_) cudnnBackendDestroyDescriptor(d);
  }
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  cudnnDataType_t io() const { return io_; }

  // A tensor of the graph. uid 0: a virtual intermediate with the next free id.
  cudnnBackendDescriptor_t tensor(cudnnDataType_t type, const Dims4& dims, const Dims4& strides, int64_t uid = 0,
                                  bool by_value = false) {
    const bool is_virtual = uid == 0;
    if (is_virtual) uid = next_virtual_++;
    cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    const bool yes = true;
    if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    build_check(cudnnBackendFinalize(t), "finalize tensor");
    return t;
  }
  // A float32 intermediate: (b, h, rows, cols) packed.
  cudnnBackendDescriptor_t virt(const Dims4& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(type, dims, packed(dims));
  }
  // A by-value float32 scalar (its host value is bound at execution).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, uid, /*by_value=*/true);
  }

  // y = mode(x [, b] [, t]). Binary and select ops take the by-value scalar as b (never as x).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    build_check(cudnnBackendFinalize(pw), "finalize pointwise descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    const float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add_op(op, "pointwise");
  }
  // y = reduce(x) over the axes where y has size 1.
  void reduction(cudnnReduceTensorOp_t kind, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &kind);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    build_check(cudnnBackendFinalize(rd), "finalize reduction descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    add_op(op, "reduction");
  }
  // c = a · b on the last two dims, float32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    build_check(cudnnBackendFinalize(mm), "finalize matmul descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    add_op(op, "matmul");
  }
  // y: x's elements under y's dims/strides (a transpose when the last two dims are swapped).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(op, "reshape");
  }

  // The operation graph's first execution plan that finalizes, among the configurations heuristic A proposes.
  // Returns the plan (owned by the caller) and its workspace size.
  std::pair<cudnnBackendDescriptor_t, int64_t> plan(cudnnHandle_t handle) {
    int64_t configs = 0;
    return plan(handle, nullptr, &configs, nullptr);
  }
  // The same for a device described by `device` (a finalized device-property descriptor) instead of a handle:
  // no GPU needed. *configs receives the number of engine configs proposed; *last the last plan failure.
  std::pair<cudnnBackendDescriptor_t, int64_t> plan(cudnnHandle_t handle, cudnnBackendDescriptor_t device,
                                                    int64_t* configs_out, std::string* last_out) {
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (handle) set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data());
    build_check(cudnnBackendFinalize(graph), "finalize operation graph");
    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;  // the fallback mode proposes nothing for these graphs
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (device) set(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &device);
    build_check(cudnnBackendFinalize(heur), "finalize engine heuristics");
    int64_t count = 0;
    build_check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                         nullptr),
                "count engine configs");
    *configs_out = 0;
    if (count == 0) throw BuildError{"no cuDNN engine supports this attention graph on this device"};
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    int64_t got = 0;
    build_check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                         &got, configs.data()),
                "get engine configs");
    *configs_out = got;  // may be fewer than counted: a graph no engine takes gets 0 here
    std::string last;
    for (int64_t i = 0; i < got; ++i) {
      cudnnBackendDescriptor_t plan = nullptr;
      build_check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan), "create plan");
      cudnnStatus_t s =
          handle ? cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
                 : cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            1, &device);
      if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &configs[static_cast<size_t>(i)]);
      if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan);  // a config may fail here: try the next
      int64_t workspace = 0, n = 0;
      if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                     &workspace);
      if (s == CUDNN_STATUS_SUCCESS) return {plan, workspace};
      last = status_text(s);
      if (last_out) *last_out = fmt::format("{} ({})", last, static_cast<int>(s));
      cudnnBackendDestroyDescriptor(plan);
    }
    throw BuildError{fmt::format("none of {} cuDNN engine configs built a plan (last: {})", got, last)};
  }

  static Dims4 packed(const Dims4& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

 private:
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    build_check(cudnnBackendCreateDescriptor(type, &d), "cudnnBackendCreateDescriptor");
    owned_.push_back(d);
    return d;
  }
  static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* value) {
    build_check(cudnnBackendSetAttribute(d, name, type, count, value), "cudnnBackendSetAttribute");
  }
  void add_op(cudnnBackendDescriptor_t op, const char* what) {
    build_check(cudnnBackendFinalize(op), what);
    ops_.push_back(op);
  }

  cudnnDataType_t io_;
  int64_t next_virtual_ = 100;
  std::vector<cudnnBackendDescriptor_t> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

Dims4 dims_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }
Dims4 strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
// The same memory seen with the last two dims swapped (Kᵀ from K).
Dims4 swap_last(const Dims4& d) { return {d[0], d[1], d[3], d[2]}; }

// Strides (the layout) of the output o and of dout as handed to the backward: heads-last (B, T, H, D).
Dims4 heads_last_strides(int64_t H, int64_t T, int64_t D) { return {T * H * D, D, H * D, 1}; }

// Top-left causal mask on scores of shape `scores`: row >= col ? x : -inf (the graphs' shared sub-graph).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, cudnnBackendDescriptor_t x, const Dims4& scores) {
  auto neg_inf = g.scalar(kNegInf);
  auto r = g.virt(scores, CUDNN_DATA_INT32), c = g.virt(scores, CUDNN_DATA_INT32);
  auto keep = g.virt(scores, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, r, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, c, nullptr, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, r, c, keep, nullptr, -1, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(scores);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, masked, keep);  // the by-value -inf goes in BDESC
  return masked;
}

// Forward graph, §1 of the recipe in the file comment.
void build_forward(GraphBuilder& g, const Dims4& qd, const Dims4& qs, const Dims4& kd, const Dims4& ks, const Dims4& vs,
                   const Dims4& os, bool causal) {
  const int64_t B = qd[0], H = qd[1], T = qd[2], D = qd[3], S = kd[2];
  const Dims4 scores{B, H, T, S}, row{B, H, T, 1};
  auto q = g.tensor(g.io(), qd, qs, kQ);
  auto kt = g.tensor(g.io(), swap_last(kd), swap_last(ks), kK);
  auto v = g.tensor(g.io(), kd, vs, kV);
  auto o = g.tensor(g.io(), {B, H, T, D}, os, kO);
  // Packed (B, H, T, 1): cuDNN's backward kernels address stats as packed whatever the strides say.
  auto stats = g.tensor(CUDNN_DATA_FLOAT, row, GraphBuilder::packed(row), kStats);
  auto scale = g.scalar(kScale);

  auto s1 = g.virt(scores);
  g.matmul(q, kt, s1);
  auto s = g.virt(scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s1, scale, s);  // scale first, as the fused engines expect
  if (causal) s = causal_mask(g, s, scores);
  auto m = g.virt(row);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  auto centred = g.virt(scores), e = g.virt(scores);
  g.pointwise(CUDNN_POINTWISE_SUB, s, m, centred);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, e);
  auto z = g.virt(row), logz = g.virt(row);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, logz);
  g.pointwise(CUDNN_POINTWISE_ADD, m, logz, stats);
  auto p = g.virt(scores, g.io());  // in the I/O dtype: with float32 P no engine takes the graph
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  g.matmul(p, v, o);
}

// Backward graph, §2 of the recipe in the file comment.
void build_backward(GraphBuilder& g, const Dims4& qd, const Dims4& qs, const Dims4& kd, const Dims4& ks,
                    const Dims4& vs, const Dims4& os, bool causal) {
  const int64_t B = qd[0], H = qd[1], T = qd[2], D = qd[3], S = kd[2];
  const Dims4 scores{B, H, T, S}, row{B, H, T, 1}, qshape{B, H, T, D};
  const Dims4 scores_t{B, H, S, T}, scores_t_strides{H * T * S, T * S, 1, S};  // a transposed view of scores
  auto q = g.tensor(g.io(), qd, qs, kQ);
  auto kt = g.tensor(g.io(), swap_last(kd), swap_last(ks), kK);
  auto vt = g.tensor(g.io(), swap_last(kd), swap_last(vs), kV);
  auto o = g.tensor(g.io(), qshape, os, kO);
  auto dout = g.tensor(g.io(), qshape, os, kdO);  // same layout as O
  auto stats = g.tensor(CUDNN_DATA_FLOAT, row, GraphBuilder::packed(row), kStats);
  auto dq = g.tensor(g.io(), qshape, GraphBuilder::packed(qshape), kdQ);
  auto dk = g.tensor(g.io(), kd, GraphBuilder::packed(kd), kdK);
  auto dv = g.tensor(g.io(), kd, GraphBuilder::packed(kd), kdV);
  // Scratch tensors the graph exposes; they must be packed (other strides build and give wrong gradients).
  auto softmax_sum = g.tensor(CUDNN_DATA_FLOAT, row, GraphBuilder::packed(row), kSoftmaxSum);
  auto dq_accum = g.tensor(CUDNN_DATA_FLOAT, qshape, GraphBuilder::packed(qshape), kdQAccum);
  auto scale = g.scalar(kScale), one = g.scalar(kOne);

  // softmax_sum = Σ_d dO∘O (·1: the pattern's dropout-scale slot)
  auto doo = g.virt(qshape), rs = g.virt(row);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, doo);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rs);
  g.pointwise(CUDNN_POINTWISE_MUL, rs, one, softmax_sum);
  // P = exp(Q·Kᵀ·scale - stats), masked
  auto s = g.virt(scores), ss = g.virt(scores), sm = g.virt(scores);
  g.matmul(q, kt, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, ss, stats, sm);
  if (causal) sm = causal_mask(g, sm, scores);
  auto p = g.virt(scores);
  g.pointwise(CUDNN_POINTWISE_EXP, sm, nullptr, p);
  // dV = Pᵀ·dO
  auto pt = g.tensor(g.io(), scores_t, scores_t_strides);
  g.reshape(p, pt);
  g.matmul(pt, dout, dv);
  // dS = P∘(dO·Vᵀ - softmax_sum)·scale
  auto dp = g.virt(scores), t1 = g.virt(scores), t2 = g.virt(scores), ds = g.virt(scores);
  g.matmul(dout, vt, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, t1);
  g.pointwise(CUDNN_POINTWISE_MUL, t1, p, t2);
  g.pointwise(CUDNN_POINTWISE_MUL, t2, scale, ds);
  // dK = dSᵀ·Q
  auto dst = g.tensor(g.io(), scores_t, scores_t_strides);
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  // dQ = dS·K, accumulated in float32 then converted
  auto kv = g.tensor(CUDNN_DATA_FLOAT, kd, ks);
  g.reshape(kt, kv);
  g.matmul(ds, kv, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
}

struct Plan {
  cudnnBackendDescriptor_t plan = nullptr;  // null: not supported (why says why)
  int64_t workspace = 0;
  std::string why;
};

using PlanKey = std::tuple<int, bool, int, Dims4, Dims4, Dims4, Dims4, Dims4, Dims4, bool>;

// The cached plan for (device, backward?, dtype, shapes, strides, causal), built on first use. Plans are never
// destroyed (a handful per model; destroying them at exit races the driver).
const Plan& plan_for(int device, bool backward, cudnnDataType_t io, const Dims4& qd, const Dims4& qs, const Dims4& kd,
                     const Dims4& ks, const Dims4& vs, const Dims4& os, bool causal) {
  static std::mutex mu;
  static std::map<PlanKey, Plan> cache;
  std::lock_guard<std::mutex> lock(mu);
  const PlanKey key{device, backward, static_cast<int>(io), qd, qs, kd, ks, vs, os, causal};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Plan p;
  try {
    GraphBuilder g(io);
    if (backward) {
      build_backward(g, qd, qs, kd, ks, vs, os, causal);
    } else {
      build_forward(g, qd, qs, kd, ks, vs, os, causal);
    }
    DeviceScope on(Device::cuda(device));
    std::tie(p.plan, p.workspace) = g.plan(handle_of(device).handle);
  } catch (const BuildError& e) {
    p.why = fmt::format("cuDNN {} graph not supported: {}", backward ? "backward" : "forward", e.what);
  }
  return cache.emplace(key, std::move(p)).first->second;
}

cudnnDataType_t io_type(DType t) { return t == kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// Runs a plan with the tensors bound to their uids (host pointers for the by-value scalars).
void execute(int device, const Plan& p, std::vector<int64_t> uids, std::vector<void*> ptrs) {
  DeviceScope on(Device::cuda(device));
  Tensor workspace;
  if (p.workspace > 0) workspace = Tensor::empty({(p.workspace + 3) / 4}, {kFloat32, Device::cuda(device)});
  cudnnBackendDescriptor_t pack = nullptr;
  run_check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "create variant pack");
  std::unique_ptr<void, void (*)(void*)> guard(pack, [](void* d) { cudnnBackendDestroyDescriptor(d); });
  void* ws = workspace.defined() ? workspace.raw_data() : nullptr;
  run_check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                     static_cast<int64_t>(uids.size()), uids.data()),
            "set variant pack ids");
  run_check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                     static_cast<int64_t>(ptrs.size()), ptrs.data()),
            "set variant pack pointers");
  run_check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
            "set variant pack workspace");
  run_check(cudnnBackendFinalize(pack), "finalize variant pack");
  DeviceHandle& h = handle_of(device);
  std::lock_guard<std::mutex> lock(h.mu);
  run_check(cudnnSetStream(h.handle, stream_of(device)), "cudnnSetStream");
  run_check(cudnnBackendExecute(h.handle, p.plan, pack), "cudnnBackendExecute");
}

}  // namespace

std::string cudnn_sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                   bool needs_backward) {
  if (!q.device().is_cuda()) return "inputs are not on a CUDA device";
  if (!is_reduced_float(q.dtype())) return fmt::format("dtype {} (the fused kernels take bfloat16/float16)", q.dtype());
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) return "q, k, v of different dtypes";
  if (k.device() != q.device() || v.device() != q.device()) return "q, k, v on different devices";
  const int64_t D = q.size(3);
  if (D % 8 != 0 || D > 128) return fmt::format("head dim {} (the fused kernels take multiples of 8 up to 128)", D);
  if (needs_backward && q.size(2) == 1 && k.size(2) == 1) return "T = S = 1 (no fused backward)";
  if (needs_backward && deterministic_algorithms_enabled())
    return "deterministic mode (the fused backward's order of accumulation is not guaranteed)";
  if (q.numel() == 0 || k.numel() == 0) return "empty tensors";
  if (causal && q.size(2) != k.size(2)) return "causal with T != S";
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->stride(3) != 1 || t->stride(0) % 8 || t->stride(1) % 8 || t->stride(2) % 8 || !aligned16(*t))
      return fmt::format(
          "q/k/v of shape {} with strides {} (the fused kernels need unit stride in D and 16-byte "
          "aligned rows)",
          t->shape(), t->strides());
  }
  const int device = q.device().index;
  const Dims4 os = heads_last_strides(q.size(1), q.size(2), D);
  const Plan& f = plan_for(device, false, io_type(q.dtype()), dims_of(q), strides_of(q), dims_of(k), strides_of(k),
                           strides_of(v), os, causal);
  if (!f.plan) return f.why;
  if (needs_backward) {
    const Plan& b = plan_for(device, true, io_type(q.dtype()), dims_of(q), strides_of(q), dims_of(k), strides_of(k),
                             strides_of(v), os, causal);
    if (!b.plan) return b.why;
  }
  return {};
}

void cudnn_sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& o,
                        Tensor& stats) {
  const std::string why = cudnn_sdpa_unsupported(q, k, v, causal, false);
  ASC_CHECK(why.empty(), "scaled_dot_product_attention (cuDNN): q {} k {} v {}: {}", q.shape(), k.shape(), v.shape(),
            why);
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3);
  const int device = q.device().index;
  ASC_CHECK(strides_of(o) == heads_last_strides(H, T, D) && stats.is_contiguous() && stats.dtype() == kFloat32,
            "scaled_dot_product_attention (cuDNN): o {} must be heads-last and stats {} contiguous float32",
            o.strides(), stats.shape());
  const Plan& p = plan_for(device, false, io_type(q.dtype()), dims_of(q), strides_of(q), dims_of(k), strides_of(k),
                           strides_of(v), strides_of(o), causal);
  float scale_f = static_cast<float>(scale), neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), stats.raw_data(), &scale_f};
  if (causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);
  execute(device, p, uids, ptrs);
}

void cudnn_sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                         const Tensor& stats, bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int device = q.device().index;
  const Dims4 os = heads_last_strides(H, T, D);
  ASC_CHECK(strides_of(o) == os && stats.is_contiguous() && stats.dtype() == kFloat32,
            "scaled_dot_product_attention (cuDNN) backward: o {} / stats {} are not the forward's", o.strides(),
            stats.shape());
  const Plan& p = plan_for(device, true, io_type(q.dtype()), dims_of(q), strides_of(q), dims_of(k), strides_of(k),
                           strides_of(v), os, causal);
  ASC_CHECK(p.plan != nullptr, "scaled_dot_product_attention (cuDNN) backward: {}", p.why);
  // dO in O's layout (it may arrive with any strides, even expanded zeros).
  Tensor d = dout;
  if (d.strides() != o.strides() || d.dtype() != o.dtype() || !aligned16(d)) {
    d = Tensor::empty({B, T, H, D}, {o.dtype(), o.device()}).permute({0, 2, 1, 3});
    d.copy_(dout);
  }
  Tensor softmax_sum = Tensor::empty({B, H, T, 1}, {kFloat32, q.device()});
  Tensor dq_accum = zeros({B, H, T, D}, {.dtype = kFloat32, .device = q.device()});
  float scale_f = static_cast<float>(scale), one = 1.0f, neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kSoftmaxSum, kdQAccum, kScale, kOne};
  std::vector<void*> ptrs{q.raw_data(),        k.raw_data(),  v.raw_data(),  o.raw_data(),  d.raw_data(),
                          stats.raw_data(),    dq.raw_data(), dk.raw_data(), dv.raw_data(), softmax_sum.raw_data(),
                          dq_accum.raw_data(), &scale_f,      &one};
  if (causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);
  execute(device, p, uids, ptrs);
}

#if !defined(ASC_CUDA_EMULATION)
std::string cudnn_sdpa_offline_check(const std::string& device_json, DType dtype, int64_t B, int64_t H, int64_t T,
                                     int64_t S, int64_t D, bool causal, bool heads_last) {
  cudnnBackendDescriptor_t device = nullptr;
  run_check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &device), "create device properties");
  std::unique_ptr<void, void (*)(void*)> guard(device, [](void* d) { cudnnBackendDestroyDescriptor(d); });
  run_check(cudnnBackendSetAttribute(device, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                     static_cast<int64_t>(device_json.size() + 1), device_json.c_str()),
            "set device properties");
  run_check(cudnnBackendFinalize(device), "finalize device properties");
  const Dims4 qd{B, H, T, D}, kd{B, H, S, D};
  const Dims4 qs = heads_last ? heads_last_strides(H, T, D) : GraphBuilder::packed(qd);
  const Dims4 ks = heads_last ? heads_last_strides(H, S, D) : GraphBuilder::packed(kd);
  std::string report;
  for (bool backward : {false, true}) {
    int64_t configs = 0;
    std::string last = "-", status = "plan built";
    try {
      GraphBuilder g(io_type(dtype));
      if (backward) {
        build_backward(g, qd, qs, kd, ks, ks, heads_last_strides(H, T, D), causal);
      } else {
        build_forward(g, qd, qs, kd, ks, ks, heads_last_strides(H, T, D), causal);
      }
      auto [plan, ws] = g.plan(nullptr, device, &configs, &last);
      cudnnBackendDestroyDescriptor(plan);
    } catch (const BuildError& e) {
      // With the driver's stub library an accepted graph fails only when its compiled kernel is loaded.
      status =
          e.what.find("CUDA_DRIVER") != std::string::npos ? "plans reach kernel load (expected without a GPU)" : e.what;
    }
    report += fmt::format("{}{}: {} engine configs; {}", backward ? " | " : "", backward ? "backward" : "forward",
                          configs, status);
  }
  return report;
}
#endif

}  // namespace asc::cuda

#else  // no cuDNN in this build

#include "core/error.h"

namespace asc::cuda {
std::string cudnn_sdpa_unsupported(const Tensor&, const Tensor&, const Tensor&, bool, bool) {
  return "this build has no cuDNN";
}
void cudnn_sdpa_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, Tensor&, Tensor&) {
  ASC_THROW("scaled_dot_product_attention: this build has no cuDNN");
}
void cudnn_sdpa_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                         double, Tensor&, Tensor&, Tensor&) {
  ASC_THROW("scaled_dot_product_attention: this build has no cuDNN");
}
}  // namespace asc::cuda

#endif
