// Control: the trainer's small collectives (means, maxima, sums of a few host values) over the
// control group, which has its own communicator and stream, so they never queue behind the
// engine's collectives; and host reads of device floats. Each call is collective over the
// group and waits for its result; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"

namespace zrt::train {

class Control {
 public:
  // At most this many values per call (the scratch buffer's size).
  static constexpr std::size_t kMaxValues = 64;

  Control(Device& device, ProcessGroup& group);

  // `value`'s float32 average over the ranks.
  double mean(double value);
  // Element-wise float32 averages of `values` over the ranks, in one all-reduce.
  std::vector<float> mean(std::vector<float> values);
  // Element-wise maxima over the ranks, in one all-reduce.
  std::vector<std::int64_t> max(std::vector<std::int64_t> values);
  // The sum over the ranks.
  std::int64_t sum(std::int64_t value);
  // Element-wise sums over the ranks, any number of values (one all-reduce per kMaxValues).
  std::vector<std::int64_t> sum(std::vector<std::int64_t> values);

 private:
  // values (count elements of dtype, host memory) = op over the ranks, through the scratch
  // buffer; a host wait.
  void all_reduce(void* values, std::size_t count, DType dtype, ReduceOp op);

  Device& device_;
  ProcessGroup& group_;
  Buffer scratch_;
};

// n floats from the device, once the stream has reached the copy (a host wait).
std::vector<float> read_floats(Device& device, Stream& stream, DevicePtr<const float> p,
                               std::size_t n);
float read_float(Device& device, Stream& stream, DevicePtr<const float> p);

}  // namespace zrt::train
