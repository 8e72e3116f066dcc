// zrt SFT shards (runtime/data/sft_shard.h, sft_dataset.h): every validation error the reader
// gives, with the file (and the sequence) named, on shards written here from the format's
// description and then corrupted; every prefix and many single-byte changes either caught or
// harmless; rows exactly as docs/fine-tuning.md says (targets inside a document only, never a
// document's first token, never padding, positions restarting); and prepare-sft's real output
// (made by the sft_fixture test first) read back against its own bytes and summary.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <spdlog/fmt/fmt.h>
#include <nlohmann/json.hpp>

#include "runtime/data/open_dataset.h"
#include "runtime/data/sft_dataset.h"
#include "runtime/data/sft_shard.h"
#include "tests/data/sft_test_support.h"

using namespace zrt;
using namespace zrt::test;
using Catch::Matchers::Contains;

namespace {

// Three sequences of T = 8, vocabulary 100, pad 99: documents of 3 and 5 tokens (no padding),
// of 2, 2 and 1 (padding from 5), and of 6 (padding from 6).
SftContent base_content() {
  SftContent c;
  c.T = 8;
  c.vocab = 100;
  c.pad = 99;
  c.sequences = {make_sequence(8, {3, 5}, 1, 99), make_sequence(8, {2, 2, 1}, 11, 99),
                 make_sequence(8, {6}, 21, 99)};
  return c;
}

// The DataError message of opening `bytes` written to `path` and reading every row, or "".
std::string shard_error(const std::string& path, const std::vector<std::uint8_t>& bytes,
                        std::int64_t vocab_size = 0) {
  write_bytes(path, bytes);
  try {
    const SftShard shard(path);
    Row row(shard.seq_len());
    for (std::int64_t s = 0; s < shard.num_sequences(); ++s) {
      shard.read_row(s, row.view(), vocab_size);
    }
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a shard written from the format reads back with the documents it holds") {
  TempDir dir;
  const SftContent c = base_content();
  write_bytes(dir / "sft_000000.bin", sft_bytes(c));
  const SftShard shard(dir / "sft_000000.bin");
  CHECK(shard.num_sequences() == 3);
  CHECK(shard.seq_len() == 8);
  CHECK(shard.num_documents() == 6);
  CHECK(shard.header().vocab_size == 100);
  CHECK(shard.header().pad_id == 99);
  for (std::int64_t s = 0; s < 3; ++s) {
    const Sequence& q = c.sequences[static_cast<std::size_t>(s)];
    REQUIRE(shard.num_documents(s) == static_cast<std::int64_t>(q.ends.size()));
    CHECK(std::vector<std::int32_t>(shard.document_ends(s),
                                    shard.document_ends(s) + shard.num_documents(s)) == q.ends);
    std::vector<std::uint32_t> tokens(8);
    std::vector<std::uint8_t> mask(8);
    shard.read_sequence(s, tokens.data(), mask.data());
    CHECK(tokens == q.tokens);
    CHECK(mask == q.mask);
  }
}

// Every SFT shard stays open for the run: past the descriptor limit the error says how to fit
// under it (the limit lowered in this process to what is open now, then restored).
TEST_CASE("an SFT shard past the open-file limit names the limit and the fix") {
  TempDir dir;
  write_bytes(dir / "sft_000000.bin", sft_bytes(base_content()));
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  // Fill the lowest free descriptors up to a small limit, so the shard's open gets EMFILE.
  std::vector<int> held;
  struct rlimit low = saved;
  low.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) held.push_back(fd);
  std::string message;
  try {
    const SftShard shard(dir / "sft_000000.bin");
  } catch (const DataError& e) {
    message = e.what();
  }
  for (const int fd : held) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK_THAT(message, Catch::Contains("sft_000000.bin: cannot open") &&
                          Catch::Contains("ulimit -n") &&
                          Catch::Contains("prepare-sft --shard-sequences"));
}

TEST_CASE("bad SFT shards give a DataError naming the file, the sequence and what is wrong") {
  TempDir dir;
  const SftContent c = base_content();
  const std::vector<std::uint8_t> good = sft_bytes(c);
  const Sections at = sections(c);
  const std::string f = dir / "sft_000000.bin";
  auto with = [&](std::size_t offset, std::uint64_t value, int width) {
    std::vector<std::uint8_t> b = good;
    put_le(b, offset, value, width);
    return b;
  };
  REQUIRE(shard_error(f, good).empty());

  SECTION("truncated by one byte, or one byte too long") {
    std::vector<std::uint8_t> b(good.begin(), good.end() - 1);
    CHECK_THAT(shard_error(f, b),
               Contains(f + ": truncated: header says S = 3 sequences of T = 8 tokens and D = 6 "
                            "documents (1200 bytes) but the file has 1199 bytes"));
    b = good;
    b.push_back(0);
    CHECK_THAT(shard_error(f, b), Contains(f + ": size mismatch: header says S = 3 sequences") &&
                                      Contains("(1200 bytes) but the file has 1201 bytes"));
  }
  SECTION("a header that lies about the sizes") {
    CHECK_THAT(shard_error(f, with(8, 4, 4)), Contains(f + ": truncated: header says S = 4"));
    CHECK_THAT(shard_error(f, with(8, 2, 4)), Contains(f + ": size mismatch: header says S = 2"));
    CHECK_THAT(shard_error(f, with(12, 9, 4)), Contains(f + ": truncated") && Contains("T = 9"));
    CHECK_THAT(shard_error(f, with(12, 7, 4)),
               Contains(f + ": size mismatch") && Contains("T = 7"));
    CHECK_THAT(shard_error(f, with(16, 7, 4)),
               Contains(f + ": truncated") && Contains("D = 7 documents"));
    CHECK_THAT(shard_error(f, with(16, 0x7fffffff, 4)), Contains(f + ": truncated"));
    CHECK_THAT(shard_error(f, with(8, 0x7fffffff, 4)),
               Contains(f + ": bad header: D = 6 documents for S = 2147483647 sequences"));
    std::vector<std::uint8_t> huge = with(8, 0x7fffffff, 4);
    put_le(huge, 12, 0x7fffffff, 4);
    put_le(huge, 16, 0x7fffffff, 4);
    CHECK_THAT(shard_error(f, huge), Contains(f + ": truncated: header says S = 2147483647"));
  }
  SECTION("header values") {
    CHECK_THAT(shard_error(f, with(0, 12345, 4)),
               Contains(f + ": not a zrt SFT shard: magic 12345") && Contains("expected 20251201"));
    CHECK_THAT(shard_error(f, with(0, 20240520, 4)),
               Contains(f + ": an llm.c token shard (magic 20240520), not a zrt SFT shard"));
    CHECK_THAT(shard_error(f, with(4, 2, 4)),
               Contains(f + ": unsupported zrt SFT shard version 2: expected 1"));
    CHECK_THAT(shard_error(f, with(8, 0, 4)), Contains(f + ": bad header: S = 0 sequences"));
    CHECK_THAT(shard_error(f, with(8, 0xffffffff, 4)), Contains(f + ": bad header: S = -1"));
    CHECK_THAT(shard_error(f, with(12, 0, 4)), Contains(f + ": bad header: sequence length T = 0"));
    CHECK_THAT(shard_error(f, with(16, 2, 4)),
               Contains(f + ": bad header: D = 2 documents for S = 3 sequences"));
    CHECK_THAT(shard_error(f, with(20, 2, 4)), Contains(f + ": bad header: token_bytes 2"));
    CHECK_THAT(shard_error(f, with(24, 0, 4)), Contains(f + ": bad header: vocab_size 0"));
    CHECK_THAT(shard_error(f, with(28, 100, 4)),
               Contains(f + ": bad header: pad_id 100 is not in [0, vocab_size 100)"));
    CHECK_THAT(shard_error(f, with(32, 1, 4)), Contains(f + ": bad header: word 8 is 1"));
    CHECK_THAT(shard_error(f, with(1020, 7, 4)), Contains(f + ": bad header: word 255 is 7"));
  }
  SECTION("the loss mask") {
    CHECK_THAT(shard_error(f, with(at.mask + 8 + 3, 2, 1)),
               Contains(f + ": sequence 1: mask byte 2 at position 3 (0 or 1)"));
    CHECK_THAT(shard_error(f, with(at.mask + 8 + 6, 1, 1)),
               Contains(f + ": sequence 1: mask 1 on padding at position 6 (the last document "
                            "ends at 5)"));
    CHECK_THAT(shard_error(f, with(at.mask + 16 + 7, 1, 1)),
               Contains(f + ": sequence 2: mask 1 on padding at position 7"));
  }
  SECTION("document pointers") {
    CHECK_THAT(shard_error(f, with(at.doc_ptr, 1, 8)), Contains(f + ": doc_ptr[0] is 1, not 0"));
    CHECK_THAT(shard_error(f, with(at.doc_ptr + 8, 0, 8)),
               Contains(f + ": sequence 0 holds no document (doc_ptr[0] = doc_ptr[1] = 0)"));
    CHECK_THAT(shard_error(f, with(at.doc_ptr + 16, 1, 8)),
               Contains(f + ": sequence 1: doc_ptr[2] = 1 is below doc_ptr[1] = 2"));
    CHECK_THAT(shard_error(f, with(at.doc_ptr + 16, 7, 8)),
               Contains(f + ": sequence 1: doc_ptr[2] = 7 is past the file's D = 6 documents"));
    CHECK_THAT(shard_error(f, with(at.doc_ptr + 16, std::uint64_t{1} << 62, 8)),
               Contains(f + ": sequence 1: doc_ptr[2] = 4611686018427387904 is past"));
    // Sequence 1 loses its last document to sequence 2, which then ends where D says it does not.
    std::vector<std::uint8_t> b = with(at.doc_ptr + 16, 4, 8);
    put_le(b, at.doc_ptr + 24, 5, 8);
    CHECK_THAT(shard_error(f, b),
               Contains(f + ": doc_ptr[3] = 5 but the header says D = 6 documents"));
  }
  SECTION("document ends") {
    // Sequence 0's ends are doc_end[0..1] = 3, 8; sequence 1's doc_end[2..4] = 2, 4, 5.
    CHECK_THAT(shard_error(f, with(at.doc_end, 0, 4)),
               Contains(f + ": sequence 0: document 0 (doc_end[0]) ends at 0, not after its "
                            "start 0"));
    CHECK_THAT(shard_error(f, with(at.doc_end + 12, 2, 4)),
               Contains(f + ": sequence 1: document 1 (doc_end[3]) ends at 2, not after its "
                            "start 2"));
    CHECK_THAT(shard_error(f, with(at.doc_end + 12, 1, 4)),
               Contains(f + ": sequence 1: document 1 (doc_end[3]) ends at 1, not after its "
                            "start 2"));
    CHECK_THAT(shard_error(f, with(at.doc_end + 4, 9, 4)),
               Contains(f + ": sequence 0: document 1 (doc_end[1]) ends at 9, past T = 8"));
    CHECK_THAT(shard_error(f, with(at.doc_end + 4, 0xffffffff, 4)),
               Contains(f + ": sequence 0: document 1 (doc_end[1]) ends at -1"));
  }
  SECTION("tokens, checked when a sequence is read") {
    CHECK_THAT(shard_error(f, with(at.tokens + 4 * 2, 100, 4)),
               Contains(f + ": sequence 0: token 100 at position 2 is not below the vocabulary "
                            "size 100 (the shard header's)"));
    CHECK_THAT(shard_error(f, with(at.tokens + 4 * (16 + 7), 5, 4)),
               Contains(f + ": sequence 2: padding token 5 at position 7 is not the pad id 99"));
    // The model's vocabulary, where it is the smaller: sequence 2's tokens are 21 .. 26.
    CHECK_THAT(shard_error(f, good, 26),
               Contains(f + ": sequence 2: token 26 at position 5 is not below the vocabulary "
                            "size 26 (the model's)"));
    CHECK(shard_error(f, good, 27).empty());
  }
  SECTION("not a shard at all") {
    CHECK_THROWS_WITH(SftShard(dir / "missing.bin"), Contains(dir / "missing.bin: no such file"));
    CHECK_THROWS_WITH(SftShard(dir.path().string()),
                      Contains(dir.path().string() + ": not a regular file"));
    CHECK_THAT(shard_error(f, {}), Contains(f + ": empty file: not a zrt SFT shard"));
    CHECK_THAT(shard_error(f, {1, 2, 3}), Contains(f + ": too small for a zrt SFT shard: 3 bytes"));
  }
}

TEST_CASE("every prefix of a shard is an error naming it; no single-byte change breaks a row") {
  const SftContent c = base_content();
  const std::vector<std::uint8_t> good = sft_bytes(c);
  for (std::size_t n = 0; n < good.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    CHECK_THROWS_WITH(SftShard("prefix.bin", good.data(), n), Contains("prefix.bin: "));
  }
  // Each byte set to a few values: the shard is refused or its rows keep every rule.
  int refused = 0, read = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (const std::uint8_t v : {0x00, 0x01, 0x02, 0x63, 0x80, 0xff}) {
      std::vector<std::uint8_t> b = good;
      if (b[i] == v) continue;
      b[i] = v;
      INFO("byte " << i << " set to " << int{v});
      try {
        const SftShard shard("changed.bin", b.data(), b.size());
        for (std::int64_t s = 0; s < shard.num_sequences(); ++s) {
          Row row(shard.seq_len());
          std::vector<std::uint32_t> tokens(static_cast<std::size_t>(shard.seq_len()));
          std::vector<std::uint8_t> mask(tokens.size());
          shard.read_sequence(s, tokens.data(), mask.data());
          shard.read_row(s, row.view());
          const int last = shard.document_ends(s)[shard.num_documents(s) - 1];
          CHECK(row_rule_broken(row, mask, last).empty());
        }
        ++read;
      } catch (const DataError& e) {
        CHECK_THAT(std::string(e.what()), Contains("changed.bin: "));
        ++refused;
      }
    }
  }
  CHECK(refused > 0);
  CHECK(read > 0);
}

TEST_CASE("an SFT row: targets inside a document only, positions restarting, padding apart") {
  // T = 10: documents [0, 3) and [3, 7), padding [7, 10). The mask is 1 at both documents'
  // first tokens (allowed, ignored), 0 at position 5.
  Sequence q;
  q.tokens = {10, 11, 12, 20, 21, 22, 23, 0, 0, 0};
  q.mask = {1, 1, 1, 1, 1, 0, 1, 0, 0, 0};
  q.ends = {3, 7};
  Row row(10);
  sft_row(q.tokens.data(), q.mask.data(), q.ends.data(), 2, 10, 0, row.view());
  CHECK(row.inputs == std::vector<std::int32_t>{10, 11, 12, 20, 21, 22, 23, 0, 0, 0});
  // 12 -> 20 crosses the boundary, 21 -> 22 is masked out, 23 -> pad is padding.
  CHECK(row.targets == std::vector<std::int32_t>{11, 12, -1, 21, -1, 23, -1, -1, -1, -1});
  CHECK(row.doc_start == std::vector<std::int32_t>{0, 0, 0, 3, 3, 3, 3, 7, 7, 7});
  CHECK(row.positions == std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 3, 0, 1, 2});
  CHECK(row_rule_broken(row, q.mask, 7).empty());

  // A sequence filled to T: its last position has no target; one document of T.
  Sequence full;
  full.tokens = {5, 6, 7, 8};
  full.mask = {1, 1, 1, 1};
  full.ends = {4};
  Row r4(4);
  sft_row(full.tokens.data(), full.mask.data(), full.ends.data(), 1, 4, 9, r4.view());
  CHECK(r4.targets == std::vector<std::int32_t>{6, 7, 8, -1});
  CHECK(r4.positions == std::vector<std::int32_t>{0, 1, 2, 3});

  // Positions and doc_start may be left out.
  Row r(10);
  SampleRow only{r.inputs.data(), r.targets.data(), nullptr, nullptr};
  sft_row(q.tokens.data(), q.mask.data(), q.ends.data(), 2, 10, 0, only);
  CHECK(r.targets == row.targets);

  // The shard's rows are the format's, computed position by position.
  TempDir dir;
  const SftContent c = base_content();
  write_bytes(dir / "sft_000000.bin", sft_bytes(c));
  const SftShard shard(dir / "sft_000000.bin");
  for (std::size_t s = 0; s < 3; ++s) {
    Row got(8);
    shard.read_row(static_cast<std::int64_t>(s), got.view());
    const Row want = expected_row(c.sequences[s], c.pad);
    CHECK(got.inputs == want.inputs);
    CHECK(got.targets == want.targets);
    CHECK(got.positions == want.positions);
    CHECK(got.doc_start == want.doc_start);
    CHECK(row_rule_broken(got, c.sequences[s].mask, c.sequences[s].ends.back()).empty());
  }
}

TEST_CASE("an SFT dataset: shards in order, T and the vocabulary checked against the model's") {
  TempDir dir;
  SftContent a = base_content();
  SftContent b = base_content();
  b.sequences = {make_sequence(8, {8}, 40, 99), make_sequence(8, {1, 1}, 50, 99)};
  write_bytes(dir / "sft_000000.bin", sft_bytes(a));
  write_bytes(dir / "sft_000001.bin", sft_bytes(b));
  write_bytes(dir / "other.bin", sft_bytes(b));  // not an sft_*.bin: not in the directory's set

  const SftDataset d(dir.path().string(), 8);
  CHECK(d.num_samples() == 5);
  CHECK(d.num_documents() == 9);
  CHECK(d.group() == 1);
  CHECK(d.documents());
  CHECK(d.locate(3) == std::pair<int, std::int64_t>{1, 0});
  std::vector<Sequence> all = a.sequences;
  all.insert(all.end(), b.sequences.begin(), b.sequences.end());
  for (std::int64_t i = 0; i < 5; ++i) {
    Row got(8);
    d.read_row(i, got.view());
    const Row want = expected_row(all[static_cast<std::size_t>(i)], 99);
    CHECK(got.inputs == want.inputs);
    CHECK(got.targets == want.targets);
    CHECK(got.positions == want.positions);
  }

  CHECK_THROWS_WITH(SftDataset(dir.path().string(), 16),
                    Contains(dir / "sft_000000.bin: sequences of T = 8 tokens, but the model's "
                                   "sequence length is 16"));
  SftDataset v(dir / "sft_*.bin", 8);
  CHECK(v.num_samples() == 5);
  CHECK_THROWS_WITH(v.set_vocab_size(50),
                    Contains(dir / "sft_000000.bin: tokenized for a vocabulary of 100 ids, but the "
                                   "model has 50"));
  v.set_vocab_size(128);
  Row row(8);
  v.read_row(4, row.view());
  CHECK(row.inputs[0] == 50);
}

#ifdef ZRT_SFT_FIXTURE
TEST_CASE("prepare-sft's output reads back as its bytes and its summary say") {
  // Made by the sft_fixture test (tests/CMakeLists.txt) from tests/data/sft before this runs.
  const std::string out = ZRT_SFT_FIXTURE;
  const nlohmann::json summary = nlohmann::json::parse(read_bytes(out + "/summary.json"));
  const int T = summary.at("seq_len").get<int>();
  const auto pad = summary.at("pad_id").get<std::uint32_t>();
  for (const std::string split : {"train", "val"}) {
    INFO(split);
    const nlohmann::json& s = summary.at(split);
    REQUIRE(s.at("shards").size() >= 1);
    std::unique_ptr<SampleSource> source = open_dataset(out + "/" + split, T);
    const auto* d = dynamic_cast<const SftDataset*>(source.get());
    REQUIRE(d != nullptr);
    CHECK(d->num_samples() == s.at("sequences").get<std::int64_t>());
    CHECK(d->num_documents() == s.at("documents").get<std::int64_t>());
    REQUIRE(d->shards().size() == s.at("shards").size());

    // The shards' bytes, read here from the format: every sequence's row as the rules say.
    std::int64_t index = 0, loss_tokens = 0, real_tokens = 0;
    for (const auto& name : s.at("shards")) {
      const std::vector<std::uint8_t> b = read_bytes(out + "/" + name.get<std::string>());
      REQUIRE(get_le(b, 0, 4) == 20251201);
      const auto S = static_cast<std::size_t>(get_le(b, 8, 4));
      const auto D = static_cast<std::size_t>(get_le(b, 16, 4));
      REQUIRE(static_cast<int>(get_le(b, 12, 4)) == T);
      REQUIRE(get_le(b, 28, 4) == pad);
      const Sections at = sections(S, static_cast<std::size_t>(T), D);
      REQUIRE(b.size() == at.size);
      for (std::size_t q = 0; q < S; ++q) {
        Sequence seq;
        for (int t = 0; t < T; ++t) {
          const std::size_t i = q * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
          seq.tokens.push_back(static_cast<std::uint32_t>(get_le(b, at.tokens + 4 * i, 4)));
          seq.mask.push_back(b[at.mask + i]);
        }
        const auto first = get_le(b, at.doc_ptr + 8 * q, 8);
        const auto last = get_le(b, at.doc_ptr + 8 * (q + 1), 8);
        for (auto k = first; k < last; ++k) {
          seq.ends.push_back(static_cast<std::int32_t>(get_le(b, at.doc_end + 4 * k, 4)));
        }
        real_tokens += seq.ends.back();
        Row got(T);
        d->read_row(index++, got.view());
        const Row want = expected_row(seq, pad);
        CHECK(got.inputs == want.inputs);
        CHECK(got.targets == want.targets);
        CHECK(got.positions == want.positions);
        CHECK(got.doc_start == want.doc_start);
        CHECK(row_rule_broken(got, seq.mask, seq.ends.back()).empty());
        for (const std::int32_t t : got.targets) loss_tokens += t >= 0;
      }
    }
    CHECK(index == d->num_samples());
    // The summary counts mask ones that are not a document's first token: exactly the targets.
    CHECK(loss_tokens == s.at("loss_tokens").get<std::int64_t>());
    CHECK(real_tokens == s.at("tokens").get<std::int64_t>());
  }
  CHECK_THROWS_WITH(open_dataset(out, T),
                    Contains(out +
                             ": a directory without sft_*.bin shards (prepare-sft's output: "
                             "give " +
                             out + "/train or " + out + "/val)"));
}

#ifdef ZRT_DATA_TOOL
// zrt-data --inspect on prepare-sft's output directories: the totals its summary gives.
TEST_CASE("zrt-data --inspect reads SFT shards to their summary's totals") {
  const std::string out = ZRT_SFT_FIXTURE;
  const nlohmann::json summary = nlohmann::json::parse(read_bytes(out + "/summary.json"));
  for (const std::string split : {"train", "val"}) {
    INFO(split);
    const nlohmann::json& s = summary.at(split);
    const std::string cmd = std::string(ZRT_DATA_TOOL) + " --inspect " + out + "/" + split;
    FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string text;
    char buf[512];
    while (fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
    CHECK(pclose(pipe) == 0);
    INFO(text);
    CHECK_THAT(text, Contains(fmt::format(
                         "zrt-data: {} SFT shard(s), {} sequences, {} documents, {} tokens, {} "
                         "loss tokens",
                         s.at("shards").size(), s.at("sequences").get<std::int64_t>(),
                         s.at("documents").get<std::int64_t>(), s.at("tokens").get<std::int64_t>(),
                         s.at("loss_tokens").get<std::int64_t>())));
  }
}
#endif
#endif
