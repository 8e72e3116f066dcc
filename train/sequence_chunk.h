// Under Ulysses sequence parallelism (sequence_parallel_size sp) a rank reads the sequences of its
// data-parallel rank and trains on one chunk of each: the sp ranks of a group (consecutive world
// ranks, ParallelDims) read the same rows, and group rank j keeps tokens [j*T/sp, (j+1)*T/sp) of
// every row. The targets are the whole row's, so a chunk's last target is the next chunk's first
// input; positions are the chunk's global ones (the rotary angles), and the attention's
// document starts stay the whole row's (documents crossing a chunk boundary attend across it).
// Pure functions and a value type; thread-safe.
#pragma once

#include <cstdint>

#include "runtime/comm/parallel_dims.h"
#include "runtime/data/sample_source.h"

namespace zrt::train {

struct DataShare {
  int dp_rank = 0, dp_size = 1;  // which rows: the data stream's rank and world
  int sp_rank = 0, sp_size = 1;  // which chunk of them
  // World rank `rank`'s share of the layout `dims`.
  static DataShare of(const ParallelDims& dims, int rank);
  bool chunked() const { return sp_size > 1; }
  // The chunk's length and first position in rows of T tokens (T when not chunked).
  int chunk_length(int T) const { return T / sp_size; }
  int chunk_offset(int T) const { return sp_rank * chunk_length(T); }
};

// The loss tokens (targets >= 0) of `share`'s chunk of `rows` (all of them when not chunked).
std::int64_t chunk_loss_tokens(const HostBatch& rows, const DataShare& share);

}  // namespace zrt::train
