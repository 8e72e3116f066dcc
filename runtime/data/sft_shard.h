// zrt SFT shards (docs/fine-tuning.md, "The packed SFT shard format"), written by
// tools/data/prepare-sft: a header of 256 little-endian int32 (magic 20251201, version 1, S, T,
// D, token_bytes 4, vocab_size, pad_id, the rest 0), then S packed sequences of T tokens (uint32),
// their loss mask (uint8, S x T), doc_ptr (int64, S + 1) and doc_end (int32, D); the file is
// exactly 1024 + 5*S*T + 8*(S+1) + 4*D bytes.
//
// Opening a shard validates it, as token_shard.h does for llm.c shards and further: the header
// against the file size (nothing read from the file is trusted before that), every document
// pointer and end, and every mask byte (0 or 1, never 1 on padding). Each failure is a DataError
// "<path>: [sequence <s>: ]<what is wrong>". The tokens are read lazily (pread), a sequence at a
// time, and checked when read: every document token below the vocabulary (the header's and the
// model's), every padding token the pad id; checking them at open would read 4 bytes a token of
// every shard on every rank before the first step.
//
// The checks are pure functions over bytes so they can be fuzzed, and a shard can be opened over
// bytes in memory (the fuzzer, tests) through the same code path as a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/sample_source.h"
#include "runtime/data/token_shard.h"

namespace zrt {

constexpr std::int32_t kSftShardMagic = 20251201;
constexpr std::int32_t kSftShardVersion = 1;
constexpr std::int32_t kSftTokenBytes = 4;

// A parsed SFT shard header.
struct SftHeader {
  std::int32_t magic = 0;
  std::int32_t version = 0;
  std::int64_t num_sequences = 0;  // S >= 1
  int seq_len = 0;                 // T >= 1
  std::int64_t num_documents = 0;  // D >= S
  int token_bytes = 0;             // 4
  std::int64_t vocab_size = 0;     // >= 1: every id is below it
  std::uint32_t pad_id = 0;        // < vocab_size
  std::string error;               // empty iff ok(): what is wrong, without the file name

  bool ok() const { return error.empty(); }
};

// Where the sections of a shard with a valid header lie (byte offsets into the file).
struct SftLayout {
  std::uint64_t tokens = 0;
  std::uint64_t mask = 0;
  std::uint64_t doc_ptr = 0;
  std::uint64_t doc_end = 0;
  std::uint64_t file_bytes = 0;  // the whole file
};

// The layout of a shard of S sequences of T tokens holding D documents; false if its size
// does not fit 64 bits (or a count is negative).
[[nodiscard]] bool sft_layout(std::int64_t S, std::int64_t T, std::int64_t D, SftLayout* layout);

// Parses and checks the header of an SFT shard whose first `size` bytes are `bytes` (size may be
// anything, including less than a header) and whose whole file is `file_size` bytes. Pure: reads
// only bytes[0, min(size, 1024)), never throws DataError, allocates only the message.
[[nodiscard]] SftHeader parse_sft_header(const std::uint8_t* bytes, std::size_t size,
                                         std::uint64_t file_size);

// Checks the documents of a shard of doc_ptr.size() - 1 sequences of T tokens: doc_ptr starts at
// 0, never decreases, gives each sequence at least one document and ends at doc_end.size(); the
// ends of each sequence's documents increase strictly, the first above 0, the last at most T.
// Returns what is wrong ("sequence 3: ..." where one sequence is at fault), or "" when nothing is.
[[nodiscard]] std::string check_sft_documents(int T, const std::vector<std::int64_t>& doc_ptr,
                                              const std::vector<std::int32_t>& doc_end);

// Checks one sequence's loss mask (T bytes) whose documents end at `last_end`: every byte 0 or
// 1, none 1 on padding (at or after last_end). Returns what is wrong, or "".
[[nodiscard]] std::string check_sft_mask(const std::uint8_t* mask, int T, int last_end);

// Checks one sequence's tokens (T) whose documents end at `last_end`: every document token
// below `vocab_limit`, every padding token `pad_id`. Returns what is wrong, or "".
[[nodiscard]] std::string check_sft_tokens(const std::uint32_t* tokens, int T, int last_end,
                                           std::int64_t vocab_limit, std::uint32_t pad_id);

// Turns a packed sequence into a model row (docs/fine-tuning.md, "How zrt-train reads it"), for a
// sequence that passed the checks above; `doc_ends` are its documents' ends, num_docs >= 1:
//   inputs[t]    = tokens[t], pad_id on padding;
//   targets[t]   = tokens[t+1] when t+1 < T, mask[t+1] == 1 and t+1 is in t's document (so never
//                  a document's first token and never padding), else -1;
//   doc_start[t] = the first index of t's document; padding (after the last end) is a trailing
//                  document of its own, so no real token attends to it;
//   positions[t] = t - doc_start[t].
// positions and doc_start may be null (not written).
void sft_row(const std::uint32_t* tokens, const std::uint8_t* mask, const std::int32_t* doc_ends,
             std::int64_t num_docs, int T, std::uint32_t pad_id, const SampleRow& row);

// One validated SFT shard, read with pread (or from bytes in memory). Not copyable; movable.
// Thread-safe for concurrent reads.
class SftShard {
 public:
  // Opens `path` and validates the header, the documents and the mask (top of this file); throws
  // DataError "<path>: ..." for a missing, unreadable, truncated, foreign or inconsistent file.
  explicit SftShard(const std::string& path);
  // The same over `size` bytes at `bytes`, which are not copied and must outlive the shard;
  // `name` stands for the file in messages.
  SftShard(std::string name, const std::uint8_t* bytes, std::size_t size);
  ~SftShard();
  SftShard(const SftShard&) = delete;
  SftShard& operator=(const SftShard&) = delete;
  SftShard(SftShard&& other) noexcept;
  SftShard& operator=(SftShard&& other) noexcept;

  const std::string& path() const { return path_; }
  const SftHeader& header() const { return header_; }
  std::int64_t num_sequences() const { return header_.num_sequences; }
  int seq_len() const { return header_.seq_len; }
  std::int64_t num_documents() const { return header_.num_documents; }
  // The documents of sequence s in [0, S): their count and their ends.
  std::int64_t num_documents(std::int64_t s) const;
  const std::int32_t* document_ends(std::int64_t s) const;

  // Copies sequence s's T tokens and T mask bytes and checks the tokens (check_sft_tokens, with
  // the header's vocabulary or `vocab_size` when smaller and not 0); throws DataError naming the
  // file and the sequence, or for a read that comes up short (the file changed since it was
  // opened).
  void read_sequence(std::int64_t s, std::uint32_t* tokens, std::uint8_t* mask,
                     std::int64_t vocab_size = 0) const;
  // Sequence s as a model row (read_sequence, then sft_row).
  void read_row(std::int64_t s, const SampleRow& row, std::int64_t vocab_size = 0) const;

 private:
  void validate();
  void read_at(std::uint64_t offset, std::size_t bytes, void* out) const;
  void close();

  std::string path_;
  int fd_ = -1;                           // the file, or
  const std::uint8_t* memory_ = nullptr;  // the bytes in memory
  std::uint64_t size_ = 0;
  SftHeader header_;
  SftLayout layout_;
  std::vector<std::int64_t> doc_ptr_;  // S + 1
  std::vector<std::int32_t> doc_end_;  // D
};

}  // namespace zrt
