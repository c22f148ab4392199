// The generated tasks (data/listops.h, data/pathfinder.h, data/grouping.h): ListOps labels against the stack
// evaluator and a recursive evaluator written here, hand-written expressions, the length / depth / argument bounds;
// Pathfinder labels against an 8-connected flood fill of the undashed rendering, the count of separate paths, dashed
// vs undashed; grouping labels recounted here; determinism; the Task fields; bad input.
#include <bit>
#include <map>
#include <set>
#include <thread>

#include "data/grouping.h"
#include "data/listops.h"
#include "data/pathfinder.h"
#include "data/tasks.h"
#include "testing.h"
using namespace asc;
using namespace asc::data;

namespace {

// ---- ListOps -------------------------------------------------------------------------------------------------------

// A recursive-descent evaluator, independent of both the generator and listops_evaluate's stack. MED is computed as
// numpy does (the middle value, or the mean of the two middle values as a real) and then truncated as LRA's int().
// Also records the structure: the deepest bracket nesting and the smallest / largest argument count.
struct Parsed {
  int value;
  int depth = 0, min_args = 1 << 30, max_args = 0;
};
int eval_rec(const std::vector<int64_t>& t, size_t& pos, int level, Parsed& info) {
  REQUIRE(pos < t.size());
  const int64_t tok = t[pos++];
  if (tok >= kListOpsDigit0 && tok < kListOpsDigit0 + 10) return static_cast<int>(tok - kListOpsDigit0);
  REQUIRE((tok >= kListOpsMax && tok <= kListOpsSum));
  info.depth = std::max(info.depth, level);
  std::vector<int> args;
  while (pos < t.size() && t[pos] != kListOpsClose) args.push_back(eval_rec(t, pos, level + 1, info));
  REQUIRE(pos < t.size());
  ++pos;  // the ']'
  info.min_args = std::min(info.min_args, static_cast<int>(args.size()));
  info.max_args = std::max(info.max_args, static_cast<int>(args.size()));
  std::sort(args.begin(), args.end());
  int sum = 0;
  for (int a : args) sum += a;
  const size_t n = args.size();
  if (tok == kListOpsMax) return args.back();
  if (tok == kListOpsMin) return args.front();
  if (tok == kListOpsSum) return sum % 10;
  const double median = n % 2 ? args[n / 2] : 0.5 * (args[n / 2 - 1] + args[n / 2]);
  return static_cast<int>(median);  // truncation toward zero, as Python's int()
}
Parsed parse(const std::vector<int64_t>& t) {
  Parsed info{};
  size_t pos = 0;
  info.value = eval_rec(t, pos, 1, info);
  CHECK(pos == t.size());
  return info;
}

int eval_text(const std::string& s) { return listops_evaluate(listops_from_string(s)); }

// ---- Pathfinder ----------------------------------------------------------------------------------------------------

// The 8-connected components of the non-zero pixels: a component id per pixel (-1 for background) and their count.
std::pair<std::vector<int>, int> components(const PathfinderSample& p) {
  const int S = p.size;
  std::vector<int> comp(static_cast<size_t>(S * S), -1);
  int count = 0;
  for (int start = 0; start < S * S; ++start) {
    if (p.pixels[static_cast<size_t>(start)] == 0 || comp[static_cast<size_t>(start)] >= 0) continue;
    std::vector<int> stack{start};
    comp[static_cast<size_t>(start)] = count;
    while (!stack.empty()) {
      const int c = stack.back();
      stack.pop_back();
      for (int dr = -1; dr <= 1; ++dr)
        for (int dc = -1; dc <= 1; ++dc) {
          const int r = c / S + dr, col = c % S + dc;
          if (r < 0 || r >= S || col < 0 || col >= S) continue;
          const size_t q = static_cast<size_t>(r * S + col);
          if (p.pixels[q] != 0 && comp[q] < 0) {
            comp[q] = count;
            stack.push_back(static_cast<int>(q));
          }
        }
    }
    ++count;
  }
  return {comp, count};
}

int at(const PathfinderSample& p, std::array<int, 2> rc) { return rc[0] * p.size + rc[1]; }

// ---- Grouping ------------------------------------------------------------------------------------------------------

// The group holding the most tokens, counted here; -1 when the largest count is shared.
int64_t majority(const std::vector<int64_t>& groups) {
  std::map<int64_t, int64_t> count;
  for (int64_t g : groups) ++count[g];
  int64_t best = -1, best_n = -1;
  bool tie = false;
  for (auto [g, n] : count) {
    if (n > best_n)
      best = g, best_n = n, tie = false;
    else if (n == best_n)
      tie = true;
  }
  return tie ? -1 : best;
}

}  // namespace

TEST_CASE("listops: hand-written expressions have their known values") {
  CHECK(eval_text("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9);
  CHECK(eval_text("[SM 5 6 7 ]") == 8);
  CHECK(eval_text("[MED 3 1 2 ]") == 2);    // odd count: the middle value
  CHECK(eval_text("[MED 3 4 6 9 ]") == 5);  // even: (4 + 6) / 2
  CHECK(eval_text("[MED 1 2 ]") == 1);      // even: 1.5 truncated
  CHECK(eval_text("[MED 9 8 ]") == 8);      // 8.5 truncated
  CHECK(eval_text("[MIN [MAX 1 8 ] [SM 9 9 ] 9 ]") == 8);
  CHECK(eval_text("[SM [SM 9 9 9 ] [MED 0 0 7 ] 5 ]") == 2);  // (7 + 0 + 5) % 10
  CHECK(eval_text("7") == 7);
  CHECK(listops_evaluate({kListOpsSum, kListOpsDigit0 + 4, kListOpsDigit0 + 8, kListOpsClose, 0, 0}) == 2);  // pads
  CHECK(listops_to_string(listops_from_string("[MAX 2 9 [MIN 4 7 ] 0 ]")) == "[MAX 2 9 [MIN 4 7 ] 0 ]");
  CHECK(listops_from_string("[SM 0 ]") == std::vector<int64_t>{kListOpsSum, kListOpsDigit0, kListOpsClose});
}

TEST_CASE("listops: malformed sequences are errors") {
  for (const char* bad : {"]", "[MAX ]", "[MAX 1", "1 2", "[MAX 1 ] 3", "[MIN 1 ] ]", "<pad> 1", "[SM 1 <pad> 2 ]"})
    CHECK_THROWS_AS(eval_text(bad), asc::Error);
  CHECK_THROWS_AS(listops_evaluate({}), asc::Error);
  CHECK_THROWS_AS(listops_evaluate({0, 0}), asc::Error);
  CHECK_THROWS_AS(listops_evaluate({kListOpsMax, 3, 16, kListOpsClose}), asc::Error);
  CHECK_THROWS_AS(listops_evaluate({kListOpsMax, 3, -1, kListOpsClose}), asc::Error);
  CHECK_THROWS_AS(listops_to_string({3, 99}), asc::Error);
  CHECK_THROWS_AS(listops_from_string("[MAX 10 ]"), asc::Error);
}

TEST_CASE("listops: labels equal two independent evaluators; lengths, depth and arguments stay in bounds") {
  struct Config {
    ListOpsOptions o;
    int n;
  };
  const Config configs[] = {{{.min_len = 20, .max_len = 100}, 2500},
                            {{.min_len = 4, .max_len = 40, .max_depth = 2, .max_args = 4}, 500},
                            {{.min_len = 60, .max_len = 80, .max_depth = 3, .max_args = 5, .leaf_prob = 0.5}, 300}};
  for (const Config& c : configs) {
    CAPTURE(c.o.min_len);
    CAPTURE(c.o.max_depth);
    std::vector<int> hist(10, 0);
    int deepest = 0, most_args = 0;
    for (int i = 0; i < c.n; ++i) {
      const ListOpsExpression e = listops_generate(3, static_cast<uint64_t>(i), c.o);
      const auto len = static_cast<int64_t>(e.tokens.size());
      REQUIRE(len >= c.o.min_len);
      REQUIRE(len <= c.o.max_len);
      const Parsed p = parse(e.tokens);
      REQUIRE(e.value == listops_evaluate(e.tokens));
      REQUIRE(e.value == p.value);
      REQUIRE(p.depth >= 1);
      REQUIRE(p.depth <= c.o.max_depth);
      REQUIRE(p.min_args >= 2);
      REQUIRE(p.max_args <= c.o.max_args);
      ++hist[static_cast<size_t>(e.value)];
      deepest = std::max(deepest, p.depth);
      most_args = std::max(most_args, p.max_args);
    }
    // The bounds are reached, not just respected.
    if (c.o.max_depth <= 3)
      CHECK(deepest == c.o.max_depth);
    else
      CHECK(deepest >= 4);
    CHECK(most_args == c.o.max_args);
    if (c.n >= 2000) {
      std::string dist;
      for (int v = 0; v < 10; ++v) {
        dist += fmt::format(" {}:{:.3f}", v, hist[static_cast<size_t>(v)] / double(c.n));
        CHECK(hist[static_cast<size_t>(v)] > c.n / 50);  // every class occurs (LRA's distribution is skewed too)
      }
      MESSAGE("listops label distribution (lengths ", c.o.min_len, "..", c.o.max_len, "):", dist);
    }
  }
}

TEST_CASE("listops: the default LRA lengths (500..2000) generate and evaluate") {
  for (uint64_t i = 0; i < 20; ++i) {
    const ListOpsExpression e = listops_generate(1, i);
    CHECK(e.tokens.size() >= 500);
    CHECK(e.tokens.size() <= 2000);
    CHECK(parse(e.tokens).depth <= 10);
    CHECK(listops_evaluate(e.tokens) == e.value);
  }
}

TEST_CASE("listops: same seed gives the same data, another seed or index other data") {
  const ListOpsOptions o{.min_len = 20, .max_len = 100};
  int same_as_other_seed = 0, same_as_next = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    const auto a = listops_generate(7, i, o), b = listops_generate(7, i, o);
    CHECK(a.tokens == b.tokens);
    CHECK(a.value == b.value);
    same_as_other_seed += listops_generate(8, i, o).tokens == a.tokens;
    same_as_next += listops_generate(7, i + 1, o).tokens == a.tokens;
  }
  CHECK(same_as_other_seed == 0);
  CHECK(same_as_next == 0);
}

TEST_CASE("listops: bad options are errors") {
  CHECK_THROWS_AS(listops_generate(0, 0, {.min_len = 0, .max_len = 3}), asc::Error);
  CHECK_THROWS_AS(listops_generate(0, 0, {.min_len = 50, .max_len = 40}), asc::Error);
  CHECK_THROWS_AS(listops_generate(0, 0, {.max_depth = 0}), asc::Error);
  CHECK_THROWS_AS(listops_generate(0, 0, {.max_args = 1}), asc::Error);
  CHECK_THROWS_AS(listops_generate(0, 0, {.leaf_prob = 1.0}), asc::Error);
  // max_depth 1, max_args 2: the longest expression is [OP a b ], 4 tokens.
  CHECK(listops_generate(0, 0, {.min_len = 4, .max_len = 4, .max_depth = 1, .max_args = 2}).tokens.size() == 4);
  CHECK_THROWS_AS(listops_generate(0, 0, {.min_len = 5, .max_len = 10, .max_depth = 1, .max_args = 2}), asc::Error);
}

TEST_CASE("listops task: fields, lazily generated splits, labels") {
  const Task t =
      make_task("listops", {.seed = 2, .train_size = 40, .val_size = 8, .test_size = 6, .min_len = 20, .max_len = 60});
  CHECK(t.name == "listops");
  CHECK(t.vocab == kListOpsVocab);
  CHECK(t.classes == 10);
  CHECK(t.max_len == 60);
  CHECK(t.pad_id == 0);
  CHECK(t.class_names.size() == 10);
  CHECK(!t.description.empty());
  CHECK(t.train->size() == 40);
  CHECK(t.val->size() == 8);
  CHECK(t.test->size() == 6);
  for (int64_t i = 0; i < 40; ++i) {
    const Example e = t.train->get(i);
    REQUIRE(e.input.dtype() == kInt64);
    REQUIRE(e.input.dim() == 1);
    REQUIRE(e.input.numel() >= 20);
    REQUIRE(e.input.numel() <= 60);
    const auto tok = e.input.to_vector<int64_t>();
    CHECK(e.label == listops_evaluate(tok));
    CHECK(t.train->get(i).input.to_vector<int64_t>() == tok);  // get() is a pure function of i
  }
  CHECK(t.train->get(0).input.to_vector<int64_t>() != t.val->get(0).input.to_vector<int64_t>());
  CHECK_THROWS_AS(t.train->get(40), asc::Error);
  CHECK_THROWS_AS(t.val->get(-1), asc::Error);
  const Task defaults = make_task("listops");
  CHECK(defaults.train->size() == 96000);
  CHECK(defaults.val->size() == 2000);
  CHECK(defaults.test->size() == 2000);
  CHECK(defaults.max_len == 2000);
}

TEST_CASE("pathfinder: an 8-connected flood fill of the undashed image agrees with every label") {
  const int n = 600;
  int positives = 0;
  PathfinderOptions o;
  o.dashed = false;
  for (int i = 0; i < n; ++i) {
    const PathfinderSample p = pathfinder_render(5, static_cast<uint64_t>(i), o);
    REQUIRE(p.size == 32);
    REQUIRE(p.pixels.size() == 1024);
    const auto [comp, count] = components(p);
    const int c0 = comp[static_cast<size_t>(at(p, p.dots[0]))], c1 = comp[static_cast<size_t>(at(p, p.dots[1]))];
    REQUIRE(c0 >= 0);
    REQUIRE(c1 >= 0);
    CHECK((c0 == c1) == (p.label == 1));
    // No two paths touch: the image has exactly one component per path.
    CHECK(count == 2 + o.distractors);
    const double dist = std::hypot(p.dots[0][0] - p.dots[1][0], p.dots[0][1] - p.dots[1][1]);
    CHECK(dist >= o.min_dot_distance);
    positives += p.label;
  }
  MESSAGE("pathfinder: ", positives, " of ", n, " images positive");
  CHECK(positives > n * 0.44);
  CHECK(positives < n * 0.56);
}

TEST_CASE("pathfinder: the dashed image is a subset of the undashed one, with the same dots and label") {
  PathfinderOptions solid;
  solid.dashed = false;
  int64_t dashed_on = 0, solid_on = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    const PathfinderSample d = pathfinder_render(9, i), u = pathfinder_render(9, i, solid);
    CHECK(d.label == u.label);
    CHECK(d.dots == u.dots);
    for (size_t k = 0; k < d.pixels.size(); ++k) {
      REQUIRE((d.pixels[k] == 0 || d.pixels[k] == 255));
      REQUIRE((u.pixels[k] == 0 || u.pixels[k] == 255));
      REQUIRE((d.pixels[k] == 0 || u.pixels[k] == 255));
      dashed_on += d.pixels[k] != 0;
      solid_on += u.pixels[k] != 0;
    }
    for (const auto& dot : d.dots)
      for (int dr = -1; dr <= 1; ++dr)
        for (int dc = -1; dc <= 1; ++dc) CHECK(d.pixels[static_cast<size_t>(at(d, {dot[0] + dr, dot[1] + dc}))] == 255);
  }
  // The gaps remove a real share of the path pixels (dash 3, gap 2 along the arc).
  CHECK(dashed_on < 0.9 * static_cast<double>(solid_on));
  CHECK(dashed_on > 0.5 * static_cast<double>(solid_on));
}

TEST_CASE("pathfinder: tokens and image forms, determinism, task fields, bad options") {
  const PathfinderSample p = pathfinder_render(1, 3);
  const Tensor tok = pathfinder_tokens(p), img = pathfinder_image(p);
  CHECK(tok.shape() == Shape{1024});
  CHECK(tok.dtype() == kInt64);
  CHECK(img.shape() == Shape{32, 32});
  CHECK(img.dtype() == kFloat32);
  const auto tv = tok.to_vector<int64_t>();
  const auto iv = img.to_vector<float>();
  for (size_t k = 0; k < 1024; ++k) {
    REQUIRE(tv[k] == p.pixels[k]);
    REQUIRE(iv[k] == static_cast<float>(p.pixels[k]) / 255.0f);
  }
  CHECK(pathfinder_render(1, 3).pixels == p.pixels);
  CHECK(pathfinder_render(2, 3).pixels != p.pixels);
  CHECK(pathfinder_render(1, 4).pixels != p.pixels);

  const Task t = make_task("pathfinder", {.seed = 1, .train_size = 16, .val_size = 4, .test_size = 4});
  CHECK(t.vocab == 256);
  CHECK(t.classes == 2);
  CHECK(t.max_len == 1024);
  CHECK(t.class_names.size() == 2);
  CHECK(t.train->size() == 16);
  for (int64_t i = 0; i < 16; ++i) {
    const Example e = t.train->get(i);
    CHECK(e.input.shape() == Shape{1024});
    CHECK((e.label == 0 || e.label == 1));
    CHECK(t.train->get(i).input.to_vector<int64_t>() == e.input.to_vector<int64_t>());
  }
  CHECK(t.train->get(0).input.to_vector<int64_t>() != t.test->get(0).input.to_vector<int64_t>());
  CHECK_THROWS_AS(t.train->get(16), asc::Error);
  CHECK(make_task("pathfinder").train->size() == 20000);
  CHECK_THROWS_AS(make_task("pathfinder", {.max_len = 100}), asc::Error);

  CHECK_THROWS_AS(pathfinder_render(0, 0, {.size = 4}), asc::Error);
  CHECK_THROWS_AS(pathfinder_render(0, 0, {.step_len = 0.1}), asc::Error);
  CHECK_THROWS_AS(pathfinder_render(0, 0, {.gap_len = 0.5}), asc::Error);
  CHECK_THROWS_AS(pathfinder_render(0, 0, {.size = 8, .path_steps = 30}), asc::Error);  // cannot fit: a clear error

  // The task's difficulty options reach the generator: a 16 x 16 scene of 5-step paths, with or without distractors,
  // dashed or solid
  const auto scene = [](int64_t distractors, bool solid) {
    return make_task("pathfinder", {.seed = 3,
                                    .train_size = 8,
                                    .val_size = 2,
                                    .test_size = 2,
                                    .pathfinder_size = 16,
                                    .path_steps = 5,
                                    .distractors = distractors,
                                    .pathfinder_solid = solid});
  };
  const Task easy = scene(0, false), same = scene(0, false), other = scene(2, false), solid = scene(0, true);
  CHECK(easy.max_len == 256);
  CHECK(easy.description.find("5 steps each, 0 distractors") != std::string::npos);
  int64_t lit_easy = 0, lit_other = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const Example e = easy.train->get(i);
    REQUIRE(e.input.shape() == Shape{256});
    CHECK(same.train->get(i).input.to_vector<int64_t>() == e.input.to_vector<int64_t>());  // deterministic
    for (int64_t v : e.input.to_vector<int64_t>()) lit_easy += v > 0;
    for (int64_t v : other.train->get(i).input.to_vector<int64_t>()) lit_other += v > 0;
  }
  CHECK(lit_other > lit_easy);  // two distractors per scene light more pixels than none
  // solid: the same geometry drawn without gaps (data/pathfinder.h: the dashed image is a subset of the solid one)
  CHECK(solid.description.find("solid random-walk paths") != std::string::npos);
  int64_t lit_solid = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const auto d = easy.train->get(i).input.to_vector<int64_t>(), s = solid.train->get(i).input.to_vector<int64_t>();
    CHECK(easy.train->get(i).label == solid.train->get(i).label);
    for (size_t k = 0; k < d.size(); ++k) {
      REQUIRE((d[k] == 0 || s[k] == 255));  // every dashed pixel lit in the solid image
      lit_solid += s[k] > 0;
    }
  }
  CHECK(lit_solid > lit_easy);
  // pooled: drawn at 32 with the options, then averaged to 16
  const Task pooled =
      make_task("pathfinder", {.train_size = 4, .val_size = 1, .test_size = 1, .image_size = 16, .path_steps = 8});
  CHECK(pooled.max_len == 256);
  CHECK_THROWS_WITH_AS(make_task("listops", {.path_steps = 4}), doctest::Contains("apply to the pathfinder task"),
                       asc::Error);
  CHECK_THROWS_WITH_AS(make_task("pathfinder", {.pathfinder_size = 4}), doctest::Contains("size must be in [8, 256]"),
                       asc::Error);
  CHECK_THROWS_AS(make_task("pathfinder", {.pathfinder_size = 8, .path_steps = 40}), asc::Error);  // cannot fit
  CHECK_THROWS_AS(make_task("pathfinder", {.distractors = -2}), asc::Error);
}

TEST_CASE("grouping: the vocabulary's groups are balanced and its latents lie nearest their own centre") {
  const GroupingOptions o;
  const GroupingVocabulary v = grouping_vocabulary(4, o);
  REQUIRE(v.token_group.size() == 64);
  CHECK(v.centres.shape() == Shape{4, 16});
  CHECK(v.latents.shape() == Shape{64, 16});
  std::vector<int> per_group(4, 0);
  for (int64_t g : v.token_group) {
    REQUIRE(g >= 0);
    REQUIRE(g < 4);
    ++per_group[static_cast<size_t>(g)];
  }
  CHECK(per_group == std::vector<int>{16, 16, 16, 16});
  bool sorted = true;  // the shuffle mixes ids: groups are not the id pattern 0,1,2,3,0,...
  for (size_t t = 0; t < 64; ++t) sorted = sorted && v.token_group[t] == static_cast<int64_t>(t % 4);
  CHECK(!sorted);
  const auto c = v.centres.to_vector<float>(), z = v.latents.to_vector<float>();
  for (size_t t = 0; t < 64; ++t) {
    size_t nearest = 0;
    double best = 1e300;
    for (size_t g = 0; g < 4; ++g) {
      double d2 = 0;
      for (size_t j = 0; j < 16; ++j) d2 += (z[t * 16 + j] - c[g * 16 + j]) * (z[t * 16 + j] - c[g * 16 + j]);
      if (d2 < best) best = d2, nearest = g;
    }
    CHECK(static_cast<int64_t>(nearest) == v.token_group[t]);
  }
  CHECK(grouping_vocabulary(4, o).latents.to_vector<float>() == z);
  CHECK(grouping_vocabulary(5, o).token_group != v.token_group);
}

TEST_CASE("grouping: groups follow the vocabulary and the label is the recounted unique majority") {
  const GroupingOptions o;
  const GroupingVocabulary v = grouping_vocabulary(1, o);
  std::vector<int> hist(4, 0);
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    const GroupingSequence q = grouping_sequence(v, 1, static_cast<uint64_t>(i), o);
    REQUIRE(q.tokens.size() == 64);
    REQUIRE(q.groups.size() == 64);
    std::set<int64_t> distinct;
    for (size_t t = 0; t < 64; ++t) {
      REQUIRE(q.tokens[t] >= 0);
      REQUIRE(q.tokens[t] < 64);
      REQUIRE(q.groups[t] == v.token_group[static_cast<size_t>(q.tokens[t])]);
      distinct.insert(q.groups[t]);
    }
    CHECK(distinct.size() <= static_cast<size_t>(o.max_groups));
    REQUIRE(q.label == majority(q.groups));  // majority() is -1 on a tie: ties never reach a label
    ++hist[static_cast<size_t>(q.label)];
  }
  MESSAGE("grouping label distribution: ", hist[0], " ", hist[1], " ", hist[2], " ", hist[3], " of ", n);
  for (int h : hist) CHECK(h > n / 6);

  const Task t = make_task("grouping", {.seed = 1, .train_size = 30, .val_size = 5, .test_size = 5, .max_len = 20});
  CHECK(t.vocab == 64);
  CHECK(t.classes == 4);
  CHECK(t.max_len == 20);
  CHECK(t.class_names.size() == 4);
  GroupingOptions o20 = o;
  o20.seq_len = 20;
  const GroupingVocabulary v20 = grouping_vocabulary(1, o20);  // the task's vocabulary, rebuilt from its seed
  for (int64_t i = 0; i < 30; ++i) {
    const Example e = t.train->get(i);
    REQUIRE(e.input.shape() == Shape{20});
    REQUIRE(e.groups.shape() == Shape{20});
    const auto tok = e.input.to_vector<int64_t>(), grp = e.groups.to_vector<int64_t>();
    for (size_t k = 0; k < 20; ++k) CHECK(grp[k] == v20.token_group[static_cast<size_t>(tok[k])]);
    CHECK(e.label == majority(grp));
    CHECK(t.train->get(i).input.to_vector<int64_t>() == tok);
  }
  CHECK(t.train->get(0).input.to_vector<int64_t>() != t.val->get(0).input.to_vector<int64_t>());
  CHECK(make_task("grouping").train->size() == 8000);
  CHECK_THROWS_AS(make_task("grouping", {.min_len = 10, .max_len = 20}), asc::Error);
  CHECK_THROWS_AS(grouping_vocabulary(0, {.groups = 1}), asc::Error);
  CHECK_THROWS_AS(grouping_vocabulary(0, {.groups = 8, .vocab = 4}), asc::Error);
  CHECK_THROWS_AS(grouping_vocabulary(0, {.min_groups = 3, .max_groups = 2}), asc::Error);
  CHECK_THROWS_AS(grouping_sequence(v, 0, 0, {.vocab = 32}), asc::Error);
}

TEST_CASE("generated tasks: get() from several threads at once returns what a single thread gets") {
  for (const char* name : {"listops", "pathfinder", "grouping"}) {
    INFO("task: " << name);  // CAPTURE of a const char* would print the pointer
    const Task t = make_task(name, {.seed = 3, .train_size = 64, .val_size = 1, .test_size = 1});
    std::vector<std::vector<int64_t>> serial;
    for (int64_t i = 0; i < 64; ++i) serial.push_back(t.train->get(i).input.to_vector<int64_t>());
    std::vector<std::vector<int64_t>> a(64), b(64);
    auto tokens = [&](int64_t i) { return t.train->get(i).input.to_vector<int64_t>(); };
    std::thread ta([&] {
      for (int64_t i = 0; i < 64; ++i) a[static_cast<size_t>(i)] = tokens(i);
    });
    std::thread tb([&] {
      for (int64_t i = 63; i >= 0; --i) b[static_cast<size_t>(i)] = tokens(i);
    });
    ta.join();
    tb.join();
    CHECK(a == serial);
    CHECK(b == serial);
  }
}

// The data are part of an experiment's definition: the same seed must give the same bits on every machine and after
// every refactoring. These fingerprints (FNV-1a over the first examples) were recorded when the generators were
// written; a mismatch means the data changed — deliberate changes update them and say so in docs/data.md.
TEST_CASE("generated tasks: the data of a seed are pinned by a fingerprint") {
  auto fnv = [](uint64_t h, int64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<uint64_t>(v) >> (8 * b)) & 0xFF)) * 0x100000001B3ull;
    return h;
  };
  uint64_t listops = 0xCBF29CE484222325ull, pathfinder = listops, grouping = listops, latents = listops;
  for (uint64_t i = 0; i < 20; ++i) {
    const ListOpsExpression e = listops_generate(11, i, {.min_len = 20, .max_len = 200});
    for (int64_t t : e.tokens) listops = fnv(listops, t);
    listops = fnv(listops, e.value);
    const PathfinderSample p = pathfinder_render(11, i);
    for (uint8_t px : p.pixels) pathfinder = fnv(pathfinder, px);
    pathfinder = fnv(pathfinder, p.label);
  }
  const GroupingVocabulary v = grouping_vocabulary(11);
  for (uint64_t i = 0; i < 20; ++i) {
    const GroupingSequence q = grouping_sequence(v, 11, i);
    for (int64_t t : q.tokens) grouping = fnv(grouping, t);
    grouping = fnv(grouping, q.label);
  }
  for (float x : v.latents.to_vector<float>()) latents = fnv(latents, std::bit_cast<uint32_t>(x));
  CHECK(listops == 0xCD3DC529317F8CAEull);
  CHECK(pathfinder == 0xFC3D899C1E5AEC5Bull);
  CHECK(grouping == 0xBAA95248A69EE80Full);
  CHECK(latents == 0x9FA19FE6DA62C5B4ull);
}
