#include "runtime/comm/process_group.h"

#include <algorithm>

#include "runtime/comm/collective_plan.h"
#include "runtime/comm/mpi_process_group.h"
#include "runtime/comm/staged_process_group.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#if ZRT_HAVE_CUDA
#include "runtime/comm/nccl_process_group.h"
#endif

namespace zrt {

namespace {

bool overlaps(const std::byte* a, std::int64_t a_bytes, const std::byte* b, std::int64_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

}  // namespace

std::string ProcessGroup::describe(const char* op, std::int64_t count, DType dtype) const {
  return fmt::format("{} of {} x {} on group '{}' (rank {} of {})", op, count, dtype_name(dtype),
                     name_, rank_, size_);
}

void ProcessGroup::check_all_gather(const std::byte* in, const std::byte* out, std::int64_t count,
                                    DType dtype) const {
  verify_sequence(fmt::format("all_gather of {} x {}", count, dtype_name(dtype)));
  ZRT_CHECK(count >= 0, "all_gather with negative count {}", count);
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const bool in_place = in == out + rank_ * count * elem;
  ZRT_CHECK(in_place || !overlaps(in, count * elem, out, size_ * count * elem),
            "{}: input overlaps the output but is not this rank's slice of it",
            describe("all_gather", count, dtype));
}

void ProcessGroup::check_reduce_scatter_op(std::int64_t count, DType dtype, ReduceOp op) const {
  verify_sequence(
      fmt::format("reduce_scatter ({}) of {} x {}", reduce_op_name(op), count, dtype_name(dtype)));
  ZRT_CHECK(count >= 0, "reduce_scatter with negative count {}", count);
  ZRT_CHECK(op == ReduceOp::kSum || (op == ReduceOp::kAvg && is_floating(dtype)),
            "reduce_scatter supports sum (and avg on floats), not {} on {}", reduce_op_name(op),
            dtype_name(dtype));
}

void ProcessGroup::check_reduce_scatter_buffers(const std::byte* in, const std::byte* out,
                                                std::int64_t count, DType dtype) const {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const bool in_place = out == in + rank_ * count * elem;
  ZRT_CHECK(in_place || !overlaps(in, size_ * count * elem, out, count * elem),
            "{}: output overlaps the input but is not this rank's slice of it",
            describe("reduce_scatter", count, dtype));
}

void ProcessGroup::check_all_reduce_op(std::int64_t count, DType dtype, ReduceOp op) const {
  verify_sequence(
      fmt::format("all_reduce ({}) of {} x {}", reduce_op_name(op), count, dtype_name(dtype)));
  ZRT_CHECK(count >= 0, "all_reduce with negative count {}", count);
  if (is_floating(dtype)) {
    ZRT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg,
              "all_reduce on {} supports sum and avg, not {}", dtype_name(dtype),
              reduce_op_name(op));
  } else {
    ZRT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kMax,
              "all_reduce on {} supports sum and max, not {}", dtype_name(dtype),
              reduce_op_name(op));
  }
}

void ProcessGroup::check_all_reduce_buffers(const std::byte* in, const std::byte* out,
                                            std::int64_t count, DType dtype) const {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  ZRT_CHECK(in == out || !overlaps(in, count * elem, out, count * elem),
            "{}: input and output overlap without being the same buffer",
            describe("all_reduce", count, dtype));
}

void ProcessGroup::check_broadcast(std::int64_t count, int root) const {
  verify_sequence(fmt::format("broadcast of {} elements from rank {}", count, root));
  ZRT_CHECK(count >= 0, "broadcast with negative count {}", count);
  ZRT_CHECK(root >= 0 && root < size_, "broadcast root {} outside group '{}' of {} ranks", root,
            name_, size_);
}

void ProcessGroup::check_all_to_all(const std::byte* in, const std::byte* out, std::int64_t count,
                                    DType dtype) const {
  verify_sequence(fmt::format("all_to_all of {} x {}", count, dtype_name(dtype)));
  ZRT_CHECK(count >= 0, "all_to_all with negative count {}", count);
  const auto bytes = size_ * count * static_cast<std::int64_t>(dtype_size(dtype));
  ZRT_CHECK(!overlaps(in, bytes, out, bytes), "{}: input and output overlap",
            describe("all_to_all", count, dtype));
}

AllToAllvLayout AllToAllvLayout::packed(std::vector<std::int64_t> send_counts,
                                        std::vector<std::int64_t> recv_counts) {
  AllToAllvLayout layout;
  const auto prefix = [](const std::vector<std::int64_t>& counts) {
    std::vector<std::int64_t> offsets(counts.size(), 0);
    std::int64_t at = 0;
    for (std::size_t p = 0; p < counts.size(); ++p) {
      offsets[p] = at;
      at += counts[p];
    }
    return offsets;
  };
  layout.send_offsets = prefix(send_counts);
  layout.recv_offsets = prefix(recv_counts);
  layout.send_counts = std::move(send_counts);
  layout.recv_counts = std::move(recv_counts);
  return layout;
}

namespace {

std::int64_t extent(const std::vector<std::int64_t>& counts,
                    const std::vector<std::int64_t>& offsets) {
  std::int64_t end = 0;
  for (std::size_t p = 0; p < counts.size() && p < offsets.size(); ++p) {
    if (counts[p] > 0) end = std::max(end, offsets[p] + counts[p]);
  }
  return end;
}

std::int64_t total(const std::vector<std::int64_t>& counts) {
  std::int64_t sum = 0;
  for (const std::int64_t c : counts) sum += c;
  return sum;
}

}  // namespace

std::int64_t AllToAllvLayout::send_extent() const {
  return extent(send_counts, send_offsets);
}
std::int64_t AllToAllvLayout::recv_extent() const {
  return extent(recv_counts, recv_offsets);
}
std::int64_t AllToAllvLayout::send_total() const {
  return total(send_counts);
}
std::int64_t AllToAllvLayout::recv_total() const {
  return total(recv_counts);
}

void ProcessGroup::check_all_to_allv(const std::byte* in, const std::byte* out,
                                     const AllToAllvLayout& layout, DType dtype) const {
  verify_sequence(fmt::format("all_to_allv of {}", dtype_name(dtype)));
  const auto members = static_cast<std::size_t>(size_);
  ZRT_CHECK(layout.send_counts.size() == members && layout.send_offsets.size() == members &&
                layout.recv_counts.size() == members && layout.recv_offsets.size() == members,
            "all_to_allv on group '{}' of {} ranks: the layout has {} send counts, {} send "
            "offsets, {} receive counts and {} receive offsets; give one of each per member",
            name_, size_, layout.send_counts.size(), layout.send_offsets.size(),
            layout.recv_counts.size(), layout.recv_offsets.size());
  for (std::size_t p = 0; p < members; ++p) {
    ZRT_CHECK(layout.send_counts[p] >= 0 && layout.send_offsets[p] >= 0 &&
                  layout.recv_counts[p] >= 0 && layout.recv_offsets[p] >= 0,
              "all_to_allv on group '{}': a negative count or offset for peer {} (send {} at {}, "
              "receive {} at {})",
              name_, p, layout.send_counts[p], layout.send_offsets[p], layout.recv_counts[p],
              layout.recv_offsets[p]);
  }
  const auto self = static_cast<std::size_t>(rank_);
  ZRT_CHECK(layout.send_counts[self] == layout.recv_counts[self],
            "all_to_allv on group '{}' (rank {}): this rank sends itself {} elements but expects "
            "{} from itself",
            name_, rank_, layout.send_counts[self], layout.recv_counts[self]);
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  ZRT_CHECK(!overlaps(in, layout.send_extent() * elem, out, layout.recv_extent() * elem),
            "all_to_allv of {} on group '{}' (rank {} of {}): input and output overlap",
            dtype_name(dtype), name_, rank_, size_);
}

LinkBytes ProcessGroup::all_to_allv_link_bytes(const AllToAllvLayout& layout, DType dtype) const {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  LinkBytes sent;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::int64_t bytes = layout.send_counts[static_cast<std::size_t>(p)] * elem;
    if (node_map_[static_cast<std::size_t>(p)] == node_map_[static_cast<std::size_t>(rank_)]) {
      sent.intra += bytes;
    } else {
      sent.inter += bytes;
    }
  }
  return sent;
}

void ProcessGroup::check_barrier() const {
  verify_sequence("barrier");
}

void ProcessGroup::verify_sequence(const std::string& operation) const {
  if (sequence_check_) sequence_check_->verify(operation);
}

void ProcessGroup::set_node_map(std::vector<int> nodes) {
  ZRT_CHECK(static_cast<int>(nodes.size()) == size_,
            "group '{}' has {} ranks but its node map names {}", name_, size_, nodes.size());
  node_map_ = std::move(nodes);
  peers_on_node_ = 0;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ &&
        node_map_[static_cast<std::size_t>(r)] == node_map_[static_cast<std::size_t>(rank_)]) {
      ++peers_on_node_;
    }
  }
}

void ProcessGroup::reset_node_map() {
  set_node_map(std::vector<int>(static_cast<std::size_t>(size_), 0));
}

LinkBytes ProcessGroup::link_bytes(CollectiveOp op, std::int64_t count, DType dtype,
                                   std::int64_t chunk, int root) const {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return direct_link_bytes(count * elem);  // one block to every peer
    case CollectiveOp::kAllReduce:
      // Reduce-scatter then all-gather of the padded slices: each slice to every peer, twice.
      return direct_link_bytes(2 * elem *
                               collective_plan::all_reduce_slice_total(count, size_, chunk));
    case CollectiveOp::kBroadcast:
      return rank_ == root ? direct_link_bytes(count * elem) : LinkBytes{};
    case CollectiveOp::kBarrier:
      return {};
  }
  return {};
}

std::int64_t collective_bytes(CollectiveOp op, std::int64_t count, DType dtype, int world) {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
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
    case CollectiveOp::kAllToAll:
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

namespace {

std::unique_ptr<ProcessGroup> make_backend_group(Device& device, MPI_Comm parent, Stream& stream,
                                                 const std::string& name,
                                                 const CommOptions& options) {
  if (options.host_staged) {
    return std::make_unique<StagedProcessGroup>(device, parent, stream, name, options);
  }
  if (runs_on_cpu(device)) {
    return std::make_unique<MpiProcessGroup>(device, parent, stream, name, options);
  }
#if ZRT_HAVE_CUDA
  return make_nccl_process_group(device, parent, stream, name, options);
#else
  cuda_backend_missing("collectives on a cuda device");
#endif
}

}  // namespace

std::unique_ptr<ProcessGroup> make_process_group(Device& device, MPI_Comm parent, Stream& stream,
                                                 const std::string& name,
                                                 const CommOptions& options) {
  std::unique_ptr<ProcessGroup> group = make_backend_group(device, parent, stream, name, options);
  if (options.check_collective_sequence) {
    group->set_sequence_check(std::make_unique<CollectiveSequenceCheck>(
        parent, name, options.timeout_s, options.watchdog.get()));
  }
  return group;
}

}  // namespace zrt
