// Llama: the Llama family's decoder (Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3, Mistral, with their
// sliding windows: LlamaConfig::layer_window) on kernels/ops.h, implementing zrt::Model.
//
// Per block: RMSNorm -> q/k/v projections (biases for Qwen2) -> an RMSNorm over each q and k
// head (Qwen3's q_norm / k_norm) -> RoPE on q and k -> causal
// grouped-query attention -> o projection -> residual -> RMSNorm -> SwiGLU MLP (down(silu(gate)
// * up)) -> residual; then a final RMSNorm and the head, tied to the token embedding or its own
// lm_head. No position embedding (positions come from RoPE), no dropout.
//
// Parameters carry exactly transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
// MistralForCausalLM state-dict names,
// shapes (nn.Linear weights (out, in)) and order (models/llama/llama_config.h lists them).
// Modules:
//   0          model.embed_tokens.weight
//   1..L       model.layers.{l-1}.*
//   L+1        model.norm.weight, and lm_head.weight (untied) or embed_tokens (tied: that
//              parameter is then SHARED by modules 0 and L+1)
// Initialisation (transformers' _init_weights): weights and the embedding normal(0, 0.02),
// biases 0, RMSNorm weights 1, from the counter RNG keyed on (seed, parameter index, element).
//
// Everything but the blocks (the module order, activation checkpointing, the embedding, the
// final RMSNorm, the head and the loss, the activations' allocation) is the shared driver's,
// models/transformer/transformer_model.h.
//
// Not thread-safe; one pass at a time per Llama.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/rope_table.h"
#include "kernels/ulysses_ops.h"
#include "models/llama/llama_config.h"
#include "models/transformer/sequence_parallel_shape.h"
#include "models/transformer/swiglu_mlp_tiles.h"
#include "models/transformer/transformer_model.h"
#include "runtime/model_interface.h"

namespace zrt::llama {

using LlamaOptions = transformer::TransformerOptions;

class Llama final : public transformer::TransformerModel {
 public:
  // Validates `config` (InvalidArgument naming the key).
  Llama(LlamaConfig config, kernels::KernelContext& ctx, LlamaOptions options = {});

  const LlamaConfig& config() const { return config_; }

  const std::vector<ParamSpec>& parameters() const override { return params_; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;

  // The parameter table of `config` (transformers' names and order), without building a model.
  static std::vector<ParamSpec> parameter_table(const LlamaConfig& config);
  // Device bytes of activations one (B, T) pass in `dtype` allocates (its loss scalar included).
  static std::int64_t activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                       bool activation_checkpointing);
  // What sequence parallelism asks of `config`'s shape (models/transformer/
  // sequence_parallel_shape.h), and why it cannot run at sequence_parallel_size `sp` (each
  // naming the keys and the fix); empty when it can: sp divides the query heads, the key/value
  // heads split over sp or divide it, and sp divides seq_len.
  static transformer::SequenceParallelShape sequence_parallel_shape(const LlamaConfig& config);
  static std::vector<std::string> sequence_parallel_problems(const LlamaConfig& config, int sp);
  // The same for a model built with `options` (cpu_checkpointing, tiling): device bytes, and the
  // pinned host bytes of the offloaded block inputs.
  static std::int64_t activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                       const LlamaOptions& options);
  static std::int64_t host_activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                            const LlamaOptions& options);

  // Block parameter slots in transformers' order; the bias slots exist with attention_bias, the
  // q/k norms with qk_norm() (Qwen3).
  enum Slot {
    kQW,
    kQB,
    kKW,
    kKB,
    kVW,
    kVB,
    kOW,
    kQNormW,
    kKNormW,
    kGateW,
    kUpW,
    kDownW,
    kLn1W,
    kLn2W,
    kNumSlots
  };
  // Index into parameters() of `slot` of block `layer` (-1: a slot the model does not have).
  int block_param(int layer, int slot) const;
  int embed() const { return spec().token_embedding; }
  int norm() const { return spec().final_norm_weight; }
  int head() const { return spec().head; }

 private:
  // What the blocks keep for their backward, the projections' scratch and one block's gradient
  // scratch.
  class Activations final : public transformer::BlockActivations {
   public:
    Activations(const LlamaConfig& config, int sp);
    void plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                      const transformer::KeptSets& sets) override;
    void plan_backward(ActivationPlanner& p, const transformer::PassShape& s) override;
    void plan_accumulated(ActivationPlanner& p, const transformer::PassShape& s) override;

    struct Kept {
      Bytes ln1, q, k, v, atty, res2, ln2, gate, up, h;
      Floats ln1_rstd, ln2_rstd, lse;  // lse: attention's row log-sum-exp (B,NH,T)
      // Sequence parallelism: q, k, v and lse are this rank's heads of the whole sequence,
      // (B,sp*T,heads,hd); atty_full the attention's output there, atty the chunk's, every head.
      Bytes atty_full;
      // Qwen3 (qk_norm): the projections' q and k before their per-head RMSNorm (the chunk's
      // rows, every head), and that norm's reciprocal RMS per (token, head).
      Bytes q_pre, k_pre;
      Floats q_rstd, k_rstd;
    };
    std::vector<Kept> kept;  // L, or 1 reused by all blocks with checkpointing
    Bytes proj;              // (B,T,C): o_proj / down_proj outputs before the residual add
    // Sequence parallelism: the all-to-alls' buffers (the chunk's q, k, v live in the kept set's
    // q, k, v until the all-to-alls turn them into the whole sequence's in place).
    Bytes send, recv;
    // The tiled MLP (TransformerOptions::mlp_tile_rows, tiling.h): rows per tile (N when
    // untiled); when tiled, the kept sets have no gate, up and h, which live for one tile in
    // these (rows, I) tensors, and dh, dgate, dup are (rows, I) too.
    int mlp_rows = 0;
    bool mlp_tiled = false;
    Bytes tile_gate, tile_up, tile_h;
    // The first projection into dln1, datty, dln2 and dh overwrites it; attention and SwiGLU
    // accumulate into dq, dk, dv, dgate and dup (the accumulated region). Under sequence
    // parallelism datty, dq, dk and dv hold the whole sequence's layout between the all-to-alls
    // (attention_backward), the chunk's before and after.
    Bytes dln1, datty, dln2, dh, dq, dk, dv, dgate, dup;
    // Qwen3 (qk_norm): the gradients of q_pre and k_pre (accumulated: the per-head RMSNorm's
    // backward adds into its input's gradient).
    Bytes dq_pre, dk_pre;

    // The block's widths: hidden, intermediate, head_dim, query and key/value heads, and the
    // widths of q and of k and v.
    struct Widths {
      int C, I, hd, NH, NKV, Q, KV;
    };
    const Widths widths;
    const bool qk_norm;  // Qwen3's q_norm / k_norm
    // The attention's heads and how sequence parallelism shares them out (heads.sp; the width
    // per chunk token of this rank's whole-sequence k and v, heads.KV_full).
    const transformer::GqaHeads heads;
  };

  // The MLP's weights (or their gradients) of block `layer`, and the tiled MLP's tile
  // (transformer/swiglu_mlp_tiles.h).
  transformer::SwigluWeights mlp_weights(ParamAccess& access, int layer, bool grads) const;
  transformer::SwigluTile mlp_tile() const;

  transformer::BlockActivations& block_activations() override { return acts_; }
  // The attention's tensors of kept set `x` (transformer_model.h's gqa_attention_*).
  static GqaTensors attention_tensors(const Activations::Kept& x);
  void block_forward(ParamAccess& access, int layer, Bytes res_in, Bytes res_out) override;
  void block_backward(ParamAccess& access, int layer, Bytes res_in) override;

  LlamaConfig config_;
  std::vector<ParamSpec> params_;
  int per_layer_ = 0;                // parameters per block
  int slot_offset_[kNumSlots] = {};  // -1: absent
  kernels::RopeTable rope_;
  Activations acts_;
};

// The rotary table of a config (kernels/rope_table.h).
kernels::RopeTable rope_table(const LlamaConfig& config);

}  // namespace zrt::llama
