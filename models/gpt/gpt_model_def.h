// GPT-2's entry in the model registry (models/model_registry.h): the GptConfig behind the
// registry's ModelDef hooks, and the Hugging Face export of a checkpoint. Registered in
// models/builtin_models.cc.
#pragma once

#include <cstdint>

#include "models/gpt/gpt_config.h"
#include "models/model_registry.h"
#include "models/transformer/transformer_spec.h"

namespace zrt::gpt {

// model.type "gpt2": resolves the model block with GptConfig::parse(ModelConfig::spec()).
ModelEntry registry_entry();

// Activation bytes of one training micro-batch (B, T) in `dtype` as Gpt lays them out (each
// tensor rounded up to 256 bytes), plus its 256-byte loss buffer: a closed form of
// Gpt::activation_bytes, so an estimate needs no model; see the .cc for the terms.
std::int64_t activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                              bool activation_checkpointing);
// The same for a Gpt built with `options`: cpu_checkpointing keeps three (B,T,C) tensors of the
// residual stream instead of L + 1, a tiled head (R,V) logits instead of (B*T,V); and the pinned
// host bytes of the offloaded block inputs.
std::int64_t activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                              const transformer::TransformerOptions& options);
std::int64_t host_activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                                   const transformer::TransformerOptions& options);

// Training FLOPs per token at sequence length T: 6 per parameter (forward and backward of the
// matrix products) plus attention's 12 L C T (the PaLM paper's MFU accounting).
double flops_per_token(const GptConfig& c, int T);

}  // namespace zrt::gpt
