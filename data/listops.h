#pragma once
// ListOps (Nangia & Bowman 2018, with the Long Range Arena rules of Tay et al. 2020): nested prefix expressions over
// the digits 0-9 whose value (0-9) is the label.
//
//   auto e = asc::data::listops_generate(/*seed=*/1, /*index=*/0, {.min_len = 20, .max_len = 100});
//   asc::data::listops_to_string(e.tokens);    // "[MAX 2 9 [MIN 4 7 ] 0 ]"
//   asc::data::listops_evaluate(e.tokens);     // == e.value (9), computed again from the tokens alone
//
// Operators (each takes 2..max_args arguments, digits or nested expressions):
//   MAX  the largest argument          MIN  the smallest
//   MED  the median: for an even count the mean of the two middle values, truncated (LRA's int(np.median(args)):
//        [MED 1 2 ] = 1, [MED 3 4 6 9 ] = 5)
//   SM   the sum modulo 10
//
// Generation (LRA's generate_tree): a node at bracket level d (the root operator opens level 1) is a digit with
// probability leaf_prob (0.25 of the time an operator), always a digit when d > max_depth; an operator draws its
// argument count uniformly in [2, max_args] and its operator uniformly from the four. The root is always an
// operator (LRA's root can be a digit, a length-1 sequence its length bound rejects anyway). Trees whose token count
// lies outside [min_len, max_len] are rejected and drawn again from the same stream, so an example is a pure
// function of (seed, index, options): data can be generated lazily, in any order, from any thread.
//
// Tokens: a fixed vocabulary of 16 ids (kListOpsVocab). LRA writes the expression with parentheses around each
// partial application, `( ( [MAX 2 ) 9 ) ]`, and its tokeniser keeps them; we emit no parentheses (they carry no
// information: the bracketed prefix form is unambiguous), so lengths count operators, digits and `]` only — the
// quantity LRA's length bounds count too.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace asc::data {

// The token ids. Digit v is id kListOpsDigit0 + v.
inline constexpr int64_t kListOpsPad = 0;
inline constexpr int64_t kListOpsDigit0 = 1;  // ids 1..10: digits 0..9
inline constexpr int64_t kListOpsMax = 11;    // "[MAX"
inline constexpr int64_t kListOpsMin = 12;    // "[MIN"
inline constexpr int64_t kListOpsMed = 13;    // "[MED"
inline constexpr int64_t kListOpsSum = 14;    // "[SM"
inline constexpr int64_t kListOpsClose = 15;  // "]"
inline constexpr int64_t kListOpsVocab = 16;
// The spelling of each id (index = id): "<pad>", "0".."9", "[MAX", "[MIN", "[MED", "[SM", "]".
extern const std::array<const char*, kListOpsVocab> kListOpsTokenNames;

struct ListOpsOptions {
  int64_t min_len = 500;  // token count bounds, inclusive (LRA: 500..2000)
  int64_t max_len = 2000;
  int max_depth = 10;       // most nested brackets around any token, >= 1
  int max_args = 10;        // most arguments of one operator, >= 2
  double leaf_prob = 0.75;  // probability that a non-root node within max_depth is a digit (LRA: 1 - VALUE_P = 0.75)
};

struct ListOpsExpression {
  std::vector<int64_t> tokens;  // (T) ids, min_len <= T <= max_len, no padding
  int value = 0;                // the expression's value, 0..9
};

// Expression `index` of the stream `seed` (a pure function of its arguments). Bad options (max_len < 4, the
// smallest expression `[OP a b ]`; min_len beyond the longest tree max_depth / max_args allow; max_depth < 1;
// max_args < 2; leaf_prob outside [0, 1)) are an asc::Error, as is a length window so narrow that 100000 trees miss
// it.
ListOpsExpression listops_generate(uint64_t seed, uint64_t index, const ListOpsOptions& options = {});

// The value of a token sequence, parsed with an explicit stack (independent of the generator's tree). Trailing pad
// tokens are ignored. A malformed sequence (unknown id, `]` without an operator, an operator without arguments,
// an unclosed operator, tokens after the complete expression, an empty sequence) is an asc::Error naming the
// position.
int listops_evaluate(const std::vector<int64_t>& tokens);

// "[MAX 2 9 [MIN 4 7 ] 0 ]": the tokens' names joined by spaces (pads as "<pad>"); unknown ids are an asc::Error.
std::string listops_to_string(const std::vector<int64_t>& tokens);
// The inverse: whitespace-separated names ("[MAX", "9", "]", "<pad>") to ids; unknown names are an asc::Error.
std::vector<int64_t> listops_from_string(const std::string& text);

}  // namespace asc::data
