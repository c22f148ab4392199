#pragma once
// The files a run writes as it goes (train/trainer.h): metrics.csv and metrics.jsonl (one row per log, validation and
// test), and JSON files written whole or not at all.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "train/step.h"

namespace asc::train {

// A finite number with 10 significant digits, anything else as an empty CSV field.
std::string num(double v);

class MetricsWriter {
 public:
  MetricsWriter(const std::filesystem::path& dir, std::vector<std::string> mech_columns, bool lm, bool append)
      : mech_(std::move(mech_columns)), lm_(lm) {
    const bool fresh = !append || !std::filesystem::exists(dir / "metrics.csv");
    csv_.open(dir / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
    jsonl_.open(dir / "metrics.jsonl", fresh ? std::ios::trunc : std::ios::app);
    ASC_CHECK(csv_ && jsonl_, "cannot write metrics files in {}", dir.string());
    if (fresh) {
      csv_ << "step,epoch,split,loss,accuracy,lr,tokens_per_s,time_s" << (lm_ ? ",bits_per_byte" : "");
      for (const auto& m : mech_) csv_ << "," << m;
      csv_ << "\n";
    }
  }
  void row(int64_t step, double epoch, const std::string& split, double loss, double acc, double lr, double tps,
           double time_s, const json& mech, const std::map<std::string, double>& flat) {
    csv_ << step << "," << num(epoch) << "," << split << "," << num(loss) << "," << num(acc) << "," << num(lr) << ","
         << num(tps) << "," << num(time_s);
    if (lm_) csv_ << "," << num(loss / std::log(2.0));
    for (const auto& m : mech_) {
      auto it = flat.find(m);
      csv_ << "," << (it == flat.end() ? "" : num(it->second));
    }
    csv_ << "\n";
    json j = {{"step", step},
              {"epoch", epoch},
              {"split", split},
              {"loss", jnum(loss)},
              {"accuracy", jnum(acc)},
              {"lr", lr},
              {"tokens_per_s", jnum(tps)},
              {"time_s", time_s}};
    if (lm_) j["bits_per_byte"] = jnum(loss / std::log(2.0));
    j["mech"] = mech.is_null() ? json::object() : mech;
    jsonl_ << j.dump() << "\n";
    csv_.flush(), jsonl_.flush();
  }

 private:
  std::ofstream csv_, jsonl_;
  std::vector<std::string> mech_;
  bool lm_;
};

// Keeps the train and val rows of metrics.csv / metrics.jsonl up to `step`: a resumed run rewrites what came after its
// checkpoint, and its own test row replaces any earlier one. A line cut short (a run killed mid-write) is dropped.
void truncate_metrics(const std::filesystem::path& dir, int64_t step);

// Text to `p` through a temporary file renamed into place: a reader sees the old file or the new one, never half.
void write_file_atomic(const std::filesystem::path& p, const std::string& text);
// JSON (indented, a final newline) the same way.
void write_json(const std::filesystem::path& p, const json& j);

}  // namespace asc::train
