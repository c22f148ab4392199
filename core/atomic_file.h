#pragma once
// Files written whole or not at all: the bytes go to PATH.tmp, which is fsync'd and then renamed onto PATH. A reader —
// or a process resuming after `kill -9`, or after a power cut — finds the old file or the complete new one, never
// half of one. Every file the library and the trainer write in one piece goes through here (checkpoints, JSON
// files, predictions); a leftover PATH.tmp is a write that never finished and is safe to delete.
//
//   asc::write_file_atomic("runs/a/summary.json", text);
//
//   asc::AtomicFile f("runs/a/best.safetensors");   // streamed: nothing under the path until commit()
//   f.write(header.data(), header.size());
//   f.commit();                                      // fsync, rename; without it the destructor removes PATH.tmp
#include <string>
#include <string_view>

namespace asc {

class AtomicFile {
 public:
  // Creates (truncates) PATH.tmp; asc::Error when it cannot.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: PATH.tmp removed, PATH untouched
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync PATH.tmp, close it, rename it onto PATH. Two fault points (core/fault.h): before and after the rename.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// `text` to `path` through AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text);
// Removes `path` (if it exists) and fsyncs its directory, so that the removal survives a crash of the machine too.
void remove_durably(const std::string& path);

}  // namespace asc
