// Local reduction of N rank-ordered blocks, used by the MPI backend's reduce-scatter and
// all-reduce: out[i] = op(block_0[i], ..., block_{N-1}[i]) computed in fp32 (for 16-bit floats
// too), strictly in rank order, so the result is identical on every rank and every run.
// Vectorized for AVX-512 / AVX2 with runtime dispatch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/comm/process_group.h"

namespace zrt {

// blocks: nblocks blocks of `count` elements, block r at blocks + r*stride elements.
// op: kSum or kAvg (divides the fp32 sum by nblocks before rounding).
void reduce_blocks(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                   DType dtype, ReduceOp op, void* out);

}  // namespace zrt
