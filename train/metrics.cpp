// metrics.csv / metrics.jsonl and JSON files (train/metrics.h).
#include "train/metrics.h"

namespace asc::train {

namespace fs = std::filesystem;

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : ""; }

// Keeps the train and val rows of metrics.csv / metrics.jsonl up to `step`: a resumed run rewrites what came after its
// checkpoint, and its own test row replaces any earlier one. A line cut short (a run killed mid-write) is dropped.
void truncate_metrics(const fs::path& dir, int64_t step) {
  for (const char* name : {"metrics.csv", "metrics.jsonl"}) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) continue;
    std::ifstream in(p);
    std::vector<std::string> keep;
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (std::string(name) == "metrics.csv" && first) {
        keep.push_back(line), first = false;
        continue;
      }
      int64_t s = -1;
      std::string split;
      try {
        if (std::string(name) == "metrics.csv") {
          const size_t a = line.find(','), b = line.find(',', a + 1), e = line.find(',', b + 1);
          if (a == std::string::npos || b == std::string::npos || e == std::string::npos) continue;
          s = std::stoll(line.substr(0, a)), split = line.substr(b + 1, e - b - 1);
        } else {
          const json j = json::parse(line);
          s = j.at("step").get<int64_t>(), split = j.at("split").get<std::string>();
        }
      } catch (const std::exception&) {
        continue;  // a line cut short
      }
      if (s <= step && split != "test") keep.push_back(line);
    }
    in.close();
    std::ofstream o(p, std::ios::trunc);
    for (const auto& l : keep) o << l << "\n";
  }
}

void write_file_atomic(const fs::path& p, const std::string& text) {
  std::ofstream f(p.string() + ".tmp", std::ios::trunc);
  f << text;
  f.close();
  ASC_CHECK(f.good(), "cannot write {}", p.string());
  fs::rename(p.string() + ".tmp", p);
}

void write_json(const fs::path& p, const json& j) { write_file_atomic(p, j.dump(2) + "\n"); }

}  // namespace asc::train
