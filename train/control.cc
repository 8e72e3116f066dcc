#include "train/control.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt::train {

Control::Control(Device& device, ProcessGroup& group) : device_(device), group_(group) {
  scratch_ = device.allocate(kMaxValues * 8, MemCategory::kWorkspace, "control scratch");
}

double Control::mean(double value) {
  return mean(std::vector<float>{static_cast<float>(value)})[0];
}

void Control::all_reduce(void* values, std::size_t count, DType dtype, ReduceOp op) {
  ZRT_CHECK(count <= kMaxValues, "too many values");
  const std::size_t bytes = count * dtype_size(dtype);
  DrainOnUnwind drain(group_.stream());  // the copies read and write `values` on the stream
  device_.copy_to_device(scratch_.device<std::byte>(), values, bytes, group_.stream());
  group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(),
                    static_cast<std::int64_t>(count), dtype, op);
  device_.copy_to_host(values, scratch_.device<std::byte>(), bytes, group_.stream());
  group_.stream().synchronize();
}

std::vector<float> Control::mean(std::vector<float> values) {
  all_reduce(values.data(), values.size(), DType::kFloat32, ReduceOp::kAvg);
  return values;
}

std::vector<std::int64_t> Control::max(std::vector<std::int64_t> values) {
  all_reduce(values.data(), values.size(), DType::kInt64, ReduceOp::kMax);
  return values;
}

std::int64_t Control::sum(std::int64_t value) {
  all_reduce(&value, 1, DType::kInt64, ReduceOp::kSum);
  return value;
}

std::vector<std::int64_t> Control::sum(std::vector<std::int64_t> values) {
  for (std::size_t first = 0; first < values.size(); first += kMaxValues) {
    const std::size_t count = std::min(kMaxValues, values.size() - first);
    all_reduce(values.data() + first, count, DType::kInt64, ReduceOp::kSum);
  }
  return values;
}

std::vector<float> read_floats(Device& device, Stream& stream, DevicePtr<const float> p,
                               std::size_t n) {
  std::vector<float> v(n);
  device.copy_to_host(v.data(), p.as<const std::byte>(), 4 * n, stream);
  stream.synchronize();
  return v;
}

float read_float(Device& device, Stream& stream, DevicePtr<const float> p) {
  return read_floats(device, stream, p, 1)[0];
}

}  // namespace zrt::train
