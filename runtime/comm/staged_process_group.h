// Collectives between ranks that share one device: MPI over pinned host memory.
//
// NCCL refuses two ranks of a communicator on one GPU, so when a node runs more ranks than it has
// GPUs (a test of 4 ranks on a one-GPU machine, or a debugging run), the ranks cannot use it.
// This group gives them the MPI backend's collectives (the same algorithms and the same fp32,
// rank-order sums, so the same bits) on a copy of the data in pinned host memory: each operation
// copies its input down from the device on the group's stream, waits for that copy, runs the MPI
// collective on the host (an MpiProcessGroup on a host-side CPU stream of its own, polled with
// the same timeouts), and copies the result back up on the stream.
//
// The price: an operation waits on the host for the device to reach it (the stream is drained
// to the input's copy before MPI starts), so the issuing thread does not run ahead of the device
// and nothing overlaps a collective. It is the path for ranks that share a device, where speed
// was never the point; with a GPU per rank zrt uses NCCL. Works on any backend (the CPU backend's
// tests run it against the plain MPI group).
//
// One issuing thread, as every ProcessGroup; not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/process_group.h"

namespace zrt {

class StagedProcessGroup final : public ProcessGroup {
 public:
  // Collective over parent (duplicates it). `stream` is one of `device`'s streams: the copies
  // are ordered on it.
  StagedProcessGroup(Device& device, MPI_Comm parent, Stream& stream, std::string name,
                     CommOptions options);
  // Drains the stream (bounded by the MPI group's timeouts), then frees the staging.
  ~StagedProcessGroup() override;

  void all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  void reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                      DType dtype, ReduceOp op) override;
  void all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype, ReduceOp op) override;
  void all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype) override;
  // The input's extent goes down, and each received piece comes back up by itself (the output's
  // gaps stay as they were).
  void all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                   const AllToAllvLayout& layout, DType dtype) override;
  void broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype, int root) override;
  void barrier() override;
  std::unique_ptr<ProcessGroup> split(int color, int key, Stream& stream,
                                      const std::string& name) override;

 private:
  struct Host;  // the host-side CPU device, its stream and the MPI group on them
  StagedProcessGroup(Device& device, std::unique_ptr<Host> host, Stream& stream, std::string name);

  // Copies `in_bytes` at `in` into the staging (after whatever the stream holds before), waits
  // for it, runs `exchange(staged_in, staged_out)` on the host MPI group and waits for it, then
  // enqueues the copy of `out_bytes` of the result to `out` on the stream.
  template <typename Exchange>
  void staged(DevicePtr<const std::byte> in, std::size_t in_bytes, DevicePtr<std::byte> out,
              std::size_t out_bytes, Exchange&& exchange);
  // Staging of at least these sizes; grows only with the stream drained (a copy up may still be
  // reading the old one).
  void reserve(std::size_t in_bytes, std::size_t out_bytes);

  Device& device_;
  // Declared before the host group, so destroyed after it: a request the group abandoned on a
  // timeout (its destructor's grace poll) may still land in them.
  Buffer staged_in_, staged_out_;  // pinned host memory of `device_`
  std::unique_ptr<Host> host_;
};

}  // namespace zrt
