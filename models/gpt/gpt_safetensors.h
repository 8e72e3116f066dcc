// GPT-2 weights from Hugging Face (model.init_from): a model directory (config.json and
// model.safetensors or a sharded index), or a .safetensors file. Names with or without the
// "transformer." prefix, Conv1D weights (in, out) as zrt stores them; the attention mask buffers
// (attn.bias, attn.masked_bias) are skipped, and an lm_head.weight must equal wte (zrt's GPT-2
// ties its head; an untied one is refused, never dropped). Every parameter must be present with
// its exact shape; an unknown tensor is an error (a foreign file). The matching is the generic
// one of models/hf/hf_import.h with these rules.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt/gpt_config.h"
#include "models/hf/hf_config.h"
#include "models/hf/hf_import.h"
#include "runtime/model_interface.h"

namespace zrt {
struct ModelConfig;
}

namespace zrt::gpt {

// The rules above, for hf::HfParamSource.
hf::HfImportRules import_rules();

class GptWeights {
 public:
  GptWeights(const std::string& path, const std::vector<ParamSpec>& params);
  // Elements [first, first + count) of parameter `index` (fp32), for ZeroEngine::initialize.
  void read(int index, std::int64_t first, std::int64_t count, float* out) const;

 private:
  std::shared_ptr<const hf::HfParamSource> source_;
};

// The GPT-2 of a config.json, checked against the run's model block: every dimension the run
// gives (model.preset's, or an explicit key) must equal the file's, else InvalidArgument naming
// both ("model.n_head 8 contradicts <dir>/config.json n_head 4"). seq_len is n_positions (wpe
// has that many rows). A model_type other than gpt2, an untied head, another activation or
// layer-norm epsilon are refused.
GptConfig config_from_hf(const hf::HfConfig& hf, const ModelConfig& run);

}  // namespace zrt::gpt
