#include "runtime/data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include <spdlog/spdlog.h>

namespace zrt {

namespace {

std::string group_phrase(std::int64_t group) {
  return group == 1 ? "a window" : fmt::format("a group of {} windows", group);
}

}  // namespace

std::vector<std::string> expand_glob(const std::string& pattern) {
  if (pattern.empty()) ZRT_THROW(DataError, "empty data path");
  // A file that exists under this very name is that file, even if its name holds glob
  // characters ("shard[1].bin" would otherwise match shard1.bin, or nothing).
  std::error_code ec;
  if (std::filesystem::is_regular_file(pattern, ec)) return {pattern};
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
    : TokenDataset(pattern, expand_glob(pattern), T, group) {}

TokenDataset::TokenDataset(std::string pattern, std::vector<std::string> paths, int T,
                           std::int64_t group)
    : pattern_(std::move(pattern)), T_(T), group_(group) {
  if (T < 1) ZRT_THROW(InvalidArgument, "sequence length must be at least 1, not {}", T);
  if (group < 1) ZRT_THROW(InvalidArgument, "window group must be at least 1, not {}", group);
  if (paths.empty()) ZRT_THROW(DataError, "{}: no shard", pattern_);
  std::int64_t largest = 0;
  for (std::string& path : paths) {
    const ShardHeader h = read_shard_header(path);
    ShardInfo info;
    info.path = std::move(path);
    info.num_tokens = h.num_tokens;
    info.token_bytes = h.token_bytes;
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
              pattern_, group_phrase(group), T + 1, shards_.size(), num_tokens_, largest);
  }
}

void TokenDataset::set_document_separator(std::int64_t separator) {
  if (separator == kAutoDocumentSeparator) {
    // A mix of widths has no one separator: the shards came from two tokenizers.
    const ShardInfo& first = shards_.front();
    for (const ShardInfo& s : shards_) {
      if (s.token_bytes != first.token_bytes) {
        ZRT_THROW(DataError,
                  "{}: document separator \"auto\" needs shards of one token width, but {} has "
                  "{}-byte tokens and {} {}-byte tokens: set data.document_separator",
                  pattern_, first.path, first.token_bytes, s.path, s.token_bytes);
      }
    }
    separator_ = first.token_bytes == 2 ? kGpt2DocumentSeparator : kLlama3DocumentSeparator;
  } else {
    if (separator < 0 || separator > std::int64_t{0x7fffffff}) {
      ZRT_THROW(InvalidArgument, "document separator {} is not a token id (0 .. 2^31-1)",
                separator);
    }
    separator_ = static_cast<std::uint32_t>(separator);
  }
  // A separator no shard can hold would split nothing: document masking silently off.
  std::int64_t widest = 0;
  for (const ShardInfo& s : shards_) widest = std::max<std::int64_t>(widest, s.token_bytes);
  const std::int64_t representable = widest >= 4 ? std::int64_t{1} << 31 : std::int64_t{1} << 16;
  const std::int64_t limit =
      vocab_size_ > 0 ? std::min<std::int64_t>(vocab_size_, representable) : representable;
  const std::int64_t id = *separator_;
  if (id >= limit) {
    ZRT_THROW(InvalidArgument,
              "{}: data.document_separator {} can never occur in this data ({}): document "
              "masking would split nothing; set data.document_separator to the tokenizer's "
              "end-of-text id",
              pattern_, id,
              vocab_size_ > 0 && vocab_size_ <= representable
                  ? fmt::format("the model's vocabulary is {} ids", vocab_size_)
                  : fmt::format("{}-byte token ids", widest));
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

std::vector<std::string> TokenDataset::paths() const {
  std::vector<std::string> out;
  for (const ShardInfo& s : shards_) out.push_back(s.path);
  return out;
}

std::string TokenDataset::describe() const {
  std::string line = fmt::format("{} windows of {} tokens in {} llm.c shard(s)", num_samples_,
                                 T_ + 1, shards_.size());
  if (separator_) line += fmt::format(", documents split at token {}", *separator_);
  return line;
}

void TokenDataset::read_row(std::int64_t index, const SampleRow& row) const {
  std::vector<std::uint32_t> tokens(static_cast<std::size_t>(T_) + 1);
  read_sample(index, tokens.data());
  window_row(tokens.data(), T_, separator_, row);
}

void window_row(const std::uint32_t* tokens, int T, std::optional<std::uint32_t> separator,
                const SampleRow& row) {
  // Tokens are below 2^31 (read_sample checks), so the casts keep their values.
  for (int t = 0; t < T; ++t) {
    row.inputs[t] = static_cast<std::int32_t>(tokens[t]);
    row.targets[t] = static_cast<std::int32_t>(tokens[t + 1]);
  }
  if (!separator) return;
  const std::uint32_t sep = *separator;
  std::int32_t start = 0;  // the document began at or before the window's first token
  for (int t = 0; t < T; ++t) {
    if (tokens[t] == sep) start = t;
    // A separator opens the next document: the token before it does not learn to predict it.
    if (tokens[t + 1] == sep) row.targets[t] = -1;
    if (row.doc_start != nullptr) row.doc_start[t] = start;
    if (row.positions != nullptr) row.positions[t] = t - start;
  }
}

}  // namespace zrt
