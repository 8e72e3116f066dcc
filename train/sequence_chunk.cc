#include "train/sequence_chunk.h"

#include "runtime/common/error.h"

namespace zrt::train {

DataShare DataShare::of(const ParallelDims& dims, int rank) {
  const int sp = dims.sequence_parallel_size;
  ZRT_CHECK(sp >= 1 && dims.world % sp == 0 && rank >= 0 && rank < dims.world,
            "rank {} of a world of {} at sequence_parallel_size {}", rank, dims.world, sp);
  // The sp blocks are consecutive ranks (ParallelDims::sequence_parallel_plan).
  return DataShare{rank / sp, dims.world / sp, rank % sp, sp};
}

std::int64_t chunk_loss_tokens(const HostBatch& rows, const DataShare& share) {
  if (!share.chunked()) return rows.loss_tokens;
  const int T = rows.seq_len;
  const int Tl = share.chunk_length(T), first = share.chunk_offset(T);
  std::int64_t n = 0;
  for (int b = 0; b < rows.batch; ++b) {
    const std::size_t row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
    for (int t = first; t < first + Tl; ++t) {
      n += rows.targets[row + static_cast<std::size_t>(t)] >= 0 ? 1 : 0;
    }
  }
  return n;
}

}  // namespace zrt::train
