#include "runtime/data/sft_dataset.h"

#include <algorithm>

#include "runtime/data/open_dataset.h"

namespace zrt {

SftDataset::SftDataset(const std::string& path, int T)
    : SftDataset(path, expand_data_path(path), T) {}

SftDataset::SftDataset(std::string pattern, std::vector<std::string> paths, int T)
    : pattern_(std::move(pattern)), T_(T) {
  if (T < 1) ZRT_THROW(InvalidArgument, "sequence length must be at least 1, not {}", T);
  if (paths.empty()) ZRT_THROW(DataError, "{}: no SFT shard", pattern_);
  shards_.reserve(paths.size());
  for (const std::string& path : paths) {
    SftShard shard(path);
    if (shard.seq_len() != T) {
      ZRT_THROW(
          DataError,
          "{}: sequences of T = {} tokens, but the model's sequence length is {} (prepare-sft "
          "--seq-len {} packs for it)",
          path, shard.seq_len(), T, T);
    }
    first_sample_.push_back(num_samples_);
    num_samples_ += shard.num_sequences();
    num_documents_ += shard.num_documents();
    shards_.push_back(std::move(shard));
  }
}

std::pair<int, std::int64_t> SftDataset::locate(std::int64_t index) const {
  ZRT_CHECK(index >= 0 && index < num_samples_, "sequence {} of {} in {}", index, num_samples_,
            pattern_);
  // Every shard holds at least one sequence: the last one starting at or before index holds it.
  const auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), index);
  const auto shard = static_cast<std::size_t>(it - first_sample_.begin()) - 1;
  return {static_cast<int>(shard), index - first_sample_[shard]};
}

std::vector<std::string> SftDataset::paths() const {
  std::vector<std::string> out;
  for (const SftShard& s : shards_) out.push_back(s.path());
  return out;
}

std::string SftDataset::describe() const {
  return fmt::format("{} packed sequences of {} tokens ({} documents) in {} SFT shard(s)",
                     num_samples_, T_, num_documents_, shards_.size());
}

void SftDataset::set_vocab_size(int vocab_size) {
  if (vocab_size < 0) ZRT_THROW(InvalidArgument, "vocabulary size {}", vocab_size);
  for (const SftShard& shard : shards_) {
    if (vocab_size > 0 && shard.header().vocab_size > vocab_size) {
      ZRT_THROW(DataError,
                "{}: tokenized for a vocabulary of {} ids, but the model has {} (prepare-sft "
                "--vocab-size {} checks that no id reaches it)",
                shard.path(), shard.header().vocab_size, vocab_size, vocab_size);
    }
  }
  vocab_size_ = vocab_size;
}

void SftDataset::read_row(std::int64_t index, const SampleRow& row) const {
  const auto [shard, sequence] = locate(index);
  shards_[static_cast<std::size_t>(shard)].read_row(sequence, row, vocab_size_);
}

}  // namespace zrt
