// What a decoder-only transformer tells the shared driver (models/transformer/transformer_model.h)
// about itself: its dimensions, its final norm, which of its parameters are the embeddings, the
// final norm and the head, and the module numbering every such model shares.
//
// Modules, for L blocks:
//   0          the token embedding (and a position embedding, if the model has one)
//   1..L       block l-1
//   L+1        the final norm and the head (with a tied head, the token embedding again: that
//              parameter is then shared by modules 0 and L+1)
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/model_interface.h"

namespace zrt::transformer {

constexpr int kEmbeddingModule = 0;
constexpr int block_module(int layer) {
  return layer + 1;
}
constexpr int head_module(int n_layer) {
  return n_layer + 1;
}
constexpr int num_modules(int n_layer) {
  return n_layer + 2;
}
// The lowest block whose backward runs when the backward ends at module `first_backward_module`
// (ParamAccess::first_backward_module); n_layer or more when only the head's runs.
constexpr int first_backward_block(int first_backward_module) {
  return first_backward_module > 1 ? first_backward_module - 1 : 0;
}

// The modules activation checkpointing reruns: the blocks, not the embedding or the head.
inline std::vector<int> block_modules(int n_layer) {
  std::vector<int> blocks;
  for (int l = 0; l < n_layer; ++l) blocks.push_back(block_module(l));
  return blocks;
}

enum class NormKind {
  kLayerNorm,  // weight and bias; keeps mean and rstd for the backward
  kRmsNorm,    // weight only; keeps rstd
};

struct TransformerSpec {
  // "gpt", "llama": names the loss buffer and the batch checks' messages.
  std::string family;
  // "gpt", "qwen2", ...: names the activations' allocation and the batch shape's message.
  std::string architecture;
  int n_layer = 0;
  int hidden_size = 0;  // C, the residual stream's width
  int vocab_size = 0;
  int seq_len = 0;  // the longest sequence a batch may have
  NormKind final_norm = NormKind::kLayerNorm;
  double norm_eps = 0.0;  // RMSNorm's epsilon (LayerNorm's is the kernel's)
  // Indices into the model's parameters(); -1 where the model has none.
  int token_embedding = 0;
  int position_embedding = -1;  // GPT-2's wpe; without one, positions are the blocks' (RoPE)
  int final_norm_weight = -1;
  int final_norm_bias = -1;  // LayerNorm only
  int head = -1;             // the LM head (V, C); token_embedding when tied
};

// How a model is built, beyond its architecture.
struct TransformerOptions {
  // Keep only each block's input; its forward reruns inside its backward.
  bool activation_checkpointing = false;
  // Ulysses sequence parallelism: the group of ranks that share each sequence, a chunk each
  // (TokenBatch), and attend over the whole of it through all-to-alls on this group; it must
  // outlive the model. Null or a group of 1: every rank holds whole sequences.
  ProcessGroup* sequence_group = nullptr;
  // For counting only (activation_bytes and its kin, with no group): the sp to count for. A
  // model built with it above 1 and no group is refused.
  int planned_sequence_parallel_size = 1;
  int sequence_parallel_size() const {
    return sequence_group ? sequence_group->size() : planned_sequence_parallel_size;
  }
  // Expert parallelism: the group whose ranks hold a block each of every mixture-of-experts
  // layer's experts and exchange the tokens' rows (models/moe/expert_dispatch.h); it must
  // outlive the model. Null or a group of 1: every expert local. Models without experts ignore it.
  ProcessGroup* expert_group = nullptr;
  int expert_parallel_size() const { return expert_group ? expert_group->size() : 1; }
  // Under expert parallelism: the local experts' rows reserved at first, over the balanced share
  // (ModelOptions::expert_rows_reserve).
  double expert_rows_reserve = kDefaultExpertRowsReserve;
  // With activation_checkpointing: the kept block inputs live in pinned host memory, the
  // device keeping two of them (checkpoint_offload.h).
  bool cpu_checkpointing = false;
  // Rows of the sequence per tile of the head's logits and loss, and of the MLP (tiling.h:
  // kTileAuto, kTileOff or a count). Models without a tiled MLP ignore mlp_tile_rows.
  int head_tile_rows = 0;
  int mlp_tile_rows = 0;
  // For counting only (activation_bytes and its kin): the lowest block whose backward runs
  // (ModelOptions::planned_first_backward_module's block). A built model takes it from its
  // ParamAccess at each pass (TransformerModel::Pass) and refuses it above 0.
  int planned_first_backward_block = 0;
};

}  // namespace zrt::transformer
