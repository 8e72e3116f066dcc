#include "models/moe/moe_model_def.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/ops.h"
#include "models/hf/hf_config.h"
#include "models/hf/hf_import.h"
#include "models/moe/moe_hf.h"
#include "models/moe/moe_model.h"
#include "models/safetensors.h"
#include "models/transformer/transformer_activations.h"
#include "models/transformer/transformer_def.h"
#include "runtime/common/error.h"

namespace zrt::moe {

namespace {

class MoeDef final : public transformer::TransformerDefOf<MoeDef, MoeConfig, MoeModel> {
 public:
  using TransformerDefOf::TransformerDefOf;

  const std::string& type() const override { return config().architecture; }
  std::vector<std::pair<std::string, std::int64_t>> dimensions() const override {
    const MoeConfig& c = config();
    return {{"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"num_experts", c.num_experts},
            {"num_experts_per_tok", c.num_experts_per_tok},
            {"moe_intermediate_size", c.moe_intermediate_size},
            {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
            {"seq_len", c.seq_len}};
  }
  std::int64_t num_active_parameters() const override { return config().num_active_parameters(); }
  double flops_per_token(int seq_len) const override {
    return moe::flops_per_token(config(), seq_len);
  }
  std::int64_t activation_bytes(int B, int T, DType dtype,
                                bool activation_checkpointing) const override {
    return MoeModel::activation_bytes(config(), B, T, dtype, activation_checkpointing);
  }
  // The grouped-query attention over the whole sequence (sp * T) with this rank's query and
  // key/value heads, as the Llama family's. On the CPU backend in 16 bits the experts' grouped
  // linear layers convert through the workspace too, for their largest expert's rows:
  // data-dependent, and not counted (as no linear layer's is).
  std::int64_t kernel_workspace_bytes(int B, int T, DType dtype, const ModelOptions& options,
                                      bool on_cpu) const override {
    const int sp = transformer::transformer_options(options).sequence_parallel_size();
    const MoeConfig& c = config();
    const transformer::GqaHeads heads =
        transformer::gqa_heads(c.num_attention_heads, c.num_key_value_heads, c.head_dim, sp);
    const int NH = sp > 1 ? heads.q_heads.block_heads : heads.NH;
    const int NKV = sp > 1 ? heads.kv_heads.block_heads : heads.NKV;
    const kernels::KernelOptions kernel_options;
    const auto request = [&](bool backward) {
      return kernels::gqa_attention_workspace_bytes(on_cpu, kernel_options, dtype, B, sp * T, NH,
                                                    NKV, c.head_dim, backward,
                                                    options.planned_documents);
    };
    return transformer::attention_workspace_growth(request(false), request(true));
  }
  bool has_auxiliary_loss() const override { return true; }
  // The load-balancing counts and router probability sums (MoeModel::add_auxiliary_losses).
  std::int64_t sequence_group_sum_floats() const override {
    return MoeModel::sequence_group_sum_floats(config());
  }
  // Under expert parallelism: this rank's experts (partition_for).
  std::vector<ParamSpec> parameters_for(const ModelOptions& options) const override {
    return MoeModel::parameter_table(config(), partition_for(options));
  }
  // Under expert parallelism the local experts' rows at options.planned_expert_rows, or where
  // expert_rows_reserve starts them (models/moe/expert_rows.h), and the dispatch's count
  // vectors.
  TileRows tile_rows(int B, int T, DType dtype, const ModelOptions& options) const override {
    const MoeOptions o = transformer::transformer_options(options);
    const MoeConfig& c = config();
    const std::int64_t N = std::int64_t{B} * T, S = static_cast<std::int64_t>(dtype_size(dtype));
    const int moe_layers = c.num_moe_layers();
    return {
        transformer::head_tile_rows(c.vocab_size, o, N, S),
        moe_layers < c.num_hidden_layers ? MoeModel::dense_tile_rows(c, o.mlp_tile_rows, N, S) : 0,
        moe_layers > 0 ? MoeModel::moe_tile_rows(c, o.mlp_tile_rows, N, S) : 0};
  }
  ActivationFootprint activation_footprint(int B, int T, DType dtype,
                                           const ModelOptions& options) const override {
    const ExpertPartition experts = partition_for(options);
    ActivationFootprint f;
    const MoeOptions o = transformer::transformer_options(options);
    f.device = MoeModel::activation_bytes(config(), B, T, dtype, o, experts.ep_size,
                                          options.planned_expert_rows);
    f.pinned_host = MoeModel::host_activation_bytes(config(), B, T, dtype, o);
    if (experts.ep_size > 1) f.device_comm = ExpertDispatch::own_bytes(experts.num_experts);
    return f;
  }

 protected:
  int n_layer() const override { return config().num_hidden_layers; }
  // This rank's experts for `options` (its group's position; position 0 for a planned degree);
  // InvalidArgument unless the degree divides the experts.
  ExpertPartition partition_for(const ModelOptions& options) const {
    const ProcessGroup* group = options.expert_group;
    const int ep = group != nullptr ? group->size() : options.planned_expert_parallel_size;
    const int E = config().num_experts;
    if (ep < 1 || E % ep != 0) {
      ZRT_THROW(InvalidArgument,
                "expert_parallel.autoep_size {} does not divide the {} experts of {}: each rank "
                "of an expert-parallel group holds the same number of experts",
                ep, E, config().describe());
    }
    return ExpertPartition{E, ep, group != nullptr ? group->rank() : 0};
  }
  ParamInitializer hf_weights_initializer(const Model& model,
                                          const std::string& init_from) const override {
    return hf::hf_initializer(init_from, model.parameters(), import_rules(config()));
  }
};

// Hugging Face safetensors in the Hub's per-expert form, and its config.json beside them.
void export_moe(ExportInput input, const std::string& out) {
  const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
  const MoeConfig c = resolve_config(saved);
  // The Hub's form of the checkpoint's tensors, checked against the whole model's: a
  // checkpoint saved under expert parallelism holds each expert's own parameters, the others
  // the fused ones; both export to the same file, in the same order.
  const std::string checkpoint = input.checkpoint;
  std::vector<ExportTensor> hub = hub_tensors(c, std::move(input.tensors));
  std::map<std::string, ExportTensor*> by_name;
  for (ExportTensor& t : hub) {
    if (!by_name.emplace(t.name, &t).second) {
      ZRT_THROW(InvalidArgument, "{}: tensor {} twice", checkpoint, t.name);
    }
  }
  const std::vector<hf::HfPiece> layout = hub_layout(c);
  SafetensorsTensors tensors;
  for (const hf::HfPiece& piece : layout) {
    const auto it = by_name.find(piece.name);
    if (it == by_name.end()) {
      ZRT_THROW(InvalidArgument, "{}: no tensor {} of a {}", checkpoint, piece.name, c.describe());
    }
    ExportTensor& t = *it->second;
    if (t.shape != piece.shape) {
      ZRT_THROW(InvalidArgument, "{}: tensor {} has shape {}, a {} has {}", checkpoint, piece.name,
                fmt::format("({})", fmt::join(t.shape, ", ")), c.describe(),
                fmt::format("({})", fmt::join(piece.shape, ", ")));
    }
    tensors.emplace_back(piece.name, std::make_pair(t.shape, std::move(t.values)));
  }
  if (hub.size() != layout.size()) {
    ZRT_THROW(InvalidArgument, "{}: {} tensors in the Hub's form, but a {} has {}", checkpoint,
              hub.size(), c.describe(), layout.size());
  }
  write_safetensors(out, tensors, {{"format", "pt"}});
  const std::filesystem::path config_path =
      std::filesystem::path(out).parent_path() / "config.json";
  std::ofstream config_file(config_path);
  config_file << hf_config_json(c).dump(2) << "\n";
  config_file.flush();
  if (!config_file) {
    ZRT_THROW(Error, "{}: cannot write: {}", config_path.string(), std::strerror(errno));
  }
}

}  // namespace

MoeConfig resolve_config(const ModelConfig& config) {
  if (const auto hf = hf::hf_config_for(config.init_from)) return config_from_hf(*hf, config);
  return MoeConfig::parse(config.type, config.spec());
}

ModelEntry registry_entry(const std::string& architecture) {
  ModelEntry entry;
  entry.type = architecture;
  std::string presets;
  for (const std::string& name : MoeConfig::preset_names()) {
    if (MoeConfig::preset(name).architecture != architecture) continue;
    entry.presets.push_back(name);
    presets += (presets.empty() ? "" : ", ") + name;
  }
  const char* family = architecture == "mixtral"     ? "Mixtral"
                       : architecture == "qwen2_moe" ? "Qwen2-MoE / Qwen1.5-MoE"
                                                     : "Qwen3-MoE";
  entry.summary = fmt::format("{} mixture of experts (presets {})", family, presets);
  entry.resolve = [](const ModelConfig& config) -> std::unique_ptr<ModelDef> {
    return std::make_unique<MoeDef>(resolve_config(config));
  };
  entry.parse_spec = [architecture](const std::string& spec) -> std::unique_ptr<ModelDef> {
    return std::make_unique<MoeDef>(MoeConfig::parse(architecture, spec));
  };
  entry.export_safetensors = [](ExportInput input, const std::string& out) {
    export_moe(std::move(input), out);
  };
  entry.hf_config = [](const ExportInput& input) {
    const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
    return hf_config_json(resolve_config(saved)).dump(2);
  };
  entry.hub_tensors = [](const ExportInput& input, std::vector<ExportTensor> tensors) {
    const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
    return hub_tensors(resolve_config(saved), std::move(tensors));
  };
  return entry;
}

double flops_per_token(const MoeConfig& c, int T) {
  const double looked_up = c.tie_word_embeddings ? 0.0 : double(c.vocab_size) * c.hidden_size;
  return 6.0 * (static_cast<double>(c.num_active_parameters()) - looked_up) +
         12.0 * c.num_hidden_layers * double(c.num_attention_heads) * c.head_dim * T;
}

}  // namespace zrt::moe
