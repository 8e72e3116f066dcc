// The longest sequence a model trains at within a memory budget (zrt-mem --max-seq-len): the
// question long-context users ask before anything else. For one setting, the largest multiple
// of `multiple` tokens T whose exact estimate at (B, T) (memory_estimate.h: the model rebuilt at
// seq_len T, so a GPT's position table grows with it) fits the device capacity per rank and, when
// given, the host capacity per node; and what stops T + multiple (the device, the host, or the
// model's own limit such as Llama's max_position_embeddings).
//
// The search doubles T while it fits, then bisects between the last fit and the first miss,
// which needs a footprint that grows with T. The estimate's does, but where an automatic switch
// turns on as T grows: the tiles of model.tiling (the MLP's footprint drops where its tiles
// start) and, on a GPU, zrt's attention kernels taking over from cuDNN's (whose workspace grows
// with T^2 up to its limit, then is none). Each switch stays on once on, so the search finds
// where each turns on, searches every stretch between them on its own, and answers the longest
// length found fitting.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/model_registry.h"
#include "tools/mem/memory_estimate.h"

namespace zrt::mem {

struct SequenceFit {
  int seq_len = 0;    // the longest that fits; 0 when not even `multiple` tokens do
  Estimate estimate;  // at seq_len (when > 0)
  // Why seq_len + multiple does not: "device", "host", or the model's refusal (its message).
  std::string limit;
};

// `in` gives everything but the model's length (world, micro-batch, dtypes, engine options,
// activation checkpointing); host_capacity_bytes 0: no host limit. Throws InvalidArgument for
// multiple < 1.
SequenceFit longest_sequence(const ModelDef& model, Inputs in, const Setting& setting,
                             std::int64_t device_capacity_bytes, std::int64_t host_capacity_bytes,
                             int multiple);

}  // namespace zrt::mem
