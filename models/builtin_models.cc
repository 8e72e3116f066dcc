// The architectures zrt ships: the one place that lists them (docs/extending.md, "Add a
// model"). Built on first use and never changed afterwards.
#include "models/gpt/gpt_model_def.h"
#include "models/llama/llama_model_def.h"
#include "models/model_registry.h"
#include "models/moe/moe_model_def.h"

namespace zrt {

namespace {
ModelRegistry register_builtin_models() {
  ModelRegistry registry;
  registry.add(gpt::registry_entry());
  for (const char* architecture : {"llama", "qwen2", "qwen3", "mistral"}) {
    registry.add(llama::registry_entry(architecture));
  }
  for (const char* architecture : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    registry.add(moe::registry_entry(architecture));
  }
  return registry;
}
}  // namespace

const ModelRegistry& builtin_models() {
  static const ModelRegistry registry = register_builtin_models();
  return registry;
}

}  // namespace zrt
