// The Llama family's entries in the model registry (models/model_registry.h): model.type
// "llama", "qwen2", "qwen3" and "mistral", each resolving the model block into a LlamaConfig behind
// the registry's ModelDef hooks. Registered in models/builtin_models.cc.
#pragma once

#include <cstdint>
#include <string>

#include "models/llama/llama_config.h"
#include "models/model_registry.h"

namespace zrt::llama {

// The entry of `architecture` ("llama", "qwen2", "qwen3" or "mistral").
ModelEntry registry_entry(const std::string& architecture);

// Training FLOPs per token at sequence length T: 6 per weight a token's matrix products read
// (every linear weight and the head; not an untied embedding table, which is only looked up)
// plus attention's 12 L (NH hd) T (QK^T and attention x V, forward and backward; PaLM's MFU
// accounting, no causal discount, as the GPT's).
double flops_per_token(const LlamaConfig& c, int T);

// The LlamaConfig of a run config's model block (ModelConfig::spec() in the entry's syntax).
LlamaConfig resolve_config(const ModelConfig& config);

}  // namespace zrt::llama
