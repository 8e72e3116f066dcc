#include "runtime/comm/nccl_process_group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/comm/collective_plan.h"
#include "runtime/comm/cuda_reduce_kernels.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/polled_wait.h"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device_impl.h"
#include "runtime/device/device_access.h"

namespace zrt {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  ZRT_THROW(InvalidArgument, "no NCCL type for dtype {}", static_cast<int>(dtype));
}

// " (NCCL's last error text)" or nothing.
std::string last_error_text(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  if (text == nullptr || *text == '\0') return {};
  return fmt::format(" ({})", text);
}

ncclConfig_t nonblocking_config(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return ncclInProgress; we poll, so everything can time out
  config.commName = name.c_str();
  return config;
}

}  // namespace

void check_nccl(ncclResult_t code, const char* call, const char* file, int line) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  throw Error(
      file, line,
      fmt::format("{} failed: {}{}", call, ncclGetErrorString(code), last_error_text(nullptr)));
}

std::unique_ptr<ProcessGroup> make_nccl_process_group(Device& device, MPI_Comm parent,
                                                      Stream& stream, const std::string& name,
                                                      const CommOptions& options) {
  return std::make_unique<NcclProcessGroup>(device, parent, stream, name, options);
}

// ---- construction and teardown ---------------------------------------------------------------

NcclProcessGroup::NcclProcessGroup(Device& device, MPI_Comm parent, Stream& stream,
                                   std::string name, CommOptions options)
    : ProcessGroup(0, 1, std::move(name), &stream),
      device_(device),
      device_index_(as_cuda_device(device, "NcclProcessGroup").index()),
      cuda_stream_(as_cuda_stream(stream, "NcclProcessGroup").handle()),
      options_(options) {
  ZRT_CHECK(as_cuda_stream(stream, "NcclProcessGroup").device() == device_index_,
            "group '{}': stream '{}' belongs to another GPU than {}", name_, stream.name(),
            device.description());
  // The device must be current before the communicator is created: NCCL binds to it.
  ZRT_CUDA_CHECK(cudaSetDevice(device_index_));

  // Bootstrap on a duplicate of the parent, so no other traffic on parent can interleave.
  MPI_Comm boot = MPI_COMM_NULL;
  ZRT_MPI_CHECK(MPI_Comm_dup(parent, &boot));
  ZRT_MPI_CHECK(MPI_Comm_set_errhandler(boot, MPI_ERRORS_RETURN));
  ZRT_MPI_CHECK(MPI_Comm_rank(boot, &rank_));
  ZRT_MPI_CHECK(MPI_Comm_size(boot, &size_));
  reset_node_map();
  const std::string what =
      fmt::format("NCCL communicator init of group '{}' (rank {} of {})", name_, rank_, size_);

  // Rank 0's ncclGetUniqueId result travels with the id, so a failure there fails every rank
  // instead of leaving the others waiting.
  struct Bootstrap {
    ncclUniqueId id;
    int result;
  } bootstrap;
  std::memset(&bootstrap, 0, sizeof bootstrap);
  if (rank_ == 0) bootstrap.result = static_cast<int>(ncclGetUniqueId(&bootstrap.id));
  MPI_Request req = MPI_REQUEST_NULL;
  ZRT_MPI_CHECK(
      MPI_Ibcast(&bootstrap, static_cast<int>(sizeof bootstrap), MPI_BYTE, 0, boot, &req));
  // On a timeout the request is still pending, so `boot` cannot be freed: it is leaked (as the
  // MPI backend does). The watchdog is not told: group creation fails on every rank alike.
  polled_wait(
      {options_.timeout_s, PollPace::kBackoff, nullptr},
      [&] {
        int done = 0;
        ZRT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      [&] {
        return fmt::format(
            "{}: the ncclUniqueId broadcast did not complete within {:.1f} s "
            "(comm_timeout_s): a peer rank died, stalled, or created groups in another order",
            what, options_.timeout_s);
      });
  ZRT_MPI_CHECK(MPI_Comm_free(&boot));
  const auto id_result = static_cast<ncclResult_t>(bootstrap.result);
  if (id_result != ncclSuccess) {
    ZRT_THROW(Error, "{}: ncclGetUniqueId failed on rank 0: {}", what,
              ncclGetErrorString(id_result));
  }

  ncclConfig_t config = nonblocking_config(name_);
  await(comm_, ncclCommInitRankConfig(&comm_, size_, bootstrap.id, rank_, &config),
        "ncclCommInitRankConfig", what);
  try {
    ZRT_CUDA_CHECK(cudaEventCreateWithFlags(&sync_event_, cudaEventDisableTiming));
    barrier_word_ = device_.allocate(sizeof(std::int32_t), MemCategory::kComm,
                                     fmt::format("group '{}' barrier word", name_),
                                     MemorySpace::kDevice, stream_);
    device_.fill_zero(barrier_word_.device<std::byte>(), sizeof(std::int32_t), *stream_);
  } catch (...) {
    if (sync_event_ != nullptr) cudaEventDestroy(sync_event_);
    ncclCommAbort(comm_);
    throw;
  }
}

NcclProcessGroup::NcclProcessGroup(Adopt, Device& device, ncclComm_t comm, Stream& stream,
                                   std::string name, CommOptions options)
    : ProcessGroup(0, 1, std::move(name), &stream),
      device_(device),
      device_index_(as_cuda_device(device, "NcclProcessGroup").index()),
      cuda_stream_(as_cuda_stream(stream, "NcclProcessGroup").handle()),
      options_(options),
      comm_(comm) {
  try {
    ZRT_CHECK(as_cuda_stream(stream, "NcclProcessGroup").device() == device_index_,
              "group '{}': stream '{}' belongs to another GPU than {}", name_, stream.name(),
              device.description());
    ZRT_CUDA_CHECK(cudaSetDevice(device_index_));
    ZRT_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    ZRT_NCCL_CHECK(ncclCommCount(comm_, &size_));
    reset_node_map();
    ZRT_CUDA_CHECK(cudaEventCreateWithFlags(&sync_event_, cudaEventDisableTiming));
    barrier_word_ = device_.allocate(sizeof(std::int32_t), MemCategory::kComm,
                                     fmt::format("group '{}' barrier word", name_),
                                     MemorySpace::kDevice, stream_);
    device_.fill_zero(barrier_word_.device<std::byte>(), sizeof(std::int32_t), *stream_);
  } catch (...) {
    if (sync_event_ != nullptr) cudaEventDestroy(sync_event_);
    ncclCommAbort(comm_);
    throw;
  }
}

NcclProcessGroup::~NcclProcessGroup() {
  if (comm_ != nullptr) {
    try {
      prepare("closing the group");
      wait_idle(last_op_.empty() ? fmt::format("work on group '{}'", name_) : last_op_);
      // Finalize flushes the communicator's internal work and quiesces it with its peers; it is
      // non-blocking here, so poll it (bounded by timeout_s) before the local destroy.
      await(comm_, ncclCommFinalize(comm_), "ncclCommFinalize",
            fmt::format("finalize of group '{}' (rank {} of {})", name_, rank_, size_));
      const ncclResult_t result = ncclCommDestroy(comm_);
      comm_ = nullptr;
      if (result != ncclSuccess && result != ncclInProgress) {
        spdlog::error("ncclCommDestroy of group '{}' failed: {}", name_,
                      ncclGetErrorString(result));
      }
    } catch (const std::exception& e) {
      // await/synchronize abort the communicator on NCCL errors and timeouts; abort it here for
      // anything else (a CUDA error).
      spdlog::warn("group '{}' closes after an error: {}", name_, e.what());
      if (comm_ != nullptr) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
    }
  }
  if (sync_event_ != nullptr) cudaEventDestroy(sync_event_);
  // barrier_word_ and scratch_ release themselves, ordered on the stream.
}

// ---- helpers ---------------------------------------------------------------------------------

void NcclProcessGroup::prepare(const std::string& what) {
  if (comm_ == nullptr) {
    ZRT_THROW(Error, "{}: the group's communicator was aborted after an earlier failure: {}", what,
              failure_);
  }
  ZRT_CUDA_CHECK(cudaSetDevice(device_index_));
}

void NcclProcessGroup::abort(ncclComm_t& comm, const std::string& message) {
  if (&comm == &comm_) failure_ = message;
  if (comm != nullptr) {
    // Abort also stops NCCL kernels still waiting on the GPU, so the stream drains.
    const ncclResult_t result = ncclCommAbort(comm);
    if (result != ncclSuccess && result != ncclInProgress) {
      spdlog::error("ncclCommAbort failed: {}", ncclGetErrorString(result));
    }
    comm = nullptr;
  }
}

void NcclProcessGroup::fail(ncclComm_t& comm, const std::string& message) {
  abort(comm, message);
  throw Error(__FILE__, __LINE__, message);
}

template <typename IsDone, typename TimeoutText>
void NcclProcessGroup::poll(ncclComm_t& comm, IsDone&& is_done, TimeoutText&& timeout_text) {
  Watchdog* watchdog = options_.watchdog.get();
  polled_wait({options_.timeout_s, PollPace::kBackoff, watchdog}, is_done, [&] {
    const std::string message = timeout_text();
    abort(comm, message);
    // NCCL does not say which peer is missing; the watchdog adds the step and ends the run.
    return watchdog && watchdog->step() > 0
               ? fmt::format("{} (training step {})", message, watchdog->step())
               : message;
  });
}

void NcclProcessGroup::await(ncclComm_t& comm, ncclResult_t result, const char* call,
                             const std::string& what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    fail(comm, fmt::format("{} failed for {}: {}{}", call, what, ncclGetErrorString(result),
                           last_error_text(comm)));
  }
  if (comm == nullptr) {
    fail(comm, fmt::format("{} returned no communicator for {}", call, what));
  }
  // A non-blocking communicator reports ncclInProgress until the operation is enqueued (or the
  // communicator initialised); no other call may be made on it before that.
  poll(
      comm,
      [&] {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
        if (queried != ncclSuccess) {
          fail(comm, fmt::format("ncclCommGetAsyncError failed for {}: {}", what,
                                 ncclGetErrorString(queried)));
        }
        if (state == ncclSuccess) return true;
        if (state != ncclInProgress) {
          fail(comm, fmt::format("{} failed for {}: {}{}", call, what, ncclGetErrorString(state),
                                 last_error_text(comm)));
        }
        return false;
      },
      [&] {
        return fmt::format(
            "{} did not complete within {:.1f} s (comm_timeout_s): a peer rank died, "
            "stalled, or issued collectives in another order",
            what, options_.timeout_s);
      });
}

void NcclProcessGroup::check_async_error() {
  if (comm_ == nullptr) {
    ZRT_THROW(Error, "group '{}' was aborted after an earlier failure: {}", name_, failure_);
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
  if (queried != ncclSuccess) {
    fail(comm_, fmt::format("ncclCommGetAsyncError failed on group '{}': {}", name_,
                            ncclGetErrorString(queried)));
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    fail(comm_,
         fmt::format("NCCL reported an asynchronous error on group '{}' (rank {} of {}){}: {}{}",
                     name_, rank_, size_, last_op_.empty() ? "" : " after " + last_op_,
                     ncclGetErrorString(state), last_error_text(comm_)));
  }
}

void NcclProcessGroup::synchronize() {
  const std::string what = last_op_.empty() ? fmt::format("work on group '{}'", name_) : last_op_;
  prepare(what);
  wait_idle(what);
  stream_->synchronize();  // done already; rethrows a host-callback error of the stream
}

void NcclProcessGroup::wait_idle(const std::string& what) {
  ZRT_CUDA_CHECK(cudaEventRecord(sync_event_, cuda_stream_));
  poll(
      comm_,
      [&] {
        if (cuda_event_complete(sync_event_)) return true;
        check_async_error();
        return false;
      },
      [&] {
        return fmt::format(
            "{} (or earlier work on stream '{}') did not complete within {:.1f} s "
            "(comm_timeout_s): a peer rank died, stalled, or issued collectives in "
            "another order",
            what, stream_->name(), options_.timeout_s);
      });
  check_async_error();
}

std::byte* NcclProcessGroup::scratch(int which, std::int64_t bytes) {
  Buffer& buf = scratch_[which];
  if (buf.bytes() < bytes) {
    buf.reset();  // cudaFreeAsync on the stream: after the work that used it
    buf = device_.allocate(bytes, MemCategory::kComm,
                           fmt::format("group '{}' collective scratch", name_),
                           MemorySpace::kDevice, stream_);
  }
  return device_access::raw(buf.device<std::byte>());
}

std::int64_t NcclProcessGroup::chunk_elements(std::int64_t elem_bytes, int parts) const {
  // NCCL counts are size_t: only the scratch memory bounds a chunk.
  return collective_plan::chunk_elements(options_.max_chunk_bytes, elem_bytes, parts);
}

void NcclProcessGroup::all_to_all(const std::byte* send, std::int64_t send_stride_bytes,
                                  std::byte* recv, std::int64_t n, DType dtype,
                                  const std::string& what) {
  const auto block_bytes = n * static_cast<std::int64_t>(dtype_size(dtype));
  ZRT_CUDA_CHECK(cudaMemcpyAsync(recv + rank_ * block_bytes, send + rank_ * send_stride_bytes,
                                 static_cast<std::size_t>(block_bytes), cudaMemcpyDeviceToDevice,
                                 cuda_stream_));
  if (size_ == 1) return;
  const ncclDataType_t type = nccl_type(dtype);
  const auto elements = static_cast<std::size_t>(n);
  ZRT_NCCL_CHECK(ncclGroupStart());
  ncclResult_t first_error = ncclSuccess;
  const char* failed_call = nullptr;
  auto note = [&](ncclResult_t result, const char* call) {
    if (first_error == ncclSuccess && result != ncclSuccess && result != ncclInProgress) {
      first_error = result;
      failed_call = call;
    }
  };
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    note(ncclSend(send + peer * send_stride_bytes, elements, type, peer, comm_, cuda_stream_),
         "ncclSend");
    note(ncclRecv(recv + peer * block_bytes, elements, type, peer, comm_, cuda_stream_),
         "ncclRecv");
  }
  const ncclResult_t ended = ncclGroupEnd();  // always close the group, even after an error
  if (first_error != ncclSuccess) await(comm_, first_error, failed_call, what);
  await(comm_, ended, "ncclGroupEnd (all-to-all of ncclSend/ncclRecv)", what);
}

// ---- all_gather ------------------------------------------------------------------------------

void NcclProcessGroup::all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                  std::int64_t count, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_gather(src, dst, count, dtype);
  const std::string what = describe("all_gather", count, dtype);
  prepare(what);
  stats_.add(CollectiveOp::kAllGather,
             collective_bytes(CollectiveOp::kAllGather, count, dtype, size_),
             link_bytes(CollectiveOp::kAllGather, count, dtype, 0));
  last_op_ = what;
  if (count == 0) return;
  // NCCL's all-gather is in place when sendbuff == recvbuff + rank*sendcount, as ours.
  await(comm_,
        ncclAllGather(src, dst, static_cast<std::size_t>(count), nccl_type(dtype), comm_,
                      cuda_stream_),
        "ncclAllGather", what);
}

// A group of one rank: its reduce-scatter and all-reduce (sum, average or maximum over itself)
// are the input, so the output is a copy of it, or nothing in place. The chunked algorithms
// below would copy it into the scratch and back (the all-reduce four times): at stage 3 on one
// GPU, every gradient twice a micro-batch.
void NcclProcessGroup::copy_alone(const std::byte* in, std::byte* out, std::int64_t count,
                                  DType dtype) {
  if (in == out) return;
  ZRT_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<std::size_t>(count) * dtype_size(dtype),
                                 cudaMemcpyDeviceToDevice, cuda_stream_));
}

// ---- reduce_scatter --------------------------------------------------------------------------

void NcclProcessGroup::reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                      std::int64_t count, DType dtype, ReduceOp op) {
  check_reduce_scatter_op(count, dtype, op);
  // Before the buffer checks, which depend on the rank (see check_reduce_scatter_op).
  if (options_.reduce_scatter_algo == ReduceScatterAlgo::kNative) {
    ZRT_CHECK(dtype == DType::kFloat32 || !is_floating(dtype),
              "the native NCCL reduce-scatter would sum {} in {} in an order of NCCL's choosing; "
              "use the alltoall algorithm",
              dtype_name(dtype), dtype_name(dtype));
  }
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_reduce_scatter_buffers(src, dst, count, dtype);
  const std::string what = describe("reduce_scatter", count, dtype);
  prepare(what);
  stats_.add(CollectiveOp::kReduceScatter,
             collective_bytes(CollectiveOp::kReduceScatter, count, dtype, size_),
             link_bytes(CollectiveOp::kReduceScatter, count, dtype, 0));
  last_op_ = what;
  run_reduce_scatter(src, dst, count, dtype, op, what);
}

void NcclProcessGroup::run_reduce_scatter(const std::byte* in, std::byte* out, std::int64_t count,
                                          DType dtype, ReduceOp op, const std::string& what) {
  if (count == 0) return;
  if (size_ == 1) {
    copy_alone(in, out, count, dtype);
    return;
  }
  if (options_.reduce_scatter_algo == ReduceScatterAlgo::kNative) {
    // In place is native too (recvbuff == sendbuff + rank*recvcount).
    await(comm_,
          ncclReduceScatter(in, out, static_cast<std::size_t>(count), nccl_type(dtype),
                            op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, cuda_stream_),
          "ncclReduceScatter", what);
    return;
  }
  // All-to-all + local fp32 sum in rank order, chunked to bound the scratch. In place works:
  // chunk c writes only out[c], and later chunks never send that part of this rank's block.
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  collective_plan::for_each_chunk(
      count, chunk_elements(elem, size_), [&](collective_plan::Range part) {
        std::byte* received = scratch(0, size_ * part.count * elem);
        all_to_all(in + part.first * elem, count * elem, received, part.count, dtype, what);
        cuda_reduce_blocks(received, part.count, size_, part.count, dtype, op,
                           out + part.first * elem, cuda_stream_);
      });
}

// ---- all_to_all ------------------------------------------------------------------------------

void NcclProcessGroup::all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                  std::int64_t count, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_to_all(src, dst, count, dtype);
  const std::string what = describe("all_to_all", count, dtype);
  prepare(what);
  stats_.add(CollectiveOp::kAllToAll,
             collective_bytes(CollectiveOp::kAllToAll, count, dtype, size_),
             link_bytes(CollectiveOp::kAllToAll, count, dtype, 0));
  last_op_ = what;
  if (count == 0) return;
  all_to_all(src, count * static_cast<std::int64_t>(dtype_size(dtype)), dst, count, dtype, what);
}

// ---- all_to_allv -----------------------------------------------------------------------------

void NcclProcessGroup::all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                   const AllToAllvLayout& layout, DType dtype) {
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_to_allv(src, dst, layout, dtype);
  const std::string what = fmt::format("all_to_allv of {} on group '{}' (rank {} of {})",
                                       dtype_name(dtype), name_, rank_, size_);
  prepare(what);
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  stats_.add(CollectiveOp::kAllToAll, layout.recv_total() * elem,
             all_to_allv_link_bytes(layout, dtype));
  last_op_ = what;
  const auto self = static_cast<std::size_t>(rank_);
  if (layout.send_counts[self] > 0) {
    ZRT_CUDA_CHECK(cudaMemcpyAsync(dst + layout.recv_offsets[self] * elem,
                                   src + layout.send_offsets[self] * elem,
                                   static_cast<std::size_t>(layout.send_counts[self] * elem),
                                   cudaMemcpyDeviceToDevice, cuda_stream_));
  }
  if (size_ == 1) return;
  const ncclDataType_t type = nccl_type(dtype);
  ZRT_NCCL_CHECK(ncclGroupStart());
  ncclResult_t first_error = ncclSuccess;
  const char* failed_call = nullptr;
  auto note = [&](ncclResult_t result, const char* call) {
    if (first_error == ncclSuccess && result != ncclSuccess && result != ncclInProgress) {
      first_error = result;
      failed_call = call;
    }
  };
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const auto p = static_cast<std::size_t>(peer);
    // An empty piece points at the buffer itself: its offset may be the buffer's end.
    const std::int64_t sends = layout.send_counts[p], receives = layout.recv_counts[p];
    note(ncclSend(sends > 0 ? src + layout.send_offsets[p] * elem : src,
                  static_cast<std::size_t>(sends), type, peer, comm_, cuda_stream_),
         "ncclSend");
    note(ncclRecv(receives > 0 ? dst + layout.recv_offsets[p] * elem : dst,
                  static_cast<std::size_t>(receives), type, peer, comm_, cuda_stream_),
         "ncclRecv");
  }
  const ncclResult_t ended = ncclGroupEnd();  // always close the group, even after an error
  if (first_error != ncclSuccess) await(comm_, first_error, failed_call, what);
  await(comm_, ended, "ncclGroupEnd (all_to_allv of ncclSend/ncclRecv)", what);
}

// ---- all_reduce ------------------------------------------------------------------------------

void NcclProcessGroup::all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                                  std::int64_t count, DType dtype, ReduceOp op) {
  check_all_reduce_op(count, dtype, op);
  const std::byte* src = device_access::raw(in);
  std::byte* dst = device_access::raw(out);
  check_all_reduce_buffers(src, dst, count, dtype);
  const std::string what = describe("all_reduce", count, dtype);
  prepare(what);
  const std::int64_t chunk =
      is_floating(dtype) ? chunk_elements(static_cast<std::int64_t>(dtype_size(dtype)), size_)
                         : std::max<std::int64_t>(count, 1);  // integers: one NCCL call
  stats_.add(CollectiveOp::kAllReduce,
             collective_bytes(CollectiveOp::kAllReduce, count, dtype, size_),
             link_bytes(CollectiveOp::kAllReduce, count, dtype, chunk));
  last_op_ = what;
  run_all_reduce(src, dst, count, dtype, op, what);
}

void NcclProcessGroup::run_all_reduce(const std::byte* in, std::byte* out, std::int64_t count,
                                      DType dtype, ReduceOp op, const std::string& what) {
  if (count == 0) return;
  if (size_ == 1) {
    copy_alone(in, out, count, dtype);
    return;
  }
  if (!is_floating(dtype)) {
    // Integer sums and maxima are exact in any order: NCCL's own all-reduce is fine.
    await(comm_,
          ncclAllReduce(in, out, static_cast<std::size_t>(count), nccl_type(dtype),
                        op == ReduceOp::kMax ? ncclMax : ncclSum, comm_, cuda_stream_),
          "ncclAllReduce", what);
    return;
  }
  // Floats: reduce-scatter then all-gather over a zero-padded copy, so every rank computes
  // the same sums in the same order and the replicas stay bit-identical.
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  collective_plan::for_each_all_reduce_piece(
      count, size_, chunk_elements(elem, size_), [&](const collective_plan::AllReducePiece& piece) {
        const std::int64_t slice = piece.slice;
        const std::int64_t input_bytes = piece.input.count * elem;
        const std::int64_t padded_bytes = piece.padded(size_) * elem;
        std::byte* work = scratch(1, padded_bytes);
        std::byte* received = scratch(0, padded_bytes);
        ZRT_CUDA_CHECK(cudaMemcpyAsync(work, in + piece.input.first * elem,
                                       static_cast<std::size_t>(input_bytes),
                                       cudaMemcpyDeviceToDevice, cuda_stream_));
        if (piece.padding(size_) > 0) {
          ZRT_CUDA_CHECK(cudaMemsetAsync(work + input_bytes, 0,
                                         static_cast<std::size_t>(padded_bytes - input_bytes),
                                         cuda_stream_));
        }
        all_to_all(work, slice * elem, received, slice, dtype, what);
        std::byte* mine = work + rank_ * slice * elem;
        cuda_reduce_blocks(received, slice, size_, slice, dtype, op, mine, cuda_stream_);
        if (size_ > 1) {
          await(comm_,
                ncclAllGather(mine, work, static_cast<std::size_t>(slice), nccl_type(dtype), comm_,
                              cuda_stream_),
                "ncclAllGather", what);
        }
        ZRT_CUDA_CHECK(cudaMemcpyAsync(out + piece.input.first * elem, work,
                                       static_cast<std::size_t>(input_bytes),
                                       cudaMemcpyDeviceToDevice, cuda_stream_));
      });
}

// ---- broadcast, barrier, split ---------------------------------------------------------------

void NcclProcessGroup::broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype,
                                 int root) {
  check_broadcast(count, root);
  std::byte* data = device_access::raw(buf);
  const std::string what = describe("broadcast", count, dtype);
  prepare(what);
  stats_.add(CollectiveOp::kBroadcast,
             collective_bytes(CollectiveOp::kBroadcast, count, dtype, size_),
             link_bytes(CollectiveOp::kBroadcast, count, dtype, 0, root));
  last_op_ = what;
  if (count == 0) return;
  await(comm_,
        ncclBroadcast(data, data, static_cast<std::size_t>(count), nccl_type(dtype), root, comm_,
                      cuda_stream_),
        "ncclBroadcast", what);
}

void NcclProcessGroup::barrier() {
  check_barrier();
  const std::string what =
      fmt::format("barrier on group '{}' (rank {} of {})", name_, rank_, size_);
  prepare(what);
  stats_.add(CollectiveOp::kBarrier, 0);
  last_op_ = what;
  // A one-word all-reduce: no rank's later stream work starts before every rank reached it.
  std::int32_t* word = device_access::raw(barrier_word_.device<std::int32_t>());
  await(comm_, ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm_, cuda_stream_),
        "ncclAllReduce (barrier)", what);
}

std::unique_ptr<ProcessGroup> NcclProcessGroup::split(int color, int key, Stream& stream,
                                                      const std::string& name) {
  ZRT_CHECK(color >= 0, "split of group '{}' with colour {}: colours must be >= 0", name_, color);
  CudaStream& child_stream = as_cuda_stream(stream, "NcclProcessGroup::split");
  ZRT_CHECK(child_stream.device() == device_index_,
            "split of group '{}': stream '{}' belongs to another GPU", name_, stream.name());
  const std::string what = fmt::format(
      "split of group '{}' (rank {} of {}) into '{}' (colour {}, "
      "key {})",
      name_, rank_, size_, name, color, key);
  prepare(what);
  ncclConfig_t config = nonblocking_config(name);
  ncclComm_t child = nullptr;
  const ncclResult_t result = ncclCommSplit(comm_, color, key, &child, &config);
  try {
    // Non-blocking: the parent reports the split's progress, the child its own initialisation.
    await(comm_, result, "ncclCommSplit", what);
  } catch (...) {
    if (child != nullptr) ncclCommAbort(child);
    throw;
  }
  await(child, ncclSuccess, "ncclCommSplit", what);
  return std::unique_ptr<ProcessGroup>(
      new NcclProcessGroup(Adopt{}, device_, child, stream, name, options_));
}

}  // namespace zrt
