// The man-page text task and the user's file task (data/text.h, data/tasks.h).
#include "data/text.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <type_traits>

#include "core/error.h"
#include "data/tasks.h"

namespace asc::data {

namespace {

namespace fs = std::filesystem;

// Sequences of tokens held as T (uint8_t bytes or int64_t ids) with their labels; get(i) builds the (T) int64
// tensor. Immutable after construction, so get is thread-safe.
template <class T>
class SequenceDataset : public Dataset {
 public:
  SequenceDataset(std::vector<std::vector<T>> seqs, std::vector<int64_t> labels)
      : seqs_(std::move(seqs)), labels_(std::move(labels)) {}
  int64_t size() const override { return static_cast<int64_t>(seqs_.size()); }
  Example get(int64_t i) const override {
    ASC_CHECK(i >= 0 && i < size(), "SequenceDataset.get: index {} is out of range for {} examples (0 <= i < {})", i,
              size(), size());
    const std::vector<T>& s = seqs_[static_cast<size_t>(i)];
    Example ex;
    ex.input = empty({static_cast<int64_t>(s.size())}, {.dtype = kInt64});  // (T) token ids
    std::copy(s.begin(), s.end(), ex.input.data_ptr<int64_t>());
    ex.label = labels_[static_cast<size_t>(i)];
    return ex;
  }

 private:
  std::vector<std::vector<T>> seqs_;
  std::vector<int64_t> labels_;
};

// One split being assembled.
template <class T>
struct Split {
  std::vector<std::vector<T>> seqs;
  std::vector<int64_t> labels;
  // The first n examples (n = 0: all), as a Dataset; n above the split's size is an error.
  std::shared_ptr<const Dataset> take(int64_t n, const char* task, const char* name) {
    const int64_t have = static_cast<int64_t>(seqs.size());
    ASC_CHECK(have > 0, "{}: the {} split is empty", task, name);
    ASC_CHECK(n <= have, "{}: {}_size {} exceeds the {} examples of the {} split", task, name, n, have, name);
    if (n > 0) {
      seqs.resize(static_cast<size_t>(n));
      labels.resize(static_cast<size_t>(n));
    }
    return std::make_shared<const SequenceDataset<T>>(std::move(seqs), std::move(labels));
  }
};

// A text as the task's examples: cut at max_len (0: whole), or (windows) split into windows of max_len tokens that
// overlap by one, so that a language model predicts each token after the text's first exactly once. A last window
// of one token would predict nothing and is left out (so is a text of one token).
template <typename T>
std::vector<std::vector<T>> examples_of(std::vector<T> seq, const TaskOptions& options) {
  const size_t L = static_cast<size_t>(options.max_len);
  if (options.windows && seq.size() < 2) return {};  // nothing to predict
  if (L == 0 || seq.size() <= L) return {std::move(seq)};
  if (!options.windows) {
    seq.resize(L);
    return {std::move(seq)};
  }
  std::vector<std::vector<T>> out;
  for (size_t start = 0; start + 1 < seq.size(); start += L - 1)
    out.emplace_back(seq.begin() + static_cast<std::ptrdiff_t>(start),
                     seq.begin() + static_cast<std::ptrdiff_t>(std::min(seq.size(), start + L)));
  return out;
}

void check_windows(const TaskOptions& options, const char* task) {
  ASC_CHECK(!options.windows || options.max_len >= 2,
            "{}: windows need max_len >= 2 (the window's length), got max_len {}", task, options.max_len);
}

int64_t longest(const auto*... splits) {
  size_t m = 0;
  for (const auto* s : {splits...})
    for (const auto& q : s->seqs) m = std::max(m, q.size());
  return static_cast<int64_t>(m);
}

// FNV-1a, 64 bit: a hash that is the same on every platform and standard library (std::hash is not).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------------------------
// text: the man pages of `manpages` and `manpages-dev`.

const char* const kManRoot = "/usr/share/man/";

// Section directory -> class; directories not listed (man1, man6, man8) are dropped.
int man_class_of(const std::string& section_dir) {
  if (section_dir == "man2") return 0;
  if (section_dir == "man3") return 1;
  if (section_dir == "man4" || section_dir == "man5") return 2;
  if (section_dir == "man7") return 3;
  return -1;
}

// The roff source without comment lines and the .TH title line (which names the section, i.e. the label).
std::string strip_page(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  size_t pos = 0;
  while (pos < src.size()) {
    size_t end = src.find('\n', pos);
    end = end == std::string::npos ? src.size() : end + 1;
    const std::string_view line(src.data() + pos, end - pos);
    const bool comment = line.starts_with(".\\\"") || line.starts_with("'\\\"");
    const bool title = line.starts_with(".TH ") || line.starts_with(".TH\t");
    if (!comment && !title) out.append(line);
    pos = end;
  }
  return out;
}

// A `.so other/page.N` redirect: nothing but that one request (after comments are stripped) and white space.
bool is_so_stub(const std::string& stripped) {
  size_t b = stripped.find_first_not_of(" \t\r\n");
  if (b == std::string::npos || stripped.compare(b, 4, ".so ") != 0) return false;
  const size_t eol = stripped.find('\n', b);
  return eol == std::string::npos || stripped.find_first_not_of(" \t\r\n", eol) == std::string::npos;
}

// The English man pages dpkg lists for `pkg`: /usr/share/man/manN/FILE.
std::vector<std::string> listed_pages(const std::string& pkg) {
  const std::string list = "/var/lib/dpkg/info/" + pkg + ".list";
  std::ifstream in(list);
  ASC_CHECK(in.good(),
            "text: package {} is not installed ({} not found); install the man pages with: apt-get install manpages "
            "manpages-dev (or bash tools/setup.sh)",
            pkg, list);
  std::vector<std::string> pages;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(kManRoot)) continue;
    const std::string rel = line.substr(std::strlen(kManRoot));  // "man2/access.2.gz"
    const size_t slash = rel.find('/');
    if (!rel.starts_with("man") || slash == std::string::npos || slash + 1 == rel.size() ||
        rel.find('/', slash + 1) != std::string::npos)
      continue;  // a directory, or a translated page (/usr/share/man/<lang>/manN/...)
    pages.push_back(rel);
  }
  return pages;
}

}  // namespace

const std::vector<std::string>& man_page_class_names() {
  static const std::vector<std::string> names = {"2: system calls", "3: library functions",
                                                 "4+5: special files and file formats",
                                                 "7: overviews, conventions and miscellany"};
  return names;
}

Task text_task(const TaskOptions& options) {
  ASC_CHECK(options.data_dir.empty(),
            "text: data_dir '{}' is not used: the pages are those dpkg lists for manpages and manpages-dev",
            options.data_dir);
  const int64_t max_len = options.max_len > 0 ? options.max_len : 4096;
  const int64_t min_len = options.min_len;
  ASC_CHECK(options.windows || min_len <= max_len, "text: min_len {} exceeds max_len {}", min_len, max_len);
  TaskOptions cut = options;
  cut.max_len = max_len;
  check_windows(cut, "text");

  std::vector<std::string> pages = listed_pages("manpages");
  for (std::string& p : listed_pages("manpages-dev")) pages.push_back(std::move(p));
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());

  Split<uint8_t> train, val, test;
  int64_t links = 0, stubs = 0, dropped_section = 0, too_short = 0, missing = 0;
  std::string first_missing;
  for (const std::string& rel : pages) {
    const std::string path = kManRoot + rel;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) {
      if (missing++ == 0) first_missing = path;
      continue;
    }
    if (S_ISLNK(st.st_mode)) {  // another name of a page already in the list
      ++links;
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    const int cls = man_class_of(rel.substr(0, rel.find('/')));
    if (cls < 0) {
      ++dropped_section;
      continue;
    }
    const std::string body = strip_page(read_file_maybe_gzip(path));
    if (is_so_stub(body)) {
      ++stubs;
      continue;
    }
    const int64_t n = options.windows ? static_cast<int64_t>(body.size())
                                      : std::min<int64_t>(static_cast<int64_t>(body.size()), max_len);
    if (n < min_len || n == 0) {
      ++too_short;
      continue;
    }
    const uint64_t bucket = fnv1a(rel) % 10;
    Split<uint8_t>& s = bucket == 0 ? test : bucket == 1 ? val : train;
    for (std::vector<uint8_t>& e : examples_of(std::vector<uint8_t>(body.begin(), body.end()), cut)) {
      s.seqs.push_back(std::move(e));
      s.labels.push_back(cls);
    }
  }
  ASC_CHECK(missing == 0,
            "text: {} of the {} man pages dpkg lists are missing (first: {}); a dpkg path-exclude (see "
            "/etc/dpkg/dpkg.cfg.d/) may have dropped them: remove it and run apt-get install --reinstall manpages "
            "manpages-dev",
            missing, pages.size(), first_missing);

  Task task;
  task.name = "text";
  task.max_len = longest(&train, &val, &test);
  task.train = train.take(options.train_size, "text", "train");
  task.val = val.take(options.val_size, "text", "val");
  task.test = test.take(options.test_size, "text", "test");
  task.vocab = 256;
  task.classes = 4;
  task.pad_id = 0;  // the loader's valid mask marks padding: its value never matters
  task.class_names = man_page_class_names();
  task.description = fmt::format(
      "man pages of Debian's manpages + manpages-dev as bytes, labelled by section (2 / 3 / 4+5 / 7): {} train / {} "
      "val / {} test {} (split by file-name hash), {} {} bytes; skipped: {} symlinks, {} .so stubs, {} in "
      "sections 1/6/8, {} shorter than min_len {}",
      task.train->size(), task.val->size(), task.test->size(), options.windows ? "windows" : "pages",
      options.windows ? "pages in windows of" : "cut to", max_len, links, stubs, dropped_section, too_short, min_len);
  return task;
}

// ---------------------------------------------------------------------------------------------------------------
// fortunes: Debian's fortune texts by topic.

namespace {

const char* const kFortuneRoot = "/usr/share/games/fortunes/";

// The version dpkg records as installed for `pkg` ("" when it is not installed).
std::string installed_version(const std::string& pkg) {
  std::ifstream in("/var/lib/dpkg/status");
  std::string line, package, version, status;
  auto done = [&] { return package == pkg && status == "install ok installed"; };
  while (std::getline(in, line)) {
    if (line.empty()) {  // the end of one package's paragraph
      if (done()) return version;
      package.clear(), version.clear(), status.clear();
    } else if (line.starts_with("Package: ")) {
      package = line.substr(9);
    } else if (line.starts_with("Version: ")) {
      version = line.substr(9);
    } else if (line.starts_with("Status: ")) {
      status = line.substr(8);
    }
  }
  return done() ? version : "";
}

// The texts of one fortune file: the blocks between lines that hold only "%", without their last line end.
std::vector<std::string> fortune_texts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ASC_CHECK(in.good(), "fortunes: cannot read {} (apt-get install fortunes={}, or bash tools/setup.sh)", path,
            kFortunesVersion);
  std::vector<std::string> out;
  std::string text, line;
  auto flush = [&] {
    if (text.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(text.substr(0, text.size() - 1));
    text.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      flush();
    } else {
      text += line;
      text += '\n';
    }
  }
  flush();
  return out;
}

}  // namespace

const std::vector<std::string>& fortune_topics() {
  static const std::vector<std::string> topics = {"computers", "definitions", "people", "politics"};
  return topics;
}

Task fortunes_task(const TaskOptions& options) {
  ASC_CHECK(options.data_dir.empty(),
            "fortunes: data_dir '{}' is not used: the texts are those of the Debian package fortunes {}",
            options.data_dir, kFortunesVersion);
  ASC_CHECK(!options.windows, "fortunes: a classification task (no windows)");
  const std::string version = installed_version("fortunes");
  ASC_CHECK(!version.empty(),
            "fortunes: the Debian package fortunes is not installed: apt-get install fortunes={} "
            "(or bash tools/setup.sh)",
            kFortunesVersion);
  ASC_CHECK(version == kFortunesVersion,
            "fortunes: the task is defined on fortunes {} (its texts make the splits), but {} is installed: apt-get "
            "install fortunes={}",
            kFortunesVersion, version, kFortunesVersion);
  const int64_t max_len = options.max_len > 0 ? options.max_len : 256;
  ASC_CHECK(options.min_len <= max_len, "fortunes: min_len {} exceeds max_len {}", options.min_len, max_len);

  // Every text with its topic; a text in two topics is ambiguous and dropped from both.
  const std::vector<std::string>& topics = fortune_topics();
  std::map<std::string, int64_t> topic_of;  // text -> topic, or -1: ambiguous
  for (size_t t = 0; t < topics.size(); ++t)
    for (std::string& text : fortune_texts(kFortuneRoot + topics[t])) {
      auto [it, fresh] = topic_of.emplace(std::move(text), static_cast<int64_t>(t));
      if (!fresh && it->second != static_cast<int64_t>(t)) it->second = -1;
    }
  std::vector<std::vector<std::pair<uint64_t, const std::string*>>> by_topic(topics.size());
  int64_t ambiguous = 0, too_short = 0;
  for (const auto& [text, t] : topic_of) {
    if (t < 0) {
      ++ambiguous;
      continue;
    }
    if (static_cast<int64_t>(std::min<size_t>(text.size(), static_cast<size_t>(max_len))) < options.min_len) {
      ++too_short;
      continue;
    }
    by_topic[static_cast<size_t>(t)].emplace_back(fnv1a(text), &text);
  }
  // Per topic in hash order: the first quarter test, the next 5 % validation, the rest train.
  struct Item {
    uint64_t hash;
    const std::string* text;
    int64_t label;
  };
  std::vector<Item> parts[3];  // train, val, test
  for (size_t t = 0; t < by_topic.size(); ++t) {
    auto& v = by_topic[t];
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : *a.second < *b.second;
    });
    const size_t n_test = v.size() / 4, n_val = v.size() / 20;
    for (size_t i = 0; i < v.size(); ++i)
      parts[i < n_test ? 2 : i < n_test + n_val ? 1 : 0].push_back({v[i].first, v[i].second, int64_t(t)});
  }
  Split<uint8_t> splits[3];
  for (int k = 0; k < 3; ++k) {
    std::sort(parts[k].begin(), parts[k].end(),
              [](const Item& a, const Item& b) { return a.hash != b.hash ? a.hash < b.hash : *a.text < *b.text; });
    for (const Item& item : parts[k]) {
      const size_t n = std::min(item.text->size(), static_cast<size_t>(max_len));
      splits[k].seqs.emplace_back(item.text->begin(), item.text->begin() + static_cast<std::ptrdiff_t>(n));
      splits[k].labels.push_back(item.label);
    }
  }
  Task task;
  task.name = "fortunes";
  task.max_len = longest(&splits[0], &splits[1], &splits[2]);
  task.train = splits[0].take(options.train_size, "fortunes", "train");
  task.val = splits[1].take(options.val_size, "fortunes", "val");
  task.test = splits[2].take(options.test_size, "fortunes", "test");
  task.vocab = 256;
  task.classes = static_cast<int64_t>(topics.size());
  task.pad_id = 0;  // the loader's valid mask marks padding
  task.class_names = topics;
  task.description = fmt::format(
      "fortunes {} by topic (computers / definitions / people / politics) as bytes cut to {}: {} train / {} val / "
      "{} test texts (split per topic by a hash of the text); skipped: {} in two topics, {} shorter than min_len {}",
      kFortunesVersion, max_len, task.train->size(), task.val->size(), task.test->size(), ambiguous, too_short,
      options.min_len);
  return task;
}

// ---------------------------------------------------------------------------------------------------------------
// file:PATH — the user's own label<SEP>text table.

namespace {

struct Record {
  int64_t line = 0;  // 1-based line where the record starts
  std::string label, text;
};

struct TableFile {
  std::string path;
  char sep = '\t';
  std::string header;  // "", "text" or "ids"
  std::vector<Record> records;
};

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// The file name without a trailing ".gz".
std::string base_name(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.size() > 3 && name.ends_with(".gz")) name.resize(name.size() - 3);
  return name;
}

// Splits `content` into records (see data/text.h for the format).
TableFile parse_table(const std::string& path) {
  std::string content = read_file_maybe_gzip(path);
  if (content.starts_with("\xEF\xBB\xBF")) content.erase(0, 3);  // a UTF-8 byte-order mark (spreadsheet exports)
  ASC_CHECK(!trim(content).empty(), "file: {} is empty (expected lines of label<TAB or ,>text)", path);

  TableFile t;
  t.path = path;
  const std::string name = lower(base_name(path));
  if (name.ends_with(".tsv")) {
    t.sep = '\t';
  } else if (name.ends_with(".csv")) {
    t.sep = ',';
  } else {
    const std::string_view first(content.data(), std::min(content.find('\n'), content.size()));
    ASC_CHECK(first.find('\t') != std::string_view::npos || first.find(',') != std::string_view::npos,
              "file: {}:1: cannot tell the separator: the first line holds neither a tab nor a comma (expected "
              "label<TAB or ,>text; name the file .tsv or .csv)",
              path);
    t.sep = first.find('\t') != std::string_view::npos ? '\t' : ',';
  }
  const bool csv = t.sep == ',';
  const char* sep_name = csv ? "comma" : "tab";

  size_t pos = 0;
  int64_t line = 1;
  const size_t n = content.size();
  // A CSV field starting at pos with a quote: returns the unquoted value, leaves pos after the closing quote.
  auto quoted = [&](size_t& p, int64_t start_line, const char* what) {
    std::string v;
    ++p;  // the opening quote
    for (;;) {
      ASC_CHECK(p < n, "file: {}:{}: the quoted {} is never closed (expected a closing \")", path, start_line, what);
      const char c = content[p];
      if (c == '"') {
        if (p + 1 < n && content[p + 1] == '"') {
          v.push_back('"');
          p += 2;
          continue;
        }
        ++p;
        return v;
      }
      if (c == '\n') ++line;
      v.push_back(c);
      ++p;
    }
  };
  while (pos < n) {
    const int64_t start = line;
    size_t eol = content.find('\n', pos);
    if (eol == std::string::npos) eol = n;
    if (trim(std::string_view(content).substr(pos, eol - pos)).empty()) {  // a blank line
      pos = eol + 1;
      ++line;
      continue;
    }
    Record r;
    r.line = start;
    // 1. label
    if (csv && content[pos] == '"') {
      r.label = quoted(pos, start, "label");
      ASC_CHECK(pos < n && content[pos] == ',', "file: {}:{}: expected a comma after the quoted label", path, start);
      ++pos;
    } else {
      const size_t s = content.find(t.sep, pos);
      ASC_CHECK(s != std::string::npos && s < eol, "file: {}:{}: expected label{}text, found no {} on the line", path,
                start, csv ? "," : "<TAB>", sep_name);
      r.label = content.substr(pos, s - pos);
      pos = s + 1;
    }
    r.label = std::string(trim(r.label));
    ASC_CHECK(!r.label.empty(), "file: {}:{}: the label (first field) is empty", path, start);
    // 2. text: quoted (CSV) or the rest of the line
    if (csv && pos < n && content[pos] == '"') {
      r.text = quoted(pos, start, "text");
      size_t after = pos;
      while (after < n && (content[after] == '\r' || content[after] == ' ' || content[after] == '\t')) ++after;
      ASC_CHECK(after == n || content[after] == '\n',
                "file: {}:{}: unexpected characters after the closing quote of the text (expected the end of the line)",
                path, line);
      pos = after + 1;
      ++line;
    } else {
      eol = content.find('\n', pos);
      if (eol == std::string::npos) eol = n;
      size_t end = eol;
      if (end > pos && content[end - 1] == '\r') --end;  // CRLF line ends
      r.text = content.substr(pos, end - pos);
      pos = eol + 1;
      ++line;
    }
    ASC_CHECK(!r.text.empty(), "file: {}:{}: the text (second field) is empty", path, r.line);
    t.records.push_back(std::move(r));
  }
  // 3. A header record names the mode.
  if (!t.records.empty() && lower(t.records[0].label) == "label") {
    const std::string h = lower(trim(t.records[0].text));
    ASC_CHECK(h == "text" || h == "ids",
              "file: {}:{}: a header's second field must be 'text' (bytes) or 'ids' (token ids), found '{}'", path,
              t.records[0].line, t.records[0].text);
    t.header = h;
    t.records.erase(t.records.begin());
  }
  ASC_CHECK(!t.records.empty(), "file: {} holds no examples, only a header", path);
  return t;
}

bool is_integer(const std::string& s) {
  const size_t b = s[0] == '-' ? 1 : 0;
  return s.size() > b && s.find_first_not_of("0123456789", b) == std::string::npos;
}

// Whitespace-separated non-negative ids; max_id is raised to the largest.
std::vector<int64_t> parse_ids(const Record& r, const std::string& path, int64_t& max_id) {
  std::vector<int64_t> ids;
  const char* p = r.text.data();
  const char* const end = p + r.text.size();
  while (p < end) {
    while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
    if (p == end) break;
    const char* q = p;
    while (q < end && !std::isspace(static_cast<unsigned char>(*q))) ++q;
    int64_t v = -1;
    const auto [ptr, ec] = std::from_chars(p, q, v);
    ASC_CHECK(ec == std::errc() && ptr == q && v >= 0 && v < kMaxFileVocab,
              "file: {}:{}: token '{}' is not a token id (expected whitespace-separated integers in [0, {}))", path,
              r.line, std::string(p, q), kMaxFileVocab);
    max_id = std::max(max_id, v);
    ids.push_back(v);
    p = q;
  }
  ASC_CHECK(!ids.empty(), "file: {}:{}: no token ids in the second field", path, r.line);
  return ids;
}

// The sibling of `path` for `split` ("val" / "test"), or "" when the name holds no "train" or the file is absent.
std::string sibling(const std::string& path, const std::string& split) {
  const fs::path p(path);
  std::string name = p.filename().string();
  const size_t at = name.rfind("train");
  if (at == std::string::npos) return "";
  name.replace(at, 5, split);
  const fs::path s = p.parent_path() / name;
  std::error_code ec;
  return fs::is_regular_file(s, ec) ? s.string() : "";
}

template <class T>
Task build_file_task(const std::string& path, const TaskOptions& options, std::vector<TableFile>& files,
                     const std::vector<int>& file_split, bool ids_mode) {
  // 1. Labels: all class ids or all class names, over every file.
  const Record* first_num = nullptr;
  const Record* first_name = nullptr;
  std::string num_path, name_path;
  for (const TableFile& f : files)
    for (const Record& r : f.records) {
      if (is_integer(r.label) ? !first_num : !first_name) {
        (is_integer(r.label) ? first_num : first_name) = &r;
        (is_integer(r.label) ? num_path : name_path) = f.path;
      }
    }
  ASC_CHECK(!first_num || !first_name,
            "file: {}:{}: label '{}' is a number but {}:{} has the class name '{}': use class ids >= 0 or class "
            "names throughout",
            num_path, first_num ? first_num->line : 0, first_num ? first_num->label : "", name_path,
            first_name ? first_name->line : 0, first_name ? first_name->label : "");
  std::vector<std::string> class_names;
  std::map<std::string, int64_t> name_ids;
  int64_t max_label = -1;
  // 2. Sequences, labelled, in file order: (file, record) -> split via file_split (or the seed's draw later).
  struct Item {
    std::vector<T> seq;
    int64_t label;
    int split;  // 0 train, 1 val, 2 test, -1 not yet decided (cut from the main file)
  };
  std::vector<Item> items;
  int64_t max_id = -1, too_short = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const TableFile& f = files[fi];
    for (const Record& r : f.records) {
      int64_t label;
      if (first_name) {
        auto [it, added] = name_ids.emplace(r.label, static_cast<int64_t>(class_names.size()));
        if (added) class_names.push_back(r.label);
        label = it->second;
      } else {
        int64_t v = -1;
        const auto [ptr, ec] = std::from_chars(r.label.data(), r.label.data() + r.label.size(), v);
        ASC_CHECK(ec == std::errc() && v >= 0 && v < kMaxFileClasses,
                  "file: {}:{}: class id {} is out of range (expected an integer in [0, {}))", f.path, r.line, r.label,
                  kMaxFileClasses);
        label = v;
        max_label = std::max(max_label, v);
      }
      std::vector<T> seq;
      if constexpr (std::is_same_v<T, int64_t>) {
        seq = parse_ids(r, f.path, max_id);
      } else {
        seq.assign(r.text.begin(), r.text.end());
      }
      const int64_t n = options.windows || options.max_len == 0
                            ? static_cast<int64_t>(seq.size())
                            : std::min<int64_t>(static_cast<int64_t>(seq.size()), options.max_len);
      if (n < options.min_len) {
        ++too_short;
        continue;
      }
      items.push_back(
          {std::move(seq), label, file_split[fi]});  // cut or split into windows below, once its split is known
    }
  }
  // 3. Splits missing a sibling file are cut from the main file by a permutation drawn from the seed.
  std::vector<size_t> undecided;
  for (size_t k = 0; k < items.size(); ++k)
    if (items[k].split < 0) undecided.push_back(k);
  const bool need_val = std::find(file_split.begin(), file_split.end(), 1) == file_split.end();
  const bool need_test = std::find(file_split.begin(), file_split.end(), 2) == file_split.end();
  const size_t cut = std::max<size_t>(1, undecided.size() / 10);
  const size_t needed = (need_val ? cut : 0) + (need_test ? cut : 0);
  ASC_CHECK(undecided.size() > needed,
            "file: {} holds {} usable examples: too few to cut {}{}{} from it (need at least {}; or put val / test "
            "files beside it)",
            path, undecided.size(), need_val ? "a validation split" : "", need_val && need_test ? " and " : "",
            need_test ? "a test split" : "", needed + 1);
  std::vector<size_t> perm = undecided;
  uint64_t state = options.seed;
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[splitmix64(state) % i]);
  size_t k = 0;
  if (need_val)
    for (size_t e = k + cut; k < e; ++k) items[perm[k]].split = 1;
  if (need_test)
    for (size_t e = k + cut; k < e; ++k) items[perm[k]].split = 2;
  for (; k < perm.size(); ++k) items[perm[k]].split = 0;

  Split<T> splits[3];
  for (Item& it : items)  // a text's windows all go where the text goes: none of them leaks into another split
    for (std::vector<T>& e : examples_of(std::move(it.seq), options)) {
      splits[it.split].seqs.push_back(std::move(e));
      splits[it.split].labels.push_back(it.label);
    }
  Task task;
  task.name = "file:" + path;
  task.max_len = longest(&splits[0], &splits[1], &splits[2]);
  task.train = splits[0].take(options.train_size, "file", "train");
  task.val = splits[1].take(options.val_size, "file", "val");
  task.test = splits[2].take(options.test_size, "file", "test");
  task.vocab = ids_mode ? max_id + 1 : 256;
  if (first_name) {
    task.classes = static_cast<int64_t>(class_names.size());
    task.class_names = std::move(class_names);
  } else {
    task.classes = max_label + 1;
    for (int64_t c = 0; c < task.classes; ++c) task.class_names.push_back(std::to_string(c));
  }
  task.pad_id = 0;  // the loader's valid mask marks padding: its value never matters
  std::string from;
  for (size_t fi = 1; fi < files.size(); ++fi) from += ", " + files[fi].path;
  task.description = fmt::format(
      "{}{}: {} train / {} val / {} test {}{}, {} classes ({}), {}; longest {}{}", path, from, task.train->size(),
      task.val->size(), task.test->size(), options.windows ? "windows" : "examples",
      need_val || need_test ? fmt::format(" (cut by seed {})", options.seed) : "", task.classes,
      first_name ? "names" : "ids", ids_mode ? fmt::format("token ids (vocab {})", task.vocab) : "bytes (vocab 256)",
      task.max_len, too_short ? fmt::format("; {} shorter than min_len skipped", too_short) : "");
  return task;
}

}  // namespace

Task file_task(const std::string& path, const TaskOptions& options) {
  ASC_CHECK(options.data_dir.empty(), "file: data_dir '{}' is not used: the path is the one in file:PATH ({})",
            options.data_dir, path);
  std::error_code ec;
  ASC_CHECK(fs::is_regular_file(path, ec), "file: {} not found (expected a .tsv / .csv file of label<SEP>text lines)",
            path);
  check_windows(options, "file");
  std::vector<TableFile> files{parse_table(path)};
  std::vector<int> file_split{-1};  // the main file: train, and any split without a sibling
  for (const auto& [split, id] : {std::pair<const char*, int>{"val", 1}, {"test", 2}}) {
    const std::string s = sibling(path, split);
    if (s.empty()) continue;
    files.push_back(parse_table(s));
    file_split.push_back(id);
  }
  const std::string mode = files[0].header.empty() ? "text" : files[0].header;
  for (const TableFile& f : files)
    ASC_CHECK(f.header.empty() || f.header == mode,
              "file: {}:1: its header says '{}' but {} is read as '{}' (the first file's header decides)", f.path,
              f.header, path, mode);
  if (mode == "ids") return build_file_task<int64_t>(path, options, files, file_split, true);
  return build_file_task<uint8_t>(path, options, files, file_split, false);
}

}  // namespace asc::data
