// Files written whole or not at all (core/atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fault.h"

namespace asc {

namespace {
// fsync of the directory holding `path`. Best effort: a file system that cannot sync a directory still has the entry.
void sync_directory_of(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASC_CHECK(fd_ >= 0, "cannot open '{}' for writing: {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  ASC_CHECK(fd_ >= 0 && !committed_, "AtomicFile: '{}' is already committed", path_);
  const auto* b = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, b, n);
    if (w < 0 && errno == EINTR) continue;
    ASC_CHECK(w > 0, "writing '{}' failed: {}", tmp_, std::strerror(errno));
    b += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  ASC_CHECK(fd_ >= 0 && !committed_, "AtomicFile: '{}' is already committed", path_);
  // fsync before the rename: after a crash of the machine, too, the path holds the old or the complete new file.
  ASC_CHECK(::fsync(fd_) == 0, "fsync of '{}' failed: {}", tmp_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  ASC_CHECK(::close(fd) == 0, "closing '{}' failed: {}", tmp_, std::strerror(errno));
  fault::write_point();  // the temporary file complete, the old file still in place
  ASC_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "renaming '{}' to '{}' failed: {}", tmp_, path_,
            std::strerror(errno));
  committed_ = true;
  // The rename itself durable too (a power cut after it must not bring the old file back).
  sync_directory_of(path_);
  fault::write_point();  // the new file in place
}

void remove_durably(const std::string& path) {
  if (std::remove(path.c_str()) != 0) {
    ASC_CHECK(errno == ENOENT, "cannot remove '{}': {}", path, std::strerror(errno));
    return;
  }
  sync_directory_of(path);
  fault::write_point();
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace asc
