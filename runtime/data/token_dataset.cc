#include "runtime/data/token_dataset.h"

#include <glob.h>

#include <algorithm>

#include <spdlog/spdlog.h>

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

std::string group_phrase(std::int64_t group) {
  return group == 1 ? "a window" : fmt::format("a group of {} windows", group);
}

}  // namespace

std::vector<std::string> expand_glob(const std::string& pattern) {
  if (pattern.empty()) ZRT_THROW(DataError, "empty data path");
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    if (pattern.find_first_of("*?[") == std::string::npos) {
      ZRT_THROW(DataError, "{}: no such file", pattern);
    }
    ZRT_THROW(DataError, "no file matches '{}'", pattern);
  }
  if (rc != 0) ZRT_THROW(DataError, "cannot expand '{}' (glob error {})", pattern, rc);
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenDataset::TokenDataset(const std::string& pattern, int T, std::int64_t group)
    : pattern_(pattern), T_(T), group_(group) {
  if (T < 1) ZRT_THROW(InvalidArgument, "sequence length must be at least 1, not {}", T);
  if (group < 1) ZRT_THROW(InvalidArgument, "window group must be at least 1, not {}", group);
  std::int64_t largest = 0;
  for (std::string& path : expand_glob(pattern)) {
    const ShardHeader h = read_shard_header(path);
    ShardInfo info;
    info.path = std::move(path);
    info.num_tokens = h.num_tokens;
    const std::int64_t windows = h.num_tokens >= 1 ? (h.num_tokens - 1) / T : 0;
    info.num_samples = windows / group * group;
    info.first_sample = num_samples_;
    if (info.num_samples == 0) {
      spdlog::warn("{}: {} tokens hold no {} of T+1 = {} tokens; the shard is skipped", info.path,
                   h.num_tokens, group_phrase(group), T + 1);
    }
    num_samples_ += info.num_samples;
    num_tokens_ += info.num_tokens;
    largest = std::max(largest, info.num_tokens);
    shards_.push_back(std::move(info));
  }
  if (num_samples_ == 0) {
    ZRT_THROW(DataError,
              "{}: no shard holds {} of T+1 = {} tokens ({} shards, {} tokens, the largest {} "
              "tokens)",
              pattern, group_phrase(group), T + 1, shards_.size(), num_tokens_, largest);
  }
}

SampleLocation TokenDataset::locate(std::int64_t index) const {
  ZRT_CHECK(index >= 0 && index < num_samples_, "window {} of {} in {}", index, num_samples_,
            pattern_);
  // The last shard starting at or before index holds it (a shard with no window starts where
  // the next one does, so it is never the last such shard).
  const auto it =
      std::upper_bound(shards_.begin(), shards_.end(), index,
                       [](std::int64_t i, const ShardInfo& s) { return i < s.first_sample; });
  const auto shard = static_cast<std::size_t>(it - shards_.begin()) - 1;
  SampleLocation loc;
  loc.shard = static_cast<int>(shard);
  loc.token = (index - shards_[shard].first_sample) * T_;
  return loc;
}

void TokenDataset::read_sample(std::int64_t index, std::uint32_t* tokens) const {
  const SampleLocation loc = locate(index);
  const ShardInfo& info = shards_[static_cast<std::size_t>(loc.shard)];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_shard_ != loc.shard) {
      open_shard_ = -1;
      open_file_ = ShardFile(info.path);
      if (open_file_.num_tokens() != info.num_tokens) {
        ZRT_THROW(DataError, "{}: changed since the dataset was opened: {} tokens, was {}",
                  info.path, open_file_.num_tokens(), info.num_tokens);
      }
      open_shard_ = loc.shard;
    }
    open_file_.read(loc.token, T_ + 1, tokens);
  }
  const std::uint32_t limit =
      vocab_size_ > 0 ? static_cast<std::uint32_t>(vocab_size_) : std::uint32_t{1} << 31;
  for (int t = 0; t <= T_; ++t) {
    if (tokens[t] >= limit) {
      ZRT_THROW(DataError, "{}: token {} at index {} is not below the vocabulary size {}",
                info.path, tokens[t], loc.token + t,
                vocab_size_ > 0 ? std::to_string(vocab_size_) : "2^31 (int32 token ids)");
    }
  }
}

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

DataStream::DataStream(const TokenDataset& dataset, DataStreamOptions options)
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

void DataStream::fill(std::int64_t first, int B, std::int32_t* inputs,
                      std::int32_t* targets) const {
  ZRT_CHECK(B >= 1 && first >= 0, "B = {}, first sample {}", B, first);
  const int T = dataset_->seq_len();
  std::vector<std::uint32_t> tokens(static_cast<std::size_t>(T) + 1);
  for (int b = 0; b < B; ++b) {
    dataset_->read_sample(window(first + b), tokens.data());
    std::int32_t* in = inputs + static_cast<std::size_t>(b) * T;
    std::int32_t* tg = targets + static_cast<std::size_t>(b) * T;
    for (int t = 0; t < T; ++t) {
      in[t] = static_cast<std::int32_t>(tokens[static_cast<std::size_t>(t)]);  // < 2^31: checked
      tg[t] = static_cast<std::int32_t>(tokens[static_cast<std::size_t>(t) + 1]);
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

void DataStream::restore(const DataStreamState& state) {
  const TokenDataset& d = *dataset_;
  if (state.seq_len != d.seq_len() || state.group != d.group() ||
      state.num_samples != d.num_samples()) {
    ZRT_THROW(DataError,
              "{}: the saved data position is for a stream of {} windows (T = {}, group {}); "
              "this dataset has {} windows (T = {}, group {}): the sample indices would mean "
              "other data",
              d.pattern(), state.num_samples, state.seq_len, state.group, d.num_samples(),
              d.seq_len(), d.group());
  }
  set_position(state.position);
  options_.shuffle = state.shuffle;
  options_.seed = state.seed;
}

}  // namespace zrt
