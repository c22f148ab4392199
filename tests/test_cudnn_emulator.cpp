// The CUDA emulator's cuDNN backend API (tests/cuda_emu/cudnn.cpp; built only with ASC_CUDA_EMULATION): small operation
// graphs built with the raw backend calls, as the fused-attention code builds them, checked against naive loops,
// and each argument check shown firing with its message.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "emu_testing.h"

using asc::testing::device_alloc;
using asc::testing::to_device;
using asc::testing::to_host;

namespace {

std::string last_error() {
  char buf[1024];
  cudnnGetLastErrorString(buf, sizeof buf);
  return buf;
}

// The call returned `status` and the last error string contains `fragment`.
#define CHECK_CUDNN_FAILS(call, status, fragment)                    \
  do {                                                               \
    CHECK((call) == (status));                                       \
    const std::string what_ = last_error();                          \
    CHECK_MESSAGE(what_.find(fragment) != std::string::npos, what_); \
  } while (0)

std::vector<int64_t> packed(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

using Desc = cudnnBackendDescriptor_t;

// Builds descriptors with the raw API and destroys them all at the end.
struct Builder {
  cudnnHandle_t handle = nullptr;
  std::vector<Desc> owned;
  Builder() { REQUIRE(cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS); }
  ~Builder() {
    for (Desc d : owned) cudnnBackendDestroyDescriptor(d);
    cudnnDestroy(handle);
  }
  Desc create(cudnnBackendDescriptorType_t t) {
    Desc d = nullptr;
    REQUIRE(cudnnBackendCreateDescriptor(t, &d) == CUDNN_STATUS_SUCCESS);
    owned.push_back(d);
    return d;
  }
  static void set(Desc d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count, const void* p) {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d, n, t, count, p);
    REQUIRE_MESSAGE(st == CUDNN_STATUS_SUCCESS, last_error());
  }
  static void finalize(Desc d) {
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    REQUIRE_MESSAGE(st == CUDNN_STATUS_SUCCESS, last_error());
  }

  Desc tensor_unfinalized(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                          cudnnDataType_t dt, bool is_virtual = false, bool by_value = false) {
    Desc d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16, n = static_cast<int64_t>(dims.size());
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data());
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data());
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (is_virtual) set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    return d;
  }
  Desc tensor(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, cudnnDataType_t dt,
              bool is_virtual = false, bool by_value = false) {
    Desc d = tensor_unfinalized(uid, dims, strides, dt, is_virtual, by_value);
    finalize(d);
    return d;
  }
  Desc scalar(int64_t uid) { return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true); }

  // An OPERATION_POINTWISE descriptor, not finalized (the error tests finalize it themselves).
  Desc pointwise_op(cudnnPointwiseMode_t mode, Desc x, Desc y, Desc b = nullptr, Desc t = nullptr, int64_t axis = -1,
                    cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw);
    Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    return op;
  }
  Desc pointwise(cudnnPointwiseMode_t mode, Desc x, Desc y, Desc b = nullptr, Desc t = nullptr, int64_t axis = -1,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    Desc op = pointwise_op(mode, x, y, b, t, axis, prec);
    finalize(op);
    return op;
  }
  Desc reduction(cudnnReduceTensorOp_t r, Desc x, Desc y) {
    Desc rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    finalize(rd);
    Desc op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    finalize(op);
    return op;
  }
  Desc matmul_op(Desc a, Desc b, Desc c) {
    Desc mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    finalize(mm);
    Desc op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    return op;
  }
  Desc matmul(Desc a, Desc b, Desc c) {
    Desc op = matmul_op(a, b, c);
    finalize(op);
    return op;
  }
  Desc reshape_op(Desc x, Desc y) {
    Desc op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    return op;
  }
  Desc reshape(Desc x, Desc y) {
    Desc op = reshape_op(x, y);
    finalize(op);
    return op;
  }

  // An operation graph, unfinalized.
  Desc graph(const std::vector<Desc>& ops) {
    Desc g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data());
    return g;
  }
  // Operation graph -> heuristics (mode A) -> the one engine config -> execution plan, as the frontend does it.
  Desc plan(const std::vector<Desc>& ops) {
    Desc g = graph(ops);
    finalize(g);
    Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heur);
    int64_t n = -1;
    REQUIRE(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                     nullptr) == CUDNN_STATUS_SUCCESS);
    REQUIRE(n == 1);
    Desc cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    REQUIRE(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg) ==
            CUDNN_STATUS_SUCCESS);
    Desc p = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    finalize(p);
    int64_t ws = -1;
    REQUIRE(cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) ==
            CUDNN_STATUS_SUCCESS);
    CHECK(ws == 0);
    return p;
  }
  cudnnStatus_t execute(Desc plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs) {
    Desc vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    void* ws = nullptr;
    set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
    set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data());
    set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    finalize(vp);
    return cudnnBackendExecute(handle, plan, vp);
  }
};

std::vector<float> wave(size_t n, double f, double phase = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(f * static_cast<double>(i) + phase));
  return v;
}

}  // namespace

TEST_CASE("emulator cuDNN: version, status strings, handles") {
  CHECK(cudnnGetVersion() == 91900);
  CHECK(CUDNN_VERSION == 91900);
  CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)) == "CUDNN_STATUS_BAD_PARAM");
  CHECK(CUDNN_STATUS_CATEGORY(CUDNN_STATUS_NOT_SUPPORTED) == CUDNN_STATUS_NOT_SUPPORTED);
  cudnnHandle_t h = nullptr;
  REQUIRE(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS);
  CHECK(cudnnSetStream(h, nullptr) == CUDNN_STATUS_SUCCESS);
  CHECK(cudnnDestroy(h) == CUDNN_STATUS_SUCCESS);
  CHECK_CUDNN_FAILS(cudnnDestroy(h), CUDNN_STATUS_BAD_PARAM, "not a live handle");
}

TEST_CASE("emulator cuDNN: matmul over a transposed-stride view with broadcast batch, rounded once to half") {
  Builder B;
  // A (2,2,3,4) packed; K (1,2,5,4) packed, read as KT (1,2,4,5) by swapping its last two strides (no copy);
  // C = A @ KT (2,2,3,5) in HALF.
  const std::vector<int64_t> ad{2, 2, 3, 4}, kd{1, 2, 5, 4}, cd{2, 2, 3, 5};
  const std::vector<float> a = wave(48, 0.37), k = wave(40, 0.91, 0.3);
  float* da = device_alloc<float>(a.size());
  float* dk = device_alloc<float>(k.size());
  __half* dc = device_alloc<__half>(60);
  to_device(da, a);
  to_device(dk, k);
  Desc A = B.tensor(1, ad, packed(ad), CUDNN_DATA_FLOAT);
  Desc KT = B.tensor(2, {1, 2, 4, 5}, {40, 20, 1, 4}, CUDNN_DATA_FLOAT);
  Desc C = B.tensor(3, cd, packed(cd), CUDNN_DATA_HALF);
  Desc plan = B.plan({B.matmul(A, KT, C)});
  REQUIRE_MESSAGE(B.execute(plan, {1, 2, 3}, {da, dk, dc}) == CUDNN_STATUS_SUCCESS, last_error());
  const std::vector<__half> c = to_host(dc, 60);
  int mismatches = 0;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) {
          double s = 0;
          for (int l = 0; l < 4; ++l)
            s += static_cast<double>(a[((b * 2 + h) * 3 + i) * 4 + l]) * k[(h * 5 + j) * 4 + l];
          mismatches += c[((b * 2 + h) * 3 + i) * 5 + j].__x != __half(s).__x;
        }
  CHECK(mismatches == 0);
  cudaFree(da);
  cudaFree(dk);
  cudaFree(dc);
}

TEST_CASE("emulator cuDNN: softmax and log-sum-exp from MAX/SUB/EXP/ADD/LOG/DIV, ops given out of order") {
  Builder B;
  const std::vector<int64_t> xd{1, 2, 4, 6}, rd{1, 2, 4, 1};
  const std::vector<float> x = wave(48, 1.3);
  float* dx = device_alloc<float>(48);
  float* dp = device_alloc<float>(48);
  float* ds = device_alloc<float>(8);
  to_device(dx, x);
  Desc X = B.tensor(1, xd, packed(xd), CUDNN_DATA_FLOAT);
  Desc M = B.tensor(2, rd, packed(rd), CUDNN_DATA_FLOAT, true);
  Desc S = B.tensor(3, xd, packed(xd), CUDNN_DATA_FLOAT, true);
  Desc E = B.tensor(4, xd, packed(xd), CUDNN_DATA_FLOAT, true);
  Desc Z = B.tensor(5, rd, packed(rd), CUDNN_DATA_FLOAT, true);
  Desc L = B.tensor(6, rd, packed(rd), CUDNN_DATA_FLOAT, true);
  Desc P = B.tensor(7, xd, packed(xd), CUDNN_DATA_FLOAT);
  Desc Stats = B.tensor(8, rd, packed(rd), CUDNN_DATA_FLOAT);
  std::vector<Desc> ops = {B.reduction(CUDNN_REDUCE_TENSOR_MAX, X, M), B.pointwise(CUDNN_POINTWISE_SUB, X, S, M),
                           B.pointwise(CUDNN_POINTWISE_EXP, S, E),     B.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z),
                           B.pointwise(CUDNN_POINTWISE_LOG, Z, L),     B.pointwise(CUDNN_POINTWISE_ADD, M, Stats, L),
                           B.pointwise(CUDNN_POINTWISE_DIV, E, P, Z)};
  std::reverse(ops.begin(), ops.end());  // the interpreter sorts by dependencies
  Desc plan = B.plan(ops);
  REQUIRE_MESSAGE(B.execute(plan, {1, 7, 8}, {dx, dp, ds}) == CUDNN_STATUS_SUCCESS, last_error());
  const std::vector<float> p = to_host(dp, 48), stats = to_host(ds, 8);
  double worst = 0;
  for (int r = 0; r < 8; ++r) {
    double m = -INFINITY, z = 0;
    for (int j = 0; j < 6; ++j) m = std::max(m, static_cast<double>(x[r * 6 + j]));
    for (int j = 0; j < 6; ++j) z += std::exp(x[r * 6 + j] - m);
    for (int j = 0; j < 6; ++j) worst = std::max(worst, std::abs(p[r * 6 + j] - std::exp(x[r * 6 + j] - m) / z));
    worst = std::max(worst, std::abs(stats[r] - (m + std::log(z))));
  }
  CHECK(worst < 1e-6);
  cudaFree(dx);
  cudaFree(dp);
  cudaFree(ds);
}

TEST_CASE("emulator cuDNN: GEN_INDEX + CMP_GE + BINARY_SELECT give the top-left causal mask, by-value scalars") {
  Builder B;
  const std::vector<int64_t> d{1, 1, 4, 5};
  const auto st = packed(d);
  const std::vector<float> s = wave(20, 0.7);
  float* ds = device_alloc<float>(20);
  float* dy = device_alloc<float>(20);
  to_device(ds, s);
  Desc S = B.tensor(1, d, st, CUDNN_DATA_FLOAT);
  Desc scale = B.scalar(2), neg_inf = B.scalar(3);
  Desc S2 = B.tensor(4, d, st, CUDNN_DATA_FLOAT, true);
  Desc row = B.tensor(5, d, st, CUDNN_DATA_INT32, true), col = B.tensor(6, d, st, CUDNN_DATA_INT32, true);
  Desc mask = B.tensor(7, d, st, CUDNN_DATA_BOOLEAN, true);
  Desc Y = B.tensor(8, d, st, CUDNN_DATA_FLOAT);
  Desc plan = B.plan({B.pointwise(CUDNN_POINTWISE_MUL, S, S2, scale),
                      B.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, row, nullptr, nullptr, 2, CUDNN_DATA_INT32),
                      B.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, col, nullptr, nullptr, 3),
                      B.pointwise(CUDNN_POINTWISE_CMP_GE, row, mask, col, nullptr, -1, CUDNN_DATA_BOOLEAN),
                      B.pointwise(CUDNN_POINTWISE_BINARY_SELECT, S2, Y, neg_inf, mask)});
  float scale_v = 0.5f, neg_inf_v = -INFINITY;
  REQUIRE_MESSAGE(B.execute(plan, {1, 2, 3, 8}, {ds, &scale_v, &neg_inf_v, dy}) == CUDNN_STATUS_SUCCESS, last_error());
  const std::vector<float> y = to_host(dy, 20);
  int bad = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) bad += y[i * 5 + j] != (i >= j ? 0.5f * s[i * 5 + j] : -INFINITY);
  CHECK(bad == 0);
  cudaFree(ds);
  cudaFree(dy);
}

TEST_CASE("emulator cuDNN: RESHAPE views X's memory through Y's strides (transpose, also square; merge)") {
  struct Case {
    std::vector<int64_t> xd, yd, ys;
    bool transpose;
  };
  // Square: Y's dims equal X's, only the strides say it is the transpose (PT = reshape(P) when T == S).
  for (const Case& c :
       {Case{{1, 2, 3, 3}, {1, 2, 3, 3}, {18, 9, 1, 3}, true}, Case{{1, 2, 2, 3}, {1, 2, 3, 2}, {12, 6, 1, 3}, true},
        Case{{1, 2, 3, 4}, {1, 1, 6, 4}, {24, 24, 4, 1}, false}}) {
    CAPTURE(c.yd[3]);
    Builder B;
    const size_t n = static_cast<size_t>(c.xd[0] * c.xd[1] * c.xd[2] * c.xd[3]);
    const std::vector<float> x = wave(n, 0.45);
    float* dx = device_alloc<float>(n);
    float* dy = device_alloc<float>(n);
    to_device(dx, x);
    // X is copied into a virtual tensor first: the reshape runs on interpreter scratch, as P -> PT does, and its
    // output is declared BFLOAT16 (rounded) like PT.
    Desc X = B.tensor(1, c.xd, packed(c.xd), CUDNN_DATA_FLOAT);
    Desc V = B.tensor(2, c.xd, packed(c.xd), CUDNN_DATA_FLOAT, true);
    Desc VT = B.tensor(3, c.yd, c.ys, CUDNN_DATA_BFLOAT16, true);
    Desc Y = B.tensor(4, c.yd, packed(c.yd), CUDNN_DATA_FLOAT);
    Desc plan = B.plan(
        {B.pointwise(CUDNN_POINTWISE_IDENTITY, X, V), B.reshape(V, VT), B.pointwise(CUDNN_POINTWISE_IDENTITY, VT, Y)});
    REQUIRE_MESSAGE(B.execute(plan, {1, 4}, {dx, dy}) == CUDNN_STATUS_SUCCESS, last_error());
    const std::vector<float> y = to_host(dy, n);
    int bad = 0;
    if (c.transpose) {
      const int64_t h = c.xd[1], r = c.xd[2], q = c.xd[3];
      for (int64_t b = 0; b < h; ++b)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < q; ++j)
            bad += y[(b * q + j) * r + i] != static_cast<float>(__nv_bfloat16(x[(b * r + i) * q + j]));
    } else {
      for (size_t i = 0; i < n; ++i) bad += y[i] != static_cast<float>(__nv_bfloat16(x[i]));
    }
    CHECK(bad == 0);
    cudaFree(dx);
    cudaFree(dy);
  }
}

TEST_CASE("emulator cuDNN: the SDPA forward graph of the recipe (bf16, causal, stats) matches naive attention") {
  Builder B;
  const int64_t b = 1, h = 2, t = 3, s = 5, d = 8;
  const std::vector<int64_t> qd{b, h, t, d}, kd{b, h, s, d}, sd{b, h, t, s}, rd{b, h, t, 1};
  const std::vector<float> q = wave(b * h * t * d, 0.61), k = wave(b * h * s * d, 0.83, 1.0),
                           v = wave(b * h * s * d, 0.29, 2.0);
  auto bf = [](const std::vector<float>& f) {
    std::vector<__nv_bfloat16> r(f.begin(), f.end());
    return r;
  };
  auto* dq = device_alloc<__nv_bfloat16>(q.size());
  auto* dk = device_alloc<__nv_bfloat16>(k.size());
  auto* dv = device_alloc<__nv_bfloat16>(v.size());
  auto* dout = device_alloc<__nv_bfloat16>(q.size());
  float* dstats = device_alloc<float>(b * h * t);
  to_device(dq, bf(q));
  to_device(dk, bf(k));
  to_device(dv, bf(v));
  const cudnnDataType_t io = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const auto ks = packed(kd);
  Desc Q = B.tensor(1, qd, packed(qd), io), KT = B.tensor(2, {b, h, d, s}, {ks[0], ks[1], 1, ks[2]}, io);
  Desc V = B.tensor(3, kd, packed(kd), io), O = B.tensor(4, qd, packed(qd), io);
  Desc Stats = B.tensor(5, rd, packed(rd), f32), scale = B.scalar(6), neg_inf = B.scalar(7);
  auto vt = [&](int64_t uid, const std::vector<int64_t>& dims, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return B.tensor(uid, dims, packed(dims), dt, true);
  };
  Desc S1 = vt(10, sd), S2 = vt(11, sd), row = vt(12, sd, CUDNN_DATA_INT32), col = vt(13, sd, CUDNN_DATA_INT32);
  Desc mask = vt(14, sd, CUDNN_DATA_BOOLEAN), S3 = vt(15, sd), M = vt(16, rd), S4 = vt(17, sd), E = vt(18, sd);
  Desc Z = vt(19, rd), L = vt(20, rd), P = vt(21, sd, io);
  Desc plan = B.plan({B.matmul(Q, KT, S1), B.pointwise(CUDNN_POINTWISE_MUL, S1, S2, scale),
                      B.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, row, nullptr, nullptr, 2),
                      B.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, col, nullptr, nullptr, 3),
                      B.pointwise(CUDNN_POINTWISE_CMP_GE, row, mask, col, nullptr, -1, CUDNN_DATA_BOOLEAN),
                      B.pointwise(CUDNN_POINTWISE_BINARY_SELECT, S2, S3, neg_inf, mask),
                      B.reduction(CUDNN_REDUCE_TENSOR_MAX, S3, M), B.pointwise(CUDNN_POINTWISE_SUB, S3, S4, M),
                      B.pointwise(CUDNN_POINTWISE_EXP, S4, E), B.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z),
                      B.pointwise(CUDNN_POINTWISE_LOG, Z, L), B.pointwise(CUDNN_POINTWISE_ADD, M, Stats, L),
                      B.pointwise(CUDNN_POINTWISE_DIV, E, P, Z), B.matmul(P, V, O)});
  float scale_v = 1.0f / std::sqrt(static_cast<float>(d)), neg_inf_v = -INFINITY;
  REQUIRE_MESSAGE(
      B.execute(plan, {1, 2, 3, 4, 5, 6, 7}, {dq, dk, dv, dout, dstats, &scale_v, &neg_inf_v}) == CUDNN_STATUS_SUCCESS,
      last_error());
  const std::vector<__nv_bfloat16> o = to_host(dout, q.size());
  const std::vector<float> stats = to_host(dstats, b * h * t);
  auto r16 = [](double x) { return static_cast<double>(static_cast<float>(__nv_bfloat16(x))); };
  double worst_o = 0, worst_s = 0;
  for (int64_t hh = 0; hh < h; ++hh)
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> sc(s, -INFINITY);
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t l = 0; l < d; ++l) dot += r16(q[(hh * t + i) * d + l]) * r16(k[(hh * s + j) * d + l]);
        sc[j] = dot * scale_v;
        m = std::max(m, sc[j]);
      }
      for (int64_t j = 0; j <= i; ++j) z += std::exp(sc[j] - m);
      worst_s = std::max(worst_s, std::abs(stats[hh * t + i] - (m + std::log(z))));
      for (int64_t l = 0; l < d; ++l) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += r16(std::exp(sc[j] - m) / z) * r16(v[(hh * s + j) * d + l]);
        worst_o = std::max(worst_o, std::abs(static_cast<float>(o[(hh * t + i) * d + l]) - acc));
      }
    }
  CHECK(worst_s < 1e-5);
  CHECK(worst_o < 1e-2);  // one bf16 rounding of O (and rare P ties): half an ulp of bf16 at |O| < 1
  for (void* p : std::vector<void*>{dq, dk, dv, dout, dstats}) cudaFree(p);
}

TEST_CASE("emulator cuDNN: descriptor checks: attribute types and counts, finalize state, missing attributes") {
  Builder B;
  Desc t = B.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t dims[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const float f = 1.0f;
  const cudnnDataType_t dts[2] = {CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
  CHECK_CUDNN_FAILS(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_FLOAT, 1, &f),
                    CUDNN_STATUS_BAD_PARAM, "given as CUDNN_TYPE_FLOAT, expected CUDNN_TYPE_INT64");
  CHECK_CUDNN_FAILS(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 9, dims),
                    CUDNN_STATUS_BAD_PARAM, "9 elements, expected 1 to 8");
  CHECK_CUDNN_FAILS(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 2, dts),
                    CUDNN_STATUS_BAD_PARAM, "2 elements, expected 1");
  CHECK_CUDNN_FAILS(cudnnBackendSetAttribute(t, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, dts),
                    CUDNN_STATUS_BAD_PARAM, "not an attribute of this descriptor");
  // A tensor without its UID does not finalize.
  Desc u = B.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t d4[4] = {1, 1, 2, 2}, s4[4] = {4, 4, 2, 1}, align = 16;
  Builder::set(u, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, dts);
  Builder::set(u, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, d4);
  Builder::set(u, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s4);
  Builder::set(u, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(u), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_UNIQUE_ID was not set");
  // After finalize nothing can be set.
  Desc x = B.tensor(1, {1, 1, 2, 2}, {4, 4, 2, 1}, CUDNN_DATA_FLOAT);
  const int64_t uid = 9;
  CHECK_CUDNN_FAILS(cudnnBackendSetAttribute(x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
                    CUDNN_STATUS_BAD_PARAM, "already finalized");
  // An unfinalized descriptor cannot be an attribute, nor read.
  Desc op = B.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  CHECK_CUDNN_FAILS(
      cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &u),
      CUDNN_STATUS_BAD_PARAM, "is not finalized");
  CHECK_CUDNN_FAILS(
      cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op),
      CUDNN_STATUS_BAD_PARAM, "expected TENSOR");
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "PW_DESCRIPTOR was not set");
  // An alpha other than 1 is not emulated.
  Desc y = B.tensor(2, {1, 1, 2, 2}, {4, 4, 2, 1}, CUDNN_DATA_FLOAT);
  Desc scaled = B.pointwise_op(CUDNN_POINTWISE_IDENTITY, x, y);
  const float two = 2.0f;
  Builder::set(scaled, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &two);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(scaled), CUDNN_STATUS_NOT_SUPPORTED, "ALPHA1");
  // Engine configs only come from the heuristics.
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)), CUDNN_STATUS_NOT_SUPPORTED,
                    "ENGINEHEUR_RESULTS");
  int64_t n = 0;
  CHECK_CUDNN_FAILS(cudnnBackendGetAttribute(x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &n, &n),
                    CUDNN_STATUS_BAD_PARAM, "read as CUDNN_TYPE_FLOAT");
  CHECK(cudnnBackendGetAttribute(x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &n) == CUDNN_STATUS_SUCCESS);
  CHECK(n == 1);
}

TEST_CASE("emulator cuDNN: graph checks: shapes, matmul inner dims, by-value, UIDs, reshape layouts") {
  Builder B;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Desc x = B.tensor(1, {1, 1, 2, 3}, {6, 6, 3, 1}, f32);
  Desc b33 = B.tensor(2, {1, 1, 3, 3}, {9, 9, 3, 1}, f32);
  Desc y = B.tensor(3, {1, 1, 2, 3}, {6, 6, 3, 1}, f32);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.pointwise_op(CUDNN_POINTWISE_ADD, x, y, b33)), CUDNN_STATUS_BAD_PARAM,
                    "operand B uid 2 (1,1,3,3)");
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.pointwise_op(CUDNN_POINTWISE_ADD, x, y)), CUDNN_STATUS_BAD_PARAM,
                    "BDESC was not set");
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.matmul_op(x, x, y)), CUDNN_STATUS_BAD_PARAM, "inner dimensions differ");
  // By-value tensors: never an output, never XDESC (the real library crashes on that).
  Desc scalar = B.scalar(4);
  Desc out1 = B.tensor(5, {1, 1, 1, 1}, {1, 1, 1, 1}, f32);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.pointwise_op(CUDNN_POINTWISE_IDENTITY, out1, scalar)),
                    CUDNN_STATUS_BAD_PARAM, "by-value tensor uid 4");
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.pointwise_op(CUDNN_POINTWISE_MUL, scalar, y, x)), CUDNN_STATUS_BAD_PARAM,
                    "XDESC is the by-value tensor uid 4");
  // One UID for two different tensors in one graph.
  Desc y_other = B.tensor(3, {1, 1, 2, 3}, {6, 6, 3, 1}, CUDNN_DATA_HALF);
  Desc z = B.tensor(6, {1, 1, 2, 3}, {6, 6, 3, 1}, f32);
  Desc g = B.graph({B.pointwise(CUDNN_POINTWISE_EXP, x, y), B.pointwise(CUDNN_POINTWISE_EXP, y_other, z)});
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(g), CUDNN_STATUS_BAD_PARAM, "UID 3 names two different tensors");
  // Two writers of one tensor; a virtual tensor nobody writes.
  Desc g2 = B.graph({B.pointwise(CUDNN_POINTWISE_EXP, x, y), B.pointwise(CUDNN_POINTWISE_LOG, x, y)});
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(g2), CUDNN_STATUS_BAD_PARAM, "is written by two operations");
  Desc v = B.tensor(7, {1, 1, 2, 3}, {6, 6, 3, 1}, f32, true);
  Desc g3 = B.graph({B.pointwise(CUDNN_POINTWISE_EXP, v, y)});
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(g3), CUDNN_STATUS_BAD_PARAM, "no operation writes it");
  // A reshape whose Y addresses other elements than X.
  Desc wide = B.tensor(8, {1, 1, 3, 2}, {6, 6, 3, 1}, f32, true);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(B.reshape_op(x, wide)), CUDNN_STATUS_BAD_PARAM,
                    "does not view the same elements");
  // GEN_INDEX needs an axis inside the rank.
  Desc gi = B.pointwise_op(CUDNN_POINTWISE_GEN_INDEX, x, y, nullptr, nullptr, 4);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(gi), CUDNN_STATUS_BAD_PARAM, "axis 4");
}

TEST_CASE("emulator cuDNN: execute checks the variant pack: coverage, virtuals, device memory, extents, alignment") {
  Builder B;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Desc X = B.tensor(1, {1, 1, 2, 4}, {8, 8, 4, 1}, f32);
  Desc V = B.tensor(2, {1, 1, 2, 4}, {8, 8, 4, 1}, f32, true);
  Desc Y = B.tensor(3, {1, 1, 2, 4}, {8, 8, 4, 1}, f32);
  Desc S = B.scalar(4);
  Desc plan = B.plan({B.pointwise(CUDNN_POINTWISE_MUL, X, V, S), B.pointwise(CUDNN_POINTWISE_EXP, V, Y)});
  float* dx = device_alloc<float>(8);
  float* dy = device_alloc<float>(12);
  float* small = device_alloc<float>(4);
  alignas(16) float host[16] = {};
  float s = 1.0f;
  to_device(dx, std::vector<float>(8, 0.5f));
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3}, {dx, dy}), CUDNN_STATUS_BAD_PARAM,
                    "no pointer for the graph's tensor uid 4");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 2, 3, 4}, {dx, dy, dy, &s}), CUDNN_STATUS_BAD_PARAM,
                    "names the virtual tensor uid 2");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3, 4, 99}, {dx, dy, &s, dy}), CUDNN_STATUS_BAD_PARAM,
                    "uid 99, which is no tensor of the graph");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3, 4}, {dx, host, &s}), CUDNN_STATUS_BAD_PARAM, "is not device memory");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3, 4}, {dx, small, &s}), CUDNN_STATUS_BAD_PARAM,
                    "runs outside its device allocation");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3, 4}, {dx, dy + 1, &s}), CUDNN_STATUS_BAD_PARAM, "16-byte aligned");
  CHECK_CUDNN_FAILS(B.execute(plan, {1, 3, 4}, {dx, dy, dx}), CUDNN_STATUS_BAD_PARAM, "given a device pointer");
  Desc vp = B.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const int64_t uids[2] = {1, 1};
  void* ptrs[2] = {dx, dx};
  Builder::set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 2, uids);
  Builder::set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 2, ptrs);
  CHECK_CUDNN_FAILS(cudnnBackendFinalize(vp), CUDNN_STATUS_BAD_PARAM, "unique id 1 appears twice");
  // And the well-formed call works: y = exp(x * s).
  REQUIRE_MESSAGE(B.execute(plan, {1, 3, 4}, {dx, dy, &s}) == CUDNN_STATUS_SUCCESS, last_error());
  const std::vector<float> y = to_host(dy, 8);
  for (float e : y) CHECK(e == static_cast<float>(std::exp(0.5)));
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(small);
}
