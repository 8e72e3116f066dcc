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

// What to do about a failed create: the system's reason alone does not say.
const char* remedy_for(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      return "the run's user may not write there: fix the directory's permissions or owner";
    case EROFS:
      return "the file system is mounted read-only: mount it read-write or pick another "
             "save_dir";
    case ENOSPC:
    case EDQUOT:
      return "the file system (or the user's quota) is full: free space or pick another "
             "save_dir";
    case ENOENT:
    case ENOTDIR:
      return "a part of the path is missing or is not a directory: fix the path";
    default:
      return "fix the path or the file system";
  }
}

std::string failure(const std::string& path, int err) {
  return path + ": " + std::strerror(err) + "; " + remedy_for(err);
}

}  // namespace

std::string why_not_writable(const std::string& dir, const std::string& who, bool simulate_denied) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return failure(dir, ec.value());
  // The lock file's own open does not tell: it may exist from an earlier run while the
  // directory itself is read-only now.
  const std::string base = (std::filesystem::path(dir) / (".write-probe-" + who)).string();
  if (simulate_denied) return failure(base, EACCES) + " (simulated: ZRT_TEST_CKPT_UNWRITABLE_RANK)";
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string probe = attempt == 0 ? base : base + "." + std::to_string(attempt);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) continue;  // left by a process killed mid-probe: not ours
    if (fd < 0) return failure(probe, errno);
    ::close(fd);
    ::unlink(probe.c_str());
    return {};
  }
  return base + ": 100 probe names in use; remove the .write-probe-* files there";
}

SaveDirLock::SaveDirLock(const std::string& save_dir) {
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  const std::string path = (std::filesystem::path(save_dir) / ".lock").string();
  const int fd = ec ? -1 : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("checkpoint.save_dir {}: not locked against a second job ({})", save_dir,
                 ec ? save_dir + ": " + ec.message() : path + ": " + std::strerror(errno));
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
