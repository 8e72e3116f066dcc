#include "runtime/comm/staged_process_group.h"

#include <spdlog/spdlog.h>

#include "runtime/comm/mpi_process_group.h"
#include "runtime/common/error.h"
#include "runtime/device/device_access.h"

namespace zrt {

struct StagedProcessGroup::Host {
  std::unique_ptr<Device> cpu;  // host memory and a stream for the MPI group, nothing else
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ProcessGroup> mpi;
  CommCounts seen;  // the MPI group's counters already folded into the staged group's
};

namespace {

DevicePtr<std::byte> host_ptr(const Buffer& b) {
  return device_access::wrap(b.host<std::byte>());
}

}  // namespace

StagedProcessGroup::StagedProcessGroup(Device& device, MPI_Comm parent, Stream& stream,
                                       std::string name, CommOptions options)
    : ProcessGroup(0, 1, std::move(name), &stream),
      device_(device),
      host_(std::make_unique<Host>()) {
  host_->cpu = make_device(DeviceOptions{});
  host_->stream = host_->cpu->create_stream("staged comm " + name_);
  host_->mpi = std::make_unique<MpiProcessGroup>(*host_->cpu, parent, *host_->stream, name_,
                                                 std::move(options));
  rank_ = host_->mpi->rank();
  size_ = host_->mpi->size();
  reset_node_map();
}

StagedProcessGroup::StagedProcessGroup(Device& device, std::unique_ptr<Host> host, Stream& stream,
                                       std::string name)
    : ProcessGroup(host->mpi->rank(), host->mpi->size(), std::move(name), &stream),
      device_(device),
      host_(std::move(host)) {
  reset_node_map();
}

StagedProcessGroup::~StagedProcessGroup() {
  try {
    stream_->synchronize();  // a copy up may still read the staging
  } catch (const std::exception& e) {
    spdlog::debug("group '{}' closes after an error: {}", name_, e.what());
  }
}

void StagedProcessGroup::reserve(std::size_t in_bytes, std::size_t out_bytes) {
  auto fits = [](const Buffer& b, std::size_t bytes) {
    return !b.empty() && b.bytes() >= static_cast<std::int64_t>(bytes);
  };
  if (fits(staged_in_, in_bytes) && fits(staged_out_, out_bytes)) return;
  stream_->synchronize();
  auto grow = [&](Buffer& b, std::size_t bytes, const char* label) {
    if (fits(b, bytes)) return;
    b.reset();
    // At least 1 MiB, and doubling, so a run's growing sizes reallocate a few times only.
    const std::int64_t size = std::max<std::int64_t>(
        {static_cast<std::int64_t>(bytes), std::int64_t{1} << 20, 2 * b.bytes()});
    b = device_.allocate(size, MemCategory::kComm, fmt::format("{} of group '{}'", label, name_),
                         MemorySpace::kPinnedHost);
  };
  grow(staged_in_, in_bytes, "host staging (in)");
  grow(staged_out_, out_bytes, "host staging (out)");
}

template <typename Exchange>
void StagedProcessGroup::staged(DevicePtr<const std::byte> in, std::size_t in_bytes,
                                DevicePtr<std::byte> out, std::size_t out_bytes,
                                Exchange&& exchange) {
  ProcessGroup& mpi = *host_->mpi;
  if (mpi.node_map() != node_map()) mpi.set_node_map(node_map());
  reserve(in_bytes, out_bytes);
  if (in_bytes > 0) device_.copy_to_host(staged_in_.host<void>(), in, in_bytes, *stream_);
  // The input is on the host once the stream has reached its copy (and so everything enqueued
  // before it: the collective sees what the stream order says it sees).
  stream_->synchronize();
  exchange(DevicePtr<const std::byte>(host_ptr(staged_in_)), host_ptr(staged_out_));
  host_->stream->synchronize();  // throws the MPI group's error or timeout
  if (out_bytes > 0) device_.copy_to_device(out, staged_out_.host<void>(), out_bytes, *stream_);
  // The MPI group counted the operation; the staged group reports it as its own.
  const CommCounts now = mpi.stats().snapshot();
  const CommCounts delta = now - host_->seen;
  host_->seen = now;
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    if (delta.calls[i] > 0) {
      stats_.add(static_cast<CollectiveOp>(i), delta.bytes[i],
                 {delta.intra_bytes[i], delta.inter_bytes[i]});
    }
  }
}

void StagedProcessGroup::all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                    std::int64_t count, DType dtype) {
  check_all_gather(device_access::raw(in), device_access::raw(out), count, dtype);
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  staged(in, bytes, out, bytes * static_cast<std::size_t>(size_),
         [&](DevicePtr<const std::byte> i, DevicePtr<std::byte> o) {
           host_->mpi->all_gather(i, o, count, dtype);
         });
}

void StagedProcessGroup::reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                        std::int64_t count, DType dtype, ReduceOp op) {
  check_reduce_scatter_op(count, dtype, op);
  check_reduce_scatter_buffers(device_access::raw(in), device_access::raw(out), count, dtype);
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  staged(in, bytes * static_cast<std::size_t>(size_), out, bytes,
         [&](DevicePtr<const std::byte> i, DevicePtr<std::byte> o) {
           host_->mpi->reduce_scatter(i, o, count, dtype, op);
         });
}

void StagedProcessGroup::all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                    std::int64_t count, DType dtype, ReduceOp op) {
  check_all_reduce_op(count, dtype, op);
  check_all_reduce_buffers(device_access::raw(in), device_access::raw(out), count, dtype);
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  staged(in, bytes, out, bytes, [&](DevicePtr<const std::byte> i, DevicePtr<std::byte> o) {
    host_->mpi->all_reduce(i, o, count, dtype, op);
  });
}

void StagedProcessGroup::all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                    std::int64_t count, DType dtype) {
  check_all_to_all(device_access::raw(in), device_access::raw(out), count, dtype);
  const std::size_t bytes =
      static_cast<std::size_t>(count) * dtype_size(dtype) * static_cast<std::size_t>(size_);
  staged(in, bytes, out, bytes, [&](DevicePtr<const std::byte> i, DevicePtr<std::byte> o) {
    host_->mpi->all_to_all(i, o, count, dtype);
  });
}

void StagedProcessGroup::all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                     const AllToAllvLayout& layout, DType dtype) {
  check_all_to_allv(device_access::raw(in), device_access::raw(out), layout, dtype);
  const std::size_t elem = dtype_size(dtype);
  const std::size_t in_bytes = static_cast<std::size_t>(layout.send_extent()) * elem;
  const std::size_t out_bytes = static_cast<std::size_t>(layout.recv_extent()) * elem;
  reserve(in_bytes, out_bytes);  // before staged(), so that the pieces below read this staging
  staged(in, in_bytes, out, 0, [&](DevicePtr<const std::byte> i, DevicePtr<std::byte> o) {
    host_->mpi->all_to_allv(i, o, layout, dtype);
  });
  for (std::size_t p = 0; p < layout.recv_counts.size(); ++p) {
    const std::size_t bytes = static_cast<std::size_t>(layout.recv_counts[p]) * elem;
    if (bytes == 0) continue;
    const std::size_t at = static_cast<std::size_t>(layout.recv_offsets[p]) * elem;
    device_.copy_to_device(out + static_cast<std::int64_t>(at), staged_out_.host<std::byte>() + at,
                           bytes, *stream_);
  }
}

void StagedProcessGroup::broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype,
                                   int root) {
  check_broadcast(count, root);
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  // The MPI group broadcasts in place, in the staged input; it goes back up from there.
  staged(buf, bytes, buf, 0, [&](DevicePtr<const std::byte>, DevicePtr<std::byte>) {
    host_->mpi->broadcast(host_ptr(staged_in_), count, dtype, root);
  });
  if (bytes > 0) device_.copy_to_device(buf, staged_in_.host<void>(), bytes, *stream_);
}

void StagedProcessGroup::barrier() {
  check_barrier();
  staged(DevicePtr<const std::byte>(), 0, DevicePtr<std::byte>(), 0,
         [&](DevicePtr<const std::byte>, DevicePtr<std::byte>) { host_->mpi->barrier(); });
}

std::unique_ptr<ProcessGroup> StagedProcessGroup::split(int color, int key, Stream& stream,
                                                        const std::string& name) {
  auto host = std::make_unique<Host>();
  host->cpu = make_device(DeviceOptions{});
  host->stream = host->cpu->create_stream("staged comm " + name);
  host->mpi = host_->mpi->split(color, key, *host->stream, name);
  return std::unique_ptr<ProcessGroup>(
      new StagedProcessGroup(device_, std::move(host), stream, name));
}

}  // namespace zrt
