#pragma once
// Sparse attention over an explicit pattern (docs/asam.md §1-2): every query attends only to the keys its pattern
// allows, with a softmax normalised over those keys. The pattern is a compressed sparse row list of key indices
// per query — never an n × n matrix — so time and memory are O(attended pairs), and the kernels (ops/kernel_list.inc:
// sparse_attention_*) walk those lists with the scores of one row alive at a time:
//
//   asc::SparsePattern p = asc::pattern_union({asc::local_window_pattern(T, 256, /*causal=*/true),
//                                              asc::global_tokens_pattern(T, 4, true),
//                                              asc::random_keys_pattern(T, 8, /*seed=*/1, true)});
//   asc::Tensor o = asc::sparse_attention(q, k, v, p, valid);     // q (B, H, T, D), k/v (B, H, S, D) -> (B, H, T, D)
//
// The patterns (each builder documents exactly which pairs it allows; causal builders keep only keys j <= i):
//   local_window_pattern   |i - j| <= w / 2;  causal: i - w < j <= i                            w keys
//   strided_pattern        (i - j) mod s == 0                                                    n / s keys
//   global_tokens_pattern  j < g (every query sees the first g tokens), and the rows i < g see every key
//   random_keys_pattern    r keys per query drawn without replacement from a seeded generator     r keys
//   hierarchical_pattern   the query's own block of b tokens, plus one summary column per other block (keys T + m)
//   clustered_pattern      a_i · a_j > θ for soft assignments a (B, H, T, c), found by bucketing; one list per
//                          (batch, head)
//   clustered_union        a pattern united with the clustered one, built on a's device (on CUDA by kernels)
//   pattern_union          the union of patterns: a key allowed by several counts once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_types.h"  // SparsePatternView

namespace asc {

// Per-query key lists, CSR. Row r = g · queries + i holds cols[row_ptr[r] .. row_ptr[r + 1]), ascending, without
// duplicates, each in [0, keys). groups == 1: one pattern for every (batch, head); otherwise groups == B · H and
// (b, h) reads group b · H + h. The transpose (for the backward's per-key sums) is built once with the pattern.
//
// A pattern is immutable and always valid: from_rows (which every builder goes through) checks the sizes (each
// >= 1, keys < 2^31, every product of them representable) and every index before anything is built, and nothing
// can edit the lists afterwards — the accessors below return copies, and the kernels read through const pointers.
// Copies of a pattern share its (read-only) lists, and the tile plans the CPU kernels derive from them and keep: made
// on the first call without padding (1-1.5 bytes per attended pair of a group for the built-in patterns, beside the
// lists' 24), and the last ones made with padding, with the key_keep they are for (the same per batch row). The
// default-constructed pattern is the empty one (defined() false): the op refuses it with a clear error.
//
// A pattern built on a CUDA device by clustered_union holds the block view only (has_lists() false): the CUDA
// kernels read nothing else. Whatever asks for its lists (row, dense_mask, row_ptr, cols, the transpose, to(cpu))
// gets them derived on the host from the view, checked as `to` checks lists.
class SparsePattern {
 public:
  // The block view the CUDA kernels tile by: the same pairs, grouped so that a thread block loads a tile of keys (or
  // queries) into shared memory once for several rows. Built from the lists when the pattern moves to a CUDA device
  // (`to`); absent on the CPU, whose kernels walk the rows.
  //   query blocks  rows [16 m, 16 m + 16) of a group: the ascending union of their keys, and per union key a bit
  //                 per row of the block (bit r: row 16 m + r attends the key)
  //   key blocks    keys [16 m, 16 m + 16) of a group: the ascending union of the queries that see them, and per
  //                 union query a bit per key of the block (bit c: the query attends key 16 m + c)
  static constexpr int64_t kRowBlock = SparsePatternView::kRowBlock, kKeyBlock = SparsePatternView::kKeyBlock;
  // The largest key count (the block view's and the CUDA kernels' indices are 32-bit safe below it).
  static constexpr int64_t kMaxKeys = (int64_t{1} << 31) - 1;

  SparsePattern() = default;  // the empty pattern
  // Builds (and checks) a pattern from per-row lists (groups · queries of them); each list is sorted and
  // deduplicated here. Throws asc::Error, before allocating anything sized by the arguments, when a size is < 1, keys
  // exceeds kMaxKeys, groups · queries or groups · keys overflows, the number of lists differs from groups ·
  // queries, or an index lies outside [0, keys).
  static SparsePattern from_rows(int64_t groups, int64_t queries, int64_t keys, std::vector<std::vector<int64_t>> rows);

  bool defined() const { return row_ptr_.defined() || rblk_ptr_.defined(); }
  bool has_lists() const { return row_ptr_.defined(); }
  int64_t groups() const { return groups_; }    // 0 for the empty pattern
  int64_t queries() const { return queries_; }  // T
  int64_t keys() const { return keys_; }        // S: T, plus summary columns for hierarchical patterns
  // Allowed (query, key) pairs over all groups, and the longest row. A pattern that clustered_union built on a device
  // without reading anything back counted both there: the first call reads them (a synchronisation), later ones
  // do not.
  int64_t nnz() const;
  int64_t max_row() const;
  Device device() const {
    return has_lists() ? row_ptr_.device() : rblk_ptr_.defined() ? rblk_ptr_.device() : Device::cpu();
  }
  bool has_block_view() const { return rblk_ptr_.defined(); }
  std::vector<int64_t> row(int64_t group, int64_t i) const;
  // The pattern as a bool mask (groups, T, S), for tests and small n only: this is the n × n matrix the kernels avoid.
  Tensor dense_mask() const;
  // The same pattern on another device (the CSR tensors copied, and to a CUDA device with the block view built;
  // a pattern already there is returned as is). The lists are checked again on the way (they are being copied
  // anyway), so no path builds a pattern that was not checked. A pattern without lists gets them on the CPU
  // (derived from its block view, at every call: keep the result), and keeps only its view on another CUDA device.
  // A CPU pattern keeps its last CUDA copy (shared by its copies, freed with the last of them): sparse_attention on
  // CUDA tensors with a CPU pattern moves it once, not at every call.
  SparsePattern to(Device device) const;

  // Copies of the lists, on the pattern's device (int64): editing one cannot change the pattern. (A pattern without
  // lists derives them on the host first.)
  Tensor row_ptr() const;   // (groups · T + 1)
  Tensor cols() const;      // (nnz)
  Tensor col_ptr() const;   // (groups · S + 1): the transpose
  Tensor col_rows() const;  // (nnz): for each entry of the transpose, its query row i
  Tensor col_pos() const;   // (nnz): and its position in cols (where the forward's pair lives)
  Tensor rblk_ptr() const;  // (groups · ceil(T / 16) + 1); undefined without a block view
  Tensor rblk_keys() const;
  Tensor rblk_bits() const;
  Tensor kblk_ptr() const;  // (groups · ceil(S / 8) + 1)
  Tensor kblk_rows() const;
  Tensor kblk_bits() const;

  // For the kernels (ops/kernel_types.h): read-only pointers into the pattern's own lists, on its device (valid while
  // a copy of the pattern lives). lists() and view() refuse the empty pattern, lists() a pattern without lists,
  // block_view() a pattern without a block view; view() carries what the pattern has of both. The transpose (col_*) is
  // made the first time something asks for it — lists() with transpose = true, col_ptr() and the others, a move to a
  // device — and kept for every copy: only the single-(batch, head) CPU backward and the CUDA block view read it, so a
  // pattern made per call (ASAM's clustered part) need not build it. Without it, lists' col_* pointers are null.
  using Lists = SparsePatternLists;
  using BlockView = SparsePatternBlocks;
  Lists lists(bool transpose = false) const;
  BlockView block_view() const;
  SparsePatternView view(bool transpose = false) const;

 private:
  // every invariant above, on CPU lists and the transpose given
  void check_lists(const char* who, const Tensor& t_ptr, const Tensor& t_rows, const Tensor& t_pos) const;
  // The pattern of CSR lists whose rows are already sorted, free of repeats and within [0, keys), sizes checked
  // (from_rows, pattern_union): counts the entries (the transpose is made when first asked for).
  static SparsePattern from_csr(int64_t groups, int64_t queries, int64_t keys, Tensor row_ptr, Tensor cols);
  // A pattern of its block view alone (clustered_union's kernels made it; nnz and max_row counted with it).
  static SparsePattern from_block_view(int64_t groups, int64_t queries, int64_t keys, int64_t nnz, int64_t max_row,
                                       Tensor rblk_ptr, Tensor rblk_keys, Tensor rblk_bits, Tensor kblk_ptr,
                                       Tensor kblk_rows, Tensor kblk_bits);
  // What a view built on a device without a read back knows only there: (4) int64 = the query and key sides' entries
  // (the view's tensors may be longer: allocated for the most there can be), the pairs, the longest row. Read once.
  struct DeviceCounts {
    std::once_flag once;
    Tensor counts;
    int64_t rblk_used = 0, kblk_used = 0, nnz = 0, max_row = 0;
  };
  const DeviceCounts* device_counts() const;  // null when the sizes are known on the host; else read (once)
  // The lists of a pattern that has only its block view, on the CPU, derived and checked there.
  SparsePattern lists_from_view() const;
  // Builds the block view from CPU lists and their transpose (to a CUDA device, or for clustered_union's CPU kernels).
  void build_block_view(const Tensor& col_ptr, const Tensor& col_rows);
  friend SparsePattern pattern_union(const std::vector<SparsePattern>& patterns);
  friend SparsePattern clustered_pattern(const Tensor& a, double theta, bool causal);
  friend SparsePattern clustered_union(const SparsePattern& base, const Tensor& a, double theta, bool causal,
                                       bool with_block_view);
  // The transpose, shared by copies: made once (from the CPU lists), or given by `to` on a device.
  struct Transpose {
    std::once_flag once;
    Tensor col_ptr, col_rows, col_pos;
  };
  const Transpose& transposed() const;

  int64_t groups_ = 0, queries_ = 0, keys_ = 0, nnz_ = 0, max_row_ = 0;
  Tensor row_ptr_, cols_;
  std::shared_ptr<Transpose> transpose_;
  std::shared_ptr<DeviceCounts> counts_;  // set only while the sizes live on the device
  Tensor rblk_ptr_, rblk_keys_, rblk_bits_, kblk_ptr_, kblk_rows_, kblk_bits_;
  // What the kernels derive from the lists and keep (the CPU tile plans), shared by copies: the lists never change.
  std::shared_ptr<SparsePatternCache> cache_;
};

// The builders' arguments (docs/asam.md, "Accepted options"): T in [1, 2^30); w, s, r, b >= 1 and g >= 0, each with
// a clear asc::Error otherwise. Values past what the sequence can use are clamped, never overflowed: w > T is the
// full window, s >= T leaves each query its own key, g >= T makes every token global, r >= the row's candidates takes
// them all (as a causal row already takes min(r, i + 1)), b >= T is one block — so INT64_MAX is accepted for each.
SparsePattern local_window_pattern(int64_t T, int64_t w, bool causal);
SparsePattern strided_pattern(int64_t T, int64_t s, bool causal);
SparsePattern global_tokens_pattern(int64_t T, int64_t g, bool causal);
// Keys drawn from a Philox stream of `seed` (the same seed gives the same pattern); row i draws min(r, m) keys from
// its m candidates ([0, T), causal: [0, i]).
SparsePattern random_keys_pattern(int64_t T, int64_t r, uint64_t seed, bool causal);
// Blocks [m b, (m + 1) b) for m < nb = ceil(T / b); the pattern has keys = T + nb, summary m being key T + m. Query
// i sees its own block (causal: j <= i within it) and the summaries of the other blocks (causal: only earlier ones,
// m < i / b: a summary that contains future tokens would leak them).
SparsePattern hierarchical_pattern(int64_t T, int64_t b, bool causal);
// nb = ceil(T / b) without overflow (T >= 1, b >= 1, else asc::Error).
int64_t hierarchical_blocks(int64_t T, int64_t b);
// The summary columns of a hierarchical pattern: x (B, H, T, d) averaged over each block of b tokens, counting only
// real tokens (key_keep (B, T) bool; undefined: all real). means (B, H, nb, d) go after the keys (and values), kept
// (B, nb) after key_keep: a block with no real token is itself padding. Differentiable in x.
struct BlockMeans {
  Tensor means, kept;
};
BlockMeans hierarchical_summaries(const Tensor& x, int64_t b, const Tensor& key_keep = {});
// The keys (or values) a hierarchical pattern reads: x (B, H, T, d) followed along dim 2 by its nb summary columns,
// (B, H, T + nb, d) — cat({x, hierarchical_summaries(x, b, key_keep).means}, 2), the same values up to the last bits
// of the means (summed in float64 here). On the CPU (float32, float64) in one pass over x and one over the gradient
// (ops/cpu/hierarchical_keys.h) instead of the composition's seven ops, which other devices and dtypes run.
// Differentiable in x.
//   Tensor ks = hierarchical_keys(k, b, keep), vs = hierarchical_keys(v, b, keep);
//   Tensor y = sparse_attention(q, ks, vs, hierarchical_pattern(T, b, false), hierarchical_keep(keep, b));
Tensor hierarchical_keys(const Tensor& x, int64_t b, const Tensor& key_keep = {});
// The key mask of hierarchical_keys' rows: key_keep (B, T) followed by (B, nb), a block with no real token being
// itself padding (BlockMeans::kept).
Tensor hierarchical_keep(const Tensor& key_keep, int64_t b);
// a (B, H, T, c) rows summing to 1 (the soft assignments), any float dtype, on any device (read on the CPU). Query i
// sees key j when Σ_m a_im a_jm > θ (causal: and j <= i). Bucketing: i joins bucket m when a_im > θ / 2 (so at most
// 2 / θ buckets); only pairs sharing a bucket are tested, which misses none: the terms with a_im <= θ/2 or
// a_jm <= θ/2 add up to at most θ/2 Σ_m a_jm + θ/2 Σ_m a_im = θ, so a pair above θ has a term with both factors
// above θ / 2. Cost Σ_m |bucket_m|² · c. groups = B · H.
SparsePattern clustered_pattern(const Tensor& a, double theta, bool causal);
// Same T for all; keys = the largest; groups 1 and B·H mix (a shared pattern joins every group).
SparsePattern pattern_union(const std::vector<SparsePattern>& patterns);
// base ∪ the clustered pattern of a (B, H, T, c), on a's device: the pairs (i, j), j < T, with Σ_m a_im a_jm > θ
// (causal: j <= i), the sums made as clustered_pattern makes them, and every pair of base. A row of a with a
// non-finite entry joins only (i, i), so its NaN reaches its own output, no other row's list. base: T queries,
// keys >= T (a hierarchical base's summary columns stay base-only), 1 or B·H groups; the result has B·H groups and
// base's keys; θ finite >= 0, else asc::Error. a may hold any values; its buckets (clustered_pattern's bound) assume
// entries >= 0, as softmax rows are: a (sample, head) with a negative entry has every pair tested.
//   CPU: clustered_pattern's bucket walk and pattern_union, CSR lists (with a negative entry: the CPU kernels below,
//   the lists derived from their view).
//   CUDA: kernels (ops/kernel_list.inc: clustered_bucket_masks, clustered_blocks_count, exclusive_offsets,
//   clustered_blocks_fill) look at every pair, test those that share a bucket, and write the block view straight away
//   — no copy of a to the host, no lists, no block view built on the host. Nothing is read back where the most
//   entries the view can have (B·H · (ceil(T / 16) · S + ceil(S / 16) · T), 16 bytes each) fit 64 MiB: the view's
//   lists are allocated for that many (held while the pattern lives: a layer's until its backward), and nnz(),
//   max_row() and the view's accessors read the counts when first asked — on the calling thread's current stream,
//   as any read of a tensor; else one read of four numbers sizes them. O(B · H · T · S) mask tests and
//   O(pairs sharing a bucket · c) sums.
//   with_block_view (CPU tensors): the CPU kernels of the same walk build the block view instead (the CUDA kernels'
//   reference; lists are derived from the view when asked for).
SparsePattern clustered_union(const SparsePattern& base, const Tensor& a, double theta, bool causal,
                              bool with_block_view = false);
namespace detail {
// The most bytes clustered_union may allocate on CUDA for a view it does not size by a read back (default 64 MiB);
// tests set 0 to take the read-back path.
int64_t clustered_view_budget();
void set_clustered_view_budget(int64_t bytes);
}  // namespace detail

// o_i = Σ_{j ∈ P(i), kept} softmax_j(q_i · k_j · scale) v_j;  q (B, H, T, D), k and v (B, H, S, D), S = pattern.keys,
// one float dtype and device; key_keep (B, S) bool (false = padding) or undefined; scale 0 means 1/√D. A query
// with no kept key outputs 0 (and passes no gradient); any other row is computed in IEEE arithmetic, so a NaN in
// its query, or in a key or value it attends, makes the row NaN (a padding key's values are never read). Every
// check runs here, before a backend is chosen: the CPU and CUDA kernels see the same validated inputs. Differentiable
// in q, k and v: the backward recomputes each row's probabilities from the saved log-sum-exp, writes dq per row, then
// sums dk and dv per key over the transpose (no atomics, no n × n).
Tensor sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                        const Tensor& key_keep = {}, double scale = 0);
// The readable reference: the pattern's dense mask and the composed attention ops (matmul, masked softmax,
// matmul). O(T · S) memory: for tests and small n.
Tensor sparse_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const SparsePattern& pattern,
                                  const Tensor& key_keep = {}, double scale = 0);

}  // namespace asc
