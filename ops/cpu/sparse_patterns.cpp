// CPU kernels that build a clustered union's block view (ops/kernel_list.inc: clustered_bucket_masks,
// clustered_blocks_count, clustered_blocks_fill, exclusive_offsets): the same walk as cuda/sparse_patterns.cu, pair for
// pair, so that the CUDA kernels have a reference on the CPU (ops/sparse_attention.h: clustered_union,
// with_block_view).
//
// Query block m of group g (rows 16 m .. 16 m + 15): every key j < S in ascending order, its bits = the base pattern's
// bits for j in that block (the base's own block view) | bit r where row 16 m + r joins j (ops/clustered_pairs.h;
// causal: j <= i). A key with bits is in the block's union. Key block m (keys 16 m ..): every query i < T, bits over
// the block's keys likewise. Every pair is looked at, but only pairs that share a bucket (a mask per token, made first
// per group) are tested: O(groups · T · S) mask tests and O(pairs sharing a bucket · c) sums.
#include <algorithm>
#include <cstdint>

#include "ops/clustered_pairs.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

namespace asc::cpu {

namespace {

constexpr int64_t kBlock = SparsePatternView::kRowBlock;
static_assert(SparsePatternView::kKeyBlock == kBlock, "query and key blocks have the same size");

int64_t blocks_of(int64_t n) { return n / kBlock + (n % kBlock != 0); }

// The walk of one block of the view, in ascending order of its union candidates: emit(item, bits) for each candidate
// whose bits are not all 0. T a's element type (float32 / float64).
template <class T>
struct Walk {
  const ClusteredBlocksArgs& s;
  const T* a;             // (groups, queries, c)
  const uint64_t* masks;  // (groups, queries)
  int64_t c;

  bool joins(int64_t g, int64_t i, int64_t j) const {
    const T* ag = a + g * s.queries * c;
    const uint64_t* mg = masks + g * s.queries;
    return clustered::joins(ag + i * c, ag + j * c, c, mg[i], mg[j], i == j, s.theta,
                            [](T x) { return static_cast<double>(x); });
  }
  // The base's list of block m (ptr, items, bits of its query or key side).
  template <class F>
  void over(int64_t g, int64_t m, int64_t n_items, int64_t blocks, const int64_t* ptr, const int64_t* items,
            const int64_t* bits, int64_t lanes, bool rows_side, F&& emit) const {
    const int64_t x = (s.base_groups == 1 ? 0 : g) * blocks + m;
    int64_t e = ptr[x];
    const int64_t e_end = ptr[x + 1];
    const uint64_t* mg = masks + g * s.queries;
    uint64_t lane_or = 0;  // the buckets of the block's own tokens: a candidate that meets none joins no lane
    for (int64_t r = 0; r < lanes && kBlock * m + r < s.queries; ++r) lane_or |= mg[kBlock * m + r];
    for (int64_t t = 0; t < n_items; ++t) {
      int64_t b = 0;
      for (; e < e_end && items[e] < t; ++e) {
      }
      if (e < e_end && items[e] == t) b = bits[e];
      const bool own = t >= kBlock * m && t < kBlock * m + lanes;  // a lane's own token (a non-finite row joins it)
      if (t < s.queries && (own || (mg[t] & lane_or) != 0))
        for (int64_t r = 0; r < lanes; ++r) {
          // rows side: row 16 m + r against key t; keys side: query t against key 16 m + r
          const int64_t i = rows_side ? kBlock * m + r : t, j = rows_side ? t : kBlock * m + r;
          if (j < s.queries && (!s.causal || j <= i) && joins(g, i, j)) b |= int64_t{1} << r;
        }
      if (b != 0) emit(t, b);
    }
  }
  template <class F>
  void query_block(int64_t g, int64_t m, F&& emit) const {
    const int64_t lanes = std::min(kBlock, s.queries - kBlock * m);
    over(g, m, s.keys, blocks_of(s.queries), s.base.rblk_ptr, s.base.rblk_keys, s.base.rblk_bits, lanes, true, emit);
  }
  template <class F>
  void key_block(int64_t g, int64_t m, F&& emit) const {
    const int64_t lanes = std::min(kBlock, s.keys - kBlock * m);
    over(g, m, s.queries, blocks_of(s.keys), s.base.kblk_ptr, s.base.kblk_rows, s.base.kblk_bits, lanes, false, emit);
  }
};

template <class F>
void dispatch(const Tensor& a, const Tensor& masks, const ClusteredBlocksArgs& s, F&& f) {
  const auto* m = reinterpret_cast<const uint64_t*>(masks.data_ptr<int64_t>());
  ASC_DISPATCH_FLOAT(a.dtype(), "clustered_blocks", [&] {
    f(Walk<scalar_t>{s, a.data_ptr<scalar_t>(), m, a.size(2)});
  });
}

}  // namespace

void clustered_bucket_masks(const ClusteredBlocksArgs& s, const Tensor& a, Tensor& masks) {
  const int64_t T = s.queries, c = a.size(2);
  auto* out = reinterpret_cast<uint64_t*>(masks.data_ptr<int64_t>());
  ASC_DISPATCH_FLOAT(a.dtype(), "clustered_bucket_masks", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    auto at = [](scalar_t x) { return static_cast<double>(x); };
    parallel_for(s.groups, T * c, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const scalar_t* ag = ap + g * T * c;
        double largest = 0;
        bool negative = false;
        for (int64_t i = 0; i < T; ++i) {
          negative = negative || clustered::has_negative(ag + i * c, c, at);
          if (clustered::finite_row(ag + i * c, c, at))
            largest = std::max(largest, clustered::row_sum(ag + i * c, c, at));
        }
        const double bmin = clustered::bucket_min(s.theta, largest);
        for (int64_t i = 0; i < T; ++i) out[g * T + i] = clustered::bucket_mask(ag + i * c, c, bmin, negative, at);
      }
    });
  });
}

void clustered_blocks_count(const ClusteredBlocksArgs& s, const Tensor& a, const Tensor& masks, Tensor& rblk_count,
                            Tensor& kblk_count, Tensor& row_len) {
  const int64_t nqb = blocks_of(s.queries), nkb = blocks_of(s.keys), c = a.size(2);
  int64_t* rc = rblk_count.data_ptr<int64_t>();
  int64_t* kc = kblk_count.data_ptr<int64_t>();
  int64_t* rl = row_len.data_ptr<int64_t>();
  dispatch(a, masks, s, [&](const auto& walk) {
    parallel_for(s.groups * nqb, kBlock * s.keys * c, [&](int64_t x0, int64_t x1) {
      for (int64_t x = x0; x < x1; ++x) {
        const int64_t g = x / nqb, m = x % nqb, i0 = kBlock * m, lanes = std::min(kBlock, s.queries - i0);
        int64_t n = 0, len[kBlock] = {};
        walk.query_block(g, m, [&](int64_t, int64_t bits) {
          ++n;
          for (int64_t r = 0; r < lanes; ++r) len[r] += bits >> r & 1;
        });
        rc[x] = n;
        for (int64_t r = 0; r < lanes; ++r) rl[g * s.queries + i0 + r] = len[r];
      }
    });
    parallel_for(s.groups * nkb, kBlock * s.queries * c, [&](int64_t x0, int64_t x1) {
      for (int64_t x = x0; x < x1; ++x) {
        int64_t n = 0;
        walk.key_block(x / nkb, x % nkb, [&](int64_t, int64_t) { ++n; });
        kc[x] = n;
      }
    });
  });
}

void clustered_blocks_fill(const ClusteredBlocksArgs& s, const Tensor& a, const Tensor& masks, const Tensor& rblk_ptr,
                           const Tensor& kblk_ptr, Tensor& rblk_keys, Tensor& rblk_bits, Tensor& kblk_rows,
                           Tensor& kblk_bits) {
  const int64_t nqb = blocks_of(s.queries), nkb = blocks_of(s.keys), c = a.size(2);
  const int64_t* rp = rblk_ptr.data_ptr<int64_t>();
  const int64_t* kp = kblk_ptr.data_ptr<int64_t>();
  int64_t* rk = rblk_keys.data_ptr<int64_t>();
  int64_t* rb = rblk_bits.data_ptr<int64_t>();
  int64_t* kr = kblk_rows.data_ptr<int64_t>();
  int64_t* kb = kblk_bits.data_ptr<int64_t>();
  dispatch(a, masks, s, [&](const auto& walk) {
    parallel_for(s.groups * nqb, kBlock * s.keys * c, [&](int64_t x0, int64_t x1) {
      for (int64_t x = x0; x < x1; ++x) {
        int64_t e = rp[x];
        walk.query_block(x / nqb, x % nqb, [&](int64_t j, int64_t bits) { rk[e] = j, rb[e++] = bits; });
      }
    });
    parallel_for(s.groups * nkb, kBlock * s.queries * c, [&](int64_t x0, int64_t x1) {
      for (int64_t x = x0; x < x1; ++x) {
        int64_t e = kp[x];
        walk.key_block(x / nkb, x % nkb, [&](int64_t i, int64_t bits) { kr[e] = i, kb[e++] = bits; });
      }
    });
  });
}

void exclusive_offsets(const Tensor& counts, Tensor& ptr) {
  const int64_t n = counts.numel();
  const int64_t* cnt = counts.data_ptr<int64_t>();
  int64_t* p = ptr.data_ptr<int64_t>();
  p[0] = 0;
  for (int64_t x = 0; x < n; ++x) p[x + 1] = p[x] + cnt[x];
}

}  // namespace asc::cpu
