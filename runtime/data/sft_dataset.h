// Fine-tuning data: the packed sequences of a set of zrt SFT shards (sft_shard.h), one of the two
// SampleSources (sample_source.h; token_dataset.h is the other).
//
// Sample i is sequence i of the set, counting through the shards in path order (a directory's
// sft_*.bin sorted bytewise: prepare-sft's OUT/train or OUT/val). One sample is one packed
// sequence of T tokens, and its row is sft_row's (sft_shard.h): targets only inside a document
// and only where the loss mask is 1, positions restarting with each document, padding a document
// of its own that is never in the loss. Sequences are read one at a time (group 1); the stream
// over them is data_stream.h's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/sample_source.h"
#include "runtime/data/sft_shard.h"

namespace zrt {

// The packed sequences of SFT shards. Read-only after construction apart from set_vocab_size;
// read_row() is thread-safe. Keeps every shard open (one descriptor each). Not copyable.
class SftDataset : public SampleSource {
 public:
  // Opens and validates every SFT shard of `path`: a directory (its sft_*.bin) or a glob
  // (expand_data_path, open_dataset.h). Throws DataError naming the file for a shard that is
  // missing or invalid, and naming both lengths when a shard's T is not `T`, the model's.
  SftDataset(const std::string& path, int T);
  // The same over `paths` in the order given; `pattern` names them in messages.
  SftDataset(std::string pattern, std::vector<std::string> paths, int T);
  SftDataset(const SftDataset&) = delete;
  SftDataset& operator=(const SftDataset&) = delete;

  const std::string& pattern() const override { return pattern_; }
  int seq_len() const override { return T_; }
  std::int64_t group() const override { return 1; }
  // Sequences in all shards.
  std::int64_t num_samples() const override { return num_samples_; }
  // Documents in all shards.
  std::int64_t num_documents() const { return num_documents_; }
  bool documents() const override { return true; }
  const std::vector<SftShard>& shards() const { return shards_; }
  // "<S> packed sequences of <T> tokens (<D> documents) in <n> SFT shard(s)".
  std::string describe() const override;
  std::vector<std::string> paths() const override;
  // The shard of sample `index` in [0, num_samples()), and the sequence's index in it.
  std::pair<int, std::int64_t> locate(std::int64_t index) const;

  // Checks that the model's vocabulary holds every shard's (DataError naming the shard
  // otherwise: the data was tokenized for a larger one), then makes read_row() throw DataError
  // for a token >= vocab_size too. 0: the shards' own vocabularies only.
  void set_vocab_size(int vocab_size) override;
  void read_row(std::int64_t index, const SampleRow& row) const override;

 private:
  std::string pattern_;
  int T_ = 0;
  int vocab_size_ = 0;
  std::vector<SftShard> shards_;
  std::vector<std::int64_t> first_sample_;  // per shard: the dataset index of its first sequence
  std::int64_t num_samples_ = 0;
  std::int64_t num_documents_ = 0;
};

}  // namespace zrt
