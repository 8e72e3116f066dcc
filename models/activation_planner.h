// ActivationPlanner: lays a model's activation tensors out in one allocation. Each field is
// given its byte size (rounded up to kActivationAlign) in order; total() is the allocation's
// size, and bind(base) points every field into it. Planning with no base computes the size
// alone, which is how the models' activation_bytes hooks count exactly what they allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/device/device_ptr.h"

namespace zrt {

constexpr std::int64_t kActivationAlign = 256;

inline std::int64_t round_up_activation(std::int64_t n) {
  return (n + kActivationAlign - 1) / kActivationAlign * kActivationAlign;
}

class ActivationPlanner {
 public:
  void bytes(DevicePtr<std::byte>* field, std::int64_t n) {
    byte_fields_.emplace_back(field, total_);
    total_ += round_up_activation(n);
  }
  void floats(DevicePtr<float>* field, std::int64_t count) {
    float_fields_.emplace_back(field, total_);
    total_ += round_up_activation(count * 4);
  }
  // `field` takes the bytes already planned for `planned`, adding none: for two tensors never
  // live at once.
  void alias(DevicePtr<std::byte>* field, const DevicePtr<std::byte>* planned) {
    for (const auto& [f, offset] : byte_fields_) {
      if (f == planned) {
        byte_fields_.emplace_back(field, offset);
        return;
      }
    }
    ZRT_THROW(Error, "ActivationPlanner::alias: the tensor to share was not planned");
  }
  std::int64_t total() const { return total_; }
  void bind(DevicePtr<std::byte> base) const {
    for (const auto& [field, offset] : byte_fields_) *field = base + offset;
    for (const auto& [field, offset] : float_fields_) *field = (base + offset).as<float>();
  }

 private:
  std::int64_t total_ = 0;
  std::vector<std::pair<DevicePtr<std::byte>*, std::int64_t>> byte_fields_;
  std::vector<std::pair<DevicePtr<float>*, std::int64_t>> float_fields_;
};

}  // namespace zrt
