// llm.c token shards and the sample stream: header validation with the messages users see,
// llm.c's DataLoader reproduced token for token, the global-sample-index stream at any world
// size and across a resume at another one, shuffling, and zrt-data's byte-level round trip
// (and its output left as it was by a failed write or a signal).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/data/token_dataset.h"
#include "runtime/data/token_shard.h"
#include "tests/data/data_test_support.h"

using namespace zrt;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
using test::write_bytes;

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A raw shard: header (magic, version, count) and `tokens` tokens of value i & 0xffff.
std::vector<std::uint8_t> raw_shard(std::int32_t magic, std::int32_t version, std::int32_t count,
                                    std::size_t tokens) {
  std::vector<std::uint8_t> b(kShardHeaderBytes + 2 * tokens, 0);
  auto put = [&](std::size_t at, std::int32_t v) {
    const auto u = static_cast<std::uint32_t>(v);
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<std::uint8_t>(u >> (8 * i));
  };
  put(0, magic);
  put(4, version);
  put(8, count);
  for (std::size_t i = 0; i < tokens; ++i) {
    b[kShardHeaderBytes + 2 * i] = static_cast<std::uint8_t>(i);
    b[kShardHeaderBytes + 2 * i + 1] = static_cast<std::uint8_t>(i >> 8);
  }
  return b;
}

// The message read_shard_header throws for `path`, or "" if it does not throw.
std::string header_error(const std::string& path) {
  try {
    (void)read_shard_header(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// Shard s of a synthetic set: token i is (s * 4099 + i) mod 65536, so every token names its
// place.
std::vector<std::uint16_t> synthetic_tokens(int s, std::size_t n) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>(s * 4099 + i);
  return t;
}

// Writes shards "<dir>/train_00k.bin" with the given sizes; returns their tokens.
std::vector<std::vector<std::uint16_t>> write_shard_set(const TempDir& dir,
                                                        const std::vector<std::size_t>& sizes) {
  std::vector<std::vector<std::uint16_t>> shards;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    shards.push_back(synthetic_tokens(static_cast<int>(s), sizes[s]));
    write_shard(dir / fmt::format("train_{:03d}.bin", s), shards.back().data(), sizes[s]);
  }
  return shards;
}

// llm.c's DataLoader (llmc/dataloader.h, unshuffled) for one rank: shard_num_samples =
// (ntok - 1) / (N*B*T) groups; group g of a shard is read at token g*N*B*T + r*B*T as B*T+1
// tokens; after the last group of a shard it moves to the next, after the last shard to the
// first.
class LlmcLoader {
 public:
  LlmcLoader(const std::vector<std::vector<std::uint16_t>>& shards, int B, int T, int rank,
             int world)
      : shards_(shards), B_(B), T_(T), rank_(rank), world_(world) {}

  void next_batch(std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets) {
    const std::int64_t group = static_cast<std::int64_t>(world_) * B_ * T_;
    auto groups = [&](std::size_t s) {
      return (static_cast<std::int64_t>(shards_[s].size()) - 1) / group;
    };
    if (sample_ >= groups(shard_)) {
      shard_ = (shard_ + 1) % shards_.size();
      sample_ = 0;
    }
    const std::int64_t at = sample_ * group + static_cast<std::int64_t>(rank_) * B_ * T_;
    const std::size_t bt = static_cast<std::size_t>(B_) * T_;
    inputs.assign(bt, 0);
    targets.assign(bt, 0);
    for (std::size_t i = 0; i < bt; ++i) {
      inputs[i] = shards_[shard_][static_cast<std::size_t>(at) + i];
      targets[i] = shards_[shard_][static_cast<std::size_t>(at) + i + 1];
    }
    ++sample_;
  }

 private:
  const std::vector<std::vector<std::uint16_t>>& shards_;
  int B_, T_, rank_, world_;
  std::size_t shard_ = 0;
  std::int64_t sample_ = 0;
};

struct Batch {
  std::vector<std::int32_t> inputs, targets;
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
};

Batch micro_batch(DataStream& stream, int rank, int world, int B) {
  const std::size_t bt = static_cast<std::size_t>(B) * stream.dataset().seq_len();
  Batch b{std::vector<std::int32_t>(bt), std::vector<std::int32_t>(bt)};
  stream.next_micro_batch(rank, world, B, b.inputs.data(), b.targets.data());
  return b;
}

Batch concat(const std::vector<Batch>& parts) {
  Batch out;
  for (const Batch& p : parts) {
    out.inputs.insert(out.inputs.end(), p.inputs.begin(), p.inputs.end());
    out.targets.insert(out.targets.end(), p.targets.begin(), p.targets.end());
  }
  return out;
}

int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a good shard is read back exactly") {
  TempDir dir;
  const auto tokens = synthetic_tokens(3, 1000);
  write_shard(dir / "good.bin", tokens.data(), tokens.size());
  const ShardHeader h = read_shard_header(dir / "good.bin");
  CHECK(h.ok());
  CHECK(h.magic == kShardMagic);
  CHECK(h.version == kShardVersion);
  CHECK(h.num_tokens == 1000);
  CHECK(fs::file_size(dir / "good.bin") == 1024 + 2 * 1000);

  ShardFile f(dir / "good.bin");
  std::vector<std::uint16_t> got(10);
  f.read(990, 10, got.data());
  CHECK(std::equal(got.begin(), got.end(), tokens.begin() + 990));
  CHECK_THROWS_WITH(f.read(995, 10, got.data()), Contains("are outside the shard's 1000 tokens"));

  // No temporary file is left behind, and an abandoned writer leaves nothing.
  { ShardWriter abandoned(dir / "abandoned.bin"); }
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
}

TEST_CASE("bad shards give an error naming the file and what is wrong") {
  TempDir dir;
  SECTION("bad magic") {
    write_bytes(dir / "magic.bin", raw_shard(12345, 1, 10, 10));
    const std::string e = header_error(dir / "magic.bin");
    CHECK_THAT(e, Contains(dir / "magic.bin: not an llm.c token shard: magic 12345"));
    CHECK_THAT(e, Contains("expected 20240520"));
  }
  SECTION("llm.c's uint32 format: its own version, its own size") {
    // raw_shard writes 2-byte tokens: 20 of them are the bytes of 10 uint32 tokens.
    write_bytes(dir / "llama3.bin", raw_shard(kLlama3ShardMagic, 7, 10, 20));
    CHECK(read_shard_header(dir / "llama3.bin").token_bytes == 4);
    write_bytes(dir / "llama3_v1.bin", raw_shard(kLlama3ShardMagic, 1, 10, 20));
    CHECK_THAT(header_error(dir / "llama3_v1.bin"),
               Contains(dir / "llama3_v1.bin: unsupported llm.c shard version 1 for magic "
                              "20240801: expected 7 (uint32 tokens)"));
    write_bytes(dir / "llama3_short.bin", raw_shard(kLlama3ShardMagic, 7, 10, 19));
    CHECK_THAT(header_error(dir / "llama3_short.bin"),
               Contains(dir / "llama3_short.bin: truncated: header says 10 tokens (1064 bytes) "
                              "but the file has 1062 bytes"));
    // A GPT-2 style header over the same bytes: 20 uint16 tokens where 10 are declared.
    write_bytes(dir / "narrow.bin", raw_shard(kShardMagic, 1, 10, 20));
    CHECK_THAT(header_error(dir / "narrow.bin"), Contains("size mismatch"));
  }
  SECTION("bad version") {
    write_bytes(dir / "version.bin", raw_shard(kShardMagic, 2, 10, 10));
    CHECK_THAT(header_error(dir / "version.bin"),
               Contains(dir / "version.bin: unsupported llm.c shard version 2"));
  }
  SECTION("truncated") {
    write_bytes(dir / "trunc.bin", raw_shard(kShardMagic, 1, 100, 50));
    CHECK_THAT(header_error(dir / "trunc.bin"),
               Contains(dir / "trunc.bin: truncated: header says 100 tokens (1224 bytes) but the "
                              "file has 1124 bytes"));
  }
  SECTION("header lying about the size") {
    write_bytes(dir / "long.bin", raw_shard(kShardMagic, 1, 10, 100));
    CHECK_THAT(header_error(dir / "long.bin"),
               Contains(dir / "long.bin: size mismatch: header says 10 tokens (1044 bytes) but "
                              "the file has 1224 bytes (180 bytes more)"));
  }
  SECTION("negative count") {
    write_bytes(dir / "neg.bin", raw_shard(kShardMagic, 1, -5, 10));
    CHECK_THAT(header_error(dir / "neg.bin"),
               Contains(dir / "neg.bin: bad header: negative token count -5"));
  }
  SECTION("smaller than a header") {
    write_bytes(dir / "small.bin", {1, 2, 3});
    CHECK_THAT(header_error(dir / "small.bin"),
               Contains(dir / "small.bin: too small for an llm.c token shard: 3 bytes"));
    write_bytes(dir / "empty.bin", {});
    CHECK_THAT(header_error(dir / "empty.bin"), Contains(dir / "empty.bin: empty file"));
    const std::string text = "In the beginning God created the heaven and the earth.\n";
    write_bytes(dir / "text.bin", std::vector<std::uint8_t>(text.begin(), text.end()));
    CHECK_THAT(header_error(dir / "text.bin"),
               Contains("(it looks like text: convert it with zrt-data)"));
  }
  SECTION("missing file") {
    CHECK_THAT(header_error(dir / "missing.bin"), Contains(dir / "missing.bin: no such file"));
    CHECK_THROWS_WITH(TokenDataset(dir / "missing.bin", 8),
                      Contains(dir / "missing.bin: no such file"));
  }
  SECTION("a file whose name holds glob characters is that file") {
    // "shard[1].bin" as a glob matches shard1.bin; the file of that very name is meant.
    const std::vector<std::uint16_t> a(40, 7), b(40, 9);
    write_shard(dir / "shard1.bin", a.data(), a.size());
    write_shard(dir / "shard[1].bin", b.data(), b.size());
    CHECK(expand_glob(dir / "shard[1].bin") == std::vector<std::string>{dir / "shard[1].bin"});
    CHECK(expand_glob(dir / "shard?.bin") == std::vector<std::string>{dir / "shard1.bin"});
  }
  SECTION("not a file") {
    fs::create_directory(dir / "sub.bin");
    CHECK_THAT(header_error(dir / "sub.bin"), Contains(dir / "sub.bin: not a regular file"));
  }
  SECTION("empty glob") {
    CHECK_THROWS_AS(TokenDataset(dir / "train_*.bin", 8), DataError);
    CHECK_THROWS_WITH(TokenDataset(dir / "train_*.bin", 8),
                      Contains("no file matches '" + (dir / "train_*.bin") + "'"));
  }
  SECTION("one bad shard among good ones") {
    write_shard_set(dir, {100, 100, 100});
    write_bytes(dir / "train_001.bin", raw_shard(kShardMagic, 1, 100, 99));
    CHECK_THROWS_WITH(TokenDataset(dir / "train_*.bin", 8),
                      Contains(dir / "train_001.bin: truncated"));
  }
  SECTION("no shard holds a window") {
    write_shard_set(dir, {5, 8});
    CHECK_THROWS_WITH(TokenDataset(dir / "train_*.bin", 8),
                      Contains("no shard holds a window of T+1 = 9 tokens (2 shards, 13 tokens, "
                               "the largest 8 tokens)"));
  }
}

TEST_CASE("the header parser is total over arbitrary bytes") {
  // A small in-process fuzz: random bytes with a plausible header now and then, random sizes
  // (shorter and longer than a header) and file sizes. ok() must mean a consistent header.
  std::mt19937_64 rng(7);
  std::vector<std::uint8_t> bytes(2048);
  for (int iter = 0; iter < 20000; ++iter) {
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    if (iter % 2 == 0) {
      const auto good = raw_shard(kShardMagic, 1, static_cast<std::int32_t>(rng() % 64), 0);
      std::copy(good.begin(), good.begin() + 12 - static_cast<long>(iter % 4), bytes.begin());
    }
    const std::size_t size = rng() % bytes.size();
    const std::uint64_t file_size =
        iter % 3 == 0 ? size : (iter % 3 == 1 ? 1024 + 2 * (rng() % 64) : rng());
    const ShardHeader h =
        parse_shard_header(iter % 97 == 0 ? nullptr : bytes.data(), size, file_size);
    CHECK(h.ok() == h.error.empty());
    if (h.ok()) {
      CHECK(size >= kShardHeaderBytes);
      CHECK(file_size == shard_file_bytes(h.num_tokens, h.token_bytes));
    }
  }
}

TEST_CASE("windows and shard boundaries") {
  TempDir dir;
  // T = 4: shard 0 (50 tokens) holds floor(49/4) = 12 windows, shard 1 (5) one, shard 2 (4)
  // none (skipped with a warning), shard 3 (30) seven.
  const auto shards = write_shard_set(dir, {50, 5, 4, 30});
  TokenDataset d(dir / "train_*.bin", 4);
  CHECK(d.num_samples() == 12 + 1 + 0 + 7);
  CHECK(d.num_tokens() == 89);
  REQUIRE(d.shards().size() == 4);
  CHECK(d.shards()[3].first_sample == 13);
  std::vector<std::uint32_t> w(5);
  for (std::int64_t i = 0; i < d.num_samples(); ++i) {
    const SampleLocation loc = d.locate(i);
    const int expect_shard = i < 12 ? 0 : (i < 13 ? 1 : 3);
    const std::int64_t local = i < 12 ? i : (i < 13 ? i - 12 : i - 13);
    CHECK(loc.shard == expect_shard);
    CHECK(loc.token == local * 4);
    d.read_sample(i, w.data());
    const auto& s = shards[static_cast<std::size_t>(expect_shard)];
    CHECK(std::equal(w.begin(), w.end(), s.begin() + local * 4));
  }
  // Groups of 3 windows: 12 -> 12, 1 -> 0, 0, 7 -> 6.
  TokenDataset g(dir / "train_*.bin", 4, 3);
  CHECK(g.num_samples() == 18);
  CHECK(g.locate(12).shard == 3);
  CHECK(g.locate(12).token == 0);

  // The vocabulary check names the shard and the token.
  d.set_vocab_size(30);
  d.read_sample(0, w.data());  // tokens 0..4
  CHECK_THROWS_WITH(d.read_sample(13, w.data()),
                    Contains(dir / "train_003.bin: token 12297 at index 0") &&
                        Contains("not below the vocabulary size 30"));
  CHECK_THROWS_AS(TokenDataset(dir / "train_*.bin", 0), InvalidArgument);
}

TEST_CASE("with group N*B the stream is llm.c's DataLoader, token for token") {
  TempDir dir;
  const auto shards = write_shard_set(dir, {50, 37, 64});
  for (int T : {3, 4}) {
    for (int B : {1, 2}) {
      for (int N : {1, 2, 3}) {
        TokenDataset d(dir / "train_*.bin", T, static_cast<std::int64_t>(N) * B);
        for (int r = 0; r < N; ++r) {
          LlmcLoader ref(shards, B, T, r, N);
          DataStream stream(d);
          Batch expect;
          for (int k = 0; k < 40; ++k) {  // several epochs
            ref.next_batch(expect.inputs, expect.targets);
            INFO("T " << T << " B " << B << " N " << N << " rank " << r << " step " << k);
            REQUIRE(micro_batch(stream, r, N, B) == expect);
          }
          CHECK(stream.position() == 40LL * N * B);
        }
      }
    }
  }
  // At the default group of 1, a single process reading B*T+1 tokens at a time within the first
  // shard is llm.c too.
  TokenDataset d(dir / "train_*.bin", 4);
  LlmcLoader ref(shards, 2, 4, 0, 1);
  DataStream stream(d);
  Batch expect;
  for (int k = 0; k < 6; ++k) {  // 6 groups of 8 tokens fit in 49
    ref.next_batch(expect.inputs, expect.targets);
    REQUIRE(micro_batch(stream, 0, 1, 2) == expect);
  }
}

TEST_CASE("rank r of N reads the global samples (k*N + r)*B ... of the sequential stream") {
  TempDir dir;
  write_shard_set(dir, {61, 23, 40});
  TokenDataset d(dir / "train_*.bin", 5);  // 12 + 4 + 7 = 23 windows
  REQUIRE(d.num_samples() == 23);
  for (bool shuffle : {false, true}) {
    const DataStreamOptions options{shuffle, 11};
    std::vector<Batch> single;  // one process, one sample at a time, over three epochs
    {
      DataStream s(d, options);
      for (int i = 0; i < 3 * 23; ++i) single.push_back(micro_batch(s, 0, 1, 1));
    }
    for (int N : {1, 2, 3, 4}) {
      for (int B : {1, 2, 3}) {
        for (int r = 0; r < N; ++r) {
          DataStream s(d, options);
          for (int k = 0; (k * N + r + 1) * B <= 3 * 23; ++k) {
            const auto first = static_cast<std::size_t>((k * N + r) * B);
            const Batch expect =
                concat(std::vector<Batch>(single.begin() + static_cast<long>(first),
                                          single.begin() + static_cast<long>(first) + B));
            INFO("shuffle " << shuffle << " N " << N << " B " << B << " rank " << r << " k " << k);
            REQUIRE(micro_batch(s, r, N, B) == expect);
          }
        }
      }
    }
    // And the epochs wrap: unshuffled, epoch 2 repeats epoch 0.
    if (!shuffle) CHECK(single[2 * 23 + 5] == single[5]);
  }
}

TEST_CASE("a run resumed at another world size continues the same stream") {
  TempDir dir;
  write_shard_set(dir, {300, 211, 97});
  TokenDataset d(dir / "train_*.bin", 8);
  for (bool shuffle : {false, true}) {
    const DataStreamOptions options{shuffle, 2024};
    const int B = 2;
    // The uninterrupted run: 4 ranks, 12 micro-batches. Samples by global index.
    std::vector<Batch> uninterrupted(12 * 4 * B);
    {
      std::vector<DataStream> ranks(4, DataStream(d, options));
      for (int k = 0; k < 12; ++k) {
        for (int r = 0; r < 4; ++r) {
          const Batch b = micro_batch(ranks[static_cast<std::size_t>(r)], r, 4, B);
          for (int j = 0; j < B; ++j) {
            const std::size_t T = 8;
            uninterrupted[static_cast<std::size_t>((k * 4 + r) * B + j)] =
                Batch{{b.inputs.begin() + static_cast<long>(j * T),
                       b.inputs.begin() + static_cast<long>((j + 1) * T)},
                      {b.targets.begin() + static_cast<long>(j * T),
                       b.targets.begin() + static_cast<long>((j + 1) * T)}};
          }
        }
      }
    }
    // The interrupted run: 4 ranks for 5 micro-batches, checkpoint, then 2 ranks.
    DataStreamState saved;
    {
      std::vector<DataStream> ranks(4, DataStream(d, options));
      for (int k = 0; k < 5; ++k) {
        for (int r = 0; r < 4; ++r) (void)micro_batch(ranks[static_cast<std::size_t>(r)], r, 4, B);
      }
      saved = ranks[0].state();
      for (const DataStream& s : ranks) CHECK(s.position() == saved.position);
    }
    CHECK(saved.position == 5 * 4 * B);
    std::vector<DataStream> ranks(2, DataStream(d));  // options come from the checkpoint
    for (DataStream& s : ranks) s.restore(saved);
    for (int k = 0; k < 14; ++k) {
      for (int r = 0; r < 2; ++r) {
        const std::size_t first =
            static_cast<std::size_t>(saved.position) + static_cast<std::size_t>((k * 2 + r) * B);
        const Batch expect =
            concat(std::vector<Batch>(uninterrupted.begin() + static_cast<long>(first),
                                      uninterrupted.begin() + static_cast<long>(first) + B));
        INFO("shuffle " << shuffle << " step " << k << " rank " << r);
        REQUIRE(micro_batch(ranks[static_cast<std::size_t>(r)], r, 2, B) == expect);
      }
    }
    // A position saved over other data is refused.
    TokenDataset other(dir / "train_*.bin", 7);
    DataStream wrong(other);
    CHECK_THROWS_WITH(wrong.restore(saved), Contains("the sample indices would mean other data"));
  }
}

TEST_CASE("shuffling is a deterministic, seed-dependent permutation per epoch") {
  for (std::int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
      for (std::int64_t epoch : {0, 1, 7}) {
        std::vector<std::int64_t> p(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          p[static_cast<std::size_t>(i)] = shuffle_index(n, seed, epoch, i);
          REQUIRE(p[static_cast<std::size_t>(i)] == shuffle_index(n, seed, epoch, i));
        }
        std::vector<std::int64_t> sorted = p;
        std::sort(sorted.begin(), sorted.end());
        for (std::int64_t i = 0; i < n; ++i) REQUIRE(sorted[static_cast<std::size_t>(i)] == i);
      }
    }
  }
  auto perm = [](std::uint64_t seed, std::int64_t epoch) {
    std::vector<std::int64_t> p;
    for (std::int64_t i = 0; i < 1000; ++i) p.push_back(shuffle_index(1000, seed, epoch, i));
    return p;
  };
  std::vector<std::int64_t> identity(1000);
  for (std::int64_t i = 0; i < 1000; ++i) identity[static_cast<std::size_t>(i)] = i;
  CHECK(perm(1, 0) != identity);
  CHECK(perm(1, 0) != perm(2, 0));
  CHECK(perm(1, 0) != perm(1, 1));
  CHECK(perm(1, 0) == perm(1, 0));

  // A shuffled stream visits every window once per epoch, in a different order each epoch.
  TempDir dir;
  write_shard_set(dir, {101, 57});
  TokenDataset d(dir / "train_*.bin", 4);  // 25 + 14 windows
  DataStream s(d, {true, 5});
  std::vector<std::int64_t> e0, e1;
  for (std::int64_t i = 0; i < d.num_samples(); ++i) e0.push_back(s.window(i));
  for (std::int64_t i = 0; i < d.num_samples(); ++i) e1.push_back(s.window(d.num_samples() + i));
  CHECK(e0 != e1);
  CHECK(std::set<std::int64_t>(e0.begin(), e0.end()).size() == 39);
  CHECK(std::set<std::int64_t>(e1.begin(), e1.end()).size() == 39);
  CHECK(s.epoch_of(d.num_samples()) == 1);
  DataStream u(d);
  for (std::int64_t i = 0; i < 2 * d.num_samples(); ++i) CHECK(u.window(i) == i % 39);
}

TEST_CASE("Llama-3 style shards: uint32 tokens written, read, checked against the vocabulary") {
  TempDir dir;
  std::vector<std::uint32_t> wide(300);
  for (std::size_t i = 0; i < wide.size(); ++i) {
    wide[i] = static_cast<std::uint32_t>(100000 + i * 401);  // above uint16, below 2^31
  }
  write_shard(dir / "a_000.bin", wide.data(), wide.size());
  const ShardHeader h = read_shard_header(dir / "a_000.bin");
  CHECK(h.magic == kLlama3ShardMagic);
  CHECK(h.version == kLlama3ShardVersion);
  CHECK(h.token_bytes == 4);
  CHECK(fs::file_size(dir / "a_000.bin") == 1024 + 4 * 300);
  {
    std::ifstream f(dir / "a_000.bin", std::ios::binary);
    unsigned char b[1028];
    f.read(reinterpret_cast<char*>(b), sizeof b);
    CHECK((b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24) == 20240801);  // little-endian, llm.c's
    CHECK((b[4] | b[5] << 8) == 7);
    CHECK((b[1024] | b[1025] << 8 | b[1026] << 16 | static_cast<std::uint32_t>(b[1027]) << 24) ==
          100000u);
  }
  ShardFile f(dir / "a_000.bin");
  std::vector<std::uint32_t> got(7);
  f.read(10, 7, got.data());
  CHECK(std::equal(got.begin(), got.end(), wide.begin() + 10));
  std::vector<std::uint16_t> narrow(7);
  CHECK_THROWS_WITH(f.read(0, 7, narrow.data()),
                    Contains("a Llama-3 style shard (uint32 tokens) read as uint16"));

  // A GPT-2 style shard beside it: one dataset over both widths.
  const std::vector<std::uint16_t> small = synthetic_tokens(1, 100);
  write_shard(dir / "a_001.bin", small.data(), small.size());
  TokenDataset d(dir / "a_*.bin", 9);
  CHECK(d.num_tokens() == 400);
  std::vector<std::uint32_t> w(10);
  d.read_sample(3, w.data());
  CHECK(std::equal(w.begin(), w.end(), wide.begin() + 27));
  const std::int64_t first_small = d.shards()[1].first_sample;
  d.read_sample(first_small + 1, w.data());
  CHECK(std::equal(w.begin(), w.end(), small.begin() + 9));
  // Vocabulary: Llama-3's 128256 takes these tokens; a 100000-token vocabulary does not.
  d.set_vocab_size(128256);
  CHECK_NOTHROW(d.read_sample(3, w.data()));
  d.set_vocab_size(100000);
  CHECK_THROWS_WITH(d.read_sample(3, w.data()),
                    Contains(dir / "a_000.bin: token 110827 at index 27") &&
                        Contains("not below the vocabulary size 100000"));

  // A uint16 writer refuses a token it cannot hold rather than wrapping it.
  ShardWriter narrow_writer(dir / "n.bin");
  const std::uint32_t big = 70000;
  CHECK_THROWS_WITH(narrow_writer.append(&big, 1), Contains("token 70000 does not fit a uint16"));
}

TEST_CASE("a shard that changes under a running dataset gives an error, not a crash") {
  TempDir dir;
  write_shard_set(dir, {100, 100});
  TokenDataset d(dir / "train_*.bin", 8);
  std::vector<std::uint32_t> w(9);
  d.read_sample(20, w.data());  // shard 1 is now the open one
  // The open shard cut under it: pread comes up short.
  fs::resize_file(dir / "train_001.bin", 1024 + 2 * 10);
  CHECK_THROWS_WITH(d.read_sample(20, w.data()),
                    Contains(dir / "train_001.bin: short read at byte 1152"));
  // A shard cut before it is opened again: its header no longer matches its size.
  fs::resize_file(dir / "train_000.bin", 1024 + 2 * 50);
  CHECK_THROWS_WITH(d.read_sample(0, w.data()),
                    Contains(dir / "train_000.bin: truncated: header says 100 tokens"));
}

TEST_CASE("zrt-data turns bytes into tokens one to one") {
  TempDir dir;
  // Every byte value, in lines: a byte-level corpus must not care what the bytes are.
  std::string text;
  for (int line = 0; line < 200; ++line) {
    for (int i = 0; i < 50; ++i) {
      const auto c = static_cast<char>((line * 50 + i) % 256);
      text.push_back(c == '\n' ? ' ' : c);
    }
    text.push_back('\n');
  }
  {
    std::ofstream f(dir / "in.txt", std::ios::binary);
    f << text;
  }
  const std::string tool = ZRT_DATA_TOOL;
  const std::string quiet = " > " + (dir / "log.txt") + " 2>&1";
  REQUIRE(run(tool + " --input " + (dir / "in.txt") + " --out " + (dir / "out/corp") +
              " --val-fraction 0.1 --shard-tokens 3000" + quiet) == 0);

  auto tokens_of = [&](const std::string& pattern) {
    std::string out;
    for (const std::string& path : expand_glob(pattern)) {
      ShardFile f(path);
      std::vector<std::uint16_t> t(static_cast<std::size_t>(f.num_tokens()));
      f.read(0, f.num_tokens(), t.data());
      for (std::uint16_t v : t) {
        REQUIRE(v < 256);
        out.push_back(static_cast<char>(v));
      }
    }
    return out;
  };
  const std::string val = tokens_of(dir / "out/corp_val_*.bin");
  const std::string train = tokens_of(dir / "out/corp_train_*.bin");
  CHECK(val + train == text);
  // The validation split is the first 10% of the text, to the end of its line.
  CHECK(val.size() == 1020);  // 10200 bytes: 1020 is the end of line 20
  CHECK(val.back() == '\n');
  CHECK(expand_glob(dir / "out/corp_train_*.bin").size() == 4);  // 9180 tokens in 3000s
  CHECK(read_shard_header(dir / "out/corp_train_000002.bin").num_tokens == 3000);
  CHECK(read_shard_header(dir / "out/corp_train_000003.bin").num_tokens == 180);

  // A second run with bigger shards replaces the first; no stale shard survives.
  REQUIRE(run(tool + " --input " + (dir / "in.txt") + " --out " + (dir / "out/corp") +
              " --val-fraction 0.1" + quiet) == 0);
  CHECK(expand_glob(dir / "out/corp_train_*.bin").size() == 1);
  CHECK(tokens_of(dir / "out/corp_val_*.bin") + tokens_of(dir / "out/corp_train_*.bin") == text);
  REQUIRE(run(tool + " --inspect '" + (dir / "out/corp_*.bin") + "' --seq-len 64" + quiet) == 0);
  const auto log = read_bytes(dir / "log.txt");
  CHECK_THAT(std::string(log.begin(), log.end()), Contains("2 shard(s), 10200 tokens"));

  // Errors: a missing input, a bad option, nothing left for training; each exits 1.
  CHECK(run(tool + " --input " + (dir / "nope.txt") + " --out " + (dir / "x") + quiet) == 1);
  CHECK(run(tool + " --input " + (dir / "in.txt") + " --out " + (dir / "x") +
            " --val-fraction 1.5" + quiet) == 1);
  CHECK(run(tool + " --inspect '" + (dir / "in.txt") + "'" + quiet) == 1);
  const auto err = read_bytes(dir / "log.txt");
  // --inspect takes llm.c and SFT shards: a text file is neither, and says what it is not.
  CHECK_THAT(std::string(err.begin(), err.end()),
             Contains("in.txt: neither an llm.c token shard") &&
                 Contains("not an llm.c token shard: magic"));
}

namespace {

// Every file under `dir` with its bytes: the output as a user would find it.
std::map<std::string, std::vector<std::uint8_t>> snapshot(const fs::path& dir) {
  std::map<std::string, std::vector<std::uint8_t>> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    files[e.path().filename().string()] = read_bytes(e.path().string());
  }
  return files;
}

int temporary_files(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    n += it->path().filename().string().find(".tmp.") != std::string::npos;
  }
  return n;
}

}  // namespace

TEST_CASE("zrt-data leaves the earlier output as it was when a write fails or a signal stops it") {
  TempDir dir;
  const std::string tool = ZRT_DATA_TOOL;
  // 32 MiB of text: long enough (tens of milliseconds of writing) for a signal to land while
  // the shards are being written.
  std::vector<std::uint8_t> text(32u << 20);
  std::mt19937 rng(7);
  for (auto& b : text) b = static_cast<std::uint8_t>('a' + rng() % 26);
  for (std::size_t i = 79; i < text.size(); i += 80) text[i] = '\n';
  write_bytes(dir / "in.txt", text);
  fs::create_directories(dir / "out");
  const std::string convert = tool + " --input " + (dir / "in.txt") + " --out " + (dir / "out/c");
  REQUIRE(run(convert + " --shard-tokens 8000000 > " + (dir / "log.txt") + " 2>&1") == 0);
  const auto before = snapshot(dir / "out");
  REQUIRE(before.size() == 5);  // val (1.6M tokens) and 4 train shards

  SECTION("a write that fails (the file-size limit, EFBIG, as a full disk would)") {
    // Files of at most 64 KiB (bash's ulimit counts KiB): the first shard of 40K tokens (81 KB)
    // fails; SIGXFSZ ignored, the write returns EFBIG. The error names the shard, not its
    // temporary file, and says that the earlier output is intact (shards complete before a
    // failure: the SIGTERM section).
    const std::string limited = "bash -c \"trap '' XFSZ; ulimit -f 64; exec " + convert +
                                " --shard-tokens 40000\" > " + (dir / "log.txt") + " 2>&1";
    CHECK(run(limited) == 1);
    const auto log = read_bytes(dir / "log.txt");
    CHECK_THAT(
        std::string(log.begin(), log.end()),
        Contains("zrt-data: error: " + (dir / "out/c") + "_val_000000.bin: write failed: ") &&
            Contains("nothing written; " + (dir / "out/c") + "_*.bin is as it was"));
    CHECK(snapshot(dir / "out") == before);  // no new shard, no temporary file, none removed
  }

  SECTION("SIGTERM while writing") {
    // The signal is sent once three temporary shards exist (of 1M tokens each), so two are
    // complete; should the conversion have finished first on a stalled machine, the attempt
    // is repeated (its output must then be whole).
    bool interrupted = false;
    for (int attempt = 0; attempt < 5 && !interrupted; ++attempt) {
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        const std::string log = dir / "log.txt";
        std::FILE* out = std::freopen(log.c_str(), "w", stdout);
        if (out == nullptr || ::dup2(::fileno(stdout), 2) < 0) ::_exit(127);
        const std::string input = dir / "in.txt", prefix = dir / "out/c";
        ::execl(tool.c_str(), tool.c_str(), "--input", input.c_str(), "--out", prefix.c_str(),
                "--shard-tokens", "1000000", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      while (temporary_files(dir / "out") < 3) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) break;  // done before it was seen
        ::usleep(200);
      }
      ::kill(pid, SIGTERM);
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      REQUIRE(WIFEXITED(status));
      if (WEXITSTATUS(status) == 0) {
        // Finished before the signal: the new output is whole (34 shards), and it goes back.
        CHECK(snapshot(dir / "out").size() == 34);
        REQUIRE(run(convert + " --shard-tokens 8000000 > /dev/null 2>&1") == 0);
        REQUIRE(snapshot(dir / "out") == before);
        continue;
      }
      interrupted = true;
      CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
      const auto log = read_bytes(dir / "log.txt");
      CHECK_THAT(std::string(log.begin(), log.end()),
                 Contains("zrt-data: interrupted (SIGTERM): nothing written; " + (dir / "out/c") +
                          "_*.bin is as it was"));
      CHECK(snapshot(dir / "out") == before);
    }
    CHECK(interrupted);
  }
}
