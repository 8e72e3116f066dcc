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

namespace {

// Whether a file can be made in `dir` (a save makes `<tag>.tmp` there): the reason if not. The
// lock file's own open does not tell, as it may exist from an earlier run while the directory
// itself is read-only now.
std::string why_not_writable(const std::string& dir) {
  const std::string probe =
      (std::filesystem::path(dir) / (".write-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return probe + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

}  // namespace

SaveDirLock::SaveDirLock(const std::string& save_dir, bool must_be_writable) {
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  const std::string path = (std::filesystem::path(save_dir) / ".lock").string();
  const std::string unwritable = ec ? save_dir + ": " + ec.message() : why_not_writable(save_dir);
  if (!unwritable.empty() && must_be_writable) {
    ZRT_THROW(InvalidArgument,
              "checkpoint.save_dir {} cannot be written ({}): the first save would end the run "
              "after training up to it; fix the path or its permissions, or set "
              "checkpoint.on_save_error \"continue\" to train on without checkpoints",
              save_dir, unwritable);
  }
  // With on_save_error "continue" the saves report such a directory (they are tolerated): the
  // run goes on, without the lock.
  const int fd =
      !unwritable.empty() ? -1 : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("checkpoint.save_dir {}: not locked against a second job ({})", save_dir,
                 !unwritable.empty() ? unwritable : path + ": " + std::strerror(errno));
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
