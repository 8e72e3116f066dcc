// The collectives' range arithmetic (runtime/comm/collective_plan.h): chunks cover a transfer
// exactly, in order, within the byte and int-count limits; the deterministic all-reduce's pieces
// cover the input and pad each to a whole number of equal slices.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <vector>

#include "runtime/comm/collective_plan.h"

using namespace zrt::collective_plan;

TEST_CASE("chunk_elements fits max_chunk_bytes across the parts, within the count limit") {
  // 32 MiB over 4 ranks of fp32: 2 Mi elements per rank.
  CHECK(chunk_elements(std::int64_t{32} << 20, 4, 4) == (std::int64_t{2} << 20));
  // Rounds down: 100 bytes over 3 parts of 8-byte elements -> 4 elements (96 bytes).
  CHECK(chunk_elements(100, 8, 3) == 4);
  // Never less than one element, even when one element exceeds the budget.
  CHECK(chunk_elements(3, 4, 2) == 1);
  CHECK(chunk_elements(0, 2, 8) == 1);
  // MPI's int counts cap a chunk however large the budget.
  CHECK(chunk_elements(std::int64_t{1} << 40, 2, 1, int_count_limit(2)) == INT_MAX / 2);
  CHECK(chunk_elements(std::int64_t{1} << 40, 1, 1, int_count_limit(1)) == INT_MAX);
  // Without a limit (NCCL's size_t counts) only the budget bounds it.
  CHECK(chunk_elements(std::int64_t{1} << 40, 2, 1) == (std::int64_t{1} << 39));
}

TEST_CASE("chunks cover a transfer exactly, in order, every one full but the last") {
  for (std::int64_t total : {0, 1, 7, 8, 9, 64, 1000}) {
    for (std::int64_t chunk : {1, 3, 8, 1000, 5000}) {
      std::vector<Range> seen;
      for_each_chunk(total, chunk, [&](Range r) { seen.push_back(r); });
      REQUIRE(static_cast<std::int64_t>(seen.size()) == chunk_count(total, chunk));
      std::int64_t next = 0;
      for (std::size_t k = 0; k < seen.size(); ++k) {
        CHECK(seen[k] == chunk_range(total, chunk, static_cast<std::int64_t>(k)));
        CHECK(seen[k].first == next);
        CHECK(seen[k].count > 0);
        if (k + 1 < seen.size()) CHECK(seen[k].count == chunk);
        CHECK(seen[k].count <= chunk);
        next += seen[k].count;
      }
      CHECK(next == total);
    }
  }
  CHECK(chunk_count(10, 4) == 3);
  CHECK(chunk_range(10, 4, 2) == Range{8, 2});
}

TEST_CASE("all-reduce pieces cover the input, padded to whole slices per rank") {
  for (int ranks : {1, 2, 3, 4, 7}) {
    for (std::int64_t count : {0, 1, 5, 6, 7, 100, 1001}) {
      for (std::int64_t chunk : {1, 2, 16, 4096}) {
        std::int64_t next = 0;
        int pieces = 0;
        for_each_all_reduce_piece(count, ranks, chunk, [&](const AllReducePiece& p) {
          ++pieces;
          CHECK(p.input.first == next);
          CHECK(p.input.count > 0);
          CHECK(p.input.count <= chunk * ranks);    // one chunk per rank at most
          CHECK(p.slice <= chunk);                  // scratch stays within the budget
          CHECK(p.padded(ranks) >= p.input.count);  // the slices hold the whole piece
          CHECK(p.padding(ranks) < ranks);          // ...with less than one element per rank spare
          CHECK(p.padded(ranks) == p.input.count + p.padding(ranks));
          next += p.input.count;
        });
        CHECK(next == count);
        CHECK(pieces == chunk_count(count, chunk * ranks));
      }
    }
  }
}

TEST_CASE("an all-reduce piece's layout, worked by hand") {
  // 10 elements over 4 ranks, chunks of 2 per rank: pieces of 8 and 2 elements.
  std::vector<AllReducePiece> pieces;
  for_each_all_reduce_piece(10, 4, 2, [&](const AllReducePiece& p) { pieces.push_back(p); });
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0] == AllReducePiece{{0, 8}, 2});
  CHECK(pieces[0].padding(4) == 0);
  // The last piece: 2 elements, one per slice for ranks 0 and 1, ranks 2 and 3 sum zeros.
  CHECK(pieces[1] == AllReducePiece{{8, 2}, 1});
  CHECK(pieces[1].padded(4) == 4);
  CHECK(pieces[1].padding(4) == 2);
}
