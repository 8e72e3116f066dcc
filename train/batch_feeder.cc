#include "train/batch_feeder.h"

#include <algorithm>
#include <cstdint>
#include <exception>

#include "runtime/common/error.h"

namespace zrt::train {

BatchFeeder::BatchFeeder(Device& device, Stream& stream, int B, int T, bool documents,
                         const DataShare& share)
    : device_(device), stream_(stream), arrays_(documents ? 4 : 2), share_(share) {
  ZRT_CHECK(share.sp_size >= 1 && T % share.sp_size == 0,
            "rows of {} tokens in {} sequence-parallel chunks", T, share.sp_size);
  // A chunk always carries its positions (its rotary angles start at its offset): inputs,
  // targets and positions of the chunk's B x T/sp tokens, and the whole rows' document starts.
  std::int64_t elements = std::int64_t{B} * T * arrays_;
  if (share.chunked()) {
    arrays_ = documents ? 4 : 3;
    elements = 3 * (std::int64_t{B} * (T / share.sp_size)) + (documents ? std::int64_t{B} * T : 0);
  }
  const std::int64_t bytes = elements * 4;
  for (int i = 0; i < 2; ++i) {
    host_[i] =
        device.allocate(bytes, MemCategory::kWorkspace, "token staging", MemorySpace::kPinnedHost);
    device_buf_[i] = device.allocate(bytes, MemCategory::kActivations, "token batch");
    copied_[i] = device.create_event();
  }
  B_ = B;
  T_ = T;
}

BatchFeeder::~BatchFeeder() {
  try {
    stream_.synchronize();
  } catch (const std::exception&) {
    // A stream error was reported where it happened; the buffers are free to go now.
  }
}

TokenBatch BatchFeeder::next(const HostBatch& rows, float loss_divisor) {
  const std::int64_t n = std::int64_t{B_} * T_;
  ZRT_CHECK(rows.batch == B_ && rows.seq_len == T_, "a {}x{} batch for a {}x{} feeder", rows.batch,
            rows.seq_len, B_, T_);
  ZRT_CHECK(!rows.documents || arrays_ == 4, "a batch with documents for a feeder without");
  const int slot = slot_++ % 2;
  copied_[slot]->synchronize();  // the host buffer's previous copy is done
  if (share_.chunked()) return next_chunk(rows, loss_divisor, slot);
  std::int32_t* staged = host_[slot].host<std::int32_t>();
  std::copy(rows.inputs.begin(), rows.inputs.end(), staged);
  std::copy(rows.targets.begin(), rows.targets.end(), staged + n);
  if (rows.documents) {
    std::copy(rows.positions.begin(), rows.positions.end(), staged + 2 * n);
    std::copy(rows.doc_start.begin(), rows.doc_start.end(), staged + 3 * n);
  }
  const int arrays = rows.documents ? 4 : 2;
  device_.copy_to_device(device_buf_[slot].device<std::byte>(), staged,
                         static_cast<std::size_t>(n * 4 * arrays), stream_);
  copied_[slot]->record(stream_);
  const DevicePtr<std::int32_t> base = device_buf_[slot].device<std::int32_t>();
  TokenBatch batch;
  batch.inputs = base;
  batch.targets = base + n;
  if (rows.documents) {
    batch.positions = base + 2 * n;
    batch.doc_start = base + 3 * n;
  }
  batch.batch = B_;
  batch.seq_len = T_;
  batch.loss_divisor = loss_divisor;
  return batch;
}

// The chunk's inputs, targets and positions (B x Tl each), then the whole rows' document starts
// (B x T) when the rows have documents.
TokenBatch BatchFeeder::next_chunk(const HostBatch& rows, float loss_divisor, int slot) {
  const int Tl = share_.chunk_length(T_), first = share_.chunk_offset(T_);
  const std::int64_t n = std::int64_t{B_} * Tl;
  std::int32_t* staged = host_[slot].host<std::int32_t>();
  for (int b = 0; b < B_; ++b) {
    const std::size_t from = static_cast<std::size_t>(b) * static_cast<std::size_t>(T_) +
                             static_cast<std::size_t>(first);
    const std::size_t to = static_cast<std::size_t>(b) * static_cast<std::size_t>(Tl);
    for (int t = 0; t < Tl; ++t) {
      const std::size_t i = from + static_cast<std::size_t>(t);
      staged[to + t] = rows.inputs[i];
      staged[n + to + t] = rows.targets[i];
      staged[2 * n + to + t] = rows.documents ? rows.positions[i] : first + t;
    }
  }
  std::int64_t elements = 3 * n;
  if (rows.documents) {
    std::copy(rows.doc_start.begin(), rows.doc_start.end(), staged + elements);
    elements += std::int64_t{B_} * T_;
  }
  device_.copy_to_device(device_buf_[slot].device<std::byte>(), staged,
                         static_cast<std::size_t>(elements * 4), stream_);
  copied_[slot]->record(stream_);
  const DevicePtr<std::int32_t> base = device_buf_[slot].device<std::int32_t>();
  TokenBatch batch;
  batch.inputs = base;
  batch.targets = base + n;
  batch.positions = base + 2 * n;
  if (rows.documents) batch.doc_start = base + 3 * n;
  batch.batch = B_;
  batch.seq_len = Tl;
  batch.loss_divisor = loss_divisor;
  return batch;
}

}  // namespace zrt::train
