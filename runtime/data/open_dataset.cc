#include "runtime/data/open_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/data/sft_dataset.h"
#include "runtime/data/sft_shard.h"
#include "runtime/data/token_dataset.h"
#include "runtime/data/token_shard.h"

namespace zrt {

namespace {

namespace fs = std::filesystem;

// open_dataset.h spells the default without including token_dataset.h.
static_assert(DatasetOptions{}.document_separator == kAutoDocumentSeparator,
              "DatasetOptions' default separator is \"auto\"");

// The sft_*.bin files directly in `dir`, sorted bytewise.
std::vector<std::string> sft_files_in(const fs::path& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 8 && name.compare(0, 4, "sft_") == 0 &&
        name.compare(name.size() - 4, 4, ".bin") == 0) {
      paths.push_back(it->path().string());
    }
  }
  if (ec) ZRT_THROW(DataError, "{}: cannot list the directory: {}", dir.string(), ec.message());
  std::sort(paths.begin(), paths.end());
  return paths;
}

const char* kind_name(DataFileKind kind) {
  return kind == DataFileKind::kSftShard ? "a zrt SFT shard" : "an llm.c token shard";
}

}  // namespace

DataFileKind data_file_kind(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) ZRT_THROW(DataError, "{}: no such file", path);
    ZRT_THROW(DataError, "{}: cannot open: {}", path, std::strerror(err));
  }
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  // The header's first bytes (all of an llm.c header, for the message when it is neither kind).
  std::uint8_t head[kShardHeaderBytes] = {};
  std::size_t got = 0;
  while (regular && got < sizeof head) {
    const ssize_t r = ::pread(fd, head + got, sizeof head - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (!regular) ZRT_THROW(DataError, "{}: not a regular file", path);
  if (got >= 4) {
    const std::int32_t magic = static_cast<std::int32_t>(
        static_cast<std::uint32_t>(head[0]) | (static_cast<std::uint32_t>(head[1]) << 8) |
        (static_cast<std::uint32_t>(head[2]) << 16) | (static_cast<std::uint32_t>(head[3]) << 24));
    if (magic == kSftShardMagic) return DataFileKind::kSftShard;
    if (magic == kShardMagic || magic == kLlama3ShardMagic) return DataFileKind::kTokenShard;
  }
  // Neither: the llm.c parser says what the bytes are not (and suggests zrt-data for text).
  const ShardHeader h = parse_shard_header(head, got, static_cast<std::uint64_t>(st.st_size));
  ZRT_THROW(DataError,
            "{}: neither an llm.c token shard (magic {} or {}) nor a zrt SFT shard (magic {}): {}",
            path, kShardMagic, kLlama3ShardMagic, kSftShardMagic, h.error);
}

std::vector<std::string> expand_data_path(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && fs::is_directory(path, ec)) {
    std::vector<std::string> paths = sft_files_in(path);
    if (paths.empty()) {
      std::string hint;
      for (const char* split : {"train", "val"}) {
        if (fs::is_directory(fs::path(path) / split, ec) &&
            !sft_files_in(fs::path(path) / split).empty()) {
          hint =
              fmt::format(" (prepare-sft's output: give {} or {})",
                          (fs::path(path) / "train").string(), (fs::path(path) / "val").string());
          break;
        }
      }
      ZRT_THROW(DataError, "{}: a directory without sft_*.bin shards{}", path, hint);
    }
    return paths;
  }
  return expand_glob(path);
}

std::unique_ptr<SampleSource> open_dataset(const std::string& path, int seq_len,
                                           const DatasetOptions& options) {
  std::vector<std::string> paths = expand_data_path(path);
  const DataFileKind kind = data_file_kind(paths.front());
  for (const std::string& other : paths) {
    const DataFileKind k = data_file_kind(other);
    if (k != kind) {
      ZRT_THROW(DataError,
                "{}: {} and {}: {} in one data set ({}); a data set is one kind: llm.c token "
                "shards for pre-training or SFT shards for fine-tuning",
                paths.front(), kind_name(kind), other, kind_name(k), path);
    }
  }
  if (kind == DataFileKind::kSftShard) {
    if (options.group != 1) {
      ZRT_THROW(InvalidArgument,
                "{}: SFT sequences are read one at a time (group 1), not in groups of {}", path,
                options.group);
    }
    auto data = std::make_unique<SftDataset>(path, std::move(paths), seq_len);
    data->set_vocab_size(options.vocab_size);
    return data;
  }
  auto data = std::make_unique<TokenDataset>(path, std::move(paths), seq_len, options.group);
  data->set_vocab_size(options.vocab_size);
  if (options.document_mask) data->set_document_separator(options.document_separator);
  return data;
}

}  // namespace zrt
