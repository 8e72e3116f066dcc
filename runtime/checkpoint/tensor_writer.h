// Streams a checkpoint's large tensors into the space HDF5 allocated for them, past the page
// cache where the file system allows it.
//
// Why not H5Dwrite: a buffered write of a rank's state copies every byte into the page cache
// and leaves the kernel to write it back later. On the machines we measured, that copy and the
// writeback throttling that follows made the data phase 2x slower than the device (1.9 s for
// 2 x 780 MB where O_DIRECT takes 1.0 s), and its time varied 3x from run to run. With
// O_DIRECT the device reads the bytes straight from our buffer, and the CRC-32C of each block is
// computed while the previous piece is in flight, so the checksums cost no extra wall time.
//
// How: the file is opened a second time with O_DIRECT. A piece is written from the caller's
// memory when it lies in one run of it and is 4 KiB-aligned, otherwise gathered into one of two
// aligned staging buffers (a copy at memory speed, an order of magnitude faster than the
// device, made while the other piece is written); at most two pieces are in flight. The source
// may be several runs of memory (a rank's state straight from the engine, a unit's slice each),
// so a synchronous save needs no snapshot copy of the whole state first. The dataset's unaligned
// tail, and everything on a file system that refuses O_DIRECT (open or write failing with EINVAL,
// e.g. some FUSE and network file systems), goes through an ordinary buffered descriptor whose
// writeback is started at once. Durability is the caller's fsync, as before: O_DIRECT bypasses the
// page cache, not the device's write cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zrt::checkpoint {

// Bytes in host memory. A tensor may be written from several runs, concatenated in file order.
struct HostBytes {
  const void* data = nullptr;
  std::int64_t bytes = 0;
};

class TensorWriter {
 public:
  // Offsets, lengths and memory handed to O_DIRECT are multiples of this (the largest logical
  // block size of common devices).
  static constexpr std::int64_t kAlignment = 4096;
  // Bytes per write call: large enough that the device streams, small enough that two staging
  // buffers cost nothing next to a rank's state.
  static constexpr std::int64_t kPieceBytes = std::int64_t{8} << 20;

  // Opens `path` (which must exist: HDF5 created it) for writing. allow_direct false, or a file
  // system that refuses O_DIRECT, gives buffered writes only.
  explicit TensorWriter(std::string path, bool allow_direct = true);
  ~TensorWriter();
  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;

  // Writes data[0, bytes) at file offset `offset` and returns the CRC-32C of each
  // `block_bytes` block (the last may be short; one checksum for an empty range). Throws Error
  // naming the file, the offset and the errno text on a failed or short write.
  // `crc_seconds`, if given, gets the time spent on checksums added to it (overlapped with the
  // writes when they go past the page cache).
  std::vector<std::uint32_t> write(std::int64_t offset, const void* data, std::int64_t bytes,
                                   std::int64_t block_bytes, double* crc_seconds = nullptr) {
    return write(offset, std::vector<HostBytes>{{data, bytes}}, block_bytes, crc_seconds);
  }
  // The same for the concatenation of `source`'s runs (a block may span runs).
  std::vector<std::uint32_t> write(std::int64_t offset, const std::vector<HostBytes>& source,
                                   std::int64_t block_bytes, double* crc_seconds = nullptr);

  // Whether the last write() sent its aligned body past the page cache.
  bool wrote_direct() const { return wrote_direct_; }
  const std::string& path() const { return path_; }

 private:
  void write_piece(int fd, const void* data, std::int64_t bytes, std::int64_t offset) const;

  std::string path_;
  int buffered_fd_ = -1;
  int direct_fd_ = -1;  // -1: the file system refused O_DIRECT (or it was not allowed)
  bool wrote_direct_ = false;
  struct Staging;
  std::unique_ptr<Staging> staging_;  // two aligned piece buffers, allocated on first need
};

}  // namespace zrt::checkpoint
