// One sample interface for both kinds of data (runtime/data/sample_source.h, open_dataset.h,
// data_stream.h): the factory tells llm.c and SFT shards apart and refuses a mix; HostBatch rows
// from the stream equal the old pointer interface bit for bit on plain windows; document masking
// on llm.c windows (Llama 3's intra-document masking); and the stream's position, shuffling and
// resume at another world size over packed SFT sequences.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/data_stream.h"
#include "runtime/data/open_dataset.h"
#include "runtime/data/sft_dataset.h"
#include "runtime/data/token_dataset.h"
#include "runtime/data/token_shard.h"
#include "tests/data/sft_test_support.h"

using namespace zrt;
using namespace zrt::test;
using Catch::Matchers::Contains;

namespace {

constexpr std::uint16_t kSep = 50256;

// An SFT shard of `n` sequences of T = 6 whose tokens name them: sequence `first + i` holds
// tokens 10*(first+i) + t (documents of 2 and 3, then padding).
SftContent numbered(int first, int n) {
  SftContent c;
  c.T = 6;
  c.vocab = 100000;
  c.pad = 0;
  for (int i = 0; i < n; ++i) {
    c.sequences.push_back(
        make_sequence(6, {2, 3}, static_cast<std::uint32_t>(10 * (first + i)), 0));
  }
  return c;
}

// The sequence a row came from (numbered()'s tokens).
int sequence_of(const HostBatch& b, int row) {
  return b.inputs[static_cast<std::size_t>(row) * static_cast<std::size_t>(b.seq_len)] / 10;
}

}  // namespace

TEST_CASE("open_dataset: llm.c shards, SFT shards or a directory, told apart by the magic") {
  TempDir dir;
  std::vector<std::uint16_t> tokens(100);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i);
  write_shard(dir / "llmc_000.bin", tokens.data(), tokens.size());
  write_shard(dir / "llmc_001.bin", tokens.data(), tokens.size());
  fs::create_directory(dir / "sft");
  write_bytes(dir / "sft/sft_000000.bin", sft_bytes(numbered(0, 3)));
  write_bytes(dir / "sft/sft_000001.bin", sft_bytes(numbered(3, 2)));

  SECTION("each kind") {
    std::unique_ptr<SampleSource> llmc = open_dataset(dir / "llmc_*.bin", 8);
    REQUIRE(dynamic_cast<TokenDataset*>(llmc.get()) != nullptr);
    CHECK(llmc->num_samples() == 2 * 12);
    CHECK_FALSE(llmc->documents());
    std::unique_ptr<SampleSource> sft = open_dataset(dir / "sft", 6);
    REQUIRE(dynamic_cast<SftDataset*>(sft.get()) != nullptr);
    CHECK(sft->num_samples() == 5);
    CHECK(sft->documents());
    CHECK(sft->pattern() == dir / "sft");
    CHECK(llmc->describe() == "24 windows of 9 tokens in 2 llm.c shard(s)");
    CHECK(sft->describe() == "5 packed sequences of 6 tokens (10 documents) in 2 SFT shard(s)");
    CHECK(open_dataset(dir / "sft/sft_*.bin", 6)->num_samples() == 5);
    CHECK(expand_data_path(dir / "sft") ==
          std::vector<std::string>{dir / "sft/sft_000000.bin", dir / "sft/sft_000001.bin"});
    CHECK(data_file_kind(dir / "llmc_000.bin") == DataFileKind::kTokenShard);
    CHECK(data_file_kind(dir / "sft/sft_000000.bin") == DataFileKind::kSftShard);
  }
  SECTION("a mix of kinds names a file of each") {
    write_shard(dir / "sft/sft_000002.bin", tokens.data(), tokens.size());
    CHECK_THROWS_WITH(
        open_dataset(dir / "sft", 6),
        Contains(dir / "sft/sft_000000.bin: a zrt SFT shard and ") &&
            Contains(dir / "sft/sft_000002.bin: an llm.c token shard in one data set"));
  }
  SECTION("neither kind, nothing there, options that do not fit") {
    write_bytes(dir / "notes.txt", {'h', 'e', 'l', 'l', 'o', '\n'});
    CHECK_THROWS_WITH(open_dataset(dir / "notes.txt", 6),
                      Contains(dir / "notes.txt: neither an llm.c token shard") &&
                          Contains("nor a zrt SFT shard (magic 20251201)") &&
                          Contains("convert it with zrt-data"));
    CHECK_THROWS_WITH(open_dataset(dir / "nothing_*.bin", 6),
                      Contains("no file matches '" + (dir / "nothing_*.bin") + "'"));
    fs::create_directory(dir / "empty");
    CHECK_THROWS_WITH(open_dataset(dir / "empty", 6),
                      Contains(dir / "empty: a directory without sft_*.bin shards"));
    DatasetOptions grouped;
    grouped.group = 2;
    CHECK_THROWS_AS(open_dataset(dir / "sft", 6, grouped), InvalidArgument);
    CHECK(open_dataset(dir / "llmc_*.bin", 8, grouped)->group() == 2);
    CHECK_THROWS_WITH(open_dataset(dir / "sft", 8),
                      Contains(dir / "sft/sft_000000.bin: sequences of T = 6 tokens, but the "
                                     "model's sequence length is 8"));
  }
  SECTION("the options reach the dataset") {
    DatasetOptions small;
    small.vocab_size = 50;
    std::unique_ptr<SampleSource> llmc = open_dataset(dir / "llmc_*.bin", 8, small);
    Row row(8);
    CHECK_NOTHROW(llmc->read_row(0, row.view()));
    CHECK_THROWS_WITH(llmc->read_row(6, row.view()),
                      Contains(dir / "llmc_000.bin: token 50 at index 50"));
    CHECK_THROWS_WITH(open_dataset(dir / "sft", 6, small),
                      Contains(dir / "sft/sft_000000.bin: tokenized for a vocabulary of 100000"));
    DatasetOptions masked;
    masked.document_mask = true;
    std::unique_ptr<SampleSource> m = open_dataset(dir / "llmc_*.bin", 8, masked);
    CHECK(m->documents());
    CHECK(dynamic_cast<TokenDataset&>(*m).document_separator() == kGpt2DocumentSeparator);
    CHECK_THAT(m->describe(), Contains(", documents split at token 50256"));
    masked.document_separator = 7;
    CHECK(dynamic_cast<TokenDataset&>(*open_dataset(dir / "llmc_*.bin", 8, masked))
              .document_separator() == 7u);
  }
}

TEST_CASE("HostBatch rows of plain windows are the pointer interface's, bit for bit") {
  TempDir dir;
  std::vector<std::uint32_t> tokens(500);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::uint32_t>((i * 7919) % 70000);
  }
  write_shard(dir / "a.bin", tokens.data(), tokens.size());
  const TokenDataset d(dir / "a.bin", 16);
  CHECK_FALSE(d.documents());
  DataStreamOptions o;
  o.shuffle = true;
  o.seed = 3;
  DataStream old_api(d, o), new_api(d, o);
  HostBatch batch;
  // A batch that held documents before: its positions must not survive.
  batch.positions.assign(5, 1);
  batch.doc_start.assign(5, 1);
  for (int k = 0; k < 6; ++k) {
    std::vector<std::int32_t> in(3 * 16), tg(3 * 16);
    old_api.next_micro_batch(1, 2, 3, in.data(), tg.data());
    new_api.next_micro_batch(1, 2, 3, batch);
    CHECK(batch.inputs == in);
    CHECK(batch.targets == tg);
    CHECK(batch.batch == 3);
    CHECK(batch.seq_len == 16);
    CHECK_FALSE(batch.documents);
    CHECK(batch.positions.empty());
    CHECK(batch.doc_start.empty());
    CHECK(batch.loss_tokens == 3 * 16);
  }
  CHECK(old_api.position() == new_api.position());
  // And both are the window's tokens: inputs 0..T-1, targets 1..T.
  HostBatch first;
  DataStream plain(d);
  plain.fill(0, 1, first);
  for (int t = 0; t < 16; ++t) {
    CHECK(first.inputs[static_cast<std::size_t>(t)] == static_cast<std::int32_t>(tokens[t]));
    CHECK(first.targets[static_cast<std::size_t>(t)] == static_cast<std::int32_t>(tokens[t + 1]));
  }
}

TEST_CASE("document masking on llm.c windows: separators start documents, never targets") {
  TempDir dir;
  // Three windows of T = 8: separators inside, one as the last target, one as the first input.
  const std::vector<std::uint16_t> w0 = {5, 6, kSep, 7, 8, kSep, kSep, 9, 10};
  const std::vector<std::uint16_t> w1 = {10, 11, 12, 13, 14, 15, 16, 17, kSep};
  const std::vector<std::uint16_t> w2 = {kSep, 20, 21, 22, 23, 24, 25, 26, 27};
  std::vector<std::uint16_t> tokens = w0;
  tokens.insert(tokens.end(), w1.begin() + 1, w1.end());
  tokens.insert(tokens.end(), w2.begin() + 1, w2.end());
  write_shard(dir / "gpt2.bin", tokens.data(), tokens.size());

  TokenDataset plain(dir / "gpt2.bin", 8);
  TokenDataset masked(dir / "gpt2.bin", 8);
  masked.set_document_separator(kAutoDocumentSeparator);
  REQUIRE(masked.document_separator() == std::optional<std::uint32_t>(kGpt2DocumentSeparator));
  REQUIRE(masked.num_samples() == 3);
  HostBatch m, p;
  DataStream(masked).fill(0, 3, m);
  DataStream(plain).fill(0, 3, p);
  REQUIRE(m.documents);
  const auto row = [](const std::vector<std::int32_t>& v, int r) {
    return std::vector<std::int32_t>(v.begin() + 8 * r, v.begin() + 8 * r + 8);
  };
  const std::int32_t S = kSep;
  CHECK(m.inputs == p.inputs);
  CHECK(row(m.targets, 0) == std::vector<std::int32_t>{6, -1, 7, 8, -1, -1, 9, 10});
  CHECK(row(m.doc_start, 0) == std::vector<std::int32_t>{0, 0, 2, 2, 2, 5, 6, 6});
  CHECK(row(m.positions, 0) == std::vector<std::int32_t>{0, 1, 0, 1, 2, 0, 0, 1});
  // The last token predicts the next document's separator: not in the loss; one document.
  CHECK(row(m.targets, 1) == std::vector<std::int32_t>{11, 12, 13, 14, 15, 16, 17, -1});
  CHECK(row(m.doc_start, 1) == std::vector<std::int32_t>(8, 0));
  CHECK(row(m.positions, 1) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  // A window opening with its separator is one document: exactly the plain window.
  CHECK(row(m.inputs, 2)[0] == S);
  CHECK(row(m.targets, 2) == row(p.targets, 2));
  CHECK(row(m.doc_start, 2) == std::vector<std::int32_t>(8, 0));
  CHECK(m.loss_tokens == 24 - 4);
  // The old interface cannot carry the documents.
  std::vector<std::int32_t> in(8), tg(8);
  CHECK_THROWS_AS(DataStream(masked).fill(0, 1, in.data(), tg.data()), InvalidArgument);

  // Llama-3 style shards: <|begin_of_text|>, 128000.
  const std::vector<std::uint32_t> wide = {1, kLlama3DocumentSeparator, 2, 3, 4};
  write_shard(dir / "llama3.bin", wide.data(), wide.size());
  TokenDataset l3(dir / "llama3.bin", 4);
  l3.set_document_separator(kAutoDocumentSeparator);
  CHECK(l3.document_separator() == std::optional<std::uint32_t>(kLlama3DocumentSeparator));
  HostBatch b;
  DataStream(l3).fill(0, 1, b);
  CHECK(b.targets == std::vector<std::int32_t>{-1, 2, 3, 4});
  CHECK(b.doc_start == std::vector<std::int32_t>{0, 1, 1, 1});
  CHECK(b.positions == std::vector<std::int32_t>{0, 0, 1, 2});
  // An explicit id; none of the widths' defaults.
  TokenDataset own(dir / "llama3.bin", 4);
  own.set_document_separator(3);
  DataStream(own).fill(0, 1, b);
  CHECK(b.targets == std::vector<std::int32_t>{128000, 2, -1, 4});
  CHECK(b.doc_start == std::vector<std::int32_t>{0, 0, 0, 3});
  CHECK_THROWS_AS(own.set_document_separator(-5), InvalidArgument);
  CHECK_THROWS_AS(own.set_document_separator(std::int64_t{1} << 31), InvalidArgument);
  // A separator the data cannot hold would split nothing (document masking silently off):
  // past the model's vocabulary, or past 16-bit shards' ids.
  TokenDataset byte_level(dir / "llama3.bin", 4);
  byte_level.set_vocab_size(256);
  CHECK_THROWS_WITH(byte_level.set_document_separator(kAutoDocumentSeparator),
                    Contains("data.document_separator 128000 can never occur in this data (the "
                             "model's vocabulary is 256 ids)"));
  CHECK_NOTHROW(byte_level.set_document_separator(255));
  TokenDataset narrow(dir / "gpt2.bin", 4);
  CHECK_THROWS_WITH(narrow.set_document_separator(70000),
                    Contains("data.document_separator 70000 can never occur in this data "
                             "(2-byte token ids)"));

  // "auto" over shards of two widths has no one answer.
  TokenDataset mixed(dir / "*.bin", 4);
  CHECK_THROWS_WITH(mixed.set_document_separator(kAutoDocumentSeparator),
                    Contains("needs shards of one token width") && Contains(dir / "gpt2.bin") &&
                        Contains(dir / "llama3.bin"));
}

TEST_CASE("SFT rows from the stream: HostBatch with documents, loss tokens counted") {
  TempDir dir;
  write_bytes(dir / "sft_000000.bin", sft_bytes(numbered(0, 4)));
  const SftDataset d(dir / "sft_000000.bin", 6);
  DataStream stream(d);
  HostBatch b;
  stream.next_micro_batch(0, 1, 2, b);
  CHECK(b.batch == 2);
  CHECK(b.seq_len == 6);
  REQUIRE(b.documents);
  // Each row: documents [0, 2) and [2, 5), padding [5, 6); tokens 10*i + t; mask 0 where t % 3
  // == 1. Targets: t=0 -> 1 is masked out, t=1 -> 2 crosses, t=2 -> 3, t=3 -> 4 is masked out.
  CHECK(std::vector<std::int32_t>(b.targets.begin(), b.targets.begin() + 6) ==
        std::vector<std::int32_t>{-1, -1, 3, -1, -1, -1});
  CHECK(std::vector<std::int32_t>(b.targets.begin() + 6, b.targets.end()) ==
        std::vector<std::int32_t>{-1, -1, 13, -1, -1, -1});
  CHECK(std::vector<std::int32_t>(b.positions.begin(), b.positions.begin() + 6) ==
        std::vector<std::int32_t>{0, 1, 0, 1, 2, 0});
  CHECK(std::vector<std::int32_t>(b.doc_start.begin(), b.doc_start.begin() + 6) ==
        std::vector<std::int32_t>{0, 0, 2, 2, 2, 5});
  CHECK(b.loss_tokens == 2);
  std::vector<std::int32_t> in(12), tg(12);
  CHECK_THROWS_WITH(stream.fill(0, 2, in.data(), tg.data()), Contains("read it into a HostBatch"));
}

TEST_CASE("a run over SFT data resumed at another world size continues the same sequences") {
  TempDir dir;
  write_bytes(dir / "sft_000000.bin", sft_bytes(numbered(0, 7)));
  write_bytes(dir / "sft_000001.bin", sft_bytes(numbered(7, 5)));
  const SftDataset d(dir.path().string(), 6);
  REQUIRE(d.num_samples() == 12);
  DataStreamOptions o;
  o.shuffle = true;
  o.seed = 11;

  // The stream itself: global sample i, read alone, over three epochs.
  const DataStream reference(d, o);
  std::vector<int> order;
  for (std::int64_t i = 0; i < 36; ++i) {
    HostBatch one;
    reference.fill(i, 1, one);
    order.push_back(sequence_of(one, 0));
    CHECK(order.back() == reference.window(i));
  }
  // Every epoch is a permutation of the 12 sequences, a different one each epoch.
  for (int e = 0; e < 3; ++e) {
    std::vector<int> epoch(order.begin() + 12 * e, order.begin() + 12 * e + 12);
    std::sort(epoch.begin(), epoch.end());
    for (int i = 0; i < 12; ++i) CHECK(epoch[static_cast<std::size_t>(i)] == i);
  }
  CHECK(std::vector<int>(order.begin(), order.begin() + 12) !=
        std::vector<int>(order.begin() + 12, order.begin() + 24));

  // 2 ranks, B = 2, three micro-batches: rank r's step k holds global samples (2k + r)*2 + b.
  std::vector<DataStream> two(2, DataStream(d, o));
  HostBatch b;
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < 2; ++r) {
      two[static_cast<std::size_t>(r)].next_micro_batch(r, 2, 2, b);
      for (int row = 0; row < 2; ++row) {
        CHECK(sequence_of(b, row) == order[static_cast<std::size_t>((2 * k + r) * 2 + row)]);
      }
    }
  }
  const DataStreamState saved = two[0].state();
  CHECK(saved.position == 12);
  CHECK(saved.num_samples == 12);
  CHECK(saved.group == 1);
  CHECK(saved.seq_len == 6);

  // Resumed at 3 ranks, B = 1 (a fresh stream without the options: the state carries them).
  std::vector<DataStream> three(3, DataStream(d));
  for (DataStream& s : three) s.restore(saved);
  for (int k = 0; k < 8; ++k) {
    for (int r = 0; r < 3; ++r) {
      three[static_cast<std::size_t>(r)].next_micro_batch(r, 3, 1, b);
      CHECK(sequence_of(b, 0) == order[static_cast<std::size_t>(12 + 3 * k + r)]);
    }
  }
  CHECK(three[0].position() == 36);
  CHECK(three[0].epoch() == 3);

  // Other data under the same indices is refused.
  write_bytes(dir / "sft_000001.bin", sft_bytes(numbered(7, 4)));
  const SftDataset fewer(dir.path().string(), 6);
  DataStream other(fewer);
  CHECK_THROWS_WITH(other.restore(saved), Contains("the sample indices would mean other data") &&
                                              Contains("a stream of 12 samples"));
}
