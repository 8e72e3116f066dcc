// Training and validation data: the windows of a glob of llm.c token shards (GPT-2 style uint16
// or Llama-3 style uint32), and the stream of
// samples every rank reads from them, addressed by a global sample index.
//
// Windows. A sample is a window of T+1 consecutive tokens of one shard: its first T tokens are
// the inputs, its last T the targets (inputs shifted by one), as in llm.c. The windows of a
// shard start at tokens 0, T, 2T, ... (neighbours share one token), so B consecutive windows
// are exactly llm.c's read of B*T+1 tokens. Windows are taken from a shard in whole groups of
// G (`group`): a shard of n tokens holds floor(floor((n-1)/T) / G) * G windows and its tail is
// skipped. The dataset numbers its windows 0 .. num_samples()-1 through the shards in sorted
// path order. This is llm.c's DataLoader rule ("move to the next shard when the next group of
// windows would not fit") with G = N*B.
//
// The stream. Global sample index i (counting from 0 over the whole run) is window i mod S of
// epoch i / S, S = num_samples(); with shuffling, window perm(seed, epoch)(i mod S), where perm
// is a keyed bijection of [0, S) (a Feistel network with cycle walking): a pure function of
// (seed, epoch, index) with no state and no dependence on the world size. Micro-batch k of rank
// r among N ranks with micro-batch size B reads global samples (k*N + r)*B ... (k*N + r)*B+B-1:
// rank r of N takes the window at r*B*T and every rank advances by N*B*T tokens, as in llm.c.
//
// Resuming at another world size. The stream is a function of the global sample index, T, G,
// the shards and the shuffle options; the position a run keeps (and checkpoints) is the global
// index where the next micro-batch starts, k*N*B. A run resumed from it at any N and B reads
// the samples an uninterrupted run at its own N and B would have read from that index on. For
// that G must not change on resume: it is part of the stream's definition (DataStreamState).
// The default G = 1 depends on nothing but T and loses fewer than T tokens per shard; G = N*B
// reproduces llm.c token for token at that N and B (and is then kept, as a number, after a
// resume at another N).
//
// Validation: a TokenDataset over the `val` glob, read sequentially from global sample 0 at each
// evaluation (a DataStream reset to position 0, or fill() at (k*N + r)*B).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/data/token_shard.h"

namespace zrt {

// One shard of a dataset.
struct ShardInfo {
  std::string path;
  std::int64_t num_tokens = 0;
  std::int64_t num_samples = 0;   // windows used from this shard (a multiple of the group)
  std::int64_t first_sample = 0;  // dataset index of its first window
};

// Where a window lies.
struct SampleLocation {
  int shard = 0;
  std::int64_t token = 0;  // index of the window's first token in the shard
};

// The windows of T+1 tokens of the shards matching a glob. Read-only after construction;
// read_sample() is thread-safe. Not copyable.
class TokenDataset {
 public:
  // Opens and validates every shard matching `pattern` (POSIX glob, sorted bytewise) for
  // windows of T+1 tokens taken in groups of `group`. Throws DataError when nothing matches,
  // a shard is missing, truncated or foreign, or no shard holds a single group.
  TokenDataset(const std::string& pattern, int T, std::int64_t group = 1);
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  const std::string& pattern() const { return pattern_; }
  int seq_len() const { return T_; }
  std::int64_t group() const { return group_; }
  // Windows per epoch (S).
  std::int64_t num_samples() const { return num_samples_; }
  // Tokens in all shards, used or not.
  std::int64_t num_tokens() const { return num_tokens_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

  // Makes read_sample() throw DataError on a token >= vocab_size (0: no check).
  void set_vocab_size(int vocab_size) { vocab_size_ = vocab_size; }

  // The shard and first token of window `index` in [0, num_samples()).
  SampleLocation locate(std::int64_t index) const;
  // Copies the T+1 tokens of window `index` in [0, num_samples()) into tokens[0..T] (uint16
  // and uint32 shards alike; a dataset may mix them). Throws DataError for a token at or above
  // the vocabulary size, or above the int32 range the model takes.
  void read_sample(std::int64_t index, std::uint32_t* tokens) const;

 private:
  std::string pattern_;
  int T_ = 0;
  std::int64_t group_ = 1;
  int vocab_size_ = 0;
  std::vector<ShardInfo> shards_;  // every match, in order (some may hold no window)
  std::int64_t num_samples_ = 0;
  std::int64_t num_tokens_ = 0;

  // The last shard read, kept open (sequential reading stays in one shard for long).
  mutable std::mutex mu_;
  mutable int open_shard_ = -1;
  mutable ShardFile open_file_;
};

// What defines a stream and where it is: the state to checkpoint. Restoring it at another world
// size or micro-batch size continues the same stream.
struct DataStreamState {
  std::int64_t position = 0;  // global sample index of the next micro-batch
  bool shuffle = false;
  std::uint64_t seed = 0;
  // The dataset it ran over, checked on restore: the stream is defined only with these equal.
  int seq_len = 0;
  std::int64_t group = 1;
  std::int64_t num_samples = 0;
};

struct DataStreamOptions {
  bool shuffle = false;  // a fresh permutation of the windows every epoch
  std::uint64_t seed = 0;
};

// The sample stream over a dataset (see the top of this file). Holds a position; not
// thread-safe. The dataset must outlive it.
class DataStream {
 public:
  explicit DataStream(const TokenDataset& dataset, DataStreamOptions options = {});

  const TokenDataset& dataset() const { return *dataset_; }
  // The dataset window of global sample index `global_index` (>= 0).
  std::int64_t window(std::int64_t global_index) const;
  // The epoch of global sample index `global_index`.
  std::int64_t epoch_of(std::int64_t global_index) const;

  // Fills inputs[b*T + t] and targets[b*T + t] (t < T) from global samples first .. first+B-1:
  // inputs are a window's tokens 0..T-1, targets its tokens 1..T. Does not move the position.
  void fill(std::int64_t first, int B, std::int32_t* inputs, std::int32_t* targets) const;
  // Rank `rank` of `world`: fills from global samples position() + rank*B ... and advances the
  // position by world*B (every rank calls it once per micro-batch).
  void next_micro_batch(int rank, int world, int B, std::int32_t* inputs, std::int32_t* targets);

  // Global sample index of the next micro-batch.
  std::int64_t position() const { return position_; }
  void set_position(std::int64_t position);
  // Epoch of the next micro-batch.
  std::int64_t epoch() const { return epoch_of(position_); }

  // The state to checkpoint, and its restore: throws DataError if it describes a stream over a
  // different dataset (T, group or number of windows), since the indices would mean other data.
  DataStreamState state() const;
  void restore(const DataStreamState& state);

 private:
  const TokenDataset* dataset_;
  DataStreamOptions options_;
  std::int64_t position_ = 0;
};

// The keyed permutation behind shuffling: a bijection of [0, n), a pure function of
// (seed, epoch, index). Exposed for tests.
std::int64_t shuffle_index(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                           std::int64_t index);

// Expands a glob into its matches, sorted bytewise. Throws DataError when nothing matches
// (naming the file when the pattern is a plain path).
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace zrt
