// stats: compare trained models with the statistics of stats/stats.h, or compute any of them over numbers given as
// JSON (the interface the experiment scripts and the scipy / scikit-learn cross-check use).
//
//   stats compare --a runs/asc-s0 runs/asc-s1 ... --b runs/dense-s0 runs/dense-s1 ...   # a markdown table
//   stats compare --a ... --b ... --json cmp.json                                      # and every figure as JSON
//   echo '{"op": "paired_bootstrap", "a": [1, 0, 1], "b": [0, 0, 1]}' | stats json     # one request (or a list)
//
// compare reads each run's summary.json (the metric, default test_accuracy, and the seed) and predictions.csv (for
// the tests over test examples: each example's correctness averaged over a model's seeds, then the paired
// bootstrap and approximate randomisation over examples). docs/stats.md explains each figure.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/gzip.h"
#include "stats/cluster.h"
#include "stats/stats.h"
#include "tools/cli.h"

namespace {

using asc::tools::Json;
namespace st = asc::stats;
namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- JSON <-> numbers (NaN travels as null: JSON has no NaN) ----------------------------------------------------

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

std::vector<double> doubles(const Json& request, const char* key) {
  ASC_CHECK(request.contains(key), "stats json: request '{}' needs an array \"{}\"", request.value("op", ""), key);
  const Json& a = request.at(key);
  ASC_CHECK(a.is_array(), "stats json: \"{}\" must be an array of numbers", key);
  std::vector<double> out;
  for (const Json& v : a) {
    ASC_CHECK(v.is_number() || v.is_null(), "stats json: \"{}\" holds {}, not a number (null stands for NaN)", key,
              v.dump());
    out.push_back(v.is_null() ? kNaN : v.get<double>());
  }
  return out;
}

std::vector<int64_t> labels(const Json& request, const char* key) {
  ASC_CHECK(request.contains(key) && request.at(key).is_array(), "stats json: request '{}' needs an array \"{}\"",
            request.value("op", ""), key);
  std::vector<int64_t> out;
  for (const Json& v : request.at(key)) {
    ASC_CHECK(v.is_number_integer(), "stats json: \"{}\" holds {}, not an integer label", key, v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// Points: "x" as an array of rows (each an array of d numbers).
std::vector<double> points(const Json& request, int64_t& d) {
  ASC_CHECK(request.contains("x") && request.at("x").is_array() && !request.at("x").empty(),
            "stats json: request '{}' needs \"x\", a non-empty array of rows", request.value("op", ""));
  std::vector<double> flat;
  d = -1;
  for (const Json& row : request.at("x")) {
    ASC_CHECK(row.is_array() && !row.empty(), "stats json: every row of \"x\" must be a non-empty array");
    ASC_CHECK(d < 0 || int64_t(row.size()) == d, "stats json: rows of \"x\" have {} and {} values", d, row.size());
    d = static_cast<int64_t>(row.size());
    for (const Json& v : row) {
      ASC_CHECK(v.is_number() || v.is_null(), "stats json: \"x\" holds {}, not a number", v.dump());
      flat.push_back(v.is_null() ? kNaN : v.get<double>());
    }
  }
  return flat;
}

template <class T>
T get_or(const Json& request, const char* key, T fallback) {
  if (!request.contains(key)) return fallback;
  if constexpr (std::is_unsigned_v<T>)  // nlohmann would wrap -1 to 2^64 - 1
    ASC_CHECK(request.at(key).is_number_unsigned(), "stats json: \"{}\" must be a non-negative integer, got {}", key,
              request.at(key).dump());
  try {
    return request.at(key).get<T>();
  } catch (const Json::exception&) {
    ASC_THROW("stats json: \"{}\" has the wrong type: {}", key, request.at(key).dump());
  }
}

st::BootstrapOptions bootstrap_options(const Json& r) {
  return {.resamples = get_or<int64_t>(r, "resamples", 10000),
          .level = get_or<double>(r, "level", 0.95),
          .seed = get_or<uint64_t>(r, "seed", 0)};
}

Json interval_json(const st::Interval& i) {
  return {{"estimate", num(i.estimate)}, {"low", num(i.low)}, {"high", num(i.high)}, {"level", i.level}};
}

Json paired_json(const st::PairedTest& t) {
  return {{"delta", num(t.delta)}, {"low", num(t.low)},        {"high", num(t.high)}, {"se", num(t.se)},
          {"p", num(t.p)},         {"resamples", t.resamples}, {"exact", t.exact}};
}

Json t_test_json(const st::TTest& t) {
  return {{"t", num(t.t)},   {"df", num(t.df)},   {"p", num(t.p)},       {"difference", num(t.difference)},
          {"se", num(t.se)}, {"low", num(t.low)}, {"high", num(t.high)}, {"level", t.level}};
}

double number_or_nan(const Json& r, const char* key) {
  if (!r.contains(key) || r.at(key).is_null()) return kNaN;
  return get_or<double>(r, key, kNaN);
}

// An interval given as {"low": x, "high": y} (null or absent: none).
st::Interval interval_of(const Json& r, const char* key) {
  st::Interval i{kNaN, kNaN, kNaN};
  if (!r.contains(key) || r.at(key).is_null()) return i;
  const Json& j = r.at(key);
  ASC_CHECK(j.is_object(), "stats json: \"{}\" must be an object {{\"low\": x, \"high\": y}}", key);
  i.low = number_or_nan(j, "low");
  i.high = number_or_nan(j, "high");
  ASC_CHECK(std::isnan(i.low) || std::isnan(i.high) || i.low <= i.high, "stats json: \"{}\" has low {} > high {}", key,
            i.low, i.high);
  return i;
}

st::ClaimEvidence evidence_of(const Json& r) {
  ASC_CHECK(r.contains("claim") && r.at("claim").is_number(), "stats json: claim_verdict needs a number \"claim\"");
  st::ClaimEvidence e;
  e.claim = r.at("claim").get<double>();
  e.direction = get_or<int>(r, "direction", 0);
  e.difference = number_or_nan(r, "difference");
  e.seeds = interval_of(r, "seeds");
  e.examples = interval_of(r, "examples");
  e.p_seeds = number_or_nan(r, "p_seeds");
  e.p_examples = number_or_nan(r, "p_examples");
  e.baseline_learns_p = number_or_nan(r, "baseline_learns_p");
  e.alpha = get_or<double>(r, "alpha", 0.05);
  e.learn_alpha = get_or<double>(r, "learn_alpha", 0.01);
  return e;
}

Json verdict_json(const st::ClaimVerdict& v) {
  return {{"verdict", st::verdict_name(v.verdict)},
          {"reason", v.reason},
          {"significant_in_direction", v.significant_in_direction}};
}

// One request {"op": name, arguments...} -> its result.
Json answer(const Json& r) {
  ASC_CHECK(r.is_object() && r.contains("op") && r.at("op").is_string(),
            "stats json: each request is an object with a string \"op\", got {}", r.dump().substr(0, 80));
  const std::string op = r.at("op").get<std::string>();
  if (op == "describe") {
    const st::Summary s = st::describe(doubles(r, "x"));
    return {{"n", s.n},          {"mean", num(s.mean)},     {"std", num(s.std)}, {"min", num(s.min)},
            {"max", num(s.max)}, {"median", num(s.median)}, {"iqm", num(s.iqm)}};
  }
  if (op == "interquartile_mean") return num(st::interquartile_mean(doubles(r, "x")));
  if (op == "bootstrap_mean_ci") return interval_json(st::bootstrap_mean_ci(doubles(r, "x"), bootstrap_options(r)));
  if (op == "bootstrap_difference_ci")
    return interval_json(st::bootstrap_difference_ci(doubles(r, "a"), doubles(r, "b"), bootstrap_options(r)));
  if (op == "paired_bootstrap")
    return paired_json(st::paired_bootstrap(doubles(r, "a"), doubles(r, "b"), bootstrap_options(r)));
  if (op == "approximate_randomization")
    return paired_json(st::approximate_randomization(doubles(r, "a"), doubles(r, "b"), bootstrap_options(r)));
  if (op == "cohens_d") return num(st::cohens_d(doubles(r, "a"), doubles(r, "b")));
  if (op == "cliffs_delta") return num(st::cliffs_delta(doubles(r, "a"), doubles(r, "b")));
  if (op == "welch_t_test") {
    const st::TTest t = st::welch_t_test(doubles(r, "a"), doubles(r, "b"), get_or<double>(r, "level", 0.95));
    Json out = t_test_json(t);
    out["mde"] =
        num(st::welch_minimum_detectable_effect(t, get_or<double>(r, "alpha", 0.05), get_or<double>(r, "power", 0.8)));
    return out;
  }
  if (op == "paired_t_test")
    return t_test_json(st::paired_t_test(doubles(r, "a"), doubles(r, "b"), get_or<double>(r, "level", 0.95)));
  if (op == "binomial_test_greater")
    return num(st::binomial_test_greater(get_or<int64_t>(r, "k", -1), get_or<int64_t>(r, "n", 0),
                                         get_or<double>(r, "p0", kNaN)));
  if (op == "holm_adjust") {
    Json out = Json::array();
    for (double v : st::holm_adjust(doubles(r, "p"))) out.push_back(num(v));
    return out;
  }
  if (op == "claim_verdict") return verdict_json(st::claim_verdict(evidence_of(r)));
  if (op == "student_t_cdf") return num(st::student_t_cdf(get_or<double>(r, "t", kNaN), get_or<double>(r, "df", kNaN)));
  if (op == "student_t_quantile")
    return num(st::student_t_quantile(get_or<double>(r, "p", kNaN), get_or<double>(r, "df", kNaN)));
  if (op == "normal_cdf") return num(st::normal_cdf(get_or<double>(r, "z", kNaN)));
  if (op == "normal_quantile") return num(st::normal_quantile(get_or<double>(r, "p", kNaN)));
  if (op == "minimum_detectable_effect")
    return num(st::minimum_detectable_effect(get_or<double>(r, "se", kNaN), get_or<double>(r, "alpha", 0.05),
                                             get_or<double>(r, "power", 0.8), get_or<double>(r, "df", 0)));
  if (op == "accuracy_difference_se")
    return num(st::accuracy_difference_se(get_or<double>(r, "p", kNaN), get_or<int64_t>(r, "n", 0)));
  if (op == "seed_difference_se")
    return num(st::seed_difference_se(get_or<double>(r, "sd", kNaN), get_or<int64_t>(r, "n_a", 0),
                                      get_or<int64_t>(r, "n_b", 0)));
  if (op == "normalized_mutual_info") return num(st::normalized_mutual_info(labels(r, "truth"), labels(r, "pred")));
  if (op == "adjusted_rand_index") return num(st::adjusted_rand_index(labels(r, "truth"), labels(r, "pred")));
  int64_t d = 0;
  if (op == "silhouette_score") {
    const std::vector<double> x = points(r, d);
    return num(st::silhouette_score(x, d, labels(r, "labels")));
  }
  if (op == "calinski_harabasz_score") {
    const std::vector<double> x = points(r, d);
    return num(st::calinski_harabasz_score(x, d, labels(r, "labels")));
  }
  if (op == "kmeans") {
    const std::vector<double> x = points(r, d);
    const st::KMeansResult km = st::kmeans(x, d, get_or<int64_t>(r, "k", 0),
                                           {.n_init = get_or<int64_t>(r, "n_init", 10),
                                            .max_iter = get_or<int64_t>(r, "max_iter", 300),
                                            .tol = get_or<double>(r, "tol", 1e-4),
                                            .seed = get_or<uint64_t>(r, "seed", 0)});
    return {{"labels", km.labels}, {"inertia", km.inertia}, {"iterations", km.iterations}};
  }
  ASC_THROW(
      "stats json: unknown op '{}' (describe, interquartile_mean, bootstrap_mean_ci, bootstrap_difference_ci, "
      "paired_bootstrap, approximate_randomization, cohens_d, cliffs_delta, welch_t_test, paired_t_test, "
      "binomial_test_greater, holm_adjust, claim_verdict, student_t_cdf, student_t_quantile, normal_cdf, "
      "normal_quantile, "
      "minimum_detectable_effect, accuracy_difference_se, seed_difference_se, kmeans, normalized_mutual_info, "
      "adjusted_rand_index, silhouette_score, calinski_harabasz_score)",
      op);
}

int run_json(const std::string& input) {
  std::string text;
  if (input == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream f(input);
    ASC_CHECK(f, "stats json: cannot read {}", input);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  Json request;
  try {
    request = Json::parse(text);
  } catch (const Json::parse_error& e) {
    ASC_THROW("stats json: {} is not JSON: {}", input == "-" ? "stdin" : input, e.what());
  }
  Json out;
  if (request.is_array()) {
    out = Json::array();
    for (const Json& r : request) out.push_back(answer(r));
  } else {
    out = answer(request);
  }
  std::cout << out.dump(1) << "\n";
  return 0;
}

// ---- compare: two groups of runs ------------------------------------------------------------------------------

struct RunResult {
  std::string dir;
  double metric = kNaN;
  int64_t seed = -1;
  std::map<int64_t, std::pair<int64_t, double>> correct;  // test index -> (label, correct 0/1)
};

// The lines of a text file, gzip-compressed or not (data/gzip.h: truncation and trailing garbage refused); false
// when it does not exist.
bool read_lines(const fs::path& path, std::vector<std::string>& lines) {
  if (!fs::exists(path)) return false;
  const std::string text = asc::data::read_file_maybe_gzip(path.string(), "stats compare");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return true;
}

RunResult read_run(const std::string& dir, const std::string& metric) {
  RunResult r;
  r.dir = dir;
  std::ifstream f(fs::path(dir) / "summary.json");
  ASC_CHECK(f, "stats compare: {} has no summary.json (is the run finished?)", dir);
  Json s;
  try {
    s = Json::parse(f);
  } catch (const Json::parse_error& e) {
    ASC_THROW("stats compare: {}/summary.json is not JSON: {}", dir, e.what());
  }
  ASC_CHECK(s.contains(metric), "stats compare: {}/summary.json has no \"{}\"", dir, metric);
  r.metric = s.at(metric).is_number() ? s.at(metric).get<double>() : kNaN;
  r.seed = s.value("seed", int64_t(-1));
  std::vector<std::string> lines;
  if (!read_lines(fs::path(dir) / "predictions.csv", lines) && !read_lines(fs::path(dir) / "predictions.csv.gz", lines))
    return r;  // an LM run: no per-example predictions
  ASC_CHECK(!lines.empty() && lines[0].rfind("index,label,prediction,correct", 0) == 0,
            "stats compare: {}/predictions.csv: header '{}'", dir, lines.empty() ? "" : lines[0]);
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty()) continue;
    long long index = 0, label = 0, prediction = 0, correct = 0;
    ASC_CHECK(std::sscanf(line.c_str(), "%lld,%lld,%lld,%lld", &index, &label, &prediction, &correct) == 4 &&
                  (correct == 0 || correct == 1),
              "stats compare: {}/predictions.csv: bad row '{}'", dir, line);
    ASC_CHECK(r.correct.emplace(index, std::make_pair(label, double(correct))).second,
              "stats compare: {}/predictions.csv: example {} twice", dir, index);
  }
  return r;
}

// Each test example's correctness averaged over the runs of one model (the same examples in every run).
std::vector<double> mean_correct(const std::vector<RunResult>& runs, const std::map<int64_t, int64_t>& examples) {
  std::vector<double> out(examples.size(), 0.0);
  for (const RunResult& r : runs) {
    size_t i = 0;
    for (const auto& [index, label] : examples) {
      const auto it = r.correct.find(index);
      ASC_CHECK(it != r.correct.end() && it->second.first == label,
                "stats compare: {} was not evaluated on the same test examples as the others (example {})", r.dir,
                index);
      out[i++] += it->second.second / double(runs.size());
    }
  }
  return out;
}

std::string fmt_num(double v, int digits = 4) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "—"; }

std::string interval_text(const st::Interval& i) { return fmt::format("[{}, {}]", fmt_num(i.low), fmt_num(i.high)); }

int run_compare(const std::vector<std::string>& a_dirs, const std::vector<std::string>& b_dirs,
                const std::string& a_name, const std::string& b_name, const std::string& metric,
                const st::BootstrapOptions& bo, double claim, int direction, const std::string& json_path) {
  std::vector<RunResult> a, b;
  for (const auto& d : a_dirs) a.push_back(read_run(d, metric));
  for (const auto& d : b_dirs) b.push_back(read_run(d, metric));
  std::vector<double> am, bm;
  for (const auto& r : a) am.push_back(r.metric);
  for (const auto& r : b) bm.push_back(r.metric);
  const st::Summary sa = st::describe(am), sb = st::describe(bm);
  Json out = {{"metric", metric}, {"a", a_name}, {"b", b_name}, {"resamples", bo.resamples}, {"seed", bo.seed}};

  // Over seeds: each model's mean with its interval; the difference with its interval and effect sizes.
  const st::Interval none{kNaN, kNaN, kNaN, bo.level};
  const st::Interval ci_a = am.size() >= 2 ? st::bootstrap_mean_ci(am, bo) : none;
  const st::Interval ci_b = bm.size() >= 2 ? st::bootstrap_mean_ci(bm, bo) : none;
  auto group = [&](const std::vector<RunResult>& runs, const st::Summary& s, const st::Interval& ci) {
    Json g = {{"runs", Json::array()}, {"n", s.n},          {"mean", num(s.mean)},
              {"std", num(s.std)},     {"iqm", num(s.iqm)}, {"ci", interval_json(ci)}};
    for (const auto& r : runs) g["runs"].push_back({{"dir", r.dir}, {"seed", r.seed}, {"value", num(r.metric)}});
    return g;
  };
  out["group_a"] = group(a, sa, ci_a);
  out["group_b"] = group(b, sb, ci_b);
  out["difference"] = num(sa.mean - sb.mean);
  const bool seeds = a.size() >= 2 && b.size() >= 2;
  st::Interval diff_ci = none;
  double d = kNaN, delta = kNaN, mde_seeds = kNaN;
  st::TTest welch;  // read only when there are seeds
  std::optional<st::TTest> seed_paired;
  if (seeds) {
    diff_ci = st::bootstrap_difference_ci(am, bm, bo);
    d = st::cohens_d(am, bm);
    delta = st::cliffs_delta(am, bm);
    welch = st::welch_t_test(am, bm, bo.level);
    // The MDE of the test that is run, Welch's: its standard error and its Welch-Satterthwaite degrees of freedom
    mde_seeds = st::welch_minimum_detectable_effect(welch);
    out["difference_ci"] = interval_json(diff_ci);
    out["cohens_d"] = num(d);
    out["cliffs_delta"] = num(delta);
    out["welch_t_test"] = t_test_json(welch);
    out["mde_seeds"] = num(mde_seeds);
    // Arms trained with the same seeds (and so the same data order and initial draws): the seed-paired test beside
    std::map<int64_t, double> by_seed_a, by_seed_b;
    for (const auto& r : a) by_seed_a[r.seed] = r.metric;
    for (const auto& r : b) by_seed_b[r.seed] = r.metric;
    const bool same_seeds = by_seed_a.size() == a.size() && by_seed_b.size() == b.size() && a.size() == b.size() &&
                            !by_seed_a.contains(-1) &&
                            std::equal(by_seed_a.begin(), by_seed_a.end(), by_seed_b.begin(),
                                       [](const auto& x, const auto& y) { return x.first == y.first; });
    if (same_seeds) {
      std::vector<double> pa, pb_;
      for (const auto& [seed, v] : by_seed_a) {
        pa.push_back(v);
        pb_.push_back(by_seed_b.at(seed));
      }
      seed_paired = st::paired_t_test(pa, pb_, bo.level);
      out["seed_paired_t_test"] = t_test_json(*seed_paired);
    }
  }

  // Over test examples (classifiers): each example's correctness averaged over a model's runs, paired between models.
  auto has_predictions = [](const RunResult& r) { return !r.correct.empty(); };
  const bool per_example =
      std::all_of(a.begin(), a.end(), has_predictions) && std::all_of(b.begin(), b.end(), has_predictions);
  st::PairedTest pb, ar;
  double mde_examples = kNaN, baseline_learns_p = kNaN, majority_rate = kNaN;
  int64_t baseline_correct = 0;
  size_t n_examples = 0;
  st::ClaimVerdict verdict;
  if (per_example) {
    std::map<int64_t, int64_t> examples;  // index -> label, from the first run; every other run must match
    for (const auto& [index, lc] : a.front().correct) examples.emplace(index, lc.first);
    for (const auto* runs : {&a, &b})
      for (const auto& r : *runs)
        ASC_CHECK(r.correct.size() == examples.size(), "stats compare: {} has {} test predictions, {} has {}", r.dir,
                  r.correct.size(), a.front().dir, examples.size());
    const std::vector<double> ca = mean_correct(a, examples), cb = mean_correct(b, examples);
    n_examples = examples.size();
    pb = st::paired_bootstrap(ca, cb, bo);
    ar = st::approximate_randomization(ca, cb, bo);
    // The paired difference's own standard error (the bootstrap's): what this test set and these models can resolve
    mde_examples = st::minimum_detectable_effect(pb.se);
    out["test_examples"] = n_examples;
    out["paired_bootstrap"] = paired_json(pb);
    out["approximate_randomization"] = paired_json(ar);
    out["mde_examples"] = num(mde_examples);
    // Does the baseline (B) learn the task? Its correct answers, averaged over its runs, against the share of the
    // most common test label (the best any constant answer scores here), by a one-sided binomial test.
    std::map<int64_t, int64_t> label_counts;
    for (const auto& [index, label] : examples) ++label_counts[label];
    int64_t majority = 0;
    for (const auto& [label, count] : label_counts) majority = std::max(majority, count);
    double b_correct = 0;
    for (double v : cb) b_correct += v;
    baseline_correct = std::llround(b_correct);
    majority_rate = double(majority) / double(n_examples);
    baseline_learns_p = st::binomial_test_greater(baseline_correct, int64_t(n_examples), majority_rate);
    out["baseline_learns"] = {{"majority_rate", majority_rate},
                              {"correct", baseline_correct},
                              {"examples", n_examples},
                              {"p", num(baseline_learns_p)}};
  }
  if (!std::isnan(claim)) {
    st::ClaimEvidence e;
    e.claim = claim;
    e.direction = direction;
    e.difference = sa.mean - sb.mean;
    if (seeds) {
      e.seeds = {welch.difference, welch.low, welch.high, bo.level};
      e.p_seeds = welch.p;
    }
    if (per_example) {
      e.examples = {pb.delta, pb.low, pb.high, bo.level};
      e.p_examples = pb.p;
      e.baseline_learns_p = baseline_learns_p;
    }
    verdict = st::claim_verdict(e);
    out["claim"] = {{"claim", claim}, {"direction", direction}};
    out["verdict"] = verdict_json(verdict);
  }

  fmt::print("| model | runs | {} mean ± std | IQM | {:g} % CI of the mean |\n|---|---|---|---|---|\n", metric,
             100 * bo.level);
  fmt::print("| {} | {} | {} ± {} | {} | {} |\n", a_name, sa.n, fmt_num(sa.mean), fmt_num(sa.std), fmt_num(sa.iqm),
             interval_text(ci_a));
  fmt::print("| {} | {} | {} ± {} | {} | {} |\n\n", b_name, sb.n, fmt_num(sb.mean), fmt_num(sb.std), fmt_num(sb.iqm),
             interval_text(ci_b));
  fmt::print("{} − {}: {}", a_name, b_name, fmt_num(sa.mean - sb.mean));
  if (seeds) {
    fmt::print(
        " (over seeds: Welch's t-test p {}, its {:g} % interval {}, bootstrap interval {}; Cohen's d {}, Cliff's δ {}; "
        "smallest difference Welch's test on {} + {} seeds detects (α 0.05, power 0.8): {})",
        fmt_num(welch.p), 100 * bo.level, interval_text({welch.difference, welch.low, welch.high, bo.level}),
        interval_text(diff_ci), fmt_num(d, 2), fmt_num(delta, 2), sa.n, sb.n, fmt_num(mde_seeds));
    if (seed_paired) fmt::print("; the same seeds in both arms: seed-paired t-test p {}", fmt_num(seed_paired->p));
  }
  fmt::print("\n");
  if (per_example) {
    fmt::print(
        "over {} test examples (each one's correctness averaged over a model's runs): paired bootstrap p {} "
        "({:g} % CI of the difference {}), approximate randomisation p {}; {} resamples, seed {}; smallest "
        "difference this test set detects: {}\n",
        n_examples, fmt_num(pb.p), 100 * bo.level, interval_text({pb.delta, pb.low, pb.high, bo.level}), fmt_num(ar.p),
        bo.resamples, bo.seed, fmt_num(mde_examples));
    fmt::print(
        "{} learns the task: {} of {} correct (mean over its runs) against a majority-class rate of {}, "
        "one-sided binomial p {}\n",
        b_name, baseline_correct, n_examples, fmt_num(majority_rate), fmt::format("{:.3g}", baseline_learns_p));
  }
  if (!std::isnan(claim))
    fmt::print("verdict on the claim {} − {} = {:+g}{}: **{}** — {}\n", a_name, b_name, claim,
               direction != 0 && claim == 0 ? (direction > 0 ? " (a gain)" : " (a loss)") : "",
               st::verdict_name(verdict.verdict), verdict.reason);
  if (!json_path.empty()) {
    try {  // whole or not at all (core/atomic_file.h)
      asc::write_file_atomic(json_path, out.dump(1) + "\n");
    } catch (const asc::Error& e) {
      ASC_THROW("stats compare: cannot write {}: {}", json_path, e.what());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "stats: compare trained models (summary.json, predictions.csv) or compute statistics over JSON "
      "(docs/stats.md)",
      "stats"};
  app.require_subcommand(1);
  CLI::App* compare = app.add_subcommand("compare",
                                         "two groups of runs: mean ± std, intervals, effect sizes, "
                                         "paired tests over test examples; a markdown table on stdout");
  std::vector<std::string> a_dirs, b_dirs;
  std::string a_name = "A", b_name = "B", metric = "test_accuracy", json_path;
  int64_t resamples = 10000;
  uint64_t seed = 0;
  double claim = kNaN;
  int direction = 0;
  compare->add_option("--a", a_dirs, "run directories of model A (one per seed)")
      ->required()
      ->check(CLI::ExistingDirectory)
      ->group("Runs");
  compare->add_option("--b", b_dirs, "run directories of model B")
      ->required()
      ->check(CLI::ExistingDirectory)
      ->group("Runs");
  compare->add_option("--a-name", a_name, "A's name in the table")->capture_default_str()->group("Runs");
  compare->add_option("--b-name", b_name, "B's name in the table")->capture_default_str()->group("Runs");
  compare->add_option("--metric", metric, "summary.json field compared over seeds")
      ->capture_default_str()
      ->group("Statistics");
  compare->add_option("--resamples", resamples, "bootstrap resamples and randomisation rounds")
      ->check(asc::tools::int_range(1, int64_t(1) << 32))
      ->capture_default_str()
      ->group("Statistics");
  compare->add_option("--seed", seed, "seed of the resampling")->capture_default_str()->group("Statistics");
  compare
      ->add_option("--claim", claim,
                   "claimed difference A − B in the metric's units (e.g. 0.008: A 0.8 points more accurate): adds "
                   "the verdict of docs/stats.md (one comparison: no correction across a family)")
      ->check(CLI::Number)
      ->group("Verdict");
  compare
      ->add_option("--direction", direction,
                   "the claimed direction, +1 or -1, for a claim of a direction only (--claim 0); default: the "
                   "claim's sign")
      ->check(CLI::IsMember({-1, 0, 1}))
      ->group("Verdict");
  compare->add_option("--json", json_path, "also write every figure as JSON to FILE")
      ->check(asc::tools::output_file())
      ->type_name("FILE")
      ->group("Output");
  CLI::App* json = app.add_subcommand("json",
                                      "answer statistics requests given as JSON (one object or a list): "
                                      "{\"op\": \"paired_bootstrap\", \"a\": [...], \"b\": [...]}");
  std::string input = "-";
  json->add_option("input", input, "request file ('-': stdin)")->capture_default_str();
  asc::tools::parse_or_exit(app, argc, argv);
  if (compare->parsed() && !std::isnan(claim)) {
    if (!std::isfinite(claim)) asc::tools::usage_error(app, "compare: --claim must be a finite number");
    if (claim == 0 && direction == 0)
      asc::tools::usage_error(app, "compare: --claim 0 claims a direction only: give --direction 1 or -1");
    if (claim * direction < 0)
      asc::tools::usage_error(app, fmt::format("compare: --claim {} points against --direction {}", claim, direction));
  }
  return asc::tools::guarded("stats", [&] {
    if (json->parsed()) return run_json(input);
    return run_compare(a_dirs, b_dirs, a_name, b_name, metric, {.resamples = resamples, .seed = seed}, claim, direction,
                       json_path);
  });
}
