// Pre-training data: the windows of a glob of llm.c token shards (GPT-2 style uint16 or Llama-3
// style uint32), one of the two SampleSources (sample_source.h; sft_dataset.h is the other).
//
// Windows. A sample is a window of T+1 consecutive tokens of one shard: its first T tokens are
// the inputs, its last T the targets (inputs shifted by one), as in llm.c. The windows of a
// shard start at tokens 0, T, 2T, ... (neighbours share one token), so B consecutive windows
// are exactly llm.c's read of B*T+1 tokens. Windows are taken from a shard in whole groups of
// G (`group`): a shard of n tokens holds floor(floor((n-1)/T) / G) * G windows and its tail is
// skipped. The dataset numbers its windows 0 .. num_samples()-1 through the shards in sorted
// path order. This is llm.c's DataLoader rule ("move to the next shard when the next group of
// windows would not fit") with G = N*B. The default G = 1 depends on nothing but T and loses
// fewer than T tokens per shard; G = N*B reproduces llm.c token for token at that N and B (and is
// then kept, as a number, after a resume at another N: G is part of the stream's definition,
// data_stream.h).
//
// The stream over the windows (which rank reads which window, shuffling, resuming at another
// world size) is data_stream.h's, the same for every SampleSource.
//
// Document masking (Llama 3's intra-document masking, data.document_mask): with a separator id
// set, every token of a window equal to it starts a new document, as llm.c's shards put
// <|endoftext|> (GPT-2) or <|begin_of_text|> (Llama 3) before each document: the separator
// belongs to the document it starts. Each position's doc_start is the last separator at or
// before it in the window (0 when there is none: the document began before the window), its
// position counts from there, and the target that would predict a separator (the last token of
// one document predicting the first of the next) is -1. A window without a separator is one
// document, with the inputs and targets of plain windows.
//
// Validation: a TokenDataset over the `val` glob, read sequentially from global sample 0 at each
// evaluation (a DataStream reset to position 0, or fill() at (k*N + r)*B).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

// data_stream.h: DataStream and its state were declared here before SampleSource; code that
// includes this header for them keeps compiling.
#include "runtime/data/data_stream.h"
#include "runtime/data/sample_source.h"
#include "runtime/data/token_shard.h"

namespace zrt {

// One shard of a dataset.
struct ShardInfo {
  std::string path;
  std::int64_t num_tokens = 0;
  int token_bytes = 2;            // 2 (uint16, GPT-2 style) or 4 (uint32, Llama-3 style)
  std::int64_t num_samples = 0;   // windows used from this shard (a multiple of the group)
  std::int64_t first_sample = 0;  // dataset index of its first window
};

// Where a window lies.
struct SampleLocation {
  int shard = 0;
  std::int64_t token = 0;  // index of the window's first token in the shard
};

// The separator that starts each document in llm.c's shards, chosen by the shards' token width:
// <|endoftext|> 50256 for GPT-2 style (uint16) shards, <|begin_of_text|> 128000 for Llama-3
// style (uint32) ones (data.document_separator "auto").
constexpr std::int64_t kAutoDocumentSeparator = -1;
constexpr std::uint32_t kGpt2DocumentSeparator = 50256;
constexpr std::uint32_t kLlama3DocumentSeparator = 128000;

// The windows of T+1 tokens of a list of llm.c shards (a glob's matches). Read-only after
// construction apart from the two setters; read_sample() and read_row() are thread-safe. Not
// copyable.
class TokenDataset : public SampleSource {
 public:
  // Opens and validates every shard matching `pattern` (POSIX glob, sorted bytewise) for
  // windows of T+1 tokens taken in groups of `group`. Throws DataError when nothing matches,
  // a shard is missing, truncated or foreign, or no shard holds a single group.
  TokenDataset(const std::string& pattern, int T, std::int64_t group = 1);
  // The same over `paths` in the order given; `pattern` names them in messages.
  TokenDataset(std::string pattern, std::vector<std::string> paths, int T, std::int64_t group = 1);
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  const std::string& pattern() const override { return pattern_; }
  int seq_len() const override { return T_; }
  std::int64_t group() const override { return group_; }
  // Windows per epoch (S).
  std::int64_t num_samples() const override { return num_samples_; }
  // Tokens in all shards, used or not.
  std::int64_t num_tokens() const { return num_tokens_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

  // "<S> windows of <T+1> tokens in <n> llm.c shard(s)[, documents split at <separator>]".
  std::string describe() const override;
  std::vector<std::string> paths() const override;

  // Makes read_sample() and read_row() throw DataError on a token >= vocab_size (0: no check).
  void set_vocab_size(int vocab_size) override { vocab_size_ = vocab_size; }

  // Turns document masking on (top of this file) with `separator` as the id that starts a
  // document; kAutoDocumentSeparator picks it by the shards' token width (DataError naming two
  // shards of different widths). InvalidArgument for another negative id or one >= 2^31.
  void set_document_separator(std::int64_t separator);
  // The separator in use, or none when document masking is off (the default).
  std::optional<std::uint32_t> document_separator() const { return separator_; }
  // True iff document masking is on.
  bool documents() const override { return separator_.has_value(); }

  // The shard and first token of window `index` in [0, num_samples()).
  SampleLocation locate(std::int64_t index) const;
  // Copies the T+1 tokens of window `index` in [0, num_samples()) into tokens[0..T] (uint16
  // and uint32 shards alike; a dataset may mix them). Throws DataError for a token at or above
  // the vocabulary size, or above the int32 range the model takes.
  void read_sample(std::int64_t index, std::uint32_t* tokens) const;
  // Window `index` as a row: inputs its tokens 0..T-1, targets its tokens 1..T; with document
  // masking, positions and doc_start (when wanted) and -1 for a target that is a separator.
  void read_row(std::int64_t index, const SampleRow& row) const override;

 private:
  std::string pattern_;
  int T_ = 0;
  std::int64_t group_ = 1;
  int vocab_size_ = 0;
  std::optional<std::uint32_t> separator_;
  std::vector<ShardInfo> shards_;  // every match, in order (some may hold no window)
  std::int64_t num_samples_ = 0;
  std::int64_t num_tokens_ = 0;

  // The last shard read, kept open (sequential reading stays in one shard for long).
  mutable std::mutex mu_;
  mutable int open_shard_ = -1;
  mutable ShardFile open_file_;
};

// Turns the T+1 tokens of a window into a row (read_row's rule; `separator` null: no document
// masking). Pure; exposed for tests.
void window_row(const std::uint32_t* tokens, int T, std::optional<std::uint32_t> separator,
                const SampleRow& row);

// Expands a glob into its matches, sorted bytewise. Throws DataError when nothing matches
// (naming the file when the pattern is a plain path).
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace zrt
