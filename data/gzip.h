#pragma once
// Reading a data file that may be gzip-compressed: one reader for the IDX files, the text and TSV / CSV tasks and
// the tools. A file that starts with gzip's magic bytes (1f 8b) is decompressed, every member of a multi-member file
// in turn (what `cat a.gz b.gz` makes is valid gzip); anything else is read as it is. Unlike zlib's gzread, which
// returns what it has when the input ends early, the reader refuses:
//   - a stream that ends before its member does (a truncated download or copy),
//   - bytes after the last member that are not another member (trailing garbage),
//   - a member whose data, CRC-32 or length does not check out (corruption).
//
//   asc::data::CompressedReader r("train-images-idx3-ubyte.gz", "read_idx");
//   std::vector<uint8_t> head(16);
//   size_t got = r.read(head.data(), head.size());     // fewer than asked only at the end of the data
//
//   std::string text = asc::data::read_file_maybe_gzip("corpus.tsv.gz");
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace asc::data {

class CompressedReader {
 public:
  // `who` opens every error message ("read_idx: FILE: ..."). A missing file, a directory or one that cannot be
  // opened is an asc::Error.
  CompressedReader(const std::string& path, std::string who);
  ~CompressedReader();
  CompressedReader(const CompressedReader&) = delete;
  CompressedReader& operator=(const CompressedReader&) = delete;

  // Up to n bytes of the (decompressed) data into dst; fewer only when the data ends. asc::Error for the faults
  // above, naming the file.
  size_t read(uint8_t* dst, size_t n);
  bool compressed() const { return gzip_; }

 private:
  bool refill();  // more input; false at the end of the file
  void start();   // the first bytes: gzip or plain
  struct Stream;
  std::string path_, who_;
  std::FILE* f_ = nullptr;
  bool gzip_ = false, in_member_ = false, done_ = false, eof_ = false;
  int64_t members_ = 0;
  std::unique_ptr<Stream> z_;
};

// The whole content of a file, decompressed when it is gzip (CompressedReader's checks); `who` opens the messages.
std::string read_file_maybe_gzip(const std::string& path, const std::string& who = "read_file");

}  // namespace asc::data
