// GPT-2 weights from a Hugging Face safetensors file (model.init_from): names with or without
// the "transformer." prefix, Conv1D weights (in, out) as zrt stores them; the attention mask
// buffers (attn.bias, attn.masked_bias) and a tied lm_head.weight are skipped. Every parameter
// must be present with its exact shape; an unknown tensor is an error (a foreign file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model_interface.h"

namespace zrt::gpt {

class GptWeights {
 public:
  GptWeights(const std::string& path, const std::vector<ParamSpec>& params);
  // Elements [first, first + count) of parameter `index` (fp32), for ZeroEngine::initialize.
  void read(int index, std::int64_t first, std::int64_t count, float* out) const;

 private:
  std::vector<std::vector<float>> values_;
};

}  // namespace zrt::gpt
