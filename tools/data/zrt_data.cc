// zrt-data: turns raw text into byte-level llm.c token shards (vocab 256: every byte is a
// token), and inspects shards.
//
//   zrt-data --input text.txt --out dir/prefix [--val-fraction 0.05] [--shard-tokens N]
//     writes dir/prefix_val_000000.bin ... (the first val-fraction of the text, extended to the
//     end of its line) and dir/prefix_train_000000.bin ... (the rest), each shard at most N
//     tokens (default 100M, as llm.c). Every shard is written to a temporary file first and
//     none is renamed into place until all are complete, so a failure (a full disk) or a
//     SIGINT/SIGTERM part-way leaves the earlier output as it was, never a mix of two runs'
//     shards under one prefix. Shards with the same prefix and a higher number, left by an
//     earlier run, are removed then, so a glob over the prefix sees only this run's data.
//   zrt-data --inspect 'dir/prefix_train_*.bin' [--seq-len T]
//     validates the shards (uint16 GPT-2 style or uint32 Llama-3 style) and prints their token
//     counts (and windows of T+1 tokens). A value naming zrt SFT shards (prepare-sft's OUT/train
//     or OUT/val directory, or a glob of sft_*.bin) is validated as training reads it, every
//     sequence read: per shard its sequences, T, documents, vocabulary, pad id, tokens and loss
//     tokens (mask ones not at a document's first token, what a step trains on).
// Text in a model's own tokenizer (tokenizer.json) is tools/data/tokenize_hf.py's job: it
// writes shards of the width the vocabulary needs, in the same naming.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"
#include "runtime/data/open_dataset.h"
#include "runtime/data/sft_shard.h"
#include "runtime/data/token_dataset.h"
#include "runtime/data/token_shard.h"

namespace {

using zrt::DataError;
using zrt::InvalidArgument;

constexpr const char* kUsage =
    "usage: zrt-data --input TEXT --out DIR/PREFIX [--val-fraction F] [--shard-tokens N]\n"
    "       zrt-data --inspect GLOB|SFT_DIR [--seq-len T]\n"
    "Converts text into byte-level (vocab 256) llm.c token shards PREFIX_val_NNNNNN.bin (the\n"
    "first F of the text, default 0.05, to the end of a line) and PREFIX_train_NNNNNN.bin (the\n"
    "rest), at most N tokens per shard (default 100000000), none in place until all are\n"
    "complete (a failure or a signal leaves the earlier shards as they were); or validates\n"
    "shards: llm.c token shards, or prepare-sft's SFT shards (a directory or a glob), every\n"
    "sequence read.\n"
    "With a model's tokenizer.json instead of bytes: tools/data/tokenize_hf.py (the same\n"
    "shards, uint32 tokens when the vocabulary needs them).\n";

struct Args {
  std::string input, out, inspect;
  double val_fraction = 0.05;
  std::int64_t shard_tokens = 100000000;
  int seq_len = 0;
};

std::int64_t parse_int(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0) {
    ZRT_THROW(InvalidArgument, "{}: not an integer: '{}'", flag, value);
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno != 0) {
    ZRT_THROW(InvalidArgument, "{}: not a number: '{}'", flag, value);
  }
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    const auto eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (flag != "--help" && flag != "-h") {
      if (i + 1 >= argc) ZRT_THROW(InvalidArgument, "{} needs a value", flag);
      value = argv[++i];
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (flag == "--input") {
      a.input = value;
    } else if (flag == "--out") {
      a.out = value;
    } else if (flag == "--inspect") {
      a.inspect = value;
    } else if (flag == "--val-fraction") {
      a.val_fraction = parse_double(flag, value);
    } else if (flag == "--shard-tokens") {
      a.shard_tokens = parse_int(flag, value);
    } else if (flag == "--seq-len") {
      a.seq_len = static_cast<int>(parse_int(flag, value));
    } else {
      ZRT_THROW(InvalidArgument, "unknown option '{}'\n{}", flag, kUsage);
    }
  }
  if (a.inspect.empty() && (a.input.empty() || a.out.empty())) {
    ZRT_THROW(InvalidArgument, "--input and --out are required\n{}", kUsage);
  }
  if (!(a.val_fraction >= 0.0 && a.val_fraction < 1.0)) {
    ZRT_THROW(InvalidArgument, "--val-fraction must be in [0, 1), not {}", a.val_fraction);
  }
  if (a.shard_tokens < 1 || a.shard_tokens > zrt::kMaxShardTokens) {
    ZRT_THROW(InvalidArgument, "--shard-tokens must be in [1, {}], not {}", zrt::kMaxShardTokens,
              a.shard_tokens);
  }
  if (a.seq_len < 0) ZRT_THROW(InvalidArgument, "--seq-len must be positive");
  return a;
}

std::string shard_path(const std::string& prefix, const std::string& split, int index) {
  return fmt::format("{}_{}_{:06d}.bin", prefix, split, index);
}

// SIGINT/SIGTERM while converting: the handler only records the signal (a signal flag is
// necessarily process-wide), the conversion polls it between chunks and unwinds, and the
// writers' destructors remove their temporary files.
volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

// Thrown when a stop signal is seen while converting.
struct Interrupted {
  int signal;
};

// Thrown when a rename fails with some shards already in place: the one failure after which
// the earlier output is not as it was.
struct PartlyPublished {
  std::string message;
};

void poll_stop_signal() {
  if (g_stop_signal != 0) throw Interrupted{static_cast<int>(g_stop_signal)};
}

// SIGINT and SIGTERM held for its lifetime: the renames that publish the output run to the end.
class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &set, &previous_);
  }
  ~SignalsHeld() { ::sigprocmask(SIG_SETMASK, &previous_, nullptr); }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t previous_;
};

// The shards of one split: bytes in, shards of at most shard_tokens tokens out, each sealed in
// its temporary file; commit() renames them all into place.
class SplitWriter {
 public:
  SplitWriter(std::string prefix, std::string split, std::int64_t shard_tokens)
      : prefix_(std::move(prefix)), split_(std::move(split)), shard_tokens_(shard_tokens) {}

  void write(const unsigned char* bytes, std::size_t n) {
    while (n > 0) {
      if (!writer_) {
        paths_.push_back(shard_path(prefix_, split_, static_cast<int>(paths_.size())));
        writer_ = std::make_unique<zrt::ShardWriter>(paths_.back());
      }
      const auto room = static_cast<std::size_t>(shard_tokens_ - writer_->num_tokens());
      const std::size_t take = std::min(n, room);
      buf_.assign(bytes, bytes + take);
      writer_->append(buf_.data(), take);
      bytes += take;
      n -= take;
      tokens_ += static_cast<std::int64_t>(take);
      if (writer_->num_tokens() == shard_tokens_) seal_shard();
    }
  }

  // The last shard sealed too: every shard complete, none in place yet.
  void seal() {
    if (writer_) seal_shard();
  }

  // Renames every shard into place, counting them in *committed (for the message when one
  // rename fails).
  void commit(std::size_t* committed) {
    for (std::size_t i = 0; i < sealed_.size(); ++i) {
      sealed_[i]->commit();
      ++*committed;
      std::printf("zrt-data: wrote %s (%lld tokens)\n", paths_[i].c_str(),
                  static_cast<long long>(sealed_[i]->num_tokens()));
    }
  }

  // Removes PREFIX_SPLIT_NNNNNN.bin beyond the ones written (left by an earlier, longer run).
  void remove_stale() const {
    for (int i = static_cast<int>(paths_.size());; ++i) {
      const std::string path = shard_path(prefix_, split_, i);
      if (std::remove(path.c_str()) != 0) break;
      std::printf("zrt-data: removed stale %s\n", path.c_str());
    }
  }

  std::int64_t tokens() const { return tokens_; }
  std::size_t shards() const { return paths_.size(); }

 private:
  void seal_shard() {
    writer_->seal();
    sealed_.push_back(std::move(writer_));
  }

  std::string prefix_, split_;
  std::int64_t shard_tokens_;
  std::unique_ptr<zrt::ShardWriter> writer_;
  std::vector<std::unique_ptr<zrt::ShardWriter>> sealed_;  // complete, not yet in place
  std::vector<std::string> paths_;
  std::vector<std::uint16_t> buf_;
  std::int64_t tokens_ = 0;
};

int convert(const Args& a) {
  struct stat st {};
  if (::stat(a.input.c_str(), &st) != 0) {
    ZRT_THROW(DataError, "{}: {}", a.input, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) ZRT_THROW(DataError, "{}: not a regular file", a.input);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) ZRT_THROW(DataError, "{}: empty file", a.input);
  const std::filesystem::path parent = std::filesystem::path(a.out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(a.input.c_str(), "rb"),
                                                     &std::fclose);
  if (!in) ZRT_THROW(DataError, "{}: cannot open: {}", a.input, std::strerror(errno));

  // The validation split is the head of the text: val_fraction of its bytes, extended to the
  // end of the line (by at most 64 KiB) so no line is cut in two.
  const auto val_target = static_cast<std::uint64_t>(a.val_fraction * static_cast<double>(size));
  constexpr std::uint64_t kMaxLineExtension = 64 * 1024;
  SplitWriter val(a.out, "val", a.shard_tokens), train(a.out, "train", a.shard_tokens);
  bool in_val = val_target > 0;
  std::uint64_t seen = 0;
  std::vector<unsigned char> chunk(1 << 20);
  for (;;) {
    poll_stop_signal();
    const std::size_t n = std::fread(chunk.data(), 1, chunk.size(), in.get());
    if (n == 0) {
      if (std::ferror(in.get())) ZRT_THROW(DataError, "{}: read error", a.input);
      break;
    }
    std::size_t i = 0;
    if (in_val) {
      // Bytes up to and including the cut go to val.
      std::size_t j = 0;
      for (; j < n; ++j) {
        const std::uint64_t pos = seen + j;  // bytes before this one
        if (pos + 1 >= val_target &&
            (chunk[j] == '\n' || pos + 1 >= val_target + kMaxLineExtension)) {
          ++j;
          in_val = false;
          break;
        }
      }
      val.write(chunk.data(), j);
      i = j;
    }
    if (i < n) train.write(chunk.data() + i, n - i);
    seen += n;
  }
  if (train.tokens() == 0) {
    ZRT_THROW(DataError, "{}: nothing left for training after the validation split ({} bytes)",
              a.input, val.tokens());
  }
  val.seal();
  train.seal();
  poll_stop_signal();
  {
    // Every shard is complete: they go into place together, the stale ones go, and the
    // directory is flushed, with SIGINT/SIGTERM held until the output is whole.
    const SignalsHeld held;
    std::size_t committed = 0;
    try {
      val.commit(&committed);
      train.commit(&committed);
    } catch (const std::exception& e) {
      // Only a rename can fail here (the same directory, every file complete): rare, and
      // the earlier output is then part replaced, which the message says.
      throw PartlyPublished{fmt::format(
          "{} ({} of the {} shards were in place before it: {}_*.bin is a mix of this run's "
          "shards and an earlier one's; run again)",
          zrt::error_text(e), committed, val.shards() + train.shards(), a.out)};
    }
    val.remove_stale();
    train.remove_stale();
    zrt::fsync_path(parent.empty() ? "." : parent.string(), true);
  }
  std::printf(
      "zrt-data: %s: %llu bytes -> %lld train tokens in %zu shard(s), %lld val tokens in %zu "
      "shard(s), vocab 256\n",
      a.input.c_str(), static_cast<unsigned long long>(seen),
      static_cast<long long>(train.tokens()), train.shards(), static_cast<long long>(val.tokens()),
      val.shards());
  return 0;
}

// SFT shards: each validated and every sequence read, as training reads them.
int inspect_sft(const std::vector<std::string>& paths) {
  std::int64_t sequences = 0, documents = 0, tokens = 0, loss_tokens = 0;
  for (const std::string& path : paths) {
    const zrt::SftShard shard(path);
    const int T = shard.seq_len();
    // Each sequence as the model row training reads (SftShard::read_row): its trained targets
    // are the loss tokens; its documents end where the last one's end says.
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(T)), targets(inputs.size());
    const zrt::SampleRow row{inputs.data(), targets.data(), nullptr, nullptr};
    std::int64_t shard_tokens = 0, shard_loss = 0;
    for (std::int64_t q = 0; q < shard.num_sequences(); ++q) {
      shard.read_row(q, row);
      shard_tokens += shard.document_ends(q)[shard.num_documents(q) - 1];
      for (const std::int32_t t : targets) shard_loss += t >= 0;
    }
    std::printf(
        "%s: %lld sequences of %d tokens, %lld documents, vocab %lld, pad id %lld; "
        "%lld tokens, %lld loss tokens\n",
        path.c_str(), static_cast<long long>(shard.num_sequences()), T,
        static_cast<long long>(shard.num_documents()),
        static_cast<long long>(shard.header().vocab_size),
        static_cast<long long>(shard.header().pad_id), static_cast<long long>(shard_tokens),
        static_cast<long long>(shard_loss));
    sequences += shard.num_sequences();
    documents += shard.num_documents();
    tokens += shard_tokens;
    loss_tokens += shard_loss;
  }
  std::printf(
      "zrt-data: %zu SFT shard(s), %lld sequences, %lld documents, %lld tokens, %lld loss "
      "tokens\n",
      paths.size(), static_cast<long long>(sequences), static_cast<long long>(documents),
      static_cast<long long>(tokens), static_cast<long long>(loss_tokens));
  return 0;
}

int inspect(const Args& a) {
  std::int64_t total = 0;
  const std::vector<std::string> paths = zrt::expand_data_path(a.inspect);
  if (zrt::data_file_kind(paths.front()) == zrt::DataFileKind::kSftShard) {
    for (const std::string& path : paths) {
      if (zrt::data_file_kind(path) != zrt::DataFileKind::kSftShard) {
        throw DataError(path + ": an llm.c token shard among SFT shards (" + paths.front() + ")");
      }
    }
    return inspect_sft(paths);
  }
  for (const std::string& path : paths) {
    const zrt::ShardHeader h = zrt::read_shard_header(path);
    total += h.num_tokens;
    std::printf("%s: %lld tokens (%s)\n", path.c_str(), static_cast<long long>(h.num_tokens),
                h.token_bytes == 4 ? "uint32, Llama-3 style" : "uint16, GPT-2 style");
  }
  std::printf("zrt-data: %zu shard(s), %lld tokens\n", paths.size(), static_cast<long long>(total));
  if (a.seq_len > 0) {
    const zrt::TokenDataset dataset(a.inspect, a.seq_len);
    std::printf("zrt-data: %lld windows of T+1 = %d tokens\n",
                static_cast<long long>(dataset.num_samples()), a.seq_len + 1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse_args(argc, argv);
    if (!a.inspect.empty()) return inspect(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-data: error: %s\n", zrt::error_text(e).c_str());
    return 1;
  }
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_handler = on_stop_signal;
  for (int signal : {SIGINT, SIGTERM}) sigaction(signal, &action, nullptr);
  // Until the commit, an error or a signal leaves nothing: the shards written so far were
  // temporary files, removed as the conversion unwinds.
  const std::string unchanged = fmt::format("nothing written; {}_*.bin is as it was", a.out);
  try {
    return convert(a);
  } catch (const Interrupted& stop) {
    std::fprintf(stderr, "zrt-data: interrupted (%s): %s\n",
                 stop.signal == SIGINT ? "SIGINT" : "SIGTERM", unchanged.c_str());
    return 128 + stop.signal;
  } catch (const PartlyPublished& e) {
    std::fprintf(stderr, "zrt-data: error: %s\n", e.message.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-data: error: %s (%s)\n", zrt::error_text(e).c_str(),
                 unchanged.c_str());
    return 1;
  }
}
