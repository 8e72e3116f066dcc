// The contract between a model and the engine that owns its parameters.
//
// A model never owns parameter or gradient memory. It describes its parameters once
// (parameters(): names, shapes, the modules that use each), and during a pass it asks a
// ParamAccess for them module by module: acquire(module, phase) before a module's parameters
// are read, release(module, phase) after. The engine decides what acquire means (nothing at
// stages 0-2; an all-gather at stage 3, prefetched along the order below) and what release
// means (free the gathered copy; in backward: the module's gradients for this micro-batch are
// complete, so its bucket may be reduced once every module using a parameter has released).
//
// Call order of one training micro-batch (Model::forward_backward), with M = num_modules():
//   forward:  acquire(m, kForward) ... release(m, kForward)           for m = 0, 1, ..., M-1
//   backward: acquire(m, kBackward) ... release(m, kBackward)         for m = M-1, ..., 0
//             where a module recomputed under activation checkpointing is preceded at once by
//             acquire(m, kRecompute) ... release(m, kRecompute) (its forward, run again), so
//             the engine can keep m's parameters from the recompute through the backward.
//             A model that stops its backward early (Model::stops_backward_early) ends it at
//             m = access.first_backward_module() instead of 0: every parameter of the modules
//             below is frozen (ParamSpec::frozen), so no gradient is wanted there, and their
//             backward (and recompute) is not run at all, as autograd stops below the lowest
//             parameter that requires a gradient.
// Eval (Model::forward): acquire(m, kEval) ... release(m, kEval) for m = 0, ..., M-1.
// A parameter may belong to several modules (a tied embedding): it is valid while any module
// using it is acquired, and its gradient is complete only after the last of them has released
// in backward. The sequence is a pure function of the model and its options, never of data.
//
// All work a model does is enqueued on its compute stream; acquire must make that stream wait
// for whatever makes the parameters valid (an event after the all-gather), and release may
// record an event on it to know when the gradients are written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt {

// One parameter tensor as the model sees it.
struct ParamSpec {
  std::string name;                 // e.g. "transformer.h.0.attn.c_attn.weight" (Hugging Face)
  std::vector<std::int64_t> shape;  // row-major, e.g. {768, 2304}
  std::vector<int> modules;         // modules that read it, ascending; >1 entry: shared (tied)
  bool no_weight_decay = false;     // biases and LayerNorm parameters
  // The engine's shard group it is sliced, reduced and norm-summed over (an index into the
  // engine's table, runtime/comm/shard_group.h): 0, the dense data-parallel group, for every
  // parameter today; an expert's parameters will name the expert-data-parallel group.
  int group = 0;
  // Not trained (model.frozen / model.trainable): the engine keeps it in units of its own
  // (runtime/engine/partition.h, Unit::frozen) without optimizer state or gradient slice; its
  // gradient, where the model writes one, is dropped unread (no reduction, no gradient norm, no
  // clipping or fp16 overflow check, no step), so it stays exactly as loaded.
  bool frozen = false;
  // An expert's own slice of a tensor the model holds fused at one rank (under expert
  // parallelism, "model.layers.3.mlp.experts.5.gate_up_proj"): that tensor's name
  // ("model.layers.3.mlp.experts.gate_up_proj"); empty for any other parameter.
  std::string fused_name = {};

  // The name config patterns match (model.frozen): the same at every expert-parallel size.
  const std::string& pattern_name() const { return fused_name.empty() ? name : fused_name; }
  // Whether the optimizer's weight decay applies to it.
  bool takes_weight_decay() const { return !no_weight_decay && !frozen; }

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

enum class Phase { kForward, kBackward, kRecompute, kEval };
// "forward", "backward", "recompute", "eval" (defined in runtime/engine/zero_engine.cc).
const char* phase_name(Phase phase);

// The engine side: where the parameters and gradients of acquired modules are.
class ParamAccess {
 public:
  virtual ~ParamAccess() = default;

  // Called before the model enqueues work that reads module `module`'s parameters in `phase`.
  virtual void acquire(int module, Phase phase) = 0;
  // Called after the model enqueued the last work of that acquisition (see the order above).
  virtual void release(int module, Phase phase) = 0;

  // The whole parameter, contiguous in compute_dtype(); valid while a module using it is
  // acquired.
  virtual DevicePtr<std::byte> param(int index) = 0;
  // The whole gradient buffer of parameter `index`, in grad_dtype(); valid while a module using
  // it is acquired in backward. The model ACCUMULATES into it (the engine zeroes it).
  virtual DevicePtr<std::byte> grad(int index) = 0;

  // Whether parameter `index` is trained (false: ParamSpec::frozen). A model may skip the work
  // of a gradient nobody reads (a frozen linear weight's GEMM: trained_grad below); it may also
  // write it: the engine drops a frozen parameter's gradient either way. A model that never
  // asks for one (Model::skips_frozen_gradients) gets no gradient memory for frozen parameters.
  virtual bool trains(int index) const {
    (void)index;
    return true;
  }

  // The lowest module whose backward the engine expects (see the call order above): 0 unless the
  // model stops its backward early and the modules below this one hold frozen parameters only.
  virtual int first_backward_module() const { return 0; }

  virtual DType compute_dtype() const = 0;  // fp32, bf16 or fp16
  virtual DType grad_dtype() const = 0;     // compute_dtype() or fp32
};

// The gradient buffer of parameter `index` for a kernel that may skip it (every kernel taking
// a parameter gradient: linear / matmul weights and biases, norms, embeddings, the head): null
// when `index` is negative (the model has no such parameter) or not trained.
inline DevicePtr<std::byte> trained_grad(ParamAccess& access, int index) {
  return index < 0 || !access.trains(index) ? DevicePtr<std::byte>() : access.grad(index);
}

// A batch of token sequences in device memory: inputs and next-token targets, (B,T) int32.
//
// Targets below 0 are not in the loss (a fine-tuning mask, padding, a document's first token).
// The loss the model reports and differentiates is the sum of its tokens' cross-entropies
// divided by `loss_divisor`, or by B*T when it is 0 (pre-training: every target counts). The
// trainer sets it so that a step's gradient is the sum over the GLOBAL batch's loss tokens
// divided by their count, whatever the micro-batch size, accumulation or world size (the engine
// averages over micro-batches and ranks, so the divisor is that count / (micro-batches x ranks);
// docs/fine-tuning.md).
//
// Packed documents (docs/fine-tuning.md): when `doc_start` is set, token t of row b attends to
// tokens doc_start[b*T + t] .. t only (its own document; 0 <= doc_start[t] <= t, non-decreasing
// in t, and either doc_start[t-1] or t), and `positions` (then also set) holds its position in
// that document (t - doc_start[t]): the position embedding's row or the rotary angle. Both null:
// one document per row, positions 0..T-1.
//
// Ulysses sequence parallelism (a model built with a sequence-parallel group of sp ranks): the
// batch is this rank's chunk of each sequence, seq_len its length (T/sp); `positions` (B,T/sp) is
// always set (the chunk's global positions, or its documents'); `doc_start` is null or the whole
// sequences' (B,T), indices into the whole row; targets are the chunk's, shifted over the whole
// row.
struct TokenBatch {
  TokenBatch() = default;
  // One document per row, every target in the loss unless below 0, the mean over B*T.
  TokenBatch(DevicePtr<const std::int32_t> inputs_, DevicePtr<const std::int32_t> targets_, int B,
             int T)
      : inputs(inputs_), targets(targets_), batch(B), seq_len(T) {}

  DevicePtr<const std::int32_t> inputs;
  DevicePtr<const std::int32_t> targets;    // may be null for forward-only passes without loss
  int batch = 0;                            // B
  int seq_len = 0;                          // T
  DevicePtr<const std::int32_t> positions;  // (B,T) or null
  DevicePtr<const std::int32_t> doc_start;  // (B,T) or null
  float loss_divisor = 0.f;                 // 0: B*T
};

// What a mixture of experts routed in its training passes (Model::take_expert_load).
struct ExpertLoad {
  // (token, slot) pairs each expert received, layer-major: E entries per MoE layer.
  std::vector<std::int64_t> tokens;
  std::int64_t dropped = 0;  // pairs a capacity factor dropped
  // Under expert parallelism: the most rows one layer's local experts received, their balanced
  // share (a pass's tokens x top-k), and the rows their buffers hold now; 0 without.
  std::int64_t rows_max = 0, rows_balanced = 0, rows_capacity = 0;
};

// model.expert_rows_reserve's default (models/moe/expert_rows.h): the local experts' buffers
// start a quarter above the balanced share of the rows.
constexpr double kDefaultExpertRowsReserve = 1.25;

// A trainable model, as the engine and the tools drive it.
class Model {
 public:
  virtual ~Model() = default;

  virtual const std::vector<ParamSpec>& parameters() const = 0;
  virtual int num_modules() const = 0;
  // Host fp32 initial values of elements [begin, begin+count) of parameter `index`, a pure
  // function of (seed, index, element): any sharding of the initialisation gives the same model.
  virtual void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                              float* out) const = 0;

  // Enqueues forward and backward of one micro-batch on the compute stream, calling `access` in
  // the order documented above. Gradients of the loss times loss_scale are ACCUMULATED into
  // access.grad(i); the unscaled loss (TokenBatch's rule: the summed cross-entropy over
  // loss_divisor) is written to loss() (device memory).
  virtual void forward_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale) = 0;
  // Enqueues a forward pass (kEval); writes the loss to loss() if batch.targets is set.
  virtual void forward(ParamAccess& access, const TokenBatch& batch) = 0;
  // One fp32 in device memory: the loss of the last pass, valid once the compute stream
  // has run it (copy it out with Device::copy_to_host, or into an accumulator on the stream).
  virtual DevicePtr<const float> loss() const = 0;
  // The logits (B, T, vocab) of the last forward(), in the compute dtype (zrt-train samples
  // text from them). After forward_backward the buffer may hold their gradient instead.
  virtual DevicePtr<const std::byte> logits() const = 0;
  // Elements from one row of logits() to the next: the vocabulary size, or more where a model
  // pads its rows for aligned GEMMs (kernels::logits_row_stride). 0 means dense rows.
  virtual std::int64_t logits_row_stride() const { return 0; }
  // True iff the model honours all of TokenBatch: targets below 0 left out of the loss,
  // loss_divisor, and packed documents (positions, doc_start). zrt-train refuses masked or
  // packed data for a model that does not, rather than train it silently wrong.
  virtual bool supports_packed_documents() const { return false; }
  // True iff forward_backward ends its backward at access.first_backward_module() (the call
  // order above). Whoever builds the engine for the model tells it so
  // (EngineOptions::model_stops_backward_early); a model that does not runs every module's
  // backward, and the engine then expects all of them.
  virtual bool stops_backward_early() const { return false; }
  // True iff forward_backward never calls access.grad() for a frozen parameter (it takes every
  // gradient through trained_grad). Told to the engine as stops_backward_early
  // (EngineOptions::model_skips_frozen_gradients), which then keeps no gradient buffer for
  // frozen parameters; a model that may write them gets buckets it drops unread.
  virtual bool skips_frozen_gradients() const { return false; }
  // The auxiliary loss term of the last training pass, before its coefficient (a mixture of
  // experts' load-balancing term; loss() already includes coefficient x term): one fp32 in device
  // memory as loss(), or null for a model without one.
  virtual DevicePtr<const float> aux_loss() const { return {}; }
  // The routing of the training passes since the last call (host counts), which it resets;
  // nullopt for a model without experts.
  virtual std::optional<ExpertLoad> take_expert_load() { return std::nullopt; }
};

}  // namespace zrt
