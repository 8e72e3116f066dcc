#include "models/gpt/gpt_model_def.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "models/gpt/gpt.h"
#include "models/gpt/gpt_safetensors.h"
#include "models/safetensors.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace {

using I64 = std::int64_t;

class GptDef final : public ModelDef {
 public:
  explicit GptDef(GptConfig config) : config_(std::move(config)) {}

  const std::string& type() const override { return type_; }
  std::string name() const override { return config_.name; }
  std::string describe() const override { return config_.describe(); }
  std::vector<std::pair<std::string, std::int64_t>> dimensions() const override {
    return {{"n_layer", config_.n_layer},
            {"n_head", config_.n_head},
            {"n_embd", config_.n_embd},
            {"vocab_size", config_.vocab_size},
            {"seq_len", config_.seq_len}};
  }

  int seq_len() const override { return config_.seq_len; }
  int vocab_size() const override { return config_.vocab_size; }
  std::unique_ptr<ModelDef> with_seq_len(int seq_len) const override {
    GptConfig config = config_;
    config.seq_len = seq_len;  // wpe has seq_len rows: the model itself changes
    config.validate();
    return std::make_unique<GptDef>(std::move(config));
  }

  std::vector<ParamSpec> parameters() const override { return Gpt::parameter_table(config_); }
  int num_modules() const override { return config_.n_layer + 2; }
  std::int64_t num_parameters() const override { return config_.num_parameters(); }
  std::vector<int> recomputed_modules() const override {
    // Activation checkpointing reruns the blocks (modules 1..L), not the embedding or head.
    std::vector<int> blocks;
    for (int m = 1; m <= config_.n_layer; ++m) blocks.push_back(m);
    return blocks;
  }

  double flops_per_token(int seq_len) const override {
    return gpt::flops_per_token(config_, seq_len);
  }
  std::int64_t activation_bytes(int B, int T, DType dtype,
                                bool activation_checkpointing) const override {
    return gpt::activation_bytes(config_, B, T, dtype, activation_checkpointing);
  }

  std::unique_ptr<Model> build(kernels::KernelContext& ctx,
                               const ModelOptions& options) const override {
    GptOptions gpt_options;
    gpt_options.activation_checkpointing = options.activation_checkpointing;
    return std::make_unique<Gpt>(config_, ctx, gpt_options);
  }

  ParamInitializer initializer(const Model& model, std::uint64_t seed,
                               const std::string& init_from) const override {
    if (!init_from.empty()) {
      // Hugging Face GPT-2 weights: the whole file is read; the caller keeps only its slices.
      auto weights = std::make_shared<const GptWeights>(init_from, model.parameters());
      return [weights](int p, std::int64_t first, std::int64_t count, float* out) {
        weights->read(p, first, count, out);
      };
    }
    return [&model, seed](int p, std::int64_t first, std::int64_t count, float* out) {
      model.init_parameter(p, seed, first, count, out);
    };
  }

 private:
  const std::string type_ = "gpt2";
  GptConfig config_;
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
  // n_head is not visible in the shapes: it comes from the run's config.
  int n_head = 0;
  const auto config = nlohmann::json::parse(input.config_json, nullptr, false);
  if (!config.is_discarded() && config.contains("model")) {
    const auto& m = config["model"];
    if (m.contains("n_head")) n_head = m["n_head"].get<int>();
    if (n_head == 0 && m.contains("preset")) {
      n_head = GptConfig::preset(m["preset"].get<std::string>()).n_head;
    }
  }
  if (n_head == 0) {
    ZRT_THROW(InvalidArgument, "{}: the saved config does not give model.n_head", dir);
  }
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
  const std::filesystem::path config_path =
      std::filesystem::path(out).parent_path() / "config.json";
  std::ofstream config_file(config_path);
  config_file << hf.dump(2) << "\n";
  config_file.flush();
  if (!config_file) {
    ZRT_THROW(Error, "{}: cannot write: {}", config_path.string(), std::strerror(errno));
  }
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
  entry.resolve = [](const ModelConfig& config) { return parse_gpt_spec(config.spec()); };
  entry.parse_spec = parse_gpt_spec;
  entry.export_safetensors = export_gpt2;
  return entry;
}

// Gpt::layout_activations puts a pass's activations in one allocation, each tensor rounded up
// to 256 bytes (S = bytes per element of the compute dtype, BT = B x T, statistics in fp32):
//   residual stream        L + 1 tensors (B,T,C)
//   per block, kept for backward (all L blocks; one reused set under checkpointing, where only
//   the residual stream, i.e. each block's input, is kept and the block's forward reruns):
//     ln1, atty, attproj, res2, ln2, fcproj (B,T,C); qkv (B,T,3C); fch, fch_gelu (B,T,4C);
//     ln1/ln2 mean and rstd (B,T) fp32; the attention probabilities (B,NH,T,T) fp32
//   head: lnf (B,T,C), its mean/rstd, logits (B,T,V) (their gradient in place), losses (B,T)
//   backward scratch: dres, dlnf (B,T,C); one block's dln1, datty, dln2 (B,T,C), dqkv (B,T,3C),
//     dfch, dfch_gelu (B,T,4C)
// plus the 256-byte loss scalar.
std::int64_t activation_bytes(const GptConfig& c, int B, int T, DType dtype,
                              bool activation_checkpointing) {
  auto r = [](I64 bytes) { return (bytes + 255) / 256 * 256; };
  const I64 S = static_cast<I64>(dtype_size(dtype));
  const I64 BT = I64{B} * T;
  const I64 C = c.n_embd;
  const I64 row = r(BT * C * S);  // one (B,T,C) tensor
  const I64 stat = r(BT * 4);     // one (B,T) fp32 statistic
  const I64 block = 6 * row + r(BT * 3 * C * S) + 2 * r(BT * 4 * C * S) + 4 * stat +
                    r(I64{B} * c.n_head * T * T * 4);
  const I64 kept_blocks = activation_checkpointing ? 1 : c.n_layer;
  const I64 residual = (c.n_layer + 1) * row;
  const I64 head = row + 2 * stat + r(BT * c.vocab_size * S) + stat;
  const I64 backward = 2 * row + 3 * row + r(BT * 3 * C * S) + 2 * r(BT * 4 * C * S);
  const I64 loss = 256;
  return residual + kept_blocks * block + head + backward + loss;
}

double flops_per_token(const GptConfig& c, int T) {
  return 6.0 * static_cast<double>(c.num_parameters()) +
         12.0 * c.n_layer * c.n_embd * static_cast<double>(T);
}

}  // namespace zrt::gpt
