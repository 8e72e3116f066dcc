// Llama: the Llama family's decoder (Llama 2/3/3.1/3.2, Qwen2/2.5, Mistral without a sliding
// window) on kernels/ops.h, implementing zrt::Model.
//
// Per block: RMSNorm -> q/k/v projections (biases for Qwen2) -> RoPE on q and k -> causal
// grouped-query attention -> o projection -> residual -> RMSNorm -> SwiGLU MLP (down(silu(gate)
// * up)) -> residual; then a final RMSNorm and the head, tied to the token embedding or its own
// lm_head. No position embedding (positions come from RoPE), no dropout.
//
// Parameters carry exactly transformers' LlamaForCausalLM / Qwen2ForCausalLM state-dict names,
// shapes (nn.Linear weights (out, in)) and order (models/llama/llama_config.h lists them).
// Modules:
//   0          model.embed_tokens.weight
//   1..L       model.layers.{l-1}.*
//   L+1        model.norm.weight, and lm_head.weight (untied) or embed_tokens (tied: that
//              parameter is then SHARED by modules 0 and L+1)
// Initialisation (transformers' _init_weights): weights and the embedding normal(0, 0.02),
// biases 0, RMSNorm weights 1, from the counter RNG keyed on (seed, parameter index, element).
//
// Activations (MemCategory::kActivations) are laid out in one allocation per (B, T, dtype)
// (layout_activations, which activation_bytes counts exactly). With activation checkpointing
// only each block's input is kept and the block's forward reruns inside its backward.
//
// Not thread-safe; one pass at a time per Llama.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/rope_table.h"
#include "models/llama/llama_config.h"
#include "runtime/device/buffer.h"
#include "runtime/model_interface.h"

namespace zrt::llama {

struct LlamaOptions {
  bool activation_checkpointing = false;
};

class Llama final : public Model {
 public:
  // Validates `config` (InvalidArgument naming the key).
  Llama(LlamaConfig config, kernels::KernelContext& ctx, LlamaOptions options = {});

  const LlamaConfig& config() const { return config_; }

  const std::vector<ParamSpec>& parameters() const override { return params_; }
  int num_modules() const override { return config_.num_hidden_layers + 2; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;
  void forward_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale) override;
  void forward(ParamAccess& access, const TokenBatch& batch) override;
  DevicePtr<const float> loss() const override { return loss_; }
  // The logits (B,T,V) of the last forward(); after forward_backward, their gradient.
  DevicePtr<const std::byte> logits() const override { return acts_.logits; }
  std::int64_t logits_row_stride() const override;
  bool supports_packed_documents() const override { return true; }

  // Copies loss() to the host, waiting for the stream (tests and tools).
  float read_loss();
  // The residual stream (B,T,hidden_size) of the last pass after block i-1 (i = 0: the token
  // embeddings), in the compute dtype: transformers' per-layer hidden states (tests).
  DevicePtr<const std::byte> residual(int i) const { return acts_.residual.at(i); }

  // The parameter table of `config` (transformers' names and order), without building a model.
  static std::vector<ParamSpec> parameter_table(const LlamaConfig& config);
  // Device bytes of activations one (B, T) pass in `dtype` allocates (its loss scalar included).
  static std::int64_t activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                       bool activation_checkpointing);

  // Block parameter slots in transformers' order; the bias slots exist with attention_bias.
  enum Slot { kQW, kQB, kKW, kKB, kVW, kVB, kOW, kGateW, kUpW, kDownW, kLn1W, kLn2W, kNumSlots };
  // Index into parameters() of `slot` of block `layer` (-1: a bias the model does not have).
  int block_param(int layer, int slot) const;
  int embed() const { return 0; }
  int norm() const { return 1 + config_.num_hidden_layers * per_layer_; }
  int head() const { return config_.tie_word_embeddings ? embed() : norm() + 1; }

 private:
  using Bytes = DevicePtr<std::byte>;
  using Floats = DevicePtr<float>;

  struct BlockActs {
    Bytes ln1, q, k, v, atty, res2, ln2, gate, up, h;
    Floats ln1_rstd, ln2_rstd, lse;  // lse: attention's row log-sum-exp (B,NH,T)
  };
  struct Acts {
    std::vector<Bytes> residual;   // L+1 of (B,T,C): [0] embeddings, [l+1] block l's output
    std::vector<BlockActs> block;  // L, or 1 reused by all blocks with checkpointing
    Bytes proj;                    // (B,T,C): o_proj / down_proj outputs before the residual add
    Bytes lnf, logits;
    Floats lnf_rstd, losses;
    // Gradients: dres (the residual stream's, in place block by block), dlnf, and one block's
    // scratch. The first projection into dln1, datty, dln2 and dh overwrites it; attention and
    // SwiGLU accumulate into dq, dk, dv, dgate and dup, which are one region
    // (accumulated_grads), zeroed before each block.
    Bytes dres, dlnf, dln1, dq, dk, dv, datty, dln2, dgate, dup, dh;
    Bytes accumulated_grads;
    std::int64_t accumulated_grad_bytes = 0;
  };

  static std::int64_t layout_activations(const LlamaConfig& c, bool checkpointing, int B, int T,
                                         DType dtype, Acts* acts, Bytes base);
  void prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets);
  void run_forward(ParamAccess& access, const TokenBatch& batch, Phase phase);
  void block_forward(ParamAccess& access, int layer, const BlockActs& a, Bytes res_in,
                     Bytes res_out);
  void block_backward(ParamAccess& access, int layer, const BlockActs& a, Bytes res_in);
  const BlockActs& block_acts(int layer) const;

  LlamaConfig config_;
  LlamaOptions options_;
  kernels::KernelContext& ctx_;
  std::vector<ParamSpec> params_;
  int per_layer_ = 0;                // parameters per block
  int slot_offset_[kNumSlots] = {};  // -1: absent
  kernels::RopeTable rope_;

  int B_ = 0, T_ = 0;
  // The current batch's packed documents (TokenBatch): null for one document a row.
  DevicePtr<const std::int32_t> positions_, doc_start_;
  DType dtype_ = DType::kFloat32;
  DType grad_dtype_ = DType::kFloat32;
  Buffer act_buffer_;
  Acts acts_;
  Buffer loss_buffer_;
  Floats loss_;
};

// The rotary table of a config (kernels/rope_table.h).
kernels::RopeTable rope_table(const LlamaConfig& config);

}  // namespace zrt::llama
