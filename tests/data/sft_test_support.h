// What the SFT data tests share (beside data_test_support.h's scratch directory): a small writer
// of zrt SFT shards written from docs/fine-tuning.md (not from the reader), byte patching, and the
// rules every row must keep, checked independently of how sft_row builds it.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/data/sample_source.h"
#include "tests/data/data_test_support.h"

namespace zrt::test {

namespace fs = std::filesystem;

// Little-endian stores and loads of `bytes` at byte offset `at`.
inline void put_le(std::vector<std::uint8_t>& bytes, std::size_t at, std::uint64_t v, int width) {
  REQUIRE(at + static_cast<std::size_t>(width) <= bytes.size());
  for (int i = 0; i < width; ++i) bytes[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint64_t get_le(const std::vector<std::uint8_t>& bytes, std::size_t at, int width) {
  std::uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(bytes[at + i]) << (8 * i);
  return v;
}

// One packed sequence as the format describes it: T tokens, T mask bytes and the exclusive ends
// of its documents.
struct Sequence {
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> ends;
};

// A shard's content and header values.
struct SftContent {
  int T = 0;
  std::int32_t vocab = 0;
  std::uint32_t pad = 0;
  std::vector<Sequence> sequences;

  std::int64_t num_documents() const {
    std::int64_t d = 0;
    for (const Sequence& s : sequences) d += static_cast<std::int64_t>(s.ends.size());
    return d;
  }
};

// Byte offsets of the sections of a shard (docs/fine-tuning.md).
struct Sections {
  std::size_t tokens, mask, doc_ptr, doc_end, size;
};
inline Sections sections(std::size_t S, std::size_t T, std::size_t D) {
  Sections s{};
  s.tokens = 1024;
  s.mask = s.tokens + 4 * S * T;
  s.doc_ptr = s.mask + S * T;
  s.doc_end = s.doc_ptr + 8 * (S + 1);
  s.size = s.doc_end + 4 * D;
  return s;
}
inline Sections sections(const SftContent& c) {
  return sections(c.sequences.size(), static_cast<std::size_t>(c.T),
                  static_cast<std::size_t>(c.num_documents()));
}

// The bytes of a shard holding `c`, exactly as the format says.
inline std::vector<std::uint8_t> sft_bytes(const SftContent& c) {
  const std::size_t S = c.sequences.size(), T = static_cast<std::size_t>(c.T);
  const Sections at = sections(c);
  std::vector<std::uint8_t> b(at.size, 0);
  const std::int64_t header[8] = {
      20251201, 1, static_cast<std::int64_t>(S), c.T, c.num_documents(), 4, c.vocab, c.pad};
  for (int i = 0; i < 8; ++i)
    put_le(b, 4 * static_cast<std::size_t>(i), static_cast<std::uint64_t>(header[i]), 4);
  std::int64_t docs = 0;
  for (std::size_t s = 0; s < S; ++s) {
    const Sequence& q = c.sequences[s];
    REQUIRE(q.tokens.size() == T);
    REQUIRE(q.mask.size() == T);
    for (std::size_t t = 0; t < T; ++t) {
      put_le(b, at.tokens + 4 * (s * T + t), q.tokens[t], 4);
      b[at.mask + s * T + t] = q.mask[t];
    }
    put_le(b, at.doc_ptr + 8 * s, static_cast<std::uint64_t>(docs), 8);
    for (const std::int32_t e : q.ends) {
      put_le(b, at.doc_end + 4 * static_cast<std::size_t>(docs), static_cast<std::uint32_t>(e), 4);
      ++docs;
    }
  }
  put_le(b, at.doc_ptr + 8 * S, static_cast<std::uint64_t>(docs), 8);
  return b;
}

// A sequence of T tokens holding documents of the given lengths, then padding. Token t of the
// sequence is `base` + t (so every token names its place); the mask is 1 on document tokens
// except every third (t % 3 == 1), and 0 on padding.
inline Sequence make_sequence(int T, const std::vector<int>& lengths, std::uint32_t base,
                              std::uint32_t pad) {
  Sequence q;
  int end = 0;
  for (const int n : lengths) {
    end += n;
    q.ends.push_back(end);
  }
  REQUIRE(end <= T);
  for (int t = 0; t < T; ++t) {
    q.tokens.push_back(t < end ? base + static_cast<std::uint32_t>(t) : pad);
    q.mask.push_back(t < end && t % 3 != 1 ? 1 : 0);
  }
  return q;
}

// One row read back (T positions).
struct Row {
  std::vector<std::int32_t> inputs, targets, positions, doc_start;
  explicit Row(int T)
      : inputs(static_cast<std::size_t>(T)),
        targets(static_cast<std::size_t>(T)),
        positions(static_cast<std::size_t>(T)),
        doc_start(static_cast<std::size_t>(T)) {}
  SampleRow view() { return {inputs.data(), targets.data(), positions.data(), doc_start.data()}; }
};

// The row a sequence must give, computed from the format's words directly (docs/fine-tuning.md,
// "How zrt-train reads it"), one position at a time with no state carried between positions.
inline Row expected_row(const Sequence& q, std::uint32_t pad) {
  const int T = static_cast<int>(q.tokens.size());
  Row r(T);
  const int last = q.ends.back();
  for (int t = 0; t < T; ++t) {
    int start = last, end = T;  // padding: a trailing document
    int begin = 0;
    for (const int e : q.ends) {
      if (t < e) {
        start = begin;
        end = e;
        break;
      }
      begin = e;
    }
    const bool padding = t >= last;
    r.inputs[t] = padding ? static_cast<std::int32_t>(pad) : static_cast<std::int32_t>(q.tokens[t]);
    r.targets[t] = !padding && t + 1 < end && q.mask[t + 1] == 1
                       ? static_cast<std::int32_t>(q.tokens[t + 1])
                       : -1;
    r.doc_start[t] = start;
    r.positions[t] = t - start;
  }
  return r;
}

// The rules every row keeps, whatever built it: "" or the first broken one. `mask` is the
// sequence's mask, `last_end` where its documents end (T for a row without padding).
inline std::string row_rule_broken(const Row& r, const std::vector<std::uint8_t>& mask,
                                   int last_end) {
  const int T = static_cast<int>(r.inputs.size());
  for (int t = 0; t < T; ++t) {
    const std::string at = " at t = " + std::to_string(t);
    if (r.doc_start[t] < 0 || r.doc_start[t] > t) return "doc_start outside [0, t]" + at;
    if (r.positions[t] != t - r.doc_start[t]) return "position is not t - doc_start" + at;
    if (t > 0 && r.doc_start[t] != r.doc_start[t - 1] && r.doc_start[t] != t) {
      return "a document starts somewhere else than where it changes" + at;
    }
    if (t >= last_end && r.doc_start[t] < last_end) return "padding attends to a document" + at;
    if (r.targets[t] < -1) return "a target below -1" + at;
    if (r.targets[t] >= 0) {
      if (t + 1 >= T) return "the last position has a target";
      if (r.doc_start[t + 1] != r.doc_start[t]) return "a target across a document boundary" + at;
      if (t + 1 >= last_end) return "padding is a target" + at;
      if (mask[static_cast<std::size_t>(t) + 1] != 1) return "a masked-out token is a target" + at;
      if (r.targets[t] != r.inputs[t + 1]) return "a target is not the next input" + at;
    }
  }
  return "";
}

}  // namespace zrt::test
