// CheckpointOffload: activation checkpointing's block inputs in pinned host memory
// (activation_checkpointing.cpu_checkpointing), DeepSpeed's CPU checkpointing for the shared
// driver. Under activation checkpointing the driver keeps each block's input (the residual
// stream) for the block's rerun before its backward; with this store the device keeps only two
// slots of the residual stream (block l's input in slot l % 2, and the last block's output apart,
// which the head reads) and the host keeps blocks 0..L-3's inputs:
//   - forward: once a block input is written on the compute stream it is copied out on the copy
//     stream (an event recorded on compute, waited for on copy); the compute stream waits for
//     that copy before the slot is written again, two blocks later;
//   - backward: the last two blocks' inputs are still in their slots; before block l runs, block
//     l-1's input is copied back into its slot (after the compute stream's work on the block
//     that held it, l+1), so the copy overlaps block l; the compute stream waits for it just
//     before block l-1's recompute.
// Every copy is whole and exact: the same bits as keeping the inputs on the device, with
// (L-2) x (B,T,C) fewer device bytes and as many in pinned host memory (MemCategory::
// kActivations, zrt-mem counts both). Blocks below the first whose backward runs (frozen lower
// layers, ParamAccess::first_backward_module) are neither rerun nor copied: the host holds
// blocks first..L-3's inputs. On the CPU backend the same code runs with host "device"
// memory and the copies through the same stream API.
//
// Not thread-safe; driven by the model's pass on one host thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device/buffer.h"
#include "runtime/device/device.h"

namespace zrt::transformer {

struct TransformerOptions;

// The block inputs the host keeps for a model of `n_layer` blocks: L-2 with activation
// checkpointing and cpu_checkpointing (the last two stay in the device's slots), else 0.
int offloaded_block_inputs(int n_layer, const TransformerOptions& options);

class CheckpointOffload {
 public:
  // `compute` is the stream the model's kernels run on; the copy stream is made here.
  CheckpointOffload(Device& device, Stream& compute);
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;

  // Holds the inputs of blocks first_block .. blocks - 1, `row_bytes` each, in pinned host
  // memory (reallocated when the size changes; stream-ordered on the copy stream). `label` names
  // the allocation.
  void prepare(int first_block, int blocks, std::int64_t row_bytes, const std::string& label);
  int blocks() const { return blocks_; }
  // The host rows for `blocks` block inputs from `first_block` (none when first_block >= blocks).
  static int host_rows(int first_block, int blocks);
  // The device slot block `block`'s input lives in.
  static int slot_of(int block) { return block % 2; }

  // Copies block `block`'s input out of `slot_ptr` once the compute stream's work so far (which
  // wrote it) is done.
  void save(int block, DevicePtr<const std::byte> slot_ptr);
  // Copies block `block`'s input back into `slot_ptr` once the compute stream's work so far
  // (the last reader of the slot's previous content) is done.
  void prefetch(int block, DevicePtr<std::byte> slot_ptr);
  // Later compute work waits for the slot's last copy: out (before the slot is overwritten) or
  // in (before it is read).
  void await_slot(int slot);

 private:
  std::byte* host_row(int block) const;

  Device& device_;
  Stream& compute_;
  std::unique_ptr<Stream> copy_;
  std::unique_ptr<Event> compute_done_;           // recorded on compute just before each copy
  std::array<std::unique_ptr<Event>, 2> copied_;  // each slot's last copy, on the copy stream
  Buffer host_;
  int first_block_ = 0;
  int blocks_ = 0;
  std::int64_t row_bytes_ = 0;
};

}  // namespace zrt::transformer
