// Tensor core: storage sharing, views, creation ops, the generator, dtype promotion, printing, errors.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "testing.h"

using namespace asc;
using namespace asc::testing;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  auto a = philox4x32(0, 0, 0);
  CHECK(a == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  auto b = philox4x32(~0ull, ~0ull, ~0ull);
  CHECK(b == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  auto c = philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull);
  CHECK(c == std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("rand float32 is the Philox stream word for word: long tensors, odd offsets, a counter's low word wrapping") {
  // The CPU kernel computes 8 blocks at a time (with AVX2 where the CPU has it) in chunks split across threads;
  // element i must be uint_to_unit_float(word i % 4 of philox4x32(seed, offset + i / 4)), whatever the split.
  for (const uint64_t offset : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 32) - 5, ~uint64_t{0} - 40}) {
    for (const int64_t n : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{1025}, int64_t{70001}}) {
      CAPTURE(offset);
      CAPTURE(n);
      Generator g(0x1234567890abcdefull);
      g.set_offset(offset);
      const std::vector<float> u = rand({n}, {}, &g).to_vector<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto r = philox4x32(0x1234567890abcdefull, offset + static_cast<uint64_t>(i / 4));
        wrong += u[i] != uint_to_unit_float(r[i % 4]);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("generator: reproducible, advancing, independent of how the draw is split") {
  Generator g1(42), g2(42);
  auto x = rand({1000}, {}, &g1).to_vector<float>();
  auto y = rand({1000}, {}, &g2).to_vector<float>();
  CHECK(x == y);
  auto z = rand({1000}, {}, &g1).to_vector<float>();
  CHECK(x != z);
  // element i depends only on (seed, offset, i): a draw of 8 equals the first 8 of a draw of 1000
  Generator g3(42);
  auto w = rand({8}, {}, &g3).to_vector<float>();
  CHECK(std::equal(w.begin(), w.end(), x.begin()));
  double mean = 0, m2 = 0;
  for (float v : x) {
    CHECK(v >= 0.0f);
    CHECK(v < 1.0f);
    mean += v;
  }
  mean /= 1000;
  CHECK(std::abs(mean - 0.5) < 0.05);
  Generator g4(7);
  auto n = randn({20000}, {.dtype = kFloat64}, &g4).to_vector<double>();
  mean = 0;
  for (double v : n) mean += v;
  mean /= n.size();
  for (double v : n) m2 += (v - mean) * (v - mean);
  CHECK(std::abs(mean) < 0.03);
  CHECK(std::abs(m2 / n.size() - 1.0) < 0.05);
  auto r = randint(3, 9, {5000}, {.dtype = kInt64}, &g4).to_vector<int64_t>();
  int counts[6] = {};
  for (auto v : r) {
    REQUIRE(v >= 3);
    REQUIRE(v < 9);
    counts[v - 3]++;
  }
  for (int c : counts) CHECK(c > 700);
  manual_seed(5);
  auto d1 = randn({4}).to_vector<float>();
  manual_seed(5);
  CHECK(randn({4}).to_vector<float>() == d1);
}

TEST_CASE("creation ops") {
  check_close(zeros({2, 2}), {0, 0, 0, 0});
  check_close(ones({3}), {1, 1, 1});
  check_close(full({2}, 2.5), {2.5, 2.5});
  check_close(arange(5), {0, 1, 2, 3, 4});
  CHECK(arange(5).dtype() == kInt64);
  check_close(arange(1.0, 2.0, 0.25, {.dtype = kFloat64}), {1, 1.25, 1.5, 1.75});
  check_close(eye(3), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor t = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = kFloat64});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == kFloat64);
  CHECK(tensor(std::vector<int64_t>{4, 5}, {2}).to_vector<int64_t>() == std::vector<int64_t>{4, 5});
  CHECK(scalar_tensor(3.0).dim() == 0);
  CHECK(scalar_tensor(3.0).item<double>() == 3.0);
  CHECK(zeros({0, 3}).numel() == 0);
  check_error([] { tensor({1, 2, 3}, {2, 2}); }, {"tensor", "3 values", "[2, 2]"});
  check_error([] { zeros({2, -1}); }, {"negative dimension"});
  check_error([] { arange(0.0, 1.0, 0.0); }, {"arange"});
  check_error([] { randint(5, 5, {2}); }, {"randint", "empty range"});
  check_error([] { rand({2}, {.dtype = kInt64}); }, {"rand", "int64"});
}

TEST_CASE("views share storage and follow strides") {
  Tensor x = arange(0.0, 24.0, 1.0, {.dtype = kFloat64}).reshape({2, 3, 4});
  CHECK(x.is_contiguous());
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(!p.is_contiguous());
  CHECK(p.shares_storage(x));
  // naive check of permute
  auto pv = p.to_vector<double>();
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c) CHECK(pv[(a * 2 + b) * 3 + c] == b * 12 + c * 4 + a);
  Tensor tr = x.transpose(0, 2);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.contiguous().is_contiguous());
  CHECK(tr.contiguous().to_vector<double>()[1] == 12);
  Tensor s = x.slice(2, 1, 4, 2);  // columns 1, 3
  CHECK(s.shape() == Shape{2, 3, 2});
  check_close(s.select(0, 1).select(0, 2), {21, 23});
  Tensor n = x.narrow(1, 1, 2);
  CHECK(n.shape() == Shape{2, 2, 4});
  CHECK(n.to_vector<double>()[0] == 4);
  CHECK(x.unsqueeze(1).shape() == Shape{2, 1, 3, 4});
  CHECK(x.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  CHECK(x.unsqueeze(1).squeeze().shape() == Shape{2, 3, 4});
  CHECK(x.reshape({6, -1}).shape() == Shape{6, 4});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  Tensor e = tensor({1, 2, 3}, {3, 1}).expand({3, 4});
  CHECK(e.stride(1) == 0);
  check_close(e, {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  // reshape of a non-viewable layout copies; view refuses
  Tensor tt = x.transpose(1, 2);
  CHECK(tt.reshape({2, 12}).to_vector<double>()[1] == 4);
  check_error([&] { tt.view({2, 12}); }, {"view", "reshape"});
  // writes through a view are visible in the base
  Tensor base = zeros({2, 3});
  base.select(1, 1).fill_(7);
  check_close(base, {0, 7, 0, 0, 7, 0});
  check_error([&] { x.reshape({5, 5}); }, {"reshape", "[5, 5]", "24"});
  check_error([&] { x.permute({0, 0, 1}); }, {"permute", "repeated"});
  check_error([&] { x.narrow(1, 2, 2); }, {"narrow", "out of bounds"});
  check_error([&] { x.select(0, 2); }, {"select", "index 2"});
  check_error([&] { x.transpose(0, 3); }, {"transpose", "dimension 3 out of range"});
  check_error([&] { tensor({1, 2}, {2}).expand({3}); }, {"expand"});
}

TEST_CASE("dtype conversion and promotion") {
  Tensor i = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  Tensor f = tensor({0.5, 0.5, 0.5}, {3});
  Tensor s = i + f;
  CHECK(s.dtype() == kFloat32);
  check_close(s, {1.5, 2.5, 3.5});
  Tensor d = f.to(kFloat64) * i;
  CHECK(d.dtype() == kFloat64);
  CHECK((i + i).dtype() == kInt64);
  Tensor b = gt(f, 0.0);
  CHECK(b.dtype() == kBool);
  CHECK(sum(b).item<int64_t>() == 3);
  check_close(tensor({1.7, -1.7}, {2}).to(kInt64), {1, -1});
}

TEST_CASE("CPU casts to and from bfloat16 / float16: round to nearest even, NaN / inf / overflow as IEEE") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // bfloat16: 8 significant bits. 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even, 1. 1 + 3 * 2^-8 is a tie
  // between 1 + 2^-7 (odd) and 1 + 2^-6 (even): 1 + 2^-6. 3.4e38 rounds past the largest finite to inf.
  {
    Tensor x = tensor({1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, -2.5, 1e-40, 3.4e38, inf, -inf, nan}, {8}).to(kFloat64);
    const std::vector<double> got = x.to(kBFloat16).to(kFloat64).to_vector<double>();
    const std::vector<double> want = {1.0, 1.0 + 0x1p-6, -2.5, 0x1p-133, inf, inf, -inf};  // 1e-40: a subnormal
    for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == want[i]);
    CHECK(std::isnan(got[7]));
  }
  // float16: 11 significant bits, largest finite 65504; 65520 is the tie to the next (unrepresentable) step: inf.
  {
    Tensor x = tensor({1.0 + 0x1p-11, 65504.0, 65520.0, 0x1p-24, -0.0, nan}, {6}).to(kFloat64);
    const std::vector<double> got = x.to(kFloat16).to(kFloat64).to_vector<double>();
    CHECK(got[0] == 1.0);
    CHECK(got[1] == 65504.0);
    CHECK(got[2] == inf);
    CHECK(got[3] == 0x1p-24);  // the smallest subnormal
    CHECK((got[4] == 0.0 && std::signbit(got[4])));
    CHECK(std::isnan(got[5]));
  }
  // From float64, one rounding, as CUDA's __double2bfloat16 / __double2half: 1 + 2^-8 + 2^-30 is above the bfloat16
  // tie 1 + 2^-8, so it rounds up to 1 + 2^-7 (through a float32 rounded to nearest it would become the tie, then 1);
  // the same for float16 at 1 + 2^-11 + 2^-40. Just below the ties they round down; exact ties go to even.
  {
    Tensor x = tensor(std::vector<double>{1.0 + 0x1p-8 + 0x1p-30, 1.0 + 0x1p-8 - 0x1p-30, -(1.0 + 0x1p-8 + 0x1p-40)},
                      {3}, {.dtype = kFloat64});
    CHECK(x.to(kBFloat16).to(kFloat64).to_vector<double>() == std::vector<double>{1.0 + 0x1p-7, 1.0, -(1.0 + 0x1p-7)});
    Tensor y = tensor(std::vector<double>{1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-11 - 0x1p-40, 1.0 + 3 * 0x1p-11}, {3},
                      {.dtype = kFloat64});
    CHECK(y.to(kFloat16).to(kFloat64).to_vector<double>() == std::vector<double>{1.0 + 0x1p-10, 1.0, 1.0 + 0x1p-9});
    CHECK(tensor(std::vector<int64_t>{2049, 2051}, {2}).to(kFloat16).to(kFloat64).to_vector<double>() ==
          std::vector<double>{2048.0, 2052.0});  // ties to even at integer spacing 2
  }
  // Between the reduced types, from and to int64 / bool, and through strided views.
  Tensor h = tensor({0.5, -3.0, 0.0, 7.0}, {2, 2}).to(kFloat16);
  check_close(h.to(kBFloat16).transpose(0, 1).to(kFloat32), {0.5, 0.0, -3.0, 7.0});
  CHECK(h.to(kInt64).to_vector<int64_t>() == std::vector<int64_t>{0, -3, 0, 7});
  CHECK(h.to(kBool).to_vector<bool>() == std::vector<bool>{true, true, false, true});
}

TEST_CASE("to_vector and item read every floating dtype, bfloat16 and float16 too, on each device; values exact") {
  // Values each reduced format holds exactly; a transposed view so the read goes through contiguous().
  const std::vector<double> v = {0.5, -1.25, 3.0, 1024.0, -0.0078125, 7.5};
  std::vector<std::pair<DType, Device>> cases;
  for (DType dt : {kBFloat16, kFloat16, kFloat32, kFloat64}) {
    cases.push_back({dt, Device::cpu()});
    if (cuda::is_available()) cases.push_back({dt, Device::cuda()});
  }
  for (auto [dt, dev] : cases) {
    CAPTURE(dt);
    CAPTURE(dev);
    Tensor t = tensor(v, {2, 3}).to(dev).to(dt).transpose(0, 1);  // (3, 2): column-major order of v
    const std::vector<double> got = t.to_vector<double>();
    const std::vector<double> want = {v[0], v[3], v[1], v[4], v[2], v[5]};
    CHECK(got == want);
    CHECK(t.to_vector<float>()[1] == 1024.0f);
    CHECK(t.to_vector<int64_t>()[2] == -1);  // -1.25 truncated, as static_cast does
    CHECK(t.select(0, 2).select(0, 1).item<double>() == 7.5);
  }
}

TEST_CASE("in-place ops bump the version and are refused on tensors that require grad") {
  Tensor x = zeros({3});
  uint64_t v0 = x.impl()->storage->version();
  x.add_(ones({3}));
  CHECK(x.impl()->storage->version() == v0 + 1);
  x.mul_(3.0);
  check_close(x, {3, 3, 3});
  x.copy_(tensor({1, 2, 3}, {3}));
  check_close(x, {1, 2, 3});
  Tensor w = ones({2}, {.requires_grad = true});
  check_error([&] { w.add_(ones({2})); }, {"add_", "requires grad"});
  {
    NoGradGuard ng;
    w.add_(ones({2}));  // parameter updates are allowed without grad mode
  }
  check_close(w, {2, 2});
  check_error([&] { x.copy_(ones({4})); }, {"copy_", "[4]", "[3]"});
  // overlapping copy reads the source before writing
  Tensor r = arange(0.0, 4.0, 1.0, {.dtype = kFloat64});
  r.slice(0, 1, 4).copy_(r.slice(0, 0, 3));
  check_close(r, {0, 0, 1, 2});
}

TEST_CASE("formatting") {
  Tensor x = tensor({1, 2, 3, 4}, {2, 2});
  std::string s = fmt::format("{}", x);
  CHECK(s.find("[[1.0000, 2.0000]") != std::string::npos);
  CHECK(s.find("shape=[2, 2]") != std::string::npos);
  CHECK(fmt::format("{}", Shape{2, 3}) == "[2, 3]");
  CHECK(fmt::format("{}", kBFloat16) == "bfloat16");
  CHECK(fmt::format("{}", Device::cuda(1)) == "cuda:1");
  CHECK(fmt::format("{}", Tensor()) == "tensor(undefined)");
  Tensor big = arange(100);
  CHECK(fmt::format("{}", big).find("...") != std::string::npos);
}

TEST_CASE("device errors are clear when no CUDA device exists") {
  if (cuda::is_available()) return;  // covered by the CUDA parity suite on GPU machines
  check_error([] { zeros({2}, {.device = Device::cuda()}); }, {"cuda:0", "no CUDA device"});
  check_error([] { ones({2}).to(Device::cuda()); }, {"cuda:0"});
}

TEST_CASE("shape errors name the op and the shapes") {
  check_error([] { tensor({1, 2, 3}, {3}) + tensor({1, 2}, {2}); }, {"add", "[3]", "[2]", "broadcastable"});
  check_error(
      [] {
        Dims d;
        for (int i = 0; i < 9; ++i) d.push_back(1);
      },
      {"at most 8"});
  check_error([] { ones({2}).item<float>(); }, {"item", "[2]"});
}

// The CPU allocator's cache of blocks above 4 KiB (core/storage.cpp): a freed block serves the next request of its
// size class whatever was allocated in between, so a training loop's outputs land on memory already mapped.
TEST_CASE("cpu allocator: blocks above 4 KiB are aligned, whole, reused after free, and released on request") {
  Allocator* a = allocator_for(Device::cpu());
  {  // the live-bytes counter: blocks above 4 KiB counted, freed ones taken off, small ones never (every build)
    const size_t before = cpu_memory_stats().allocated;
    std::vector<std::pair<void*, size_t>> blocks;
    for (size_t n : {size_t{8}, size_t{4096}, size_t{4097}, size_t{100}, size_t{1} << 20})
      blocks.emplace_back(a->allocate(n, Device::cpu()), n);
    CHECK(cpu_memory_stats().allocated == before + 4160 + (size_t{1} << 20));
    for (auto [p, n] : blocks) a->deallocate(p, n);
    CHECK(cpu_memory_stats().allocated == before);
  }
  // Every size round a class boundary: 64-byte aligned, and all of the asked bytes writable and kept.
  for (size_t n : {size_t{4097}, size_t{8191}, size_t{65536}, size_t{65537}, size_t{81921}, size_t{98305},
                   size_t{(1 << 20) + 3}, size_t{(5 << 20) / 2}, size_t{(3 << 21) + 1}}) {
    auto* p = static_cast<unsigned char*>(a->allocate(n, Device::cpu()));
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 7 + n);
    bool same = true;
    for (size_t i = 0; i < n; ++i) same &= p[i] == static_cast<unsigned char>(i * 7 + n);
    CHECK(same);
    a->deallocate(p, n);
  }
#if !defined(ASC_SANITIZE_BUILD)  // sanitizer builds use malloc directly, so that use-after-free is caught
  empty_cpu_cache();
  CHECK(cpu_memory_stats().cached == 0);
  const size_t live = cpu_memory_stats().allocated;
  void* first = nullptr;
  {
    Tensor t = zeros({1024, 1024});  // 4 MiB
    first = t.data_ptr<float>();
    CHECK(cpu_memory_stats().allocated == live + (size_t{4} << 20));
  }
  CHECK(cpu_memory_stats().allocated == live);
  const size_t cached = cpu_memory_stats().cached;
  CHECK(cached >= (size_t{4} << 20));
  // Small long-lived allocations in between (glibc's heap would carve them out of the freed block) ...
  std::vector<std::unique_ptr<std::string>> small;
  for (int i = 0; i < 200; ++i) small.push_back(std::make_unique<std::string>(100, 'x'));
  {
    // ... and a request of the same class (a little smaller) still gets the block back, its contents untouched.
    Tensor t = empty({1000, 1040});
    CHECK(static_cast<void*>(t.data_ptr<float>()) == first);
    CHECK(cpu_memory_stats().cached == cached - (size_t{4} << 20));  // 4 MiB is a class of its own
  }
  // A block larger than the cache may ever hold goes back to the system without flushing the others (its pages
  // are never touched here: only address space).
  const size_t cached_now = cpu_memory_stats().cached;
  const size_t huge = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE)) / 8 +
                      (size_t{1} << 20);
  a->deallocate(a->allocate(huge, Device::cpu()), huge);
  CHECK(cpu_memory_stats().cached == cached_now);
  empty_cpu_cache();
  CHECK(cpu_memory_stats().cached == 0);
  CHECK(cpu_memory_stats().allocated == live);
#endif
}

TEST_CASE("cpu allocator: threads allocating and freeing blocks of many sizes at once each keep their own bytes") {
  Allocator* a = allocator_for(Device::cpu());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t s = 12345 + t;
      std::vector<std::pair<unsigned char*, size_t>> held;
      for (int i = 0; i < 400; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const size_t n = 4097 + (s >> 33) % (size_t{3} << 20);
        auto* p = static_cast<unsigned char*>(a->allocate(n, Device::cpu()));
        p[0] = static_cast<unsigned char>(t), p[n / 2] = static_cast<unsigned char>(t),
        p[n - 1] = static_cast<unsigned char>(t);
        held.emplace_back(p, n);
        if (held.size() > 6) {  // free the oldest after checking nobody else wrote into it
          auto [q, m] = held.front();
          if (q[0] != t || q[m / 2] != t || q[m - 1] != t) ++bad;
          a->deallocate(q, m);
          held.erase(held.begin());
        }
      }
      for (auto [q, m] : held) {
        if (q[0] != t || q[m / 2] != t || q[m - 1] != t) ++bad;
        a->deallocate(q, m);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
}

#if !defined(ASC_SANITIZE_BUILD)
TEST_CASE("cpu allocator: a child forked while another thread allocates can allocate (the cache's lock is free)") {
  Allocator* a = allocator_for(Device::cpu());
  std::atomic<bool> stop{false};
  std::thread busy([&] {  // holds the cache's lock as often as it can
    while (!stop.load()) a->deallocate(a->allocate(size_t{1} << 20, Device::cpu()), size_t{1} << 20);
  });
  bool all_ok = true;
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      Tensor t = full({512, 512}, 2.0);  // 1 MiB: the cache's class the other thread was using
      _exit(sum(t).item<double>() == 2.0 * 512 * 512 ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    all_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  stop = true;
  busy.join();
  CHECK(all_ok);
}
#endif
