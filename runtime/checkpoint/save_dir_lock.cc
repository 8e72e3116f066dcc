#include "runtime/checkpoint/save_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt::checkpoint {

SaveDirLock::SaveDirLock(const std::string& save_dir) {
  // A directory that cannot be made or opened now is the saves' to report (they may be
  // tolerated: checkpoint.on_save_error "continue"): the run goes on without the lock.
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  const std::string path = (std::filesystem::path(save_dir) / ".lock").string();
  const int fd = ec ? -1 : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("checkpoint.save_dir {}: not locked against a second job ({}: {})", save_dir, path,
                 ec ? ec.message() : std::string(std::strerror(errno)));
    return;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    fd_ = fd;
    return;
  }
  const int err = errno;
  ::close(fd);
  if (err == EWOULDBLOCK) {
    ZRT_THROW(InvalidArgument,
              "checkpoint.save_dir {} is in use by another running job (it holds {}): two jobs "
              "saving into one directory would resume from and overwrite each other's "
              "checkpoints; give this run its own save_dir, or wait for the other to end",
              save_dir, path);
  }
  // ENOLCK, EOPNOTSUPP, ENOSYS: a file system without flock. Saving still works; only the
  // guard against a second job is missing.
  spdlog::info("checkpoint.save_dir {}: not locked against a second job ({}: {})", save_dir, path,
               std::strerror(err));
}

SaveDirLock::~SaveDirLock() {
  release();
}

SaveDirLock::SaveDirLock(SaveDirLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

SaveDirLock& SaveDirLock::operator=(SaveDirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void SaveDirLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the lock
  fd_ = -1;
}

}  // namespace zrt::checkpoint
