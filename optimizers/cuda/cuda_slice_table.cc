#include "optimizers/cuda/cuda_slice_table.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"

namespace zrt::detail {

CudaSliceTable::~CudaSliceTable() {
  if (device_table_ != nullptr) (void)cudaFree(device_table_);  // waits for pending kernels
}

CudaOptimizerDesc CudaSliceTable::describe(float* param, const void* grad, float* const* states,
                                           std::size_t num_states, void* param_out,
                                           std::int64_t numel, DType grad_dtype, DType out_dtype,
                                           bool weight_decay) {
  CudaOptimizerDesc d;
  std::memset(&d, 0, sizeof d);  // padding too: tables are compared bytewise
  d.param = param;
  d.grad = grad;
  for (std::size_t k = 0; k < num_states; ++k) d.state[k] = states[k];
  d.param_out = param_out;
  d.numel = numel;
  d.grad_kind = grad_dtype == DType::kFloat32 ? 0 : grad_dtype == DType::kBFloat16 ? 1 : 2;
  d.out_kind = param_out == nullptr            ? 0
               : out_dtype == DType::kFloat32  ? 1
               : out_dtype == DType::kBFloat16 ? 2
                                               : 3;
  d.weight_decay = weight_decay ? 1 : 0;
  return d;
}

bool CudaSliceTable::upload(std::vector<CudaOptimizerDesc> table, cudaStream_t stream) {
  if (table.empty()) return false;
  std::int64_t blocks = 0;
  for (CudaOptimizerDesc& d : table) {
    d.first_block = blocks;
    blocks += (d.numel + kCudaOptimizerBlockElems - 1) / kCudaOptimizerBlockElems;
  }
  ZRT_CHECK(blocks <= std::numeric_limits<int>::max(), "{} thread blocks exceed the grid limit",
            blocks);
  const bool same =
      table.size() == table_.size() &&
      std::memcmp(table.data(), table_.data(), table.size() * sizeof(CudaOptimizerDesc)) == 0;
  if (same) return true;
  if (table.size() > device_capacity_) {
    if (device_table_ != nullptr) {
      ZRT_CUDA_CHECK(cudaFree(device_table_));  // waits for kernels still reading it
      device_table_ = nullptr;
    }
    const std::size_t capacity = std::max<std::size_t>(table.size(), 2 * device_capacity_);
    ZRT_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&device_table_), capacity * sizeof(CudaOptimizerDesc)));
    device_capacity_ = capacity;
  }
  // From pageable memory: returns once the bytes are staged, so `table` may go away; ordered
  // after earlier kernels on `stream` that still read the previous table.
  ZRT_CUDA_CHECK(cudaMemcpyAsync(device_table_, table.data(),
                                 table.size() * sizeof(CudaOptimizerDesc), cudaMemcpyHostToDevice,
                                 stream));
  table_ = std::move(table);
  blocks_ = blocks;
  return true;
}

void CudaSliceTable::check_launch() {
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt::detail
