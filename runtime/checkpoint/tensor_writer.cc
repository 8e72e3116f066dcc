#include "runtime/checkpoint/tensor_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>

#include "runtime/checkpoint/crc32c.h"
#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace {

bool aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % TensorWriter::kAlignment == 0;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

struct TensorWriter::Staging {
  std::unique_ptr<unsigned char, AlignedFree> buffers[2];
  Staging() {
    for (auto& b : buffers) {
      b.reset(static_cast<unsigned char*>(std::aligned_alloc(kAlignment, kPieceBytes)));
      if (!b) ZRT_THROW(Error, "cannot allocate {} bytes of aligned staging memory", kPieceBytes);
    }
  }
};

TensorWriter::TensorWriter(std::string path, bool allow_direct) : path_(std::move(path)) {
  buffered_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (buffered_fd_ < 0) {
    ZRT_THROW(Error, "{}: cannot open to write tensor data: {}", path_, std::strerror(errno));
  }
  // A file system without O_DIRECT (EINVAL) just gets buffered writes.
  if (allow_direct) direct_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
}

TensorWriter::~TensorWriter() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

void TensorWriter::write_piece(int fd, const void* data, std::int64_t bytes,
                               std::int64_t offset) const {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, static_cast<std::size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;  // a zero-byte write: no room for more
      ZRT_THROW(Error, "{}: writing {} bytes at offset {} failed: {}", path_, bytes, offset,
                std::strerror(err));
    }
    p += n;
    bytes -= n;
    offset += n;
  }
}

std::vector<std::uint32_t> TensorWriter::write(std::int64_t offset, const void* data,
                                               std::int64_t bytes, std::int64_t block_bytes,
                                               double* crc_seconds) {
  ZRT_CHECK(offset >= 0 && bytes >= 0 && block_bytes > 0, "{}: bad write request", path_);
  const auto* src = static_cast<const unsigned char*>(data);
  std::vector<std::uint32_t> crcs;
  double crc_s = 0;
  std::int64_t crc_done = 0;  // bytes whose blocks have a checksum
  // Checksums of every whole block below `upto` (all of them, the short last one included, at
  // the end): computed on the caller's thread while a piece is in flight.
  auto checksum_until = [&](std::int64_t upto) {
    const auto start = std::chrono::steady_clock::now();
    while (crc_done < bytes && (crc_done + block_bytes <= upto || upto == bytes)) {
      const std::int64_t n = std::min(block_bytes, bytes - crc_done);
      crcs.push_back(crc32c(src + crc_done, static_cast<std::size_t>(n)));
      crc_done += n;
    }
    crc_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  // The body goes past the page cache when the file offset is aligned; the tail (and a
  // misaligned dataset) is written buffered.
  const bool direct = direct_fd_ >= 0 && offset % kAlignment == 0;
  const std::int64_t body = direct ? bytes / kAlignment * kAlignment : 0;
  std::atomic<bool> refused{false};  // the file system took O_DIRECT at open, not at write
  if (body > 0) {
    if (!aligned(src) && !staging_) staging_ = std::make_unique<Staging>();
    std::future<void> in_flight[2];
    std::int64_t k = 0;
    for (std::int64_t at = 0; at < body; at += kPieceBytes, ++k) {
      const std::int64_t n = std::min(kPieceBytes, body - at);
      std::future<void>& slot = in_flight[k % 2];
      if (slot.valid()) slot.get();  // its buffer is free again; rethrows its write error
      const unsigned char* piece = src + at;
      if (!aligned(piece)) {
        unsigned char* stage = staging_->buffers[k % 2].get();
        std::memcpy(stage, piece, static_cast<std::size_t>(n));
        piece = stage;
      }
      slot = std::async(std::launch::async, [this, piece, n, at, offset, &refused] {
        if (!refused.load()) {
          const ssize_t w = ::pwrite(direct_fd_, piece, static_cast<std::size_t>(n), offset + at);
          if (w == n) return;
          if (w < 0 && errno != EINVAL) {
            ZRT_THROW(Error, "{}: writing {} bytes at offset {} failed: {}", path_, n, offset + at,
                      std::strerror(errno));
          }
          if (w < 0) refused.store(true);
          // A short direct write (or EINVAL): the rest of the piece, buffered.
          const std::int64_t done = std::max<ssize_t>(w, 0);
          write_piece(buffered_fd_, piece + done, n - done, offset + at + done);
          return;
        }
        write_piece(buffered_fd_, piece, n, offset + at);
      });
      checksum_until(at);  // the blocks before this piece, while it is written
    }
    for (auto& slot : in_flight) {
      if (slot.valid()) slot.get();
    }
  }
  wrote_direct_ = body > 0 && !refused.load();
  if (body < bytes) {
    write_piece(buffered_fd_, src + body, bytes - body, offset + body);
    // Start the device on the buffered bytes now; the caller's fsync waits for them.
    ::sync_file_range(buffered_fd_, offset + body, bytes - body, SYNC_FILE_RANGE_WRITE);
  }
  checksum_until(bytes);
  if (crcs.empty()) crcs.push_back(crc32c(src, 0));
  if (crc_seconds != nullptr) *crc_seconds += crc_s;
  return crcs;
}

}  // namespace zrt::checkpoint
