#include "models/transformer/transformer_def.h"

namespace zrt::transformer {

std::unique_ptr<Model> TransformerDef::build(kernels::KernelContext& ctx,
                                             const ModelOptions& options) const {
  TransformerOptions transformer_options;
  transformer_options.activation_checkpointing = options.activation_checkpointing;
  transformer_options.sequence_group = options.sequence_group;
  return build_model(ctx, transformer_options);
}

ParamInitializer TransformerDef::initializer(const Model& model, std::uint64_t seed,
                                             const std::string& init_from) const {
  if (!init_from.empty()) return hf_weights_initializer(model, init_from);
  return [&model, seed](int p, std::int64_t first, std::int64_t count, float* out) {
    model.init_parameter(p, seed, first, count, out);
  };
}

}  // namespace zrt::transformer
