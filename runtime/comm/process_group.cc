#include "runtime/comm/process_group.h"

#include "runtime/comm/mpi_process_group.h"
#include "runtime/common/error.h"
#if ZRT_HAVE_CUDA
#include "runtime/comm/nccl_process_group.h"
#endif

namespace zrt {

std::int64_t collective_bytes(CollectiveOp op, std::int64_t count, DType dtype, int world) {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      return count * elem * world;  // count is per rank
    case CollectiveOp::kAllReduce:
    case CollectiveOp::kBroadcast:
      return count * elem;
    case CollectiveOp::kBarrier:
      return 0;
  }
  return 0;
}

double bus_factor(CollectiveOp op, int world) {
  const double n = world;
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      return (n - 1) / n;
    case CollectiveOp::kAllReduce:
      return 2 * (n - 1) / n;
    case CollectiveOp::kBroadcast:
      return 1.0;
    case CollectiveOp::kBarrier:
      return 0.0;
  }
  return 0.0;
}

std::unique_ptr<ProcessGroup> make_process_group(Device& device, MPI_Comm parent, Stream& stream,
                                                 const std::string& name,
                                                 const CommOptions& options) {
  if (device.type() == DeviceType::kCpu) {
    return std::make_unique<MpiProcessGroup>(device, parent, stream, name, options);
  }
#if ZRT_HAVE_CUDA
  return make_nccl_process_group(device, parent, stream, name, options);
#else
  ZRT_THROW(InvalidArgument, "no collective backend for device '{}' in this build",
            device.description());
#endif
}

}  // namespace zrt
