// ListOps: the generator (LRA's generate_tree, rejection-sampled to a length window), the stack evaluator and the
// task builder. Every example is drawn from its own Philox stream, so the datasets generate lazily in get().
#include "data/listops.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/generator.h"
#include "data/generated.h"
#include "data/tasks.h"

namespace asc::data {

const std::array<const char*, kListOpsVocab> kListOpsTokenNames = {
    "<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MAX", "[MIN", "[MED", "[SM", "]"};

namespace {

using detail::GeneratedDataset;
using detail::mix64;
using detail::Stream;

// The value of operator `op` over args[0, n) (operand values 0..9, n >= 1). Sorts args in place for MED.
int apply_op(int64_t op, int* args, int n) {
  switch (op) {
    case kListOpsMax: return *std::max_element(args, args + n);
    case kListOpsMin: return *std::min_element(args, args + n);
    case kListOpsMed:
      // int(np.median(args)): the middle value, or for an even count the two middle values' mean, truncated.
      std::sort(args, args + n);
      return n % 2 == 1 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;
    case kListOpsSum: return std::accumulate(args, args + n, 0) % 10;
    default: ASC_THROW("listops: token {} is not an operator", op);
  }
}

// The longest expression max_depth / max_args allow: a full tree of operators with max_args arguments each
// (saturated at 2^62 so deep configurations do not overflow).
int64_t longest_expression(int max_depth, int max_args) {
  int64_t len = 1;  // a digit below the deepest level
  for (int d = 0; d < max_depth; ++d) {
    if (len > (int64_t{1} << 62) / max_args) return int64_t{1} << 62;
    len = 2 + max_args * len;
  }
  return len;
}

void check_options(const ListOpsOptions& o) {
  ASC_CHECK(o.max_depth >= 1 && o.max_depth <= 64, "listops: max_depth must be in [1, 64], got {}", o.max_depth);
  ASC_CHECK(o.max_args >= 2 && o.max_args <= 64, "listops: max_args must be in [2, 64], got {}", o.max_args);
  ASC_CHECK(o.leaf_prob >= 0.0 && o.leaf_prob < 1.0, "listops: leaf_prob must be in [0, 1), got {}", o.leaf_prob);
  ASC_CHECK(o.max_len >= 4, "listops: max_len must be >= 4 (the shortest expression, [MAX a b ]), got {}", o.max_len);
  ASC_CHECK(o.min_len >= 0 && o.min_len <= o.max_len, "listops: need 0 <= min_len <= max_len, got {} and {}", o.min_len,
            o.max_len);
  const int64_t longest = longest_expression(o.max_depth, o.max_args);
  ASC_CHECK(o.min_len <= longest,
            "listops: min_len {} exceeds the longest expression max_depth {} and max_args {} allow ({} tokens)",
            o.min_len, o.max_depth, o.max_args, longest);
}

// Appends one node at bracket level `level` to `out` and returns its value; gives up (overflow) as soon as `out`
// holds more than max_len tokens, so an over-long tree costs no more than max_len tokens of work.
int grow(Stream& s, const ListOpsOptions& o, int level, bool root, std::vector<int64_t>& out, bool& overflow) {
  // One 32-bit word per coin: P(leaf) = leaf_prob to within 2^-32.
  const bool leaf = !root && (level > o.max_depth || s.next() < static_cast<uint64_t>(o.leaf_prob * 4294967296.0));
  if (leaf) {
    const int v = s.below(10);
    out.push_back(kListOpsDigit0 + v);
    return v;
  }
  const int nargs = s.between(2, o.max_args);
  const int64_t op = kListOpsMax + s.below(4);
  out.push_back(op);
  std::array<int, 64> args;  // max_args <= 64
  for (int k = 0; k < nargs; ++k) {
    int& a = args[static_cast<size_t>(k)];
    a = grow(s, o, level + 1, false, out, overflow);
    if (overflow || static_cast<int64_t>(out.size()) > o.max_len) {
      overflow = true;
      return 0;
    }
  }
  out.push_back(kListOpsClose);
  return apply_op(op, args.data(), nargs);
}

}  // namespace

ListOpsExpression listops_generate(uint64_t seed, uint64_t index, const ListOpsOptions& options) {
  check_options(options);
  constexpr int kMaxTries = 100000;
  Stream s(mix64(seed ^ 0x4C4953544F5053ull /* "LISTOPS" */), index);
  ListOpsExpression e;
  e.tokens.reserve(static_cast<size_t>(std::min<int64_t>(options.max_len, 1 << 16)) + 1);
  for (int attempt = 0; attempt < kMaxTries; ++attempt) {
    e.tokens.clear();
    bool overflow = false;
    e.value = grow(s, options, 1, true, e.tokens, overflow);
    const auto len = static_cast<int64_t>(e.tokens.size());
    if (!overflow && len >= options.min_len && len <= options.max_len) return e;
  }
  ASC_THROW(
      "listops: no tree of length in [{}, {}] in {} tries (max_depth {}, max_args {}, leaf_prob {}): widen "
      "the length window",
      options.min_len, options.max_len, kMaxTries, options.max_depth, options.max_args, options.leaf_prob);
}

int listops_evaluate(const std::vector<int64_t>& tokens) {
  // Trailing pads are the loader's; a pad before a real token is malformed.
  size_t n = tokens.size();
  while (n > 0 && tokens[n - 1] == kListOpsPad) --n;
  ASC_CHECK(n > 0, "listops_evaluate: empty sequence ({} tokens, all padding)", tokens.size());
  struct Frame {
    int64_t op;
    std::vector<int> args;
  };
  std::vector<Frame> stack;  // the open operators, innermost last
  int result = -1;           // the value once the outermost expression is complete
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = tokens[i];
    ASC_CHECK(t >= 0 && t < kListOpsVocab, "listops_evaluate: token {} at position {} is not in [0, {})", t, i,
              kListOpsVocab);
    ASC_CHECK(t != kListOpsPad, "listops_evaluate: pad token at position {} before the end of the expression", i);
    ASC_CHECK(result < 0, "listops_evaluate: token '{}' at position {} follows the complete expression",
              kListOpsTokenNames[static_cast<size_t>(t)], i);
    if (t >= kListOpsMax && t <= kListOpsSum) {
      stack.push_back({t, {}});
      continue;
    }
    int value;
    if (t == kListOpsClose) {
      ASC_CHECK(!stack.empty(), "listops_evaluate: ']' at position {} closes no operator", i);
      Frame f = std::move(stack.back());
      stack.pop_back();
      ASC_CHECK(!f.args.empty(), "listops_evaluate: '{}' closed at position {} without arguments",
                kListOpsTokenNames[static_cast<size_t>(f.op)], i);
      value = apply_op(f.op, f.args.data(), static_cast<int>(f.args.size()));
    } else {
      value = static_cast<int>(t - kListOpsDigit0);
    }
    if (stack.empty())
      result = value;
    else
      stack.back().args.push_back(value);
  }
  ASC_CHECK(stack.empty(), "listops_evaluate: {} operator(s) not closed at the end ({} tokens)", stack.size(), n);
  return result;
}

std::string listops_to_string(const std::vector<int64_t>& tokens) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    ASC_CHECK(t >= 0 && t < kListOpsVocab, "listops_to_string: token {} at position {} is not in [0, {})", t, i,
              kListOpsVocab);
    if (i > 0) out += ' ';
    out += kListOpsTokenNames[static_cast<size_t>(t)];
  }
  return out;
}

std::vector<int64_t> listops_from_string(const std::string& text) {
  std::istringstream in(text);
  std::vector<int64_t> out;
  for (std::string word; in >> word;) {
    auto it = std::find_if(kListOpsTokenNames.begin(), kListOpsTokenNames.end(),
                           [&](const char* name) { return word == name; });
    ASC_CHECK(it != kListOpsTokenNames.end(),
              "listops_from_string: unknown token '{}' (known: <pad>, 0-9, [MAX, [MIN, [MED, [SM, ])", word);
    out.push_back(it - kListOpsTokenNames.begin());
  }
  return out;
}

Task listops_task(const TaskOptions& options) {
  ListOpsOptions lo;
  if (options.min_len > 0) lo.min_len = options.min_len;
  if (options.max_len > 0) lo.max_len = options.max_len;
  check_options(lo);
  const int64_t sizes[3] = {options.train_size > 0 ? options.train_size : 96000,
                            options.val_size > 0 ? options.val_size : 2000,
                            options.test_size > 0 ? options.test_size : 2000};
  std::shared_ptr<const Dataset> splits[3];
  for (uint64_t split = 0; split < 3; ++split) {
    // Each split has its own stream key, so the splits never share an expression stream.
    const uint64_t seed = mix64(options.seed) + split;
    splits[split] = std::make_shared<GeneratedDataset>(sizes[split], [seed, lo](int64_t i) {
      ListOpsExpression e = listops_generate(seed, static_cast<uint64_t>(i), lo);
      const auto T = static_cast<int64_t>(e.tokens.size());
      return Example{.input = tensor(e.tokens, {T}), .label = e.value, .groups = {}};  // input (T) int64
    });
  }
  Task task;
  task.name = "listops";
  task.train = splits[0];
  task.val = splits[1];
  task.test = splits[2];
  task.vocab = kListOpsVocab;
  task.classes = 10;
  task.max_len = lo.max_len;
  task.pad_id = kListOpsPad;
  for (int v = 0; v < 10; ++v) task.class_names.push_back(std::to_string(v));
  task.description = fmt::format(
      "ListOps (LRA rules): generated expressions of MAX/MIN/MED/SM over digits, {}..{} tokens, depth <= {}, <= {} "
      "arguments; label = value 0-9; {} / {} / {} examples (seed {})",
      lo.min_len, lo.max_len, lo.max_depth, lo.max_args, sizes[0], sizes[1], sizes[2], options.seed);
  return task;
}

}  // namespace asc::data
