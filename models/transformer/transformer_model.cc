#include "models/transformer/transformer_model.h"

#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "runtime/common/error.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

TransformerModel::TransformerModel(kernels::KernelContext& ctx, TransformerSpec spec,
                                   TransformerOptions options)
    : spec_(std::move(spec)), options_(options), ctx_(ctx) {
  if (options_.sequence_group == nullptr && options_.planned_sequence_parallel_size != 1) {
    ZRT_THROW(InvalidArgument,
              "{}: planned_sequence_parallel_size {} is for counting; a model needs the group",
              spec_.family, options_.planned_sequence_parallel_size);
  }
  if (options_.planned_first_backward_block != 0) {
    ZRT_THROW(InvalidArgument,
              "{}: planned_first_backward_block {} is for counting; a model takes it from its "
              "ParamAccess",
              spec_.family, options_.planned_first_backward_block);
  }
  loss_buffer_ =
      ctx_.device().allocate(kActivationAlign, MemCategory::kActivations, spec_.family + " loss",
                             MemorySpace::kDevice, &ctx_.stream());
  loss_ = loss_buffer_.device<float>();
  if (options_.sequence_parallel_size() > 1) {
    ulysses_ = std::make_unique<UlyssesExchange>(ctx_, *options_.sequence_group);
  }
  if (offloaded_block_inputs(spec_.n_layer, options_) > 0) {
    offload_ = std::make_unique<CheckpointOffload>(ctx_.device(), ctx_.stream());
  }
}

std::int64_t TransformerModel::activation_bytes(const TransformerSpec& spec,
                                                const TransformerOptions& options, int B, int T,
                                                DType dtype, BlockActivations& scratch) {
  TransformerActs acts;
  return layout_activations(spec, options, B, T, dtype, scratch, &acts, Bytes(),
                            /*whole_logits=*/false, options.planned_first_backward_block);
}

std::int64_t TransformerModel::host_activation_bytes(const TransformerSpec& spec,
                                                     const TransformerOptions& options, int B,
                                                     int T, DType dtype) {
  const int rows = CheckpointOffload::host_rows(options.planned_first_backward_block,
                                                offloaded_block_inputs(spec.n_layer, options));
  return std::int64_t{rows} * B * T * spec.hidden_size *
         static_cast<std::int64_t>(dtype_size(dtype));
}

const ParamSpec& TransformerModel::init_range(int index, std::int64_t begin,
                                              std::int64_t count) const {
  const std::vector<ParamSpec>& params = parameters();
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params.size()), "parameter index {} of {}",
            index, params.size());
  const ParamSpec& spec = params[static_cast<std::size_t>(index)];
  ZRT_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
            "elements [{}, {}) of {} ({} elements)", begin, begin + count, spec.name, spec.numel());
  return spec;
}

void TransformerModel::prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets) {
  k::check_dtypes(access.compute_dtype(), access.grad_dtype());
  const int B = batch.batch;
  const int T = batch.seq_len;
  const int sp = options_.sequence_parallel_size();
  if (B <= 0 || T <= 0 || std::int64_t{T} * sp > spec_.seq_len) {
    ZRT_THROW(InvalidArgument, "{}: batch {}x{}{} (need B >= 1 and 1 <= T <= seq_len {}{})",
              spec_.architecture, B, T,
              sp > 1 ? fmt::format(" in chunks of {} ranks", sp) : std::string(), spec_.seq_len,
              sp > 1 ? " for the whole sequence" : "");
  }
  ZRT_CHECK(static_cast<bool>(batch.inputs), "{}: batch has no input tokens", spec_.family);
  if (need_targets) {
    ZRT_CHECK(static_cast<bool>(batch.targets), "{}: batch has no targets", spec_.family);
  }
  if (sp > 1) {
    // A chunk's rotary angles start at its offset in the sequence: the batch says which.
    ZRT_CHECK(static_cast<bool>(batch.positions),
              "{}: a sequence-parallel chunk needs its positions", spec_.family);
  } else {
    ZRT_CHECK(static_cast<bool>(batch.positions) == static_cast<bool>(batch.doc_start),
              "{}: a packed batch needs both positions and doc_start", spec_.family);
  }
  pass_.sp = sp;
  // The lowest block whose module the backward reaches (block l is module l + 1): what the
  // blocks below keep, and their part of the residual stream, is the forward's scratch.
  const int first_backward_block =
      std::min(transformer::first_backward_block(access.first_backward_module()), spec_.n_layer);
  pass_.positions = batch.positions;
  pass_.doc_start = batch.doc_start;
  pass_.grad_dtype = access.grad_dtype();
  // Only a pass without targets needs the whole logits (logits()).
  const bool whole_logits = !batch.targets;
  if (B == pass_.B && T == pass_.T && access.compute_dtype() == pass_.dtype &&
      whole_logits == whole_logits_ && first_backward_block == pass_.first_backward_block &&
      !act_buffer_.empty()) {
    return;
  }
  act_buffer_.reset();  // stream-ordered: passes already enqueued keep their memory
  pass_.B = B;
  pass_.T = T;
  pass_.dtype = access.compute_dtype();
  whole_logits_ = whole_logits;
  pass_.first_backward_block = first_backward_block;
  BlockActivations& blocks = block_activations();
  const std::int64_t total = layout_activations(spec_, options_, B, T, pass_.dtype, blocks, &acts_,
                                                Bytes(), whole_logits, first_backward_block);
  act_buffer_ =
      ctx_.device().allocate(total, MemCategory::kActivations,
                             fmt::format("{} activations (B={} T={})", spec_.architecture, B, T),
                             MemorySpace::kDevice, &ctx_.stream());
  layout_activations(spec_, options_, B, T, pass_.dtype, blocks, &acts_,
                     act_buffer_.device<std::byte>(), whole_logits, first_backward_block);
  if (offload_) {
    offload_->prepare(
        first_backward_block, offloaded_block_inputs(spec_.n_layer, options_),
        static_cast<std::int64_t>(B) * T * spec_.hidden_size * dtype_size(pass_.dtype),
        fmt::format("{} checkpointed block inputs (B={} T={})", spec_.architecture, B, T));
  }
}

// The position table has seq_len rows: a sequence-parallel chunk's positions (global, or its
// documents') reach past the chunk's T.
void TransformerModel::embedding_forward(ParamAccess& a, const TokenBatch& batch) {
  const bool positional = spec_.position_embedding >= 0;
  k::encoder_forward(ctx_, pass_.dtype, acts_.residual[0], batch.inputs,
                     a.param(spec_.token_embedding),
                     positional ? a.param(spec_.position_embedding) : Bytes(), pass_.B, pass_.T,
                     spec_.hidden_size, spec_.vocab_size,
                     positional ? pass_.positions : DevicePtr<const std::int32_t>(), spec_.seq_len);
}

void TransformerModel::embedding_backward(ParamAccess& a, const TokenBatch& batch) {
  const bool positional = spec_.position_embedding >= 0;
  // A frozen table's sums are not computed (trained_grad: null); with both frozen, nothing is.
  const Bytes dwte = trained_grad(a, spec_.token_embedding);
  const Bytes dwpe = trained_grad(a, spec_.position_embedding);
  if (!dwte && !dwpe) return;
  k::encoder_backward(ctx_, pass_.dtype, pass_.grad_dtype, dwte, dwpe, acts_.dres, batch.inputs,
                      pass_.B, pass_.T, spec_.hidden_size, spec_.vocab_size,
                      positional ? pass_.positions : DevicePtr<const std::int32_t>(),
                      spec_.seq_len);
}

void TransformerModel::run_forward(ParamAccess& a, const TokenBatch& batch, Phase phase) {
  const int L = spec_.n_layer;
  // A training pass copies the block inputs the host keeps out as they are written (those of
  // blocks with a backward); the slot block l+1's input goes into held block l-1's, whose copy
  // must be done by then.
  const int offloaded = offload_ && phase == Phase::kForward ? offload_->blocks() : 0;
  const int kept_from = pass_.first_backward_block;
  a.acquire(kEmbeddingModule, phase);
  embedding_forward(a, batch);
  a.release(kEmbeddingModule, phase);
  if (offloaded > 0 && kept_from == 0) offload_->save(0, acts_.residual[0]);
  for (int l = 0; l < L; ++l) {
    a.acquire(block_module(l), phase);
    if (l >= 1 && l - 1 < offloaded && l + 1 < L) {
      offload_->await_slot(CheckpointOffload::slot_of(l + 1));
    }
    block_forward(a, l, acts_.residual[l], acts_.residual[l + 1]);
    a.release(block_module(l), phase);
    if (l + 1 < offloaded && l + 1 >= kept_from) offload_->save(l + 1, acts_.residual[l + 1]);
  }
  a.acquire(head_module(L), phase);
  head_forward(a, batch, phase);
  a.release(head_module(L), phase);
}

void TransformerModel::forward(ParamAccess& access, const TokenBatch& batch) {
  prepare(access, batch, /*need_targets=*/false);
  run_forward(access, batch, Phase::kEval);
}

void TransformerModel::forward_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  prepare(a, batch, /*need_targets=*/true);
  run_forward(a, batch, Phase::kForward);

  const int L = spec_.n_layer;
  a.acquire(head_module(L), Phase::kBackward);
  head_backward(a, batch, loss_scale);
  a.release(head_module(L), Phase::kBackward);
  add_auxiliary_losses(loss_, loss_scale);

  // With cpu_checkpointing the last two blocks' inputs are still in their slots; each earlier
  // one comes back while the block after it runs (checkpoint_offload.h). The backward ends at
  // the first block with one (the blocks and the embedding below hold frozen parameters only:
  // model_interface.h), as autograd's would.
  const int offloaded = offload_ ? offload_->blocks() : 0;
  const int first_block = pass_.first_backward_block;
  for (int l = L - 1; l >= first_block; --l) {
    const int m = block_module(l);
    if (l - 1 >= first_block && l - 1 < offloaded) {
      offload_->prefetch(l - 1, acts_.residual[l - 1]);
    }
    if (l < offloaded) offload_->await_slot(CheckpointOffload::slot_of(l));
    if (options_.activation_checkpointing) {
      a.acquire(m, Phase::kRecompute);
      block_forward(a, l, acts_.residual[l], Bytes());
      a.release(m, Phase::kRecompute);
    }
    a.acquire(m, Phase::kBackward);
    if (acts_.accumulated_grad_bytes > 0) {  // GPT's is empty without sequence parallelism
      ctx_.device().fill_zero(acts_.accumulated_grads,
                              static_cast<std::size_t>(acts_.accumulated_grad_bytes),
                              ctx_.stream());
    }
    block_backward(a, l, acts_.residual[l]);
    if (l == first_block) blocks_backward_done();
    a.release(m, Phase::kBackward);
  }
  if (first_block == L) blocks_backward_done();

  if (a.first_backward_module() > kEmbeddingModule) return;
  a.acquire(kEmbeddingModule, Phase::kBackward);
  embedding_backward(a, batch);
  a.release(kEmbeddingModule, Phase::kBackward);
}

std::int64_t TransformerModel::logits_row_stride() const {
  return k::logits_row_stride(spec_.vocab_size);
}

float TransformerModel::read_loss() {
  float value = 0.0f;
  ctx_.device().copy_to_host(&value, loss_.as<const std::byte>(), sizeof value, ctx_.stream());
  ctx_.stream().synchronize();
  return value;
}

}  // namespace zrt::transformer
