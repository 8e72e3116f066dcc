// The mixtures of experts' entries in the model registry (models/model_registry.h): model.type
// "mixtral", "qwen2_moe" and "qwen3_moe", each resolving the model block into a MoeConfig behind
// the registry's ModelDef hooks; export in the Hub's per-expert form (models/moe/moe_hf.h).
// Registered in models/builtin_models.cc.
#pragma once

#include <string>

#include "models/model_registry.h"
#include "models/moe/moe_config.h"

namespace zrt::moe {

// The entry of `architecture` ("mixtral", "qwen2_moe" or "qwen3_moe").
ModelEntry registry_entry(const std::string& architecture);

// Training FLOPs per token at sequence length T, counting what a token computes: 6 per weight of
// its active parameters' matrix products (attention, the router, its k experts of each MoE layer,
// the shared expert, the dense layers, the head; not an untied embedding table, only looked up)
// plus attention's 12 L (NH hd) T, as the Llama family's.
double flops_per_token(const MoeConfig& c, int T);

// The MoeConfig of a run config's model block (an init_from Hugging Face directory's config.json,
// or the spec of the block's keys).
MoeConfig resolve_config(const ModelConfig& config);

}  // namespace zrt::moe
