#include "runtime/data/data_stream.h"

#include <algorithm>

#include "runtime/data/data_fingerprint.h"
#include "runtime/data/token_shard.h"

namespace zrt {

namespace {

constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's finaliser: a bijective 64-bit mixer.
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr int kFeistelRounds = 6;

// A row past the end of a one-pass stream: one document of token 0 that trains nothing.
void fill_padding_row(int T, const SampleRow& row) {
  for (int t = 0; t < T; ++t) {
    row.inputs[t] = 0;
    row.targets[t] = -1;
    if (row.positions != nullptr) row.positions[t] = t;
    if (row.doc_start != nullptr) row.doc_start[t] = 0;
  }
}

}  // namespace

std::int64_t shuffle_index(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                           std::int64_t index) {
  ZRT_CHECK(n >= 1 && n <= (std::int64_t{1} << 62) && index >= 0 && index < n, "index {} of {}",
            index, n);
  // A balanced Feistel network on 2h bits (the smallest 4^h >= n) is a bijection of
  // [0, 4^h); walking its cycle until the value falls below n restricts it to a bijection of
  // [0, n), in under 4 steps on average.
  int h = 0;
  while ((std::uint64_t{1} << (2 * h)) < static_cast<std::uint64_t>(n)) ++h;
  const std::uint64_t mask = (std::uint64_t{1} << h) - 1;
  std::uint64_t keys[kFeistelRounds];
  const std::uint64_t base =
      mix64(mix64(seed + kGamma) + static_cast<std::uint64_t>(epoch) * kGamma);
  for (int k = 0; k < kFeistelRounds; ++k) keys[k] = mix64(base + (k + 1) * kGamma);
  std::uint64_t x = static_cast<std::uint64_t>(index);
  do {
    std::uint64_t left = x >> h, right = x & mask;
    for (int k = 0; k < kFeistelRounds; ++k) {
      const std::uint64_t next = left ^ (mix64(right ^ keys[k]) & mask);
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= static_cast<std::uint64_t>(n));
  return static_cast<std::int64_t>(x);
}

DataStream::DataStream(const SampleSource& dataset, DataStreamOptions options)
    : dataset_(&dataset), options_(options) {}

std::int64_t DataStream::epoch_of(std::int64_t global_index) const {
  ZRT_CHECK(global_index >= 0, "negative sample index {}", global_index);
  return global_index / dataset_->num_samples();
}

std::int64_t DataStream::window(std::int64_t global_index) const {
  ZRT_CHECK(global_index >= 0, "negative sample index {}", global_index);
  const std::int64_t n = dataset_->num_samples();
  const std::int64_t w = global_index % n;
  if (!options_.shuffle) return w;
  return shuffle_index(n, options_.seed, global_index / n, w);
}

void DataStream::fill(std::int64_t first, int B, HostBatch& batch) const {
  ZRT_CHECK(B >= 1 && first >= 0, "B = {}, first sample {}", B, first);
  const int T = dataset_->seq_len();
  const bool documents = dataset_->documents();
  const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  batch.batch = B;
  batch.seq_len = T;
  batch.documents = documents;
  batch.inputs.resize(n);
  batch.targets.resize(n);
  if (documents) {
    batch.positions.resize(n);
    batch.doc_start.resize(n);
  } else {
    batch.positions.clear();
    batch.doc_start.clear();
  }
  for (int b = 0; b < B; ++b) {
    const std::size_t at = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
    SampleRow row;
    row.inputs = batch.inputs.data() + at;
    row.targets = batch.targets.data() + at;
    if (documents) {
      row.positions = batch.positions.data() + at;
      row.doc_start = batch.doc_start.data() + at;
    }
    if (options_.one_pass && first + b >= dataset_->num_samples()) {
      fill_padding_row(T, row);
    } else {
      dataset_->read_row(window(first + b), row);
    }
  }
  batch.loss_tokens = std::count_if(batch.targets.begin(), batch.targets.end(),
                                    [](std::int32_t t) { return t >= 0; });
}

void DataStream::next_micro_batch(int rank, int world, int B, HostBatch& batch) {
  ZRT_CHECK(world >= 1 && rank >= 0 && rank < world && B >= 1, "rank {} of {}, B = {}", rank, world,
            B);
  fill(position_ + static_cast<std::int64_t>(rank) * B, B, batch);
  position_ += static_cast<std::int64_t>(world) * B;
}

void DataStream::fill(std::int64_t first, int B, std::int32_t* inputs,
                      std::int32_t* targets) const {
  ZRT_CHECK(B >= 1 && first >= 0, "B = {}, first sample {}", B, first);
  if (dataset_->documents()) {
    ZRT_THROW(InvalidArgument,
              "{}: the data has document boundaries (packed SFT sequences or document masking), "
              "which inputs and targets alone cannot carry: read it into a HostBatch",
              dataset_->pattern());
  }
  const int T = dataset_->seq_len();
  for (int b = 0; b < B; ++b) {
    const std::size_t at = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
    SampleRow row;
    row.inputs = inputs + at;
    row.targets = targets + at;
    if (options_.one_pass && first + b >= dataset_->num_samples()) {
      fill_padding_row(T, row);
    } else {
      dataset_->read_row(window(first + b), row);
    }
  }
}

void DataStream::next_micro_batch(int rank, int world, int B, std::int32_t* inputs,
                                  std::int32_t* targets) {
  ZRT_CHECK(world >= 1 && rank >= 0 && rank < world && B >= 1, "rank {} of {}, B = {}", rank, world,
            B);
  fill(position_ + static_cast<std::int64_t>(rank) * B, B, inputs, targets);
  position_ += static_cast<std::int64_t>(world) * B;
}

void DataStream::set_position(std::int64_t position) {
  if (position < 0) ZRT_THROW(InvalidArgument, "negative data position {}", position);
  position_ = position;
}

DataStreamState DataStream::state() const {
  DataStreamState s;
  s.position = position_;
  s.shuffle = options_.shuffle;
  s.seed = options_.seed;
  s.seq_len = dataset_->seq_len();
  s.group = dataset_->group();
  s.num_samples = dataset_->num_samples();
  return s;
}

const std::string& DataStream::fingerprint() const {
  if (!fingerprinted_) {
    fingerprint_ = data_fingerprint(dataset_->paths());
    fingerprinted_ = true;
  }
  return fingerprint_;
}

void DataStream::restore(const DataStreamState& state) {
  const SampleSource& d = *dataset_;
  if (state.seq_len != d.seq_len() || state.group != d.group() ||
      state.num_samples != d.num_samples()) {
    ZRT_THROW(DataError,
              "{}: the saved data position is for a stream of {} samples (T = {}, group {}); "
              "this dataset has {} samples (T = {}, group {}): the sample indices would mean "
              "other data. To go on with other data or another seq_len from these weights, "
              "start a new run from them: zrt-ckpt export --hf, then model.init_from (the "
              "optimizer state starts afresh)",
              d.pattern(), state.num_samples, state.seq_len, state.group, d.num_samples(),
              d.seq_len(), d.group());
  }
  set_position(state.position);
  options_.shuffle = state.shuffle;
  options_.seed = state.seed;
}

}  // namespace zrt
