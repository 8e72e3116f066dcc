#include "models/transformer/checkpoint_offload.h"

#include <algorithm>

#include "models/transformer/transformer_spec.h"
#include "runtime/common/error.h"

namespace zrt::transformer {

int offloaded_block_inputs(int n_layer, const TransformerOptions& options) {
  if (!options.activation_checkpointing || !options.cpu_checkpointing) return 0;
  return std::max(0, n_layer - 2);
}

CheckpointOffload::CheckpointOffload(Device& device, Stream& compute)
    : device_(device),
      compute_(compute),
      copy_(device.create_stream("activation checkpoint copy")),
      compute_done_(device.create_event()) {
  for (std::unique_ptr<Event>& e : copied_) e = device.create_event();
}

int CheckpointOffload::host_rows(int first_block, int blocks) {
  return std::max(0, blocks - std::max(first_block, 0));
}

void CheckpointOffload::prepare(int first_block, int blocks, std::int64_t row_bytes,
                                const std::string& label) {
  if (first_block == first_block_ && blocks == blocks_ && row_bytes == row_bytes_ &&
      !host_.empty()) {
    return;
  }
  host_.reset();  // ordered on the copy stream, behind the copies of the last pass
  first_block_ = std::max(first_block, 0);
  blocks_ = blocks;
  row_bytes_ = row_bytes;
  const int rows = host_rows(first_block_, blocks);
  if (rows == 0) return;
  host_ = device_.allocate(std::int64_t{rows} * row_bytes, MemCategory::kActivations, label,
                           MemorySpace::kPinnedHost, copy_.get());
}

std::byte* CheckpointOffload::host_row(int block) const {
  ZRT_CHECK(block >= first_block_ && block < blocks_,
            "checkpointed block input {} in host memory, which holds blocks {}..{}", block,
            first_block_, blocks_ - 1);
  return host_.host<std::byte>() + std::int64_t{block - first_block_} * row_bytes_;
}

void CheckpointOffload::save(int block, DevicePtr<const std::byte> slot_ptr) {
  std::byte* dst = host_row(block);
  compute_done_->record(compute_);
  copy_->wait(*compute_done_);
  device_.copy_to_host(dst, slot_ptr, static_cast<std::size_t>(row_bytes_), *copy_);
  copied_[static_cast<std::size_t>(slot_of(block))]->record(*copy_);
}

void CheckpointOffload::prefetch(int block, DevicePtr<std::byte> slot_ptr) {
  const std::byte* src = host_row(block);
  compute_done_->record(compute_);
  copy_->wait(*compute_done_);
  device_.copy_to_device(slot_ptr, src, static_cast<std::size_t>(row_bytes_), *copy_);
  copied_[static_cast<std::size_t>(slot_of(block))]->record(*copy_);
}

void CheckpointOffload::await_slot(int slot) {
  compute_.wait(*copied_[static_cast<std::size_t>(slot)]);
}

}  // namespace zrt::transformer
