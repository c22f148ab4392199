// Reading files that may be gzip-compressed (data/gzip.h): zlib's inflate, one member after another.
#include "data/gzip.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace asc::data {

struct CompressedReader::Stream {
  z_stream s{};
  std::vector<uint8_t> in = std::vector<uint8_t>(size_t{1} << 18);
  bool init = false;
  ~Stream() {
    if (init) inflateEnd(&s);
  }
};

CompressedReader::CompressedReader(const std::string& path, std::string who)
    : path_(path), who_(std::move(who)), z_(std::make_unique<Stream>()) {
  std::error_code ec;
  ASC_CHECK(std::filesystem::is_regular_file(path, ec), "{}: {} not found (or not a regular file)", who_, path);
  f_ = std::fopen(path.c_str(), "rb");
  ASC_CHECK(f_ != nullptr, "{}: cannot open {}: {}", who_, path, std::strerror(errno));
  try {
    start();
  } catch (...) {  // the destructor does not run for a constructor that throws
    std::fclose(f_);
    f_ = nullptr;
    throw;
  }
}

void CompressedReader::start() {
  const std::string& path = path_;
  refill();
  z_stream& s = z_->s;
  gzip_ = s.avail_in >= 2 && s.next_in[0] == 0x1f && s.next_in[1] == 0x8b;
  if (gzip_) {
    ASC_CHECK(inflateInit2(&s, 16 + MAX_WBITS) == Z_OK, "{}: {}: zlib could not start", who_, path);  // gzip only
    z_->init = true;
    in_member_ = true, members_ = 1;
  } else if (s.avail_in == 1 && s.next_in[0] == 0x1f) {
    ASC_THROW("{}: {}: one byte long; a gzip stream that ends inside its header?", who_, path);
  }
}

CompressedReader::~CompressedReader() {
  if (f_) std::fclose(f_);
}

bool CompressedReader::refill() {
  z_stream& s = z_->s;
  if (eof_) return false;
  // keep what inflate has not used yet at the front of the buffer
  const size_t keep = s.avail_in;
  if (keep > 0 && s.next_in != z_->in.data()) std::memmove(z_->in.data(), s.next_in, keep);
  const size_t got = std::fread(z_->in.data() + keep, 1, z_->in.size() - keep, f_);
  ASC_CHECK(!std::ferror(f_), "{}: {}: read error: {}", who_, path_, std::strerror(errno));
  if (got == 0) eof_ = true;
  s.next_in = z_->in.data();
  s.avail_in = static_cast<uInt>(keep + got);
  return got > 0;
}

size_t CompressedReader::read(uint8_t* dst, size_t n) {
  z_stream& s = z_->s;
  size_t out = 0;
  if (!gzip_) {  // plain: what is buffered, then the file
    while (out < n) {
      if (s.avail_in == 0 && !refill()) break;
      const size_t k = std::min<size_t>(n - out, s.avail_in);
      std::memcpy(dst + out, s.next_in, k);
      s.next_in += k, s.avail_in -= static_cast<uInt>(k), out += k;
    }
    return out;
  }
  while (out < n && !done_) {
    if (!in_member_) {  // between members: another member, or the end of the file, nothing else
      if (s.avail_in < 2) refill();
      if (s.avail_in == 0) {
        done_ = true;
        break;
      }
      ASC_CHECK(s.avail_in >= 2 && s.next_in[0] == 0x1f && s.next_in[1] == 0x8b,
                "{}: {}: {} byte(s) of trailing garbage after gzip member {} (not another gzip member)", who_, path_,
                s.avail_in, members_);
      ASC_CHECK(inflateReset(&s) == Z_OK, "{}: {}: zlib could not restart", who_, path_);
      in_member_ = true, ++members_;
    }
    if (s.avail_in == 0 && !refill())
      ASC_THROW("{}: {}: the gzip stream is truncated: the file ends inside member {} after {} bytes of data", who_,
                path_, members_, s.total_out);
    const size_t ask = std::min<size_t>(n - out, size_t{1} << 30);
    s.next_out = dst + out;
    s.avail_out = static_cast<uInt>(ask);
    const int r = inflate(&s, Z_NO_FLUSH);
    out += ask - s.avail_out;
    if (r == Z_STREAM_END) {
      in_member_ = false;  // its CRC-32 and length checked by inflate
    } else if (r != Z_OK && r != Z_BUF_ERROR) {
      ASC_THROW("{}: {}: the gzip stream is corrupt in member {}: {}", who_, path_, members_,
                s.msg ? s.msg : zError(r));
    }
  }
  return out;
}

std::string read_file_maybe_gzip(const std::string& path, const std::string& who) {
  CompressedReader r(path, who);
  std::string out;
  std::vector<uint8_t> buf(size_t{1} << 18);
  for (;;) {
    const size_t got = r.read(buf.data(), buf.size());
    out.append(reinterpret_cast<const char*>(buf.data()), got);
    if (got < buf.size()) break;
  }
  return out;
}

}  // namespace asc::data
