#include "models/gpt/gpt_model_def.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_safetensors.h"
#include "models/safetensors.h"
#include "models/transformer/checkpoint_offload.h"
#include "models/transformer/tiling.h"
#include "models/transformer/transformer_activations.h"
#include "models/transformer/transformer_def.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace {

using I64 = std::int64_t;

class GptDef final : public transformer::TransformerDefOf<GptDef, GptConfig, Gpt> {
 public:
  using TransformerDefOf::TransformerDefOf;

  const std::string& type() const override { return type_; }
  std::vector<std::pair<std::string, std::int64_t>> dimensions() const override {
    return {{"n_layer", config().n_layer},
            {"n_head", config().n_head},
            {"n_embd", config().n_embd},
            {"vocab_size", config().vocab_size},
            {"seq_len", config().seq_len}};
  }
  double flops_per_token(int seq_len) const override {
    return gpt::flops_per_token(config(), seq_len);
  }
  std::int64_t activation_bytes(int B, int T, DType dtype,
                                bool activation_checkpointing) const override {
    return gpt::activation_bytes(config(), B, T, dtype, activation_checkpointing);
  }
  TileRows tile_rows(int B, int T, DType dtype, const ModelOptions& options) const override {
    return {transformer::head_tile_rows(
                config().vocab_size, transformer::transformer_options(options), std::int64_t{B} * T,
                static_cast<std::int64_t>(dtype_size(dtype))),
            0, 0};
  }
  ActivationFootprint activation_footprint(int B, int T, DType dtype,
                                           const ModelOptions& options) const override {
    const transformer::TransformerOptions o = transformer::transformer_options(options);
    // At sp > 1 the blocks add the all-to-alls' buffers and whole-sequence tensors: the
    // model's own planner counts them.
    const std::int64_t device = o.sequence_parallel_size() > 1
                                    ? Gpt::planned_activation_bytes(config(), o, B, T, dtype)
                                    : gpt::activation_bytes(config(), B, T, dtype, o);
    return {device, gpt::host_activation_bytes(config(), B, T, dtype, o)};
  }
  // The attention over the whole sequence (sp * T) with this rank's NH / sp heads.
  std::int64_t kernel_workspace_bytes(int B, int T, DType dtype, const ModelOptions& options,
                                      bool on_cpu) const override {
    const int sp = transformer::transformer_options(options).sequence_parallel_size();
    const GptConfig& c = config();
    const kernels::KernelOptions kernel_options;
    const auto request = [&](bool backward) {
      return kernels::attention_workspace_bytes(on_cpu, kernel_options, dtype, B, sp * T,
                                                c.n_embd / sp, c.n_head / sp, backward,
                                                options.planned_documents);
    };
    return transformer::attention_workspace_growth(request(false), request(true));
  }

 protected:
  int n_layer() const override { return config().n_layer; }
  ParamInitializer hf_weights_initializer(const Model& model,
                                          const std::string& init_from) const override {
    // Hugging Face GPT-2 weights, read lazily: each rank reads only the slices it keeps.
    std::error_code ec;
    if (std::filesystem::is_regular_file(init_from, ec) && !hf::hf_config_for(init_from)) {
      spdlog::warn(
          "model.init_from {}: no config.json beside it, so the file's head count cannot be "
          "checked against model.n_head (the shapes do not show it)",
          init_from);
    }
    return hf::hf_initializer(init_from, model.parameters(), import_rules());
  }

 private:
  const std::string type_ = "gpt2";
};

// Hugging Face GPT-2: the tensors under zrt's names (which are Hugging Face's) with Conv1D
// weights (in, out) as zrt keeps them, fp32, and a GPT2LMHeadModel config.json beside them.
void export_gpt2(ExportInput input, const std::string& out) {
  const std::string& dir = input.checkpoint;
  std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>
      tensors;
  int n_layer = 0;
  std::int64_t vocab = 0, n_positions = 0, n_embd = 0;
  for (ExportTensor& t : input.tensors) {
    if (t.name == "transformer.wte.weight" && t.shape.size() == 2) {
      vocab = t.shape[0];
      n_embd = t.shape[1];
    }
    if (t.name == "transformer.wpe.weight" && t.shape.size() == 2) n_positions = t.shape[0];
    if (t.name.rfind("transformer.h.", 0) == 0) {
      n_layer = std::max(n_layer, std::stoi(t.name.substr(14)) + 1);
    }
    tensors.emplace_back(t.name, std::make_pair(t.shape, std::move(t.values)));
  }
  if (vocab == 0 || n_positions == 0 || n_layer == 0) {
    ZRT_THROW(InvalidArgument,
              "{}: not a GPT-2 checkpoint (no transformer.wte / wpe / h.* parameters)", dir);
  }
  // n_head is not visible in the shapes: it comes from the run's config (its model block
  // resolved again, so a run from a Hugging Face directory takes it from that config.json).
  const int n_head = static_cast<int>(
      builtin_models().resolve(saved_model_config(input.config_json, dir))->dimensions()[1].second);
  write_safetensors(out, tensors, {{"format", "pt"}});
  nlohmann::json hf;
  hf["architectures"] = {"GPT2LMHeadModel"};
  hf["model_type"] = "gpt2";
  hf["vocab_size"] = vocab;
  hf["n_positions"] = n_positions;
  hf["n_ctx"] = n_positions;
  hf["n_embd"] = n_embd;
  hf["n_layer"] = n_layer;
  hf["n_head"] = n_head;
  hf["activation_function"] = "gelu_new";
  hf["layer_norm_epsilon"] = 1e-5;
  hf["tie_word_embeddings"] = true;
  hf["torch_dtype"] = "float32";
  // Left out, transformers' GPT2Config gives bos and eos 50256: an id a smaller vocabulary
  // does not have (generate() would never stop, or index past the embedding). Null says none.
  if (vocab <= 50256) {
    hf["bos_token_id"] = nullptr;
    hf["eos_token_id"] = nullptr;
  }
  const std::filesystem::path config_path =
      std::filesystem::path(out).parent_path() / "config.json";
  std::ofstream config_file(config_path);
  config_file << hf.dump(2) << "\n";
  config_file.flush();
  if (!config_file) {
    ZRT_THROW(Error, "{}: cannot write: {}", config_path.string(), std::strerror(errno));
  }
}

// config.json of a GPT2LMHeadModel with the checkpoint's dimensions (the saved run's model
// block resolved again: n_head is not visible in the shapes).
std::string hf_config_json(const ExportInput& input) {
  const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
  const auto def = builtin_models().resolve(saved);
  std::map<std::string, std::int64_t> dims;
  for (const auto& [key, value] : def->dimensions()) dims[key] = value;
  nlohmann::json hf;
  hf["architectures"] = {"GPT2LMHeadModel"};
  hf["model_type"] = "gpt2";
  hf["vocab_size"] = dims.at("vocab_size");
  hf["n_positions"] = dims.at("seq_len");
  hf["n_ctx"] = dims.at("seq_len");
  hf["n_embd"] = dims.at("n_embd");
  hf["n_layer"] = dims.at("n_layer");
  hf["n_head"] = dims.at("n_head");
  hf["n_inner"] = nullptr;  // 4 x n_embd
  hf["activation_function"] = "gelu_new";
  hf["layer_norm_epsilon"] = 1e-5;
  hf["resid_pdrop"] = 0.0;  // zrt trains without dropout
  hf["embd_pdrop"] = 0.0;
  hf["attn_pdrop"] = 0.0;
  hf["tie_word_embeddings"] = true;
  return hf.dump();
}

std::unique_ptr<ModelDef> parse_gpt_spec(const std::string& spec) {
  return std::make_unique<GptDef>(GptConfig::parse(spec));
}

}  // namespace

ModelEntry registry_entry() {
  ModelEntry entry;
  entry.type = "gpt2";
  entry.summary = "GPT-2 (presets gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)";
  entry.presets = GptConfig::preset_names();
  entry.resolve = [](const ModelConfig& config) -> std::unique_ptr<ModelDef> {
    // A Hugging Face directory (or a file with its config.json beside it) gives the dimensions;
    // the run's keys must agree with them.
    if (const auto hf = hf::hf_config_for(config.init_from)) {
      return std::make_unique<GptDef>(config_from_hf(*hf, config));
    }
    return parse_gpt_spec(config.spec());
  };
  entry.parse_spec = parse_gpt_spec;
  entry.export_safetensors = export_gpt2;
  entry.hf_config = hf_config_json;
  return entry;
}

// Gpt::layout_activations puts a pass's activations in one allocation, each tensor rounded up
// to 256 bytes (S = bytes per element of the compute dtype, BT = B x T, statistics in fp32):
//   residual stream        L + 1 tensors (B,T,C) (below the first block whose backward runs, F:
//                          two rows in turn, so L + 1 - F + min(F, 2))
//   per block, kept for backward (the L - F blocks from F and one set the blocks below share;
//   one reused set under checkpointing, where only the residual stream, i.e. each block's input,
//   is kept and the block's forward reruns):
//     ln1, atty, attproj, res2, ln2, fcproj (B,T,C); qkv (B,T,3C); fch, fch_gelu (B,T,4C);
//     ln1/ln2 mean and rstd (B,T) fp32; the attention log-sum-exp (B,NH,T) fp32
//   head: lnf (B,T,C), its mean/rstd, logits (B,T,V) in rows of kernels::logits_row_stride(V)
//     (their gradient in place), losses (B,T)
//   backward scratch: dres, dlnf (B,T,C); one block's dln1, datty, dln2 (B,T,C), dqkv (B,T,3C),
//     dfch, dfch_gelu (B,T,4C)
// plus the 256-byte loss scalar.
std::int64_t activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                              bool activation_checkpointing) {
  transformer::TransformerOptions options;
  options.activation_checkpointing = activation_checkpointing;
  return activation_bytes(c, B, T, dtype, options);
}

// With cpu_checkpointing (and L > 2) the residual stream keeps 3 tensors, the host L - 2 (of
// the blocks from the first whose backward runs, F: L - 2 - F); a tiled head's logits are (R,V),
// R its tile rows (transformer/tiling.h). Below F (frozen lower layers) the blocks share one kept
// set and the residual stream two rows (transformer/transformer_activations.h).
std::int64_t host_activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                                   const transformer::TransformerOptions& options) {
  const int F = std::min(options.planned_first_backward_block, c.n_layer);
  const int host_rows = std::max(0, transformer::offloaded_block_inputs(c.n_layer, options) - F);
  return I64{host_rows} * B * T * c.n_embd * static_cast<I64>(dtype_size(dtype));
}

std::int64_t activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                              const transformer::TransformerOptions& options) {
  const bool activation_checkpointing = options.activation_checkpointing;
  auto r = [](I64 bytes) { return (bytes + 255) / 256 * 256; };
  const I64 S = static_cast<I64>(dtype_size(dtype));
  const I64 BT = I64{B} * T;
  const I64 C = c.n_embd;
  const I64 row = r(BT * C * S);  // one (B,T,C) tensor
  const I64 stat = r(BT * 4);     // one (B,T) fp32 statistic
  const I64 block =
      6 * row + r(BT * 3 * C * S) + 2 * r(BT * 4 * C * S) + 4 * stat + r(I64{B} * c.n_head * T * 4);
  const int L = c.n_layer;
  const int F = std::min(options.planned_first_backward_block, L);
  const I64 kept_blocks = activation_checkpointing ? 1 : (F > 0 ? 1 : 0) + L - F;
  const bool offloaded = transformer::offloaded_block_inputs(L, options) > 0;
  const I64 residual = (offloaded ? 3 : L + 1 - F + std::min(F, 2)) * row;
  const I64 ldl = kernels::logits_row_stride(c.vocab_size);
  const I64 logit_rows = transformer::head_tile_rows(options.head_tile_rows, BT, ldl * S);
  const I64 head = row + 2 * stat + r(logit_rows * ldl * S) + stat;
  const I64 backward = 2 * row + 3 * row + r(BT * 3 * C * S) + 2 * r(BT * 4 * C * S);
  const I64 loss = 256;
  return residual + kept_blocks * block + head + backward + loss;
}

double flops_per_token(const GptConfig& c, int T) {
  return 6.0 * static_cast<double>(c.num_parameters()) +
         12.0 * c.n_layer * c.n_embd * static_cast<double>(T);
}

}  // namespace zrt::gpt
