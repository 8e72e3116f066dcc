#include "runtime/engine/engine_parallel_dims.h"

namespace zrt {

ParallelDims parallel_dims(const EngineOptions& options, int world, int ranks_per_node) {
  ParallelDims dims;
  dims.world = world;
  dims.ranks_per_node = ranks_per_node;
  dims.stage = options.stage;
  dims.mics_shard_size = options.mics_shard_size;
  dims.hpz_partition_size = options.hpz_partition_size;
  dims.quantized_weights = options.quantized_weights;
  dims.quantized_gradients = options.quantized_gradients;
  dims.expert_parallel_size = options.expert_parallel_size;
  dims.data_before_expert_parallel = options.data_before_expert_parallel;
  dims.sequence_parallel_size = options.sequence_parallel_size;
  return dims;
}

}  // namespace zrt
