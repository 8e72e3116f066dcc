// llm.c token shards (.bin), read and written as llm.c's dev/data scripts do: a header of 256
// little-endian int32 (magic, version, token count, the rest zero) followed by the tokens:
//   GPT-2 style   magic 20240520, version 1, little-endian uint16 tokens (vocabularies < 65536)
//   Llama-3 style magic 20240801, version 7, little-endian uint32 tokens (larger vocabularies)
// The file size must be exactly 1024 + width x count bytes. Readers widen either to uint32.
//
// The header check is a pure function over bytes (parse_shard_header) so it can be fuzzed;
// everything that touches files wraps it and throws DataError naming the file and what is
// wrong. No size read from a file is trusted before it has been checked against the file size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/common/error.h"

namespace zrt {

// A missing, truncated, foreign or otherwise unreadable data file.
class DataError : public Error {
 public:
  using Error::Error;
};

constexpr std::int32_t kShardMagic = 20240520;  // llm.c GPT-2 style: uint16 tokens
constexpr std::int32_t kShardVersion = 1;
constexpr std::int32_t kLlama3ShardMagic = 20240801;  // llm.c Llama-3 style: uint32 tokens
constexpr std::int32_t kLlama3ShardVersion = 7;
constexpr std::size_t kShardHeaderInts = 256;
constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * sizeof(std::int32_t);
constexpr std::int64_t kMaxShardTokens = 2147483647;  // the count is an int32

enum class ShardHeaderStatus {
  kOk,
  kTooSmall,       // fewer bytes than a header
  kBadMagic,       // not an llm.c shard
  kBadVersion,     // right magic, unknown version
  kBadTokenCount,  // negative count
  kTruncated,      // the file is shorter than the header says
  kTrailingData,   // the file is longer than the header says
};

// The result of parsing a shard header.
struct ShardHeader {
  ShardHeaderStatus status = ShardHeaderStatus::kTooSmall;
  std::int32_t magic = 0;
  std::int32_t version = 0;
  std::int64_t num_tokens = 0;  // valid when ok()
  int token_bytes = 2;          // 2 (GPT-2 style) or 4 (Llama-3 style); valid when ok()
  std::string error;            // empty iff ok(): what is wrong, without the file name

  bool ok() const { return status == ShardHeaderStatus::kOk; }
};

// Bytes of a valid shard holding `num_tokens` tokens of `token_bytes` (2 or 4) bytes each.
constexpr std::uint64_t shard_file_bytes(std::int64_t num_tokens, int token_bytes = 2) {
  return kShardHeaderBytes +
         static_cast<std::uint64_t>(token_bytes) * static_cast<std::uint64_t>(num_tokens);
}

// Parses and checks the header of a shard whose first `size` bytes are `bytes` (size may be
// anything, including less than a header) and whose whole file is `file_size` bytes. Pure: reads
// only bytes[0, min(size, 1024)), never throws DataError, allocates only the message.
[[nodiscard]] ShardHeader parse_shard_header(const std::uint8_t* bytes, std::size_t size,
                                             std::uint64_t file_size);

// Opens `path`, checks its header against its size and returns it; throws DataError
// ("<path>: <what is wrong>") for a missing, unreadable, truncated or foreign file.
[[nodiscard]] ShardHeader read_shard_header(const std::string& path);

// A validated shard opened for reading tokens with pread. Not copyable; movable. Thread-safe
// for concurrent read() calls.
class ShardFile {
 public:
  ShardFile() = default;
  // Opens and validates `path` (as read_shard_header); throws DataError.
  explicit ShardFile(const std::string& path);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ShardFile(ShardFile&& other) noexcept;
  ShardFile& operator=(ShardFile&& other) noexcept;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  std::int64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }  // 2 or 4
  // Copies tokens [first, first + count) into out (uint16 tokens widened); throws DataError if
  // the range is outside the shard or the read comes up short (the file changed since it was
  // opened).
  void read(std::int64_t first, std::int64_t count, std::uint32_t* out) const;
  // The same for a GPT-2 style shard only (DataError naming the width for a uint32 shard).
  void read(std::int64_t first, std::int64_t count, std::uint16_t* out) const;

 private:
  void close();
  void read_bytes(std::int64_t first, std::int64_t count, void* out) const;

  std::string path_;
  int fd_ = -1;
  std::int64_t num_tokens_ = 0;
  int token_bytes_ = 2;
};

// Writes one shard atomically: tokens stream into "<path>.tmp.<pid>", finish() writes the
// header, flushes and renames onto `path`. A writer destroyed before finish() removes its
// temporary file, so `path` is either absent, the old file or the complete new one.
class ShardWriter {
 public:
  // token_bytes 2: a GPT-2 style shard (uint16); 4: Llama-3 style (uint32).
  explicit ShardWriter(std::string path, int token_bytes = 2);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens; throws DataError on an I/O error or past kMaxShardTokens.
  void append(const std::uint16_t* tokens, std::size_t count);
  // The same from uint32 tokens; into a uint16 shard each must be below 65536 (else DataError).
  void append(const std::uint32_t* tokens, std::size_t count);
  std::int64_t num_tokens() const { return num_tokens_; }
  // seal() + commit(). Call once.
  void finish();
  // Writes the header, fsyncs and closes the temporary file: complete, but not yet at `path`.
  // A writer destroyed sealed but not committed still removes it, so a tool writing several
  // shards can seal them all and commit none when one of them fails (zrt-data).
  void seal();
  // Renames the sealed file onto `path`.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool sealed_ = false;
  bool committed_ = false;
  std::int64_t num_tokens_ = 0;
  int token_bytes_ = 2;
};

// Writes a whole shard atomically (ShardWriter in one call): GPT-2 style from uint16 tokens,
// Llama-3 style (uint32) from uint32 tokens.
void write_shard(const std::string& path, const std::uint16_t* tokens, std::size_t count);
void write_shard(const std::string& path, const std::uint32_t* tokens, std::size_t count);

}  // namespace zrt
