#include "runtime/data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/data/little_endian.h"

namespace zrt {

namespace {

// Tokens are little-endian on disk; swap in place on a big-endian host.
void le16_to_host(std::uint16_t* tokens, std::size_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (std::size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<std::uint16_t>((tokens[i] >> 8) | (tokens[i] << 8));
  }
#else
  (void)tokens;
  (void)count;
#endif
}

void le32_to_host(std::uint32_t* tokens, std::size_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (std::size_t i = 0; i < count; ++i) tokens[i] = __builtin_bswap32(tokens[i]);
#else
  (void)tokens;
  (void)count;
#endif
}

// True if the bytes look like text (so the message can say how to convert it).
bool looks_like_text(const std::uint8_t* bytes, std::size_t size) {
  const std::size_t n = std::min<std::size_t>(size, 64);
  if (n == 0) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t c = bytes[i];
    if (c < 0x09 || (c > 0x0d && c < 0x20) || c == 0x7f) return false;
  }
  return true;
}

std::string errno_text(int err) {
  return std::strerror(err);
}

// Opens `path` read-only and checks its header; returns the header and the open descriptor.
ShardHeader open_validated(const std::string& path, int* fd_out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) ZRT_THROW(DataError, "{}: no such file", path);
    ZRT_THROW(DataError, "{}: cannot open: {}", path, errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    ZRT_THROW(DataError, "{}: cannot stat: {}", path, errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    ZRT_THROW(DataError, "{}: not a regular file", path);
  }
  const std::uint64_t file_size = static_cast<std::uint64_t>(st.st_size);
  std::uint8_t header[kShardHeaderBytes];
  std::size_t got = 0;
  while (got < kShardHeaderBytes && got < file_size) {
    const ssize_t r = ::pread(fd, header + got, kShardHeaderBytes - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      ZRT_THROW(DataError, "{}: cannot read the header: {}", path, errno_text(err));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  ShardHeader h = parse_shard_header(header, got, file_size);
  if (!h.ok()) {
    ::close(fd);
    ZRT_THROW(DataError, "{}: {}", path, h.error);
  }
  *fd_out = fd;
  return h;
}

void write_all(int fd, const void* data, std::size_t bytes, std::uint64_t offset,
               const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t w = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) ZRT_THROW(DataError, "{}: write failed: {}", path, errno_text(errno));
    p += w;
    bytes -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

}  // namespace

ShardHeader parse_shard_header(const std::uint8_t* bytes, std::size_t size,
                               std::uint64_t file_size) {
  ShardHeader h;
  if (bytes == nullptr) size = 0;
  const std::uint64_t have = std::min<std::uint64_t>(size, file_size);
  if (have < kShardHeaderBytes) {
    h.status = ShardHeaderStatus::kTooSmall;
    h.error = have == 0 ? "empty file: not an llm.c token shard"
                        : fmt::format(
                              "too small for an llm.c token shard: {} bytes, the header "
                              "alone is {} bytes",
                              have, kShardHeaderBytes);
    if (looks_like_text(bytes, static_cast<std::size_t>(have))) {
      h.error += " (it looks like text: convert it with zrt-data)";
    }
    return h;
  }
  h.magic = load_le_i32(bytes);
  h.version = load_le_i32(bytes + 4);
  const std::int32_t count = load_le_i32(bytes + 8);
  if (h.magic != kShardMagic && h.magic != kLlama3ShardMagic) {
    h.status = ShardHeaderStatus::kBadMagic;
    h.error = fmt::format(
        "not an llm.c token shard: magic {} (0x{:08x}), expected {} (uint16 tokens) or {} "
        "(uint32 tokens)",
        h.magic, static_cast<std::uint32_t>(h.magic), kShardMagic, kLlama3ShardMagic);
    if (looks_like_text(bytes, kShardHeaderBytes)) {
      h.error += " (it looks like text: convert it with zrt-data)";
    }
    return h;
  }
  const bool wide = h.magic == kLlama3ShardMagic;
  const std::int32_t version = wide ? kLlama3ShardVersion : kShardVersion;
  if (h.version != version) {
    h.status = ShardHeaderStatus::kBadVersion;
    h.error =
        fmt::format("unsupported llm.c shard version {} for magic {}: expected {} ({} tokens)",
                    h.version, h.magic, version, wide ? "uint32" : "uint16");
    return h;
  }
  h.token_bytes = wide ? 4 : 2;
  if (count < 0) {
    h.status = ShardHeaderStatus::kBadTokenCount;
    h.error = fmt::format("bad header: negative token count {}", count);
    return h;
  }
  const std::uint64_t expected = shard_file_bytes(count, h.token_bytes);
  if (file_size < expected) {
    h.status = ShardHeaderStatus::kTruncated;
    h.error = fmt::format("truncated: header says {} tokens ({} bytes) but the file has {} bytes",
                          count, expected, file_size);
    return h;
  }
  if (file_size > expected) {
    h.status = ShardHeaderStatus::kTrailingData;
    h.error = fmt::format(
        "size mismatch: header says {} tokens ({} bytes) but the file has {} bytes ({} bytes "
        "more)",
        count, expected, file_size, file_size - expected);
    return h;
  }
  h.status = ShardHeaderStatus::kOk;
  h.num_tokens = count;
  return h;
}

ShardHeader read_shard_header(const std::string& path) {
  int fd = -1;
  ShardHeader h = open_validated(path, &fd);
  ::close(fd);
  return h;
}

ShardFile::ShardFile(const std::string& path) : path_(path) {
  const ShardHeader h = open_validated(path, &fd_);
  num_tokens_ = h.num_tokens;
  token_bytes_ = h.token_bytes;
}

ShardFile::~ShardFile() {
  close();
}

ShardFile::ShardFile(ShardFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      token_bytes_(other.token_bytes_) {}

ShardFile& ShardFile::operator=(ShardFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    token_bytes_ = other.token_bytes_;
  }
  return *this;
}

void ShardFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ShardFile::read_bytes(std::int64_t first, std::int64_t count, void* out) const {
  ZRT_CHECK(fd_ >= 0, "read from a closed shard");
  if (first < 0 || count < 0 || first > num_tokens_ || count > num_tokens_ - first) {
    ZRT_THROW(DataError, "{}: tokens [{}, {}) are outside the shard's {} tokens", path_, first,
              first + count, num_tokens_);
  }
  auto* p = static_cast<std::uint8_t*>(out);
  std::uint64_t offset = shard_file_bytes(first, token_bytes_);
  std::size_t left = static_cast<std::size_t>(count) * static_cast<std::size_t>(token_bytes_);
  while (left > 0) {
    const ssize_t r = ::pread(fd_, p, left, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ZRT_THROW(DataError, "{}: read failed: {}", path_, errno_text(errno));
    if (r == 0) {
      ZRT_THROW(DataError, "{}: short read at byte {}: the file changed since it was opened", path_,
                offset);
    }
    p += r;
    left -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

void ShardFile::read(std::int64_t first, std::int64_t count, std::uint16_t* out) const {
  if (token_bytes_ != 2) {
    ZRT_THROW(DataError, "{}: a Llama-3 style shard (uint32 tokens) read as uint16", path_);
  }
  read_bytes(first, count, out);
  le16_to_host(out, static_cast<std::size_t>(count));
}

void ShardFile::read(std::int64_t first, std::int64_t count, std::uint32_t* out) const {
  if (token_bytes_ == 4) {
    read_bytes(first, count, out);
    le32_to_host(out, static_cast<std::size_t>(count));
    return;
  }
  // Widen in place from the back: the uint16 tokens fill the first half of the buffer.
  auto* narrow = reinterpret_cast<std::uint16_t*>(out);
  read_bytes(first, count, narrow);
  le16_to_host(narrow, static_cast<std::size_t>(count));
  for (std::int64_t i = count - 1; i >= 0; --i) {
    std::uint16_t v;
    std::memcpy(&v, narrow + i, sizeof v);
    out[i] = v;
  }
}

ShardWriter::ShardWriter(std::string path, int token_bytes)
    : path_(std::move(path)),
      tmp_path_(path_ + ".tmp." + std::to_string(::getpid())),
      token_bytes_(token_bytes) {
  ZRT_CHECK(token_bytes == 2 || token_bytes == 4, "shard token width {} (2 or 4)", token_bytes);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ZRT_THROW(DataError, "{}: cannot create: {}", tmp_path_, errno_text(errno));
  const std::uint8_t zeros[kShardHeaderBytes] = {};
  try {
    write_all(fd_, zeros, sizeof(zeros), 0, path_);
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    throw;
  }
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (fd_ >= 0 || (sealed_ && !committed_)) ::unlink(tmp_path_.c_str());
}

void ShardWriter::append(const std::uint16_t* tokens, std::size_t count) {
  if (token_bytes_ == 4) {
    const std::vector<std::uint32_t> wide(tokens, tokens + count);
    append(wide.data(), count);
    return;
  }
  ZRT_CHECK(fd_ >= 0, "append to a finished shard writer ({})", path_);
  if (static_cast<std::uint64_t>(count) >
      static_cast<std::uint64_t>(kMaxShardTokens - num_tokens_)) {
    ZRT_THROW(DataError, "{}: a shard holds at most {} tokens", path_, kMaxShardTokens);
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  std::vector<std::uint16_t> le(tokens, tokens + count);
  le16_to_host(le.data(), count);  // the swap is its own inverse
  tokens = le.data();
#endif
  write_all(fd_, tokens, count * 2, shard_file_bytes(num_tokens_, 2), path_);
  num_tokens_ += static_cast<std::int64_t>(count);
}

void ShardWriter::append(const std::uint32_t* tokens, std::size_t count) {
  if (token_bytes_ == 2) {
    std::vector<std::uint16_t> narrow(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (tokens[i] > 0xffffu) {
        ZRT_THROW(DataError,
                  "{}: token {} does not fit a uint16 shard (write a Llama-3 style shard: "
                  "4-byte tokens)",
                  path_, tokens[i]);
      }
      narrow[i] = static_cast<std::uint16_t>(tokens[i]);
    }
    append(narrow.data(), count);
    return;
  }
  ZRT_CHECK(fd_ >= 0, "append to a finished shard writer ({})", path_);
  if (static_cast<std::uint64_t>(count) >
      static_cast<std::uint64_t>(kMaxShardTokens - num_tokens_)) {
    ZRT_THROW(DataError, "{}: a shard holds at most {} tokens", path_, kMaxShardTokens);
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  std::vector<std::uint32_t> le(tokens, tokens + count);
  le32_to_host(le.data(), count);
  tokens = le.data();
#endif
  write_all(fd_, tokens, count * 4, shard_file_bytes(num_tokens_, 4), path_);
  num_tokens_ += static_cast<std::int64_t>(count);
}

void ShardWriter::finish() {
  seal();
  commit();
}

void ShardWriter::seal() {
  ZRT_CHECK(fd_ >= 0 && !sealed_, "seal() or finish() called twice ({})", path_);
  std::uint8_t header[kShardHeaderBytes] = {};
  store_le_i32(header, token_bytes_ == 4 ? kLlama3ShardMagic : kShardMagic);
  store_le_i32(header + 4, token_bytes_ == 4 ? kLlama3ShardVersion : kShardVersion);
  store_le_i32(header + 8, static_cast<std::int32_t>(num_tokens_));
  write_all(fd_, header, sizeof(header), 0, path_);
  if (::fsync(fd_) != 0) ZRT_THROW(DataError, "{}: fsync failed: {}", path_, errno_text(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    ZRT_THROW(DataError, "{}: close failed: {}", path_, errno_text(err));
  }
  sealed_ = true;
}

void ShardWriter::commit() {
  ZRT_CHECK(sealed_ && !committed_, "commit() of a shard not sealed, or twice ({})", path_);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    ZRT_THROW(DataError, "{}: cannot rename {} into place: {}", path_, tmp_path_, errno_text(err));
  }
  committed_ = true;
}

void write_shard(const std::string& path, const std::uint16_t* tokens, std::size_t count) {
  ShardWriter writer(path, 2);
  writer.append(tokens, count);
  writer.finish();
}

void write_shard(const std::string& path, const std::uint32_t* tokens, std::size_t count) {
  ShardWriter writer(path, 4);
  writer.append(tokens, count);
  writer.finish();
}

}  // namespace zrt
