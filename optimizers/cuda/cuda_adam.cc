#include "optimizers/cuda/cuda_adam.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device_access.h"

namespace zrt {

namespace {

using detail::CudaAdamDesc;
using detail::kCudaAdamBlockElems;

std::uint8_t grad_kind(DType t) {
  return t == DType::kFloat32 ? 0 : t == DType::kBFloat16 ? 1 : 2;
}

std::uint8_t out_kind(const AdamDeviceSlice& s) {
  if (!s.param_out) return 0;
  return s.out_dtype == DType::kFloat32 ? 1 : s.out_dtype == DType::kBFloat16 ? 2 : 3;
}

}  // namespace

CudaAdam::CudaAdam(const AdamOptions& options) : options_(options) {}

CudaAdam::~CudaAdam() {
  if (device_table_ != nullptr) (void)cudaFree(device_table_);  // waits for pending kernels
}

void CudaAdam::step(const AdamDeviceSlice* slices, std::size_t count, std::int64_t step, double lr,
                    cudaStream_t stream, double grad_scale) {
  const AdamStepScalars scalars = adam_step_scalars(options_, step, lr, grad_scale);
  std::vector<CudaAdamDesc> table;
  table.reserve(count);
  std::int64_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const AdamDeviceSlice& s = slices[k];
    if (s.numel < 0) ZRT_THROW(InvalidArgument, "Adam slice {}: numel {} < 0", k, s.numel);
    if (s.numel == 0) continue;
    if (!s.param || !s.grad || !s.exp_avg || !s.exp_avg_sq) {
      ZRT_THROW(InvalidArgument,
                "Adam slice {} ({} elements): null param, grad, exp_avg or "
                "exp_avg_sq",
                k, s.numel);
    }
    if (!is_floating(s.grad_dtype) || (s.param_out && !is_floating(s.out_dtype))) {
      ZRT_THROW(InvalidArgument,
                "Adam slice {}: gradient dtype {} / output dtype {} must be "
                "fp32, bf16 or fp16",
                k, dtype_name(s.grad_dtype), dtype_name(s.out_dtype));
    }
    CudaAdamDesc d;
    std::memset(&d, 0, sizeof d);  // padding too: tables are compared bytewise
    d.param = device_access::raw(s.param);
    d.grad = device_access::raw(s.grad);
    d.exp_avg = device_access::raw(s.exp_avg);
    d.exp_avg_sq = device_access::raw(s.exp_avg_sq);
    d.param_out = device_access::raw(s.param_out);
    d.numel = s.numel;
    d.first_block = blocks;
    d.grad_kind = grad_kind(s.grad_dtype);
    d.out_kind = out_kind(s);
    d.weight_decay = s.weight_decay ? 1 : 0;
    table.push_back(d);
    blocks += (s.numel + kCudaAdamBlockElems - 1) / kCudaAdamBlockElems;
  }
  if (table.empty()) return;
  ZRT_CHECK(blocks <= std::numeric_limits<int>::max(), "{} thread blocks exceed the grid limit",
            blocks);

  const bool same =
      table.size() == table_.size() &&
      std::memcmp(table.data(), table_.data(), table.size() * sizeof(CudaAdamDesc)) == 0;
  if (!same) {
    if (table.size() > device_capacity_) {
      if (device_table_ != nullptr) {
        ZRT_CUDA_CHECK(cudaFree(device_table_));  // waits for kernels still reading it
        device_table_ = nullptr;
      }
      const std::size_t capacity = std::max<std::size_t>(table.size(), 2 * device_capacity_);
      ZRT_CUDA_CHECK(
          cudaMalloc(reinterpret_cast<void**>(&device_table_), capacity * sizeof(CudaAdamDesc)));
      device_capacity_ = capacity;
    }
    // From pageable memory: returns once the bytes are staged, so `table` may go away; ordered
    // after earlier kernels on `stream` that still read the previous table.
    ZRT_CUDA_CHECK(cudaMemcpyAsync(device_table_, table.data(), table.size() * sizeof(CudaAdamDesc),
                                   cudaMemcpyHostToDevice, stream));
    table_ = std::move(table);
    blocks_ = blocks;
  }
  detail::launch_cuda_adam(device_table_, static_cast<int>(table_.size()),
                           static_cast<int>(blocks_), scalars, stream);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt
