// Hugging Face I/O (models/hf): config.json of the published models (tests/models/hf_configs),
// both rotary forms, every refusal; safetensors in bf16/fp16/fp32 and sharded with an index,
// written and read back, with damaged and foreign indexes and shards refused by name; the
// generic parameter matching (a GPT-2 model directory through the registry, contradicting keys,
// an untied head, a foreign tensor); and the export of a Hugging Face directory.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_safetensors.h"
#include "models/hf/hf_config.h"
#include "models/hf/hf_export.h"
#include "models/hf/hf_import.h"
#include "models/hf/hf_weights.h"
#include "models/model_registry.h"
#include "models/safetensors.h"
#include "runtime/common/error.h"

using namespace zrt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string& name) {
  return std::string(ZRT_SOURCE_DIR) + "/tests/models/hf_configs/" + name;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_hf" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// Values exact in bf16 and fp16 (small integers over 8).
std::vector<float> exact_values(std::int64_t n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = ((i * 7 + salt) % 61 - 30) / 8.f;
  return v;
}

}  // namespace

TEST_CASE("config.json of published models", "[hf][config]") {
  using hf::HfConfig;
  const HfConfig l1 = HfConfig::read(fixture("llama-3.2-1b.json"));
  CHECK(l1.model_type == "llama");
  CHECK(l1.architectures == std::vector<std::string>{"LlamaForCausalLM"});
  CHECK(l1.hidden_size == 2048);
  CHECK(l1.intermediate_size == 8192);
  CHECK(l1.num_hidden_layers == 16);
  CHECK(l1.num_attention_heads == 32);
  CHECK(l1.num_key_value_heads == 8);
  CHECK(l1.head_dim == 64);
  CHECK(l1.vocab_size == 128256);
  CHECK(l1.max_position_embeddings == 131072);
  CHECK(l1.rms_norm_eps == 1e-5);
  CHECK(l1.rope_theta == 500000.0);
  CHECK(l1.rope_scaling.rope_type == "llama3");
  CHECK(l1.rope_scaling.factor == 32.0);
  CHECK(l1.rope_scaling.low_freq_factor == 1.0);
  CHECK(l1.rope_scaling.high_freq_factor == 4.0);
  CHECK(l1.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(l1.tie_word_embeddings);
  CHECK_FALSE(l1.attention_bias);
  CHECK(l1.sliding_window == 0);
  CHECK(l1.torch_dtype == "bfloat16");
  CHECK(*l1.bos_token_id == 128000);
  CHECK(*l1.eos_token_id == 128001);

  // transformers v5: rope_parameters (theta inside) and "dtype" read the same.
  const HfConfig v5 = HfConfig::read(fixture("llama-3.2-1b-v5.json"));
  CHECK(v5.rope_theta == l1.rope_theta);
  CHECK(v5.rope_scaling.rope_type == "llama3");
  CHECK(v5.rope_scaling.factor == 32.0);
  CHECK(v5.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(v5.torch_dtype == "bfloat16");

  const HfConfig l8 = HfConfig::read(fixture("llama-3.1-8b.json"));
  CHECK(l8.hidden_size == 4096);
  CHECK(l8.intermediate_size == 14336);
  CHECK(l8.num_hidden_layers == 32);
  CHECK(l8.num_key_value_heads == 8);
  CHECK(l8.head_dim == 128);  // absent: hidden_size / num_attention_heads
  CHECK(l8.rope_scaling.factor == 8.0);
  CHECK_FALSE(l8.tie_word_embeddings);

  const HfConfig q = HfConfig::read(fixture("qwen2.5-0.5b.json"));
  CHECK(q.model_type == "qwen2");
  CHECK(q.hidden_size == 896);
  CHECK(q.num_attention_heads == 14);
  CHECK(q.num_key_value_heads == 2);
  CHECK(q.head_dim == 64);
  CHECK(q.vocab_size == 151936);
  CHECK(q.rope_theta == 1e6);
  CHECK(q.rms_norm_eps == 1e-6);
  CHECK(q.attention_bias);       // qwen2 implies q/k/v biases
  CHECK(q.sliding_window == 0);  // use_sliding_window false
  CHECK(q.tie_word_embeddings);
  CHECK(q.rope_scaling.rope_type == "default");

  // Qwen3-8B: head_dim given, q_norm / k_norm implied by the type, no biases, no window.
  const HfConfig q3 = HfConfig::read(fixture("qwen3-8b.json"));
  CHECK(q3.model_type == "qwen3");
  CHECK(q3.hidden_size == 4096);
  CHECK(q3.intermediate_size == 12288);
  CHECK(q3.num_hidden_layers == 36);
  CHECK(q3.num_key_value_heads == 8);
  CHECK(q3.head_dim == 128);
  CHECK(q3.max_position_embeddings == 40960);
  CHECK(q3.rope_theta == 1e6);
  CHECK(q3.rms_norm_eps == 1e-6);
  CHECK_FALSE(q3.attention_bias);
  CHECK(q3.sliding_window == 0);
  CHECK_FALSE(q3.tie_word_embeddings);
  CHECK(*q3.eos_token_id == 151645);

  const HfConfig m = HfConfig::read(fixture("mistral-7b.json"));
  CHECK(m.model_type == "mistral");
  CHECK(m.sliding_window == 4096);
  CHECK(m.vocab_size == 32000);
  CHECK(m.num_key_value_heads == 8);
  CHECK_FALSE(m.attention_bias);

  const HfConfig s = HfConfig::read(fixture("smollm2-135m.json"));
  CHECK(s.hidden_size == 576);
  CHECK(s.num_attention_heads == 9);
  CHECK(s.num_key_value_heads == 3);
  CHECK(s.head_dim == 64);
  CHECK(s.num_hidden_layers == 30);
  CHECK(s.rope_theta == 100000.0);               // an integer in the file
  CHECK(s.rope_scaling.rope_type == "default");  // rope_scaling: null

  const HfConfig g = HfConfig::read(fixture("gpt2.json"));
  CHECK(g.model_type == "gpt2");
  CHECK(g.n_layer == 12);
  CHECK(g.n_head == 12);
  CHECK(g.n_embd == 768);
  CHECK(g.vocab_size == 50257);
  CHECK(g.n_positions == 1024);
  CHECK(g.tie_word_embeddings);
  CHECK(g.activation_function == "gelu_new");
}

TEST_CASE("config.json problems are named", "[hf][config]") {
  using hf::HfConfig;
  json base = json::parse(text_of(fixture("llama-3.2-1b.json")));
  auto fails = [](const json& doc, const std::string& message) {
    INFO(doc.dump());
    CHECK_THROWS_WITH(HfConfig::parse(doc.dump(), "x/config.json"),
                      Catch::Contains("x/config.json") && Catch::Contains(message));
  };
  CHECK_THROWS_WITH(HfConfig::parse("{oops", "x/config.json"), Catch::Contains("not valid JSON"));
  json d = base;
  d.erase("model_type");
  fails(d, "model_type is missing");
  d = base;
  d["model_type"] = "falcon";
  fails(d, "model_type 'falcon' is not supported");
  d = base;
  d.erase("hidden_size");
  fails(d, "hidden_size is missing");
  d = base;
  d["num_hidden_layers"] = "16";
  fails(d, "num_hidden_layers is \"16\", not a non-negative integer");
  d = base;
  d["rope_scaling"]["rope_type"] = "longrope";
  fails(d, "rope_scaling.rope_type 'longrope' is not supported");
  d = base;
  d["rope_scaling"].erase("low_freq_factor");
  fails(d, "rope_scaling.low_freq_factor is missing (rope_type llama3 needs it)");
  d = base;
  d["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  d["rope_scaling"] = nullptr;
  fails(d, "rope_theta 500000 and rope_parameters.rope_theta 10000 disagree");
  d = base;
  d["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // v4's older key
  fails(d, "rope_scaling.rope_type 'dynamic' is not supported");
  // Linear interpolation and YaRN: read with transformers' defaults (YaRN's original context is
  // max_position_embeddings, its factor max_position_embeddings over that), bad values refused.
  d = base;
  d["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  CHECK(HfConfig::parse(d.dump(), "x").rope_scaling.rope_type == "linear");
  CHECK(HfConfig::parse(d.dump(), "x").rope_scaling.factor == 2.0);
  d["rope_scaling"].erase("factor");
  fails(d, "rope_scaling.factor is missing (rope_type linear needs it)");
  d = base;
  d["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  {
    const HfConfig y = HfConfig::parse(d.dump(), "x");
    CHECK(y.rope_scaling.original_max_position_embeddings == 131072);  // max_position_embeddings
    CHECK(y.rope_scaling.truncate);
    CHECK(y.rope_scaling.beta_fast == 0);  // absent: the kernels' default, 32
  }
  d["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 32768},
                       {"beta_fast", 16},     {"beta_slow", 2},
                       {"mscale", 1.0},       {"mscale_all_dim", 0.5},
                       {"truncate", false}};
  {
    const HfConfig y = HfConfig::parse(d.dump(), "x");
    CHECK(y.rope_scaling.factor == 4.0);  // 131072 / 32768
    CHECK(y.rope_scaling.beta_fast == 16);
    CHECK(y.rope_scaling.beta_slow == 2);
    CHECK(y.rope_scaling.mscale == 1.0);
    CHECK(y.rope_scaling.mscale_all_dim == 0.5);
    CHECK_FALSE(y.rope_scaling.truncate);
  }
  d["rope_scaling"]["beta_fast"] = 1;
  fails(d, "yarn scaling needs factor >= 1, beta_fast >= beta_slow");
  d = base;
  d["tie_word_embeddings"] = 1;
  fails(d, "tie_word_embeddings is 1, not true or false");
  // Llama 3.1's list of eos ids: the first is taken.
  d = base;
  d["eos_token_id"] = {128001, 128008, 128009};
  CHECK(*HfConfig::parse(d.dump(), "x").eos_token_id == 128001);
  // Mistral v0.3 style: no window.
  json mistral = json::parse(text_of(fixture("mistral-7b.json")));
  mistral["sliding_window"] = nullptr;
  CHECK(HfConfig::parse(mistral.dump(), "x").sliding_window == 0);
  // Qwen2 with its window switched on: transformers applies it to the layers from
  // max_window_layers on (layer_types), so with max_window_layers 24 of 24 layers to none, with
  // 21 to the last three.
  json qwen = json::parse(text_of(fixture("qwen2.5-0.5b.json")));
  qwen["use_sliding_window"] = true;
  CHECK(HfConfig::parse(qwen.dump(), "x").sliding_window == 0);
  qwen["max_window_layers"] = 21;
  CHECK(HfConfig::parse(qwen.dump(), "x").sliding_window == 32768);
  CHECK(HfConfig::parse(qwen.dump(), "x").max_window_layers == 21);
  // config.json's own layer_types (transformers 5 writes it): the sliding layers must be a suffix,
  // which sets the first one; anything else is refused, naming the layer.
  {
    json typed = qwen;
    typed["layer_types"] = json::array();
    for (int i = 0; i < 24; ++i)
      typed["layer_types"].push_back(i < 20 ? "full_attention" : "sliding_attention");
    CHECK(HfConfig::parse(typed.dump(), "x").max_window_layers == 20);
    typed["layer_types"][22] = "full_attention";
    fails(typed, "full_attention at layer 22 after sliding_attention at layer 20");
    typed["layer_types"][22] = "chunked_attention";
    fails(typed, "layer_types[22] is \"chunked_attention\"");
    typed["layer_types"] = {"full_attention"};
    fails(typed, "layer_types must list the 24 layers");
  }
  // A window switched on with no size: none (Qwen2Config's sliding_window null); with no key at
  // all, the class's default 4096.
  qwen["sliding_window"] = nullptr;
  CHECK(HfConfig::parse(qwen.dump(), "x").sliding_window == 0);
  qwen.erase("sliding_window");
  CHECK(HfConfig::parse(qwen.dump(), "x").sliding_window == 4096);
  // Qwen3 windows as Qwen2 does; its attention_bias would put a bias on o_proj too: refused.
  {
    json qwen3 = json::parse(text_of(fixture("qwen3-8b.json")));
    json no_head_dim = qwen3;  // Qwen3Config's default, not hidden_size / heads
    no_head_dim["hidden_size"] = 1024;
    no_head_dim["num_attention_heads"] = 16;
    no_head_dim.erase("head_dim");
    CHECK(HfConfig::parse(no_head_dim.dump(), "x").head_dim == 128);
    qwen3["use_sliding_window"] = true;
    qwen3["sliding_window"] = 4096;
    CHECK(HfConfig::parse(qwen3.dump(), "x").sliding_window == 0);  // max_window_layers 36 of 36
    qwen3["max_window_layers"] = 30;
    CHECK(HfConfig::parse(qwen3.dump(), "x").sliding_window == 4096);
    CHECK(HfConfig::parse(qwen3.dump(), "x").max_window_layers == 30);
    qwen3["attention_bias"] = true;
    fails(qwen3, "attention_bias true is not supported for qwen3");
  }
  // Qwen2-MoE windows every other layer below max_window_layers: refused, not trained wrongly.
  {
    json moe = json::parse(text_of(fixture("qwen2.5-0.5b.json")));
    moe["model_type"] = "qwen2_moe";
    moe["num_experts"] = 4;
    moe["num_experts_per_tok"] = 2;
    moe["moe_intermediate_size"] = 64;
    moe["shared_expert_intermediate_size"] = 128;
    moe["use_sliding_window"] = true;
    moe["max_window_layers"] = 4;
    fails(moe, "every other layer");
    moe["max_window_layers"] = 0;
    CHECK(HfConfig::parse(moe.dump(), "x").sliding_window == 0);
    moe["layer_types"] = {"sliding_attention", "full_attention"};
    fails(moe, "layer_types has sliding_attention");
  }
  // Mistral without the key: MistralConfig's default window, 4096; Mixtral's defaults (eps
  // 1e-5, theta 1e6) where its keys are absent.
  mistral.erase("sliding_window");
  CHECK(HfConfig::parse(mistral.dump(), "x").sliding_window == 4096);
  json mixtral = json::parse(text_of(fixture("mistral-7b.json")));
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 8;
  mixtral["num_experts_per_tok"] = 2;
  mixtral.erase("rms_norm_eps");
  mixtral.erase("rope_theta");
  CHECK(HfConfig::parse(mixtral.dump(), "x").rms_norm_eps == 1e-5);
  CHECK(HfConfig::parse(mixtral.dump(), "x").rope_theta == 1e6);
  // Mixtral's window has no default (MixtralConfig's None); Qwen3-MoE's is 4096 once switched on.
  mixtral.erase("sliding_window");
  CHECK(HfConfig::parse(mixtral.dump(), "x").sliding_window == 0);
  {
    json qwen3 = mixtral;
    qwen3.erase("num_local_experts");
    qwen3["model_type"] = "qwen3_moe";
    qwen3["num_experts"] = 8;
    qwen3["moe_intermediate_size"] = 64;
    CHECK(HfConfig::parse(qwen3.dump(), "x").sliding_window == 0);
    qwen3["use_sliding_window"] = true;
    CHECK(HfConfig::parse(qwen3.dump(), "x").sliding_window == 4096);
    qwen3["sliding_window"] = 512;
    CHECK(HfConfig::parse(qwen3.dump(), "x").sliding_window == 512);
  }
  // Qwen2 layers marked sliding with no window switched on: refused (transformers fails too).
  {
    json typed = json::parse(text_of(fixture("qwen2.5-0.5b.json")));
    typed["layer_types"] = json::array();
    for (int i = 0; i < 24; ++i) typed["layer_types"].push_back("sliding_attention");
    fails(typed, "layer_types marks sliding_attention layers, but use_sliding_window is false");
  }
  // A different model than the family's, refused rather than trained as another: a non-SiLU
  // MLP, MLP biases, Llama's attention_bias (q, k, v and o_proj in transformers).
  json llama = base;
  llama["hidden_act"] = "gelu_pytorch_tanh";
  fails(llama, "hidden_act 'gelu_pytorch_tanh' is not supported: zrt's llama MLP is SwiGLU");
  llama = base;
  llama["hidden_act"] = "swish";
  CHECK(HfConfig::parse(llama.dump(), "x").hidden_act == "swish");
  llama["mlp_bias"] = true;
  fails(llama, "mlp_bias true is not supported");
  llama = base;
  llama["attention_bias"] = true;
  fails(llama,
        "attention_bias true is not supported for llama: transformers then puts biases on "
        "q, k, v and o_proj");
  // Mistral's projections never take biases; the key is ignored, as transformers does.
  mistral["attention_bias"] = true;
  CHECK_FALSE(HfConfig::parse(mistral.dump(), "x").attention_bias);
}

TEST_CASE("safetensors in bf16, fp16 and fp32: written, read whole and in slices", "[hf][st]") {
  const fs::path dir = fresh_dir("dtypes");
  const std::vector<float> v = exact_values(1000, 3);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::string path = (dir / (std::string(dtype_name(dtype)) + ".safetensors")).string();
    write_safetensors(path, {{"w", {{10, 100}, v}}, {"b", {{3}, {1.5f, -2.f, 0.25f}}}}, {}, dtype);
    const SafetensorsFile f(path);
    CHECK(f.tensors().at("w").dtype == (dtype == DType::kFloat32    ? "F32"
                                        : dtype == DType::kBFloat16 ? "BF16"
                                                                    : "F16"));
    CHECK(fs::file_size(path) % 2 == 0);
    CHECK(f.read_f32("w") == v);  // exactly representable in all three
    std::vector<float> part(7);
    f.read_f32("w", 993, 7, part.data());
    CHECK(part == std::vector<float>(v.end() - 7, v.end()));
    CHECK_THROWS_WITH(f.read_f32("w", 995, 7, part.data()),
                      Catch::Contains("elements [995, 1002) are outside its 1000"));
  }
  // Rounding to nearest even, as the engine's own conversion does.
  const std::string path = (dir / "round.safetensors").string();
  write_safetensors(path, {{"x", {{1}, {1.0f + 1.0f / 256}}}}, {}, DType::kBFloat16);
  CHECK(SafetensorsFile(path).read_f32("x")[0] == to_float(to_bf16(1.0f + 1.0f / 256)));
}

TEST_CASE("sharded weights: index written as transformers does, read back", "[hf][st]") {
  const fs::path dir = fresh_dir("sharded");
  SafetensorsTensors tensors;
  for (int i = 0; i < 5; ++i) {
    tensors.push_back({"t" + std::to_string(i), {{10, 10}, exact_values(100, i)}});
  }
  // 100 elements x 2 bytes = 200 bytes each: a 450-byte limit holds two per shard.
  const auto files = hf::write_hf_weights(dir.string(), tensors, DType::kBFloat16, 450);
  CHECK(files == std::vector<std::string>{
                     "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  const json index = json::parse(text_of((dir / "model.safetensors.index.json").string()));
  CHECK(index["metadata"]["total_size"] == 1000);
  CHECK(index["weight_map"]["t0"] == "model-00001-of-00003.safetensors");
  CHECK(index["weight_map"]["t2"] == "model-00002-of-00003.safetensors");
  CHECK(index["weight_map"]["t4"] == "model-00003-of-00003.safetensors");
  const hf::HfWeights w(dir.string());
  CHECK(w.names().size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(w.read_f32("t" + std::to_string(i)) == exact_values(100, i));
  CHECK(w.file_of("t3") == (dir / "model-00002-of-00003.safetensors").string());

  // A tensor above the limit gets a shard to itself; under the limit, one file, and the old
  // shards and index are gone.
  CHECK(hf::write_hf_weights(dir.string(), tensors, DType::kFloat32, 100).size() == 6);
  CHECK(hf::write_hf_weights(dir.string(), tensors, DType::kFloat32, 1u << 20) ==
        std::vector<std::string>{"model.safetensors"});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"model.safetensors"});
  CHECK(hf::HfWeights(dir.string()).read_f32("t1") == exact_values(100, 1));
  // Over it again, sharded: a staging folder an interrupted export left is cleared first, the
  // single file goes, a file that is no weight stays, and the same-named shards are replaced.
  fs::create_directories(dir / ".zrt-export.tmp");
  std::ofstream(dir / ".zrt-export.tmp" / "model-00001-of-00009.safetensors") << "partial";
  std::ofstream(dir / "README.md") << "a model card";
  for (int pass = 0; pass < 2; ++pass) {
    CHECK(hf::write_hf_weights(dir.string(), tensors, DType::kBFloat16, 450).size() == 4);
  }
  left.clear();
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"README.md", "model-00001-of-00003.safetensors",
                                         "model-00002-of-00003.safetensors",
                                         "model-00003-of-00003.safetensors",
                                         "model.safetensors.index.json"});
  CHECK(hf::HfWeights(dir.string()).names().size() == 5);

  CHECK(hf::parse_byte_size("5GB", "s") == 5000000000ull);
  CHECK(hf::parse_byte_size("500MB", "s") == 500000000ull);
  CHECK(hf::parse_byte_size("1.5GB", "s") == 1500000000ull);
  CHECK(hf::parse_byte_size("2GiB", "s") == 2147483648ull);
  CHECK(hf::parse_byte_size("100kb", "s") == 100000ull);
  CHECK(hf::parse_byte_size("4096", "s") == 4096ull);
  CHECK_THROWS_WITH(hf::parse_byte_size("5 parsecs", "--max-shard-size"),
                    Catch::Contains("--max-shard-size '5 parsecs': expected a size"));
  CHECK_THROWS_WITH(hf::parse_byte_size("0", "s"), Catch::Contains("above 0"));
}

TEST_CASE("damaged or foreign sharded checkpoints are refused by name", "[hf][st]") {
  SafetensorsTensors tensors;
  for (int i = 0; i < 4; ++i)
    tensors.push_back({"t" + std::to_string(i), {{4}, exact_values(4, i)}});
  auto make = [&](const std::string& name) {
    const fs::path dir = fresh_dir(name);
    hf::write_hf_weights(dir.string(), tensors, DType::kFloat32, 40);  // two per shard
    return dir;
  };
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  auto edit_index = [](const fs::path& dir, const std::function<void(json&)>& edit) {
    const fs::path p = dir / "model.safetensors.index.json";
    json doc = json::parse(text_of(p.string()));
    edit(doc);
    write_text(p, doc.dump());
  };
  {
    const fs::path dir = make("wrong_shard");
    edit_index(dir, [&](json& d) { d["weight_map"]["t0"] = s2; });
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()), Catch::Contains("maps tensor 't0' to") &&
                                                       Catch::Contains(s2) &&
                                                       Catch::Contains("which does not hold it"));
  }
  {
    const fs::path dir = make("unlisted");
    edit_index(dir, [&](json& d) { d["weight_map"].erase("t3"); });
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()),
                      Catch::Contains(s2) && Catch::Contains("holds tensor 't3', which the index"));
  }
  {
    // metadata.total_size is advisory (transformers ignores it; mlx-lm counts whole files, and
    // some writers store a float): another value loads, noted in the log.
    const fs::path dir = make("total");
    edit_index(dir, [&](json& d) { d["metadata"]["total_size"] = 12345; });
    CHECK_NOTHROW(hf::HfWeights(dir.string()));
    edit_index(dir, [&](json& d) { d["metadata"]["total_size"] = 64.0; });
    CHECK_NOTHROW(hf::HfWeights(dir.string()));
  }
  {
    const fs::path dir = make("escape");
    edit_index(dir, [&](json& d) { d["weight_map"]["t0"] = "../elsewhere.safetensors"; });
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()),
                      Catch::Contains("it must name a file in the index's directory"));
  }
  {
    const fs::path dir = make("missing");
    fs::remove(dir / s2);
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()),
                      Catch::Contains(s2) && Catch::Contains("cannot open"));
  }
  {
    const fs::path dir = make("truncated");
    fs::resize_file(dir / s2, fs::file_size(dir / s2) - 5);
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()), Catch::Contains(s2) &&
                                                       Catch::Contains("run past the") &&
                                                       Catch::Contains("truncated"));
  }
  {
    const fs::path dir = make("foreign");
    write_text(dir / "model.safetensors.index.json", "{\"hello\": 1}");
    CHECK_THROWS_WITH(hf::HfWeights(dir.string()),
                      Catch::Contains("needs a \"weight_map\" object"));
  }
  CHECK_THROWS_WITH(hf::HfWeights(fresh_dir("empty").string()),
                    Catch::Contains("holds neither model.safetensors nor"));
}

namespace {

// A tiny GPT-2's parameters and values, and a Hugging Face directory holding them.
struct TinyGpt {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("s");
  kernels::KernelContext ctx{*device, *stream};
  gpt::Gpt model{gpt::GptConfig::parse("n_layer=2,n_head=4,n_embd=32,vocab_size=64,seq_len=16"),
                 ctx};
  std::vector<std::vector<float>> values;

  TinyGpt() {
    const auto& params = model.parameters();
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      values.push_back(exact_values(params[static_cast<std::size_t>(i)].numel(), i));
    }
  }
  json config() const {
    return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
            {"n_layer", 2},         {"n_head", 4},
            {"n_embd", 32},         {"vocab_size", 64},
            {"n_positions", 16},    {"bos_token_id", 63},
            {"eos_token_id", 63}};
  }
  // What zrt-ckpt hands the exporter for a checkpoint of this model trained from `init_from`.
  ExportInput export_input(const fs::path& init_from) const {
    ExportInput input;
    input.checkpoint = "ckpt";
    input.config_json =
        json{{"model", {{"type", "gpt2"}, {"init_from", init_from.string()}}}}.dump();
    const auto& params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      input.tensors.push_back({params[i].name, params[i].shape, values[i]});
    }
    return input;
  }
  // Hub-style names (no "transformer." prefix), bf16, a mask buffer and a tied head.
  fs::path write_dir(const std::string& name, const json& cfg, bool untied_head = false,
                     std::uint64_t max_shard = 1u << 30) const {
    const fs::path dir = fresh_dir(name);
    SafetensorsTensors t;
    const auto& params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      t.push_back({params[i].name.substr(12), {params[i].shape, values[i]}});
    }
    t.push_back({"h.0.attn.bias", {{1, 1, 16, 16}, std::vector<float>(256, 1.f)}});
    std::vector<float> head = values[0];
    if (untied_head) head[5] += 1.f;
    t.push_back({"lm_head.weight", {params[0].shape, head}});
    hf::write_hf_weights(dir.string(), t, DType::kBFloat16, max_shard);
    write_text(dir / "config.json", cfg.dump());
    return dir;
  }
};

ModelConfig run_model(const std::string& init_from) {
  ModelConfig m;
  m.init_from = init_from;
  return m;
}

}  // namespace

TEST_CASE("a GPT-2 model directory: architecture from config.json, every tensor used",
          "[hf][import]") {
  TinyGpt t;
  for (const std::uint64_t shard : {std::uint64_t{1} << 30, std::uint64_t{3000}}) {
    const fs::path dir =
        t.write_dir(shard > 4000 ? "gpt_dir" : "gpt_dir_sharded", t.config(), false, shard);
    CHECK(fs::exists(dir / (shard > 4000 ? "model.safetensors" : "model.safetensors.index.json")));
    const auto def = builtin_models().resolve(run_model(dir.string()));
    CHECK(def->dimensions() ==
          std::vector<std::pair<std::string, std::int64_t>>{
              {"n_layer", 2}, {"n_head", 4}, {"n_embd", 32}, {"vocab_size", 64}, {"seq_len", 16}});
    const ParamInitializer init = def->initializer(t.model, 1, dir.string());
    const auto& params = t.model.parameters();
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      std::vector<float> got(static_cast<std::size_t>(params[static_cast<std::size_t>(i)].numel()));
      init(i, 0, static_cast<std::int64_t>(got.size()), got.data());
      REQUIRE(got == t.values[static_cast<std::size_t>(i)]);
    }
    std::vector<float> part(3);
    init(2, 5, 3, part.data());
    CHECK(part == std::vector<float>(t.values[2].begin() + 5, t.values[2].begin() + 8));
  }
}

TEST_CASE("a GPT-2 directory that contradicts the run, or holds more, is refused", "[hf][import]") {
  TinyGpt t;
  const fs::path dir = t.write_dir("gpt_contra", t.config());
  const std::string cfg = (dir / "config.json").string();
  ModelConfig m = run_model(dir.string());
  m.n_head = 8;
  CHECK_THROWS_WITH(builtin_models().resolve(m),
                    Catch::Contains("model.n_head 8 contradicts " + cfg + " n_head 4"));
  m = run_model(dir.string());
  m.seq_len = 32;
  CHECK_THROWS_WITH(builtin_models().resolve(m),
                    Catch::Contains("model.seq_len 32 contradicts " + cfg + " n_positions 16"));
  m = run_model(dir.string());
  m.preset = "gpt2-tiny";
  CHECK_THROWS_WITH(
      builtin_models().resolve(m),
      Catch::Contains("model.preset 'gpt2-tiny' (n_embd 64) contradicts " + cfg + " n_embd 32"));
  // A preset with an override agrees with a file that has the overridden value.
  {
    const fs::path tiny = fresh_dir("gpt_tiny_16");
    write_text(tiny / "config.json", json{{"model_type", "gpt2"},
                                          {"n_layer", 2},
                                          {"n_head", 4},
                                          {"n_embd", 64},
                                          {"vocab_size", 256},
                                          {"n_positions", 16}}
                                         .dump());
    ModelConfig p = run_model(tiny.string());
    p.preset = "gpt2-tiny";
    p.seq_len = 16;
    CHECK(builtin_models().resolve(p)->seq_len() == 16);
    p.seq_len.reset();  // the preset's own 256 then contradicts
    CHECK_THROWS_WITH(builtin_models().resolve(p),
                      Catch::Contains("model.preset 'gpt2-tiny' (seq_len 256) contradicts") &&
                          Catch::Contains("n_positions 16"));
  }
  // Agreeing keys are fine.
  m = run_model(dir.string());
  m.n_head = 4;
  m.vocab_size = 64;
  CHECK_NOTHROW(builtin_models().resolve(m));

  json llama = t.config();
  llama["model_type"] = "llama";
  const fs::path other = t.write_dir("gpt_llama_type", t.config());
  write_text(other / "config.json", text_of(fixture("smollm2-135m.json")));
  CHECK_THROWS_WITH(
      builtin_models().resolve(run_model(other.string())),
      Catch::Contains("model.type 'gpt2' contradicts") && Catch::Contains("model_type 'llama'"));

  json untied = t.config();
  untied["tie_word_embeddings"] = false;
  const fs::path u = t.write_dir("gpt_untied_cfg", untied);
  CHECK_THROWS_WITH(builtin_models().resolve(run_model(u.string())),
                    Catch::Contains("tie_word_embeddings is false"));

  // An lm_head that differs from wte: an untied head, never dropped.
  const fs::path head = t.write_dir("gpt_untied_head", t.config(), true);
  const auto def = builtin_models().resolve(run_model(head.string()));
  CHECK_THROWS_WITH(def->initializer(t.model, 1, head.string()),
                    Catch::Contains("tensor 'lm_head.weight' differs from 'wte.weight': an "
                                    "untied output head"));

  // A tensor no parameter takes.
  const fs::path extra = fresh_dir("gpt_extra");
  {
    SafetensorsTensors ts;
    const auto& params = t.model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      ts.push_back({params[i].name, {params[i].shape, t.values[i]}});
    ts.push_back({"transformer.h.2.ln_1.weight", {{32}, std::vector<float>(32)}});
    hf::write_hf_weights(extra.string(), ts, DType::kFloat32, 1u << 30);
    write_text(extra / "config.json", t.config().dump());
  }
  CHECK_THROWS_WITH(def->initializer(t.model, 1, extra.string()),
                    Catch::Contains("tensor 'transformer.h.2.ln_1.weight' matches no parameter"));

  // A plain .safetensors file with a config.json beside it whose head count differs from the
  // run's: refused (the shapes alone cannot show it).
  ModelConfig file_run = run_model((dir / "model.safetensors").string());
  file_run.n_layer = 2;
  file_run.n_head = 8;
  file_run.n_embd = 32;
  file_run.vocab_size = 64;
  file_run.seq_len = 16;
  CHECK_THROWS_WITH(builtin_models().resolve(file_run),
                    Catch::Contains("model.n_head 8 contradicts " + cfg + " n_head 4"));
}

TEST_CASE("the run config takes the architecture from an init_from directory", "[hf][config]") {
  TinyGpt t;
  const fs::path dir = t.write_dir("gpt_run_config", t.config());
  const fs::path cfg = fresh_dir("run_config") / "run.json";
  write_text(cfg, json{{"train_batch_size", 2},
                       {"train_micro_batch_size_per_gpu", 2},
                       {"model", {{"init_from", dir.string()}}},
                       {"data", {{"train", "x_*.bin"}}},
                       {"train", {{"steps", 1}}}}
                      .dump());
  const Config c = load_config(cfg.string(), 1);
  CHECK(c.model.type == "gpt2");
  CHECK(builtin_models().resolve(c.model)->seq_len() == 16);
}

TEST_CASE("export of a Hugging Face directory", "[hf][export]") {
  TinyGpt t;
  const fs::path src = t.write_dir("export_src", t.config());
  write_text(src / "tokenizer.json", "{\"tok\": 1}");
  write_text(src / "tokenizer_config.json", "{}");
  fs::create_directories(src / "chat_templates");  // transformers v5's named templates
  write_text(src / "chat_templates" / "tool_use.jinja", "{{ messages }}");
  const ExportInput input = t.export_input(src);
  const auto& params = t.model.parameters();
  const fs::path out = fresh_dir("export_out");
  HfExportOptions options;
  options.dtype = DType::kBFloat16;
  options.max_shard_bytes = 4000;
  const auto files = builtin_models().export_hf(input, out.string(), options);
  CHECK(std::count(files.begin(), files.end(), "tokenizer.json") == 1);
  CHECK(std::count(files.begin(), files.end(), "model.safetensors.index.json") == 1);
  CHECK(text_of((out / "tokenizer.json").string()) == "{\"tok\": 1}");
  CHECK(std::count(files.begin(), files.end(), "chat_templates/tool_use.jinja") == 1);
  CHECK(text_of((out / "chat_templates" / "tool_use.jinja").string()) == "{{ messages }}");
  const json config = json::parse(text_of((out / "config.json").string()));
  CHECK(config["n_head"] == 4);
  CHECK(config["n_positions"] == 16);
  CHECK(config["torch_dtype"] == "bfloat16");
  CHECK(config["bos_token_id"] == 63);  // kept from the source's config.json
  CHECK(config["architectures"] == json{"GPT2LMHeadModel"});
  const json generation = json::parse(text_of((out / "generation_config.json").string()));
  CHECK(generation["eos_token_id"] == 63);
  // The single-file export (--safetensors) of a run from a directory takes n_head from it too.
  const fs::path legacy = fresh_dir("export_legacy");
  builtin_models().export_safetensors(input, (legacy / "model.safetensors").string());
  CHECK(json::parse(text_of((legacy / "config.json").string()))["n_head"] == 4);
  // What was exported imports again, bit for bit (values exact in bf16).
  const auto def = builtin_models().resolve(run_model(out.string()));
  const ParamInitializer init = def->initializer(t.model, 1, out.string());
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> got(t.values[i].size());
    init(static_cast<int>(i), 0, static_cast<std::int64_t>(got.size()), got.data());
    REQUIRE(got == t.values[i]);
  }
}

TEST_CASE("export: token ids the source's config.json leaves out come from its tokenizer",
          "[hf][export]") {
  TinyGpt t;
  json config = t.config();
  config.erase("bos_token_id");
  config.erase("eos_token_id");
  const auto export_of = [&](const std::string& name, const fs::path& src) {
    const fs::path out = fresh_dir(name);
    builtin_models().export_hf(t.export_input(src), out.string(), HfExportOptions{});
    return std::make_pair(json::parse(text_of((out / "config.json").string())),
                          json::parse(text_of((out / "generation_config.json").string())));
  };
  // A ChatML tokenizer as the fine-tuning example makes it: no BOS, the end of a turn as EOS
  // (an added token), a pad token found in tokenizer.json's added tokens.
  const fs::path chat = t.write_dir("tokens_src", config);
  write_text(chat / "tokenizer_config.json",
             json{{"bos_token", nullptr},
                  {"eos_token", "<|im_end|>"},
                  {"pad_token", {{"content", "<|endoftext|>"}}},
                  {"added_tokens_decoder",
                   {{"60", {{"content", "<|im_start|>"}, {"special", true}}},
                    {"61", {{"content", "<|im_end|>"}, {"special", true}}}}}}
                 .dump());
  write_text(chat / "tokenizer.json",
             json{{"added_tokens", {{{"id", 62}, {"content", "<|endoftext|>"}}}},
                  {"model", {{"vocab", {{"a", 0}}}}}}
                 .dump());
  const auto [with_tokenizer, generation] = export_of("tokens_out", chat);
  CHECK(with_tokenizer["bos_token_id"].is_null());
  CHECK(with_tokenizer["eos_token_id"] == 61);
  CHECK(with_tokenizer["pad_token_id"] == 62);
  CHECK(generation["eos_token_id"] == 61);
  // No tokenizer: GPT-2's defaults (50256) would name no token of a 64-token vocabulary, so the
  // export says null rather than leave them to transformers.
  const auto [bare, bare_generation] =
      export_of("tokens_bare_out", t.write_dir("bare_src", config));
  CHECK(bare["bos_token_id"].is_null());
  CHECK(bare["eos_token_id"].is_null());
  CHECK_FALSE(bare.contains("pad_token_id"));
  // The source's own ids win over the tokenizer's.
  const fs::path own = t.write_dir("own_src", t.config());
  fs::copy_file(chat / "tokenizer_config.json", own / "tokenizer_config.json");
  CHECK(export_of("own_out", own).first["eos_token_id"] == 63);
}

namespace {

// transformers' LlamaForCausalLM / Qwen2ForCausalLM parameter names and [out, in] shapes (the
// contract with models/llama): one layer, C 8, 2 heads of 4, 1 KV head, MLP 16, vocabulary 32.
std::vector<ParamSpec> llama_params(bool tied, bool bias) {
  std::vector<ParamSpec> p;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    ParamSpec s;
    s.name = name;
    s.shape = std::move(shape);
    p.push_back(s);
  };
  add("model.embed_tokens.weight", {32, 8});
  const std::string l = "model.layers.0.";
  add(l + "input_layernorm.weight", {8});
  add(l + "self_attn.q_proj.weight", {8, 8});
  add(l + "self_attn.k_proj.weight", {4, 8});
  add(l + "self_attn.v_proj.weight", {4, 8});
  if (bias) {
    add(l + "self_attn.q_proj.bias", {8});
    add(l + "self_attn.k_proj.bias", {4});
    add(l + "self_attn.v_proj.bias", {4});
  }
  add(l + "self_attn.o_proj.weight", {8, 8});
  add(l + "post_attention_layernorm.weight", {8});
  add(l + "mlp.gate_proj.weight", {16, 8});
  add(l + "mlp.up_proj.weight", {16, 8});
  add(l + "mlp.down_proj.weight", {8, 16});
  add("model.norm.weight", {8});
  if (!tied) add("lm_head.weight", {32, 8});
  return p;
}

fs::path write_llama_dir(const std::string& name, const std::vector<ParamSpec>& params,
                         const SafetensorsTensors& extra, DType dtype = DType::kBFloat16) {
  const fs::path dir = fresh_dir(name);
  SafetensorsTensors t;
  for (std::size_t i = 0; i < params.size(); ++i) {
    t.push_back({params[i].name, {params[i].shape, exact_values(params[i].numel(), int(i))}});
  }
  for (const auto& e : extra) t.push_back(e);
  hf::write_hf_weights(dir.string(), t, dtype, 1500);  // sharded
  return dir;
}

}  // namespace

TEST_CASE("Llama-family files match transformers' names: tied and untied heads, Qwen2 biases",
          "[hf][import]") {
  const auto rules = hf::llama_family_rules();
  // Untied (Llama-3.1-8B style): lm_head is a parameter and is read.
  const auto untied = llama_params(false, false);
  {
    const fs::path dir = write_llama_dir("llama_untied", untied, {});
    const hf::HfParamSource src(dir.string(), untied, rules);
    const std::size_t head = untied.size() - 1;
    std::vector<float> got(32 * 8);
    src.read(static_cast<int>(head), 0, 256, got.data());
    CHECK(got == exact_values(256, static_cast<int>(head)));
    CHECK(src.tensor_of(static_cast<int>(head)) == "lm_head.weight");
  }
  // An untied model and a file without lm_head: refused (the head would be random).
  {
    const fs::path dir = write_llama_dir("llama_no_head", llama_params(true, false), {});
    CHECK_THROWS_WITH(hf::HfParamSource(dir.string(), untied, rules),
                      Catch::Contains("no tensor for parameter 'lm_head.weight'"));
  }
  // Tied (Llama-3.2-1B, Qwen2.5 style) with biases and an old rotary buffer; an lm_head copy
  // equal to the embedding is accepted, one that differs is an untied head: refused.
  const auto tied = llama_params(true, true);
  const SafetensorsTensors buffer = {
      {"model.layers.0.self_attn.rotary_emb.inv_freq", {{2}, {1.f, 0.5f}}}};
  CHECK_NOTHROW(
      hf::HfParamSource(write_llama_dir("qwen_tied", tied, buffer).string(), tied, rules));
  SafetensorsTensors copy = buffer;
  copy.push_back({"lm_head.weight", {{32, 8}, exact_values(256, 0)}});
  CHECK_NOTHROW(hf::HfParamSource(write_llama_dir("qwen_copy", tied, copy).string(), tied, rules));
  SafetensorsTensors other = buffer;
  other.push_back({"lm_head.weight", {{32, 8}, exact_values(256, 5)}});
  CHECK_THROWS_WITH(
      hf::HfParamSource(write_llama_dir("qwen_untied_copy", tied, other).string(), tied, rules),
      Catch::Contains("tensor 'lm_head.weight' differs from 'model.embed_tokens.weight': an "
                      "untied output head"));
  // Qwen2 biases in the file but a model without them (attention_bias false): not dropped.
  CHECK_THROWS_WITH(hf::HfParamSource(write_llama_dir("qwen_bias", tied, {}).string(),
                                      llama_params(true, false), rules),
                    Catch::Contains("tensor 'model.layers.0.self_attn.") &&
                        Catch::Contains("_proj.bias' matches no parameter"));
  // A transposed projection (e.g. a GPT-2 style Conv1D layout) is a shape mismatch.
  SafetensorsTensors transposed;
  auto wrong = untied;
  for (auto& p : wrong) {
    if (p.name == "model.layers.0.mlp.down_proj.weight") p.shape = {16, 8};
  }
  CHECK_THROWS_WITH(
      hf::HfParamSource(write_llama_dir("llama_transposed", wrong, {}).string(), untied, rules),
      Catch::Contains("tensor 'model.layers.0.mlp.down_proj.weight' has shape (16, 8) but the "
                      "model's 'model.layers.0.mlp.down_proj.weight' is (8, 16)"));
}

// rope_scaling given with an init_from directory is checked against its config.json like every
// other key (it was silently dropped: a default-rope file trained with default rope although
// the run asked for llama3, and --check said nothing).
TEST_CASE("rope_scaling given with an init_from directory is checked against it", "[hf][config]") {
  const fs::path dir = fresh_dir("rope_contradiction");
  write_text(dir / "config.json", text_of(fixture("llama-3.2-1b.json")));  // llama3, factor 32
  ModelConfig run;
  run.type = "llama";
  run.init_from = dir.string();
  run.seq_len = 64;
  CHECK_NOTHROW(builtin_models().resolve(run));
  const std::string cfg = (dir / "config.json").string();
  ModelConfig r = run;
  r.rope_scaling.rope_type = "default";
  CHECK_THROWS_WITH(builtin_models().resolve(r),
                    Catch::Contains("model.rope_scaling.rope_type default contradicts " + cfg +
                                    " rope_scaling.rope_type (llama3)"));
  r = run;
  r.rope_scaling.factor = 8.0;
  CHECK_THROWS_WITH(builtin_models().resolve(r),
                    Catch::Contains("model.rope_scaling.factor 8 contradicts " + cfg +
                                    " rope_scaling.factor (32)"));
  r = run;
  r.rope_scaling.rope_type = "llama3";
  r.rope_scaling.factor = 32.0;
  CHECK_NOTHROW(builtin_models().resolve(r));
  // YaRN (Qwen3's long-context setting): its keys are read from the file and checked the same way.
  const fs::path qwen = fresh_dir("rope_yarn");
  json yarn = json::parse(text_of(fixture("qwen3-8b.json")));
  yarn["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  yarn["max_position_embeddings"] = 131072;
  write_text(qwen / "config.json", yarn.dump());
  ModelConfig q;
  q.type = "qwen3";
  q.init_from = qwen.string();
  q.seq_len = 65536;
  CHECK_NOTHROW(builtin_models().resolve(q));
  const std::string qcfg = (qwen / "config.json").string();
  q.rope_scaling.beta_fast = 32.0;  // the file has none: its default, so this agrees
  CHECK_NOTHROW(builtin_models().resolve(q));
  q.rope_scaling.beta_fast = 16.0;
  CHECK_THROWS_WITH(builtin_models().resolve(q),
                    Catch::Contains("model.rope_scaling.beta_fast 16 contradicts " + qcfg +
                                    " rope_scaling.beta_fast (32): drop the key"));
  q.rope_scaling.beta_fast.reset();
  q.rope_scaling.mscale = 1.0;
  CHECK_THROWS_WITH(builtin_models().resolve(q), Catch::Contains("rope_scaling.mscale (absent)"));
}

// A checkpoint of a run that started from a Hugging Face directory rebuilds its model from that
// directory's config.json (zrt-ckpt export, logits): gone, it is named (the block alone read as
// a GPT-2 with missing dimensions). The trainer saves init_from as an absolute path, so another
// working directory finds it.
TEST_CASE("a saved model whose init_from directory is gone is named", "[hf][export]") {
  const std::string config_json =
      json{{"model", {{"init_from", "/nonexistent/qwen2.5-0.5b"}, {"seq_len", 32}}}}.dump();
  CHECK_THROWS_WITH(saved_model_config(config_json, "ckpt/global_step2"),
                    Catch::Contains("ckpt/global_step2: the saved model comes from "
                                    "model.init_from /nonexistent/qwen2.5-0.5b, which is not "
                                    "there"));
}
