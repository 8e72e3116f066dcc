// The Llama family in the model registry: the config's model block (config.json's key names,
// rope_scaling, keys of the other architecture refused by name, Mistral's sliding window), the
// tools' --model specs (presets route to their entry), and the hooks (parameter table, FLOPs,
// activation bytes, recomputed modules, export) agree with the Llama model and with arithmetic
// done by hand.
#include <catch2/catch.hpp>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "models/llama/llama.h"
#include "models/llama/llama_model_def.h"
#include "models/model_registry.h"
#include "models/safetensors.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

using namespace zrt;

namespace {

nlohmann::json config_with_model(const nlohmann::json& model) {
  auto doc = nlohmann::json::parse(R"({
    "train_batch_size": 2,
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "data": {"train": "data/train_*.bin"},
    "train": {"steps": 1}
  })");
  doc["model"] = model;
  return doc;
}

const char* const kSpecs[] = {"llama-tiny",
                              "llama-3.2-1b",
                              "llama-3.1-8b",
                              "qwen2.5-0.5b",
                              "qwen2.5-7b",
                              "smollm2-135m",
                              "llama-tiny:num_hidden_layers=3,tie_word_embeddings=true,seq_len=64"};

}  // namespace

TEST_CASE("a Llama model block resolves, with config.json's names and rope_scaling",
          "[llama][registry]") {
  const Config config = parse_config(
      config_with_model(
          {{"type", "llama"},
           {"preset", "llama-tiny"},
           {"num_hidden_layers", 3},
           {"seq_len", 64},
           {"rope_theta", 500000.0},
           {"rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8}, {"original_max_position_embeddings", 128}}}}),
      1, "run.json");
  const auto def = builtin_models().resolve(config.model);
  CHECK(def->type() == "llama");
  const llama::LlamaConfig c = llama::resolve_config(config.model);
  CHECK(c.num_hidden_layers == 3);
  CHECK(c.seq_len == 64);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.rope_type == "llama3");
  CHECK(c.rope_scaling.factor == 8.0);
  CHECK(c.rope_scaling.high_freq_factor == 4.0);  // the default of a key not given
  CHECK(c.rope_scaling.original_max_position_embeddings == 128);
  CHECK(def->describe() == c.describe());
  CHECK(def->seq_len() == 64);
  CHECK(def->with_seq_len(32)->seq_len() == 32);
  CHECK_THROWS_WITH(def->with_seq_len(1024), Catch::Contains("exceeds max_position_embeddings"));
  // The saved form of the block (to_json) reads back to the same model.
  const Config again = parse_config(resolved_document(config), 1, "saved.json");
  CHECK(llama::resolve_config(again.model).describe() == c.describe());
  CHECK(again.model.spec() == config.model.spec());
}

// YaRN from a run config (Qwen3's long-context recipe: factor 4 over 32768 positions), every key
// through the saved form and back.
TEST_CASE("a Qwen3 block with YaRN resolves, and its saved form reads back", "[llama][registry]") {
  const Config config =
      parse_config(config_with_model({{"type", "qwen3"},
                                      {"preset", "qwen3-0.6b"},  // 40960 positions
                                      {"seq_len", 65536},
                                      {"rope_scaling",
                                       {{"rope_type", "yarn"},
                                        {"factor", 4},
                                        {"original_max_position_embeddings", 32768},
                                        {"beta_fast", 16},
                                        {"beta_slow", 2},
                                        {"mscale", 1.0},
                                        {"mscale_all_dim", 0.5},
                                        {"truncate", false}}}}),
                   1, "run.json");
  const llama::LlamaConfig c = llama::resolve_config(config.model);
  CHECK(c.rope_scaling.rope_type == "yarn");
  CHECK(c.rope_scaling.factor == 4.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 32768);
  CHECK(c.rope_scaling.beta_fast == 16.0);
  CHECK(c.rope_scaling.beta_slow == 2.0);
  CHECK(c.rope_scaling.mscale == 1.0);
  CHECK(c.rope_scaling.mscale_all_dim == 0.5);
  CHECK_FALSE(c.rope_scaling.truncate);
  CHECK_THAT(c.describe(), Catch::Contains("qwen3 L28") && Catch::Contains("yarn x4 of 32768"));
  // (0.1 ln 4 + 1) / (0.05 ln 4 + 1)
  CHECK(llama::rope_table(c).attention_scaling ==
        Approx((0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1)).epsilon(1e-7));
  // Past max_position_embeddings up to original x factor (131072), not beyond; without yarn the
  // error names rotary scaling as the fix.
  CHECK(c.seq_len == 65536);
  const auto def = builtin_models().resolve(config.model);
  CHECK(def->with_seq_len(131072)->seq_len() == 131072);
  CHECK_THROWS_WITH(def->with_seq_len(131073),
                    Catch::Contains("exceeds max_position_embeddings=40960") &&
                        Catch::Contains("32768 x 4 = 131072"));
  CHECK_THROWS_WITH(builtin_models().parse_spec("qwen3", "qwen3-0.6b:seq_len=65536"),
                    Catch::Contains("exceeds max_position_embeddings=40960") &&
                        Catch::Contains("raise model.max_position_embeddings to at least "
                                        "65536") &&
                        Catch::Contains("rope_type yarn with factor x "
                                        "original_max_position_embeddings >= 65536"));
  const Config again = parse_config(resolved_document(config), 1, "saved.json");
  CHECK(again.model.spec() == config.model.spec());
  const llama::LlamaConfig back = llama::resolve_config(again.model);
  CHECK_FALSE(back.rope_scaling.truncate);
  CHECK(back.rope_scaling.mscale_all_dim == 0.5);
}

TEST_CASE("Llama block errors name the key", "[llama][registry]") {
  // A GPT-2 key in a Llama block, and the other way round: refused at validation.
  CHECK_THROWS_WITH(
      parse_config(config_with_model({{"type", "llama"}, {"preset", "llama-tiny"}, {"n_embd", 64}}),
                   1, "run.json"),
      Catch::Contains("model.n_embd") && Catch::Contains("not a key of model.type llama"));
  CHECK_THROWS_WITH(parse_config(config_with_model({{"preset", "gpt2-tiny"}, {"hidden_size", 64}}),
                                 1, "run.json"),
                    Catch::Contains("model.hidden_size") && Catch::Contains("gpt2"));
  CHECK_THROWS_WITH(parse_config(config_with_model({{"type", "llama"},
                                                    {"preset", "llama-tiny"},
                                                    {"rope_scaling", {{"rope_type", "dynamic"}}}}),
                                 1, "run.json"),
                    Catch::Contains("model.rope_scaling.rope_type"));
  // YaRN measures its ramp against the pretrained context: without it the run is refused.
  CHECK_THROWS_WITH(
      builtin_models().resolve(
          parse_config(
              config_with_model({{"type", "qwen3"},
                                 {"preset", "qwen3-0.6b"},
                                 {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}}}),
              1, "run.json")
              .model),
      Catch::Contains("model.rope_scaling.original_max_position_embeddings is required"));
  // Qwen2's first windowed layer on a mixture of experts (which windows every layer or none).
  CHECK_THROWS_WITH(parse_config(config_with_model({{"type", "qwen3_moe"},
                                                    {"preset", "qwen3-moe-tiny"},
                                                    {"sliding_window", 16},
                                                    {"max_window_layers", 1}}),
                                 1, "run.json"),
                    Catch::Contains("model.max_window_layers") && Catch::Contains("it is Qwen2's"));
  // Values are the entry's to judge, by key.
  ModelConfig m;
  m.type = "llama";
  m.preset = "llama-tiny";
  m.num_key_value_heads = 3;
  CHECK_THROWS_WITH(builtin_models().resolve(m), Catch::Contains("num_key_value_heads=3"));
  m.num_key_value_heads.reset();
  m.preset = "gpt2-tiny";
  CHECK_THROWS_WITH(builtin_models().resolve(m), Catch::Contains("unknown Llama-family preset"));
  m.preset = "qwen2.5-0.5b";
  CHECK_THROWS_WITH(builtin_models().resolve(m), Catch::Contains("is a qwen2 model"));
  // Mistral with a sliding window shorter than the sequence: taken (the window is in the model's
  // description); max_window_layers is Qwen2's and refused for Mistral, naming the key.
  const Config mistral = parse_config(config_with_model({{"type", "mistral"},
                                                         {"hidden_size", 64},
                                                         {"intermediate_size", 128},
                                                         {"num_hidden_layers", 2},
                                                         {"num_attention_heads", 4},
                                                         {"num_key_value_heads", 2},
                                                         {"vocab_size", 256},
                                                         {"max_position_embeddings", 256},
                                                         {"seq_len", 256},
                                                         {"sliding_window", 128}}),
                                      1, "run.json");
  CHECK_THAT(builtin_models().resolve(mistral.model)->describe(), Catch::Contains("window 128"));
  ModelConfig qwen_only = mistral.model;
  qwen_only.max_window_layers = 1;
  CHECK_THROWS_WITH(builtin_models().resolve(qwen_only), Catch::Contains("max_window_layers=1"));
  ModelConfig fits = mistral.model;
  fits.seq_len = 128;
  CHECK(builtin_models().resolve(fits)->type() == "mistral");
}

TEST_CASE("tool specs: a Llama-family preset goes to its entry", "[llama][registry]") {
  CHECK(builtin_models().parse_spec("llama-3.1-8b")->type() == "llama");
  CHECK(builtin_models().parse_spec("qwen2.5-7b")->type() == "qwen2");
  CHECK(builtin_models().parse_spec("smollm2-135m:seq_len=2048")->seq_len() == 2048);
  CHECK(builtin_models().parse_spec("gpt2-tiny")->type() == "gpt2");
  CHECK(builtin_models().parse_spec("gpt2:n_layer=2")->type() == "gpt2");  // preset gpt2, not type
  const auto custom = builtin_models().parse_spec(
      "mistral:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
      "num_key_value_heads=1,vocab_size=256,max_position_embeddings=128");
  CHECK(custom->type() == "mistral");
  CHECK(custom->seq_len() == 128);
}

TEST_CASE("Llama hooks agree with the model and with arithmetic by hand", "[llama][registry]") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("test");
  kernels::KernelContext ctx(*device, *stream);
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto def = builtin_models().parse_spec(spec);
    const std::string type = def->type();
    const llama::LlamaConfig c = llama::LlamaConfig::parse(type, spec);  // the entry's own parse
    const std::vector<ParamSpec> params = def->parameters();
    CHECK(def->num_modules() == c.num_hidden_layers + 2);
    std::int64_t total = 0;
    for (const ParamSpec& p : params) total += p.numel();
    CHECK(total == def->num_parameters());
    // Every parameter's module: the embedding is module 0 (and the head's when tied).
    CHECK(params.front().name == "model.embed_tokens.weight");
    CHECK(params.front().modules == (c.tie_word_embeddings
                                         ? std::vector<int>{0, c.num_hidden_layers + 1}
                                         : std::vector<int>{0}));
    CHECK(params.back().name == (c.tie_word_embeddings ? "model.norm.weight" : "lm_head.weight"));
    for (const ParamSpec& p : params) CHECK(p.no_weight_decay == (p.shape.size() == 1));
    std::vector<int> blocks;
    for (int m = 1; m <= c.num_hidden_layers; ++m) blocks.push_back(m);
    CHECK(def->recomputed_modules() == blocks);
    if (c.num_parameters() < 10'000'000) {  // a small one is built: its table is the same
      const auto model = def->build(ctx, ModelOptions{});
      REQUIRE(model->parameters().size() == params.size());
      for (std::size_t i = 0; i < params.size(); ++i) {
        CHECK(model->parameters()[i].name == params[i].name);
        CHECK(model->parameters()[i].shape == params[i].shape);
        CHECK(model->parameters()[i].modules == params[i].modules);
      }
    }
  }
  // Llama 3.1 8B's FLOPs per token at T = 8192, by hand: 6 x (8,030,261,248 - the untied
  // embedding 128256 x 4096 = 525,336,576) + 12 x 32 layers x 4096 x 8192.
  const auto l8b = builtin_models().parse_spec("llama-3.1-8b");
  CHECK(l8b->flops_per_token(8192) == 6.0 * (8030261248.0 - 525336576.0) + 12.0 * 32 * 4096 * 8192);
  // Tied (Llama 3.2 1B): the table is the head's matrix, counted.
  const auto l1b = builtin_models().parse_spec("llama-3.2-1b");
  CHECK(l1b->flops_per_token(1) == 6.0 * 1235814400.0 + 12.0 * 16 * 2048);
  // Checkpointing keeps one block's tensors instead of L. Llama 3.1 8B, B = 1, T = 8192, bf16:
  // ln1, res2, ln2 (4096 wide) 3 x 67,108,864; q, atty 2 x 67,108,864; k, v 2 x 16,777,216;
  // gate, up, h 3 x 234,881,024; two rstd 2 x 32,768; attention's fp32 row log-sum-exp
  // 32 x 8192 x 4 (the (B,NH,T,T) probabilities it replaced were 8.6 GB a block).
  const std::int64_t block =
      5 * 67'108'864LL + 2 * 16'777'216LL + 3 * 234'881'024LL + 2 * 32'768LL + 32LL * 8192 * 4;
  CHECK(l8b->activation_bytes(1, 8192, DType::kBFloat16, false) -
            l8b->activation_bytes(1, 8192, DType::kBFloat16, true) ==
        31 * block);
}

// Qwen2's window exports as transformers reads it: use_sliding_window only when some layer is
// windowed (from max_window_layers on), and the exported config.json reads back to the same
// window and first layer (a Qwen2Config with the window on and max_window_layers at or past the
// last layer has no windowed layer: exported as off).
TEST_CASE("a Qwen2 sliding window exports to config.json and reads back", "[llama][registry]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "zrt_qwen2_window_export_test";
  for (const int first : {1, 2}) {
    INFO("max_window_layers " << first << " of 2");
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string keys =
        "hidden_size=32,intermediate_size=64,num_hidden_layers=2,num_attention_heads=4,"
        "num_key_value_heads=2,vocab_size=16,max_position_embeddings=64,seq_len=64,"
        "attention_bias=true,sliding_window=16,max_window_layers=" +
        std::to_string(first);
    const auto def = builtin_models().parse_spec("qwen2", keys);
    ExportInput input;
    input.checkpoint = "ckpt";
    input.config_json = nlohmann::json{{"model",
                                        {{"type", "qwen2"},
                                         {"hidden_size", 32},
                                         {"intermediate_size", 64},
                                         {"num_hidden_layers", 2},
                                         {"num_attention_heads", 4},
                                         {"num_key_value_heads", 2},
                                         {"vocab_size", 16},
                                         {"max_position_embeddings", 64},
                                         {"seq_len", 64},
                                         {"sliding_window", 16},
                                         {"max_window_layers", first}}}}
                            .dump();
    for (const ParamSpec& p : def->parameters()) {
      ExportTensor t;
      t.name = p.name;
      t.shape = p.shape;
      t.values.assign(static_cast<std::size_t>(p.numel()), 0.5f);
      input.tensors.push_back(std::move(t));
    }
    builtin_models().export_safetensors(input, (dir / "model.safetensors").string());
    std::ifstream in(dir / "config.json");
    const auto hf = nlohmann::json::parse(in);
    CHECK(hf["use_sliding_window"] == (first < 2));
    CHECK(hf["sliding_window"] == 16);
    CHECK(hf["max_window_layers"] == (first < 2 ? first : 2));
    ModelConfig back;
    back.type = "qwen2";
    back.init_from = dir.string();
    const auto read = builtin_models().resolve(back);
    if (first < 2) {
      CHECK_THAT(read->describe(), Catch::Contains("window 16 from layer 1"));
    } else {
      CHECK_THAT(read->describe(), !Catch::Contains("window"));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a Llama checkpoint exports under transformers' names with its config.json",
          "[llama][registry]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "zrt_llama_export_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string spec = "llama-tiny:tie_word_embeddings=true";
  const auto def = builtin_models().parse_spec(spec);
  ExportInput input;
  input.checkpoint = "ckpt";
  input.config_json =
      R"({"model": {"type": "llama", "preset": "llama-tiny", "tie_word_embeddings": true}})";
  float fill = 0.0f;
  for (const ParamSpec& p : def->parameters()) {
    ExportTensor t;
    t.name = p.name;
    t.shape = p.shape;
    t.values.assign(static_cast<std::size_t>(p.numel()), fill += 1.0f);
    input.tensors.push_back(std::move(t));
  }
  const std::string out = (dir / "model.safetensors").string();
  builtin_models().export_safetensors(input, out);
  const SafetensorsFile file(out);
  CHECK(file.tensors().size() == def->parameters().size());
  CHECK(file.tensors().count("lm_head.weight") == 0);  // tied
  CHECK(file.read_f32("model.norm.weight").front() == fill);
  std::ifstream in(dir / "config.json");
  const auto hf = nlohmann::json::parse(in);
  CHECK(hf["architectures"][0] == "LlamaForCausalLM");
  CHECK(hf["num_key_value_heads"] == 2);
  CHECK(hf["head_dim"] == 16);
  CHECK(hf["tie_word_embeddings"] == true);
  // A tensor list that is not this model's is refused by name.
  input.tensors.pop_back();
  CHECK_THROWS_WITH(builtin_models().export_safetensors(input, out), Catch::Contains("tensors"));
  fs::remove_all(dir);
}
