// CUDA twin of reduce_blocks (reduce_kernels.h), used by the NCCL backend's reduce-scatter and
// all-reduce: out[i] = op(block_0[i], ..., block_{N-1}[i]) accumulated in fp32 (for 16-bit
// floats too), strictly in rank order, then rounded to nearest even, so the result is
// bit-identical to the CPU backend's. (NaN results stay NaN; only their payload bits may differ,
// as x86 and CUDA propagate NaN payloads differently.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/comm/process_group.h"

namespace zrt {

// Same arguments as reduce_blocks, but `blocks` and `out` are device pointers and the reduction
// is enqueued on `stream` (asynchronous; the launch is checked). blocks: nblocks blocks of
// `count` elements, block r at blocks + r*stride elements. op: kSum or kAvg on floats (avg
// divides the fp32 sum by nblocks before rounding); kSum or kMax on integers. `out` may be one
// of the blocks (each element is read before it is written) but must not otherwise overlap them.
void cuda_reduce_blocks(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                        DType dtype, ReduceOp op, void* out, cudaStream_t stream);

}  // namespace zrt
