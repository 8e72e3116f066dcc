// The model registry (models/model_registry.h): it lists gpt2 and the Llama family (their hooks:
// test_llama_registry.cc); an unknown model.type is an
// error naming the known ones (at config validation through the key table, and again where
// the registry resolves a model block, for callers that did not validate); and GPT-2's hooks
// (parameter table and count, FLOPs per token, activation bytes, initialiser, construction)
// agree with what the Gpt itself reports.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/key_table.h"
#include "kernels/kernel_context.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_model_def.h"
#include "models/model_registry.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

using namespace zrt;

namespace {

// A config that validates at one rank, with `model` as its model block.
nlohmann::json config_with_model(const nlohmann::json& model) {
  nlohmann::json doc = nlohmann::json::parse(R"({
    "train_batch_size": 2,
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "data": {"train": "data/train_*.bin"},
    "train": {"steps": 1}
  })");
  doc["model"] = model;
  return doc;
}

const char* const kSpecs[] = {"gpt2-tiny", "gpt2", "gpt2-xl", "gpt2-tiny:seq_len=128",
                              "n_layer=3,n_head=3,n_embd=48,vocab_size=101,seq_len=37"};

}  // namespace

TEST_CASE(
    "the registry lists gpt2, the Llama family and the mixtures of experts, and the config's key "
    "table offers what "
    "it lists") {
  const ModelRegistry& registry = builtin_models();
  CHECK(registry.types() == std::vector<std::string>{"gpt2", "llama", "qwen2", "qwen3", "mistral",
                                                     "mixtral", "qwen2_moe", "qwen3_moe"});
  CHECK(registry.contains("gpt2"));
  CHECK(registry.entry("gpt2").type == "gpt2");
  // config cannot ask the registry, so model.type's choices are written in the key
  // table: they must name exactly the registered types.
  const config::KeyInfo* key = config::find_key("model.type");
  REQUIRE(key != nullptr);
  std::string registered;
  for (const std::string& t : registry.types()) registered += (registered.empty() ? "" : "|") + t;
  CHECK(std::string(key->choices) == registered);
  // The default model.type is a registered one.
  CHECK(registry.contains(ModelConfig{}.type));
}

TEST_CASE("an unknown model.type: a config error, and a registry error naming the known types") {
  // Config validation rejects it first, naming the key and the choices.
  CHECK_THROWS_WITH(
      parse_config(config_with_model({{"type", "bloom"}, {"preset", "gpt2-tiny"}}), 1, "run.json"),
      Catch::Contains("model.type") && Catch::Contains("gpt2"));
  // A ModelConfig that did not come through validation: the registry says the same at
  // resolution (make_model, zrt-mem, zrt-train --check) and export.
  ModelConfig config;
  config.type = "bloom";
  config.preset = "gpt2-tiny";
  const std::string message =
      "unknown model.type 'bloom' (known: gpt2, llama, qwen2, qwen3, mistral, mixtral, "
      "qwen2_moe, qwen3_moe)";
  CHECK_THROWS_AS(builtin_models().resolve(config), InvalidArgument);
  CHECK_THROWS_WITH(builtin_models().resolve(config), Catch::Contains(message));
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("test");
  kernels::KernelContext ctx(*device, *stream);
  CHECK_THROWS_WITH(make_model(config, ctx, ModelOptions{}), Catch::Contains(message));
  CHECK_THROWS_WITH(builtin_models().parse_spec("bloom", "gpt2-tiny"), Catch::Contains(message));
  ExportInput saved;
  saved.checkpoint = "ckpt";
  saved.config_json = R"({"model": {"type": "bloom"}})";
  CHECK_THROWS_WITH(builtin_models().export_safetensors(saved, "out.safetensors"),
                    Catch::Contains(message));
  // A saved config without model.type is the default's (gpt2), whose exporter names the
  // problem with the tensors.
  saved.config_json = R"({"model": {"preset": "gpt2-tiny"}})";
  CHECK_THROWS_WITH(builtin_models().export_safetensors(saved, "out.safetensors"),
                    Catch::Contains("ckpt: not a GPT-2 checkpoint"));
}

// Another family's preset under the default model.type names the type it belongs to (it read
// as an unknown GPT preset).
TEST_CASE("a preset of another family names its model.type") {
  ModelConfig config;  // model.type gpt2, the default
  config.preset = "llama-3.2-1b";
  CHECK_THROWS_WITH(builtin_models().resolve(config),
                    Catch::Contains("model.preset 'llama-3.2-1b' is a llama preset, but "
                                    "model.type is gpt2 (the default when none is given): set "
                                    "model.type to llama"));
  config.type = "llama";
  CHECK_NOTHROW(builtin_models().resolve(config));
}

TEST_CASE("a registry refuses a second entry of one type and an entry without its hooks") {
  ModelRegistry registry;
  registry.add(gpt::registry_entry());
  CHECK_THROWS_WITH(registry.add(gpt::registry_entry()), Catch::Contains("registered twice"));
  ModelEntry bare;
  bare.type = "bare";
  CHECK_THROWS_WITH(registry.add(bare), Catch::Contains("'bare' lacks a hook"));
  CHECK(registry.types() == std::vector<std::string>{"gpt2"});
}

TEST_CASE("the model block resolves as GptConfig::parse(spec()) does") {
  const Config config = parse_config(
      config_with_model({{"preset", "gpt2-tiny"}, {"n_layer", 3}, {"seq_len", 64}}), 1, "run.json");
  const auto def = builtin_models().resolve(config.model);
  const gpt::GptConfig want = gpt::GptConfig::parse(config.model.spec());
  CHECK(def->type() == "gpt2");
  CHECK(def->name() == want.name);
  CHECK(def->describe() == want.describe());
  CHECK(def->seq_len() == 64);
  CHECK(def->vocab_size() == 256);
  CHECK(def->num_parameters() == want.num_parameters());
  using Dims = std::vector<std::pair<std::string, std::int64_t>>;
  CHECK(def->dimensions() ==
        Dims{{"n_layer", 3}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256}, {"seq_len", 64}});
  // An invalid block is the GPT's own error.
  ModelConfig bad = config.model;
  bad.n_head = 5;
  CHECK_THROWS_WITH(builtin_models().resolve(bad), Catch::Contains("not a multiple of n_head=5"));
  // with_seq_len changes only the length, validated.
  CHECK(def->with_seq_len(32)->describe() ==
        gpt::GptConfig::parse(config.model.spec() + ",seq_len=32").describe());
  CHECK_THROWS_AS(def->with_seq_len(0), InvalidArgument);
}

TEST_CASE("GPT-2's hooks agree with the model: parameters, count, FLOPs, recomputed modules") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("test");
  kernels::KernelContext ctx(*device, *stream);
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto def = builtin_models().parse_spec(spec);
    const gpt::GptConfig config = gpt::GptConfig::parse(spec);
    const gpt::Gpt model(config, ctx);
    const std::vector<ParamSpec> params = def->parameters();
    REQUIRE(params.size() == model.parameters().size());
    std::int64_t total = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const ParamSpec& want = model.parameters()[i];
      CHECK(params[i].name == want.name);
      CHECK(params[i].shape == want.shape);
      CHECK(params[i].modules == want.modules);
      CHECK(params[i].no_weight_decay == want.no_weight_decay);
      total += params[i].numel();
    }
    CHECK(def->num_modules() == model.num_modules());
    CHECK(def->num_parameters() == total);
    CHECK(def->num_parameters() == config.num_parameters());
    // MFU's FLOPs per token: 6 N plus attention's 12 L C T, the formula zrt-train has used.
    for (int T : {1, config.seq_len / 2 + 1, config.seq_len}) {
      const double want = 6.0 * static_cast<double>(config.num_parameters()) +
                          12.0 * config.n_layer * config.n_embd * static_cast<double>(T);
      CHECK(def->flops_per_token(T) == want);
    }
    // Checkpointing reruns the blocks, modules 1..L.
    std::vector<int> blocks;
    for (int m = 1; m <= config.n_layer; ++m) blocks.push_back(m);
    CHECK(def->recomputed_modules() == blocks);
  }
  // gpt2 (124M): 124,439,808 parameters, as Hugging Face counts them (tied head).
  CHECK(builtin_models().parse_spec("gpt2")->num_parameters() == 124'439'808);
}

TEST_CASE("GPT-2's activation hook: the closed form equals the model's own layout") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("test");
  kernels::KernelContext ctx(*device, *stream);
  for (const char* spec : kSpecs) {
    const auto def = builtin_models().parse_spec(spec);
    const auto config = gpt::GptConfig::parse(spec);
    for (bool ckpt : {false, true}) {
      gpt::GptOptions options;
      options.activation_checkpointing = ckpt;
      const gpt::Gpt model(config, ctx, options);
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        for (auto [B, T] : {std::pair{1, config.seq_len}, std::pair{3, config.seq_len / 2 + 1}}) {
          INFO(spec << " ckpt " << ckpt << " " << dtype_name(dt) << " B " << B << " T " << T);
          CHECK(def->activation_bytes(B, T, dt, ckpt) ==
                model.activation_bytes(B, T, dt) + 256);  // + the loss scalar
        }
      }
      // Frozen lower layers: the backward from block F (module F + 1); the blocks below share
      // one kept set, the residual stream below F two rows, the host none of their inputs.
      for (bool cpu : {false, true}) {
        if (cpu && !ckpt) continue;
        for (int F : {1, 2, config.n_layer - 1, config.n_layer}) {
          INFO(spec << " ckpt " << ckpt << " cpu_checkpointing " << cpu << " first block " << F);
          gpt::GptOptions planned = options;
          planned.cpu_checkpointing = cpu;
          planned.planned_first_backward_block = F;
          CHECK(gpt::activation_bytes(config, 2, 24, DType::kBFloat16, planned) ==
                gpt::Gpt::planned_activation_bytes(config, planned, 2, 24, DType::kBFloat16));
          ModelOptions counted;
          counted.activation_checkpointing = ckpt;
          counted.cpu_checkpointing = cpu;
          counted.planned_first_backward_module = F + 1;
          CHECK(def->activation_footprint(2, 24, DType::kBFloat16, counted).device ==
                gpt::activation_bytes(config, 2, 24, DType::kBFloat16, planned));
        }
      }
    }
  }
  // Checkpointing keeps one block's tensors instead of L: for gpt2-xl at B = 4, T = 1024 in bf16
  // a block keeps 6 (B,T,C) tensors, qkv, two (B,T,4C), four (B,T) fp32 statistics and the fp32
  // attention log-sum-exp (B,NH,T) = 223,297,536 bytes (by hand).
  const auto xl = builtin_models().parse_spec("gpt2-xl");
  const std::int64_t block =
      6 * 13'107'200LL + 39'321'600 + 2 * 52'428'800LL + 4 * 16'384 + 409'600;
  REQUIRE(block == 223'297'536);
  CHECK(xl->activation_bytes(4, 1024, DType::kBFloat16, false) -
            xl->activation_bytes(4, 1024, DType::kBFloat16, true) ==
        47 * block);
}

TEST_CASE("make_model and the initialiser: the Gpt with its own random initialisation") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("test");
  kernels::KernelContext ctx(*device, *stream);
  ModelConfig config;
  config.preset = "gpt2-tiny";
  const std::unique_ptr<Model> model = make_model(config, ctx, ModelOptions{true});
  const auto* gpt_model = dynamic_cast<const gpt::Gpt*>(model.get());
  REQUIRE(gpt_model != nullptr);
  CHECK(gpt_model->options().activation_checkpointing);
  CHECK(gpt_model->config().describe() == gpt::GptConfig::preset("gpt2-tiny").describe());

  const auto def = builtin_models().resolve(config);
  const ParamInitializer init = def->initializer(*model, 42, "");
  for (int p : {0, 1, 2, 4, gpt_model->lnf_weight()}) {
    const ParamSpec& spec = model->parameters()[static_cast<std::size_t>(p)];
    const std::int64_t first = spec.numel() / 3;
    const std::int64_t count = spec.numel() - first;
    std::vector<float> got(static_cast<std::size_t>(count)), want(got.size());
    init(p, first, count, got.data());
    model->init_parameter(p, 42, first, count, want.data());
    CHECK(got == want);
  }
  // With init_from, the file is read (and must exist).
  CHECK_THROWS(def->initializer(*model, 42, "/nonexistent/model.safetensors"));
}
