#include "runtime/comm/mpi_process_group.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "runtime/comm/collective_plan.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/polled_wait.h"
#include "runtime/comm/reduce_kernels.h"
#include "runtime/common/error.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"

namespace zrt {

namespace {

using Clock = std::chrono::steady_clock;

void require_thread_multiple() {
  int level = 0;
  ZRT_MPI_CHECK(MPI_Query_thread(&level));
  ZRT_CHECK(level >= MPI_THREAD_MULTIPLE,
            "MPI was initialised without MPI_THREAD_MULTIPLE (level {}); collectives run on "
            "stream threads and need it. Initialise MPI through zrt::MpiRuntime.",
            level);
}

MPI_Datatype mpi_int_type(DType dtype) {
  return dtype == DType::kInt32 ? MPI_INT32_T : MPI_INT64_T;
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(Device& device, MPI_Comm parent, Stream& stream, std::string name,
                                 CommOptions options)
    : ProcessGroup(0, 1, std::move(name), &stream),
      device_(device),
      cpu_stream_(as_cpu_stream(stream, "MpiProcessGroup")),
      options_(options) {
  ZRT_CHECK(device.type() == DeviceType::kCpu, "the MPI process group needs the CPU device, not {}",
            device.description());
  require_thread_multiple();
  {
    // MPI_Comm_dup blocks until every rank calls it and cannot time out: the watchdog's
    // monitor is the only guard against a rank that never comes.
    const Watchdog::Watch watch =
        options_.watchdog
            ? options_.watchdog->watch(fmt::format("MPI_Comm_dup creating group '{}'", name_))
            : Watchdog::Watch();
    ZRT_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  }
  ZRT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZRT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZRT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  reset_node_map();
}

MpiProcessGroup::MpiProcessGroup(Adopt, Device& device, MPI_Comm comm, Stream& stream,
                                 std::string name, CommOptions options)
    : ProcessGroup(0, 1, std::move(name), &stream),
      device_(device),
      cpu_stream_(as_cpu_stream(stream, "MpiProcessGroup")),
      options_(options),
      comm_(comm) {
  ZRT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZRT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZRT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  reset_node_map();
}

MpiProcessGroup::~MpiProcessGroup() {
  try {
    stream_->synchronize();
  } catch (const std::exception& e) {
    spdlog::debug("group '{}' closes after an error: {}", name_, e.what());
  }
  // A timed-out operation is still pending in MPI. Give late peers a moment to complete it;
  // if they do not, leak the communicator rather than free it under a live request.
  const bool completed =
      abandoned_.empty() || poll_until_done(2.0, PollPace::kSpin, [this] {
        int done = 0;
        return MPI_Testall(static_cast<int>(abandoned_.size()), abandoned_.data(), &done,
                           MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
               done != 0;
      });
  if (!completed) {
    spdlog::warn(
        "group '{}': an abandoned collective is still pending; leaking its "
        "communicator",
        name_);
    return;
  }
  MPI_Comm_free(&comm_);
}

void MpiProcessGroup::enqueue(CollectiveOp op, std::int64_t bytes, LinkBytes sent,
                              std::function<void()> body) {
  stats_.add(op, bytes, sent);
  // Every rank issues the same operations in the same order, so the count names an operation
  // across ranks (the attendance taken after a timeout compares it).
  body = [this, body = std::move(body)] {
    ++sequence_;
    body();
  };
  const double bandwidth = options_.simulated_bandwidth_bytes_per_s;
  const double latency = options_.simulated_latency_s;
  if (bandwidth <= 0.0 && latency <= 0.0) {
    cpu_stream_.enqueue(std::move(body));
    return;
  }
  const double bus_bytes = static_cast<double>(bytes) * bus_factor(op, size_);
  const double seconds = latency + (bandwidth > 0.0 ? bus_bytes / bandwidth : 0.0);
  cpu_stream_.enqueue([body = std::move(body), seconds] {
    const auto start = Clock::now();
    body();
    // The simulated link finishes no earlier than its modelled time; sleeping costs no CPU.
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(seconds)));
  });
}

void MpiProcessGroup::wait(MPI_Request& req, const std::string& what) {
  wait_all(&req, 1, what);
}

void MpiProcessGroup::wait_all(MPI_Request* reqs, int n, const std::string& what,
                               MPI_Status* statuses) {
  Watchdog* watchdog = options_.watchdog.get();
  // The watchdog's monitor is the backstop should MPI_Testall itself ever block.
  const Watchdog::Watch watch = watchdog ? watchdog->watch(what) : Watchdog::Watch();
  // A timeout, or an error of MPI_Testall itself, throws out of the poll: the requests still
  // pending go to the group.
  AbandonOnUnwind abandon_on_error(*this, reqs, static_cast<std::size_t>(n));
  polled_wait(
      {options_.timeout_s, PollPace::kSpin, watchdog},
      [&] {
        int done = 0;
        ZRT_MPI_CHECK(MPI_Testall(n, reqs, &done, statuses));
        return done != 0;
      },
      [&] {
        return fmt::format("{} did not complete within {:.1f} s (comm_timeout_s){}; {}", what,
                           options_.timeout_s, watchdog ? watchdog->step_phrase() : "",
                           take_attendance());
      });
}

void MpiProcessGroup::abandon(MPI_Request* reqs, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    abandoned_.push_back(reqs[i]);
    reqs[i] = MPI_REQUEST_NULL;
  }
}

std::string MpiProcessGroup::take_attendance() {
  // Every rank stuck in this operation times out at about the same moment and sends the
  // others its operation number on this group, point to point beside the collectives (their
  // own tag; collective traffic never matches it). Peers heard from with the same number are
  // waiting too; with another number they are elsewhere in the group's sequence; peers not
  // heard from within the grace period are missing: dead, frozen, or blocked somewhere else.
  // MPI errors here (a dead peer) only mean "not heard from".
  constexpr int kAttendanceTag = 0x7a7;
  const double grace = std::min(2.0, std::max(0.2, options_.timeout_s / 2));
  attendance_send_ = sequence_;
  std::vector<std::int64_t> heard(static_cast<std::size_t>(size_), -1);
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request send = MPI_REQUEST_NULL;
    if (MPI_Isend(&attendance_send_, 1, MPI_INT64_T, peer, kAttendanceTag, comm_, &send) ==
        MPI_SUCCESS) {
      abandoned_.push_back(send);  // completed (or given up) by the destructor
    }
    MPI_Irecv(&heard[static_cast<std::size_t>(peer)], 1, MPI_INT64_T, peer, kAttendanceTag, comm_,
              &recvs[static_cast<std::size_t>(peer)]);
  }
  poll_until_done(grace, PollPace::kBackoff, [&] {
    int done = 0;
    return MPI_Testall(size_, recvs.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || done;
  });
  for (MPI_Request& r : recvs) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
  }
  std::vector<int> missing, waiting;
  std::vector<std::string> elsewhere;
  for (int peer = 0; peer < size_; ++peer) {
    const std::int64_t seq = heard[static_cast<std::size_t>(peer)];
    if (peer == rank_) continue;
    if (seq < 0) {
      missing.push_back(peer);
    } else if (seq == sequence_) {
      waiting.push_back(peer);
    } else {
      elsewhere.push_back(fmt::format("rank {} at operation #{}", peer, seq));
    }
  }
  std::string text = missing.empty()
                         ? std::string("no rank missing")
                         : fmt::format(
                               "ranks missing: {} (not heard from within {:.1f} s: dead, "
                               "frozen or blocked elsewhere)",
                               fmt::join(missing, ", "), grace);
  if (!elsewhere.empty()) {
    text += fmt::format(
        "; in another operation of the group (collectives issued in another "
        "order?): {}",
        fmt::join(elsewhere, ", "));
  }
  text += fmt::format("; this is operation #{} of the group; waiting in it too: {}", sequence_,
                      waiting.empty() ? std::string("no other rank")
                                      : fmt::format("ranks {}", fmt::join(waiting, ", ")));
  return text;
}

std::byte* MpiProcessGroup::scratch(int which, std::int64_t bytes) {
  Buffer& buf = scratch_[which];
  if (buf.bytes() < bytes) {
    buf.reset();
    buf = device_.allocate(bytes, MemCategory::kComm,
                           fmt::format("group '{}' collective scratch", name_));
  }
  return device_access::raw(buf.device<std::byte>());
}

std::int64_t MpiProcessGroup::chunk_elements(std::int64_t elem_bytes, int parts) const {
  return collective_plan::chunk_elements(options_.max_chunk_bytes, elem_bytes, parts,
                                         collective_plan::int_count_limit(elem_bytes));
}

// ---- all_gather ------------------------------------------------------------------------------

void MpiProcessGroup::all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                 std::int64_t count, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_gather(src, dst, count, dtype);
  enqueue(CollectiveOp::kAllGather, collective_bytes(CollectiveOp::kAllGather, count, dtype, size_),
          link_bytes(CollectiveOp::kAllGather, count, dtype, 0), [this, src, dst, count, dtype] {
            if (options_.simulated_link_only)
              run_local_all_gather(src, dst, count * static_cast<std::int64_t>(dtype_size(dtype)));
            else
              run_all_gather(src, dst, count, dtype);
          });
}

void MpiProcessGroup::run_local_all_gather(const std::byte* in, std::byte* out,
                                           std::int64_t bytes) const {
  for (int r = 0; r < size_; ++r) {
    std::byte* block = out + r * bytes;
    if (block != in) std::memmove(block, in, static_cast<std::size_t>(bytes));
  }
}

void MpiProcessGroup::run_all_gather(const std::byte* in, std::byte* out, std::int64_t count,
                                     DType dtype) {
  if (count == 0) return;
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t bytes = count * elem;
  std::byte* mine = out + rank_ * bytes;
  // Small and medium slices go point to point (every send and receive posted at once, as
  // MPI_Allgather's two-process and linear algorithms do); OpenMPI's nonblocking all-gather
  // (libnbc) is a schedule of rounds advanced one MPI_Test at a time and measured 1.4-2.5x
  // slower below a few MiB, but as fast as MPI_Allgather from 4 MiB up. Beyond int counts every
  // slice goes point to point in pieces of max_chunk_bytes.
  const bool use_mpi = options_.all_gather_algo == AllGatherAlgo::kMpi ||
                       (options_.all_gather_algo == AllGatherAlgo::kAuto &&
                        bytes > options_.direct_all_gather_bytes);
  if (use_mpi && bytes <= INT_MAX && size_ > 1) {
    MPI_Request req = MPI_REQUEST_NULL;
    ZRT_MPI_CHECK(MPI_Iallgather(in == mine ? MPI_IN_PLACE : in, static_cast<int>(bytes), MPI_BYTE,
                                 out, static_cast<int>(bytes), MPI_BYTE, comm_, &req));
    wait(req, describe("all_gather", count, dtype));
    return;
  }
  // Every rank sends its slice to every peer and receives theirs. The slice goes out from `in`
  // itself and is copied into place while the messages are in flight: sending the copy just
  // written instead measured 3-5x slower at 256 KiB-4 MiB (2 ranks, shared memory).
  const auto copy_mine = [&] {
    if (in != mine) std::memcpy(mine, in, static_cast<std::size_t>(bytes));
  };
  if (size_ == 1) {
    copy_mine();
    return;
  }
  exchange_blocks(in, 0, out, bytes, 0, describe("all_gather", count, dtype), copy_mine);
}

void MpiProcessGroup::exchange_blocks(const std::byte* send, std::int64_t send_stride,
                                      std::byte* recv, std::int64_t bytes, int tag,
                                      const std::string& what,
                                      const std::function<void()>& meanwhile) {
  // All messages posted at once; large blocks go as several messages to keep counts in int.
  std::vector<MPI_Request>& reqs = requests_;
  reqs.clear();
  AbandonOnUnwind abandon_on_error(*this, {&reqs});
  collective_plan::for_each_chunk(bytes, byte_chunk(), [&](collective_plan::Range piece) {
    const int n = static_cast<int>(piece.count);
    for (int step = 1; step < size_; ++step) {
      const int from = (rank_ - step + size_) % size_;
      reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
      ZRT_MPI_CHECK(MPI_Irecv(recv + from * bytes + piece.first, n, MPI_BYTE, from, tag, comm_,
                              &reqs.back()));
    }
    for (int step = 1; step < size_; ++step) {
      const int to = (rank_ + step) % size_;
      reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
      ZRT_MPI_CHECK(MPI_Isend(send + to * send_stride + piece.first, n, MPI_BYTE, to, tag, comm_,
                              &reqs.back()));
    }
  });
  if (meanwhile) meanwhile();
  wait_all(reqs.data(), static_cast<int>(reqs.size()), what);
}

// ---- reduce_scatter --------------------------------------------------------------------------

void MpiProcessGroup::reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                     std::int64_t count, DType dtype, ReduceOp op) {
  check_reduce_scatter_op(count, dtype, op);
  if (options_.reduce_scatter_algo == ReduceScatterAlgo::kNative) {
    ZRT_CHECK(dtype == DType::kFloat32 || !is_floating(dtype),
              "the native MPI reduce-scatter cannot sum {} (MPI has no 16-bit float type); use "
              "the alltoall algorithm",
              dtype_name(dtype));
  }
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_reduce_scatter_buffers(src, dst, count, dtype);
  enqueue(CollectiveOp::kReduceScatter,
          collective_bytes(CollectiveOp::kReduceScatter, count, dtype, size_),
          link_bytes(CollectiveOp::kReduceScatter, count, dtype, 0),
          [this, src, dst, count, dtype, op] {
            const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
            if (options_.simulated_link_only) {
              if (dst != src + rank_ * bytes)
                std::memmove(dst, src + rank_ * bytes, static_cast<std::size_t>(bytes));
            } else {
              run_reduce_scatter(src, dst, count, dtype, op);
            }
          });
}

void MpiProcessGroup::post_exchange(const std::byte* send, std::int64_t send_stride,
                                    std::byte* recv, std::int64_t block_bytes,
                                    std::vector<MPI_Request>& reqs) {
  // Block p of `send` goes to rank p; block p of `recv` comes from rank p; ours is copied.
  reqs.clear();
  const int n = static_cast<int>(block_bytes);
  for (int step = 1; step < size_; ++step) {
    const int from = (rank_ - step + size_) % size_;
    reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
    ZRT_MPI_CHECK(MPI_Irecv(recv + from * block_bytes, n, MPI_BYTE, from, 1, comm_, &reqs.back()));
  }
  for (int step = 1; step < size_; ++step) {
    const int to = (rank_ + step) % size_;
    reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
    ZRT_MPI_CHECK(MPI_Isend(send + to * send_stride, n, MPI_BYTE, to, 1, comm_, &reqs.back()));
  }
  std::memcpy(recv + rank_ * block_bytes, send + rank_ * send_stride,
              static_cast<std::size_t>(block_bytes));
}

// A group of one rank: its reduce-scatter and all-reduce are the input itself (a copy, or
// nothing in place), not the chunked exchange through the scratch.
void MpiProcessGroup::copy_alone(const std::byte* in, std::byte* out, std::int64_t count,
                                 DType dtype) {
  if (in != out) std::memcpy(out, in, static_cast<std::size_t>(count) * dtype_size(dtype));
}

void MpiProcessGroup::run_reduce_scatter(const std::byte* in, std::byte* out, std::int64_t count,
                                         DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (size_ == 1) {
    copy_alone(in, out, count, dtype);
    return;
  }
  if (options_.reduce_scatter_algo == ReduceScatterAlgo::kNative) {
    run_reduce_scatter_native(in, out, count, dtype, op);
    return;
  }
  // Each rank receives every peer's block of its slice (point-to-point, all posted at once),
  // then sums them in rank order. Chunks are double-buffered: chunk k+1 is already posted while
  // chunk k is being summed.
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::string what = describe("reduce_scatter", count, dtype);
  const std::int64_t chunk = chunk_elements(elem, size_);
  const std::int64_t chunks = collective_plan::chunk_count(count, chunk);
  std::vector<MPI_Request> pending[2];
  // Chunk k+1 is posted before chunk k is waited for: a timeout on k abandons both.
  AbandonOnUnwind abandon_on_error(*this, {&pending[0], &pending[1]});
  std::byte* received[2] = {scratch(0, size_ * std::min(chunk, count) * elem),
                            chunks > 1 ? scratch(1, size_ * chunk * elem) : nullptr};
  auto post = [&](std::int64_t k) {
    const collective_plan::Range part = collective_plan::chunk_range(count, chunk, k);
    post_exchange(in + part.first * elem, count * elem, received[k % 2], part.count * elem,
                  pending[k % 2]);
  };
  post(0);
  for (std::int64_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) post(k + 1);
    std::vector<MPI_Request>& reqs = pending[k % 2];
    wait_all(reqs.data(), static_cast<int>(reqs.size()), what);
    const collective_plan::Range part = collective_plan::chunk_range(count, chunk, k);
    reduce_blocks(received[k % 2], part.count, size_, part.count, dtype, op,
                  out + part.first * elem);
  }
}

void MpiProcessGroup::run_reduce_scatter_native(const std::byte* in, std::byte* out,
                                                std::int64_t count, DType dtype, ReduceOp op) {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::string what = describe("reduce_scatter", count, dtype);
  MPI_Request req = MPI_REQUEST_NULL;
  collective_plan::for_each_chunk(
      count, chunk_elements(elem, size_), [&](collective_plan::Range part) {
        const std::int64_t first = part.first;
        const std::int64_t n = part.count;
        // OpenMPI applies predefined reductions to basic types only, so a chunk's strided blocks
        // are packed first (a single chunk is already contiguous). The result goes through
        // scratch so in-place calls stay legal.
        const std::byte* send = in;
        if (n != count) {
          std::byte* packed = scratch(1, size_ * n * elem);
          for (int r = 0; r < size_; ++r) {
            std::memcpy(packed + r * n * elem, in + (r * count + first) * elem,
                        static_cast<std::size_t>(n * elem));
          }
          send = packed;
        }
        std::byte* result = scratch(0, n * elem);
        const MPI_Datatype type = dtype == DType::kFloat32 ? MPI_FLOAT : mpi_int_type(dtype);
        ZRT_MPI_CHECK(MPI_Ireduce_scatter_block(send, result, static_cast<int>(n), type, MPI_SUM,
                                                comm_, &req));
        wait(req, what);
        if (op == ReduceOp::kAvg) {
          auto* f = reinterpret_cast<float*>(result);
          for (std::int64_t i = 0; i < n; ++i) f[i] /= static_cast<float>(size_);
        }
        std::memcpy(out + first * elem, result, static_cast<std::size_t>(n * elem));
      });
}

// ---- all_to_all ------------------------------------------------------------------------------

void MpiProcessGroup::all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                 std::int64_t count, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_to_all(src, dst, count, dtype);
  enqueue(CollectiveOp::kAllToAll, collective_bytes(CollectiveOp::kAllToAll, count, dtype, size_),
          link_bytes(CollectiveOp::kAllToAll, count, dtype, 0), [this, src, dst, count, dtype] {
            const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
            if (options_.simulated_link_only)
              run_local_all_gather(src + rank_ * bytes, dst, bytes);  // block `rank` of every peer
            else
              run_all_to_all(src, dst, count, dtype);
          });
}

void MpiProcessGroup::run_all_to_all(const std::byte* in, std::byte* out, std::int64_t count,
                                     DType dtype) {
  if (count == 0) return;
  const std::int64_t block = count * static_cast<std::int64_t>(dtype_size(dtype));
  const auto copy_mine = [&] {
    std::memcpy(out + rank_ * block, in + rank_ * block, static_cast<std::size_t>(block));
  };
  if (size_ == 1) {
    copy_mine();
    return;
  }
  exchange_blocks(in, block, out, block, 2, describe("all_to_all", count, dtype), copy_mine);
}

// ---- all_to_allv -----------------------------------------------------------------------------

void MpiProcessGroup::all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                  const AllToAllvLayout& layout, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_to_allv(src, dst, layout, dtype);
  const std::int64_t received = layout.recv_total() * static_cast<std::int64_t>(dtype_size(dtype));
  enqueue(CollectiveOp::kAllToAll, received, all_to_allv_link_bytes(layout, dtype),
          [this, src, dst, layout, dtype] {
            const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
            const auto self = static_cast<std::size_t>(rank_);
            if (options_.simulated_link_only) {  // this rank's own piece only
              std::memcpy(dst + layout.recv_offsets[self] * elem,
                          src + layout.send_offsets[self] * elem,
                          static_cast<std::size_t>(layout.send_counts[self] * elem));
              return;
            }
            run_all_to_allv(src, dst, layout, dtype);
          });
}

void MpiProcessGroup::run_all_to_allv(const std::byte* in, std::byte* out,
                                      const AllToAllvLayout& layout, DType dtype) {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::string what = fmt::format("all_to_allv of {} on group '{}' (rank {} of {})",
                                       dtype_name(dtype), name_, rank_, size_);
  // One message per piece of at most byte_chunk() bytes, and one empty message for an empty
  // piece: the pairs match by order on the tag, whatever the counts.
  constexpr int kTag = 3;
  const std::int64_t chunk = byte_chunk();
  const auto pieces = [&](std::int64_t bytes) {
    return std::max<std::int64_t>(1, collective_plan::chunk_count(bytes, chunk));
  };
  std::vector<MPI_Request>& reqs = requests_;
  reqs.clear();
  AbandonOnUnwind abandon_on_error(*this, {&reqs});
  struct Expected {
    int peer;
    std::int64_t bytes;
  };
  std::vector<Expected> expected;  // per receive request, its size
  for (int step = 1; step < size_; ++step) {
    const int from = (rank_ - step + size_) % size_;
    const auto p = static_cast<std::size_t>(from);
    const std::int64_t bytes = layout.recv_counts[p] * elem;
    std::byte* base = out + layout.recv_offsets[p] * elem;
    for (std::int64_t k = 0; k < pieces(bytes); ++k) {
      const std::int64_t first = k * chunk;
      const std::int64_t n = std::min(chunk, bytes - first);
      reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
      expected.push_back({from, std::max<std::int64_t>(n, 0)});
      ZRT_MPI_CHECK(MPI_Irecv(base + first, static_cast<int>(std::max<std::int64_t>(n, 0)),
                              MPI_BYTE, from, kTag, comm_, &reqs.back()));
    }
  }
  const std::size_t receives = reqs.size();
  for (int step = 1; step < size_; ++step) {
    const int to = (rank_ + step) % size_;
    const auto p = static_cast<std::size_t>(to);
    const std::int64_t bytes = layout.send_counts[p] * elem;
    const std::byte* base = in + layout.send_offsets[p] * elem;
    for (std::int64_t k = 0; k < pieces(bytes); ++k) {
      const std::int64_t first = k * chunk;
      const std::int64_t n = std::min(chunk, bytes - first);
      reqs.push_back(MPI_REQUEST_NULL);  // stays null if the post fails
      ZRT_MPI_CHECK(MPI_Isend(base + first, static_cast<int>(std::max<std::int64_t>(n, 0)),
                              MPI_BYTE, to, kTag, comm_, &reqs.back()));
    }
  }
  const auto self = static_cast<std::size_t>(rank_);
  std::memcpy(out + layout.recv_offsets[self] * elem, in + layout.send_offsets[self] * elem,
              static_cast<std::size_t>(layout.send_counts[self] * elem));
  std::vector<MPI_Status> statuses(reqs.size());
  wait_all(reqs.data(), static_cast<int>(reqs.size()), what, statuses.data());
  for (std::size_t i = 0; i < receives; ++i) {
    int got = 0;
    ZRT_MPI_CHECK(MPI_Get_count(&statuses[i], MPI_BYTE, &got));
    ZRT_CHECK(got == expected[i].bytes,
              "{}: rank {} sent {} bytes where this rank expected {} (its receive counts must "
              "be what each peer sends it: exchange the counts first)",
              what, expected[i].peer, got, expected[i].bytes);
  }
}

// ---- all_reduce ------------------------------------------------------------------------------

void MpiProcessGroup::all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                 std::int64_t count, DType dtype, ReduceOp op) {
  check_all_reduce_op(count, dtype, op);
  // Integers go through MPI's own all-reduce in one call (int count).
  ZRT_CHECK(is_floating(dtype) || count <= INT_MAX,
            "integer all_reduce of {} elements is too large", count);
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_reduce_buffers(src, dst, count, dtype);
  const std::int64_t chunk =
      is_floating(dtype) ? chunk_elements(static_cast<std::int64_t>(dtype_size(dtype)), size_)
                         : std::max<std::int64_t>(count, 1);  // integers: one MPI call
  enqueue(CollectiveOp::kAllReduce, collective_bytes(CollectiveOp::kAllReduce, count, dtype, size_),
          link_bytes(CollectiveOp::kAllReduce, count, dtype, chunk),
          [this, src, dst, count, dtype, op] {
            const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
            if (!options_.simulated_link_only)
              run_all_reduce(src, dst, count, dtype, op);
            else if (dst != src)
              std::memmove(dst, src, static_cast<std::size_t>(bytes));
          });
}

void MpiProcessGroup::run_all_reduce(const std::byte* in, std::byte* out, std::int64_t count,
                                     DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (size_ == 1) {
    copy_alone(in, out, count, dtype);
    return;
  }
  const std::string what = describe("all_reduce", count, dtype);
  MPI_Request req = MPI_REQUEST_NULL;
  if (!is_floating(dtype)) {
    // Integer sums and maxima are exact in any order: MPI's own all-reduce is fine.
    ZRT_MPI_CHECK(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count),
                                 mpi_int_type(dtype), op == ReduceOp::kMax ? MPI_MAX : MPI_SUM,
                                 comm_, &req));
    wait(req, what);
    return;
  }
  // Floats: reduce-scatter then all-gather over a zero-padded copy, so every rank computes
  // the same sums in the same order and the replicas stay bit-identical.
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  collective_plan::for_each_all_reduce_piece(
      count, size_, chunk_elements(elem, size_), [&](const collective_plan::AllReducePiece& piece) {
        const std::int64_t slice = piece.slice;
        const std::int64_t padded_bytes = piece.padded(size_) * elem;
        std::byte* work = scratch(1, padded_bytes);
        std::byte* received = scratch(0, padded_bytes);
        std::memcpy(work, in + piece.input.first * elem,
                    static_cast<std::size_t>(piece.input.count * elem));
        std::memset(work + piece.input.count * elem, 0,
                    static_cast<std::size_t>(piece.padding(size_) * elem));
        AbandonOnUnwind abandon_on_error(*this, {&requests_});  // a failed post
        post_exchange(work, slice * elem, received, slice * elem, requests_);
        wait_all(requests_.data(), static_cast<int>(requests_.size()), what);
        reduce_blocks(received, slice, size_, slice, dtype, op, work + rank_ * slice * elem);
        run_all_gather(work + rank_ * slice * elem, work, slice, dtype);
        std::memcpy(out + piece.input.first * elem, work,
                    static_cast<std::size_t>(piece.input.count * elem));
      });
}

// ---- broadcast, barrier, split ---------------------------------------------------------------

void MpiProcessGroup::broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype,
                                int root) {
  check_broadcast(count, root);
  std::byte* data = device_access::raw(buf);
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  enqueue(CollectiveOp::kBroadcast, collective_bytes(CollectiveOp::kBroadcast, count, dtype, size_),
          link_bytes(CollectiveOp::kBroadcast, count, dtype, 0, root),
          [this, data, bytes, root, what = describe("broadcast", count, dtype)] {
            if (options_.simulated_link_only) return;  // every rank holds the same data
            collective_plan::for_each_chunk(bytes, byte_chunk(), [&](collective_plan::Range piece) {
              MPI_Request req = MPI_REQUEST_NULL;
              ZRT_MPI_CHECK(MPI_Ibcast(data + piece.first, static_cast<int>(piece.count), MPI_BYTE,
                                       root, comm_, &req));
              wait(req, what);
            });
          });
}

void MpiProcessGroup::barrier() {
  check_barrier();
  enqueue(CollectiveOp::kBarrier, 0, {}, [this] {
    if (options_.simulated_link_only) return;
    MPI_Request req = MPI_REQUEST_NULL;
    ZRT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    wait(req, fmt::format("barrier on group '{}' (rank {} of {})", name_, rank_, size_));
  });
}

std::unique_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key, Stream& stream,
                                                     const std::string& name) {
  // MPI_Comm_split is a collective on comm_, so it must run in the group's stream order,
  // never concurrently with the worker's operations.
  MPI_Comm child = MPI_COMM_NULL;
  cpu_stream_.enqueue([this, color, key, &child, name] {
    const Watchdog::Watch watch =
        options_.watchdog
            ? options_.watchdog->watch(fmt::format("MPI_Comm_split creating group '{}'", name))
            : Watchdog::Watch();
    ZRT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
  });
  stream_->synchronize();
  return std::unique_ptr<ProcessGroup>(
      new MpiProcessGroup(Adopt{}, device_, child, stream, name, options_));
}

}  // namespace zrt
