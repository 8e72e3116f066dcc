// ExpertRows: the device memory of the tensors that hold the rows this rank's experts compute
// under expert parallelism (expert_parallel.autoep_size ep > 1), sized from the routing instead
// of for its worst case.
//
// Per kept activation set that serves an MoE block (transformer_activations.h's KeptSets: one per
// block, one the blocks below the first with a backward share, or one under activation
// checkpointing; or one when the MoE layers run in tiles: a tile's rows, computed again in the
// backward) the experts' input rows
// and their SwiGLU values, kept from a layer's forward to its backward:
//   xl (R, C), gate, up, h (R, I)
// and one scratch every forward and backward overwrites before reading:
//   staging (R, C)       where the exchanges land before the reorder (ExpertDispatch)
//   rows (R, C)          the experts' outputs (forward), then the rows' output gradients and
//                        the experts' input gradients (backward): never live at once
//   dh, dgate, dup (R, I) the SwiGLU's gradients (the layer zeroes dgate, dup before adding)
// R is the rows a layer's local experts receive: between 0 and ep x N x min(k, E/ep) (every rank
// of the group routing each token's pairs here; worst_rows) for N tokens a rank (a tile's rows
// when the MoE layers run in tiles), N x k when the routing is balanced. Sizing every buffer for
// the worst case makes expert parallelism cost memory instead of saving it (ep x the balanced
// share where E/ep >= k: Qwen3-30B-A3B at ep 8 holds 8x what it computes), so the buffers hold
// `capacity` rows instead:
//   - at first model.expert_rows_reserve x the balanced share (rounded up to the granule, N x k
//     / 16, and at most the worst case): initial_rows();
//   - when a layer's exchanged counts ask for more (DispatchPlan::local_rows, on the host before
//     any row moves), that demand rounded up to the granule: grown_rows(). The rows of the same
//     pass's earlier layers stay where they are (their sets are read by the backward), and a
//     set grows when its contents are dead: at its layer's forward.
//   - after a training pass's backward, settle() brings every set and the scratch to the
//     capacity, so what the tracker sees at its peak depends on the capacity alone
//     (device_bytes(), what zrt-mem counts for a given capacity).
// Growing waits for the compute stream and the exchange's stream (the old buffer may still be in
// use on either), frees, then allocates: never both at once. It happens a few times early in a
// run (each time the busiest layer beats the capacity by a granule), is logged, and an
// out-of-memory error names the demand and the reserve to raise.
//
// Not thread-safe; the model's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "models/moe/moe_layer.h"
#include "runtime/device/buffer.h"
#include "runtime/device/device.h"

namespace zrt::moe {

// What sizes the rows: the layer's widths, top-k, experts and the expert-parallel degree.
struct ExpertRowsShape {
  int C = 0;   // hidden size: xl, staging and the rows' scratch are C wide
  int I = 0;   // an expert's width: gate, up, h, dh, dgate, dup
  int k = 0;   // experts per token
  int E = 0;   // experts of a layer
  int ep = 1;  // expert-parallel degree

  // The dropless worst case for N tokens a rank: a token's k experts are distinct, so at most
  // min(k, E/ep) of its pairs land on one rank's E/ep experts, from each of the ep ranks.
  std::int64_t worst_rows(std::int64_t N) const;
  // The balanced share: the group's ep x N x k pairs over its ep ranks.
  std::int64_t balanced_rows(std::int64_t N) const { return N * k; }
  // What growth rounds up to: 1/16 of the balanced share (at least one row).
  std::int64_t granule(std::int64_t N) const;
  // The capacity a run starts with at `reserve` x the balanced share (reserve >= 1; at most the
  // worst case), and the one a demand of `rows` grows it to.
  std::int64_t initial_rows(std::int64_t N, double reserve) const;
  std::int64_t grown_rows(std::int64_t rows, std::int64_t N) const;
  // Device bytes of one kept set and of the scratch at `rows` rows of `element` bytes, and of
  // everything (`sets` kept sets and the scratch): what zrt-mem counts.
  std::int64_t kept_bytes(std::int64_t rows, std::int64_t element) const;
  std::int64_t scratch_bytes(std::int64_t rows, std::int64_t element) const;
  std::int64_t device_bytes(int sets, std::int64_t rows, std::int64_t element) const {
    return sets * kept_bytes(rows, element) + scratch_bytes(rows, element);
  }
};

class ExpertRows {
 public:
  // `compute`: the layers' stream; `comm`: the exchange's (the expert-parallel group's). Both,
  // and `device`, must outlive this. `reserve`: model.expert_rows_reserve (>= 1).
  ExpertRows(Device& device, Stream& compute, Stream& comm, ExpertRowsShape shape, double reserve);
  ExpertRows(const ExpertRows&) = delete;
  ExpertRows& operator=(const ExpertRows&) = delete;

  // A layer's forward, once its plan says this rank's experts receive `rows` of the pass's `N`
  // tokens a rank: grows the capacity if they do not fit, brings kept set `kept.rows_set` and
  // the scratch to it, and points kept's xl/gate/up/h and scratch's staging/yl/dyl/dxl/dh/
  // dgate/dup at their rows. `layer` names the layer in the log and errors.
  void fit(MoeKept& kept, MoeScratch& scratch, std::int64_t rows, std::int64_t N, DType dtype,
           int layer);
  // After a training pass's backward: every kept set and the scratch at the capacity.
  void settle();

  // Rows each buffer holds now (0 before the first forward).
  std::int64_t capacity() const { return capacity_; }
  // The most rows one layer's experts received in the passes since the last call, and the
  // largest balanced share (N x k) of those passes' layers (a tile's, when the MoE layers run in
  // tiles: what model.expert_rows_reserve multiplies); resets both.
  struct Peak {
    std::int64_t rows = 0, balanced = 0;
  };
  Peak take_peak();

 private:
  // `buffer` holding at least `bytes`, reallocated (after both streams drain) if smaller;
  // `label()` names the allocation (called only then: fit() runs every layer of every pass).
  template <typename Label>
  void ensure(Buffer& buffer, std::int64_t bytes, const Label& label);

  Device& device_;
  Stream& compute_;
  Stream& comm_;
  ExpertRowsShape shape_;
  double reserve_;
  std::int64_t capacity_ = 0;
  std::int64_t element_ = 0;  // bytes of the last pass's rows' elements
  std::vector<Buffer> kept_;  // per kept set
  Buffer scratch_;
  std::int64_t peak_rows_ = 0, balanced_ = 0;
};

}  // namespace zrt::moe
