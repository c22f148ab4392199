// The synthetic grouping task: the latent vocabulary, the sequences and the task builder. Every sequence is drawn
// from its own Philox stream, so the datasets generate lazily in get().
#include "data/grouping.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/generator.h"
#include "data/generated.h"
#include "data/tasks.h"

namespace asc::data {
namespace {

using detail::GeneratedDataset;
using detail::mix64;
using detail::Stream;

constexpr uint64_t kVocabTag = 0x564F434142ull, kSequenceTag = 0x47524F5550ull;  // "VOCAB", "GROUP"

void check_options(const GroupingOptions& o) {
  ASC_CHECK(o.groups >= 2 && o.groups <= 4096, "grouping: groups must be in [2, 4096], got {}", o.groups);
  ASC_CHECK(o.vocab >= o.groups && o.vocab <= (int64_t{1} << 24),
            "grouping: vocab must be in [groups = {}, 2^24] (each group needs a token), got {}", o.groups, o.vocab);
  ASC_CHECK(o.seq_len >= 2 && o.seq_len <= (int64_t{1} << 24), "grouping: seq_len must be in [2, 2^24], got {}",
            o.seq_len);
  ASC_CHECK(o.latent_dim >= 1 && o.latent_dim <= 65536, "grouping: latent_dim must be in [1, 65536], got {}",
            o.latent_dim);
  ASC_CHECK(o.min_groups >= 1 && o.min_groups <= o.max_groups && o.max_groups <= o.groups,
            "grouping: need 1 <= min_groups <= max_groups <= groups = {}, got min_groups {} max_groups {}", o.groups,
            o.min_groups, o.max_groups);
  ASC_CHECK(o.centre_scale >= 0.0 && o.spread >= 0.0, "grouping: centre_scale and spread must be >= 0, got {} and {}",
            o.centre_scale, o.spread);
}

}  // namespace

GroupingVocabulary grouping_vocabulary(uint64_t seed, const GroupingOptions& o) {
  check_options(o);
  Stream s(mix64(seed ^ kVocabTag), 0);
  const int64_t G = o.groups, V = o.vocab, d = o.latent_dim;
  GroupingVocabulary out;
  // Balanced groups, shuffled (Fisher-Yates) so ids carry no group.
  out.token_group.resize(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) out.token_group[static_cast<size_t>(v)] = v % G;
  for (int64_t v = V - 1; v > 0; --v)
    std::swap(out.token_group[static_cast<size_t>(v)], out.token_group[static_cast<size_t>(s.below(v + 1))]);
  std::vector<double> centres(static_cast<size_t>(G * d));  // (G, d)
  for (double& c : centres) c = o.centre_scale * s.normal();
  std::vector<float> latents(static_cast<size_t>(V * d));  // (V, d)
  for (int64_t v = 0; v < V; ++v)
    for (int64_t j = 0; j < d; ++j)
      latents[static_cast<size_t>(v * d + j)] = static_cast<float>(
          centres[static_cast<size_t>(out.token_group[static_cast<size_t>(v)] * d + j)] + o.spread * s.normal());
  out.centres = tensor(std::vector<float>(centres.begin(), centres.end()), {G, d});
  out.latents = tensor(latents, {V, d});
  return out;
}

GroupingSequence grouping_sequence(const GroupingVocabulary& vocab, uint64_t seed, uint64_t index,
                                   const GroupingOptions& o) {
  check_options(o);
  const int64_t G = o.groups, V = o.vocab, T = o.seq_len;
  ASC_CHECK(static_cast<int64_t>(vocab.token_group.size()) == V,
            "grouping_sequence: the vocabulary has {} tokens, options say vocab = {}", vocab.token_group.size(), V);
  // The tokens of each group, in id order.
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(G));
  for (int64_t v = 0; v < V; ++v) {
    const int64_t g = vocab.token_group[static_cast<size_t>(v)];
    ASC_CHECK(g >= 0 && g < G, "grouping_sequence: token {} has group {}, outside [0, {})", v, g, G);
    members[static_cast<size_t>(g)].push_back(v);
  }
  for (int64_t g = 0; g < G; ++g)
    ASC_CHECK(!members[static_cast<size_t>(g)].empty(), "grouping_sequence: group {} has no token", g);

  Stream s(mix64(seed ^ kSequenceTag), index);
  constexpr int kMaxTries = 10000;
  GroupingSequence out;
  out.tokens.resize(static_cast<size_t>(T));
  out.groups.resize(static_cast<size_t>(T));
  std::vector<int64_t> order(static_cast<size_t>(G)), count(static_cast<size_t>(G));
  for (int attempt = 0; attempt < kMaxTries; ++attempt) {
    // k distinct groups: the first k of a partial Fisher-Yates shuffle.
    const int64_t k = s.between(o.min_groups, o.max_groups);
    for (int64_t g = 0; g < G; ++g) order[static_cast<size_t>(g)] = g;
    for (int64_t i = 0; i < k; ++i)
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(s.between(i, G - 1))]);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = order[static_cast<size_t>(s.below(k))];
      const auto& m = members[static_cast<size_t>(g)];
      out.groups[static_cast<size_t>(t)] = g;
      out.tokens[static_cast<size_t>(t)] = m[static_cast<size_t>(s.below(static_cast<int64_t>(m.size())))];
      ++count[static_cast<size_t>(g)];
    }
    // The label is the unique largest count; a tie for the largest is redrawn.
    const int64_t best = std::max_element(count.begin(), count.end()) - count.begin();
    const bool tie = std::count(count.begin(), count.end(), count[static_cast<size_t>(best)]) > 1;
    if (tie) continue;
    out.label = best;
    return out;
  }
  ASC_THROW(
      "grouping_sequence: every one of {} draws tied for the largest group (seq_len {}, groups per sequence "
      "{}..{})",
      kMaxTries, T, o.min_groups, o.max_groups);
}

Task grouping_task(const TaskOptions& options) {
  GroupingOptions go;
  // Sequences have one length T: max_len (or min_len) sets it; both must then agree.
  ASC_CHECK(options.min_len == 0 || options.max_len == 0 || options.min_len == options.max_len,
            "grouping: sequences have one length; min_len and max_len must be equal (or 0), got {} and {}",
            options.min_len, options.max_len);
  if (options.max_len > 0)
    go.seq_len = options.max_len;
  else if (options.min_len > 0)
    go.seq_len = options.min_len;
  check_options(go);
  const auto vocab = std::make_shared<const GroupingVocabulary>(grouping_vocabulary(options.seed, go));
  const int64_t sizes[3] = {options.train_size > 0 ? options.train_size : 8000,
                            options.val_size > 0 ? options.val_size : 1000,
                            options.test_size > 0 ? options.test_size : 1000};
  std::shared_ptr<const Dataset> splits[3];
  for (uint64_t split = 0; split < 3; ++split) {
    const uint64_t seed = mix64(options.seed) + split;  // each split its own stream key
    splits[split] = std::make_shared<GeneratedDataset>(sizes[split], [seed, go, vocab](int64_t i) {
      GroupingSequence q = grouping_sequence(*vocab, seed, static_cast<uint64_t>(i), go);
      return Example{.input = tensor(q.tokens, {go.seq_len}),  // (T) int64 token ids
                     .label = q.label,
                     .groups = tensor(q.groups, {go.seq_len})};  // (T) int64 true groups
    });
  }
  Task task;
  task.name = "grouping";
  task.train = splits[0];
  task.val = splits[1];
  task.test = splits[2];
  task.vocab = go.vocab;
  task.classes = go.groups;
  task.max_len = go.seq_len;
  task.pad_id = 0;  // never used: every sequence has seq_len tokens (id 0 is a real token)
  for (int64_t g = 0; g < go.groups; ++g) task.class_names.push_back(fmt::format("group {}", g));
  task.description = fmt::format(
      "grouping: {} tokens in {} latent groups ({}-d), sequences of {} tokens mixing {}..{} groups; label = the group "
      "holding the most tokens (no ties); {} / {} / {} examples (seed {})",
      go.vocab, go.groups, go.latent_dim, go.seq_len, go.min_groups, go.max_groups, sizes[0], sizes[1], sizes[2],
      options.seed);
  return task;
}

}  // namespace asc::data
