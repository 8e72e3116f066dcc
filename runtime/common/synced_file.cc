#include "runtime/common/synced_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/common/error.h"

namespace zrt {

SyncedFileWriter::SyncedFileWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ZRT_THROW(Error, "{}: cannot create: {}", path_, std::strerror(errno));
}

SyncedFileWriter::~SyncedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SyncedFileWriter::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) ZRT_THROW(Error, "{}: written after it was committed", path_);
  const char* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, at, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ZRT_THROW(Error, "{}: write failed: {}", path_,
                n < 0 ? std::strerror(errno) : "the device took no bytes");
    }
    at += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void SyncedFileWriter::commit() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ZRT_THROW(Error, "{}: fsync failed: {}", path_, std::strerror(err));
  }
  // A close can report what the write-back found (NFS: a quota, a lost server).
  if (::close(fd) != 0) ZRT_THROW(Error, "{}: close failed: {}", path_, std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) ZRT_THROW(Error, "{}: cannot open to fsync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ZRT_THROW(Error, "{}: fsync failed: {}", path, std::strerror(err));
}

void write_synced_file(const std::string& path, const std::string& text) {
  SyncedFileWriter file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace zrt
