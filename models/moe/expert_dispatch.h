// ExpertDispatch: expert parallelism's token exchange for one mixture-of-experts layer. The ranks
// of an expert-parallel group (ParallelLayout::expert_parallel_group(), ep ranks) each hold
// L = E / ep of the layer's E experts: rank j the experts [j*L, (j+1)*L). A rank's routed rows,
// permuted by global expert id (moe_dispatch_plan's order), go to the ranks holding their
// experts, the experts run there over the rows of every rank of the group, and the outputs come
// back to their rows' owners:
//
//   plan()     one all_to_all of the count vectors: each rank learns how many rows every peer
//              sends each of its local experts (host vectors; one host synchronisation)
//   dispatch() one all_to_allv: piece p = the rows for rank p's experts (contiguous, since the
//              rows are in global expert order), then a local reorder of the received pieces
//              (source-major) into expert-major order, what the grouped linear takes
//   combine()  the reverse: the reorder back, one all_to_allv, each row at its sender's place
//
// The backward does the same in reverse: the output gradients go to the experts with dispatch()
// (the forward's plan), the experts' input gradients come back with combine().
//
// It cannot hang: every rank issues exactly these collectives, in this order, whatever the
// routing. An expert with no row, a rank with nothing to send, a rank receiving every row of the
// group: the pieces are empty or large, never skipped (ProcessGroup::all_to_allv exchanges empty
// pieces too). With comm.check_collective_sequence each collective is agreed on first, and a
// rank that skipped one is named instead of waited for (docs/reliability.md).
//
// Gradients of the expert weights: the rank holding expert e sums, over the rows of every rank
// of its ep group, what each row's loss gives it; averaging that over the expert-data-parallel
// group (world / ep ranks, one per ep group) counts each rank's loss ep / world times, where a
// dense parameter's average counts it 1 / world: the expert units' reduced gradients must be
// multiplied by 1 / ep (ShardGroup::gradient_scale, docs/multi-node.md derives it).
//
// Streams: the exchanges run on the group's stream, ordered after the work enqueued on `compute`
// so far, and later work on `compute` waits for them (events, no host wait); plan() waits on the
// host for the counts. One thread drives it (the layer's), like the group.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"

namespace zrt::moe {

// Which experts each rank of an expert-parallel group holds: contiguous blocks of L.
struct ExpertPartition {
  int num_experts = 1;
  int ep_size = 1;
  int ep_rank = 0;
  // Throws InvalidArgument unless ep_size divides num_experts and ep_rank is in range.
  void check() const;
  int local() const { return num_experts / ep_size; }
  int first_local() const { return ep_rank * local(); }
  int owner(int expert) const { return expert / local(); }
};

// What one exchange moves, from the counts: kept by the layer from the forward to the backward.
struct DispatchPlan {
  ExpertPartition experts;
  std::vector<std::int64_t> counts;        // (E) this rank's rows per global expert
  std::vector<std::int64_t> from_sources;  // (ep x L) rows source s sends local expert l: [s*L + l]
  std::vector<std::int64_t> local_counts;  // (L) rows of each local expert, all sources
  std::int64_t rows = 0;                   // this rank's routed rows (sum of counts)
  std::int64_t local_rows = 0;             // rows its experts compute (sum of local_counts)
  AllToAllvLayout to_experts;              // dispatch's exchange (rows -> source-major staging)
  AllToAllvLayout to_owners;               // combine's (the reverse)
};

class ExpertDispatch {
 public:
  // `group`: the expert-parallel group (its size is ep, its rank the ep rank); `compute`: the
  // stream the layer's kernels run on. Both must outlive this.
  ExpertDispatch(Device& device, Stream& compute, ProcessGroup& group, int num_experts);
  ExpertDispatch(const ExpertDispatch&) = delete;
  ExpertDispatch& operator=(const ExpertDispatch&) = delete;

  const ExpertPartition& experts() const { return experts_; }

  // Collective over the group: exchanges the count vectors. `counts`: this rank's rows per
  // global expert (E entries, any may be 0). Waits on the host for the exchange.
  DispatchPlan plan(const std::vector<std::int64_t>& counts);
  // Collective: `rows` (plan.rows x width elements of `dtype`, in global expert order) to the
  // experts' ranks; `local` (plan.local_rows x width) receives them expert-major, within an
  // expert by source rank. Stream-ordered on `compute`.
  // `staging`: plan.local_rows x width elements the exchange lands in before the reorder (a
  // caller that plans its memory gives it); null: a buffer of this dispatch's, grown on demand.
  void dispatch(const DispatchPlan& plan, DevicePtr<const std::byte> rows,
                DevicePtr<std::byte> local, std::int64_t width, DType dtype,
                DevicePtr<std::byte> staging = {});
  // Collective, the reverse of dispatch: `local` (plan.local_rows x width, expert-major) back to
  // `rows` (plan.rows x width) on the ranks that sent them. `staging` as for dispatch.
  void combine(const DispatchPlan& plan, DevicePtr<const std::byte> local,
               DevicePtr<std::byte> rows, std::int64_t width, DType dtype,
               DevicePtr<std::byte> staging = {});
  // Device bytes the dispatch allocates itself (the count exchange's two buffers), for planners.
  static std::int64_t own_bytes(int num_experts);

 private:
  // Copies the (source, local expert) blocks from `from` to `to` on `compute`: source-major
  // (the staging) to expert-major (the experts' rows) when to_local, else the other way.
  void reorder(const DispatchPlan& plan, DevicePtr<const std::byte> from, DevicePtr<std::byte> to,
               std::int64_t row_bytes, bool to_local);
  // Staging of at least `bytes` (grown on demand, after `compute` and the group's stream drain).
  DevicePtr<std::byte> staging(std::int64_t bytes);
  // The group's stream waits for `compute` so far; and the other way round.
  void comm_after_compute();
  void compute_after_comm();

  Device& device_;
  Stream& compute_;
  ProcessGroup& group_;
  ExpertPartition experts_;
  std::unique_ptr<Event> compute_done_, comm_done_;
  Buffer counts_out_, counts_in_;  // int64 (E) each, the count exchange's buffers
  Buffer staging_;
};

}  // namespace zrt::moe
