#include "runtime/data/sft_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/data/little_endian.h"

namespace zrt {

namespace {

constexpr std::size_t kHeaderWords = 256;
constexpr std::size_t kHeaderBytes = kHeaderWords * 4;
// The mask is checked at open in chunks of about this many bytes (whole sequences).
constexpr std::size_t kMaskChunkBytes = std::size_t{1} << 20;

// The sections are little-endian on disk; swap in place on a big-endian host.
template <typename T>
void le_to_host(T* values, std::size_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (std::size_t i = 0; i < count; ++i) {
    std::uint8_t b[sizeof(T)];
    std::memcpy(b, values + i, sizeof(T));
    std::reverse(b, b + sizeof(T));
    std::memcpy(values + i, b, sizeof(T));
  }
#else
  (void)values;
  (void)count;
#endif
}

std::string sizes_phrase(std::int64_t S, std::int64_t T, std::int64_t D) {
  return fmt::format("S = {} sequences of T = {} tokens and D = {} documents", S, T, D);
}

}  // namespace

bool sft_layout(std::int64_t S, std::int64_t T, std::int64_t D, SftLayout* layout) {
  if (S < 0 || T < 0 || D < 0) return false;
  const auto s = static_cast<std::uint64_t>(S), t = static_cast<std::uint64_t>(T),
             d = static_cast<std::uint64_t>(D);
  std::uint64_t st, token_bytes, doc_ptr_bytes, doc_end_bytes;
  SftLayout l;
  l.tokens = kHeaderBytes;
  if (__builtin_mul_overflow(s, t, &st) || __builtin_mul_overflow(st, 4u, &token_bytes) ||
      __builtin_add_overflow(l.tokens, token_bytes, &l.mask) ||
      __builtin_add_overflow(l.mask, st, &l.doc_ptr) ||
      __builtin_mul_overflow(s + 1, 8u, &doc_ptr_bytes) ||
      __builtin_add_overflow(l.doc_ptr, doc_ptr_bytes, &l.doc_end) ||
      __builtin_mul_overflow(d, 4u, &doc_end_bytes) ||
      __builtin_add_overflow(l.doc_end, doc_end_bytes, &l.file_bytes)) {
    return false;
  }
  *layout = l;
  return true;
}

SftHeader parse_sft_header(const std::uint8_t* bytes, std::size_t size, std::uint64_t file_size) {
  SftHeader h;
  if (bytes == nullptr) size = 0;
  const std::uint64_t have = std::min<std::uint64_t>(size, file_size);
  if (have < kHeaderBytes) {
    h.error = have == 0 ? "empty file: not a zrt SFT shard"
                        : fmt::format(
                              "too small for a zrt SFT shard: {} bytes, the header alone is {} "
                              "bytes",
                              have, kHeaderBytes);
    return h;
  }
  std::int32_t w[kHeaderWords];
  for (std::size_t i = 0; i < kHeaderWords; ++i) w[i] = load_le_i32(bytes + 4 * i);
  h.magic = w[0];
  h.version = w[1];
  if (h.magic != kSftShardMagic) {
    if (h.magic == kShardMagic || h.magic == kLlama3ShardMagic) {
      h.error = fmt::format(
          "an llm.c token shard (magic {}), not a zrt SFT shard (magic {}): it holds no loss mask "
          "or documents",
          h.magic, kSftShardMagic);
    } else {
      h.error = fmt::format("not a zrt SFT shard: magic {} (0x{:08x}), expected {}", h.magic,
                            static_cast<std::uint32_t>(h.magic), kSftShardMagic);
    }
    return h;
  }
  if (h.version != kSftShardVersion) {
    h.error = fmt::format("unsupported zrt SFT shard version {}: expected {}", h.version,
                          kSftShardVersion);
    return h;
  }
  const std::int32_t S = w[2], T = w[3], D = w[4], token_bytes = w[5], vocab = w[6], pad = w[7];
  if (S < 1) {
    h.error = fmt::format("bad header: S = {} sequences (at least 1)", S);
  } else if (T < 1) {
    h.error = fmt::format("bad header: sequence length T = {} (at least 1)", T);
  } else if (D < S) {
    h.error = fmt::format(
        "bad header: D = {} documents for S = {} sequences (every sequence holds at least one)", D,
        S);
  } else if (token_bytes != kSftTokenBytes) {
    h.error = fmt::format("bad header: token_bytes {} (version {} has {}-byte tokens)", token_bytes,
                          kSftShardVersion, kSftTokenBytes);
  } else if (vocab < 1) {
    h.error = fmt::format("bad header: vocab_size {} (at least 1)", vocab);
  } else if (pad < 0 || pad >= vocab) {
    h.error = fmt::format("bad header: pad_id {} is not in [0, vocab_size {})", pad, vocab);
  } else {
    for (std::size_t i = 8; i < kHeaderWords; ++i) {
      if (w[i] != 0) {
        h.error = fmt::format("bad header: word {} is {} (words 8 to 255 are 0 in version {})", i,
                              w[i], kSftShardVersion);
        break;
      }
    }
  }
  if (!h.error.empty()) return h;
  SftLayout layout;
  if (!sft_layout(S, T, D, &layout)) {
    h.error = fmt::format("truncated: header says {} (over 2^64 bytes) but the file has {} bytes",
                          sizes_phrase(S, T, D), file_size);
    return h;
  }
  if (file_size < layout.file_bytes) {
    h.error = fmt::format("truncated: header says {} ({} bytes) but the file has {} bytes",
                          sizes_phrase(S, T, D), layout.file_bytes, file_size);
    return h;
  }
  if (file_size > layout.file_bytes) {
    h.error = fmt::format(
        "size mismatch: header says {} ({} bytes) but the file has {} bytes ({} bytes more)",
        sizes_phrase(S, T, D), layout.file_bytes, file_size, file_size - layout.file_bytes);
    return h;
  }
  h.num_sequences = S;
  h.seq_len = T;
  h.num_documents = D;
  h.token_bytes = token_bytes;
  h.vocab_size = vocab;
  h.pad_id = static_cast<std::uint32_t>(pad);
  return h;
}

std::string check_sft_documents(int T, const std::vector<std::int64_t>& doc_ptr,
                                const std::vector<std::int32_t>& doc_end) {
  if (doc_ptr.empty()) return "no doc_ptr";
  const auto S = static_cast<std::int64_t>(doc_ptr.size()) - 1;
  const auto D = static_cast<std::int64_t>(doc_end.size());
  if (doc_ptr[0] != 0) return fmt::format("doc_ptr[0] is {}, not 0", doc_ptr[0]);
  for (std::int64_t s = 0; s < S; ++s) {
    const std::int64_t a = doc_ptr[static_cast<std::size_t>(s)];
    const std::int64_t b = doc_ptr[static_cast<std::size_t>(s) + 1];
    if (b < a) {
      return fmt::format(
          "sequence {}: doc_ptr[{}] = {} is below doc_ptr[{}] = {} (it never "
          "decreases)",
          s, s + 1, b, s, a);
    }
    if (b == a) {
      return fmt::format("sequence {} holds no document (doc_ptr[{}] = doc_ptr[{}] = {})", s, s,
                         s + 1, a);
    }
    if (b > D) {
      return fmt::format("sequence {}: doc_ptr[{}] = {} is past the file's D = {} documents", s,
                         s + 1, b, D);
    }
    std::int32_t start = 0;
    for (std::int64_t k = a; k < b; ++k) {
      const std::int32_t end = doc_end[static_cast<std::size_t>(k)];
      if (end <= start) {
        return fmt::format(
            "sequence {}: document {} (doc_end[{}]) ends at {}, not after its start {} (ends "
            "increase strictly within a sequence, from above 0)",
            s, k - a, k, end, start);
      }
      if (end > T) {
        return fmt::format("sequence {}: document {} (doc_end[{}]) ends at {}, past T = {}", s,
                           k - a, k, end, T);
      }
      start = end;
    }
  }
  if (doc_ptr[static_cast<std::size_t>(S)] != D) {
    return fmt::format("doc_ptr[{}] = {} but the header says D = {} documents", S,
                       doc_ptr[static_cast<std::size_t>(S)], D);
  }
  return "";
}

std::string check_sft_mask(const std::uint8_t* mask, int T, int last_end) {
  for (int t = 0; t < T; ++t) {
    if (mask[t] > 1) return fmt::format("mask byte {} at position {} (0 or 1)", mask[t], t);
    if (mask[t] != 0 && t >= last_end) {
      return fmt::format("mask 1 on padding at position {} (the last document ends at {})", t,
                         last_end);
    }
  }
  return "";
}

std::string check_sft_tokens(const std::uint32_t* tokens, int T, int last_end,
                             std::int64_t vocab_limit, std::uint32_t pad_id) {
  for (int t = 0; t < T; ++t) {
    if (t < last_end && static_cast<std::int64_t>(tokens[t]) >= vocab_limit) {
      return fmt::format("token {} at position {} is not below the vocabulary size {}", tokens[t],
                         t, vocab_limit);
    }
    if (t >= last_end && tokens[t] != pad_id) {
      return fmt::format("padding token {} at position {} is not the pad id {}", tokens[t], t,
                         pad_id);
    }
  }
  return "";
}

void sft_row(const std::uint32_t* tokens, const std::uint8_t* mask, const std::int32_t* doc_ends,
             std::int64_t num_docs, int T, std::uint32_t pad_id, const SampleRow& row) {
  const std::int32_t last_end = doc_ends[num_docs - 1];
  std::int64_t k = 0;      // the document of position t
  std::int32_t start = 0;  // its first position
  for (std::int32_t t = 0; t < T; ++t) {
    if (t < last_end) {
      while (t >= doc_ends[k]) start = doc_ends[k++];
      const std::int32_t end = doc_ends[k];  // <= T, so t + 1 < end is inside the row
      // Tokens are below the vocabulary size, an int32 (check_sft_tokens).
      row.inputs[t] = static_cast<std::int32_t>(tokens[t]);
      row.targets[t] =
          t + 1 < end && mask[t + 1] == 1 ? static_cast<std::int32_t>(tokens[t + 1]) : -1;
    } else {
      // Padding: a trailing document of its own, never in the loss.
      start = last_end;
      row.inputs[t] = static_cast<std::int32_t>(pad_id);
      row.targets[t] = -1;
    }
    if (row.doc_start != nullptr) row.doc_start[t] = start;
    if (row.positions != nullptr) row.positions[t] = t - start;
  }
}

SftShard::SftShard(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) ZRT_THROW(DataError, "{}: no such file", path);
    // Every SFT shard stays open for the run: past the process's descriptor limit, say how to
    // fit under it.
    if (err == EMFILE) {
      ZRT_THROW(DataError,
                "{}: cannot open: {} (each SFT shard stays open for the run: raise the limit, "
                "ulimit -n, or write fewer, larger shards: prepare-sft --shard-sequences)",
                path, std::strerror(err));
    }
    ZRT_THROW(DataError, "{}: cannot open: {}", path, std::strerror(err));
  }
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ZRT_THROW(DataError, "{}: cannot stat: {}", path, std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) ZRT_THROW(DataError, "{}: not a regular file", path);
    size_ = static_cast<std::uint64_t>(st.st_size);
    validate();
  } catch (...) {
    close();
    throw;
  }
}

SftShard::SftShard(std::string name, const std::uint8_t* bytes, std::size_t size)
    : path_(std::move(name)), memory_(bytes), size_(bytes != nullptr ? size : 0) {
  validate();
}

SftShard::~SftShard() {
  close();
}

SftShard::SftShard(SftShard&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      memory_(std::exchange(other.memory_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)),
      layout_(other.layout_),
      doc_ptr_(std::move(other.doc_ptr_)),
      doc_end_(std::move(other.doc_end_)) {}

SftShard& SftShard::operator=(SftShard&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    memory_ = std::exchange(other.memory_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
    layout_ = other.layout_;
    doc_ptr_ = std::move(other.doc_ptr_);
    doc_end_ = std::move(other.doc_end_);
  }
  return *this;
}

void SftShard::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void SftShard::read_at(std::uint64_t offset, std::size_t bytes, void* out) const {
  ZRT_CHECK(offset <= size_ && bytes <= size_ - offset, "{}: bytes [{}, +{}) of {}", path_, offset,
            bytes, size_);
  if (fd_ < 0) {
    ZRT_CHECK(memory_ != nullptr || bytes == 0, "read from a closed SFT shard ({})", path_);
    if (bytes > 0) std::memcpy(out, memory_ + offset, bytes);
    return;
  }
  auto* p = static_cast<std::uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ZRT_THROW(DataError, "{}: read failed: {}", path_, std::strerror(errno));
    if (r == 0) {
      ZRT_THROW(DataError, "{}: short read at byte {}: the file changed since it was opened", path_,
                offset);
    }
    p += r;
    bytes -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

void SftShard::validate() {
  // The header, against the size: every later offset is inside the file once it passes.
  std::uint8_t head[kHeaderBytes];
  const auto got = static_cast<std::size_t>(std::min<std::uint64_t>(size_, kHeaderBytes));
  read_at(0, got, head);
  header_ = parse_sft_header(head, got, size_);
  if (!header_.ok()) ZRT_THROW(DataError, "{}: {}", path_, header_.error);
  const bool laid_out =
      sft_layout(header_.num_sequences, header_.seq_len, header_.num_documents, &layout_);
  ZRT_CHECK(laid_out, "{}: a valid header without a layout", path_);

  const auto S = static_cast<std::size_t>(header_.num_sequences);
  const auto D = static_cast<std::size_t>(header_.num_documents);
  const int T = header_.seq_len;
  doc_ptr_.resize(S + 1);
  read_at(layout_.doc_ptr, 8 * (S + 1), doc_ptr_.data());
  le_to_host(doc_ptr_.data(), doc_ptr_.size());
  doc_end_.resize(D);
  read_at(layout_.doc_end, 4 * D, doc_end_.data());
  le_to_host(doc_end_.data(), doc_end_.size());
  const std::string documents = check_sft_documents(T, doc_ptr_, doc_end_);
  if (!documents.empty()) ZRT_THROW(DataError, "{}: {}", path_, documents);

  // The mask, a chunk of whole sequences at a time.
  const std::size_t rows = std::max<std::size_t>(1, kMaskChunkBytes / static_cast<std::size_t>(T));
  std::vector<std::uint8_t> chunk(std::min(rows, S) * static_cast<std::size_t>(T));
  for (std::size_t first = 0; first < S; first += rows) {
    const std::size_t n = std::min(rows, S - first);
    read_at(layout_.mask + first * static_cast<std::size_t>(T), n * static_cast<std::size_t>(T),
            chunk.data());
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = static_cast<std::int64_t>(first + i);
      const std::string mask = check_sft_mask(chunk.data() + i * static_cast<std::size_t>(T), T,
                                              document_ends(s)[num_documents(s) - 1]);
      if (!mask.empty()) ZRT_THROW(DataError, "{}: sequence {}: {}", path_, s, mask);
    }
  }
}

std::int64_t SftShard::num_documents(std::int64_t s) const {
  ZRT_CHECK(s >= 0 && s < header_.num_sequences, "sequence {} of {} in {}", s,
            header_.num_sequences, path_);
  return doc_ptr_[static_cast<std::size_t>(s) + 1] - doc_ptr_[static_cast<std::size_t>(s)];
}

const std::int32_t* SftShard::document_ends(std::int64_t s) const {
  ZRT_CHECK(s >= 0 && s < header_.num_sequences, "sequence {} of {} in {}", s,
            header_.num_sequences, path_);
  return doc_end_.data() + doc_ptr_[static_cast<std::size_t>(s)];
}

void SftShard::read_sequence(std::int64_t s, std::uint32_t* tokens, std::uint8_t* mask,
                             std::int64_t vocab_size) const {
  ZRT_CHECK(s >= 0 && s < header_.num_sequences, "sequence {} of {} in {}", s,
            header_.num_sequences, path_);
  const int T = header_.seq_len;
  const std::uint64_t first = static_cast<std::uint64_t>(s) * static_cast<std::uint64_t>(T);
  read_at(layout_.tokens + 4 * first, 4 * static_cast<std::size_t>(T), tokens);
  le_to_host(tokens, static_cast<std::size_t>(T));
  read_at(layout_.mask + first, static_cast<std::size_t>(T), mask);
  const std::int32_t last_end = document_ends(s)[num_documents(s) - 1];
  // Checked again: the rows' rules rely on it, and the file may have changed since the open.
  std::string error = check_sft_mask(mask, T, last_end);
  if (error.empty()) {
    const bool model = vocab_size > 0 && vocab_size < header_.vocab_size;
    error = check_sft_tokens(tokens, T, last_end, model ? vocab_size : header_.vocab_size,
                             header_.pad_id);
    if (!error.empty() && error.rfind("token ", 0) == 0) {
      error += model ? " (the model's)" : " (the shard header's)";
    }
  }
  if (!error.empty()) ZRT_THROW(DataError, "{}: sequence {}: {}", path_, s, error);
}

void SftShard::read_row(std::int64_t s, const SampleRow& row, std::int64_t vocab_size) const {
  const auto T = static_cast<std::size_t>(header_.seq_len);
  std::vector<std::uint32_t> tokens(T);
  std::vector<std::uint8_t> mask(T);
  read_sequence(s, tokens.data(), mask.data(), vocab_size);
  sft_row(tokens.data(), mask.data(), document_ends(s), num_documents(s), header_.seq_len,
          header_.pad_id, row);
}

}  // namespace zrt
