// The CPU backend's collectives on MPI. Each group owns a duplicated communicator and runs its
// operations on its stream's worker thread with nonblocking MPI calls polled by MPI_Test, so
// they are asynchronous to the host and can time out (OpenMPI 4.1 has no progress thread).
//
// Reduce-scatter exchanges each rank's blocks point to point (an all-to-all) and sums them
// locally in fp32 in rank order, double-buffered over chunks of CommOptions::max_chunk_bytes:
// 2.4-5x faster than MPI_Reduce_scatter_block here, and the only way to sum 16-bit floats in
// fp32. All-gather (CommOptions::all_gather_algo, kAuto by default) sends each slice point to
// point straight from the input up to direct_all_gather_bytes per rank, and is MPI_Iallgather
// above (and point to point again beyond int counts).
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/comm/collective_plan.h"
#include "runtime/comm/process_group.h"

namespace zrt {

class CpuStream;

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Duplicates parent (collective over it). `device` must be the CPU backend.
  MpiProcessGroup(Device& device, MPI_Comm parent, Stream& stream, std::string name,
                  CommOptions options);
  // Waits for the group's enqueued work, then frees the communicator. The stream must outlive
  // the group.
  ~MpiProcessGroup() override;

  void all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  void reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                      DType dtype, ReduceOp op) override;
  void all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype, ReduceOp op) override;
  void all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  // Every piece is a message (an empty piece too), so each pair of ranks matches its sends and
  // receives whatever the counts; a received size that differs from the count expected throws.
  void all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                   const AllToAllvLayout& layout, DType dtype) override;
  void broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype, int root) override;
  void barrier() override;
  std::unique_ptr<ProcessGroup> split(int color, int key, Stream& stream,
                                      const std::string& name) override;

  MPI_Comm comm() const { return comm_; }

 private:
  struct Adopt {};
  MpiProcessGroup(Adopt, Device& device, MPI_Comm comm, Stream& stream, std::string name,
                  CommOptions options);

  // Enqueues body on the stream; counts the bytes; applies the simulated link.
  void enqueue(CollectiveOp op, std::int64_t bytes, LinkBytes sent, std::function<void()> body);
  // Polls req until done; after options_.timeout_s tells the watchdog and throws Timeout naming
  // `what`, the step and the ranks missing.
  void wait(MPI_Request& req, const std::string& what);
  void wait_all(MPI_Request* reqs, int n, const std::string& what,
                MPI_Status* statuses = MPI_STATUSES_IGNORE);
  // Moves the still-pending requests of `reqs` (not MPI_REQUEST_NULL) to abandoned_ and nulls
  // them: the destructor gives late peers a grace period to complete them, and leaks the
  // communicator otherwise, instead of freeing it (and the buffers they write) under them.
  void abandon(MPI_Request* reqs, std::size_t n);
  // Abandons every request of the sets it watches when its scope is left by an exception: a
  // timeout, or an MPI error while posting, with other requests already posted (a reduce-scatter
  // chunk's exchange posted ahead of the one that failed).
  class AbandonOnUnwind {
   public:
    AbandonOnUnwind(MpiProcessGroup& group, std::initializer_list<std::vector<MPI_Request>*> sets)
        : group_(group), sets_(sets), exceptions_(std::uncaught_exceptions()) {}
    AbandonOnUnwind(MpiProcessGroup& group, MPI_Request* reqs, std::size_t n)
        : group_(group), reqs_(reqs), n_(n), exceptions_(std::uncaught_exceptions()) {}
    ~AbandonOnUnwind() {
      if (std::uncaught_exceptions() <= exceptions_) return;
      for (std::vector<MPI_Request>* set : sets_) group_.abandon(set->data(), set->size());
      if (reqs_ != nullptr) group_.abandon(reqs_, n_);
    }
    AbandonOnUnwind(const AbandonOnUnwind&) = delete;
    AbandonOnUnwind& operator=(const AbandonOnUnwind&) = delete;

   private:
    MpiProcessGroup& group_;
    std::vector<std::vector<MPI_Request>*> sets_;
    MPI_Request* reqs_ = nullptr;  // or an array of n_ requests
    std::size_t n_ = 0;
    int exceptions_;
  };
  // After a timeout: which peers are waiting in the same operation, which are elsewhere and
  // which are missing (see the .cc). Returns the phrase the error message carries.
  std::string take_attendance();
  // Worker-thread scratch of at least `bytes` (comm category, grown on demand).
  std::byte* scratch(int which, std::int64_t bytes);
  // Elements per rank in one chunk (collective_plan::chunk_elements within int counts).
  std::int64_t chunk_elements(std::int64_t elem_bytes, int parts) const;
  // Bytes in one piece of a byte transfer: max_chunk_bytes within an int count.
  std::int64_t byte_chunk() const {
    return collective_plan::chunk_elements(options_.max_chunk_bytes, 1, 1,
                                           collective_plan::int_count_limit(1));
  }

  // Worker-thread bodies.
  void run_all_gather(const std::byte* in, std::byte* out, std::int64_t count, DType dtype);
  // size 1: out = in (nothing in place).
  static void copy_alone(const std::byte* in, std::byte* out, std::int64_t count, DType dtype);
  void run_reduce_scatter(const std::byte* in, std::byte* out, std::int64_t count, DType dtype,
                          ReduceOp op);
  void run_reduce_scatter_native(const std::byte* in, std::byte* out, std::int64_t count,
                                 DType dtype, ReduceOp op);
  // Sends `bytes` from send + p*send_stride to every peer p and receives peer p's into
  // recv + p*bytes, point to point (tag `tag`), and waits for all of it; `meanwhile` (if set)
  // runs once everything is posted (the local block's copy, which overlaps the transfers).
  void exchange_blocks(const std::byte* send, std::int64_t send_stride, std::byte* recv,
                       std::int64_t bytes, int tag, const std::string& what,
                       const std::function<void()>& meanwhile = {});
  // Posts the exchange of one block per rank (see the .cc); completes when reqs do.
  void post_exchange(const std::byte* send, std::int64_t send_stride, std::byte* recv,
                     std::int64_t block_bytes, std::vector<MPI_Request>& reqs);
  void run_all_to_all(const std::byte* in, std::byte* out, std::int64_t count, DType dtype);
  void run_all_to_allv(const std::byte* in, std::byte* out, const AllToAllvLayout& layout,
                       DType dtype);
  void run_all_reduce(const std::byte* in, std::byte* out, std::int64_t count, DType dtype,
                      ReduceOp op);
  // CommOptions::simulated_link_only: the output from this rank's input alone (see there).
  void run_local_all_gather(const std::byte* in, std::byte* out, std::int64_t bytes) const;

  Device& device_;
  CpuStream& cpu_stream_;
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  Buffer scratch_[2];                   // touched by the worker only
  std::vector<MPI_Request> abandoned_;  // requests left pending by a timeout (worker only)
  std::vector<MPI_Request> requests_;   // reused request list (worker only)
  std::int64_t sequence_ = 0;           // operations started on this group (worker only)
  std::int64_t attendance_send_ = 0;    // the value a timeout's attendance call sends

 public:
  // Requests a timeout or an error left pending, which the destructor waits for (tests).
  std::size_t abandoned_requests() const { return abandoned_.size(); }
};

}  // namespace zrt
