#pragma once
// What the command-line tools of tools/ share (not part of the library): parsing with CLI11 under one contract,
// validators for list options, a progress line, a result table written as CSV and JSON, and where a tool finds its
// Python twin.
//
//   CLI::App app{"bench_x: what it measures", "bench_x"};
//   std::vector<int64_t> ns = {128, 512};
//   tools::add_int_list(app, "--n", ns, "sequence lengths", 1, 1 << 20);
//   tools::Outputs out;
//   tools::add_output_options(app, out);
//   tools::parse_or_exit(app, argc, argv);        // --help: usage, exit 0; any bad argument: error + usage, exit 2
//   tools::Progress progress(ns.size(), "bench_x");
//   for (...) { ...; progress.update(++done, "n 512"); }
//   progress.finish();
//
// The contract every tool keeps: `--help` prints the usage (every option with its default) on stdout and exits 0
// without running anything; a bad argument (a value out of range, a value that is not a number, an unknown name in
// a list, a missing value, an unknown flag — with the nearest known flags) prints one line "tool: error: ..." and one
// line pointing to --help on stderr and exits 2;
// a failure while running (a file that cannot be written, an error thrown by the library) exits 1 with a message.
// Progress goes to stderr, so what a tool prints on stdout (its tables) stays clean when redirected.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/cpu_isa.h"
#include "core/profiler.h"

namespace asc::tools {

// JSON that keeps keys in insertion order: a result file lists the run facts, then the columns in the CSV's order.
using Json = nlohmann::ordered_json;

// ---- parsing --------------------------------------------------------------------------------------------------------

// The help every tool prints: the options in their groups, each as "  --flag TYPE=default" and its description wrapped
// to 100 columns, what the option accepts (its validators' descriptions) in brackets after it.
class HelpFormatter : public CLI::Formatter {
 public:
  static constexpr size_t kWidth = 100, kColumn = 30, kLongDefault = 40;
  HelpFormatter() { column_width(kColumn); }
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_type_size() == 0) return "";  // a flag without a value
    std::string type = opt->get_type_name();
    type = type.substr(0, type.find(':'));  // "INT:an integer in [0, 4096]" -> "INT"
    if (opt->get_expected_max() > 1) type += ",...";
    std::string out = type.empty() ? "" : " " + type;
    const std::string def = opt->get_default_str();
    if (!def.empty() && def.size() <= kLongDefault) out += "=" + def;  // a longer one goes with the description
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    const std::string type = opt->get_type_name();
    const size_t colon = type.find(':');
    if (colon != std::string::npos) desc += " (" + type.substr(colon + 1) + ")";
    const std::string def = opt->get_default_str();
    if (def.size() > kLongDefault) desc += " Default: " + def;
    return desc;
  }
  std::string make_description(const CLI::App* app) const override {
    std::string out, line;
    std::istringstream words(app->get_description());
    for (std::string w; words >> w;) {
      if (!line.empty() && line.size() + 1 + w.size() > kWidth) out += line + "\n", line.clear();
      line += (line.empty() ? "" : " ") + w;
    }
    return out + line + (line.empty() ? "" : "\n");
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    return lay_out("  " + sub->get_name(), sub->get_description());
  }
  std::string make_option(const CLI::Option* opt, bool positional) const override {
    if (opt->get_group().empty()) return "";
    const std::string left = "  " + make_option_name(opt, positional) + make_option_opts(opt);
    return lay_out(left, make_option_desc(opt));
  }
  // `left` in the first column, `text` wrapped beside it (below it when `left` is too wide).
  static std::string lay_out(const std::string& left, const std::string& text) {
    std::string out = left;
    size_t col = left.size();
    if (col + 1 >= kColumn) out += "\n", col = 0;
    out.append(kColumn - col, ' ');
    col = kColumn;
    // the words, a list too long for a line broken after its commas
    std::vector<std::string> ws;
    std::istringstream in(text);
    for (std::string w; in >> w;) {
      while (w.size() > kWidth - kColumn && w.find(',') != std::string::npos) {
        size_t cut = w.rfind(',', kWidth - kColumn - 1);
        if (cut == std::string::npos) cut = w.find(',');
        ws.push_back(w.substr(0, cut + 1)), w = w.substr(cut + 1);
      }
      ws.push_back(w);
    }
    bool first = true;
    for (const std::string& w : ws) {
      if (!first && col + 1 + w.size() > kWidth) out += "\n" + std::string(kColumn, ' '), col = kColumn, first = true;
      if (!first) out += ' ', ++col;
      out += w, col += w.size(), first = false;
    }
    return out + "\n";
  }
};

// Every option name of `app` and its subcommands ("--model", "-h", "compare"), for suggestions.
inline void known_names(const CLI::App& app, std::vector<std::string>& out) {
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : o->get_snames()) out.push_back("-" + s);
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    out.push_back(sub->get_name());
    known_names(*sub, out);
  }
}

inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The known names nearest to `word` (at most 3; none when nothing is close): "--modle" -> {"--model"}.
inline std::vector<std::string> nearest_names(const std::string& word, const std::vector<std::string>& known) {
  const std::string w = word.substr(0, word.find('='));
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& k : known) {
    const size_t d = edit_distance(w, k);
    const bool close = d <= std::max<size_t>(2, k.size() / 4) || (w.size() >= 4 && k.find(w) != std::string::npos);
    if (close) scored.emplace_back(d, k);
  }
  std::sort(scored.begin(), scored.end());
  scored.erase(std::unique(scored.begin(), scored.end()), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(scored[i].second);
  return out;
}

// A usage error (a bad value, an unknown flag, two options that do not fit together): one line "tool: error: ...",
// one line pointing to --help, exit 2. (The help is not printed: a long list would bury the line that matters.)
[[noreturn]] inline void usage_error(const CLI::App& app, const std::string& message) {
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');  // one line, whatever CLI11's message looked like
  std::cerr << app.get_name() << ": error: " << line << "\n"
            << "Run '" << app.get_name() << " --help' for every option and the values it accepts.\n";
  std::exit(2);
}

inline void use_help_formatter(CLI::App& app) {
  app.formatter(std::make_shared<HelpFormatter>());
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) use_help_formatter(*sub);
}

// app.parse under the tools' contract. CLI11's own app.exit() uses a different code per error kind (106 for a
// validation error, 109 for an extra argument...); scripts only need "usage" vs "ran", so every parse error is 2.
// An unknown flag names the nearest known ones.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  use_help_formatter(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    std::exit(0);
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    // An unknown flag explains the rest (a required option "missing", a value taken as a positional): it comes first.
    std::vector<std::string> extras = app.remaining();
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      for (const std::string& r : sub->remaining()) extras.push_back(r);
    const auto unknown =
        std::find_if(extras.begin(), extras.end(), [](const std::string& a) { return a.size() > 1 && a[0] == '-'; });
    if (unknown == extras.end()) usage_error(app, e.what());
    std::vector<std::string> known;
    known_names(app, known);
    const std::vector<std::string> near = nearest_names(*unknown, known);
    usage_error(app, fmt::format("unknown option '{}'{}", *unknown,
                                 near.empty() ? "" : fmt::format("; did you mean {}?", fmt::join(near, " or "))));
  }
}

// Runs a tool's body; an exception that escapes it (the library refusing a shape, memory that cannot be allocated)
// becomes a message and exit 1 instead of std::terminate.
inline int guarded(const std::string& tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    const std::string msg = e.what();
    if (msg.starts_with(tool + " ") || msg.starts_with(tool + ":"))  // "stats compare: ..." names the tool already
      std::fprintf(stderr, "%s\n", msg.c_str());
    else
      std::fprintf(stderr, "%s: %s\n", tool.c_str(), msg.c_str());
    return 1;
  }
}

// "a,b,c" -> {"a", "b", "c"}; an empty item (",," or a trailing comma) is kept as "" for the validators to refuse.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

template <class T>
std::string join_list(const std::vector<T>& items) {
  return fmt::format("{}", fmt::join(items, ","));
}

namespace detail {

// The whole of s as an integer / a finite real, or false (no partial parses: "12abc", "1e3" for an integer, "").
inline bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return false;
  out = v;
  return true;
}
inline bool parse_real(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  out = v;
  return true;
}

}  // namespace detail

// A number in [lo, hi]. CLI11's Range reports "Value abc not in range" for a value that is no number at all; these
// say which of the two is wrong.
inline CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        if (!detail::parse_int(s, v)) return fmt::format("'{}' is not an integer", s);
        if (v < lo || v > hi) return fmt::format("{} is outside [{}, {}]", v, lo, hi);
        return "";
      },
      fmt::format("in [{}, {}]", lo, hi));
}
inline CLI::Validator real_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (!detail::parse_real(s, v)) return fmt::format("'{}' is not a finite number", s);
        if (v < lo || v > hi) return fmt::format("{} is outside [{}, {}]", v, lo, hi);
        return "";
      },
      fmt::format("in [{}, {}]", lo, hi));
}

// Validators of comma-separated lists: each item an integer in [lo, hi], a real in [lo, hi], or one of `names`.
// The message names the first bad item, e.g. "--n: item 'abc' of '128,abc' is not an integer".
inline CLI::Validator int_list(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        for (const std::string& item : split_list(s)) {
          int64_t v = 0;
          if (!detail::parse_int(item, v)) return fmt::format("item '{}' of '{}' is not an integer", item, s);
          if (v < lo || v > hi) return fmt::format("item {} of '{}' is outside [{}, {}]", v, s, lo, hi);
        }
        return "";
      },
      fmt::format("each in [{}, {}]", lo, hi));
}
inline CLI::Validator real_list(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        for (const std::string& item : split_list(s)) {
          double v = 0;
          if (!detail::parse_real(item, v)) return fmt::format("item '{}' of '{}' is not a finite number", item, s);
          if (v < lo || v > hi) return fmt::format("item {} of '{}' is outside [{}, {}]", v, s, lo, hi);
        }
        return "";
      },
      fmt::format("each in [{}, {}]", lo, hi));
}
inline CLI::Validator name_list(std::vector<std::string> names) {
  return CLI::Validator(
      [names](std::string& s) -> std::string {
        for (const std::string& item : split_list(s))
          if (std::find(names.begin(), names.end(), item) == names.end())
            return fmt::format("unknown name '{}' in '{}' (known: {})", item, s, join_list(names));
        return "";
      },
      "");  // the names are listed in the option's description (add_name_list)
}

// List options bound to a vector: the default shown in --help is the vector's value; the validator runs before the
// vector is replaced, so a bad list leaves nothing half-parsed.
inline CLI::Option* add_int_list(CLI::App& app, const std::string& name, std::vector<int64_t>& out,
                                 const std::string& description, int64_t lo, int64_t hi) {
  return app
      .add_option_function<std::string>(
          name,
          [&out](const std::string& s) {
            out.clear();
            for (const std::string& item : split_list(s)) out.push_back(std::stoll(item));
          },
          description)
      ->check(int_list(lo, hi))
      ->type_name("N,...")
      ->default_str(join_list(out));
}
inline CLI::Option* add_real_list(CLI::App& app, const std::string& name, std::vector<double>& out,
                                  const std::string& description, double lo, double hi) {
  return app
      .add_option_function<std::string>(
          name,
          [&out](const std::string& s) {
            out.clear();
            for (const std::string& item : split_list(s)) out.push_back(std::stod(item));
          },
          description)
      ->check(real_list(lo, hi))
      ->type_name("X,...")
      ->default_str(join_list(out));
}
inline CLI::Option* add_name_list(CLI::App& app, const std::string& name, std::vector<std::string>& out,
                                  const std::string& description, const std::vector<std::string>& names) {
  return app
      .add_option_function<std::string>(
          name, [&out](const std::string& s) { out = split_list(s); },
          description + " (comma-separated, any of " + join_list(names) + ")")
      ->check(name_list(names))
      ->type_name("NAME,...")
      ->default_str(join_list(out));
}

// An output file: refused at parse time when it cannot be created (empty name, missing directory, a directory), so a
// long run does not end in "cannot write".
inline CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        namespace fs = std::filesystem;
        if (s.empty()) return "an empty file name";
        std::error_code ec;
        if (fs::is_directory(s, ec)) return fmt::format("'{}' is a directory", s);
        const fs::path dir = fs::path(s).parent_path();
        if (!dir.empty() && !fs::is_directory(dir, ec))
          return fmt::format("directory '{}' of '{}' does not exist", dir.string(), s);
        return "";
      },
      "");
}

// --csv FILE, --json FILE and --profile FILE of every benchmark.
struct Outputs {
  std::string csv, json, profile;
};
inline void add_output_options(CLI::App& app, Outputs& out) {
  app.add_option("--profile", out.profile,
                 "profile the whole run (core/profiler.h): the ops by self time on stderr at the end, a Chrome trace "
                 "in FILE (Perfetto opens it)")
      ->check(output_file())
      ->type_name("FILE");
  app.add_option("--csv", out.csv, "write the result rows as CSV to FILE")->check(output_file())->type_name("FILE");
  app.add_option("--json", out.json, "write the result rows as JSON to FILE: {\"rows\": [{column: value}], run facts}")
      ->check(output_file())
      ->type_name("FILE");
}

// A benchmark's --profile FILE: records from construction to destruction, then prints the table on stderr and writes
// the trace (under mpirun, rank r > 0 writes FILE.rank<r>). An empty path: nothing.
//   tools::ProfileRun profile_run(out.profile);
//   return tools::guarded("bench_x", [&] { ... });
class ProfileRun {
 public:
  explicit ProfileRun(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK"); rank && std::string(rank) != "0")
      path_ += std::string(".rank") + rank;
    profile_.emplace();
  }
  ~ProfileRun() {
    if (!profile_) return;
    try {
      profile_->stop();
      profile_->write_chrome_trace(path_);
      std::fprintf(stderr, "%sprofile: trace in %s\n", profile_->table(30).c_str(), path_.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "profile: %s\n", e.what());
    }
  }
  ProfileRun(const ProfileRun&) = delete;
  ProfileRun& operator=(const ProfileRun&) = delete;

 private:
  std::string path_;
  std::optional<asc::profiler::Profile> profile_;
};

// ---- progress -------------------------------------------------------------------------------------------------------

// "0.4s", "42s", "3m05s", "2h07m".
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 9.95) return fmt::format("{:.1f}s", seconds);
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, s % 3600 / 60);
}

// A count with an SI suffix and three significant digits: 950, 12.3k, 4.56M, 1.20G.
inline std::string format_si(double v) {
  const char* suffix[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (std::fabs(v) >= 999.5 && i < 4) v /= 1000, ++i;
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format(std::fabs(v) < 9.995 ? "{:.2f}{}" : std::fabs(v) < 99.95 ? "{:.1f}{}" : "{:.0f}{}", v, suffix[i]);
}

// A progress reporter on stderr:  label  done/total  [#####-----]  fields  elapsed  ETA
// On a terminal, one line redrawn in place (\r, then clear to end of line) at most 10 times a second. Otherwise (a
// log file, a pipe) a plain line every plain_every seconds (default 10), so a log is never flooded; finish() always
// writes the final line. A tool that prints on stdout while a progress line is drawn calls clear() first (stdout and
// stderr share the terminal); the next update() redraws it. total 0: unknown (no bar, no ETA).
class Progress {
 public:
  Progress(int64_t total, std::string label, std::FILE* out = stderr)
      : total_(std::max<int64_t>(total, 0)),
        label_(std::move(label)),
        out_(out),
        terminal_(isatty(fileno(out)) != 0),
        start_(Clock::now()),
        last_(start_) {}
  ~Progress() {
    if (drawn_) std::fputc('\n', out_);  // an exception left the line open: keep the next message on its own line
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_plain_every(double seconds) { plain_every_ = seconds; }
  // Where this process starts counting (a resumed run's first step): the ETA comes from the steps done since.
  void set_first(int64_t done) { first_ = done_ = done; }

  void update(int64_t done, const std::string& fields = "") {
    done_ = done;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (terminal_) {
      if (drawn_ && since < 0.1) return;
      std::fprintf(out_, "\r%s\033[K", line(done, fields).c_str());
      drawn_ = true;
    } else {
      if (since < plain_every_) return;
      std::fprintf(out_, "%s\n", line(done, fields).c_str());
    }
    std::fflush(out_);
    last_ = now;
  }

  // Erases the drawn line (terminal only) so that output on stdout starts at the left margin.
  void clear() {
    if (!terminal_ || !drawn_) return;
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
    drawn_ = false;
  }

  // The last line: the bar full, or with `reached_end` false (an interrupted run) where it stopped.
  void finish(const std::string& fields = "", bool reached_end = true) {
    if (terminal_) std::fputs("\r", out_);
    const int64_t done = total_ && reached_end ? std::max(done_, total_) : done_;
    std::fprintf(out_, "%s%s\n", line(done, fields, /*eta=*/false).c_str(), terminal_ ? "\033[K" : "");
    std::fflush(out_);
    drawn_ = false;
  }

  // The line as drawn (without \r or newline).
  std::string line(int64_t done, const std::string& fields, bool eta = true) const {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    std::string s = label_ + "  ";
    if (total_ > 0) {
      constexpr int kWidth = 20;
      const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
      const int filled = static_cast<int>(frac * kWidth);
      s += fmt::format("{}/{}  [{}{}]", done, total_, std::string(filled, '#'), std::string(kWidth - filled, '-'));
    } else {
      s += std::to_string(done);
    }
    if (!fields.empty()) s += "  " + fields;
    s += "  " + format_duration(elapsed);
    if (eta && total_ > 0 && done > first_ && done < total_)  // the rate of this process's own steps
      s +=
          "  ETA " + format_duration(elapsed / static_cast<double>(done - first_) * static_cast<double>(total_ - done));
    return s;
  }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_, done_ = 0, first_ = 0;
  std::string label_;
  std::FILE* out_;
  bool terminal_, drawn_ = false;
  double plain_every_ = 10;
  Clock::time_point start_, last_;
};

// ---- result tables --------------------------------------------------------------------------------------------------

// One value of a result row: its text in the CSV (formatted as the tool always wrote it) and its JSON value (the
// same number, parsed back from that text so both files agree; null for an empty cell or a non-finite number).
struct Cell {
  std::string text;
  Json value;

  static Cell fixed(double v, int decimals) { return number(fmt::format("{:.{}f}", v, decimals)); }
  static Cell general(double v, int significant) { return number(fmt::format("{:.{}g}", v, significant)); }
  static Cell integer(int64_t v) { return {std::to_string(v), v}; }
  static Cell str(std::string s) {
    Json j = s;
    return {std::move(s), std::move(j)};
  }
  static Cell blank() { return {"", nullptr}; }

 private:
  static Cell number(std::string text) {
    int64_t i = 0;
    double v = 0;
    if (detail::parse_int(text, i)) return {text, Json(i)};  // "%.0f" and the like: an integer in JSON too
    return {text, detail::parse_real(text, v) ? Json(v) : Json(nullptr)};
  }
};

// Rows of named columns, written as CSV (RFC 4180 quoting: a field with a comma, quote or newline is quoted) and as
// JSON: {"tool": ..., <run facts>, "columns": [...], "rows": [{column: value}, ...]}.
class Table {
 public:
  explicit Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}

  void add(std::vector<Cell> row) {
    if (row.size() != columns_.size())
      throw std::logic_error(fmt::format("result row of {} cells for {} columns", row.size(), columns_.size()));
    rows_.push_back(std::move(row));
  }
  size_t size() const { return rows_.size(); }

  std::string csv() const {
    auto field = [](const std::string& s) {
      if (s.find_first_of(",\"\n") == std::string::npos) return s;
      std::string q = "\"";
      for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
      return q + "\"";
    };
    std::string out;
    for (size_t c = 0; c < columns_.size(); ++c) out += (c ? "," : "") + field(columns_[c]);
    out += "\n";
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) out += (c ? "," : "") + field(row[c].text);
      out += "\n";
    }
    return out;
  }

  Json json(const Json& facts) const {
    Json j = facts;
    j["columns"] = columns_;
    j["rows"] = Json::array();
    for (const auto& row : rows_) {
      Json r = Json::object();
      for (size_t c = 0; c < row.size(); ++c) r[columns_[c]] = row[c].value;
      j["rows"].push_back(std::move(r));
    }
    return j;
  }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<Cell>> rows_;
};

// The processor as /proc/cpuinfo names it, with its family and model (a model name such as "AMD EPYC" covers several
// generations); empty fields where it says nothing.
struct CpuInfo {
  std::string model_name, family, model;
};
inline CpuInfo cpu_info() {
  CpuInfo c;
  std::ifstream cpuinfo("/proc/cpuinfo");
  auto value = [](const std::string& line) { return line.substr(line.find(':') + 2); };
  for (std::string line; std::getline(cpuinfo, line) && !line.empty();) {
    if (line.find(':') == std::string::npos || line.find(':') + 2 > line.size()) continue;
    if (line.rfind("model name", 0) == 0)
      c.model_name = value(line);
    else if (line.rfind("cpu family", 0) == 0)
      c.family = value(line);
    else if (line.rfind("model", 0) == 0 && line.rfind("model name", 0) != 0)
      c.model = value(line);
  }
  return c;
}

// One line for a benchmark's header: "AMD EPYC (family 26, model 2), CPU kernels x86-64-v4, GEMM OpenBLAS Cooperlake".
inline std::string cpu_line() {
  const CpuInfo c = cpu_info();
  std::string s = c.model_name.empty() ? "unknown CPU" : c.model_name;
  if (!c.family.empty()) s += " (family " + c.family + ", model " + c.model + ")";
  return s + ", CPU kernels " + asc::cpu_isa_name(asc::cpu_isa()) + ", GEMM " + asc::cpu_gemm_kernel();
}

// Facts of the run that make a result file readable on its own: the tool, its arguments, when, where (CPU model and
// family, the CPU kernels' instruction set level, hardware threads, host). Tools add their own (thread count, device).
inline Json run_facts(const std::string& tool, int argc, char** argv) {
  Json j;
  j["tool"] = tool;
  std::vector<std::string> args(argv + 1, argv + argc);
  j["args"] = args;
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["started_utc"] = when;
  const CpuInfo cpu = cpu_info();
  if (!cpu.model_name.empty()) j["cpu"] = cpu.model_name;
  if (!cpu.family.empty()) j["cpu_family"] = cpu.family, j["cpu_model"] = cpu.model;
  j["cpu_isa"] = asc::cpu_isa_name(asc::cpu_isa());
  j["cpu_gemm"] = asc::cpu_gemm_kernel();
  j["hardware_threads"] = std::thread::hardware_concurrency();
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) j["host"] = host;
  return j;
}

// Writes the table where --csv / --json ask; false (with a message on stderr) when a file cannot be written.
// announce: print "wrote FILE" on stdout, as the tools that did so before.
inline bool write_results(const Table& table, const Outputs& out, const Json& facts, bool announce) {
  const std::string tool = facts.value("tool", std::string("tool"));
  auto write = [&](const std::string& path, const std::string& text) {
    if (path.empty()) return true;
    std::ofstream f(path, std::ios::binary);
    f << text;
    f.close();
    if (!f) {
      std::fprintf(stderr, "%s: cannot write %s\n", tool.c_str(), path.c_str());
      return false;
    }
    if (announce) std::printf("wrote %s\n", path.c_str());
    return true;
  };
  const bool csv_ok = write(out.csv, table.csv());
  const bool json_ok = write(out.json, out.json.empty() ? "" : table.json(facts).dump(2) + "\n");
  return csv_ok && json_ok;
}

// ---- Python twins ----------------------------------------------------------------------------------------------

// Where a tool finds a file of its Python twin. Installed (<exe dir>/../share/ascender/ exists; the executable's own
// path from /proc/self/exe): there and only there, so an installed tool never reads a source tree that may have moved
// on or gone. From the build tree: ASC_SOURCE_DIR/tools/<file>. Empty when the file is not where it should be.
inline std::string twin_path(const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path share = fs::weakly_canonical(exe.parent_path() / ".." / "share" / "ascender", ec);
    if (!ec && fs::is_directory(share, ec)) return fs::is_regular_file(share / file, ec) ? (share / file).string() : "";
  }
#ifdef ASC_SOURCE_DIR
  const fs::path source = fs::path(ASC_SOURCE_DIR) / "tools" / file;
  if (fs::is_regular_file(source, ec)) return source.string();
#endif
  return "";
}

// The Python that runs the PyTorch twins: $ASC_TORCH_PYTHON; else, from the build tree, the virtual environment that
// tools/setup_bench.sh makes (current PyTorch from PyPI, its version pinned); else Debian's /usr/bin/python3 with
// python3-torch. Each twin prints the torch version it ran with, and the tools report it beside its figures.
inline std::string torch_python() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("ASC_TORCH_PYTHON"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
#ifdef ASC_SOURCE_DIR
  const fs::path venv = fs::path(ASC_SOURCE_DIR) / ".venv-bench" / "bin" / "python";
  if (fs::exists(venv, ec)) return venv.string();
#endif
  return "/usr/bin/python3";
}

// s as one word of a /bin/sh command line.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A command's standard output, or "" when it cannot start or exits with a status other than 0.
inline std::string run_command(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[4096];
  std::string out;
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  return pclose(p) == 0 ? out : "";
}

// Why a benchmark's PyTorch twin (`file`, found by twin_path) produced nothing, on stdout under `label`.
inline void print_twin_failure(const std::string& label, const std::string& file) {
  if (twin_path(file).empty())
    std::printf("%s: could not run (%s not found; installed: share/ascender/)\n", label.c_str(), file.c_str());
  else
    std::printf(
        "%s: could not run (needs torch in $ASC_TORCH_PYTHON, in .venv-bench from tools/setup_bench.sh, or in "
        "/usr/bin/python3: apt-get install python3-torch)\n",
        label.c_str());
}

}  // namespace asc::tools
