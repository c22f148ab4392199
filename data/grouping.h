#pragma once
// The synthetic grouping task: tokens belong to latent groups, and the label needs the groups — for interpretability
// metrics (does an attention head's top-k neighbourhood of a token follow its true group?).
//
//   asc::data::GroupingOptions opts;                                        // G = 4 groups, V = 64 tokens, T = 64
//   auto vocab = asc::data::grouping_vocabulary(/*seed=*/1, opts);          // vocab.token_group, vocab.latents
//   auto seq = asc::data::grouping_sequence(vocab, /*seed=*/1, /*index=*/0, opts);
//   // seq.tokens (T) ids, seq.groups (T) their groups, seq.label = the group holding the most tokens
//
// The vocabulary (one per seed, shared by every split):
//   centres   G centres in a latent_dim-dimensional space, each coordinate centre_scale * z
//   groups    token v's group: a seeded shuffle of [0, 1, .., G-1, 0, 1, ..] (V / G tokens per group, the first
//             V mod G groups one more), so neighbouring ids say nothing about groups
//   latents   token v's vector: its group's centre + spread * z per coordinate
// where z is an approximate standard normal: the sum of 12 uniforms minus 6 (Irwin-Hall; exact IEEE arithmetic, so
// the same bits on every machine, unlike a libm-based normal). The sequences below do not read the latents: they
// are ground truth for metrics (e.g. compare a model's token embeddings or attention neighbourhoods with them).
//
// A sequence: k groups drawn without replacement (k uniform in [min_groups, max_groups]), then each of the T
// positions draws one of the k groups uniformly and a token of that group uniformly. label = the group holding the
// most positions. Ties are avoided by construction: a sequence whose two largest counts are equal is rejected and
// redrawn from the same stream, so every label is unambiguous.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace asc::data {

struct GroupingOptions {
  int64_t groups = 4;         // G, >= 2; also the number of classes
  int64_t vocab = 64;         // V, >= G: token ids 0..V-1 (no pad id: every sequence has length seq_len)
  int64_t seq_len = 64;       // T, >= 2
  int64_t latent_dim = 16;    // d
  int64_t min_groups = 2;     // k, the number of groups mixed in one sequence: uniform in [min_groups, max_groups],
  int64_t max_groups = 3;     // 1 <= min_groups <= max_groups <= G
  double centre_scale = 4.0;  // spread of the centres
  double spread = 1.0;        // spread of the tokens around their centre
};

struct GroupingVocabulary {
  std::vector<int64_t> token_group;  // (V) the group of each token id
  Tensor centres;                    // (G, d) float32
  Tensor latents;                    // (V, d) float32, row v = token v's latent vector
};

struct GroupingSequence {
  std::vector<int64_t> tokens;  // (T) token ids
  std::vector<int64_t> groups;  // (T) each token's group
  int64_t label = 0;            // the group holding the most tokens (a unique maximum)
};

// The vocabulary of `seed` (the task built with TaskOptions::seed = s uses grouping_vocabulary(s, options)).
// Bad options are an asc::Error.
GroupingVocabulary grouping_vocabulary(uint64_t seed, const GroupingOptions& options = {});
// Sequence `index` of the stream `seed` over `vocab` (built with the same options; a pure function of its arguments).
GroupingSequence grouping_sequence(const GroupingVocabulary& vocab, uint64_t seed, uint64_t index,
                                   const GroupingOptions& options = {});

}  // namespace asc::data
