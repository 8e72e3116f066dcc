// TransformerModel: the driver every decoder-only transformer here (GPT-2, the Llama family)
// shares, implementing zrt::Model. A model derives from it, describes itself once
// (TransformerSpec) and writes only its blocks: their activations (BlockActivations), their
// forward and their backward. The driver owns the rest, the same for every model:
//   - the module numbering (transformer_spec.h) and acquire / release through ParamAccess in
//     the order runtime/model_interface.h documents;
//   - the forward and backward loops over the blocks, and activation checkpointing (only each
//     block's input is kept; acquire/release(m, kRecompute) and the block's forward rerun just
//     before acquire(m, kBackward));
//   - the token (and position) embedding, the final norm, the head and the loss: the
//     TokenBatch's targets (below 0: not in the loss), loss_divisor and packed documents
//     (positions to the position embedding, doc_start and positions to the blocks);
//   - the activations (MemCategory::kActivations): one allocation per (B, T, dtype) and kind
//     of pass, reused while they stay the same (transformer_activations.h), and the loss
//     scalar, allocated at construction;
//   - with cpu_checkpointing, the checkpointed block inputs in pinned host memory
//     (checkpoint_offload.h): residual(i) then holds block i's input only until the slot it
//     shares is written again;
//   - the head in tiles of rows (tiling.h, transformer_head.cc): a training pass never holds
//     (B,T,V) logits. Its loss and logit gradients come from the backward, tile by tile: each
//     tile's logits, the fused classifier's losses and dlogits in place, then the tile's input
//     gradient and the head weight's gradient accumulated. An eval pass with targets takes its
//     losses tile by tile; a pass without targets keeps the whole logits (logits());
//   - under Ulysses sequence parallelism (TransformerOptions::sequence_group of sp ranks), the
//     UlyssesExchange the blocks' attention uses: a batch is then this rank's chunk of each
//     sequence (TokenBatch::seq_len the chunk's length, positions its global ones, doc_start
//     the whole sequence's), every op but the attention runs on the chunk, and the loss is the
//     chunk's tokens' sum over the divisor.
// A training pass's loss equals the untiled one bit for bit where the GEMMs give each row the
// same bits at any row count; the head weight's gradient is summed over the tiles in fp32 (the
// rounding bound: tests/models/test_tiled_compute.cc).
// Everything is enqueued on the KernelContext's stream.
//
// Not thread-safe; one pass at a time per model (passes on one stream are ordered anyway).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/kernel_context.h"
#include "models/transformer/checkpoint_offload.h"
#include "models/transformer/gqa_attention_block.h"
#include "models/transformer/transformer_activations.h"
#include "models/transformer/transformer_spec.h"
#include "models/transformer/ulysses_exchange.h"
#include "runtime/device/buffer.h"
#include "runtime/model_interface.h"

namespace zrt::transformer {

class TransformerModel : public Model {
 public:
  TransformerModel(const TransformerModel&) = delete;
  TransformerModel& operator=(const TransformerModel&) = delete;

  int num_modules() const override { return transformer::num_modules(spec_.n_layer); }
  void forward_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale) override;
  void forward(ParamAccess& access, const TokenBatch& batch) override;
  DevicePtr<const float> loss() const override { return loss_; }
  // The logits (B,T,V) of the last forward() without targets, in the compute dtype. After a
  // tiled pass (forward_backward, or forward() with targets) the buffer holds the last tile's
  // logits or their gradient instead.
  DevicePtr<const std::byte> logits() const override { return acts_.logits; }
  std::int64_t logits_row_stride() const override;
  bool supports_packed_documents() const override { return true; }
  bool stops_backward_early() const override { return true; }
  bool skips_frozen_gradients() const override { return true; }

  const TransformerSpec& spec() const { return spec_; }
  const TransformerOptions& options() const { return options_; }
  // Copies loss() to the host, waiting for the compute stream: for tests and tools, not for
  // the training loop (it stalls the host).
  float read_loss();
  // The residual stream (B,T,hidden_size) of the last pass after block i-1 (i = 0: the token
  // embeddings), in the compute dtype: transformers' per-layer hidden states (tests). With
  // cpu_checkpointing only the last three are still there after a pass, and below the first
  // block whose backward runs (frozen lower layers) only the last two of those blocks' rows.
  DevicePtr<const std::byte> residual(int i) const { return acts_.residual.at(i); }
  // Rows per tile of the head in the last pass (B*T when it was whole).
  int head_tile_rows() const { return acts_.head_rows; }

 protected:
  using Bytes = DevicePtr<std::byte>;
  using Floats = DevicePtr<float>;

  // The current pass, as the blocks see it.
  struct Pass {
    int B = 0, T = 0;
    DType dtype = DType::kFloat32;       // the compute dtype: activations and parameters
    DType grad_dtype = DType::kFloat32;  // the parameters' gradients
    // The batch's packed documents (TokenBatch): null for one document a row. Under sequence
    // parallelism positions are the chunk's (B,T), doc_start the whole sequences' (B,sp*T).
    DevicePtr<const std::int32_t> positions, doc_start;
    int sp = 1;  // the chunks of each sequence: T is one chunk's length
    // The lowest block whose backward runs (ParamAccess::first_backward_module's, n_layer when
    // only the head's does): the blocks below it hold frozen parameters only.
    int first_backward_block = 0;
    int N() const { return B * T; }
    int sequence_length() const { return T * sp; }  // what the attention spans
  };

  // Allocates the loss scalar. `spec` is the model's, already validated.
  TransformerModel(kernels::KernelContext& ctx, TransformerSpec spec, TransformerOptions options);

  // The model's activations, which the driver lays out with its own.
  virtual BlockActivations& block_activations() = 0;
  // Block `layer`'s forward from res_in (B,T,C); writes res_out unless it is null (the rerun
  // under checkpointing, whose output the backward does not need).
  virtual void block_forward(ParamAccess& access, int layer, Bytes res_in, Bytes res_out) = 0;
  // Block `layer`'s backward: on entry dres() holds the gradient of the block's output, on exit
  // that of its input. The driver zeroes the accumulated region (BlockActivations::
  // plan_accumulated) just before; parameter gradients accumulate into access.grad.
  virtual void block_backward(ParamAccess& access, int layer, Bytes res_in) = 0;
  // Once per training pass, after the head wrote the cross-entropy into `loss` and before the
  // blocks' backward: a model with auxiliary losses (a mixture of experts' load-balancing term)
  // adds them to `loss` and prepares their gradients, times `loss_scale`. None by default.
  virtual void add_auxiliary_losses(Floats loss, float loss_scale) {
    (void)loss;
    (void)loss_scale;
  }
  // Once per training pass, at the end of the last block backward that runs (the first backward
  // block's, ParamAccess::first_backward_module, before its release; after the head's when no
  // block's runs).
  virtual void blocks_backward_done() {}

  // The bytes of a pass's activations for a model of `spec`, without its loss scalar.
  static std::int64_t activation_bytes(const TransformerSpec& spec,
                                       const TransformerOptions& options, int B, int T, DType dtype,
                                       BlockActivations& scratch);
  // The pinned host bytes a pass's offloaded block inputs take (cpu_checkpointing; else 0).
  static std::int64_t host_activation_bytes(const TransformerSpec& spec,
                                            const TransformerOptions& options, int B, int T,
                                            DType dtype);
  // Throws unless elements [begin, begin + count) of parameter `index` exist; returns it.
  const ParamSpec& init_range(int index, std::int64_t begin, std::int64_t count) const;

  kernels::KernelContext& ctx() const { return ctx_; }
  const Pass& pass() const { return pass_; }
  // Which of the blocks' kept activation sets block `layer` uses (KeptSets: 0 for all under
  // checkpointing, and for the blocks below the first with a backward).
  int kept_set(int layer) const { return acts_.kept.of_layer.at(static_cast<std::size_t>(layer)); }
  // The residual stream's gradient (B,T,C), updated in place block by block.
  Bytes dres() const { return acts_.dres; }
  // The all-to-alls of sequence parallelism; null at sequence_parallel_size 1.
  UlyssesExchange* ulysses() const { return ulysses_.get(); }

  // The Llama family's grouped-query attention (gqa_attention_block.h, .cc) on a block's tensors:
  // q, k, v after RoPE (the chunk's; under sequence parallelism each buffer then holds this
  // rank's heads of the whole sequence, planned at GqaHeads::KV_full for k and v), lse and the
  // output atty (the chunk's, every head); atty_full the whole sequence's output with this
  // rank's heads (sp > 1 only). send and recv: the all-to-alls' scratch (sp > 1 only; one
  // buffer may be both at B == 1).
  struct GqaTensors {
    Bytes q, k, v, atty, atty_full;
    Floats lse;
  };
  // datty holds the output's gradient (the chunk's) on entry and is scratch after (under sequence
  // parallelism it is turned into the whole sequence's layout in place); dq, dk, dv (zeroed by
  // the driver, planned as q, k, v) receive q's, k's and v's gradients in the chunk's layout.
  struct GqaGradients {
    Bytes dq, dk, dv, datty;
  };
  // window: the layer's sliding window (kernels/ops.h; 0: none), the same for both passes.
  void gqa_attention_forward(const GqaHeads& heads, const GqaTensors& x, Bytes send, Bytes recv,
                             int window);
  void gqa_attention_backward(const GqaHeads& heads, const GqaTensors& x, const GqaGradients& d,
                              Bytes send, Bytes recv, int window);

 private:
  void prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets);
  void run_forward(ParamAccess& access, const TokenBatch& batch, Phase phase);
  // The final norm, the head and the loss (module L+1), transformer_head.cc. Forward: the
  // final norm; for an eval pass the logits and, with targets, the loss. Backward: the loss and
  // the gradients from the logits down to dres, tile by tile.
  void head_forward(ParamAccess& access, const TokenBatch& batch, Phase phase);
  void head_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale);
  // Rows [r0, r0 + n) of lnf times the head into the logits buffer.
  void head_logits(ParamAccess& access, int r0, int n);
  // The token embedding's forward / backward (module 0); positions go to the position
  // embedding only, where the model has one.
  void embedding_forward(ParamAccess& access, const TokenBatch& batch);
  void embedding_backward(ParamAccess& access, const TokenBatch& batch);

  TransformerSpec spec_;
  TransformerOptions options_;
  kernels::KernelContext& ctx_;
  Pass pass_;
  Buffer act_buffer_;
  bool whole_logits_ = false;  // the layout's kind of pass: without targets
  TransformerActs acts_;
  std::unique_ptr<CheckpointOffload> offload_;  // with cpu_checkpointing, else null
  Buffer loss_buffer_;
  Floats loss_;
  std::unique_ptr<UlyssesExchange> ulysses_;
};

}  // namespace zrt::transformer
