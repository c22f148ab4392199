// sparse_attention (ops/sparse_attention.h): the pattern builders, validation, the kernels (ops/kernel_list.inc:
// sparse_attention_*), one graph node; and the composed reference.
#include "ops/sparse_attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <numeric>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "core/generator.h"
#include "ops/attention.h"
#include "ops/checks.h"
#include "ops/cpu/clustered_rows.h"
#include "ops/cpu/compact.h"
#include "ops/cpu/hierarchical_keys.h"
#include "ops/cpu/loops.h"  // parallel_for: the builders are host work
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/flops.h"
#include "ops/index.h"
#include "ops/kernels.h"
#include "ops/linalg.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"

namespace asc {

namespace {
constexpr const char* kOp = "sparse_attention";

// A sequence length the builders accept (the per-row lists of 2^30 queries would not fit in memory anyway).
void check_length(const char* who, int64_t T) {
  ASC_CHECK(T >= 1 && T < (int64_t{1} << 30), "{}: the sequence length must be in [1, 2^30), got {}", who, T);
}
}  // namespace

// ---- the CSR pattern ---------------------------------------------------------------------------------------------

namespace {

// An int64 tensor of n elements on the CPU (asc::Error, not std::bad_alloc, when it cannot be allocated).
Tensor int64_buffer(int64_t n) { return Tensor::empty({n}, {.dtype = kInt64}); }

}  // namespace

SparsePattern SparsePattern::from_rows(int64_t groups, int64_t queries, int64_t keys,
                                       std::vector<std::vector<int64_t>> rows) {
  constexpr const char* who = "SparsePattern";
  ASC_CHECK(groups >= 1 && queries >= 1 && keys >= 1 && keys <= kMaxKeys,
            "{}: needs groups, queries, keys >= 1 (keys <= 2^31 - 1); got {}, {}, {}", who, groups, queries, keys);
  // The sizes of the lists: every product checked before anything is allocated or indexed.
  const int64_t n_rows = checked_mul(groups, queries, who, "groups x queries");
  checked_add(checked_mul(groups, keys, who, "groups x keys"), 1, who, "groups x keys + 1");
  ASC_CHECK(static_cast<int64_t>(rows.size()) == n_rows, "{}: expected {} row lists (groups {} x queries {}), got {}",
            who, n_rows, groups, queries, rows.size());
  int64_t nnz = 0;
  for (auto& r : rows) {
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    if (!r.empty())
      ASC_CHECK(r.front() >= 0 && r.back() < keys, "{}: key index {} outside [0, {})", who,
                r.front() < 0 ? r.front() : r.back(), keys);
    nnz += static_cast<int64_t>(r.size());  // <= the memory the lists already hold: no overflow
  }
  Tensor row_ptr = int64_buffer(n_rows + 1), cols_t = int64_buffer(nnz);
  int64_t* rp = row_ptr.data_ptr<int64_t>();
  int64_t* cols = cols_t.data_ptr<int64_t>();
  int64_t e = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    rp[r] = e;
    std::copy(rows[r].begin(), rows[r].end(), cols + e);
    e += static_cast<int64_t>(rows[r].size());
  }
  rp[rows.size()] = e;
  return from_csr(groups, queries, keys, std::move(row_ptr), std::move(cols_t));
}

SparsePattern SparsePattern::from_csr(int64_t groups, int64_t queries, int64_t keys, Tensor row_ptr, Tensor cols_t) {
  SparsePattern p;
  const int64_t n_rows = groups * queries;  // checked by the callers
  const int64_t* rp = row_ptr.data_ptr<int64_t>();
  p.groups_ = groups, p.queries_ = queries, p.keys_ = keys, p.nnz_ = rp[n_rows];
  for (int64_t r = 0; r < n_rows; ++r) p.max_row_ = std::max(p.max_row_, rp[r + 1] - rp[r]);
  p.row_ptr_ = std::move(row_ptr);
  p.cols_ = std::move(cols_t);
  p.cache_ = std::make_shared<SparsePatternCache>();
  p.transpose_ = std::make_shared<Transpose>();
  return p;
}

const SparsePattern::Transpose& SparsePattern::transposed() const {
  // Made from the CPU lists, by counting sort per group: entries of key column c of group g in query order. A pattern
  // on a device got its transpose from `to`, which makes it on the host first.
  std::call_once(transpose_->once, [this] {
    const int64_t n_cols = groups_ * keys_ + 1;
    const int64_t* rp = row_ptr_.data_ptr<int64_t>();
    const int64_t* cols = cols_.data_ptr<int64_t>();
    Transpose& t = *transpose_;
    t.col_ptr = int64_buffer(n_cols);
    t.col_rows = int64_buffer(nnz_);
    t.col_pos = int64_buffer(nnz_);
    int64_t* cp = t.col_ptr.data_ptr<int64_t>();
    int64_t* crow = t.col_rows.data_ptr<int64_t>();
    int64_t* cpos = t.col_pos.data_ptr<int64_t>();
    std::fill(cp, cp + n_cols, int64_t{0});
    for (int64_t g = 0; g < groups_; ++g)
      for (int64_t x = rp[g * queries_]; x < rp[(g + 1) * queries_]; ++x) ++cp[g * keys_ + cols[x] + 1];
    std::partial_sum(cp, cp + n_cols, cp);
    Tensor fill_t = int64_buffer(n_cols - 1);
    int64_t* fill = fill_t.data_ptr<int64_t>();
    std::copy(cp, cp + n_cols - 1, fill);
    for (int64_t g = 0; g < groups_; ++g)
      for (int64_t i = 0; i < queries_; ++i)
        for (int64_t x = rp[g * queries_ + i]; x < rp[g * queries_ + i + 1]; ++x) {
          const int64_t slot = fill[g * keys_ + cols[x]]++;
          crow[slot] = i;
          cpos[slot] = x;
        }
  });
  return *transpose_;
}

void SparsePattern::check_lists(const char* who, const Tensor& t_ptr, const Tensor& t_rows, const Tensor& t_pos) const {
  // The invariants from_rows establishes, re-checked on a copy (to()): sizes first, then every index, so that a
  // pattern whose storage was damaged is refused instead of read out of bounds.
  ASC_CHECK(groups_ >= 1 && queries_ >= 1 && keys_ >= 1 && keys_ <= kMaxKeys, "{}: invalid pattern sizes {}, {}, {}",
            who, groups_, queries_, keys_);
  const int64_t n_rows = checked_mul(groups_, queries_, who), n_cols = checked_mul(groups_, keys_, who);
  ASC_CHECK(row_ptr_.numel() == n_rows + 1 && t_ptr.numel() == n_cols + 1 && cols_.numel() == nnz_ &&
                t_rows.numel() == nnz_ && t_pos.numel() == nnz_,
            "{}: the pattern's lists do not match its sizes", who);
  const int64_t* rp = row_ptr_.data_ptr<int64_t>();
  const int64_t* cols = cols_.data_ptr<int64_t>();
  const int64_t* cp = t_ptr.data_ptr<int64_t>();
  const int64_t* crow = t_rows.data_ptr<int64_t>();
  const int64_t* cpos = t_pos.data_ptr<int64_t>();
  ASC_CHECK(rp[0] == 0 && rp[n_rows] == nnz_ && cp[0] == 0 && cp[n_cols] == nnz_, "{}: corrupt pattern (list ends)",
            who);
  int64_t longest = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    ASC_CHECK(rp[r] <= rp[r + 1], "{}: corrupt pattern (row {} ends before it starts)", who, r);
    longest = std::max(longest, rp[r + 1] - rp[r]);
    for (int64_t x = rp[r]; x < rp[r + 1]; ++x)
      ASC_CHECK(cols[x] >= 0 && cols[x] < keys_ && (x == rp[r] || cols[x] > cols[x - 1]),
                "{}: corrupt pattern (row {} has key {} outside [0, {}) or out of order)", who, r, cols[x], keys_);
  }
  ASC_CHECK(longest == max_row_, "{}: corrupt pattern (longest row)", who);
  for (int64_t c = 0; c < n_cols; ++c) {
    ASC_CHECK(cp[c] <= cp[c + 1], "{}: corrupt pattern (transpose column {})", who, c);
    for (int64_t y = cp[c]; y < cp[c + 1]; ++y) {
      const int64_t g = c / keys_, i = crow[y], x = cpos[y];
      ASC_CHECK(
          i >= 0 && i < queries_ && x >= rp[g * queries_ + i] && x < rp[g * queries_ + i + 1] && cols[x] == c % keys_,
          "{}: corrupt pattern (transpose entry {})", who, y);
    }
  }
}

std::vector<int64_t> SparsePattern::row(int64_t group, int64_t i) const {
  ASC_CHECK(defined(), "SparsePattern::row: the pattern is empty");
  ASC_CHECK(group >= 0 && group < groups_ && i >= 0 && i < queries_, "SparsePattern::row: ({}, {}) outside ({}, {})",
            group, i, groups_, queries_);
  const SparsePattern c = to(Device::cpu());
  const int64_t* rp = c.row_ptr_.data_ptr<int64_t>();
  const int64_t* cols = c.cols_.data_ptr<int64_t>();
  const int64_t r = group * queries_ + i;
  return std::vector<int64_t>(cols + rp[r], cols + rp[r + 1]);
}

Tensor SparsePattern::dense_mask() const {
  ASC_CHECK(defined(), "SparsePattern::dense_mask: the pattern is empty");
  const SparsePattern c = to(Device::cpu());
  Tensor m = zeros({groups_, queries_, keys_}, {.dtype = kBool});  // checks the product
  bool* mp = m.data_ptr<bool>();
  const int64_t* rp = c.row_ptr_.data_ptr<int64_t>();
  const int64_t* cols = c.cols_.data_ptr<int64_t>();
  for (int64_t r = 0; r < groups_ * queries_; ++r)
    for (int64_t x = rp[r]; x < rp[r + 1]; ++x) mp[r * keys_ + cols[x]] = true;
  return m;
}

namespace {
Tensor copy_of(const Tensor& t) { return t.defined() ? t.clone() : Tensor(); }
}  // namespace

// A pattern without lists answers with its lists derived on the host, moved to its device.
Tensor SparsePattern::row_ptr() const {
  return defined() && !has_lists() ? lists_from_view().row_ptr_.to(device()) : copy_of(row_ptr_);
}
Tensor SparsePattern::cols() const {
  return defined() && !has_lists() ? lists_from_view().cols_.to(device()) : copy_of(cols_);
}
Tensor SparsePattern::col_ptr() const {
  if (defined() && !has_lists()) return lists_from_view().col_ptr().to(device());
  return defined() ? copy_of(transposed().col_ptr) : Tensor();
}
Tensor SparsePattern::col_rows() const {
  if (defined() && !has_lists()) return lists_from_view().col_rows().to(device());
  return defined() ? copy_of(transposed().col_rows) : Tensor();
}
Tensor SparsePattern::col_pos() const {
  if (defined() && !has_lists()) return lists_from_view().col_pos().to(device());
  return defined() ? copy_of(transposed().col_pos) : Tensor();
}
const SparsePattern::DeviceCounts* SparsePattern::device_counts() const {
  if (!counts_) return nullptr;
  std::call_once(counts_->once, [c = counts_.get()] {
    const Tensor host = c->counts.to(Device::cpu());
    const int64_t* v = host.data_ptr<int64_t>();
    c->rblk_used = v[0], c->kblk_used = v[1], c->nnz = v[2], c->max_row = v[3];
  });
  return counts_.get();
}
int64_t SparsePattern::nnz() const { return counts_ ? device_counts()->nnz : nnz_; }
int64_t SparsePattern::max_row() const { return counts_ ? device_counts()->max_row : max_row_; }

namespace {
// The first n entries of a view's list (n >= 0: a view built without a read back may hold more, unwritten).
Tensor used(const Tensor& t, int64_t n) { return t.defined() && n >= 0 ? t.narrow(0, 0, n).clone() : copy_of(t); }
}  // namespace

Tensor SparsePattern::rblk_ptr() const { return copy_of(rblk_ptr_); }
Tensor SparsePattern::rblk_keys() const { return used(rblk_keys_, counts_ ? device_counts()->rblk_used : -1); }
Tensor SparsePattern::rblk_bits() const { return used(rblk_bits_, counts_ ? device_counts()->rblk_used : -1); }
Tensor SparsePattern::kblk_ptr() const { return copy_of(kblk_ptr_); }
Tensor SparsePattern::kblk_rows() const { return used(kblk_rows_, counts_ ? device_counts()->kblk_used : -1); }
Tensor SparsePattern::kblk_bits() const { return used(kblk_bits_, counts_ ? device_counts()->kblk_used : -1); }

SparsePattern::Lists SparsePattern::lists(bool transpose) const {
  ASC_CHECK(defined(), "SparsePattern: the pattern is empty (build it with a *_pattern function)");
  ASC_CHECK(has_lists(),
            "SparsePattern: this pattern holds only its block view on {} (clustered_union built it there); "
            "to(Device::cpu()) derives its lists",
            device());
  Lists l{row_ptr_.data_ptr<int64_t>(), cols_.data_ptr<int64_t>(), nullptr, nullptr, nullptr};
  if (transpose) {
    const Transpose& t = transposed();
    l.col_ptr = t.col_ptr.data_ptr<int64_t>(), l.col_rows = t.col_rows.data_ptr<int64_t>();
    l.col_pos = t.col_pos.data_ptr<int64_t>();
  }
  return l;
}

SparsePattern::BlockView SparsePattern::block_view() const {
  ASC_CHECK(has_block_view(), "SparsePattern: the pattern has no block view (move it with SparsePattern::to)");
  return {rblk_ptr_.data_ptr<int64_t>(), rblk_keys_.data_ptr<int64_t>(), rblk_bits_.data_ptr<int64_t>(),
          kblk_ptr_.data_ptr<int64_t>(), kblk_rows_.data_ptr<int64_t>(), kblk_bits_.data_ptr<int64_t>()};
}

SparsePatternView SparsePattern::view(bool transpose) const {
  // nnz and max_row -1 where only the device knows them (the CUDA kernels read neither; nothing is read back here)
  SparsePatternView v{.groups = groups_,
                      .queries = queries_,
                      .keys = keys_,
                      .nnz = counts_ ? -1 : nnz_,
                      .max_row = counts_ ? -1 : max_row_};
  ASC_CHECK(defined(), "SparsePattern: the pattern is empty (build it with a *_pattern function)");
  if (has_lists()) v.lists = lists(transpose);
  if (has_block_view()) v.blocks = block_view();
  v.cache = cache_.get();
  return v;
}

namespace {

// Groups `lists` (n_lists per group, list x = lists_ptr[x] .. lists_ptr[x + 1] of items < n_items) in blocks of
// `block` lists: per block, the ascending union of their items and per item the bits of the lists holding it.
// O(entries + Σ union · log union) with one scratch word per item.
void block_union(int64_t groups, int64_t n_lists, int64_t n_items, int64_t block, const int64_t* lists_ptr,
                 const int64_t* items, Tensor& out_ptr, Tensor& out_items, Tensor& out_bits) {
  const int64_t nblk = n_lists / block + (n_lists % block != 0);
  std::vector<int64_t> ptr{0}, its, bits, touched;
  Tensor scratch_t = zeros({n_items}, {.dtype = kInt64});  // asc::Error, not bad_alloc, when too large
  int64_t* scratch = scratch_t.data_ptr<int64_t>();
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t m = 0; m < nblk; ++m) {
      touched.clear();
      for (int64_t r = 0; r < block && m * block + r < n_lists; ++r) {
        const int64_t x = g * n_lists + m * block + r;
        for (int64_t e = lists_ptr[x]; e < lists_ptr[x + 1]; ++e) {
          if (scratch[items[e]] == 0) touched.push_back(items[e]);
          scratch[items[e]] |= int64_t{1} << r;
        }
      }
      std::sort(touched.begin(), touched.end());
      for (int64_t j : touched) its.push_back(j), bits.push_back(scratch[j]), scratch[j] = 0;
      ptr.push_back(static_cast<int64_t>(its.size()));
    }
  auto as_tensor = [](const std::vector<int64_t>& v) {
    Tensor t = int64_buffer(static_cast<int64_t>(v.size()));
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t;
  };
  out_ptr = as_tensor(ptr), out_items = as_tensor(its), out_bits = as_tensor(bits);
}

}  // namespace

SparsePattern SparsePattern::from_block_view(int64_t groups, int64_t queries, int64_t keys, int64_t nnz,
                                             int64_t max_row, Tensor rblk_ptr, Tensor rblk_keys, Tensor rblk_bits,
                                             Tensor kblk_ptr, Tensor kblk_rows, Tensor kblk_bits) {
  SparsePattern p;
  p.groups_ = groups, p.queries_ = queries, p.keys_ = keys, p.nnz_ = nnz, p.max_row_ = max_row;
  p.rblk_ptr_ = std::move(rblk_ptr), p.rblk_keys_ = std::move(rblk_keys), p.rblk_bits_ = std::move(rblk_bits);
  p.kblk_ptr_ = std::move(kblk_ptr), p.kblk_rows_ = std::move(kblk_rows), p.kblk_bits_ = std::move(kblk_bits);
  p.cache_ = std::make_shared<SparsePatternCache>();
  p.transpose_ = std::make_shared<Transpose>();
  return p;
}

SparsePattern SparsePattern::lists_from_view() const {
  constexpr const char* who = "SparsePattern (lists from the block view)";
  const Tensor ptr_t = rblk_ptr().to(Device::cpu()), keys_t = rblk_keys().to(Device::cpu());
  const Tensor bits_t = rblk_bits().to(Device::cpu());
  const int64_t nqb = queries_ / kRowBlock + (queries_ % kRowBlock != 0), n_rows = groups_ * queries_;
  const int64_t* ptr = ptr_t.data_ptr<int64_t>();
  const int64_t* keys = keys_t.data_ptr<int64_t>();
  const int64_t* bits = bits_t.data_ptr<int64_t>();
  ASC_CHECK(ptr_t.numel() == groups_ * nqb + 1 && ptr[0] == 0 && ptr[groups_ * nqb] == keys_t.numel() &&
                bits_t.numel() == keys_t.numel(),
            "{}: corrupt block view (list ends)", who);
  for (int64_t x = 0; x < groups_ * nqb; ++x)  // every offset first: no entry is read past the lists
    ASC_CHECK(ptr[x] <= ptr[x + 1], "{}: corrupt block view (block {})", who, x);
  // Visits the view's (row, entry) pairs in its order: a block's union ascends, so every row's keys do.
  auto each_pair = [&](auto&& visit) {
    for (int64_t x = 0; x < groups_ * nqb; ++x) {
      const int64_t i0 = (x / nqb) * queries_ + (x % nqb) * kRowBlock;
      const int64_t lanes = std::min(kRowBlock, queries_ - (x % nqb) * kRowBlock);
      for (int64_t e = ptr[x]; e < ptr[x + 1]; ++e) {
        ASC_CHECK(bits[e] != 0 && (bits[e] >> lanes) == 0, "{}: corrupt block view (entry {})", who, e);
        for (int64_t r = 0; r < lanes; ++r)
          if (bits[e] >> r & 1) visit(i0 + r, e);
      }
    }
  };
  // Each row's length, then its keys.
  Tensor row_ptr = int64_buffer(n_rows + 1);
  int64_t* rp = row_ptr.data_ptr<int64_t>();
  std::fill(rp, rp + n_rows + 1, int64_t{0});
  each_pair([&](int64_t row, int64_t) { ++rp[row + 1]; });
  for (int64_t r = 0; r < n_rows; ++r) rp[r + 1] += rp[r];
  Tensor cols_t = int64_buffer(rp[n_rows]);
  int64_t* cols = cols_t.data_ptr<int64_t>();
  std::vector<int64_t> fill(rp, rp + n_rows);
  each_pair([&](int64_t row, int64_t e) { cols[fill[row]++] = keys[e]; });
  SparsePattern p = from_csr(groups_, queries_, keys_, std::move(row_ptr), std::move(cols_t));
  ASC_CHECK(p.nnz_ == nnz() && p.max_row_ == max_row(),
            "{}: corrupt block view ({} pairs and a longest row of {}; {} and {} counted)", who, p.nnz_, p.max_row_,
            nnz(), max_row());
  const Transpose& t = p.transposed();
  p.check_lists(who, t.col_ptr, t.col_rows, t.col_pos);  // keys in range and ascending, the longest row
  return p;
}

void SparsePattern::build_block_view(const Tensor& col_ptr, const Tensor& col_rows) {
  block_union(groups_, queries_, keys_, kRowBlock, row_ptr_.data_ptr<int64_t>(), cols_.data_ptr<int64_t>(), rblk_ptr_,
              rblk_keys_, rblk_bits_);
  block_union(groups_, keys_, queries_, kKeyBlock, col_ptr.data_ptr<int64_t>(), col_rows.data_ptr<int64_t>(), kblk_ptr_,
              kblk_rows_, kblk_bits_);
}

SparsePattern SparsePattern::to(Device device) const {
  if (!defined()) return *this;  // the empty pattern is empty everywhere (the op refuses it)
  if (!has_lists()) {
    if (device.is_cpu()) return lists_from_view();
    if (device == this->device()) return *this;
    // The view alone, to another CUDA device, with its sizes read (the lists cut to their entries).
    SparsePattern p =
        from_block_view(groups_, queries_, keys_, nnz(), max_row(), rblk_ptr_.to(device), rblk_keys().to(device),
                        rblk_bits().to(device), kblk_ptr_.to(device), kblk_rows().to(device), kblk_bits().to(device));
    return p;
  }
  if (row_ptr_.device() == device) return *this;
  const bool keep_copy = cache_ && row_ptr_.device().is_cpu() && device.is_cuda();
  if (keep_copy) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->device_copy && cache_->device_index == device.index)
      return *static_cast<const SparsePattern*>(cache_->device_copy.get());
  }
  SparsePattern p = *this;
  p.cache_ = std::make_shared<SparsePatternCache>();  // its own: sharing this one would make the kept copy a cycle
  // The transpose moves too (made here on the host if it was not yet); the copy gets a holder of its own.
  const Transpose& t = transposed();
  Tensor col_ptr = t.col_ptr, col_rows = t.col_rows, col_pos = t.col_pos;
  auto move_all = [&](Device d) {
    for (Tensor* x : {&p.row_ptr_, &p.cols_, &col_ptr, &col_rows, &col_pos, &p.rblk_ptr_, &p.rblk_keys_, &p.rblk_bits_,
                      &p.kblk_ptr_, &p.kblk_rows_, &p.kblk_bits_})
      if (x->defined()) *x = x->to(d);
  };
  if (!p.row_ptr_.device().is_cpu()) move_all(Device::cpu());  // from a device: by way of the host
  // O(nnz + groups · keys), as cheap as the copy itself
  p.check_lists("SparsePattern::to", col_ptr, col_rows, col_pos);
  if (device.is_cuda() && !p.has_block_view()) p.build_block_view(col_ptr, col_rows);
  if (!device.is_cpu()) move_all(device);
  p.transpose_ = std::make_shared<Transpose>();
  std::call_once(p.transpose_->once, [&] {
    p.transpose_->col_ptr = col_ptr, p.transpose_->col_rows = col_rows, p.transpose_->col_pos = col_pos;
  });
  if (keep_copy) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    cache_->device_copy = std::make_shared<const SparsePattern>(p);
    cache_->device_index = device.index;
  }
  return p;
}

// ---- the builders ------------------------------------------------------------------------------------------------

SparsePattern local_window_pattern(int64_t T, int64_t w_in, bool causal) {
  check_length("local_window_pattern", T);
  ASC_CHECK(w_in >= 1, "local_window_pattern: the window w must be >= 1, got {}", w_in);
  // A window past 2T holds every key either way: clamping changes no pair and keeps i ± w in range.
  const int64_t w = std::min(w_in, 2 * T);
  std::vector<std::vector<int64_t>> rows(T);
  const int64_t r = w / 2;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t lo = causal ? std::max<int64_t>(0, i - w + 1) : std::max<int64_t>(0, i - r);
    const int64_t hi = causal ? i : std::min(T - 1, i + r);
    for (int64_t j = lo; j <= hi; ++j) rows[i].push_back(j);
  }
  return SparsePattern::from_rows(1, T, T, std::move(rows));
}

SparsePattern strided_pattern(int64_t T, int64_t s_in, bool causal) {
  check_length("strided_pattern", T);
  ASC_CHECK(s_in >= 1, "strided_pattern: the stride s must be >= 1, got {}", s_in);
  const int64_t s = std::min(s_in, T);  // s >= T: only j = i; clamped so that j + s cannot overflow
  std::vector<std::vector<int64_t>> rows(T);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i % s; j < (causal ? i + 1 : T); j += s) rows[i].push_back(j);
  return SparsePattern::from_rows(1, T, T, std::move(rows));
}

SparsePattern global_tokens_pattern(int64_t T, int64_t g_in, bool causal) {
  check_length("global_tokens_pattern", T);
  ASC_CHECK(g_in >= 0, "global_tokens_pattern: the global token count g must be >= 0, got {}", g_in);
  const int64_t g = std::min(g_in, T);  // g >= T: every token is global (the layer's rule too)
  std::vector<std::vector<int64_t>> rows(T);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t end = causal ? i + 1 : T;
    for (int64_t j = 0; j < (i < g ? end : std::min(g, end)); ++j) rows[i].push_back(j);
  }
  return SparsePattern::from_rows(1, T, T, std::move(rows));
}

SparsePattern random_keys_pattern(int64_t T, int64_t r_in, uint64_t seed, bool causal) {
  check_length("random_keys_pattern", T);
  ASC_CHECK(r_in >= 1, "random_keys_pattern: r (random keys per query) must be >= 1, got {}", r_in);
  const int64_t r = std::min(r_in, T);  // a row takes min(r, its candidates), as causal rows always did
  std::vector<std::vector<int64_t>> rows(T);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t m = causal ? i + 1 : T;  // candidates [0, m)
    auto& row = rows[i];
    if (r >= m) {
      for (int64_t j = 0; j < m; ++j) row.push_back(j);
      continue;
    }
    // Floyd's sampling: r distinct values of [0, m), one Philox word per step; (seed, row, step) fixes each word.
    std::unordered_set<int64_t> chosen;
    int64_t step = 0;
    for (int64_t top = m - r; top < m; ++top, ++step) {
      const auto words = philox4x32(seed, static_cast<uint64_t>(i), static_cast<uint64_t>(step / 4));
      const int64_t t = static_cast<int64_t>(words[step % 4] % static_cast<uint64_t>(top + 1));
      const int64_t pick = chosen.count(t) ? top : t;
      chosen.insert(pick);
      row.push_back(pick);
    }
  }
  return SparsePattern::from_rows(1, T, T, std::move(rows));
}

int64_t hierarchical_blocks(int64_t T, int64_t b) {
  ASC_CHECK(T >= 1 && b >= 1, "hierarchical_blocks: needs T >= 1 and a block size b >= 1, got T = {}, b = {}", T, b);
  return T / b + (T % b != 0);  // ceil(T / b), without the overflow of T + b - 1
}

SparsePattern hierarchical_pattern(int64_t T, int64_t b_in, bool causal) {
  check_length("hierarchical_pattern", T);
  ASC_CHECK(b_in >= 1, "hierarchical_pattern: the block size b must be >= 1, got {}", b_in);
  const int64_t b = std::min(b_in, T);  // b >= T: one block, the same pairs
  const int64_t nb = hierarchical_blocks(T, b);
  std::vector<std::vector<int64_t>> rows(T);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t blk = i / b, lo = blk * b, hi = causal ? i : std::min(T, lo + b) - 1;
    for (int64_t j = lo; j <= hi; ++j) rows[i].push_back(j);
    for (int64_t m = 0; m < (causal ? blk : nb); ++m)
      if (m != blk) rows[i].push_back(T + m);
  }
  return SparsePattern::from_rows(1, T, T + nb, std::move(rows));
}

namespace {
// The arguments of hierarchical_summaries and hierarchical_keys: x (B, H, T >= 1, d) of a float dtype, b >= 1, key_keep
// undefined or bool (B, T) on x's device.
void check_block_means_args(const char* who, const Tensor& x, int64_t b, const Tensor& key_keep) {
  check_defined(who, x, "x");
  check_float(who, x, "x");
  ASC_CHECK(x.dim() == 4 && x.size(2) >= 1, "{}: expects x (B, H, T, d), got {}", who, x.shape());
  ASC_CHECK(b >= 1, "{}: the block size b must be >= 1, got {}", who, b);
  if (!key_keep.defined()) return;
  const int64_t B = x.size(0), T = x.size(2);
  ASC_CHECK(key_keep.dtype() == kBool && key_keep.dim() == 2 && key_keep.size(0) == B && key_keep.size(1) == T,
            "{}: key_keep must be bool (B, T) = ({}, {}); got {} {}", who, B, T, key_keep.dtype(), key_keep.shape());
  ASC_CHECK(key_keep.device() == x.device(), "{}: key_keep is on {}, x on {}", who, key_keep.device(), x.device());
}
}  // namespace

BlockMeans hierarchical_summaries(const Tensor& x, int64_t b_in, const Tensor& key_keep) {
  check_block_means_args("hierarchical_summaries", x, b_in, key_keep);
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3);
  const int64_t b = std::min(b_in, T), nb = hierarchical_blocks(T, b);  // as hierarchical_pattern: b >= T is one block
  Tensor w = key_keep.defined() ? key_keep.to(x.dtype()).view({B, 1, T, 1}) : ones({B, 1, T, 1}, x.options());
  // Padding tokens by `where`, not only weighted by 0: a padding token's NaN must not reach its block's mean.
  Tensor xw = key_keep.defined() ? where(key_keep.view({B, 1, T, 1}), x, 0.0) : x;
  if (nb * b > T) {  // pad the last block with weight-0 tokens
    xw = cat({xw, zeros({B, H, nb * b - T, d}, x.options())}, 2);
    w = cat({w, zeros({B, 1, nb * b - T, 1}, x.options())}, 2);
  }
  const Tensor count = sum(w.view({B, 1, nb, b, 1}), {3});  // (B, 1, nb, 1)
  return {sum(xw.view({B, H, nb, b, d}), {3}) / clamp(count, 1.0, std::nullopt), gt(count.view({B, nb}), 0.0)};
}

Tensor hierarchical_keys(const Tensor& x, int64_t b_in, const Tensor& key_keep) {
  constexpr const char* who = "hierarchical_keys";
  check_block_means_args(who, x, b_in, key_keep);
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3);
  const int64_t b = std::min(b_in, T), nb = hierarchical_blocks(T, b);
  if (!x.device().is_cpu() || (x.dtype() != kFloat32 && x.dtype() != kFloat64))  // other devices, 16-bit dtypes
    return cat({x, hierarchical_summaries(x, b_in, key_keep).means}, 2);
  // the mask copied (B × T bools): the backward reads it, whatever the caller does to its tensor meanwhile
  const Tensor keep = key_keep.defined() ? key_keep.detach().clone() : Tensor();
  const Tensor xd = x.detach(), xc = d > 0 && xd.stride(3) != 1 ? xd.contiguous() : xd;  // rows read in place
  Tensor out = Tensor::empty({B, H, T + nb, d}, x.options());
  if (out.numel() > 0) {
    profiler::KernelScope event(who, "hierarchical_keys_forward");
    cpu::hierarchical_keys_forward(xc, b, keep, out);
  }
  if (autograd::needs_grad({&x}))
    autograd::record(who, {x}, {out}, [b, keep, shape = x.shape(), opts = x.options()](const TensorList& g) {
      Tensor gx = Tensor::empty(shape, opts);
      if (gx.numel() > 0) {
        const Tensor gc = g[0].stride(3) != 1 ? g[0].contiguous() : g[0];
        profiler::KernelScope event("hierarchical_keys backward", "hierarchical_keys_backward");
        cpu::hierarchical_keys_backward(gc, b, keep, gx);
      }
      return TensorList{gx};
    });
  return out;
}

Tensor hierarchical_keep(const Tensor& key_keep, int64_t b_in) {
  constexpr const char* who = "hierarchical_keep";
  check_defined(who, key_keep, "key_keep");
  ASC_CHECK(key_keep.dtype() == kBool && key_keep.dim() == 2 && key_keep.size(1) >= 1,
            "{}: key_keep must be bool (B, T), got {} {}", who, key_keep.dtype(), key_keep.shape());
  ASC_CHECK(b_in >= 1, "{}: the block size b must be >= 1, got {}", who, b_in);
  const int64_t B = key_keep.size(0), T = key_keep.size(1), b = std::min(b_in, T), nb = hierarchical_blocks(T, b);
  Tensor padded = key_keep;
  if (nb * b > T) padded = cat({key_keep, zeros({B, nb * b - T}, {kBool, key_keep.device()})}, 1);
  return cat({key_keep, any(padded.view({B, nb, b}), 2)}, 1);
}

namespace {
// The clustered builders' arguments: soft assignments a (B, H, T, c) of a float dtype with B, H, c >= 1 and a length
// the builders accept; θ finite and >= 0.
void check_assignments(const char* who, const Tensor& a, double theta) {
  check_defined(who, a, "a");
  check_float(who, a, "a");
  ASC_CHECK(a.dim() == 4 && a.size(3) >= 1, "{}: expects soft assignments a (B, H, T, c), got {}", who, a.shape());
  ASC_CHECK(std::isfinite(theta) && theta >= 0, "{}: theta must be finite and >= 0, got {}", who, theta);
  ASC_CHECK(a.size(0) >= 1 && a.size(1) >= 1, "{}: needs B, H >= 1 (one list per (batch, head)); got a of shape {}",
            who, a.shape());
  check_length(who, a.size(2));
}
}  // namespace

namespace {

// Visits the union of two ascending lists without repeats, [a, a_end) and [b, b_end), in ascending order, each key
// once (pattern_union's two-list case, clustered_rows' merge with the base row).
template <class F>
void merge_ascending(const int64_t* a, const int64_t* a_end, const int64_t* b, const int64_t* b_end, F&& emit) {
  while (a != a_end && b != b_end) emit(*a < *b ? *a++ : *b < *a ? *b++ : (++b, *a++));
  for (; a != a_end; ++a) emit(*a);
  for (; b != b_end; ++b) emit(*b);
}

// The clustered pattern's rows, each united with a base pattern's row (none: base_lists null), as CSR lists: row
// (g, i) holds the j with a_i · a_j > θ (causal: j <= i) and the base row's keys, ascending, each once. a: (G, T, c)
// float64, finite and >= 0. The bucket bound θ / 2 assumes rows summing to 1 (ops/sparse_attention.h); dividing by
// the largest row sum keeps the proof for any non-negative rows (a softmax's sum is 1 only up to rounding): the terms
// with a_im <= θ / (2 s_max) add up to at most θ / (2 s_max) · Σ_m a_jm <= θ / 2, so no qualifying pair is missed.
//
// Per group (in parallel): the buckets as ascending lists, with their members' assignments transposed; row i's
// clustered keys are the j of its buckets (causal: j <= i) with a_i · a_j > θ. The tests go bucket by bucket, four
// member rows at a time against all its members (clustered_rows_bits: every sum over m in order, each operation
// rounded on its own, so a pair qualifies the same way on every path and processor), into a bit row per (member,
// bucket): a bucket's assignments are read from the cache by its members in turn, where rows in token order would
// fetch a different bucket's from memory row after row. Then each row's keys are taken from its bits, once (a stamp
// per key) and sorted when the row is in several buckets, and merged with the base row. A row whose buckets hold more
// than a quarter of the keys (few clusters, soft assignments) tests every key instead, four such rows at a time
// against the group's transposed assignments (clustered_rows_flags: the same sums), and takes the base row's keys by
// marking them in its flags: one branch-free pass writes the union, no merge. Each group's rows go into a list of its
// own, copied into the CSR arrays after: no list per row. Returns (row_ptr, cols) for SparsePattern::from_csr.
std::pair<Tensor, Tensor> clustered_rows(const double* ap, int64_t G, int64_t T, int64_t c, double theta, bool causal,
                                         const SparsePattern::Lists* base_lists, int64_t base_groups, const char* who) {
  double s_max = 1;
  for (int64_t row = 0; row < G * T; ++row) {
    double s_row = 0;
    for (int64_t m = 0; m < c; ++m) s_row += ap[row * c + m];
    s_max = std::max(s_max, s_row);
  }
  const double bucket_min = theta / (2 * s_max);
  std::vector<std::vector<int64_t>> keys_of(G), len_of(G);
  const int64_t cost = T * std::max<int64_t>(1, T / 4) * c;  // about a quarter of the pairs share a bucket
  cpu::parallel_for(G, cost, [&](int64_t g0, int64_t g1) {
    std::vector<int64_t> bucket_ptr(c + 1), items, stamp(T), found;
    std::vector<double> at(static_cast<size_t>(T * c)), bt;  // the group's a transposed: at[m T + j] = a_jm
    // every_key: the rows that test every key; hit: the flags of four of them (ek_row[0, ek_count)), row ek_at next
    std::vector<unsigned char> hit(static_cast<size_t>(4 * T)), every_key(static_cast<size_t>(T));
    int64_t ek_row[4] = {}, ek_count = 0, ek_at = 0;
    std::vector<int64_t> slot, cursor(c);  // slot: where a bucket member's bits start (-1: it tests every key)
    std::vector<uint64_t> bits;
    for (int64_t g = g0; g < g1; ++g) {
      const double* ag = ap + g * T * c;
      for (int64_t j = 0; j < T; ++j)
        for (int64_t m = 0; m < c; ++m) at[m * T + j] = ag[j * c + m];
      std::fill(bucket_ptr.begin(), bucket_ptr.end(), int64_t{0});
      for (int64_t i = 0; i < T; ++i)
        for (int64_t m = 0; m < c; ++m) bucket_ptr[m + 1] += ag[i * c + m] > bucket_min;
      for (int64_t m = 0; m < c; ++m) bucket_ptr[m + 1] += bucket_ptr[m];
      items.resize(static_cast<size_t>(bucket_ptr[c]));
      std::vector<int64_t> fill(bucket_ptr.begin(), bucket_ptr.end() - 1);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t m = 0; m < c; ++m)
          if (ag[i * c + m] > bucket_min) items[fill[m]++] = i;
      // Each bucket's members' assignments transposed, (c, size) from bt + c · bucket_ptr[m]: its members' rows are
      // tested against them four at a time (clustered_rows_bits), as the dense pass tests every key.
      bt.resize(static_cast<size_t>(c * bucket_ptr[c]));
      for (int64_t m = 0; m < c; ++m) {
        const int64_t size = bucket_ptr[m + 1] - bucket_ptr[m];
        double* b = bt.data() + c * bucket_ptr[m];
        for (int64_t e = 0; e < size; ++e)
          for (int64_t mm = 0; mm < c; ++mm) b[mm * size + e] = ag[items[bucket_ptr[m] + e] * c + mm];
      }
      // Which rows test every key (their buckets hold more than a quarter of them), and the bucket rows' tests made
      // bucket by bucket, four of its members at a time (clustered_rows_bits), while the bucket's transposed
      // assignments are in the cache: a row's bits over its bucket's members at bits[slot] (causal: only members
      // up to the four rows' last are tested; a row reads its own prefix). bits: a word per 64 members of each
      // of a row's buckets, at most T / 4 candidates a row: about T² / 32 bytes a group (the pattern's lists take 64
      // bytes per kept pair), reused by the thread's next group.
      size_t most = 0;  // about the group's most entries: its bucket rows' candidates and every base row
      for (int64_t i = 0; i < T; ++i) {
        int64_t candidates = 0;
        for (int64_t m = 0; m < c; ++m)
          if (ag[i * c + m] > bucket_min) candidates += bucket_ptr[m + 1] - bucket_ptr[m];
        every_key[i] = 4 * candidates > T;
        most += static_cast<size_t>(every_key[i] ? 0 : candidates);  // an every-key row's count is not bounded
        if (base_lists) {
          const int64_t r = (base_groups == 1 ? 0 : g) * T + i;
          most += static_cast<size_t>(base_lists->row_ptr[r + 1] - base_lists->row_ptr[r]);
        }
      }
      slot.assign(static_cast<size_t>(bucket_ptr[c]), -1);
      int64_t words_total = 0;
      for (int64_t m = 0; m < c; ++m) {
        const int64_t size = bucket_ptr[m + 1] - bucket_ptr[m];
        for (int64_t e = 0; e < size; ++e)
          if (!every_key[items[bucket_ptr[m] + e]])
            slot[bucket_ptr[m] + e] = words_total, words_total += (size + 63) / 64;
      }
      bits.resize(static_cast<size_t>(words_total));
      for (int64_t m = 0; m < c; ++m) {
        const int64_t* members = items.data() + bucket_ptr[m];
        const int64_t size = bucket_ptr[m + 1] - bucket_ptr[m], words = (size + 63) / 64;
        const double* bm = bt.data() + c * bucket_ptr[m];
        for (int64_t e = 0; e < size;) {
          const double* rows[4];
          int64_t R = 0, first = -1, last = 0;
          for (; e < size && R < 4; ++e)  // the slots of a bucket's rows are consecutive, `words` apart
            if (slot[bucket_ptr[m] + e] >= 0) {
              if (R == 0) first = slot[bucket_ptr[m] + e];
              rows[R++] = ag + members[e] * c, last = e;
            }
          if (R == 0) continue;
          const int64_t n = causal ? last + 1 : size;  // members up to the last row tested (members are ascending)
          cpu::clustered_rows_bits(rows, R, bm, size, c, n, theta, bits.data() + first, words);
        }
      }
      std::fill(stamp.begin(), stamp.end(), int64_t{-1});
      std::copy(bucket_ptr.begin(), bucket_ptr.end() - 1, cursor.begin());  // each bucket's next member
      ek_count = ek_at = 0;
      std::vector<int64_t>& keys = keys_of[g];
      std::vector<int64_t>& lens = len_of[g];
      lens.assign(T, 0);
      // No reallocation as the bucket rows are appended (rows that test every key grow the list as they need; at
      // most 2^22 entries reserved, 32 MiB, as every group's list lives until the copy below).
      keys.reserve(std::min(most, size_t{1} << 22));
      for (int64_t i = 0; i < T; ++i) {
        const size_t start = keys.size();                // row i's keys are appended to the group's list
        const int64_t *bk = nullptr, *bk_end = nullptr;  // the base row's keys, ascending
        if (base_lists) {
          const int64_t r = (base_groups == 1 ? 0 : g) * T + i;
          bk = base_lists->cols + base_lists->row_ptr[r], bk_end = base_lists->cols + base_lists->row_ptr[r + 1];
        }
        int64_t buckets = 0;
        for (int64_t m = 0; m < c; ++m) buckets += ag[i * c + m] > bucket_min;
        if (every_key[i]) {  // every key j < n, the same sums
          for (int64_t m = 0; m < c; ++m) cursor[m] += ag[i * c + m] > bucket_min;
          const int64_t n = causal ? i + 1 : T;
          if (ek_at == ek_count || ek_row[ek_at] != i) {  // the flags of the next four rows from i that test every key
            ek_count = ek_at = 0;
            const double* rows[4];
            for (int64_t r = i; r < T && ek_count < 4; ++r)
              if (every_key[r]) ek_row[ek_count] = r, rows[ek_count++] = ag + r * c;
            const int64_t n_last = causal ? ek_row[ek_count - 1] + 1 : T;
            cpu::clustered_rows_flags(rows, ek_count, at.data(), T, c, n_last, theta, hit.data(), T);
          }
          unsigned char* h = hit.data() + ek_at++ * T;
          const int64_t* b = bk;
          for (; b != bk_end && *b < n; ++b) h[*b] = 1;
          keys.resize(start + static_cast<size_t>(n) + static_cast<size_t>(bk_end - b));
          int64_t* out = keys.data() + start;
          int64_t len = cpu::compact_flags(h, n, out);
          for (; b != bk_end; ++b) out[len++] = *b;  // base keys past the clustered range
          keys.resize(start + static_cast<size_t>(len));
        } else {
          // Each of the row's buckets: its bits over the members (causal: those <= i, a prefix of the ascending
          // list). One bucket: its members that pass, in order. Several: a key in two of them is taken once (its
          // stamp), and the keys sorted.
          found.clear();
          for (int64_t m = 0; m < c; ++m) {
            if (!(ag[i * c + m] > bucket_min)) continue;
            const int64_t e_i = cursor[m]++;  // row i's place among bucket m's members
            const int64_t* members = items.data() + bucket_ptr[m];
            const int64_t size = bucket_ptr[m + 1] - bucket_ptr[m];
            const int64_t n = causal ? e_i - bucket_ptr[m] + 1 : size;
            const uint64_t* row_bits = bits.data() + slot[e_i];
            for (int64_t w = 0; w * 64 < n; ++w) {
              uint64_t word = row_bits[w];
              if (n - w * 64 < 64) word &= (uint64_t{1} << (n - w * 64)) - 1;
              for (; word != 0; word &= word - 1) {
                const int64_t j = members[w * 64 + std::countr_zero(word)];
                if (buckets == 1) {
                  found.push_back(j);
                } else if (stamp[j] != i) {
                  stamp[j] = i, found.push_back(j);
                }
              }
            }
          }
          if (buckets > 1) std::sort(found.begin(), found.end());
          merge_ascending(found.data(), found.data() + found.size(), bk, bk_end, [&](int64_t j) { keys.push_back(j); });
        }
        lens[i] = static_cast<int64_t>(keys.size() - start);
      }
    }
  });
  const int64_t n_rows = checked_mul(G, T, who, "groups x queries");
  Tensor row_ptr = int64_buffer(n_rows + 1);
  int64_t* rp = row_ptr.data_ptr<int64_t>();
  rp[0] = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < T; ++i) rp[g * T + i + 1] = rp[g * T + i] + len_of[g][i];
  Tensor cols_t = int64_buffer(rp[n_rows]);
  int64_t* cols = cols_t.data_ptr<int64_t>();
  cpu::parallel_for(G, T * 8, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) std::copy(keys_of[g].begin(), keys_of[g].end(), cols + rp[g * T]);
  });
  return {std::move(row_ptr), std::move(cols_t)};
}

}  // namespace

SparsePattern clustered_pattern(const Tensor& a_in, double theta, bool causal) {
  constexpr const char* who = "clustered_pattern";
  check_assignments(who, a_in, theta);
  const int64_t B = a_in.size(0), H = a_in.size(1), T = a_in.size(2), c = a_in.size(3);
  const Tensor a = a_in.detach().to(Device::cpu()).to(kFloat64).contiguous();
  const double* ap = a.data_ptr<double>();
  for (int64_t x = 0; x < a.numel(); ++x) {
    ASC_CHECK(std::isfinite(ap[x]), "{}: the assignments contain a non-finite value ({}) at flat index {}", who, ap[x],
              x);
    ASC_CHECK(ap[x] >= 0, "{}: the assignments must be >= 0; got {} at flat index {}", who, ap[x], x);
  }
  auto [row_ptr, cols] = clustered_rows(ap, B * H, T, c, theta, causal, nullptr, 1, who);
  return SparsePattern::from_csr(B * H, T, T, std::move(row_ptr), std::move(cols));
}

SparsePattern pattern_union(const std::vector<SparsePattern>& patterns) {
  ASC_CHECK(!patterns.empty(), "pattern_union: needs at least one pattern");
  for (size_t x = 0; x < patterns.size(); ++x)
    ASC_CHECK(patterns[x].defined(), "pattern_union: pattern {} is empty (build it with a *_pattern function)", x);
  const int64_t T = patterns[0].queries();
  int64_t groups = 1, keys = 0;
  for (const auto& p : patterns) {
    ASC_CHECK(p.queries() == T, "pattern_union: patterns of {} and {} queries", T, p.queries());
    ASC_CHECK(p.groups() == 1 || groups == 1 || p.groups() == groups, "pattern_union: patterns of {} and {} groups",
              groups, p.groups());
    groups = std::max(groups, p.groups());
    keys = std::max(keys, p.keys());
  }
  // Each input's rows are sorted and free of repeats (from_rows makes them so): row (g, i) of the union is their
  // merge, written straight into the CSR arrays in two passes (its length, then its keys) — no per-row lists, no sort.
  std::vector<SparsePattern> cpu;
  std::vector<SparsePattern::Lists> lists;
  for (const auto& p : patterns) cpu.push_back(p.to(Device::cpu()));
  for (const auto& p : cpu) lists.push_back(p.lists());
  const size_t k = lists.size();
  // Visits row (g, i)'s merged keys in ascending order, each once; at / end: the caller's cursors (one per input).
  auto merge_row = [&](int64_t g, int64_t i, const int64_t** at, const int64_t** end, auto&& emit) {
    for (size_t x = 0; x < k; ++x) {
      const int64_t r = (cpu[x].groups() == 1 ? 0 : g) * T + i;
      at[x] = lists[x].cols + lists[x].row_ptr[r], end[x] = lists[x].cols + lists[x].row_ptr[r + 1];
    }
    if (k == 2) return merge_ascending(at[0], end[0], at[1], end[1], emit);  // the common case: two pointers
    for (;;) {
      int64_t next = -1;
      for (size_t x = 0; x < k; ++x)
        if (at[x] != end[x] && (next < 0 || *at[x] < next)) next = *at[x];
      if (next < 0) return;
      emit(next);
      for (size_t x = 0; x < k; ++x)
        if (at[x] != end[x] && *at[x] == next) ++at[x];
    }
  };
  const int64_t n_rows = checked_mul(groups, T, "pattern_union", "groups x queries");
  checked_add(checked_mul(groups, keys, "pattern_union", "groups x keys"), 1, "pattern_union", "groups x keys + 1");
  Tensor row_ptr = int64_buffer(n_rows + 1);
  int64_t* rp = row_ptr.data_ptr<int64_t>();
  rp[0] = 0;
  // Two passes over the rows, in parallel (each row's length, then its keys), with the offsets' prefix sum between.
  int64_t in_entries = 0;
  for (const auto& p : cpu) in_entries += p.nnz();
  const int64_t per_row = std::max<int64_t>(1, in_entries / std::max<int64_t>(1, n_rows));
  cpu::parallel_for(n_rows, per_row, [&](int64_t r0, int64_t r1) {
    std::vector<const int64_t*> at(k), end(k);
    for (int64_t r = r0; r < r1; ++r) {
      int64_t len = 0;
      merge_row(r / T, r % T, at.data(), end.data(), [&](int64_t) { ++len; });
      rp[r + 1] = len;
    }
  });
  for (int64_t r = 0; r < n_rows; ++r) rp[r + 1] += rp[r];  // <= the inputs' total entries: no overflow
  Tensor cols_t = int64_buffer(rp[n_rows]);
  int64_t* cols = cols_t.data_ptr<int64_t>();
  cpu::parallel_for(n_rows, per_row, [&](int64_t r0, int64_t r1) {
    std::vector<const int64_t*> at(k), end(k);
    for (int64_t r = r0; r < r1; ++r) {
      int64_t e = rp[r];
      merge_row(r / T, r % T, at.data(), end.data(), [&](int64_t j) { cols[e++] = j; });
    }
  });
  return SparsePattern::from_csr(groups, T, keys, std::move(row_ptr), std::move(cols_t));
}

SparsePattern clustered_union(const SparsePattern& base, const Tensor& a_in, double theta, bool causal,
                              bool with_block_view) {
  constexpr const char* who = "clustered_union";
  ASC_CHECK(base.defined(), "{}: the base pattern is empty (build it with a *_pattern function)", who);
  check_assignments(who, a_in, theta);
  const int64_t B = a_in.size(0), H = a_in.size(1), T = a_in.size(2), c = a_in.size(3);
  const int64_t G = checked_mul(B, H, who, "B x H"), S = base.keys();
  ASC_CHECK(base.queries() == T && S >= T,
            "{}: the base pattern is for {} queries and {} keys; a has T = {} (needs T queries and >= T keys)", who,
            base.queries(), S, T);
  ASC_CHECK(base.groups() == 1 || base.groups() == G, "{}: the base pattern has {} groups; expected 1 or B·H = {}", who,
            base.groups(), G);
  const Device dev = a_in.device();

  const Tensor a64 = dev.is_cpu() && !with_block_view ? a_in.detach().to(kFloat64).contiguous() : Tensor();
  bool negative = false;     // a finite entry below 0: the bucket walk's bound does not hold
  std::vector<int64_t> bad;  // flat rows g · T + i with a non-finite entry
  if (a64.defined()) {
    const double* ap = a64.data_ptr<double>();
    for (int64_t r = 0; r < G * T; ++r) {
      bool finite = true;
      for (int64_t m = 0; m < c; ++m) {
        const double x = ap[r * c + m];
        finite = finite && std::isfinite(x);
        negative = negative || (x < 0 && std::isfinite(x));
      }
      if (!finite) bad.push_back(r);
    }
  }
  if (a64.defined() && !negative) {
    // The bucket walk over CSR lists. A row with a non-finite entry is zeroed (so it joins no bucket and no pair:
    // θ >= 0) and given its own key.
    const Tensor& a = a64;
    if (bad.empty()) {  // the union's rows written in one pass (clustered_rows)
      const SparsePattern bc = base.to(Device::cpu());
      const SparsePattern::Lists bl = bc.lists();
      auto [row_ptr, cols] = clustered_rows(a.data_ptr<double>(), G, T, c, theta, causal, &bl, bc.groups(), who);
      return SparsePattern::from_csr(G, T, S, std::move(row_ptr), std::move(cols));
    }
    const Tensor clean = a.clone();
    double* cp = clean.data_ptr<double>();
    std::vector<std::vector<int64_t>> self(G * T);
    for (int64_t r : bad) {
      std::fill(cp + r * c, cp + (r + 1) * c, 0.0);
      self[r] = {r % T};
    }
    return pattern_union(
        {base, clustered_pattern(clean, theta, causal), SparsePattern::from_rows(G, T, T, std::move(self))});
  }

  // Kernels (ops/kernel_list.inc): each token's buckets, each block's entries counted, their offsets, the fill. The
  // CPU kernels read float32 / float64 (a bfloat16 / float16 a converts exactly). On the CPU with a negative entry
  // they test every pair of its group, and the lists are derived from their view.
  if (a64.defined()) return clustered_union(base, a64, theta, causal, /*with_block_view=*/true).to(Device::cpu());
  ASC_CHECK(!dev.is_cuda() || G <= 65535, "{} (CUDA): B·H = {} exceeds the kernels' 65535 (batch, head) pairs", who, G);
  Tensor a = a_in.detach().contiguous().view({G, T, c});
  if (dev.is_cpu() && a.dtype() != kFloat32 && a.dtype() != kFloat64) a = a.to(kFloat64);
  SparsePattern bp = base.to(dev);
  if (!bp.has_block_view()) {  // a CPU base: its view made here
    const auto& t = bp.transposed();
    bp.build_block_view(t.col_ptr, t.col_rows);
  }
  const ClusteredBlocksArgs args{.base = bp.block_view(),
                                 .base_groups = bp.groups(),
                                 .groups = G,
                                 .queries = T,
                                 .keys = S,
                                 .theta = theta,
                                 .causal = causal};
  constexpr int64_t kR = SparsePattern::kRowBlock, kK = SparsePattern::kKeyBlock;
  const int64_t nqb = T / kR + (T % kR != 0), nkb = S / kK + (S % kK != 0);
  const TensorOptions i64{.dtype = kInt64, .device = dev};
  Tensor rcount = Tensor::empty({G * nqb}, i64), kcount = Tensor::empty({G * nkb}, i64);
  Tensor row_len = Tensor::empty({G * T}, i64), masks = Tensor::empty({G * T}, i64);
  ASC_KERNEL(dev, who, clustered_bucket_masks, args, a, masks);
  ASC_KERNEL(dev, who, clustered_blocks_count, args, a, masks, rcount, kcount, row_len);
  Tensor rptr = Tensor::empty({G * nqb + 1}, i64), kptr = Tensor::empty({G * nkb + 1}, i64);
  ASC_KERNEL(dev, who, exclusive_offsets, rcount, rptr);
  ASC_KERNEL(dev, who, exclusive_offsets, kcount, kptr);
  // The view's sizes, the pairs and the longest row, on the device.
  const Tensor counts =
      cat({rptr.narrow(0, G * nqb, 1), kptr.narrow(0, G * nkb, 1), sum(row_len).view({1}), amax(row_len).view({1})}, 0);
  // On CUDA, where the most entries the view can have (every candidate of every block) fit the budget, the lists
  // are allocated for that many and nothing is read back: the step goes on without waiting for the device, and
  // nnz() / max_row() / the view's accessors read the counts when first asked. Otherwise one read sizes them.
  const __int128 r_most = static_cast<__int128>(G) * nqb * S, k_most = static_cast<__int128>(G) * nkb * T;
  const bool no_read = dev.is_cuda() && (r_most + k_most) * 2 * 8 <= detail::clustered_view_budget();
  int64_t r_n = 0, k_n = 0, nnz = 0, max_row = 0;
  if (no_read) {
    r_n = static_cast<int64_t>(r_most), k_n = static_cast<int64_t>(k_most);
  } else {
    const Tensor host = counts.to(Device::cpu());
    const int64_t* v = host.data_ptr<int64_t>();
    r_n = v[0], k_n = v[1], nnz = v[2], max_row = v[3];
  }
  Tensor rkeys = Tensor::empty({r_n}, i64), rbits = Tensor::empty({r_n}, i64);
  Tensor krows = Tensor::empty({k_n}, i64), kbits = Tensor::empty({k_n}, i64);
  ASC_KERNEL(dev, who, clustered_blocks_fill, args, a, masks, rptr, kptr, rkeys, rbits, krows, kbits);
  SparsePattern out =
      SparsePattern::from_block_view(G, T, S, nnz, max_row, std::move(rptr), std::move(rkeys), std::move(rbits),
                                     std::move(kptr), std::move(krows), std::move(kbits));
  if (no_read) {
    out.counts_ = std::make_shared<SparsePattern::DeviceCounts>();
    out.counts_->counts = counts;
  }
  return out;
}

namespace detail {
namespace {
std::atomic<int64_t> g_view_budget{int64_t{64} << 20};
}  // namespace
int64_t clustered_view_budget() { return g_view_budget.load(); }
void set_clustered_view_budget(int64_t bytes) { g_view_budget.store(bytes); }
}  // namespace detail

// ---- the op ------------------------------------------------------------------------------------------------------

namespace {

// Checks q, k, v, the pattern and the mask against each other; returns the scale to use.
double check_inputs(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& p,
                    const Tensor& key_keep, double scale) {
  check_defined(who, q, "q");
  check_defined(who, k, "k");
  check_defined(who, v, "v");
  check_same_device(who, {&q, &k, &v});
  check_float(who, q, "q");
  ASC_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && q.size(0) == k.size(0) &&
                q.size(1) == k.size(1) && q.size(3) == k.size(3),
            "{}: expects q (B, H, T, D), k and v (B, H, S, D); got q {}, k {}, v {}", who, q.shape(), k.shape(),
            v.shape());
  ASC_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "{}: q, k, v must share a dtype; got {}, {}, {}", who,
            q.dtype(), k.dtype(), v.dtype());
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  ASC_CHECK(p.defined(), "{}: the pattern is empty (build it with a *_pattern function)", who);
  ASC_CHECK(p.queries() == T && p.keys() == S,
            "{}: the pattern is for {} queries and {} keys, but q has T = {} and k has S = {}", who, p.queries(),
            p.keys(), T, S);
  ASC_CHECK(p.groups() == 1 || p.groups() == B * H,
            "{}: the pattern has {} groups; expected 1 (shared) or B·H = {} (one per batch and head)", who, p.groups(),
            B * H);
  ASC_CHECK(q.numel() > 0 && k.numel() > 0, "{}: empty inputs (q {}, k {})", who, q.shape(), k.shape());
  if (key_keep.defined()) {
    ASC_CHECK(key_keep.dtype() == kBool && key_keep.dim() == 2 && key_keep.size(0) == B && key_keep.size(1) == S,
              "{}: key_keep must be bool (B, S) = ({}, {}); got {} {}", who, B, S, key_keep.dtype(), key_keep.shape());
    ASC_CHECK(key_keep.device() == q.device(), "{}: key_keep is on {}, q on {}", who, key_keep.device(), q.device());
  }
  ASC_CHECK(std::isfinite(scale) && scale >= 0, "{}: scale must be finite and >= 0 (0: 1/sqrt(D)), got {}", who, scale);
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// The kernels' FLOPs (ops/flops.h) over the pattern's pairs: nnz / groups per (batch, head).
double forward_flops(const Tensor& q, const SparsePattern& p) {
  return flops::attention(q.size(0) * q.size(1),
                          static_cast<double>(p.nnz()) / static_cast<double>(std::max<int64_t>(p.groups(), 1)),
                          q.size(3));
}

}  // namespace

Tensor sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                        const Tensor& key_keep, double scale) {
  const double sc = check_inputs(kOp, q, k, v, pattern, key_keep, scale);
  const SparsePattern p = pattern.to(q.device());
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const Tensor keep = key_keep.defined() ? key_keep.contiguous() : Tensor();
  // o (B, H, T, D); lse (B, H, T), the rows' log-sum-exp in the kernels' compute type (float32 for 16-bit inputs)
  Tensor o = Tensor::empty(qc.shape(), qc.options());
  Tensor lse = Tensor::empty({qc.size(0), qc.size(1), qc.size(2)}, {accumulate_dtype(qc.dtype()), qc.device()});
  ASC_KERNEL_COUNTED(qc.device(), kOp, forward_flops(qc, p), sparse_attention_forward, qc, kc, vc, p.view(), keep, sc,
                     o, lse);
  if (autograd::needs_grad({&q, &k, &v})) {
    using autograd::SavedTensor;
    autograd::record(kOp, {qc, kc, vc}, {o},
                     [qs = SavedTensor(qc, kOp), ks = SavedTensor(kc, kOp), vs = SavedTensor(vc, kOp),
                      os = SavedTensor(o, kOp), lse, keep, p, sc](const TensorList& g) -> TensorList {
                       const Tensor q = qs.get(), k = ks.get(), v = vs.get();
                       // the CPU backward of a single (batch, head) walks the pattern's transpose
                       const bool transpose = q.device().is_cpu() && q.size(0) * q.size(1) == 1;
                       Tensor dq = Tensor::empty(q.shape(), q.options()), dk = Tensor::empty(k.shape(), q.options()),
                              dv = Tensor::empty(v.shape(), q.options());  // the kernels write every element
                       ASC_KERNEL_COUNTED(g[0].device(), kOp, 2 * forward_flops(q, p), sparse_attention_backward, q, k,
                                          v, p.view(transpose), keep, sc, os.get(), g[0].contiguous(), lse, dq, dk, dv);
                       return {dq, dk, dv};
                     });
  }
  return o;
}

Tensor sparse_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                                  const Tensor& key_keep, double scale) {
  const double sc = check_inputs("sparse_attention_reference", q, k, v, pattern, key_keep, scale);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  Tensor mask = pattern.dense_mask().to(q.device());  // (G, T, S)
  mask = pattern.groups() == 1 ? mask.view({1, 1, T, S}) : mask.view({B, H, T, S});
  if (key_keep.defined()) mask = logical_and(mask, key_keep.view({B, 1, 1, S}));
  // The composed ops: scores (B, H, T, S), masked softmax (a row with no kept key is zero), A V.
  const Tensor scores = matmul(q, k.transpose(-2, -1)) * sc;
  return matmul(softmax(scores, -1, mask), v);
}

}  // namespace asc
