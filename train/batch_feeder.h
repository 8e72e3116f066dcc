// BatchFeeder: a micro-batch's rows (HostBatch) onto the device as the model takes them
// (TokenBatch), through two host/device buffer pairs, so the next micro-batch's tokens are
// prepared while the previous copy may still be in flight. Under sequence parallelism
// (sequence_chunk.h) it sends the rank's chunk of every row: inputs, targets and positions of the
// chunk (its global positions, or the documents' ones), and the whole rows' document starts.
// One per stream; not thread-safe.
#pragma once

#include <memory>

#include "runtime/data/sample_source.h"
#include "runtime/device/device.h"
#include "runtime/model_interface.h"
#include "train/sequence_chunk.h"

namespace zrt::train {

class BatchFeeder {
 public:
  // Rows of B x T tokens; with `documents` also their positions and document starts; `share`'s
  // chunk of each (sp_size must divide T).
  BatchFeeder(Device& device, Stream& stream, int B, int T, bool documents,
              const DataShare& share = {});
  // The stream may still read the buffers (an exception unwinding mid-step destroys the feeder
  // before the engine drains its streams): waits for it before they are freed.
  ~BatchFeeder();
  BatchFeeder(const BatchFeeder&) = delete;
  BatchFeeder& operator=(const BatchFeeder&) = delete;

  // Copies `rows` into the next slot and returns the device batch, with `loss_divisor`
  // (TokenBatch: 0 for the mean over every token).
  TokenBatch next(const HostBatch& rows, float loss_divisor);
  // Which rows the caller reads (the data stream's rank and world) and which chunk is sent.
  const DataShare& share() const { return share_; }

 private:
  TokenBatch next_chunk(const HostBatch& rows, float loss_divisor, int slot);

  Device& device_;
  Stream& stream_;
  int arrays_ = 2;  // int32 arrays per slot (B*T each; at sp the chunk's, doc_start whole rows)
  Buffer host_[2];
  Buffer device_buf_[2];
  std::unique_ptr<Event> copied_[2];
  int slot_ = 0;
  int B_ = 0;
  int T_ = 0;
  DataShare share_;
};

}  // namespace zrt::train
