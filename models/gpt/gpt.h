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
// The model owns only activations (MemCategory::kActivations, allocated on first use for a
// (B, T, dtype) and reused) and enqueues everything on the KernelContext's stream. With
// activation checkpointing only each block's input is kept; the block's forward is recomputed
// inside its backward (acquire/release(m, kRecompute) just before acquire(m, kBackward)).
//
// Not thread-safe; one pass at a time per Gpt (passes on one stream are ordered anyway).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/gpt/gpt_config.h"
#include "runtime/device/buffer.h"
#include "runtime/model_interface.h"

namespace zrt::gpt {

struct GptOptions {
  bool activation_checkpointing = false;
};

class Gpt final : public Model {
 public:
  Gpt(GptConfig config, kernels::KernelContext& ctx, GptOptions options = {});

  const GptConfig& config() const { return config_; }
  const GptOptions& options() const { return options_; }

  const std::vector<ParamSpec>& parameters() const override { return params_; }
  int num_modules() const override { return config_.n_layer + 2; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;
  void forward_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale) override;
  void forward(ParamAccess& access, const TokenBatch& batch) override;
  DevicePtr<const float> loss() const override { return loss_; }

  // Copies loss() to the host, waiting for the compute stream: for tests and tools, not for
  // the training loop (it stalls the host).
  float read_loss();
  // The logits (B,T,V) of the last forward(), in the compute dtype. After forward_backward the
  // buffer holds the logits' gradient instead.
  DevicePtr<const std::byte> logits() const override { return acts_.logits; }
  std::int64_t logits_row_stride() const override;
  bool supports_packed_documents() const override { return true; }
  // Activation bytes a pass at (B, T) in `dtype` allocates.
  std::int64_t activation_bytes(int B, int T, DType dtype) const;

  // The parameter table a Gpt of `config` reports (Hugging Face names and order), without
  // building one.
  static std::vector<ParamSpec> parameter_table(const GptConfig& config);

  // Indices into parameters().
  int wte() const { return 0; }
  int wpe() const { return 1; }
  int lnf_weight() const { return 2 + config_.n_layer * kBlockParams; }
  int lnf_bias() const { return lnf_weight() + 1; }
  // Parameter `slot` (0..11 in Hugging Face order: ln_1.weight, ln_1.bias, c_attn.weight,
  // c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, ln_2.weight, ln_2.bias, c_fc.weight,
  // c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias) of block `layer`.
  int block_param(int layer, int slot) const { return 2 + layer * kBlockParams + slot; }
  static constexpr int kBlockParams = 12;

 private:
  using Bytes = DevicePtr<std::byte>;
  using Floats = DevicePtr<float>;

  struct BlockActs {
    Bytes ln1, qkv, atty, attproj, res2, ln2, fch, fch_gelu, fcproj;
    Floats ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, att_lse;
  };
  struct Acts {
    std::vector<Bytes> residual;   // L+1 of (B,T,C): [0] embeddings, [l+1] output of block l
    std::vector<BlockActs> block;  // L, or 1 shared by all blocks with checkpointing
    Bytes lnf, logits;             // (B,T,C), (B,T,V)
    Floats lnf_mean, lnf_rstd, losses;
    // Gradients: dres is the residual stream's gradient, updated in place block by block.
    // The block scratch: the matmuls overwrite dln1, datty, dln2, dfch (with the GELU's
    // gradient, kernels::matmul_dgelu_backward) and dfch_gelu (that op's unfused scratch), their
    // one producer; attention accumulates into dqkv (accumulated_grads), zeroed before each
    // block.
    Bytes dres, dlnf, dln1, dqkv, datty, dln2, dfch, dfch_gelu;
    Bytes accumulated_grads;
    std::int64_t accumulated_grad_bytes = 0;
  };

  void prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets);
  // Lays the activations of a (B, T, dtype) pass out in one allocation: returns its bytes and,
  // if base is set, points acts' fields into it.
  std::int64_t layout_activations(int B, int T, DType dtype, Acts* acts, Bytes base) const;
  void run_forward(ParamAccess& access, const TokenBatch& batch, Phase phase);
  void block_forward(ParamAccess& access, int layer, const BlockActs& a, Bytes res_in,
                     Bytes res_out);
  void block_backward(ParamAccess& access, int layer, const BlockActs& a, Bytes res_in);
  const BlockActs& block_acts(int layer) const;

  GptConfig config_;
  GptOptions options_;
  kernels::KernelContext& ctx_;
  std::vector<ParamSpec> params_;

  // Activations for the current (B, T, dtype).
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

}  // namespace zrt::gpt
