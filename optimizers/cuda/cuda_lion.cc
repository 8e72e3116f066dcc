#include "optimizers/cuda/cuda_lion.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device_access.h"

namespace zrt {

namespace {

using detail::CudaLionDesc;
using detail::kCudaLionBlockElems;

std::uint8_t grad_kind(DType t) {
  return t == DType::kFloat32 ? 0 : t == DType::kBFloat16 ? 1 : 2;
}

std::uint8_t out_kind(const LionDeviceSlice& s) {
  if (!s.param_out) return 0;
  return s.out_dtype == DType::kFloat32 ? 1 : s.out_dtype == DType::kBFloat16 ? 2 : 3;
}

}  // namespace

CudaLion::CudaLion(const LionOptions& options) : options_(options) {}

CudaLion::~CudaLion() {
  if (device_table_ != nullptr) (void)cudaFree(device_table_);  // waits for pending kernels
}

void CudaLion::step(const std::vector<LionDeviceSlice>& slices, double lr, cudaStream_t stream,
                    double grad_scale) {
  const LionStepScalars scalars = lion_step_scalars(options_, lr, grad_scale);
  std::vector<CudaLionDesc> table;
  table.reserve(slices.size());
  std::int64_t blocks = 0;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const LionDeviceSlice& s = slices[k];
    if (s.numel < 0) ZRT_THROW(InvalidArgument, "Lion slice {}: numel {} < 0", k, s.numel);
    if (s.numel == 0) continue;
    if (!s.param || !s.grad || !s.exp_avg) {
      ZRT_THROW(InvalidArgument, "Lion slice {} ({} elements): null param, grad or exp_avg", k,
                s.numel);
    }
    if (!is_floating(s.grad_dtype) || (s.param_out && !is_floating(s.out_dtype))) {
      ZRT_THROW(InvalidArgument,
                "Lion slice {}: gradient dtype {} / output dtype {} must be fp32, bf16 or fp16", k,
                dtype_name(s.grad_dtype), dtype_name(s.out_dtype));
    }
    CudaLionDesc d;
    std::memset(&d, 0, sizeof d);  // padding too: tables are compared bytewise
    d.param = device_access::raw(s.param);
    d.grad = device_access::raw(s.grad);
    d.exp_avg = device_access::raw(s.exp_avg);
    d.param_out = device_access::raw(s.param_out);
    d.numel = s.numel;
    d.first_block = blocks;
    d.grad_kind = grad_kind(s.grad_dtype);
    d.out_kind = out_kind(s);
    d.weight_decay = s.weight_decay ? 1 : 0;
    table.push_back(d);
    blocks += (s.numel + kCudaLionBlockElems - 1) / kCudaLionBlockElems;
  }
  if (table.empty()) return;
  ZRT_CHECK(blocks <= std::numeric_limits<int>::max(), "{} thread blocks exceed the grid limit",
            blocks);
  const bool same =
      table.size() == table_.size() &&
      std::memcmp(table.data(), table_.data(), table.size() * sizeof(CudaLionDesc)) == 0;
  if (!same) {
    if (table.size() > device_capacity_) {
      if (device_table_ != nullptr) {
        ZRT_CUDA_CHECK(cudaFree(device_table_));  // waits for kernels still reading it
        device_table_ = nullptr;
      }
      const std::size_t capacity = std::max<std::size_t>(table.size(), 2 * device_capacity_);
      ZRT_CUDA_CHECK(
          cudaMalloc(reinterpret_cast<void**>(&device_table_), capacity * sizeof(CudaLionDesc)));
      device_capacity_ = capacity;
    }
    // From pageable memory: returns once the bytes are staged; ordered after earlier kernels
    // on `stream` that still read the previous table.
    ZRT_CUDA_CHECK(cudaMemcpyAsync(device_table_, table.data(), table.size() * sizeof(CudaLionDesc),
                                   cudaMemcpyHostToDevice, stream));
    table_ = std::move(table);
    blocks_ = blocks;
  }
  detail::launch_cuda_lion(device_table_, static_cast<int>(table_.size()),
                           static_cast<int>(blocks_), scalars, stream);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt
