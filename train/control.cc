#include "train/control.h"

#include "runtime/common/error.h"

namespace zrt::train {

Control::Control(Device& device, ProcessGroup& group) : device_(device), group_(group) {
  scratch_ = device.allocate(kMaxValues * 8, MemCategory::kWorkspace, "control scratch");
}

double Control::mean(double value) {
  return mean(std::vector<float>{static_cast<float>(value)})[0];
}

std::vector<float> Control::mean(std::vector<float> values) {
  ZRT_CHECK(values.size() <= kMaxValues, "too many values");
  const std::size_t bytes = values.size() * 4;
  device_.copy_to_device(scratch_.device<std::byte>(), values.data(), bytes, group_.stream());
  group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(),
                    static_cast<std::int64_t>(values.size()), DType::kFloat32, ReduceOp::kAvg);
  device_.copy_to_host(values.data(), scratch_.device<std::byte>(), bytes, group_.stream());
  group_.stream().synchronize();
  return values;
}

std::vector<std::int64_t> Control::max(std::vector<std::int64_t> values) {
  ZRT_CHECK(values.size() <= kMaxValues, "too many values");
  const std::size_t bytes = values.size() * 8;
  device_.copy_to_device(scratch_.device<std::byte>(), values.data(), bytes, group_.stream());
  group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(),
                    static_cast<std::int64_t>(values.size()), DType::kInt64, ReduceOp::kMax);
  device_.copy_to_host(values.data(), scratch_.device<std::byte>(), bytes, group_.stream());
  group_.stream().synchronize();
  return values;
}

std::int64_t Control::sum(std::int64_t value) {
  device_.copy_to_device(scratch_.device<std::byte>(), &value, 8, group_.stream());
  group_.all_reduce(scratch_.device<std::byte>(), scratch_.device<std::byte>(), 1, DType::kInt64,
                    ReduceOp::kSum);
  device_.copy_to_host(&value, scratch_.device<std::byte>(), 8, group_.stream());
  group_.stream().synchronize();
  return value;
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
