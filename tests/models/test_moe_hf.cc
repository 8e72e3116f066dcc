// The mixtures of experts and Hugging Face: the Hub's per-expert files and transformers v5's
// fused experts load to the same model, a piece missing or misshapen is named, export writes the
// Hub's form with a config.json transformers reads, and the presets have the published parameter
// counts (total and active).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/hf/hf_config.h"
#include "models/hf/hf_import.h"
#include "models/hf/hf_weights.h"
#include "models/model_registry.h"
#include "models/moe/moe_config.h"
#include "models/moe/moe_hf.h"
#include "models/moe/moe_model.h"
#include "models/safetensors.h"

namespace zrt::moe {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_moe_hf" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<float> values_of(std::int64_t n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + salt) % 61 - 30) / 8.f;
  return v;
}

std::vector<ExportTensor> model_tensors(const MoeConfig& c) {
  std::vector<ExportTensor> out;
  const auto table = MoeModel::parameter_table(c);
  for (std::size_t i = 0; i < table.size(); ++i) {
    out.push_back({table[i].name, table[i].shape, values_of(table[i].numel(), int(i))});
  }
  return out;
}

fs::path write_dir(const std::string& name, const std::vector<ExportTensor>& tensors) {
  const fs::path dir = fresh_dir(name);
  SafetensorsTensors t;
  for (const ExportTensor& x : tensors) t.push_back({x.name, {x.shape, x.values}});
  write_safetensors((dir / "model.safetensors").string(), t, {{"format", "pt"}});
  return dir;
}

std::vector<std::vector<float>> read_all(const fs::path& dir, const MoeConfig& c) {
  const auto table = MoeModel::parameter_table(c);
  const hf::HfParamSource src(dir.string(), table, import_rules(c));
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < table.size(); ++i) {
    out.emplace_back(static_cast<std::size_t>(table[i].numel()));
    // Two slices, the second across the pieces' boundaries.
    const std::int64_t half = table[i].numel() / 2;
    src.read(static_cast<int>(i), 0, half, out.back().data());
    src.read(static_cast<int>(i), half, table[i].numel() - half, out.back().data() + half);
  }
  return out;
}

TEST_CASE("the Hub's per-expert tensors and the fused experts load to the same MoE model",
          "[moe][hf]") {
  for (const char* preset : {"mixtral-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"}) {
    INFO(preset);
    const MoeConfig c = MoeConfig::preset(preset);
    const std::vector<ExportTensor> fused = model_tensors(c);
    const std::vector<ExportTensor> hub = hub_tensors(c, model_tensors(c));
    std::set<std::string> names;
    for (const ExportTensor& t : hub) names.insert(t.name);
    // The Hub's names, as transformers' checkpoints on the Hub spell them.
    if (c.architecture == "mixtral") {
      CHECK(names.count("model.layers.0.block_sparse_moe.gate.weight") == 1);
      CHECK(names.count("model.layers.1.block_sparse_moe.experts.3.w1.weight") == 1);
      CHECK(names.count("model.layers.1.block_sparse_moe.experts.3.w2.weight") == 1);
      CHECK(names.count("model.layers.1.block_sparse_moe.experts.3.w3.weight") == 1);
    } else {
      CHECK(names.count("model.layers.0.mlp.gate.weight") == 1);
      CHECK(names.count("model.layers.0.mlp.experts.1.gate_proj.weight") == 1);
      CHECK(names.count("model.layers.0.mlp.experts.1.up_proj.weight") == 1);
      CHECK(names.count("model.layers.0.mlp.experts.1.down_proj.weight") == 1);
    }
    if (c.has_shared_expert()) {
      CHECK(names.count("model.layers.0.mlp.shared_expert.gate_proj.weight") == 1);
      CHECK(names.count("model.layers.0.mlp.shared_expert_gate.weight") == 1);
      CHECK(names.count("model.layers.1.mlp.gate_proj.weight") == 1);  // the dense layer
    }
    for (const std::string& n : names) CHECK(n.find("gate_up_proj") == std::string::npos);
    CHECK(names.size() ==
          fused.size() + static_cast<std::size_t>(c.num_moe_layers()) * (3 * c.num_experts - 2));
    const auto from_fused = read_all(write_dir(std::string(preset) + "_fused", fused), c);
    const auto from_hub = read_all(write_dir(std::string(preset) + "_hub", hub), c);
    REQUIRE(from_fused.size() == fused.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
      INFO(fused[i].name);
      CHECK(from_fused[i] == fused[i].values);
      CHECK(from_hub[i] == fused[i].values);
    }
  }
}

TEST_CASE("a per-expert file missing a piece, or with one misshapen, is refused by name",
          "[moe][hf]") {
  const MoeConfig c = MoeConfig::preset("qwen3-moe-tiny");
  const auto table = MoeModel::parameter_table(c);
  auto hub = hub_tensors(c, model_tensors(c));
  auto missing = hub;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [](const ExportTensor& t) {
                                 return t.name == "model.layers.1.mlp.experts.5.up_proj.weight";
                               }),
                missing.end());
  CHECK_THROWS_WITH(
      hf::HfParamSource(write_dir("missing", missing).string(), table, import_rules(c)),
      Catch::Contains("no tensor 'model.layers.1.mlp.experts.5.up_proj.weight' (a "
                      "piece of parameter 'model.layers.1.mlp.experts.gate_up_proj')"));
  auto wrong = hub;
  for (ExportTensor& t : wrong) {
    if (t.name == "model.layers.0.mlp.experts.2.down_proj.weight") t.shape = {8, 16};
  }
  CHECK_THROWS_WITH(
      hf::HfParamSource(write_dir("misshapen", wrong).string(), table, import_rules(c)),
      Catch::Contains("tensor 'model.layers.0.mlp.experts.2.down_proj.weight' has shape (8, 16) "
                      "but a piece of 'model.layers.0.mlp.experts.down_proj' is (16, 8)"));
  // A stray expert beyond num_experts matches nothing: refused, never dropped.
  auto extra = hub;
  extra.push_back({"model.layers.0.mlp.experts.8.up_proj.weight", {8, 16}, values_of(128, 1)});
  CHECK_THROWS_WITH(
      hf::HfParamSource(write_dir("extra", extra).string(), table, import_rules(c)),
      Catch::Contains("'model.layers.0.mlp.experts.8.up_proj.weight' matches no parameter"));
  // So does an expert in a layer the model keeps dense (Qwen2-MoE-tiny's layer 1): a mismatch,
  // not another expert-parallel rank's expert.
  const MoeConfig q2 = MoeConfig::preset("qwen2-moe-tiny");
  REQUIRE_FALSE(q2.is_moe_layer(1));
  auto dense = hub_tensors(q2, model_tensors(q2));
  dense.push_back({"model.layers.1.mlp.experts.0.up_proj.weight",
                   {q2.moe_intermediate_size, q2.hidden_size},
                   values_of(std::int64_t{q2.moe_intermediate_size} * q2.hidden_size, 1)});
  CHECK_THROWS_WITH(hf::HfParamSource(write_dir("dense_expert", dense).string(),
                                      MoeModel::parameter_table(q2), import_rules(q2)),
                    Catch::Contains("'model.layers.1.mlp.experts.0.up_proj.weight' matches no "
                                    "parameter"));
}

// model.init_from under expert parallelism: each rank's model holds only its own experts, and
// reads them from the whole file; the other ranks' experts there are passed over, not refused.
TEST_CASE("each expert-parallel rank reads its own experts from a Hub file", "[moe][hf]") {
  for (const char* preset : {"mixtral-tiny", "qwen3-moe-tiny"}) {
    INFO(preset);
    const MoeConfig c = MoeConfig::preset(preset);
    const std::vector<ExportTensor> fused = model_tensors(c);
    const fs::path dir = write_dir(std::string("ep_") + preset, hub_tensors(c, fused));
    std::map<std::string, const ExportTensor*> whole;
    for (const ExportTensor& t : fused) whole[t.name] = &t;
    for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
      ExpertPartition experts;
      experts.num_experts = c.num_experts;
      experts.ep_size = 2;
      experts.ep_rank = ep_rank;
      const auto table = MoeModel::parameter_table(c, experts);
      const hf::HfParamSource src(dir.string(), table, import_rules(c));
      int own_experts = 0;
      for (std::size_t i = 0; i < table.size(); ++i) {
        INFO(table[i].name);
        std::vector<float> got(static_cast<std::size_t>(table[i].numel()));
        src.read(static_cast<int>(i), 0, table[i].numel(), got.data());
        const auto same = whole.find(table[i].name);
        if (same != whole.end()) {
          CHECK(got == same->second->values);  // a dense parameter: as the file holds it
          continue;
        }
        // Expert e's own parameter: slice e of the stacked one.
        const std::string name = table[i].name;
        const std::size_t at = name.find("experts.") + 8;
        const int e = std::stoi(name.substr(at));
        CHECK(e / experts.local() == ep_rank);
        const std::string stacked = name.substr(0, at) + name.substr(name.find('.', at) + 1);
        REQUIRE(whole.count(stacked) == 1);
        const std::vector<float>& all = whole[stacked]->values;
        const std::size_t n = got.size();
        CHECK(std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(e * n),
                                 all.begin() + static_cast<std::ptrdiff_t>((e + 1) * n)) == got);
        ++own_experts;
      }
      CHECK(own_experts == c.num_moe_layers() * experts.local() * 2);
    }
  }
}

TEST_CASE("MoE export writes the Hub's form and a config.json; it reads back as the same model",
          "[moe][hf]") {
  for (const char* type : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    INFO(type);
    const std::string preset = std::string(type) == "mixtral"     ? "mixtral-tiny"
                               : std::string(type) == "qwen2_moe" ? "qwen2-moe-tiny"
                                                                  : "qwen3-moe-tiny";
    const MoeConfig c = MoeConfig::preset(preset);
    ExportInput input;
    input.checkpoint = "ckpt";
    input.config_json = nlohmann::json{{"model", {{"type", type}, {"preset", preset}}}}.dump();
    input.tensors = model_tensors(c);
    const fs::path dir = fresh_dir(std::string("export_") + type);
    builtin_models().export_safetensors(input, (dir / "model.safetensors").string());
    const hf::HfWeights written(dir.string());
    for (const std::string& name : written.names()) {
      CHECK(name.find("experts.gate_up_proj") == std::string::npos);
      CHECK(name.find("experts.down_proj") == std::string::npos);
    }
    std::ifstream in(dir / "config.json");
    const auto hf = nlohmann::json::parse(in);
    CHECK(hf["model_type"] == type);
    CHECK(hf["num_experts_per_tok"] == c.num_experts_per_tok);
    // The registry reads the directory back (its config.json gives the architecture).
    ModelConfig run;
    run.type = type;
    run.init_from = dir.string();
    const auto def = builtin_models().resolve(run);
    CHECK(def->num_parameters() == c.num_parameters());
    CHECK(def->num_active_parameters() == c.num_active_parameters());
    const auto back = read_all(dir, c);
    for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == input.tensors[i].values);
  }
}

// A checkpoint saved under expert parallelism holds each expert's own parameters (in the order
// the ranks' tables give them): export --safetensors writes the same file as from the fused
// model, and a tensor missing is named.
TEST_CASE("MoE export of an expert-parallel checkpoint equals the fused model's", "[moe][hf]") {
  for (const char* preset : {"mixtral-tiny", "qwen3-moe-tiny"}) {
    INFO(preset);
    const MoeConfig c = MoeConfig::preset(preset);
    const std::vector<ExportTensor> fused = model_tensors(c);
    std::map<std::string, const ExportTensor*> whole;
    for (const ExportTensor& t : fused) whole[t.name] = &t;
    ExportInput input;
    input.checkpoint = "ckpt";
    input.config_json =
        nlohmann::json{{"model", {{"type", c.architecture}, {"preset", preset}}}}.dump();
    std::set<std::string> seen;
    for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
      ExpertPartition experts{c.num_experts, 2, ep_rank};
      for (const ParamSpec& p : MoeModel::parameter_table(c, experts)) {
        if (!seen.insert(p.name).second) continue;  // a dense parameter, every rank's
        if (whole.count(p.name) != 0) {
          input.tensors.push_back(*whole[p.name]);
          continue;
        }
        const std::size_t at = p.name.find("experts.") + 8;
        const int e = std::stoi(p.name.substr(at));
        const std::string stacked = p.name.substr(0, at) + p.name.substr(p.name.find('.', at) + 1);
        const std::vector<float>& all = whole.at(stacked)->values;
        const std::ptrdiff_t n = p.numel();
        input.tensors.push_back(
            {p.name, p.shape, std::vector<float>(all.begin() + e * n, all.begin() + (e + 1) * n)});
      }
    }
    REQUIRE(input.tensors.size() > fused.size());
    const fs::path ep_dir = fresh_dir(std::string("export_ep_") + preset);
    ExportInput missing = input;
    builtin_models().export_safetensors(std::move(input), (ep_dir / "model.safetensors").string());
    ExportInput from_fused = missing;
    from_fused.tensors = fused;
    const fs::path fused_dir = fresh_dir(std::string("export_fused_") + preset);
    builtin_models().export_safetensors(from_fused, (fused_dir / "model.safetensors").string());
    const hf::HfWeights a(ep_dir.string()), b(fused_dir.string());
    REQUIRE(a.names() == b.names());
    for (const std::string& name : a.names()) {
      INFO(name);
      CHECK(a.read_f32(name) == b.read_f32(name));
    }
    missing.tensors.pop_back();
    CHECK_THROWS_WITH(builtin_models().export_safetensors(
                          missing, (fresh_dir("export_missing") / "m.safetensors").string()),
                      Catch::Contains("ckpt: no tensor "));
  }
}

// The published sizes, from each model's config.json on the Hugging Face Hub (the values in
// MoeConfig's presets): mistralai/Mixtral-8x7B-v0.1 (hidden 4096, intermediate 14336, 32 layers,
// 32/8 heads of 128, vocab 32000, 8 experts, top 2: "46.7B total, 12.9B active" in Mistral's
// announcement), Qwen/Qwen1.5-MoE-A2.7B (hidden 2048, 24 layers, 16 heads of 128 with q/k/v
// biases, vocab 151936, 60 experts of 1408, top 4, a shared expert of 5632: "14.3B, 2.7B
// activated" in its model card) and Qwen/Qwen3-30B-A3B (hidden 2048, 48 layers, 32/4 heads of 128
// with q/k norms, vocab 151936, 128 experts of 768, top 8: "30.5B, 3.3B activated" in its model
// card). Both counts include the untied embedding and head. The exact counts are computed here
// from those values, independently of MoeConfig's own sum.
TEST_CASE("MoE presets have the published parameter counts, total and active", "[moe]") {
  struct Expected {
    const char* preset;
    std::int64_t total, active;
    double published_total_b, published_active_b;
  };
  auto count = [](std::int64_t C, std::int64_t L, std::int64_t NH, std::int64_t NKV,
                  std::int64_t hd, std::int64_t V, std::int64_t E, std::int64_t k, std::int64_t I,
                  std::int64_t Is, bool bias, bool qk) {
    const std::int64_t attention = 2 * C * NH * hd + 2 * C * NKV * hd +
                                   (bias ? NH * hd + 2 * NKV * hd : 0) + (qk ? 2 * hd : 0);
    const std::int64_t common = attention + 2 * C + E * C + (Is ? 3 * C * Is + C : 0);
    const std::int64_t rest = 2 * V * C + C;
    return std::make_pair(L * (common + E * 3 * C * I) + rest, L * (common + k * 3 * C * I) + rest);
  };
  const auto mixtral = count(4096, 32, 32, 8, 128, 32000, 8, 2, 14336, 0, false, false);
  const auto qwen15 = count(2048, 24, 16, 16, 128, 151936, 60, 4, 1408, 5632, true, false);
  const auto qwen3 = count(2048, 48, 32, 4, 128, 151936, 128, 8, 768, 0, false, true);
  const Expected cases[] = {
      {"mixtral-8x7b", mixtral.first, mixtral.second, 46.7, 12.9},
      {"qwen2-moe-a2.7b", qwen15.first, qwen15.second, 14.3, 2.7},
      {"qwen3-30b-a3b", qwen3.first, qwen3.second, 30.5, 3.3},
  };
  CHECK(mixtral == std::make_pair(std::int64_t{46702792704}, std::int64_t{12879925248}));
  CHECK(qwen15 == std::make_pair(std::int64_t{14315784192}, std::int64_t{2689173504}));
  CHECK(qwen3 == std::make_pair(std::int64_t{30532122624}, std::int64_t{3353032704}));
  for (const Expected& e : cases) {
    INFO(e.preset);
    const MoeConfig c = MoeConfig::preset(e.preset);
    CHECK(c.num_parameters() == e.total);
    CHECK(c.num_active_parameters() == e.active);
    // The published figures are the counts in billions to one decimal, rounded or truncated
    // (Qwen3-30B-A3B's 3.353B active is published as 3.3B).
    auto published = [](std::int64_t n, double figure) {
      const double tenths = static_cast<double>(n) / 1e8;
      return std::round(tenths) == std::round(figure * 10) ||
             std::floor(tenths) == std::round(figure * 10);
    };
    CHECK(published(c.num_parameters(), e.published_total_b));
    CHECK(published(c.num_active_parameters(), e.published_active_b));
    // The parameter table the model registers sums to the same count.
    std::int64_t sum = 0;
    for (const ParamSpec& p : MoeModel::parameter_table(c)) sum += p.numel();
    CHECK(sum == c.num_parameters());
  }
}

// Qwen3-MoE's window exports with use_sliding_window (without it Qwen3MoeConfig drops the window)
// and max_window_layers 0 (transformers 4.5x windows the layers from it on), and reads back.
TEST_CASE("a Qwen3-MoE sliding window exports to config.json and reads back", "[moe]") {
  const MoeConfig c = MoeConfig::parse("qwen3_moe", "qwen3-moe-tiny:sliding_window=16");
  const nlohmann::json hf = hf_config_json(c);
  CHECK(hf["use_sliding_window"] == true);
  CHECK(hf["sliding_window"] == 16);
  CHECK(hf["max_window_layers"] == 0);
  CHECK(hf::HfConfig::parse(hf.dump(), "x").sliding_window == 16);
  const nlohmann::json none = hf_config_json(MoeConfig::parse("qwen3_moe", "qwen3-moe-tiny"));
  CHECK(none["use_sliding_window"] == false);
  CHECK(hf::HfConfig::parse(none.dump(), "x").sliding_window == 0);
}

TEST_CASE("MoE config errors name the key", "[moe]") {
  CHECK_THROWS_WITH(MoeConfig::parse("mixtral", "mixtral-tiny:num_experts_per_tok=5"),
                    Catch::Contains("model.num_experts_per_tok=5 must be at most num_experts=4"));
  CHECK_THROWS_WITH(MoeConfig::parse("qwen3_moe", "qwen3-moe-tiny:mlp_only_layers=7"),
                    Catch::Contains("model.mlp_only_layers names layer 7 of 2"));
  CHECK_THROWS_WITH(
      MoeConfig::parse("qwen3_moe", "qwen3-moe-tiny:shared_expert_intermediate_size=8"),
      Catch::Contains("only qwen2_moe has a shared expert"));
  CHECK_THROWS_WITH(MoeConfig::parse("mixtral", "qwen3-moe-tiny"),
                    Catch::Contains("is a qwen3_moe model, not model.type 'mixtral'"));
  CHECK_THROWS_WITH(MoeConfig::parse("qwen2_moe", "qwen2-moe-tiny:capacity_factor=-1"),
                    Catch::Contains("model.capacity_factor=-1 must be a finite number >= 0"));
  const MoeConfig q = MoeConfig::parse("qwen2_moe", "qwen2-moe-tiny:mlp_only_layers=0+1");
  CHECK(q.num_moe_layers() == 0);
  // Sliding windows: Mixtral's and Qwen3-MoE's on every layer; Qwen2-MoE's alternate (not
  // implemented), refused by name.
  CHECK(MoeConfig::parse("mixtral", "mixtral-tiny:sliding_window=16").sliding_window == 16);
  CHECK(MoeConfig::parse("qwen3_moe", "qwen3-moe-tiny:sliding_window=16").sliding_window == 16);
  CHECK_THROWS_WITH(MoeConfig::parse("qwen2_moe", "qwen2-moe-tiny:sliding_window=16"),
                    Catch::Contains("model.sliding_window=16 is not supported for qwen2_moe"));
  CHECK_THROWS_WITH(MoeConfig::parse("mixtral", "mixtral-tiny:sliding_window=-4"),
                    Catch::Contains("model.sliding_window=-4"));
}

}  // namespace
}  // namespace zrt::moe

namespace zrt::moe {
namespace {

// Keys given with an init_from directory that change no shape but the arithmetic (rope_theta,
// the norms' epsilon, the routing's renormalisation, the layout of dense and sparse layers) are
// checked against its config.json as the shapes are: a contradiction is refused, naming both
// values (they were silently dropped, the file's values used). An output_router_logits in the
// export would make transformers' labelled loss add the auxiliary term: off, as published.
TEST_CASE("keys given with a MoE init_from directory are checked against it", "[moe][hf]") {
  const MoeConfig c = MoeConfig::preset("qwen3-moe-tiny");
  ExportInput input;
  input.checkpoint = "ckpt";
  input.config_json =
      nlohmann::json{{"model", {{"type", "qwen3_moe"}, {"preset", "qwen3-moe-tiny"}}}}.dump();
  input.tensors = model_tensors(c);
  const fs::path dir = fresh_dir("contradictions");
  builtin_models().export_safetensors(input, (dir / "model.safetensors").string());
  std::ifstream in(dir / "config.json");
  const auto hf = nlohmann::json::parse(in);
  CHECK(hf["output_router_logits"] == false);
  ModelConfig run;
  run.type = "qwen3_moe";
  run.init_from = dir.string();
  CHECK_NOTHROW(builtin_models().resolve(run));
  const std::string cfg = (dir / "config.json").string();
  auto refused = [&](ModelConfig r, const std::string& message) {
    INFO(message);
    CHECK_THROWS_WITH(builtin_models().resolve(r),
                      Catch::Contains(message) && Catch::Contains(cfg));
  };
  ModelConfig r = run;
  r.rope_theta = c.rope_theta * 2;
  refused(r, "model.rope_theta");
  r = run;
  r.rms_norm_eps = 1e-3;
  refused(r, "model.rms_norm_eps 0.001 contradicts");
  r = run;
  r.norm_topk_prob = !c.norm_topk_prob;
  refused(r, "model.norm_topk_prob");
  r = run;
  r.max_position_embeddings = c.max_position_embeddings + 1;
  refused(r, "model.max_position_embeddings");
  r = run;
  r.decoder_sparse_step = 2;
  refused(r, "model.decoder_sparse_step 2 contradicts");
  r = run;
  r.mlp_only_layers = std::vector<int>{0};
  refused(r, "model.mlp_only_layers [0] contradicts");
  // The same values as the file's are not contradictions.
  r = run;
  r.rope_theta = c.rope_theta;
  r.norm_topk_prob = c.norm_topk_prob;
  CHECK_NOTHROW(builtin_models().resolve(r));
}

}  // namespace
}  // namespace zrt::moe
