#include "models/flat_param_access.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt {

namespace {

constexpr std::int64_t kAlignElements = 64;

const char* name_of(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kEval:
      return "eval";
  }
  return "?";
}

std::vector<std::byte> to_storage(const std::vector<float>& values, DType dtype) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(&out[i * 4], &values[i], 4);
        break;
      case DType::kBFloat16: {
        const bf16 h = to_bf16(values[i]);
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      case DType::kFloat16: {
        const fp16 h = to_fp16(values[i]);
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      default:
        ZRT_THROW(InvalidArgument, "FlatParamAccess: dtype {} is not a float", dtype_name(dtype));
    }
  }
  return out;
}

std::vector<float> from_storage(const std::vector<std::byte>& bytes, DType dtype) {
  const std::size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(&out[i], &bytes[i * 4], 4);
        break;
      case DType::kBFloat16: {
        bf16 h;
        std::memcpy(&h, &bytes[i * 2], 2);
        out[i] = to_float(h);
        break;
      }
      case DType::kFloat16: {
        fp16 h;
        std::memcpy(&h, &bytes[i * 2], 2);
        out[i] = to_float(h);
        break;
      }
      default:
        ZRT_THROW(InvalidArgument, "FlatParamAccess: dtype {} is not a float", dtype_name(dtype));
    }
  }
  return out;
}

}  // namespace

FlatParamAccess::FlatParamAccess(Device& device, Stream& stream, std::vector<ParamSpec> specs,
                                 int num_modules, DType compute_dtype, DType grad_dtype)
    : device_(device),
      stream_(stream),
      specs_(std::move(specs)),
      compute_dtype_(compute_dtype),
      grad_dtype_(grad_dtype),
      state_(static_cast<std::size_t>(num_modules), -1) {
  ZRT_CHECK(is_floating(compute_dtype) && is_floating(grad_dtype), "dtypes {} / {}",
            dtype_name(compute_dtype), dtype_name(grad_dtype));
  std::int64_t total = 0;
  for (const ParamSpec& s : specs_) {
    for (int m : s.modules) {
      ZRT_CHECK(m >= 0 && m < num_modules, "parameter {} names module {} of {}", s.name, m,
                num_modules);
    }
    offsets_.push_back(total);
    total += (s.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  const std::int64_t n = std::max<std::int64_t>(total, 1);
  params_ = device_.allocate(n * static_cast<std::int64_t>(dtype_size(compute_dtype_)),
                             MemCategory::kParams, "flat parameters");
  grads_ = device_.allocate(n * static_cast<std::int64_t>(dtype_size(grad_dtype_)),
                            MemCategory::kGrads, "flat gradients");
  device_.fill_zero(params_.device<std::byte>(), static_cast<std::size_t>(params_.bytes()),
                    stream_);
  zero_grads();
  stream_.synchronize();
}

FlatParamAccess::~FlatParamAccess() {
  try {
    stream_.synchronize();
  } catch (const std::exception& e) {
    spdlog::error("FlatParamAccess: stream error before release: {}", e.what());
  }
}

void FlatParamAccess::acquire(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < static_cast<int>(state_.size()), "acquire of module {}",
            module);
  ZRT_CHECK(state_[module] < 0, "acquire({}, {}) while module {} is acquired ({})", module,
            name_of(phase), module, name_of(static_cast<Phase>(state_[module])));
  ZRT_CHECK(
      (phase != Phase::kBackward && phase != Phase::kRecompute) || module >= first_backward_module_,
      "acquire({}, {}) below the first backward module {}", module, name_of(phase),
      first_backward_module_);
  state_[module] = static_cast<int>(phase);
  log_.push_back(fmt::format("acquire {} {}", module, name_of(phase)));
}

bool FlatParamAccess::trains(int index) const {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "parameter index {}", index);
  return !specs_[static_cast<std::size_t>(index)].frozen;
}

void FlatParamAccess::set_first_backward_module(int module) {
  ZRT_CHECK(module >= 0 && module < static_cast<int>(state_.size()),
            "first backward module {} of {} modules", module, state_.size());
  first_backward_module_ = module;
}

void FlatParamAccess::release(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < static_cast<int>(state_.size()), "release of module {}",
            module);
  ZRT_CHECK(state_[module] >= 0, "release({}, {}) of a module that is not acquired", module,
            name_of(phase));
  const Phase held = static_cast<Phase>(state_[module]);
  ZRT_CHECK(held == phase, "release({}, {}) of a module acquired for {}", module, name_of(phase),
            name_of(held));
  state_[module] = -1;
  log_.push_back(fmt::format("release {} {}", module, name_of(phase)));
}

bool FlatParamAccess::acquired_in(int index, bool backward) const {
  for (int m : specs_[index].modules) {
    const int s = state_[m];
    if (s < 0) continue;
    const Phase p = static_cast<Phase>(s);
    if (!backward || p == Phase::kBackward) return true;
  }
  return false;
}

DevicePtr<std::byte> FlatParamAccess::param(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "param({})", index);
  ZRT_CHECK(acquired_in(index, false), "param({}) = {} read while none of its modules is acquired",
            index, specs_[index].name);
  return params_.device<std::byte>() +
         offsets_[index] * static_cast<std::int64_t>(dtype_size(compute_dtype_));
}

DevicePtr<std::byte> FlatParamAccess::grad(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "grad({})", index);
  ZRT_CHECK(acquired_in(index, true),
            "grad({}) = {} used while none of its modules is acquired for backward", index,
            specs_[index].name);
  return grads_.device<std::byte>() +
         offsets_[index] * static_cast<std::int64_t>(dtype_size(grad_dtype_));
}

void FlatParamAccess::init_from(const Model& model, std::uint64_t seed) {
  for (int i = 0; i < static_cast<int>(specs_.size()); ++i) {
    std::vector<float> values(static_cast<std::size_t>(specs_[i].numel()));
    model.init_parameter(i, seed, 0, specs_[i].numel(), values.data());
    set_param(i, values);
  }
}

void FlatParamAccess::set_param(int index, const std::vector<float>& values) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "set_param({})", index);
  ZRT_CHECK(static_cast<std::int64_t>(values.size()) == specs_[index].numel(),
            "set_param({}): {} values for {} elements", specs_[index].name, values.size(),
            specs_[index].numel());
  const std::vector<std::byte> bytes = to_storage(values, compute_dtype_);
  device_.copy_to_device(
      params_.device<std::byte>() +
          offsets_[index] * static_cast<std::int64_t>(dtype_size(compute_dtype_)),
      bytes.data(), bytes.size(), stream_);
  stream_.synchronize();  // `bytes` must outlive the copy
}

std::vector<float> FlatParamAccess::read_param(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "read_param({})", index);
  std::vector<std::byte> bytes(static_cast<std::size_t>(specs_[index].numel()) *
                               dtype_size(compute_dtype_));
  device_.copy_to_host(bytes.data(),
                       params_.device<std::byte>() +
                           offsets_[index] * static_cast<std::int64_t>(dtype_size(compute_dtype_)),
                       bytes.size(), stream_);
  stream_.synchronize();
  return from_storage(bytes, compute_dtype_);
}

std::vector<float> FlatParamAccess::read_grad(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "read_grad({})", index);
  std::vector<std::byte> bytes(static_cast<std::size_t>(specs_[index].numel()) *
                               dtype_size(grad_dtype_));
  device_.copy_to_host(bytes.data(),
                       grads_.device<std::byte>() +
                           offsets_[index] * static_cast<std::int64_t>(dtype_size(grad_dtype_)),
                       bytes.size(), stream_);
  stream_.synchronize();
  return from_storage(bytes, grad_dtype_);
}

void FlatParamAccess::zero_grads() {
  device_.fill_zero(grads_.device<std::byte>(), static_cast<std::size_t>(grads_.bytes()), stream_);
}

}  // namespace zrt
