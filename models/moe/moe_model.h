// MoeModel: transformers' MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM on the
// shared driver (models/transformer/transformer_model.h), implementing zrt::Model.
//
// Per block: RMSNorm -> q/k/v projections (biases for Qwen2-MoE) -> per-head q/k RMSNorm
// (Qwen3-MoE) -> RoPE -> causal grouped-query attention -> o projection -> residual -> RMSNorm
// -> the MLP: a routed mixture of SwiGLU experts (models/moe/moe_layer.h, plus Qwen2-MoE's
// sigmoid-gated shared expert) or, on Qwen2/3-MoE's dense layers, a SwiGLU MLP -> residual.
//
// The loss of a training pass (forward_backward) is transformers' training loss of that
// forward: cross-entropy (TokenBatch's rule) + router_aux_loss_coef x the load-balancing term
// over the forward's tokens and all its MoE layers (+ router_z_loss_coef x the router z-loss, the
// mean over the MoE layers' rows of logsumexp^2, when set). The terms' gradients flow through
// every router. aux_loss() holds the load-balancing term alone. An evaluation pass (forward)
// reports the cross-entropy only. How the per-forward term adds up over accumulation and ranks:
// docs/config.md ("Mixture of experts").
//
// Parameters: models/moe/moe_config.h (transformers v5's names and order, the fused experts).
// Modules as every transformer here: 0 the embedding, 1..L the blocks, L+1 the norm and head.
//
// Expert parallelism (MoeOptions::expert_group of ep > 1 ranks, this rank at position p): each
// MoE layer's experts p*E/ep .. (p+1)*E/ep-1 are this rank's, one parameter per expert and
// projection named by its GLOBAL index, where the fused pair stood:
//   model.layers.{i}.mlp.experts.{e}.gate_up_proj  [2*moe_intermediate, hidden]  (ParamSpec group
//   1) model.layers.{i}.mlp.experts.{e}.down_proj     [hidden, moe_intermediate]    (group 1)
// (the local experts' gate_up first, then their down: each kind is evenly spaced in the engine's
// unit, which the grouped GEMMs read as one strided tensor). Every rank has the same shapes; the
// routers, the shared expert and everything else are group 0 with the same names on every rank.
// Their initial values are the fused parameters' rows (init_parameter), so a run at any ep starts
// from the same model. The experts' rows travel through ExpertDispatch (moe_layer.h).
//
// Not thread-safe; one pass at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/rope_table.h"
#include "models/moe/expert_rows.h"
#include "models/moe/moe_config.h"
#include "models/moe/moe_layer.h"
#include "models/transformer/swiglu_mlp_tiles.h"
#include "models/transformer/transformer_model.h"
#include "runtime/device/buffer.h"
#include "runtime/model_interface.h"

namespace zrt::moe {

using MoeOptions = transformer::TransformerOptions;

// Routing counts of the training passes since the last take_routing_stats().
struct RoutingStats {
  std::int64_t min_tokens = 0;  // the fewest (token, slot) pairs an expert of a layer received
  std::int64_t max_tokens = 0;  // the most
  std::int64_t dropped = 0;     // pairs dropped by the capacity factor
  int passes = 0;               // training passes counted
};

class MoeModel final : public transformer::TransformerModel {
 public:
  // Validates `config` (InvalidArgument naming the key).
  MoeModel(MoeConfig config, kernels::KernelContext& ctx, MoeOptions options = {});

  const MoeConfig& config() const { return config_; }
  const std::vector<ParamSpec>& parameters() const override { return params_; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;

  // Every rank's table at ep 1 (`experts` of one rank); under expert parallelism the table of
  // the rank at `experts`.ep_rank (its local experts only, group 1).
  static std::vector<ParamSpec> parameter_table(const MoeConfig& config,
                                                const ExpertPartition& experts = {});
  // Device bytes of activations one (B, T) pass in `dtype` allocates (the loss scalar and the
  // router statistics included); under expert parallelism (`expert_parallel_size` ep > 1) with
  // the local experts' rows (ExpertRows) at `expert_rows` rows, where `expert_rows_reserve`
  // starts them (0), or at the dropless worst case (-1).
  static std::int64_t activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                       bool activation_checkpointing, int expert_parallel_size = 1,
                                       std::int64_t expert_rows = 0,
                                       double expert_rows_reserve = kDefaultExpertRowsReserve);
  // The same for a model built with `options` (checkpointing, cpu_checkpointing, the tiles,
  // expert_rows_reserve and the planned sequence_parallel_size: at sp > 1 T is a chunk's length,
  // the attention's tensors and all-to-all scratch over the whole sequence counted as the Llama
  // family's), and the pinned host bytes of its offloaded block inputs (cpu_checkpointing).
  static std::int64_t activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                       const MoeOptions& options, int expert_parallel_size,
                                       std::int64_t expert_rows);
  static std::int64_t host_activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                            const MoeOptions& options);
  // Under sequence parallelism: the fp32 values of the forward's statistics summed over the
  // sequence-parallel group, the load-balancing counts and probability sums (with their
  // padding), in one all-reduce; the z-loss's sum is a second of one value.
  static std::int64_t sequence_group_sum_floats(const MoeConfig& config);
  // Why it cannot run at sequence_parallel_size `sp` (models/transformer/
  // sequence_parallel_shape.h: the attention's heads and the sequence split), each naming the
  // keys and the fix; empty when it can.
  static std::vector<std::string> sequence_parallel_problems(const MoeConfig& config, int sp);
  // The expert partition of this rank (ep_size 1 without expert parallelism).
  const ExpertPartition& experts() const { return experts_; }

  // The tiled MLP (TransformerOptions::mlp_tile_rows, model.tiling.mlp_rows; tiling.h): the rows
  // a MoE layer takes at a time for a pass of N rows (`S` bytes an element), by the automatic
  // rule over its per-token tensors (moe_row_bytes) or the setting, and the same for the dense
  // layers' SwiGLU MLP (Qwen2/3-MoE's mlp_only_layers). A tiled MoE layer routes, runs its
  // experts and combines a tile of rows at a time, keeps nothing of them for the backward, and
  // the backward runs each tile's forward again (in token order: a capacity factor drops the
  // same pairs as untiled) before its gradients; under expert parallelism every tile is one
  // exchange (every rank of the group has the same N, so the same tiles).
  static std::int64_t moe_row_bytes(const MoeConfig& config, std::int64_t S);
  static int moe_tile_rows(const MoeConfig& config, int setting, std::int64_t N, std::int64_t S);
  static int dense_tile_rows(const MoeConfig& config, int setting, std::int64_t N, std::int64_t S);
  // The rows the last pass's MoE layers and dense MLPs took a tile (its N when untiled).
  struct MlpTiles {
    int moe_rows = 0, dense_rows = 0;
  };
  MlpTiles mlp_tiles() const { return {acts_.moe_rows, acts_.dense_rows}; }

  // The load-balancing term of the last training pass (fp32, device; before the coefficient).
  DevicePtr<const float> aux_loss() const override { return lb_; }
  // Per expert and MoE layer, the (token, slot) pairs routed to it in the training passes since
  // the last call (host, counted as the dispatch plans come back; evaluation passes are not
  // counted); resets the counts.
  std::optional<ExpertLoad> take_expert_load() override;
  // take_expert_load() summarised: the fewest and most pairs an expert of a layer received.
  RoutingStats take_routing_stats();

  enum Slot {
    kQW,
    kQB,
    kKW,
    kKB,
    kVW,
    kVB,
    kOW,
    kQNorm,
    kKNorm,
    kRouter,
    kGateUp,
    kDown,
    kSharedGateProj,
    kSharedUpProj,
    kSharedDownProj,
    kSharedExpertGate,
    kDenseGate,
    kDenseUp,
    kDenseDown,
    kLn1,
    kLn2,
    kNumSlots
  };
  // Index into parameters() of `slot` of block `layer`, -1 where the block has none.
  int block_param(int layer, int slot) const {
    return slots_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(slot)];
  }

 private:
  class Activations final : public transformer::BlockActivations {
   public:
    Activations(const MoeConfig& config, int expert_parallel_size, int sequence_parallel_size);
    void plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                      const transformer::KeptSets& sets) override;
    void plan_backward(ActivationPlanner& p, const transformer::PassShape& s) override;
    void plan_accumulated(ActivationPlanner& p, const transformer::PassShape& s) override;
    // A MoE layer's kept tensors for `rows` rows (a set's, or the tile's).
    void plan_moe_set(ActivationPlanner& p, MoeKept& m, std::int64_t rows, std::int64_t S);
    // The SwiGLU gradients the experts (and the shared expert) add into, for `rows` rows: the
    // accumulated region's, or a tile's in the backward's scratch.
    void plan_moe_swiglu_gradients(ActivationPlanner& p, std::int64_t rows, std::int64_t S);

    struct Kept {
      Bytes ln1, q, k, v, q_pre, k_pre, atty, res2, ln2;
      Floats ln1_rstd, ln2_rstd, q_rstd, k_rstd, lse;
      // Sequence parallelism: q, k, v and lse hold this rank's heads of the whole sequence once
      // the attention ran; atty_full its output there (gqa_attention_block.h).
      Bytes atty_full;
      Bytes gate, up, h;  // a dense layer's MLP
      MoeKept moe;
    };
    std::vector<Kept> kept;
    Bytes proj;        // (N,C): o_proj / the MLP's output before the residual add
    Bytes send, recv;  // sequence parallelism: the all-to-alls' scratch
    MoeScratch moe;
    Bytes dln1, datty, dln2, dh;
    Bytes dq, dk, dv, dq_pre, dk_pre, dgate, dup;  // accumulated (dgate, dup: a tile's if tiled)
    // The tiled MLP (moe_tile_rows): the rows of a tile (N when untiled), and, tiled, the tile's
    // MoE set (the kept sets have none) or the dense MLP's gate, up, h (dense_tile.rows rows).
    int moe_rows = 0, dense_rows = 0;
    bool moe_tiled = false, dense_tiled = false;
    MoeKept moe_tile;
    transformer::SwigluTile dense_tile;
    // A capacity factor under sequence parallelism: every rank's routing counts (sp, B, E) int32
    // (MoeModel::plan_capacity).
    Bytes capacity_counts;

    const MoeConfig& c;
    int ep = 1;
    bool any_dense = false, any_moe = false;
    // The attention's heads and how sequence parallelism shares them out.
    transformer::GqaHeads heads;
  };

  transformer::BlockActivations& block_activations() override { return acts_; }
  void block_forward(ParamAccess& access, int layer, Bytes res_in, Bytes res_out) override;
  void block_backward(ParamAccess& access, int layer, Bytes res_in) override;
  void add_auxiliary_losses(Floats loss, float loss_scale) override;
  // The local experts' buffers all at the capacity the pass reached (ExpertRows::settle).
  void blocks_backward_done() override;

  MoeParams moe_params(ParamAccess& a, int layer, bool grads) const;
  // A dense layer's SwiGLU weights (or gradients), and its tile (the backward's tensors set).
  transformer::SwigluWeights dense_weights(ParamAccess& a, int layer, bool grads) const;
  transformer::SwigluTile dense_tile() const;
  // A MoE layer over the pass's rows in tiles of acts_.moe_rows: the forward into acts_.proj
  // (`counting`: a training or evaluation forward, whose routing is counted), and the backward
  // from dres into dln2, each tile's forward run again first.
  void moe_tiled_forward(ParamAccess& a, int layer, Bytes ln2, bool counting);
  void moe_tiled_backward(ParamAccess& a, int layer, Bytes ln2);
  // The routed pairs of MoE layer `layer`'s last forward (a tile's) added to the pass's counts.
  void count_routing(int layer, const MoeKept& kept);
  // MoE layer `layer`'s index among the MoE layers.
  int moe_index(int layer) const;
  // With a capacity factor, MoE layer `layer`'s MoeCapacity, restarted; null without one. A
  // `fresh` forward (not a recompute, not the backward's reruns) plans it first: the forward's
  // pairs and, under sequence parallelism, the pairs ahead of this rank's chunk of each sequence,
  // from a routing pre-pass over `ln2` (the layer's input, in tiles when the layer is tiled, into
  // `kept`'s routing buffers) whose counts are gathered over the sp group.
  MoeCapacity* capacity_for(ParamAccess& a, int layer, Bytes ln2, MoeKept& kept, bool fresh);
  // Elements from one local expert's parameter (or gradient) to the next's, from parameter
  // `first` (the first local expert's) on; throws Error unless they are evenly spaced.
  std::int64_t local_expert_stride(ParamAccess& a, int first, bool grads, DType dtype) const;
  static std::int64_t router_bytes(const MoeConfig& config);

  MoeConfig config_;
  ExpertPartition experts_;
  // Expert parallelism's exchange and the memory of the rows this rank's experts receive (null
  // at ep 1), before the layer that uses them.
  std::unique_ptr<ExpertDispatch> dispatch_;
  std::unique_ptr<ExpertRows> rows_;
  std::vector<ParamSpec> params_;
  // Per parameter: the ep-1 table's parameter and element offset its initial values are read
  // from (an expert's own parameter: its rows of the fused one).
  std::vector<std::pair<int, std::int64_t>> init_source_;
  std::vector<std::array<int, kNumSlots>> slots_;
  kernels::RopeTable rope_;
  MoeLayer layer_;
  int first_moe_layer_ = -1;
  Activations acts_;
  // The router losses' state, which outlives a pass's activations: the load-balancing
  // statistics, the z-loss sum, the shared gradient and the term itself (router_bytes()).
  Buffer router_buffer_;
  MoeRouterLoss router_;
  Floats lb_;
  // Routing counts of the current forward (committed by a training pass's
  // add_auxiliary_losses) and of the training passes since take_expert_load (layer-major, E per
  // MoE layer).
  std::vector<std::int64_t> pass_tokens_, expert_tokens_;
  std::int64_t pass_dropped_ = 0, dropped_ = 0;
  int passes_ = 0;
  // With a capacity factor: each MoE layer's plan of the current forward, kept for its recompute
  // and the backward's reruns (host memory: runs x E counts).
  std::vector<MoeCapacity> capacity_;
};

}  // namespace zrt::moe
