// EngineOptions' one validation (engine_options.h): each rule names its DeepSpeed key and the
// fix, every problem comes back at once, and check_options throws them as one InvalidArgument.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/engine/engine_options.h"

using namespace zrt;

namespace {

std::vector<std::string> texts(const EngineOptions& o, int world = 0) {
  std::vector<std::string> out;
  for (const OptionProblem& p : validate(o, world)) out.push_back(p.text());
  return out;
}

EngineOptions at_stage(int stage) {
  EngineOptions o;
  o.stage = stage;
  return o;
}

}  // namespace

TEST_CASE("the default options and every stage are valid") {
  CHECK(validate(EngineOptions{}).empty());
  for (int stage : {0, 1, 2, 3}) CHECK(validate(at_stage(stage), 8).empty());
  EngineOptions offload = at_stage(3);
  offload.offload_optimizer.enabled = true;
  offload.offload_param.enabled = true;
  CHECK(validate(offload, 8).empty());
  CHECK_NOTHROW(check_options(offload, 8));
}

TEST_CASE("each rule names its DeepSpeed key and the fix") {
  struct Case {
    const char* what;
    EngineOptions options;
    int world;
    const char* text;
  };
  std::vector<Case> cases;
  EngineOptions o = at_stage(2);
  o.offload_optimizer.enabled = true;
  o.offload_param.enabled = true;
  cases.push_back({"parameter offload below stage 3", o, 0,
                   "zero_optimization.offload_param: parameter offload needs ZeRO stage 3 (stage "
                   "is 2); set stage 3 or offload_param.device none"});
  o = at_stage(0);
  o.offload_optimizer.enabled = true;
  cases.push_back({"optimizer offload at stage 0", o, 0,
                   "zero_optimization.offload_optimizer: optimizer offload needs ZeRO stage 1, 2 "
                   "or 3 (stage is 0); set a stage or offload_optimizer.device none"});
  o = at_stage(1);
  o.offload_optimizer.enabled = true;
  o.offload_optimizer.ratio = 0.5;
  cases.push_back({"partial offload below stage 3", o, 0,
                   "zero_optimization.offload_optimizer.ratio: partial optimizer offload (ratio < "
                   "1) needs ZeRO stage 3 (stage is 1); set stage 3 or ratio 1"});
  o = at_stage(3);
  o.offload_param.enabled = true;
  cases.push_back({"parameter offload alone", o, 0,
                   "zero_optimization.offload_param: parameter offload needs offload_optimizer too "
                   "(zrt keeps offloaded parameter slices beside the optimizer state in host "
                   "memory)"});
  o = at_stage(2);
  o.hpz_partition_size = 2;
  cases.push_back({"hpZ below stage 3", o, 0,
                   "zero_optimization.zero_hpz_partition_size: hpZ keeps secondary shards of "
                   "stage 3's gathered parameters (stage is 2); set stage 3 or "
                   "zero_hpz_partition_size 1"});
  o = at_stage(3);
  o.hpz_partition_size = 3;
  cases.push_back({"hpZ not dividing the world", o, 8,
                   "zero_optimization.zero_hpz_partition_size: 3 does not divide the world size "
                   "8: hpZ groups are equal blocks of consecutive ranks (the ranks of one node)"});
  o = at_stage(3);
  o.mics_shard_size = 3;
  cases.push_back({"MiCS not dividing the world", o, 8,
                   "zero_optimization.mics_shard_size: 3 does not divide the world size 8: shard "
                   "groups are equal blocks of consecutive ranks (e.g. the ranks of one node)"});
  o = at_stage(1);
  o.quantized_gradients = true;
  cases.push_back({"qgZ below stage 2", o, 0,
                   "zero_optimization.zero_quantized_gradients: qgZ quantizes the reduce-scatters "
                   "of stages 2-3 (stage is 1); set stage 2 or 3, or zero_quantized_gradients "
                   "false"});
  o = EngineOptions{};
  o.compute_dtype = DType::kBFloat16;
  o.grad_accum_dtype = DType::kFloat16;
  cases.push_back({"accumulation in another 16-bit type", o, 0,
                   "data_types.grad_accum_dtype: fp16 accumulation with bf16 compute; accumulate "
                   "in fp32 or the compute dtype"});
  o = EngineOptions{};
  o.gradient_accumulation_steps = 0;
  cases.push_back(
      {"no micro-batch per step", o, 0, "gradient_accumulation_steps: must be >= 1, not 0"});
  for (const Case& c : cases) {
    INFO(c.what);
    CHECK(texts(c.options, c.world) == std::vector<std::string>{c.text});
  }
}

TEST_CASE("every problem at once, in one InvalidArgument") {
  EngineOptions o = at_stage(0);
  o.offload_optimizer.enabled = true;
  o.quantized_weights = true;
  o.stage3_prefetch_bucket_size = -1;
  const std::vector<OptionProblem> problems = validate(o);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].key == "zero_optimization.stage3_prefetch_bucket_size");
  CHECK(problems[1].key == "zero_optimization.zero_quantized_weights");
  CHECK(problems[1].also == std::vector<std::string>{"zero_optimization.stage"});
  CHECK(problems[2].key == "zero_optimization.offload_optimizer");
  CHECK_THROWS_AS(check_options(o), InvalidArgument);
  CHECK_THROWS_WITH(check_options(o),
                    Catch::Contains("3 problems with the engine options:\n"
                                    "zero_optimization.stage3_prefetch_bucket_size: must be >= 0 "
                                    "elements, not -1\n"
                                    "zero_optimization.zero_quantized_weights: qwZ quantizes") &&
                        Catch::Contains("\nzero_optimization.offload_optimizer: optimizer offload "
                                        "needs ZeRO stage 1, 2 or 3"));
}

TEST_CASE("a chain of rules reports the first one a key breaks, and the world only when known") {
  EngineOptions o = at_stage(2);
  o.hpz_partition_size = 3;
  o.mics_shard_size = 3;
  // hpZ breaks its stage rule, its MiCS rule and its world rule: the stage is reported.
  const std::vector<OptionProblem> problems = validate(o, 8);
  REQUIRE(problems.size() == 2);
  CHECK(problems[0].key == "zero_optimization.mics_shard_size");
  CHECK(problems[1].key == "zero_optimization.zero_hpz_partition_size");
  CHECK(problems[1].message.find("stage is 2") != std::string::npos);
  EngineOptions hpz = at_stage(3);
  hpz.hpz_partition_size = 3;
  CHECK(validate(hpz).empty());  // world unknown (the engine checks its groups)
  CHECK(validate(hpz, 6).empty());
  CHECK(validate(hpz, 8).size() == 1);
}
