#pragma once
// The files a run writes as it goes (train/trainer.h): metrics.csv and metrics.jsonl (one row per log, validation and
// test), and JSON files written whole or not at all.
//
// Crash consistency: the metrics files are appended one whole record at a time (one write() each), the CSV header is
// written with the file, and a checkpoint records both files' sizes (bytes()), after sync(). A resumed run cuts the
// files back to those sizes (cut_metrics) — whatever a killed process appended after its last checkpoint, a row cut
// short included, goes — and appends from there. Every other file goes through core/atomic_file.h.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "train/step.h"

namespace asc::train {

// A finite number with 10 significant digits, anything else as an empty CSV field.
std::string num(double v);

class MetricsWriter {
 public:
  // fresh: both files created (emptied) and the CSV header written; otherwise appended to (created, with the header,
  // when metrics.csv does not exist).
  MetricsWriter(const std::filesystem::path& dir, std::vector<std::string> mech_columns, bool lm, bool fresh);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void row(int64_t step, double epoch, const std::string& split, double loss, double acc, double lr, double tps,
           double time_s, const json& mech, const std::map<std::string, double>& flat);
  // The files' sizes in bytes: what a checkpoint records as the resume point.
  int64_t csv_bytes() const { return csv_.bytes; }
  int64_t jsonl_bytes() const { return jsonl_.bytes; }
  // fsync both files (before a checkpoint records their sizes).
  void sync();

 private:
  struct File {
    int fd = -1;
    int64_t bytes = 0;
    std::string path;
  };
  void append(File& f, const std::string& record);
  File csv_, jsonl_;
  std::vector<std::string> mech_;
  bool lm_;
};

// A resumed run's metrics cut back to the sizes its checkpoint recorded (MetricsWriter::csv_bytes / jsonl_bytes).
// asc::Error (naming the file) when a file is missing or shorter than recorded: the directory was changed after the
// checkpoint, and appending to it would not make the run's file.
void cut_metrics(const std::filesystem::path& dir, int64_t csv_bytes, int64_t jsonl_bytes);

// The same for a checkpoint written before the sizes were recorded (format version 1 and 2): keeps the train and val
// rows up to `step` and the CSV header, drops a line cut short, and rewrites each file atomically.
void truncate_metrics(const std::filesystem::path& dir, int64_t step);

// Text to `p` whole or not at all (core/atomic_file.h).
void write_file_atomic(const std::filesystem::path& p, const std::string& text);
// JSON (indented, a final newline) the same way.
void write_json(const std::filesystem::path& p, const json& j);

}  // namespace asc::train
