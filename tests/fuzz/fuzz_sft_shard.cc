// libFuzzer target for the zrt SFT shard reader (clang only; see tests/fuzz/CMakeLists.txt):
//   build-fuzz/tests/fuzz/fuzz_sft_shard scratch/ tests/fuzz/corpus/sft_shard -max_len=4096
// Each input is read twice: as a whole shard, and as the sections of a small shard whose header
// is made to fit (the first bytes pick S, T, D, the vocabulary and the pad id; the rest are the
// tokens, mask bytes, doc_ptr and doc_end, one byte each), so the document and mask checks are
// reached without the fuzzer having to guess a matching file size. Whatever opens must read
// into rows that keep the rules of docs/fine-tuning.md; anything else must be a DataError.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/data/sft_shard.h"

namespace {

void put_le(std::vector<std::uint8_t>& b, std::size_t at, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i)
    b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}

// The rules of a row built from a sequence with this mask whose documents end at `last_end`.
void check_row(const std::vector<std::int32_t>& in, const std::vector<std::int32_t>& tg,
               const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& start,
               const std::vector<std::uint8_t>& mask, int last_end, std::int64_t vocab,
               std::uint32_t pad) {
  const int T = static_cast<int>(in.size());
  for (int t = 0; t < T; ++t) {
    const auto i = static_cast<std::size_t>(t);
    if (start[i] < 0 || start[i] > t || pos[i] != t - start[i]) __builtin_trap();
    if (t > 0 && start[i] != start[i - 1] && start[i] != t) __builtin_trap();
    if (t >= last_end && (start[i] != last_end || in[i] != static_cast<std::int32_t>(pad))) {
      __builtin_trap();
    }
    if (in[i] < 0 || in[i] >= vocab) __builtin_trap();
    if (tg[i] < -1) __builtin_trap();
    const bool same_doc = t + 1 < last_end && start[i + 1] == start[i];
    // A target exactly where the next token is in the same document and in the loss.
    const bool want = t + 1 < T && same_doc && mask[i + 1] == 1;
    if (want != (tg[i] >= 0)) __builtin_trap();
    if (want && tg[i] != in[i + 1]) __builtin_trap();
  }
}

void read_all(const std::uint8_t* data, std::size_t size) {
  try {
    const zrt::SftShard shard("input", data, size);
    const zrt::SftHeader& h = shard.header();
    if (!h.ok() || h.num_sequences < 1 || h.seq_len < 1 || h.num_documents < h.num_sequences) {
      __builtin_trap();
    }
    const auto T = static_cast<std::size_t>(h.seq_len);
    std::vector<std::uint32_t> tokens(T);
    std::vector<std::uint8_t> mask(T);
    std::vector<std::int32_t> in(T), tg(T), pos(T), start(T);
    for (std::int64_t s = 0; s < shard.num_sequences(); ++s) {
      const std::int64_t n = shard.num_documents(s);
      if (n < 1) __builtin_trap();
      const int last_end = shard.document_ends(s)[n - 1];
      if (last_end < 1 || last_end > h.seq_len) __builtin_trap();
      try {
        shard.read_sequence(s, tokens.data(), mask.data());
        shard.read_row(s, {in.data(), tg.data(), pos.data(), start.data()});
      } catch (const zrt::DataError&) {
        continue;  // a bad token or padding: refused when the sequence is read
      }
      check_row(in, tg, pos, start, mask, last_end, h.vocab_size, h.pad_id);
    }
  } catch (const zrt::DataError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  read_all(data, size);
  if (size < 5) return 0;
  // A small shard around the input's bytes.
  const std::int64_t S = 1 + data[0] % 4, T = 1 + data[1] % 16, D = S + data[2] % 8;
  const std::int64_t vocab = 1 + data[3];
  const std::int64_t pad = data[4] % vocab;
  zrt::SftLayout at;
  if (!zrt::sft_layout(S, T, D, &at)) __builtin_trap();
  std::vector<std::uint8_t> b(at.file_bytes, 0);
  const std::int64_t header[8] = {
      zrt::kSftShardMagic, zrt::kSftShardVersion, S, T, D, 4, vocab, pad};
  for (int i = 0; i < 8; ++i)
    put_le(b, 4 * static_cast<std::size_t>(i), static_cast<std::uint64_t>(header[i]), 4);
  std::size_t next = 5;
  auto byte = [&]() -> std::uint8_t { return next < size ? data[next++] : 0; };
  for (std::int64_t i = 0; i < S * T; ++i)
    put_le(b, at.tokens + 4 * static_cast<std::size_t>(i), byte(), 4);
  for (std::int64_t i = 0; i < S * T; ++i) b[at.mask + static_cast<std::size_t>(i)] = byte();
  for (std::int64_t i = 0; i <= S; ++i) {
    put_le(b, at.doc_ptr + 8 * static_cast<std::size_t>(i),
           static_cast<std::uint64_t>(static_cast<std::int8_t>(byte())), 8);
  }
  for (std::int64_t i = 0; i < D; ++i) {
    put_le(b, at.doc_end + 4 * static_cast<std::size_t>(i),
           static_cast<std::uint32_t>(static_cast<std::int8_t>(byte())), 4);
  }
  read_all(b.data(), b.size());
  return 0;
}
