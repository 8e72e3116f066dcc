// MoeLayer: the routed MLP of one mixture-of-experts block (Mixtral, Qwen2-MoE, Qwen3-MoE) on
// kernels/moe_ops.h, every expert local. One forward is four steps, and the backward the same
// four in reverse:
//   route    router logits = x @ gate^T; softmax, top-k (renormalised or not); with a capacity
//            factor, the pairs past an expert's capacity dropped; the dispatch plan (per-expert
//            counts and offsets, each pair's row), whose offsets come to the host once (the
//            grouped GEMMs need them there)
//   permute  the token rows gathered into expert order (N*k rows, expert e's contiguous)
//   experts  the grouped SwiGLU over those rows: gate and up from the fused gate_up_proj, silu(g)
//            * u, down_proj. This is the seam of expert parallelism: given the permuted rows and
//            the per-expert offsets it returns each row's output in the same order. With an
//            ExpertDispatch (expert_parallel.autoep_size ep > 1) the rows go to the ranks holding
//            their experts (plan, dispatch), this rank's E/ep experts run over the rows every
//            rank of its ep group sent them, and the outputs come back (combine); the backward
//            sends the rows' output gradients the same way and brings the input gradients back.
//            Route, permute and combine, the load-balancing statistics with them, run on this
//            rank's own tokens as with every expert local.
//   combine  out[n] = sum over its k slots of weight * the expert's row (slot order); Qwen2-MoE's
//            shared expert adds sigmoid(shared_expert_gate(x)) * shared_expert(x).
// Every sum runs in a fixed order (kernels/moe_ops.h): two runs give the same bits.
//
// Not thread-safe; the buffers are the model's (models/moe/moe_model.h lays them out).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/moe_ops.h"
#include "models/moe/expert_dispatch.h"
#include "runtime/device/device_ptr.h"

namespace zrt::moe {

class ExpertRows;

using Bytes = DevicePtr<std::byte>;
using Floats = DevicePtr<float>;

struct MoeLayerShape {
  int C = 0;   // hidden size
  int E = 0;   // experts
  int k = 0;   // experts per token
  int I = 0;   // one expert's width
  int Is = 0;  // the shared expert's width; 0: none
  bool renormalize = true;
  double capacity_factor = 0.0;  // 0: dropless
};

// The layer's parameters (or their gradients): null where the layer has none.
struct MoeParams {
  Bytes router;              // (E,C)
  Bytes gate_up;             // (E,2I,C): gate rows [0,I), up rows [I,2I) of each expert
  Bytes down;                // (E,C,I)
  Bytes shared_gate_proj;    // (Is,C)
  Bytes shared_up_proj;      // (Is,C)
  Bytes shared_down_proj;    // (C,Is)
  Bytes shared_expert_gate;  // (1,C)
  // Elements from one expert's gate_up / down to the next's (the same for the gradients): 0 for
  // the fused tensors' 2I*C and C*I. Under expert parallelism gate_up / down point at the first
  // local expert's own parameter, the others following at this stride (the engine's alignment).
  std::int64_t gate_up_stride = 0;
  std::int64_t down_stride = 0;
};

// What the forward keeps for the backward (N tokens; R <= N*k rows dispatched).
struct MoeKept {
  Bytes logits;           // (N,E) the router's logits
  Floats probs, weights;  // (N,E) fp32 softmax, (N,k) fp32 routing weights
  Bytes experts;          // (N,k) int32: the router's choices (the load-balancing statistics')
  // (N,k) int32, with a capacity factor only: the experts dispatched to (-1: dropped).
  Bytes routed;
  Bytes row_of;              // (N,k) int32: each pair's row
  Bytes xe, gate, up, h, y;  // (N*k, C / I / I / I / C): permuted inputs, the experts' values
  // Expert parallelism: gate, up, h hold the local experts' rows (R of them: what the plan
  // says every rank of the group sends here), xl their inputs (R, C), all four in ExpertRows'
  // kept set `rows_set` (models/moe/expert_rows.h), bound at each forward; the exchange's plan
  // and the local experts' row offsets (E/ep + 1) on the host; the block they belong to (logs).
  Bytes xl;
  int rows_set = 0;
  int layer = 0;
  DispatchPlan plan;
  std::vector<std::int32_t> local_offsets;
  Bytes sgate, sup, sh, sout, slogit;  // shared expert: (N,Is) x3, (N,C), (N) gate logit
  std::vector<std::int32_t> offsets;   // host copy of the plan's offsets (E+1)
  std::int64_t dropped = 0;            // pairs dropped by the capacity factor this forward
};

// Scratch one forward or backward overwrites before reading.
struct MoeScratch {
  Bytes counts, offsets, source;  // int32: (E), (E+1), (N*k)
  // Expert parallelism: the permuted rows (N*k, C) on their way out, the kept sets' xe.
  Bytes xe;
  Bytes dy, dh, dxe;  // (N*k, C / I / C); under expert parallelism dh (R, I)
  // Expert parallelism, ExpertRows' scratch: the local experts' outputs (R, C) and, in the
  // backward, their output then input gradients: one buffer, never live at once; the
  // exchanges' landing rows (R, C).
  Bytes yl, dyl, dxl;
  Bytes staging;
  Floats dweights;         // (N,k)
  Bytes dlogits;           // (N,E)
  Bytes ds, dsh, dslogit;  // (N,C), (N,Is), (N)
  // Accumulated: swiglu's gradients, zeroed by the driver before each block's backward (under
  // expert parallelism ExpertRows' (R, I) each, zeroed by the layer).
  Bytes dgate, dup;    // (N*k, I)
  Bytes dsgate, dsup;  // (N,Is)
};

// Router statistics and gradient the load-balancing loss shares across the forward's layers.
struct MoeRouterLoss {
  Floats stats_counts, stats_probsum;  // (E) fp32: zeroed once per forward, summed over layers
  Floats z_sum;                        // (1): the z-loss's mean over the MoE layers
  Floats dprobs_shared;                // (E): the load-balancing loss's d/dprobs, set before bwd
  float z_layer_weight = 0.f;          // 1 / (MoE layers): each layer's share of the z-loss mean
  float z_grad = 0.f;                  // d loss / d z_sum for this backward (coef x loss scale)
  Floats z_scratch;                    // (1)
};

// With a capacity factor: where each expert stands in the forward's token order before the rows
// a layer call covers, so that the forward's capacity is applied in token order however its rows
// are split. Without sequence parallelism the rank's rows are the forward's, in order: one run,
// `ahead` zero, `taken` counting the pairs of the calls so far (the earlier tiles'). Under
// sequence parallelism each sequence of the micro-batch is spread over the sp group, a chunk a
// rank in rank order, so each is a run of `rows_per_run` rows here and `ahead` holds, per run and
// expert, the forward's pairs before this rank's chunk of it (every rank's chunks of the earlier
// sequences, the lower ranks' chunks of this one: MoeModel's routing pre-pass counts them over
// the group). restart() before each pass over the rows (the forward, its recompute, the
// backward's reruns).
struct MoeCapacity {
  std::int64_t forward_pairs = 0;  // the forward's (token, slot) pairs over the sp group
  std::int64_t rows_per_run = 0;
  std::vector<std::int64_t> ahead;  // (runs, E)
  std::vector<std::int64_t> taken;  // (runs, E)
  void restart() { std::fill(taken.begin(), taken.end(), 0); }
};

// The rows a layer call covers among the forward's rows on this rank: a tile
// (model.tiling.mlp_rows: the layer run over a tile of the pass's rows at a time, the backward
// running each tile's forward again) or all of them. The forward's rows, which the z-loss's mean
// is over; the call's first row; and with a capacity factor the forward's MoeCapacity.
struct MoeTile {
  std::int64_t forward_rows = 0;
  std::int64_t first_row = 0;
  MoeCapacity* capacity = nullptr;
};

class MoeLayer {
 public:
  // `dispatch`: expert parallelism's exchange over the ep group, and `rows` the local experts'
  // rows' memory (both must outlive the layer), or both null with every expert local.
  explicit MoeLayer(MoeLayerShape shape, ExpertDispatch* dispatch = nullptr,
                    ExpertRows* rows = nullptr)
      : shape_(shape), dispatch_(dispatch), rows_(rows) {}

  const MoeLayerShape& shape() const { return shape_; }

  // out (N,C) = the layer applied to x (N,C); a null `out` computes only what the backward
  // reads (a tile's recompute). With `loss` the router statistics (and the z-loss, when
  // `with_z_loss`) accumulate into it; null for a recompute, which must not count twice. `tile`:
  // x is a tile of a forward's rows (MoeTile), null for the whole forward.
  void forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
               MoeScratch& scratch, Bytes x, Bytes out, int N, MoeRouterLoss* loss,
               bool with_z_loss, const MoeTile* tile = nullptr) const;
  // The routing pre-pass of a capacity under sequence parallelism: the router's choices for x's
  // N rows (rows first_row... of the rank's forward) added per run of `rows_per_run` rows and per
  // expert into `counts` (runs, E); kept's routing buffers are overwritten.
  void count_choices(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
                     Bytes x, int N, std::int64_t first_row, std::int64_t rows_per_run,
                     std::vector<std::int64_t>& counts) const;
  // dx (N,C) = the gradient into x (OVERWRITTEN); parameter gradients accumulate into g. dout
  // (N,C) is the layer output's gradient; `tile` as the forward's.
  void backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                const MoeParams& g, const MoeKept& kept, MoeScratch& scratch, Bytes x, Bytes dout,
                Bytes dx, int N, const MoeRouterLoss& loss, bool with_z_loss,
                const MoeTile* tile = nullptr) const;

 private:
  // The router's logits, probabilities, weights and top-k choices for x's N rows into kept.
  void choose_experts(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
                      Bytes x, int N) const;
  void route(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
             MoeScratch& scratch, Bytes x, int N, const MoeTile* tile) const;
  // The experts' SwiGLU over the permuted rows (the expert-parallel seam: rows in, rows out).
  void experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                       const MoeKept& kept) const;
  void experts_backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                        const MoeParams& g, const MoeKept& kept, MoeScratch& scratch) const;
  // The same over the ep group: kept.xe (of N tokens' pairs) to the experts' ranks, the local
  // experts' SwiGLU, the outputs back into kept.y; the backward scratch.dy out and scratch.dxe
  // back.
  void remote_experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                              MoeKept& kept, MoeScratch& scratch, int N) const;
  void remote_experts_backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                               const MoeParams& g, const MoeKept& kept, MoeScratch& scratch) const;
  // The grouped SwiGLU of `experts` experts over `offsets`' rows, forward and backward (the
  // strides of MoeParams): shared by the local and the remote paths.
  void swiglu_experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p, Bytes x,
                              Bytes gate, Bytes up, Bytes h, Bytes y,
                              const std::vector<std::int32_t>& offsets, int experts) const;
  void swiglu_experts_backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                               const MoeParams& g, Bytes x, Bytes gate, Bytes up, Bytes h, Bytes dy,
                               Bytes dx, MoeScratch& scratch,
                               const std::vector<std::int32_t>& offsets, int experts) const;
  // The pairs past each expert's capacity, in token order, sent nowhere (kept.routed); the
  // capacity is the whole forward's, the pairs ahead counted (MoeTile::capacity).
  void apply_capacity(kernels::KernelContext& ctx, MoeKept& kept, int N, const MoeTile* tile) const;

  MoeLayerShape shape_;
  ExpertDispatch* dispatch_ = nullptr;
  ExpertRows* rows_ = nullptr;
};

}  // namespace zrt::moe
