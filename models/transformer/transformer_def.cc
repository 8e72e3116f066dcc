#include "models/transformer/transformer_def.h"

#include "runtime/common/error.h"

namespace zrt::transformer {

std::unique_ptr<Model> TransformerDef::build(kernels::KernelContext& ctx,
                                             const ModelOptions& options) const {
  // A planned degree only counts (zrt-mem); the experts a rank holds are its group's to decide.
  if (options.expert_group == nullptr && options.planned_expert_parallel_size != 1) {
    ZRT_THROW(InvalidArgument,
              "{}: planned_expert_parallel_size {} is for counting; a model needs the "
              "expert-parallel group",
              type(), options.planned_expert_parallel_size);
  }
  return build_model(ctx, transformer_options(options));
}

TransformerOptions transformer_options(const ModelOptions& options) {
  TransformerOptions o;
  o.activation_checkpointing = options.activation_checkpointing;
  o.cpu_checkpointing = options.cpu_checkpointing;
  o.head_tile_rows = options.head_tile_rows;
  o.mlp_tile_rows = options.mlp_tile_rows;
  o.sequence_group = options.sequence_group;
  o.planned_sequence_parallel_size = options.planned_sequence_parallel_size;
  o.expert_group = options.expert_group;
  o.expert_rows_reserve = options.expert_rows_reserve;
  o.planned_first_backward_block = first_backward_block(options.planned_first_backward_module);
  return o;
}

std::int64_t attention_workspace_growth(std::int64_t forward, std::int64_t backward) {
  using kernels::KernelContext;
  return KernelContext::grown_workspace_bytes(KernelContext::grown_workspace_bytes(0, forward),
                                              backward);
}

ParamInitializer TransformerDef::initializer(const Model& model, std::uint64_t seed,
                                             const std::string& init_from) const {
  if (!init_from.empty()) return hf_weights_initializer(model, init_from);
  return [&model, seed](int p, std::int64_t first, std::int64_t count, float* out) {
    model.init_parameter(p, seed, first, count, out);
  };
}

}  // namespace zrt::transformer
