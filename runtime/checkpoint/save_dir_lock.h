// One running job per checkpoint directory. Two jobs saving into one save_dir would resume from
// each other's checkpoints, remove each other's half-written `.tmp` directories and could commit
// one's index beside the other's rank files. Rank 0 of a job that saves holds an advisory lock
// (flock) on save_dir/.lock for the job's life; a second job is refused at start, naming the
// directory. The kernel drops the lock when the process ends, however it ends (a SIGKILL, a
// node lost), so a restart after a crash is never blocked by a stale lock. File systems that
// do not support flock (Lustre without -o flock, some FUSE mounts) are logged and not locked.
#pragma once

#include <string>

namespace zrt::checkpoint {

class SaveDirLock {
 public:
  SaveDirLock() = default;
  // Creates save_dir if needed, checks that a file can be made in it, and takes its lock, or
  // throws InvalidArgument naming it when another job holds it. A directory that cannot be
  // made or written is an InvalidArgument naming it and the system's reason when
  // `must_be_writable` (checkpoint.on_save_error "stop": the first save would end the run after
  // training up to it); otherwise it is logged and left unlocked, and the saves report it as
  // on_save_error says.
  explicit SaveDirLock(const std::string& save_dir, bool must_be_writable = false);
  ~SaveDirLock();
  SaveDirLock(SaveDirLock&& other) noexcept;
  SaveDirLock& operator=(SaveDirLock&& other) noexcept;
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

  // Whether the lock is held (false where the file system has no flock).
  bool held() const { return fd_ >= 0; }

 private:
  void release();
  int fd_ = -1;
};

}  // namespace zrt::checkpoint
