#include "runtime/comm/quantized_collectives.h"

#include <algorithm>

#include "runtime/comm/quantize.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"
#if ZRT_HAVE_CUDA
#include "runtime/comm/cuda_quantize_kernels.h"
#include "runtime/device/cuda_device.h"
#endif

namespace zrt {

namespace {

using device_access::raw;
using device_access::wrap;

constexpr const char* kWhat = "quantized collectives";

#if ZRT_HAVE_CUDA
cudaStream_t cuda_handle(Stream& stream) {
  return cuda_stream_handle(stream);
}
#endif

}  // namespace

QuantizedCollectives::QuantizedCollectives(Device& device, ProcessGroup& world, ProcessGroup* intra,
                                           ProcessGroup* inter, std::int64_t block)
    : device_(device), world_(world), intra_(intra), inter_(inter), block_(block) {
  ZRT_CHECK(block >= 1, "quantization blocks of {} elements", block);
  ZRT_CHECK((intra == nullptr) == (inter == nullptr),
            "quantized collectives on group '{}': give both the intra- and the inter-node group, "
            "or neither",
            world.name());
  if (intra_ == nullptr) {
    intra_ = &world_;  // one node
    ranks_per_node_ = world.size();
    nodes_ = 1;
    return;
  }
  ranks_per_node_ = intra_->size();
  nodes_ = inter_->size();
  ZRT_CHECK(ranks_per_node_ * nodes_ == world.size() &&
                world.rank() == inter_->rank() * ranks_per_node_ + intra_->rank(),
            "quantized collectives: group '{}' (rank {} of {}) is not nodes of consecutive ranks "
            "with intra-node group '{}' (rank {} of {}) and inter-node group '{}' (rank {} of {})",
            world.name(), world.rank(), world.size(), intra_->name(), intra_->rank(),
            intra_->size(), inter_->name(), inter_->rank(), inter_->size());
  ZRT_CHECK(&intra_->stream() == &world.stream() && &inter_->stream() == &world.stream(),
            "quantized collectives: groups '{}', '{}' and '{}' must issue on one stream",
            world.name(), intra_->name(), inter_->name());
}

QuantizedCollectives::~QuantizedCollectives() {
  try {
    world_.stream().synchronize();  // the scratch must outlive the work that uses it
  } catch (const std::exception&) {
    // The failure was reported by whoever waited on the stream.
  }
}

std::byte* QuantizedCollectives::scratch(int which, std::int64_t bytes) {
  Buffer& buf = scratch_[which];
  if (buf.bytes() < bytes) {
    world_.stream().synchronize();  // no enqueued work may still use the old buffer
    buf.reset();
    buf = device_.allocate(std::max<std::int64_t>(bytes, 256), MemCategory::kComm,
                           fmt::format("group '{}' quantized collective scratch", world_.name()),
                           MemorySpace::kDevice, &world_.stream());
  }
  return raw(buf.device<std::byte>());
}

void QuantizedCollectives::quantize(const std::byte* in, DType dtype, std::int64_t n,
                                    std::byte* dst) {
  auto* q = reinterpret_cast<std::int8_t*>(dst);
  auto* scales = reinterpret_cast<float*>(dst + 4 * ((n + 3) / 4));
  const std::int64_t block = block_;
  if (runs_on_cpu(device_)) {
    as_cpu_stream(world_.stream(), kWhat).enqueue([=] {
      quantize_int8_blocks(in, dtype, n, block, q, scales);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda_quantize_int8_blocks(in, dtype, n, block, q, scales, cuda_handle(world_.stream()));
#else
  cuda_backend_missing(kWhat);
#endif
}

void QuantizedCollectives::dequantize(const std::byte* src, std::int64_t n, DType dtype,
                                      std::byte* out) {
  const auto* q = reinterpret_cast<const std::int8_t*>(src);
  const auto* scales = reinterpret_cast<const float*>(src + 4 * ((n + 3) / 4));
  const std::int64_t block = block_;
  if (runs_on_cpu(device_)) {
    as_cpu_stream(world_.stream(), kWhat).enqueue([=] {
      dequantize_int8_blocks(q, scales, n, block, dtype, out);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda_dequantize_int8_blocks(q, scales, n, block, dtype, out, cuda_handle(world_.stream()));
#else
  cuda_backend_missing(kWhat);
#endif
}

void QuantizedCollectives::dequantize_add(const std::byte* src, std::int64_t n, float* acc,
                                          bool add) {
  const auto* q = reinterpret_cast<const std::int8_t*>(src);
  const auto* scales = reinterpret_cast<const float*>(src + 4 * ((n + 3) / 4));
  const std::int64_t block = block_;
  if (runs_on_cpu(device_)) {
    as_cpu_stream(world_.stream(), kWhat).enqueue([=] {
      dequantize_int8_blocks_add(q, scales, n, block, acc, add);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda_dequantize_int8_blocks_add(q, scales, n, block, acc, add, cuda_handle(world_.stream()));
#else
  cuda_backend_missing(kWhat);
#endif
}

void QuantizedCollectives::narrow(const float* acc, std::int64_t n, float divisor, DType dtype,
                                  std::byte* out) {
  if (runs_on_cpu(device_)) {
    as_cpu_stream(world_.stream(), kWhat).enqueue([=] {
      narrow_fp32(acc, n, divisor, dtype, out);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda_narrow_fp32(acc, n, divisor, dtype, out, cuda_handle(world_.stream()));
#else
  cuda_backend_missing(kWhat);
#endif
}

void QuantizedCollectives::all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                      std::int64_t count, DType dtype) {
  check_quantize_args(dtype, count, block_);
  if (count == 0) return;
  const std::int64_t words = quantized_slice_words(count, block_);
  const int n = world_.size();
  std::byte* send = scratch(0, words * 4);
  std::byte* recv = scratch(1, n * words * 4);
  quantize(raw(in), dtype, count, send);
  world_.all_gather(wrap<const std::byte>(send), wrap(recv), words, DType::kInt32);
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  for (int r = 0; r < n; ++r) {
    dequantize(recv + r * words * 4, count, dtype, raw(out) + r * count * elem);
  }
}

void QuantizedCollectives::reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                          std::int64_t count, DType dtype, ReduceOp op) {
  check_quantize_args(dtype, count, block_);
  ZRT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg,
            "the quantized reduce-scatter sums or averages, not {}", reduce_op_name(op));
  if (count == 0) return;
  const int L = ranks_per_node_;
  const int M = nodes_;
  const int N = world_.size();
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const float divisor = op == ReduceOp::kAvg ? static_cast<float>(N) : 1.0f;
  const std::byte* input = raw(in);
  if (N == 1) {  // nothing to send: the sum (and the mean) is the input
    device_.copy(out, in, static_cast<std::size_t>(count * elem), world_.stream());
    return;
  }
  const std::int64_t words = quantized_slice_words(count, block_);
  // All scratch up front: growing it later would synchronize between enqueued steps.
  std::byte* send = scratch(0, N * words * 4);
  std::byte* recv = scratch(1, N * words * 4);
  auto* node_sum = reinterpret_cast<float*>(scratch(2, M * count * 4));
  auto* total = reinterpret_cast<float*>(scratch(3, count * 4));
  // World slice of (node m, local rank l) starts at element (m * L + l) * count of `in`.
  const auto slice = [&](int m, int l) { return input + (m * L + l) * count * elem; };
  if (L > 1) {
    // (1) Inside the node: local rank l gets the node's contributions to slices (m, l) for
    // every node m, and sums them in fp32 in local-rank order.
    for (int l = 0; l < L; ++l) {
      for (int m = 0; m < M; ++m)
        quantize(slice(m, l), dtype, count, send + (l * M + m) * words * 4);
    }
    intra_->all_to_all(wrap<const std::byte>(send), wrap(recv), M * words, DType::kInt32);
    for (int l = 0; l < L; ++l) {
      for (int m = 0; m < M; ++m) {
        dequantize_add(recv + (l * M + m) * words * 4, count, node_sum + m * count, l > 0);
      }
    }
    if (M == 1) {
      narrow(node_sum, count, divisor, dtype, raw(out));
      return;
    }
  }
  // (2) Between nodes: node m's partial of this rank's slice comes from local rank l of node m.
  for (int m = 0; m < M; ++m) {
    if (L > 1) {
      quantize(reinterpret_cast<const std::byte*>(node_sum + m * count), DType::kFloat32, count,
               send + m * words * 4);
    } else {
      quantize(slice(m, 0), dtype, count, send + m * words * 4);
    }
  }
  inter_->all_to_all(wrap<const std::byte>(send), wrap(recv), words, DType::kInt32);
  for (int m = 0; m < M; ++m) dequantize_add(recv + m * words * 4, count, total, m > 0);
  narrow(total, count, divisor, dtype, raw(out));
}

}  // namespace zrt
