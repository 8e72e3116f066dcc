// The "optimizer" block: DeepSpeed's types, keys and defaults, and clear errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "optimizers/optimizer_config.h"
#include "runtime/common/error.h"

namespace zrt {
namespace {

using json = nlohmann::json;

OptimizerConfig parse(const char* text) {
  return parse_optimizer_config(json::parse(text));
}

TEST_CASE("optimizer defaults follow DeepSpeed", "[optimizer_config]") {
  const OptimizerConfig none = parse_optimizer_config(json());
  CHECK(none.type == "AdamW");
  const OptimizerConfig c = parse(R"({"type": "Adam"})");
  CHECK(c.type == "Adam");
  CHECK(c.adam.lr == 1e-3);
  CHECK(c.adam.beta1 == 0.9);
  CHECK(c.adam.beta2 == 0.999);
  CHECK(c.adam.eps == 1e-8);
  CHECK(c.adam.weight_decay == 0.0);
  CHECK(c.adam.bias_correction);
  CHECK(c.adam.adam_w_mode);  // "Adam" is AdamW unless adam_w_mode is false
}

TEST_CASE("optimizer params are read", "[optimizer_config]") {
  const OptimizerConfig c = parse(R"({"type": "adamw", "params": {"lr": 3e-4,
      "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1, "bias_correction": false,
      "torch_adam": true, "amsgrad": false}})");
  CHECK(c.type == "AdamW");  // type names are case-insensitive, as in DeepSpeed
  CHECK(c.adam.lr == 3e-4);
  CHECK(c.adam.beta1 == 0.9);
  CHECK(c.adam.beta2 == 0.95);
  CHECK(c.adam.eps == 1e-6);
  CHECK(c.adam.weight_decay == 0.1);
  CHECK_FALSE(c.adam.bias_correction);
  CHECK(c.adam.adam_w_mode);
}

TEST_CASE("adam_w_mode selects L2 for Adam only", "[optimizer_config]") {
  CHECK_FALSE(parse(R"({"type": "Adam", "params": {"adam_w_mode": false}})").adam.adam_w_mode);
  CHECK(parse(R"({"type": "Adam", "params": {"adam_w_mode": true}})").adam.adam_w_mode);
  // DeepSpeed: type AdamW forces decoupled decay whatever adam_w_mode says.
  CHECK(parse(R"({"type": "AdamW", "params": {"adam_w_mode": false}})").adam.adam_w_mode);
}

TEST_CASE("unsupported optimizer types list the supported ones", "[optimizer_config]") {
  for (const char* type : {"SGD", "OneBitAdam", "Lamb", "ZeroOneAdam", "Adagrad"}) {
    INFO(type);
    CHECK_THROWS_WITH(parse((std::string(R"({"type": ")") + type + "\"}").c_str()),
                      Catch::Contains("not supported") && Catch::Contains("Adam, AdamW, Lion"));
  }
  CHECK_THROWS_WITH(parse(R"({"type": "AdamX"})"),
                    Catch::Contains("unknown") && Catch::Contains("did you mean 'Adam"));
  CHECK_THROWS_WITH(parse(R"({"type": "Shampoo"})"),
                    Catch::Contains("unknown") && Catch::Contains("Adam, AdamW"));
}

TEST_CASE("optimizer config errors name the key", "[optimizer_config]") {
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"weight_decy": 0.1}})"),
                    Catch::Contains("unknown key 'weight_decy'") &&
                        Catch::Contains("did you mean 'weight_decay'"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "parms": {}})"),
                    Catch::Contains("did you mean 'params'"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"betas": [0.9]}})"),
                    Catch::Contains("betas must be a list of two numbers"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"betas": [0.9, 1.0]}})"),
                    Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"lr": -1}})"),
                    Catch::Contains("lr must be >= 0"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"lr": "auto"}})"),
                    Catch::Contains("lr must be a number"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"eps": 0}})"),
                    Catch::Contains("eps must be > 0"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"weight_decay": -0.1}})"),
                    Catch::Contains("weight_decay must be >= 0"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"amsgrad": true}})"),
                    Catch::Contains("AMSGrad is not supported"));
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "params": {"bias_correction": 1}})"),
                    Catch::Contains("must be true or false"));
  CHECK_THROWS_AS(parse(R"(["AdamW"])"), InvalidArgument);
  CHECK_THROWS_WITH(parse(R"({"type": "AdamW", "no_weight_decay": "bias"})"),
                    Catch::Contains("list of name patterns"));
}

TEST_CASE("the collecting parsers report every problem; an unsupported type alone",
          "[optimizer_config]") {
  std::vector<ConfigProblem> problems;
  const OptimizerConfig c = parse_optimizer_config(
      json::parse(R"({"type": "AdamW", "params": {"lr": -1, "eps": 0, "weight_decy": 0.1}})"),
      problems);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].kind == ProblemKind::kUnknownKey);
  CHECK_THAT(problems[0].message, Catch::Contains("did you mean 'weight_decay'"));
  CHECK(problems[1].kind == ProblemKind::kBadValue);
  CHECK_THAT(problems[1].message, Catch::Contains("lr must be >= 0"));
  CHECK_THAT(problems[2].message, Catch::Contains("eps must be > 0"));
  CHECK(c.adam.lr == 1e-3);  // the default in place of the bad value
  // The throwing form lists them all, one per line.
  CHECK_THROWS_WITH(
      parse_optimizer_config(json::parse(R"({"params": {"lr": -1, "eps": 0}})")),
      "optimizer.params.lr must be >= 0, got -1\noptimizer.params.eps must be > 0, got 0");

  problems.clear();
  parse_optimizer_config(json::parse(R"({"type": "Lamb", "params": {"max_coeff": 10}})"), problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].kind == ProblemKind::kUnsupported);
  CHECK(problems[0].message ==
        "optimizer type 'Lamb' is not supported by zrt; supported types: Adam, AdamW, Lion");
  CHECK(unsupported_optimizer_type("adamw").empty());

  problems.clear();
  parse_scheduler_config(json::parse(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0}})"),
                         problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].kind == ProblemKind::kUnsupported);
  CHECK(unsupported_scheduler_type("WarmupLR").empty());

  problems.clear();
  parse_scheduler_config(json::parse(R"({"type": "WarmupCosineLR", "params": {
      "warmup_max_lr": 1, "warmup_type": "cubic"}})"),
                         problems);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].kind == ProblemKind::kUnknownKey);
  CHECK(problems[1].kind == ProblemKind::kBadValue);
  CHECK(problems[2].kind == ProblemKind::kMissing);
  CHECK(problems[2].message == "scheduler.params.total_num_steps is required for WarmupCosineLR");
}

TEST_CASE("default no-decay patterns exempt biases and norm weights", "[optimizer_config]") {
  const OptimizerConfig c = parse(R"({"type": "AdamW", "params": {"weight_decay": 0.1}})");
  for (const char* name : {"transformer.h.0.attn.c_attn.bias", "transformer.h.11.ln_1.weight",
                           "transformer.h.11.ln_2.bias", "transformer.ln_f.weight", "ln1w",
                           "blocks.3.ln2b", "model.layers.0.input_layernorm.weight",
                           "model.norm.weight", "encoder.LayerNorm_0.scale", "bias"}) {
    INFO(name);
    CHECK_FALSE(c.applies_weight_decay(name));
  }
  for (const char* name : {"transformer.h.0.attn.c_attn.weight", "transformer.h.3.mlp.c_fc.weight",
                           "transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight",
                           "model.layers.0.self_attn.q_proj.weight"}) {
    INFO(name);
    CHECK(c.applies_weight_decay(name));
  }
}

TEST_CASE("no_weight_decay patterns are configurable", "[optimizer_config]") {
  const OptimizerConfig c =
      parse(R"({"type": "AdamW", "no_weight_decay": ["transformer.w?e.*", "*.c_proj.*"]})");
  CHECK_FALSE(c.applies_weight_decay("transformer.wte.weight"));
  CHECK_FALSE(c.applies_weight_decay("transformer.wpe.weight"));
  CHECK_FALSE(c.applies_weight_decay("transformer.h.1.attn.c_proj.weight"));
  CHECK(c.applies_weight_decay("transformer.h.1.attn.c_attn.weight"));
  CHECK(c.applies_weight_decay("transformer.h.1.ln_1.bias"));  // defaults replaced

  const OptimizerConfig all = parse(R"({"type": "AdamW", "no_weight_decay": []})");
  CHECK(all.applies_weight_decay("transformer.h.1.ln_1.bias"));
}

TEST_CASE("closest-match helper", "[optimizer_config]") {
  CHECK(detail::closest_match("lR", {"lr", "eps"}) == "lr");
  CHECK(detail::closest_match("completely_different", {"lr", "eps"}).empty());
  // Swapping two adjacent letters is one edit.
  CHECK(detail::closest_match("stpes", {"steps", "eval_interval"}) == "steps");
}

}  // namespace
}  // namespace zrt
