// Peak arithmetic throughput of the devices zrt runs on, for model FLOPs utilisation (MFU).
// GPUs from the vendors' dense (no sparsity) tensor-core figures; CPUs from their vector width
// and clock (cores x GHz x FLOPs per cycle), read from the running machine.
#pragma once

#include <string>

#include "runtime/common/dtype.h"
#include "runtime/device/device.h"

namespace zrt::train {

struct DevicePeak {
  double flops_per_s = 0.0;  // 0: unknown (MFU not reported)
  std::string source;        // how it was obtained, for the log
};

// The peak of one rank: a GPU, or this node's CPU cores divided among its local ranks.
DevicePeak device_peak(const Device& device, DType compute_dtype, int local_ranks);

}  // namespace zrt::train
