// metrics.csv / metrics.jsonl and JSON files (train/metrics.h).
#include "train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/atomic_file.h"
#include "core/fault.h"

namespace asc::train {

namespace fs = std::filesystem;

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : ""; }

MetricsWriter::MetricsWriter(const fs::path& dir, std::vector<std::string> mech_columns, bool lm, bool fresh)
    : mech_(std::move(mech_columns)), lm_(lm) {
  const bool create = fresh || !fs::exists(dir / "metrics.csv");
  for (File* f : {&csv_, &jsonl_}) {
    f->path = (dir / (f == &csv_ ? "metrics.csv" : "metrics.jsonl")).string();
    f->fd = ::open(f->path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (create ? O_TRUNC : 0), 0644);
    if (f->fd < 0) {
      const int err = errno;
      if (csv_.fd >= 0) ::close(csv_.fd);  // the destructor does not run for a constructor that throws
      ASC_THROW("cannot write {}: {}", f->path, std::strerror(err));
    }
    const off_t end = ::lseek(f->fd, 0, SEEK_END);
    ASC_CHECK(end >= 0, "cannot seek in {}: {}", f->path, std::strerror(errno));
    f->bytes = end;
  }
  if (create) {  // the header with the file: a run killed before its first row still has it
    std::string h = "step,epoch,split,loss,accuracy,lr,tokens_per_s,time_s";
    if (lm_) h += ",bits_per_byte";
    for (const auto& m : mech_) h.append(",").append(m);
    append(csv_, h + "\n");
  }
}

MetricsWriter::~MetricsWriter() {
  for (File* f : {&csv_, &jsonl_})
    if (f->fd >= 0) ::close(f->fd);
}

// One record in one write() (O_APPEND): a kill leaves it whole or absent — or, in the fault hook's torn mode, cut
// short, which a resume's cut_metrics removes.
void MetricsWriter::append(File& f, const std::string& record) {
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(f.fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      ASC_CHECK(w > 0, "writing {} failed: {}", f.path, std::strerror(errno));
      p += w, n -= static_cast<size_t>(w);
    }
  };
  fault::write_point([&] { write_all(record.data(), record.size() / 2); });
  write_all(record.data(), record.size());
  f.bytes += static_cast<int64_t>(record.size());
}

void MetricsWriter::row(int64_t step, double epoch, const std::string& split, double loss, double acc, double lr,
                        double tps, double time_s, const json& mech, const std::map<std::string, double>& flat) {
  std::string csv = fmt::format("{},{},{},{},{},{},{},{}", step, num(epoch), split, num(loss), num(acc), num(lr),
                                num(tps), num(time_s));
  if (lm_) csv.append(",").append(num(loss / std::log(2.0)));
  for (const auto& m : mech_) {
    auto it = flat.find(m);
    csv.append(",");
    if (it != flat.end()) csv.append(num(it->second));
  }
  append(csv_, csv + "\n");
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
  append(jsonl_, j.dump() + "\n");
}

void MetricsWriter::sync() {
  for (File* f : {&csv_, &jsonl_})
    ASC_CHECK(::fsync(f->fd) == 0, "fsync of {} failed: {}", f->path, std::strerror(errno));
}

void cut_metrics(const fs::path& dir, int64_t csv_bytes, int64_t jsonl_bytes) {
  const std::pair<const char*, int64_t> files[] = {{"metrics.csv", csv_bytes}, {"metrics.jsonl", jsonl_bytes}};
  for (const auto& [name, size] : files) {  // both checked before either changes
    const fs::path p = dir / name;
    std::error_code ec;
    const auto have = fs::file_size(p, ec);
    ASC_CHECK(!ec && static_cast<int64_t>(have) >= size,
              "{} holds {} bytes, but the checkpoint was written when it held {}: the run directory was changed after "
              "its last checkpoint, so it cannot be continued; start the run again in a new --out",
              p.string(), ec ? std::string("no") : std::to_string(have), size);
  }
  for (const auto& [name, size] : files) {
    fs::resize_file(dir / name, static_cast<uintmax_t>(size));  // one truncate(2): atomic
    fault::write_point();
  }
}

void truncate_metrics(const fs::path& dir, int64_t step) {
  for (const char* name : {"metrics.csv", "metrics.jsonl"}) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) continue;
    const bool csv = std::string(name) == "metrics.csv";
    std::ifstream in(p);
    std::string keep, line;
    bool first = true;
    while (std::getline(in, line)) {
      if (line.empty() || in.eof()) continue;  // the last line without its newline: cut short
      if (csv && first) {
        keep += line + "\n", first = false;
        continue;
      }
      int64_t s = -1;
      std::string split;
      try {
        if (csv) {
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
      if (s <= step && split != "test") keep += line + "\n";
    }
    in.close();
    write_file_atomic(p, keep);
  }
}

void write_file_atomic(const fs::path& p, const std::string& text) { asc::write_file_atomic(p.string(), text); }

void write_json(const fs::path& p, const json& j) { write_file_atomic(p, j.dump(2) + "\n"); }

}  // namespace asc::train
