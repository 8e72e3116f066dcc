// The activations of one (B, T, dtype) pass of a transformer, laid out in one allocation: the
// part every model here has (TransformerActs: the residual stream, the head, the loss, the
// residual stream's gradient) around the part its blocks own (BlockActivations).
//
// The layout, in order (S = bytes per element of the compute dtype, N = B*T, statistics fp32,
// each tensor rounded up to kActivationAlign bytes by ActivationPlanner):
//   residual stream       L + 1 of (N,C): [0] the embeddings, [l+1] block l's output; with
//                         cpu_checkpointing and L > 2 three: two slots that block l's input
//                         takes in turn (l % 2, checkpoint_offload.h) and [L]. Below the first
//                         block whose backward runs (F, ParamAccess::first_backward_module) the
//                         stream is the forward's alone: [l] for l < F takes slot l % 2 of the
//                         first two, so L + 1 - F + min(F, 2) rows
//   the blocks' forward   BlockActivations::plan_forward (KeptSets: a set per block from F, one
//                         that the blocks below F share, or 1 under checkpointing)
//   head                  lnf (N,C), its mean (LayerNorm only) and rstd (N); logits (R,V) in
//                         rows of kernels::logits_row_stride(V) (their gradient in place), R
//                         the head's tile rows (tiling.h; N for whole logits); losses (N)
//   backward              dres, dlnf (N,C); BlockActivations::plan_backward; then the
//                         accumulated region (BlockActivations::plan_accumulated)
// Planning with no base counts the bytes alone: that is how activation_bytes hooks count
// exactly what a model allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/activation_planner.h"
#include "models/transformer/transformer_spec.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt::transformer {

// The sizes a pass's tensors are planned from.
struct PassShape {
  int B = 0, T = 0;
  std::int64_t S = 0;  // bytes per element of the compute dtype
  // TransformerOptions::mlp_tile_rows, for a model whose blocks tile their MLP (tiling.h).
  int mlp_tile_setting = 0;
  std::int64_t N() const { return std::int64_t{B} * T; }
};

// The blocks' kept activation sets: one for each block whose backward runs; under activation
// checkpointing one for all (each block's rerun refills it before its backward); and one that the
// blocks below the first with a backward (`first_backward_block`: frozen lower layers,
// ParamAccess::first_backward_module) share, since nothing reads what their forward keeps.
struct KeptSets {
  int count = 0;
  std::vector<int> of_layer;  // the set block l uses
};
KeptSets kept_sets(int n_layer, bool activation_checkpointing, int first_backward_block);

// A model's own activations: what its blocks keep for their backward and one block's gradient
// scratch. Each hook appends its tensors to the planner, always in the same order.
class BlockActivations {
 public:
  virtual ~BlockActivations() = default;
  // The tensors the blocks' forward keeps for their backward, sets.count times (KeptSets), then
  // any forward scratch the blocks share.
  virtual void plan_forward(ActivationPlanner& p, const PassShape& s, const KeptSets& sets) = 0;
  // One block's gradient scratch that its backward overwrites before reading it.
  virtual void plan_backward(ActivationPlanner& p, const PassShape& s) = 0;
  // One block's gradient scratch that its backward accumulates into: one region, which the
  // driver zeroes before each block's backward.
  virtual void plan_accumulated(ActivationPlanner& p, const PassShape& s) = 0;
};

struct TransformerActs {
  using Bytes = DevicePtr<std::byte>;
  using Floats = DevicePtr<float>;
  std::vector<Bytes> residual;  // L+1 of (B,T,C)
  Bytes lnf, logits;            // (B,T,C), (B,T,V)
  Floats lnf_mean, lnf_rstd, losses;
  // The residual stream's gradient, updated in place block by block, and the final norm's
  // output gradient.
  Bytes dres, dlnf;
  Bytes accumulated_grads;  // BlockActivations::plan_accumulated's region
  std::int64_t accumulated_grad_bytes = 0;
  int head_rows = 0;  // the logits' rows: the head's tile (N when whole)
  KeptSets kept;      // which of the blocks' kept sets each block uses
};

// The rows a head tile takes for a pass of N rows: N for whole logits (a pass without targets
// keeps them, transformer_model.h), else TransformerOptions::head_tile_rows resolved by tiling.h.
int head_tile_rows(const TransformerSpec& spec, const TransformerOptions& options, std::int64_t N,
                   std::int64_t S, bool whole_logits);
// The same for a vocabulary of `vocab_size` and a pass with targets (the model defs' planning).
int head_tile_rows(int vocab_size, const TransformerOptions& options, std::int64_t N,
                   std::int64_t S);

// Lays a (B, T, dtype) pass out: returns its bytes and, if base is set, points the fields of
// `acts` and `blocks` into it. `whole_logits`: (N,V) logits whatever the tiling;
// `first_backward_block`: the lowest block whose backward runs (0: all; the layout above).
std::int64_t layout_activations(const TransformerSpec& spec, const TransformerOptions& options,
                                int B, int T, DType dtype, BlockActivations& blocks,
                                TransformerActs* acts, DevicePtr<std::byte> base,
                                bool whole_logits = false, int first_backward_block = 0);

}  // namespace zrt::transformer
