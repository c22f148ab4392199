// A fuzzer of the op API: random op sequences over random shapes (0, 1, small, negative, and sizes near
// the 64-bit limits), dtypes, broadcasting, non-contiguous views and devices (CPU, and CUDA where a device is present:
// the emulator in CI). Every call must either throw asc::Error or return a result that an independent float64
// recomputation on the host confirms; anything else (another exception type, a wrong value, a sanitizer report) fails
// with the seed and step that reproduce it:
//
//   ASC_FUZZ_SEED=1234 ASC_FUZZ_SECONDS=5 build/asan/tests/test_fuzz_ops
//   ASC_FUZZ_SEED=1234 ASC_FUZZ_FIRST_STEP=6842 ASC_FUZZ_SECONDS=0.001 build/asan/tests/test_fuzz_ops   # one step
//
// A third case runs the op table's entries (tests/op_table.h) on hostile values. The sanitizer run in CI gives the
// file about a minute (tests/CMakeLists.txt); the other builds a few seconds.
#include <chrono>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "op_table.h"
#include "testing.h"

using namespace asc;

namespace {

// ---- host reference: a contiguous float64 array with a shape ----------------------------------------------------

struct Host {
  Shape shape;
  std::vector<double> v;
};

Host host_of(const Tensor& t) {
  Tensor c = t;
  if (c.dtype() == kBFloat16 || c.dtype() == kFloat16) c = c.to(kFloat32);
  return {t.shape(), c.to_vector<double>()};
}

// The multi-index of linear position i in `s` (row-major).
Dims unravel(int64_t i, const Shape& s) {
  Dims idx = Dims::filled(s.size(), 0);
  for (int d = s.size() - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
int64_t ravel(const Dims& idx, const Shape& s) {
  int64_t i = 0;
  for (int d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

// Element of `h` seen through broadcasting to `target`.
double at_broadcast(const Host& h, const Dims& idx, const Shape& target) {
  Dims src = Dims::filled(h.shape.size(), 0);
  for (int d = 0; d < h.shape.size(); ++d) {
    const int td = target.size() - h.shape.size() + d;
    src[d] = h.shape[d] == 1 ? 0 : idx[td];
  }
  return h.v[static_cast<size_t>(ravel(src, h.shape))];
}

// ---- the fuzzer -------------------------------------------------------------------------------------------------

struct Fuzzer {
  std::mt19937_64 rng;
  std::vector<Device> devices{Device::cpu()};
  int64_t checked = 0, refused = 0;
  const char* last = "";  // the family of the step running (named when one fails)
  std::map<std::string, std::pair<int64_t, int64_t>> by_family;  // checked, refused

  explicit Fuzzer(uint64_t seed) : rng(seed) {
    if (cuda::is_available()) devices.push_back(Device::cuda());
  }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng); }
  template <class T>
  const T& pick(const std::vector<T>& xs) {
    return xs[static_cast<size_t>(uniform(0, static_cast<int64_t>(xs.size()) - 1))];
  }

  // A size: mostly small, sometimes 0, sometimes hostile (negative, or near the 64-bit limits).
  int64_t size() {
    // Not 2^31 or 2^32: those fit in this machine's memory and would be allocated and filled for real. 2^40
    // elements do not: the allocator refuses them.
    if (chance(0.03))
      return pick<int64_t>({-1, -7, int64_t{1} << 40, int64_t{1} << 62, std::numeric_limits<int64_t>::max()});
    return pick<int64_t>({0, 1, 1, 2, 2, 3, 3, 4, 5});
  }
  Shape shape(int max_rank = 4) {
    Shape s;
    const int r = static_cast<int>(uniform(0, max_rank));
    for (int i = 0; i < r; ++i) s.push_back(size());
    return s;
  }
  int64_t dim_arg(int rank) {
    return chance(0.05) ? uniform(-9, 9) : uniform(-std::max(rank, 1), std::max(rank, 1) - 1);
  }

  // A random input: a fresh tensor, or a non-contiguous view of one (transposed, sliced, expanded).
  Tensor input(const Shape& s, DType dt, Device dev) {
    Tensor t = dt == kInt64  ? randint(-3, 4, s, {}, nullptr)
               : dt == kBool ? randint(0, 2, s).to(kBool)
                             : randn(s, {.dtype = dt});
    if (s.size() >= 2 && chance(0.3)) t = t.transpose(0, 1).contiguous().transpose(0, 1);  // same values, strided
    return t.to(dev);
  }

  // One step: an op chosen at random with random arguments. Returns normally when the op threw asc::Error or its
  // result was confirmed; CHECK failures name the step.
  void step() {
    const Device dev = pick(devices);
    const DType dt = chance(0.1) ? kInt64 : chance(0.5) ? kFloat64 : kFloat32;
    const int op = static_cast<int>(uniform(0, 9));
    static const char* const names[] = {"unary", "binary", "reduce",   "matmul",  "view",
                                        "cat",   "gather", "creation", "softmax", "convert"};
    last = names[op];
    try {
      switch (op) {
        case 0: unary(dev, dt); break;
        case 1: binary(dev, dt); break;
        case 2: reduce(dev, dt); break;
        case 3: matmul_op(dev); break;
        case 4: view_op(dev, dt); break;
        case 5: cat_op(dev, dt); break;
        case 6: gather_op(dev); break;
        case 7: creation(dev); break;
        case 8: softmax_op(dev); break;
        default: convert(dev, dt); break;
      }
      ++checked;
      ++by_family[last].first;
    } catch (const Error&) {
      ++refused;  // a clean refusal is a correct outcome for hostile arguments
      ++by_family[last].second;
    }
  }

  static double tol(DType dt) { return dt == kFloat64 ? 1e-9 : 1e-4; }
  void expect_close(const Tensor& got, const Host& want, DType dt, const char* what) {
    // FAIL only on a mismatch: one doctest assertion per element would dominate the fuzzer's time.
    if (!(got.shape() == want.shape))
      FAIL(std::string(what) << ": shape " << fmt::format("{}", got.shape()) << ", expected "
                             << fmt::format("{}", want.shape));
    const Host g = host_of(got);
    for (size_t i = 0; i < g.v.size(); ++i) {
      const double a = g.v[i], b = want.v[i];
      if (std::isnan(a) && std::isnan(b)) continue;
      if (std::isinf(b) && a == b) continue;
      if (!(std::abs(a - b) <= tol(dt) * (1 + std::abs(b))))
        FAIL(std::string(what) << ": element " << i << " is " << a << ", expected " << b);
    }
  }

  void unary(Device dev, DType dt) {
    Tensor x = input(shape(), dt, dev);
    const int which = static_cast<int>(uniform(0, 6));
    static const std::vector<std::pair<const char*, std::function<double(double)>>> fs = {
        {"exp", [](double v) { return std::exp(v); }},
        {"abs", [](double v) { return std::abs(v); }},
        {"relu", [](double v) { return v > 0 ? v : 0.0; }},
        {"tanh", [](double v) { return std::tanh(v); }},
        {"sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); }},
        {"neg", [](double v) { return -v; }},
        {"sqrt", [](double v) { return std::sqrt(v); }}};
    Tensor y;
    switch (which) {
      case 0: y = exp(x); break;
      case 1: y = abs(x); break;
      case 2: y = relu(x); break;
      case 3: y = tanh(x); break;
      case 4: y = sigmoid(x); break;
      case 5: y = -x; break;
      default: y = sqrt(x); break;
    }
    Host h = host_of(x);
    for (double& v : h.v) v = fs[static_cast<size_t>(which)].second(v);
    expect_close(y, h, y.dtype(), fs[static_cast<size_t>(which)].first);
  }

  void binary(Device dev, DType dt) {
    // Broadcast-compatible most of the time: b's shape is a suffix of a's with some dims set to 1.
    Shape sa = shape(), sb;
    if (chance(0.85)) {
      const int keep = static_cast<int>(uniform(0, sa.size()));
      for (int i = sa.size() - keep; i < sa.size(); ++i) sb.push_back(chance(0.3) ? 1 : sa[i]);
    } else {
      sb = shape();
    }
    if (chance(0.5)) std::swap(sa, sb);
    Tensor a = input(sa, dt, dev), b = input(sb, chance(0.05) ? kFloat64 : dt, dev);
    const int which = static_cast<int>(uniform(0, 3));
    Tensor y = which == 0 ? a + b : which == 1 ? a - b : which == 2 ? a * b : a / b;
    const Shape out = broadcast_shapes(sa, sb, "fuzz");
    const Host ha = host_of(a), hb = host_of(b);
    Host want{out, std::vector<double>(static_cast<size_t>(numel_of(out)))};
    for (int64_t i = 0; i < numel_of(out); ++i) {
      const Dims idx = unravel(i, out);
      const double x = at_broadcast(ha, idx, out), z = at_broadcast(hb, idx, out);
      double r = which == 0 ? x + z : which == 1 ? x - z : which == 2 ? x * z : x / z;
      if (which == 3 && y.dtype() == kInt64) r = std::nan("");  // integer division: compare shapes only
      want.v[static_cast<size_t>(i)] = r;
    }
    if (which == 3 && y.dtype() == kInt64) {
      if (!(y.shape() == out)) FAIL("integer division: wrong shape");
      return;
    }
    expect_close(y, want, y.dtype(), "binary op");
  }

  void reduce(Device dev, DType dt) {
    Tensor x = input(shape(), dt == kInt64 ? kFloat64 : dt, dev);
    const bool all = chance(0.3), keep = chance(0.5), mean_op = chance(0.5);
    const int64_t d = dim_arg(x.dim());
    Tensor y = all ? (mean_op ? x.mean() : x.sum()) : (mean_op ? x.mean({d}, keep) : x.sum({d}, keep));
    const Host h = host_of(x);
    if (all) {
      double s = 0;
      for (double v : h.v) s += v;
      if (mean_op) s /= static_cast<double>(h.v.size());
      expect_close(y, Host{{}, {s}}, x.dtype(), "sum/mean (all)");
      return;
    }
    const int dd = wrap_dim(d, x.dim(), "fuzz");
    Shape out = x.shape();
    if (x.dim() == 0) {
      expect_close(y, h, x.dtype(), "sum/mean of a 0-d tensor");
      return;
    }
    const int64_t n = out[dd];
    out[dd] = 1;
    Host want{out, std::vector<double>(static_cast<size_t>(numel_of(out)), 0.0)};
    for (int64_t i = 0; i < numel_of(x.shape()); ++i) {
      Dims idx = unravel(i, x.shape());
      idx[dd] = 0;
      want.v[static_cast<size_t>(ravel(idx, out))] += h.v[static_cast<size_t>(i)];
    }
    if (mean_op)
      for (double& v : want.v) v /= static_cast<double>(n);
    if (!keep) want.shape.erase(dd);
    expect_close(y, want, x.dtype(), "sum/mean over a dim");
  }

  void matmul_op(Device dev) {
    const DType dt = chance(0.5) ? kFloat64 : kFloat32;
    const int64_t M = size(), K = size(), N = size(), B = chance(0.5) ? size() : -2;
    Shape sa{M, K}, sb{K, N};
    if (B != -2) sa.insert(0, B);
    if (chance(0.1)) sb[0] = size();  // inner dimensions that may differ
    Tensor a = input(sa, dt, dev), b = input(sb, dt, dev);
    Tensor y = matmul(a, b);
    const Host ha = host_of(a), hb = host_of(b);
    int64_t nb = B == -2 ? 1 : B;
    Shape out = B == -2 ? Shape{M, N} : Shape{B, M, N};
    Host want{out, std::vector<double>(static_cast<size_t>(numel_of(out)), 0.0)};
    if (want.v.empty()) nb = 0;  // no loop over a huge batch of empty matrices
    for (int64_t p = 0; p < nb; ++p)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += ha.v[static_cast<size_t>((p * M + i) * K + k)] * hb.v[static_cast<size_t>(k * N + j)];
          want.v[static_cast<size_t>((p * M + i) * N + j)] = s;
        }
    expect_close(y, want, dt, "matmul");
  }

  // Views, checked element by element through the index mapping they promise; then made contiguous.
  void view_op(Device dev, DType dt) {
    Tensor x = input(shape(), dt, dev);
    const Host h = host_of(x);
    const int r = x.dim();
    const int which = static_cast<int>(uniform(0, 7));
    Tensor y;
    std::function<Dims(const Dims&)> source;  // output multi-index -> input multi-index
    switch (which) {
      case 0: {
        const int64_t a = dim_arg(r), b = dim_arg(r);
        y = x.transpose(a, b);
        const int wa = wrap_dim(a, r, "fuzz"), wb = wrap_dim(b, r, "fuzz");
        source = [=](const Dims& o) {
          Dims s = o;
          if (r > 0) std::swap(s[wa], s[wb]);
          return s;
        };
        break;
      }
      case 1: {
        const int64_t d = dim_arg(r),
                      start =
                          chance(0.1) ? pick<int64_t>({-1, std::numeric_limits<int64_t>::max() - 1}) : uniform(0, 3),
                      len = chance(0.1) ? std::numeric_limits<int64_t>::max() : uniform(0, 3);
        y = x.narrow(d, start, len);
        const int wd = wrap_dim(d, r, "fuzz");
        source = [=](const Dims& o) {
          Dims s = o;
          s[wd] += start;
          return s;
        };
        break;
      }
      case 2: {
        const int64_t d = dim_arg(r), start = uniform(-4, 4), end = uniform(-4, 6),
                      step = chance(0.1) ? std::numeric_limits<int64_t>::max() : uniform(1, 3);
        y = x.slice(d, start, end, step);
        const int wd = wrap_dim(d, r, "fuzz");
        const int64_t n = r == 0 ? 1 : x.size(wd);
        const int64_t s0 = std::clamp<int64_t>(start < 0 ? start + n : start, 0, n);
        source = [=](const Dims& o) {
          Dims s = o;
          s[wd] = s0 + o[wd] * step;
          return s;
        };
        break;
      }
      case 3: {
        const int64_t d = dim_arg(r + 1);
        y = x.unsqueeze(d);
        const int wd = wrap_dim(d, r + 1, "fuzz");
        source = [=](const Dims& o) {
          Dims s = o;
          s.erase(wd);
          return s;
        };
        break;
      }
      case 4: {
        Shape target = x.shape();
        for (int i = 0; i < target.size(); ++i)
          if (target[i] == 1 && chance(0.5)) target[i] = size();
        if (chance(0.3)) target.insert(0, size());
        y = x.expand(target);
        const int lead = target.size() - r;
        source = [=, shp = x.shape()](const Dims& o) {
          Dims s = Dims::filled(r, 0);
          for (int i = 0; i < r; ++i) s[i] = shp[i] == 1 ? 0 : o[i + lead];
          return s;
        };
        break;
      }
      case 5: {
        Shape target;
        if (chance(0.3)) {
          target = shape();
        } else {
          target.push_back(-1);
          if (chance(0.5)) target.push_back(1);
        }
        y = x.reshape(target);  // keeps the row-major order: compared flat
        if (y.numel() != x.numel()) FAIL("reshape changed the element count");
        expect_close(y.contiguous().reshape({-1}), Host{{static_cast<int64_t>(h.v.size())}, h.v}, x.dtype(), "reshape");
        return;
      }
      default: {
        Dims order;
        for (int i = 0; i < r; ++i) order.push_back(i);
        std::shuffle(order.begin(), order.end(), rng);
        if (chance(0.1) && r > 0) order[0] = order[r - 1];  // a repeated dimension
        y = x.permute(order);
        source = [=](const Dims& o) {
          Dims s = Dims::filled(r, 0);
          for (int i = 0; i < r; ++i) s[order[i]] = o[i];
          return s;
        };
        break;
      }
    }
    if (y.numel() > 100000) return;  // a huge expanded view (make_view checked its bounds): not copied
    Host want{y.shape(), std::vector<double>(static_cast<size_t>(y.numel()))};
    for (int64_t i = 0; i < y.numel(); ++i) {
      const Dims s = source(unravel(i, y.shape()));
      want.v[static_cast<size_t>(i)] = h.v[static_cast<size_t>(ravel(s, x.shape()))];
    }
    expect_close(y.contiguous(), want, x.dtype(), "view");
  }

  void cat_op(Device dev, DType dt) {
    Shape s = shape(3);
    const int n = static_cast<int>(uniform(1, 3));
    const int64_t d = dim_arg(s.size());
    TensorList xs;
    for (int i = 0; i < n; ++i) {
      Shape si = s;
      if (s.size() > 0 && chance(0.8)) si[wrap_dim(d, s.size(), "fuzz")] = size();
      xs.push_back(input(si, dt, dev));
    }
    Tensor y = cat(xs, d);
    const int wd = wrap_dim(d, s.size(), "fuzz");
    Host want{y.shape(), std::vector<double>(static_cast<size_t>(y.numel()))};
    int64_t base = 0;
    for (const Tensor& x : xs) {
      const Host h = host_of(x);
      for (int64_t i = 0; i < x.numel(); ++i) {
        Dims idx = unravel(i, x.shape());
        idx[wd] += base;
        want.v[static_cast<size_t>(ravel(idx, y.shape()))] = h.v[static_cast<size_t>(i)];
      }
      base += x.size(wd);
    }
    expect_close(y, want, dt, "cat");
  }

  void gather_op(Device dev) {
    const int64_t V = size(), D = size(), N = size();
    Tensor w = input({V, D}, kFloat64, dev);
    const int64_t high = std::clamp<int64_t>(V, 1, 1000) + (chance(0.1) ? 2 : 0);  // sometimes out of range
    Tensor idx = randint(chance(0.1) ? -2 : 0, high, {N}).to(dev);
    Tensor y = chance(0.5) ? embedding(w, idx) : index_select(w, 0, idx);
    const Host hw = host_of(w), hi = host_of(idx);
    Host want{{N, D}, std::vector<double>(static_cast<size_t>(N * D))};
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < D; ++j)
        want.v[static_cast<size_t>(i * D + j)] = hw.v[static_cast<size_t>(static_cast<int64_t>(hi.v[i]) * D + j)];
    expect_close(y, want, kFloat64, "embedding/index_select");
  }

  void creation(Device dev) {
    const Shape s = shape();
    const int which = static_cast<int>(uniform(0, 4));
    if (which == 0) {
      Tensor t = full(s, 2.5, {.dtype = kFloat64, .device = dev});
      expect_close(t, Host{s, std::vector<double>(static_cast<size_t>(numel_of(s)), 2.5)}, kFloat64, "full");
    } else if (which == 1) {
      const int64_t n = size();
      Tensor t = eye(n, {.dtype = kFloat64, .device = dev});
      Host want{{n, n}, std::vector<double>(static_cast<size_t>(n * n), 0.0)};
      for (int64_t i = 0; i < n; ++i) want.v[static_cast<size_t>(i * n + i)] = 1;
      expect_close(t, want, kFloat64, "eye");
    } else if (which == 2) {
      const double end = static_cast<double>(size()), step = chance(0.1) ? 1e-300 : 1.0;
      Tensor t = arange(0.0, end, step, {.dtype = kFloat64, .device = dev});
      const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(end));
      Host want{{n}, {}};
      for (int64_t i = 0; i < n; ++i) want.v.push_back(static_cast<double>(i));
      expect_close(t, want, kFloat64, "arange");
    } else if (which == 3) {
      Tensor idx = randint(0, 3, shape(2)).to(dev);
      const int64_t c = chance(0.1) ? size() : 3;
      Tensor t = one_hot(idx, c, kFloat64);
      const Host hi = host_of(idx);
      Shape os = idx.shape();
      os.push_back(c);
      Host want{os, std::vector<double>(static_cast<size_t>(numel_of(os)), 0.0)};
      for (size_t i = 0; i < hi.v.size(); ++i) want.v[i * static_cast<size_t>(c) + static_cast<size_t>(hi.v[i])] = 1;
      expect_close(t, want, kFloat64, "one_hot");
    } else {
      Tensor t = zeros(s, {.dtype = kFloat32, .device = dev});
      expect_close(t, Host{s, std::vector<double>(static_cast<size_t>(numel_of(s)), 0.0)}, kFloat32, "zeros");
    }
  }

  void softmax_op(Device dev) {
    Tensor x = input(shape(), kFloat64, dev);
    const int64_t d = dim_arg(x.dim());
    Tensor y = softmax(x, d);
    const Host h = host_of(x);
    const int wd = wrap_dim(d, x.dim(), "fuzz");
    if (x.dim() == 0) {
      expect_close(y, Host{{}, {1.0}}, kFloat64, "softmax of a 0-d tensor");
      return;
    }
    Host want{x.shape(), h.v};
    if (x.numel() == 0) return expect_close(y, want, kFloat64, "softmax of an empty tensor");
    Shape red = x.shape();
    red[wd] = 1;
    std::vector<double> mx(static_cast<size_t>(numel_of(red)), -INFINITY), sum(mx.size(), 0.0);
    auto key = [&](int64_t i) {
      Dims idx = unravel(i, x.shape());
      idx[wd] = 0;
      return static_cast<size_t>(ravel(idx, red));
    };
    for (int64_t i = 0; i < x.numel(); ++i) mx[key(i)] = std::max(mx[key(i)], h.v[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < x.numel(); ++i) sum[key(i)] += std::exp(h.v[static_cast<size_t>(i)] - mx[key(i)]);
    for (int64_t i = 0; i < x.numel(); ++i)
      want.v[static_cast<size_t>(i)] = std::exp(h.v[static_cast<size_t>(i)] - mx[key(i)]) / sum[key(i)];
    expect_close(y, want, kFloat64, "softmax");
  }

  void convert(Device dev, DType dt) {
    Tensor x = input(shape(), dt, dev);
    const DType to = pick<DType>({kFloat32, kFloat64, kInt64});
    Tensor y = x.to(to);
    Host want = host_of(x);
    if (to == kInt64)
      for (double& v : want.v) v = std::trunc(v);
    if (to == kFloat32)
      for (double& v : want.v) v = static_cast<float>(v);
    expect_close(y, want, to == kFloat32 ? kFloat32 : kFloat64, "to(dtype)");
    if (dev.is_cuda()) expect_close(x.cpu().to(to), want, kFloat32, "to(dtype) on the device vs the CPU");
  }
};

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

}  // namespace

TEST_CASE("fuzz: random op sequences either throw asc::Error or return results a float64 recomputation confirms") {
  const uint64_t seed = static_cast<uint64_t>(env_or("ASC_FUZZ_SEED", 20261123));
  const double seconds = env_or("ASC_FUZZ_SECONDS", 2.0);
  Fuzzer f(seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t steps = static_cast<int64_t>(env_or("ASC_FUZZ_FIRST_STEP", 0));  // to replay one failing step
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    // Each step's own generator state comes from (seed, step), so one failing step reproduces on its own.
    f.rng.seed(seed * 1000003 + static_cast<uint64_t>(steps));
    manual_seed(seed + static_cast<uint64_t>(steps));
    try {
      f.step();
    } catch (...) {  // anything but asc::Error (which step() absorbs) escapes: name the seed, then rethrow
      MESSAGE("reproduce with ASC_FUZZ_SEED=" << seed << " ASC_FUZZ_FIRST_STEP=" << steps << " (a '"
                                              << std::string(f.last) << "' step)");
      throw;
    }
    ++steps;
  }
  MESSAGE("fuzz: seed " << seed << ", " << steps << " steps in " << seconds << " s (" << f.checked
                        << " results checked, " << f.refused << " refused with asc::Error) on " << f.devices.size()
                        << " device(s)");
  for (const auto& [family, counts] : f.by_family) {
    MESSAGE(family << ": " << counts.first << " checked, " << counts.second << " refused");
    CHECK(counts.first > 0);  // every family produced results, not only refusals
  }
  CHECK(f.refused > 0);
}

// ---- SparsePattern construction and sparse attention ----------------------------------------------------------------
// Hostile sizes and index lists for SparsePattern::from_rows and the pattern builders (0, 1, small, negative, near
// the 64-bit limits), then sparse_attention over a random accepted pattern with random shapes, padding, dtype and
// device: every call throws asc::Error or matches the composed float64 reference (sparse_attention_reference).
namespace {

struct SparseFuzzer {
  std::mt19937_64 rng;
  std::vector<Device> devices{Device::cpu()};
  int64_t checked = 0, refused = 0;

  explicit SparseFuzzer(uint64_t seed) : rng(seed) {
    if (cuda::is_available()) devices.push_back(Device::cuda());
  }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng); }
  int64_t arg() {  // an integer argument: mostly small, sometimes hostile
    if (chance(0.15))
      return std::vector<int64_t>{-1,
                                  0,
                                  int64_t{1} << 31,
                                  int64_t{1} << 40,
                                  int64_t{1} << 62,
                                  std::numeric_limits<int64_t>::max(),
                                  std::numeric_limits<int64_t>::min()}[static_cast<size_t>(uniform(0, 6))];
    return uniform(0, 9);
  }

  SparsePattern pattern(int64_t T) {
    const bool causal = chance(0.5);
    switch (uniform(0, 6)) {
      case 0: return local_window_pattern(T, arg(), causal);
      case 1: return strided_pattern(T, arg(), causal);
      case 2: return global_tokens_pattern(T, arg(), causal);
      case 3: return random_keys_pattern(T, arg(), static_cast<uint64_t>(rng()), causal);
      case 4: return hierarchical_pattern(T, arg(), causal);
      case 5:
        return pattern_union({local_window_pattern(T, uniform(1, 4), causal), global_tokens_pattern(T, arg(), causal)});
      default: {  // from_rows with random (sometimes hostile) lists
        const int64_t groups = chance(0.9) ? 1 : arg(), queries = chance(0.9) ? T : arg(),
                      keys = chance(0.9) ? T : arg();
        const int64_t n =
            groups >= 0 && queries >= 0 && groups <= 64 && queries <= 64 ? groups * queries : uniform(0, 4);
        std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n));
        for (auto& r : rows)
          for (int64_t x = uniform(0, 4); x > 0; --x) {
            const int64_t a = arg();  // hostile: an edge value shifted down (INT64_MIN itself stays as it is)
            r.push_back(chance(0.05) ? (a > std::numeric_limits<int64_t>::min() + 3 ? a - 3 : a)
                                     : uniform(0, std::max<int64_t>(T, 1) - 1));
          }
        return SparsePattern::from_rows(groups, queries, keys, std::move(rows));
      }
    }
  }

  void step() {
    try {
      const Device dev = devices[static_cast<size_t>(uniform(0, static_cast<int64_t>(devices.size()) - 1))];
      const int64_t T = chance(0.05) ? arg() : uniform(1, 19);
      const SparsePattern p = pattern(T);
      // An accepted pattern is valid: sizes positive, every row's keys ascending in [0, keys).
      REQUIRE(p.defined());
      REQUIRE((p.groups() >= 1 && p.queries() >= 1 && p.keys() >= 1));
      if (p.queries() > 64 || p.groups() != 1) {
        ++checked;
        return;
      }
      for (int64_t i = 0; i < p.queries(); ++i) {
        const auto row = p.row(0, i);
        for (size_t x = 0; x < row.size(); ++x)
          REQUIRE((row[x] >= 0 && row[x] < p.keys() && (x == 0 || row[x] > row[x - 1])));
      }
      // D: small, or hostile without 2^31 (which this machine could allocate and fill for real).
      const int64_t D =
          chance(0.05) ? std::vector<int64_t>{-1, 0, int64_t{1} << 40, int64_t{1} << 62,
                                              std::numeric_limits<int64_t>::max()}[static_cast<size_t>(uniform(0, 4))]
                       : uniform(1, 6);
      const int64_t B = uniform(1, 2), H = uniform(1, 2);
      const DType dt = chance(0.5) ? kFloat64 : kFloat32;
      Tensor q = randn({B, H, p.queries(), std::max<int64_t>(D, 0)}, {.dtype = kFloat64});
      Tensor k = randn({B, H, p.keys(), std::max<int64_t>(D, 0)}, {.dtype = kFloat64});
      Tensor v = randn({B, H, p.keys(), std::max<int64_t>(D, 0)}, {.dtype = kFloat64});
      Tensor keep;
      if (chance(0.5)) keep = randint(0, 2, {B, p.keys()}).to(chance(0.95) ? kBool : kFloat32);
      const Tensor want =
          sparse_attention_reference(q, k, v, p, keep.defined() && keep.dtype() == kBool ? keep : Tensor());
      const Tensor got = sparse_attention(q.to(dt).to(dev), k.to(dt).to(dev), v.to(dt).to(dev), p,
                                          keep.defined() ? keep.to(dev) : keep);
      const auto g = got.to(kFloat64).cpu().to_vector<double>(), w = want.to_vector<double>();
      REQUIRE(g.size() == w.size());
      const double tol = dt == kFloat64 ? 1e-9 : 1e-4;
      for (size_t x = 0; x < g.size(); ++x)
        if (!(std::isnan(g[x]) && std::isnan(w[x])) && !(std::abs(g[x] - w[x]) <= tol * (1 + std::abs(w[x]))))
          FAIL("sparse_attention: element " << x << " is " << g[x] << ", the reference " << w[x]);
      ++checked;
    } catch (const Error&) {
      ++refused;
    }
  }
};

}  // namespace

TEST_CASE("fuzz: SparsePattern construction and sparse_attention either throw asc::Error or match the reference") {
  const uint64_t seed = static_cast<uint64_t>(env_or("ASC_FUZZ_SEED", 20261123));
  const double seconds = env_or("ASC_FUZZ_SECONDS", 2.0) / 2;
  SparseFuzzer f(seed);
  const auto start = std::chrono::steady_clock::now();
  int64_t steps = static_cast<int64_t>(env_or("ASC_FUZZ_FIRST_STEP", 0));
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    f.rng.seed(seed * 1000033 + static_cast<uint64_t>(steps));
    manual_seed(seed + static_cast<uint64_t>(steps));
    try {
      f.step();
    } catch (...) {
      MESSAGE("reproduce with ASC_FUZZ_SEED=" << seed << " ASC_FUZZ_FIRST_STEP=" << steps << " (a sparse step)");
      throw;
    }
    ++steps;
  }
  MESSAGE("sparse fuzz: " << steps << " steps, " << f.checked << " checked, " << f.refused << " refused");
  CHECK(f.checked > 0);
  CHECK(f.refused > 0);
}

// ---- the op table's entries on hostile values -----------------------------------------------------------------------
// Every entry of the op table (tests/op_table.h) on its sample inputs with random elements replaced by NaN, ±inf, ±0,
// huge and subnormal values, through a random view and dtype (and device, where there is one): it either throws
// asc::Error or returns outputs; an entry with a float64 reference returns what the reference
// gives on the same values (NaN where it gives NaN, the same infinities) — NaN in, NaN out.

TEST_CASE("fuzz: op-table entries on NaN, inf, signed zeros, huge and subnormal values") {
  const uint64_t seed = static_cast<uint64_t>(env_or("ASC_FUZZ_SEED", 20261129));
  const double seconds = env_or("ASC_FUZZ_SECONDS", 2.0) / 4;
  std::mt19937_64 rng(seed);
  std::vector<Device> devices = {Device::cpu()};
  if (cuda::is_available()) devices.push_back(Device::cuda(0));
  std::vector<std::pair<std::string, const optable::OpCase*>> cases;
  for (const optable::Family& f : optable::op_table())
    for (const optable::OpCase& c : f.cases)
      if (f.name != "random" && f.name != "optimizers") cases.push_back({f.name, &c});
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e300, -1e300, 4e-320, 1e-30};
  const auto start = std::chrono::steady_clock::now();
  int64_t steps = 0, refused = 0, compared = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds ||
         steps < static_cast<int64_t>(cases.size())) {
    // every entry at least once, then random ones
    const auto& [family, c] = cases[steps < static_cast<int64_t>(cases.size()) ? steps : rng() % cases.size()];
    const DType dt = rng() % 2 ? kFloat32 : kFloat64;
    const optable::View view = c->views[rng() % c->views.size()];
    const Device dev = devices[rng() % devices.size()];
    CAPTURE(family);
    CAPTURE(c->op);
    CAPTURE(dtype_name(dt));
    CAPTURE(steps);
    Generator gen(seed + static_cast<uint64_t>(steps));
    TensorList in;
    for (const optable::In& i : c->inputs) {
      Tensor leaf = optable::make_leaf(i, view, dt, gen);
      if (optable::is_float_input(i) && leaf.numel() > 0) {
        std::vector<double> v = leaf.to(kFloat64).contiguous().to_vector<double>();
        for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
          v[rng() % v.size()] = specials[rng() % std::size(specials)];
        leaf = tensor(std::span<const double>(v), leaf.shape(), {.dtype = kFloat64}).to(dt);
      }
      in.push_back(optable::view_of(leaf.to(dev), i, view));
    }
    ++steps;
    TensorList out;
    try {
      out = c->fn(in);
    } catch (const Error&) {
      // A refusal is a valid answer (rule B refuses a layer whose weights its clip range does not hold); anything
      // else escapes and fails the test with the capture above.
      ++refused;
      continue;
    }
    if (!c->reference) continue;
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(Device::cpu()).to(kFloat64) : t.cpu());
    const TensorList ref = c->reference(in64);
    REQUIRE(out.size() == ref.size());
    for (size_t k = 0; k < out.size(); ++k) {
      const std::vector<double> o = out[k].to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      const std::vector<double> r = ref[k].to_vector<double>();
      REQUIRE(o.size() == r.size());
      for (size_t e = 0; e < o.size(); ++e) {
        // float32 turns the reference's huge values into infinities and its subnormals into zeros: compare where
        // the reference is representable in the dtype (or NaN)
        if (dt == kFloat32 && std::isfinite(r[e]) && (std::abs(r[e]) > 3e38 || (r[e] != 0 && std::abs(r[e]) < 1e-37)))
          continue;
        CAPTURE(e);
        if (std::isnan(r[e]))
          CHECK(std::isnan(o[e]));
        else if (std::isinf(r[e]))
          CHECK(o[e] == r[e]);
        else
          CHECK(std::abs(o[e] - r[e]) <= 1e-5 * (1 + std::abs(r[e])));
      }
    }
    ++compared;
  }
  MESSAGE("fuzz (op table): " << steps << " steps, " << compared << " compared with a reference, " << refused
                              << " refused with asc::Error");
  CHECK(compared > 0);
}
