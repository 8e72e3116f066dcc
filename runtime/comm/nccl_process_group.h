// The CUDA backend's collectives: NCCL communicators (the ncclUniqueId broadcast over MPI),
// created non-blocking so a stuck operation can be detected (ncclCommGetAsyncError) and
// aborted (ncclCommAbort) after CommOptions::timeout_s. Built only when ZRT_HAVE_CUDA.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "runtime/comm/process_group.h"

namespace zrt {

// Checks an NCCL return code (ncclInProgress counts as success: non-blocking communicators
// return it while an operation is still being enqueued); throws with ncclGetErrorString.
void check_nccl(ncclResult_t code, const char* call, const char* file, int line);

// Collective over parent. The device must be a CUDA device and `stream` one of its streams.
std::unique_ptr<ProcessGroup> make_nccl_process_group(Device& device, MPI_Comm parent,
                                                      Stream& stream, const std::string& name,
                                                      const CommOptions& options);

// A ProcessGroup on one non-blocking NCCL communicator, issuing on one CUDA stream. Driven by
// one thread (the one that owns the stream); not thread-safe.
//
// Every call enqueues its work on the stream and returns once NCCL has enqueued it (a
// non-blocking communicator may need peers to connect first: that wait is bounded by
// CommOptions::timeout_s). Argument errors and NCCL errors are thrown by the call itself.
//
// Reduce-scatter (and the float all-reduce built from it) is an all-to-all of ncclSend/ncclRecv
// pairs into a scratch buffer followed by cuda_reduce_blocks, so results are summed in fp32 in
// rank order and match the MPI backend bit for bit. Integer all-reduce and broadcast use NCCL's
// own collectives (exact in any order).
//
// Detecting a stuck collective: once enqueued, an operation runs on the GPU, and a peer that
// never joins leaves the NCCL kernel waiting forever; Stream::synchronize() and
// Event::synchronize() would then block forever too. A host that must not hang waits through
// synchronize() below (it polls the stream and ncclCommGetAsyncError, and aborts the
// communicator after CommOptions::timeout_s), or calls check_async_error() in its own wait
// loop. After a failure or a timeout the communicator is aborted and every later call throws.
class NcclProcessGroup final : public ProcessGroup {
 public:
  // Duplicates parent for the bootstrap (collective over it): rank 0 creates the ncclUniqueId,
  // MPI broadcasts it, and every rank initialises a non-blocking communicator on the device
  // (made current first), all within CommOptions::timeout_s.
  NcclProcessGroup(Device& device, MPI_Comm parent, Stream& stream, std::string name,
                   CommOptions options);
  // Waits (bounded by timeout_s) for the group's enqueued work, then finalizes and destroys the
  // communicator, or aborts it if that fails. The stream and device must outlive the group.
  ~NcclProcessGroup() override;

  void all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  void reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                      DType dtype, ReduceOp op) override;
  void all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype, ReduceOp op) override;
  void all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  // One ncclGroupStart/End of an ncclSend and an ncclRecv per peer, empty pieces included
  // (NCCL matches point-to-point operations per pair in order, so every pair issues the same
  // number whatever the counts); this rank's own piece by a device copy.
  void all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                   const AllToAllvLayout& layout, DType dtype) override;
  void broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype, int root) override;
  void barrier() override;
  // ncclCommSplit (non-blocking, bounded by timeout_s). color must be >= 0.
  std::unique_ptr<ProcessGroup> split(int color, int key, Stream& stream,
                                      const std::string& name) override;

  // Blocks until all work enqueued on the group's stream so far has finished, polling for
  // asynchronous NCCL errors. Throws (after aborting the communicator) on an NCCL error, and
  // Timeout naming the last operation if the work is not done within CommOptions::timeout_s.
  void synchronize();
  // Throws (after aborting the communicator) if NCCL reports an asynchronous error (a peer
  // failed, a network error) or the group was aborted before. Cheap: one ncclCommGetAsyncError.
  void check_async_error();
  // The communicator; null once aborted.
  ncclComm_t comm() const { return comm_; }

 private:
  struct Adopt {};
  NcclProcessGroup(Adopt, Device& device, ncclComm_t comm, Stream& stream, std::string name,
                   CommOptions options);

  // Throws if the group was aborted; makes the device current.
  void prepare(const std::string& what);
  // Handles the result of an NCCL call on `comm`: polls ncclCommGetAsyncError until the
  // operation is enqueued (ncclInProgress -> ncclSuccess). On an error or after timeout_s it
  // aborts `comm` (nulling it) and throws Error / Timeout naming `what`.
  void await(ncclComm_t& comm, ncclResult_t result, const char* call, const std::string& what);
  // Polls the stream (an event recorded now) and the communicator's async error until the
  // stream's work is done; aborts and throws like await.
  void wait_idle(const std::string& what);
  // Aborts `comm` (nulling it), remembering `message` as the group's failure if it is comm_.
  void abort(ncclComm_t& comm, const std::string& message);
  // Aborts `comm` and throws Error with `message`.
  [[noreturn]] void fail(ncclComm_t& comm, const std::string& message);
  // polled_wait with backoff until is_done() (bool); after timeout_s aborts `comm`, tells the
  // watchdog and throws Timeout with timeout_text() (std::string) and the training step.
  template <typename IsDone, typename TimeoutText>
  void poll(ncclComm_t& comm, IsDone&& is_done, TimeoutText&& timeout_text);
  // Stream-ordered scratch of at least `bytes` (comm category, grown on demand).
  std::byte* scratch(int which, std::int64_t bytes);
  std::int64_t chunk_elements(std::int64_t elem_bytes, int parts) const;
  // recv block p (n elements) = send block `rank` of peer p, where send block q starts at
  // send + q*send_stride_bytes. Own block by a device copy, the others by ncclSend/ncclRecv.
  void all_to_all(const std::byte* send, std::int64_t send_stride_bytes, std::byte* recv,
                  std::int64_t n, DType dtype, const std::string& what);
  // size 1: out = in (nothing in place).
  void copy_alone(const std::byte* in, std::byte* out, std::int64_t count, DType dtype);
  void run_reduce_scatter(const std::byte* in, std::byte* out, std::int64_t count, DType dtype,
                          ReduceOp op, const std::string& what);
  void run_all_reduce(const std::byte* in, std::byte* out, std::int64_t count, DType dtype,
                      ReduceOp op, const std::string& what);

  Device& device_;
  int device_index_;
  cudaStream_t cuda_stream_;
  CommOptions options_;
  ncclComm_t comm_ = nullptr;
  std::string failure_;  // why the communicator was aborted
  std::string last_op_;  // the last operation enqueued, for timeout messages
  cudaEvent_t sync_event_ = nullptr;
  Buffer barrier_word_;  // one int32 zero, all-reduced by barrier()
  Buffer scratch_[2];
};

}  // namespace zrt

#define ZRT_NCCL_CHECK(call) ::zrt::check_nccl((call), #call, __FILE__, __LINE__)
