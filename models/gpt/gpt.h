// Gpt: the GPT-2 architecture (no dropout) on kernels/ops.h, implementing zrt::Model.
//
// Parameters carry Hugging Face GPT-2 names, shapes and order (Conv1D weights stored
// (in, out)); the LM head is tied to transformer.wte.weight, which is therefore SHARED by
// module 0 (lookup) and the final module (logits). Modules:
//   0          transformer.wte.weight, transformer.wpe.weight
//   1..L       transformer.h.{l-1}.* (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
//              mlp.c_proj; weights and biases)
//   L+1        transformer.ln_f.weight, transformer.ln_f.bias, and wte (tied head)
// Initialisation (GPT-2's): weights normal(0, 0.02), c_proj weights normal(0, 0.02 /
// sqrt(2 L)), biases 0, LayerNorm weights 1, from the counter RNG in models/init_rng.h keyed on
// (seed, parameter index, element).
//
// Everything but the blocks (the module order, activation checkpointing, the embeddings, the
// final LayerNorm, the tied head and the loss, the activations' allocation) is the shared
// driver's, models/transformer/transformer_model.h.
//
// Under Ulysses sequence parallelism (GptOptions::sequence_group of sp ranks) a pass is this
// rank's chunk of each sequence; the position embedding reads the chunk's global positions (the
// driver's), and the attention sends the chunk's packed q, k, v through one all-to-all
// (UlyssesExchange::to_heads_packed), attends over the whole sequence with n_head / sp heads
// (multi-head attention: every head its own key and value) and sends the output back to the chunk.
//
// Not thread-safe; one pass at a time per Gpt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/gpt/gpt_config.h"
#include "models/transformer/sequence_parallel_shape.h"
#include "models/transformer/transformer_model.h"
#include "runtime/model_interface.h"

namespace zrt::gpt {

using GptOptions = transformer::TransformerOptions;

class Gpt final : public transformer::TransformerModel {
 public:
  // Validates `config` and, under sequence parallelism, that it splits over the group
  // (InvalidArgument naming the keys).
  Gpt(GptConfig config, kernels::KernelContext& ctx, GptOptions options = {});

  const GptConfig& config() const { return config_; }

  const std::vector<ParamSpec>& parameters() const override { return params_; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;
  // Activation bytes a pass at (B, T) in `dtype` allocates (without the loss scalar).
  std::int64_t activation_bytes(int B, int T, DType dtype) const;
  // The same for a Gpt of `config` built with `options`, without building one (with the loss
  // scalar): at sequence parallelism T is the rank's chunk (options' planned size counts).
  static std::int64_t planned_activation_bytes(const GptConfig& config, const GptOptions& options,
                                               int B, int T, DType dtype);

  // The parameter table a Gpt of `config` reports (Hugging Face names and order), without
  // building one.
  static std::vector<ParamSpec> parameter_table(const GptConfig& config);
  // What sequence parallelism asks of `config`'s shape (models/transformer/
  // sequence_parallel_shape.h), and why it cannot run at sequence_parallel_size `sp` (each
  // naming the keys and the fix); empty when it can: sp divides n_head and seq_len.
  static transformer::SequenceParallelShape sequence_parallel_shape(const GptConfig& config);
  static std::vector<std::string> sequence_parallel_problems(const GptConfig& config, int sp);

  // Indices into parameters().
  int wte() const { return spec().token_embedding; }
  int wpe() const { return spec().position_embedding; }
  int lnf_weight() const { return spec().final_norm_weight; }
  int lnf_bias() const { return spec().final_norm_bias; }
  // Parameter `slot` (0..11 in Hugging Face order: ln_1.weight, ln_1.bias, c_attn.weight,
  // c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, ln_2.weight, ln_2.bias, c_fc.weight,
  // c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias) of block `layer`.
  int block_param(int layer, int slot) const { return 2 + layer * kBlockParams + slot; }
  static constexpr int kBlockParams = 12;

 private:
  // What the blocks keep for their backward, and one block's gradient scratch.
  class Activations final : public transformer::BlockActivations {
   public:
    Activations(const GptConfig& config, int sp_size) : sp(sp_size), config_(config) {}
    void plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                      const transformer::KeptSets& sets) override;
    void plan_backward(ActivationPlanner& p, const transformer::PassShape& s) override;
    void plan_accumulated(ActivationPlanner& p, const transformer::PassShape& s) override;

    struct Kept {
      Bytes ln1, qkv, atty, attproj, res2, ln2, fch, fch_gelu, fcproj;
      Floats ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, att_lse;
      // Sequence parallelism: qkv and att_lse hold this rank's heads of the whole sequence
      // (B,sp*T,3,NH/sp,hs), the same sizes; atty_full is the attention's output there, atty
      // the chunk's, every head.
      Bytes atty_full;
    };
    std::vector<Kept> kept;  // L, or 1 shared by all blocks with checkpointing
    // Sequence parallelism: the all-to-alls' buffers (the chunk's qkv projection lives in the
    // kept set's qkv until the all-to-all turns it into the whole sequence's in place).
    Bytes send, recv;
    // The matmuls overwrite dln1, datty, dln2, dfch (with the GELU's gradient,
    // kernels::matmul_dgelu_backward) and dfch_gelu (that op's unfused scratch), their one
    // producer; so does attention dqkv without sequence parallelism (GradWrite::kOverwrite),
    // and under it accumulates into dqkv in the accumulated region, datty and dqkv holding the
    // whole sequence's layout between the all-to-alls (attention_backward), the chunk's before
    // and after.
    Bytes dln1, datty, dln2, dfch, dfch_gelu, dqkv;

    const int sp;  // sequence_parallel_size

   private:
    const GptConfig& config_;
  };

  transformer::BlockActivations& block_activations() override { return acts_; }
  // The attention, from the block's qkv to x.atty, and its backward into dqkv: over the batch's
  // rows here, or over the whole sequences through the sp group's all-to-alls (qkv first in the
  // chunk's scratch).
  void attention_forward(const Activations::Kept& x);
  void attention_backward(const Activations::Kept& x);
  void block_forward(ParamAccess& access, int layer, Bytes res_in, Bytes res_out) override;
  void block_backward(ParamAccess& access, int layer, Bytes res_in) override;

  GptConfig config_;
  std::vector<ParamSpec> params_;
  Activations acts_;
};

}  // namespace zrt::gpt
