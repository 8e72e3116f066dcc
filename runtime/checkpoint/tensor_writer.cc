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

}  // namespace

struct TensorWriter::Staging {
  struct AlignedFree {
    void operator()(void* p) const { std::free(p); }
  };
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

namespace {

// Reads the concatenation of runs of host memory front to back.
class Gather {
 public:
  explicit Gather(const std::vector<HostBytes>& runs) : runs_(runs) {}

  // The next n bytes: a pointer into a run where they lie in one (and are 4 KiB-aligned, when
  // `need_aligned`), otherwise copied into scratch() (n bytes).
  template <typename Scratch>
  const unsigned char* next(std::int64_t n, bool need_aligned, Scratch scratch) {
    skip_spent();
    if (run_ < runs_.size() && runs_[run_].bytes - at_ >= n) {
      const auto* p = static_cast<const unsigned char*>(runs_[run_].data) + at_;
      if (!need_aligned || aligned(p)) {
        at_ += n;
        return p;
      }
    }
    unsigned char* out = scratch();
    for_each(n, [&out](const unsigned char* p, std::int64_t k) {
      std::memcpy(out, p, static_cast<std::size_t>(k));
      out += k;
    });
    return out - n;
  }

  // Calls f(pointer, bytes) for the next n bytes, one call per run they touch.
  template <typename F>
  void for_each(std::int64_t n, F f) {
    while (n > 0) {
      skip_spent();
      ZRT_CHECK(run_ < runs_.size(), "tensor source shorter than its length");
      const std::int64_t k = std::min(n, runs_[run_].bytes - at_);
      f(static_cast<const unsigned char*>(runs_[run_].data) + at_, k);
      at_ += k;
      n -= k;
    }
  }

 private:
  void skip_spent() {
    while (run_ < runs_.size() && at_ == runs_[run_].bytes) {
      ++run_;
      at_ = 0;
    }
  }
  const std::vector<HostBytes>& runs_;
  std::size_t run_ = 0;
  std::int64_t at_ = 0;  // bytes of runs_[run_] already read
};

// The CRC-32C of every `block` bytes of a stream fed in pieces of any size (blocks may span
// pieces); the last block may be short; an empty stream has one checksum, of nothing.
class BlockChecksums {
 public:
  explicit BlockChecksums(std::int64_t block) : block_(block) {}
  void feed(const unsigned char* p, std::int64_t n) {
    while (n > 0) {
      const std::int64_t k = std::min(n, block_ - filled_);
      crc_ = crc32c(p, static_cast<std::size_t>(k), crc_);
      filled_ += k;
      p += k;
      n -= k;
      if (filled_ == block_) {
        crcs_.push_back(crc_);
        crc_ = 0;
        filled_ = 0;
      }
    }
  }
  std::vector<std::uint32_t> finish() {
    if (filled_ > 0 || crcs_.empty()) crcs_.push_back(crc32c(nullptr, 0, crc_));
    return std::move(crcs_);
  }

 private:
  std::int64_t block_;
  std::int64_t filled_ = 0;
  std::uint32_t crc_ = 0;
  std::vector<std::uint32_t> crcs_;
};

}  // namespace

std::vector<std::uint32_t> TensorWriter::write(std::int64_t offset,
                                               const std::vector<HostBytes>& source,
                                               std::int64_t block_bytes, double* crc_seconds) {
  std::int64_t bytes = 0;
  for (const HostBytes& run : source) {
    ZRT_CHECK(run.bytes >= 0 && (run.data != nullptr || run.bytes == 0), "{}: bad source run",
              path_);
    bytes += run.bytes;
  }
  ZRT_CHECK(offset >= 0 && block_bytes > 0, "{}: bad write request", path_);
  Gather gather(source);
  BlockChecksums checksums(block_bytes);
  double crc_s = 0;
  auto checksum = [&](const unsigned char* p, std::int64_t n) {
    const auto start = std::chrono::steady_clock::now();
    checksums.feed(p, n);
    crc_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  // The body goes past the page cache when the file offset is aligned; the tail (and a
  // misaligned dataset) is written buffered.
  const bool direct = direct_fd_ >= 0 && offset % kAlignment == 0;
  const std::int64_t body = direct ? bytes / kAlignment * kAlignment : 0;
  std::atomic<bool> refused{false};  // the file system took O_DIRECT at open, not at write
  if (body > 0) {
    std::future<void> in_flight[2];
    const unsigned char* previous = nullptr;  // the piece in flight before this one
    std::int64_t previous_n = 0;
    std::int64_t k = 0;
    for (std::int64_t at = 0; at < body; at += kPieceBytes, ++k) {
      const std::int64_t n = std::min(kPieceBytes, body - at);
      std::future<void>& slot = in_flight[k % 2];
      if (slot.valid()) slot.get();  // its buffer is free again; rethrows its write error
      const unsigned char* piece = gather.next(n, /*need_aligned=*/true, [&] {
        if (!staging_) staging_ = std::make_unique<Staging>();
        return staging_->buffers[k % 2].get();
      });
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
      // The previous piece's checksums while this one is written (its memory, a staging buffer
      // or the source, is not reused before the next piece's wait).
      if (previous != nullptr) checksum(previous, previous_n);
      previous = piece;
      previous_n = n;
    }
    if (previous != nullptr) checksum(previous, previous_n);
    for (auto& slot : in_flight) {
      if (slot.valid()) slot.get();
    }
  }
  wrote_direct_ = body > 0 && !refused.load();
  if (body < bytes) {
    std::int64_t at = offset + body;
    gather.for_each(bytes - body, [&](const unsigned char* p, std::int64_t n) {
      write_piece(buffered_fd_, p, n, at);
      checksum(p, n);
      at += n;
    });
    // Start the device on the buffered bytes now; the caller's fsync waits for them.
    ::sync_file_range(buffered_fd_, offset + body, bytes - body, SYNC_FILE_RANGE_WRITE);
  }
  if (crc_seconds != nullptr) *crc_seconds += crc_s;
  return checksums.finish();
}

}  // namespace zrt::checkpoint
