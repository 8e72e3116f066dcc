// SyncedFileWriter: a file written whole and then made durable. A writer that must not lose
// what it replaces (a checkpoint's `latest`, an export that removes the earlier weights) needs
// to know the new bytes are on the device before it goes on, and std::ofstream tells neither a
// failed close (NFS reports a full quota there) nor offers fsync. Every step's error is thrown
// naming the file and the system's reason.
#pragma once

#include <cstddef>
#include <string>

namespace zrt {

class SyncedFileWriter {
 public:
  // Creates `path` (or truncates it), mode 0644. Throws Error naming it if it cannot.
  explicit SyncedFileWriter(std::string path);
  // Closes an uncommitted file without syncing it (the caller removes what it left).
  ~SyncedFileWriter();
  SyncedFileWriter(const SyncedFileWriter&) = delete;
  SyncedFileWriter& operator=(const SyncedFileWriter&) = delete;

  // Appends `bytes` bytes (a short write is retried; ENOSPC and the like throw).
  void write(const void* data, std::size_t bytes);
  // fsync, then close: the bytes are on the device when this returns.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Flushes a file or directory (`directory`: a rename or a removal in it) to stable storage
// (fsync); throws Error naming it.
void fsync_path(const std::string& path, bool directory = false);

// Writes `text` to `path` and commits it (not atomic: write to a temp name and rename for that).
void write_synced_file(const std::string& path, const std::string& text);

}  // namespace zrt
