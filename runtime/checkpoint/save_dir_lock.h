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

// Why a file cannot be made in `dir` (a save makes `<tag>.tmp` there, each rank its file in
// it): empty if one can. Creates `dir` if needed, then creates and removes a probe file named
// `.write-probe-<who>` (`who` unique among the processes probing at once: host, pid, rank; a
// name left by a process killed mid-probe is stepped past, never reused). The reason names the
// path, the system's error and what to do about it. `simulate_denied`: report EACCES without
// trying (a test hook: one rank of a job on a directory only the others may write).
std::string why_not_writable(const std::string& dir, const std::string& who,
                             bool simulate_denied = false);

class SaveDirLock {
 public:
  SaveDirLock() = default;
  // Creates save_dir if needed and takes its lock, or throws InvalidArgument naming it when
  // another job holds it. A lock file that cannot be made (a directory the run may not write:
  // CheckpointPolicy::plan has refused it or warned already) is logged and left unlocked.
  explicit SaveDirLock(const std::string& save_dir);
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
