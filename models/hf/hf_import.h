// Hugging Face weights → a model's parameters (model.init_from): the generic matching every
// architecture uses. Each parameter of ModelDef::parameters() is found in the files by its own
// name (zrt's parameter names are transformers' state-dict names) or an alias the architecture
// allows, with exactly its shape; then every tensor of the files must have been used, be a
// tied copy equal to the parameter it is tied to, or be one the architecture names as
// ignorable (a buffer, not a weight). Anything else is an InvalidArgument naming the file and
// the tensor — in particular an untied output head that the model would drop.
//
// The values are read lazily: the returned initializer reads only the slices the engine asks
// for, converting bf16/fp16 to fp32 on the way.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/model_registry.h"
#include "runtime/model_interface.h"

namespace zrt::hf {

class HfWeights;

// One tensor of a parameter a file holds in pieces (HfImportRules::pieces).
struct HfPiece {
  std::string name;
  std::vector<std::int64_t> shape;
};

struct HfImportRules {
  // Other names parameter `name` may have in a file, tried after the name itself (GPT-2 hub
  // files drop the "transformer." prefix). May be empty.
  std::function<std::vector<std::string>(const std::string& name)> aliases;
  // File tensors that are not weights and may be left unread, e.g. causal-mask buffers
  // ("attn.bias") or rotary "inv_freq". May be empty.
  std::function<bool(const std::string& tensor)> ignorable;
  // Tied copies: file tensor → the parameter it must equal (a head tied to the embedding:
  // {"lm_head.weight", "model.embed_tokens.weight"}). A copy that differs is an untied head the
  // model cannot hold: an error, never dropped.
  std::map<std::string, std::string> tied;
  // A parameter a file may hold as several tensors whose values, concatenated in order, are the
  // parameter's (the Hub's per-expert tensors of a fused experts parameter: expert 0's gate and
  // up projections, then expert 1's, ...): their names and shapes, tried when neither the name
  // nor an alias is in the file. Empty for none. Each piece must exist with exactly its shape.
  std::function<std::vector<HfPiece>(const std::string& name)> pieces;
};

// The rules for transformers' LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM files,
// whose names zrt's Llama family uses as they are: rotary "inv_freq" buffers (older files) are
// ignorable; with a tied head an lm_head.weight in the file must equal
// model.embed_tokens.weight (untied, lm_head.weight is a parameter like any other, and a file
// without it is refused).
HfImportRules llama_family_rules();

// Which file tensor feeds each parameter, after every check above; `path` is init_from (a
// model directory, a .safetensors file or an index .json).
class HfParamSource {
 public:
  HfParamSource(const std::string& path, const std::vector<ParamSpec>& params,
                const HfImportRules& rules);
  // Elements [first, first + count) of parameter `index`, as fp32.
  void read(int index, std::int64_t first, std::int64_t count, float* out) const;
  // The file tensor parameter `index` reads (its first piece when it is read in pieces).
  const std::string& tensor_of(int index) const {
    return tensors_.at(static_cast<std::size_t>(index)).front().name;
  }

 private:
  struct Source {
    std::string name;
    std::int64_t numel = 0;
  };
  std::shared_ptr<const HfWeights> weights_;
  std::vector<std::vector<Source>> tensors_;
};

// HfParamSource as the ParamInitializer ModelDef::initializer returns (shares the source).
ParamInitializer hf_initializer(const std::string& path, const std::vector<ParamSpec>& params,
                                const HfImportRules& rules);

// "(2, 3)": a shape for messages.
std::string shape_text(const std::vector<std::int64_t>& shape);

}  // namespace zrt::hf
