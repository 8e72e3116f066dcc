// The mixture-of-experts models and Hugging Face: the two on-disk forms of the experts, the
// config.json, and the conversion between them and zrt's parameters (models/moe/moe_config.h).
//
// The experts of a layer are one fused pair of parameters in zrt, as transformers v5 holds them
// in memory: experts.gate_up_proj (E, 2I, C) (expert e's gate projection, then its up
// projection) and experts.down_proj (E, C, I). The Hub's files (and transformers' save_pretrained)
// keep one tensor per expert and projection:
//   Mixtral     model.layers.{l}.block_sparse_moe.gate.weight          (the router)
//               model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight  gate (I, C)
//               model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight  up   (I, C)
//               model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight  down (C, I)
//   Qwen2/3-MoE model.layers.{l}.mlp.gate.weight                       (the router)
//               model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight
// Both forms load to the same model (import_rules); export writes the Hub's (hub_tensors).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/hf/hf_config.h"
#include "models/hf/hf_import.h"
#include "models/model_registry.h"
#include "models/moe/moe_config.h"

namespace zrt::moe {

// Reading either form: a fused parameter from its own tensor or from the per-expert pieces; the
// Mixtral router from block_sparse_moe.gate.weight; rotary inv_freq buffers ignorable; a tied
// head's lm_head.weight must equal the embedding.
hf::HfImportRules import_rules(const MoeConfig& config);

// The model's tensors (zrt's names and order, fused experts) in the Hub's form: each fused
// parameter split into its per-expert tensors in place, every other tensor as it is.
// Also an expert-parallel checkpoint's tensors (each expert's own parameters, moe_model.h).
std::vector<ExportTensor> hub_tensors(const MoeConfig& config, std::vector<ExportTensor> tensors);

// The whole model's tensors in the Hub's form, names and shapes, in hub_tensors' order of the
// fused model: what an export holds, however the experts were partitioned when saved.
std::vector<hf::HfPiece> hub_layout(const MoeConfig& config);

// transformers' config.json of the model (MixtralForCausalLM, Qwen2MoeForCausalLM,
// Qwen3MoeForCausalLM).
nlohmann::json hf_config_json(const MoeConfig& config);

// The architecture of a Hugging Face config.json, with the run's explicit model keys checked
// against it (a contradiction names both values).
MoeConfig config_from_hf(const hf::HfConfig& hf, const ModelConfig& run);

}  // namespace zrt::moe
