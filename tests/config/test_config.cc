// config: the run's JSON file. A full config and the defaults; DeepSpeed's batch rule in
// every combination; "auto"; a table of bad configs, each with its exact message; warnings;
// the key table against docs/config-keys.md; every example in configs/ validates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/json_reader.h"
#include "config/key_table.h"
#include "runtime/common/error.h"

namespace zrt {
namespace {

using json = nlohmann::json;

// A small valid config for 2 ranks: 8 = micro 2 x accumulation 2 x world 2.
json base_config() {
  return json::parse(R"({
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "model": {"preset": "gpt2-tiny"},
    "data": {"train": "data/kjv_train_*.bin", "val": "data/kjv_val_*.bin"},
    "train": {"steps": 100, "eval_interval": 50}
  })");
}

// base_config() with an RFC 7386 merge patch applied (null removes a key).
json patched(const char* patch) {
  json doc = base_config();
  doc.merge_patch(json::parse(patch));
  return doc;
}

Config parse_doc(const json& doc, int world = 2) {
  return parse_config(doc, world, "test.json");
}

std::string error_of(const std::string& text, int world = 2) {
  try {
    parse_config_text(text, world, "bad.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool has_warning(const Config& c, const std::string& prefix) {
  for (const std::string& w : c.warnings) {
    if (w.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

TEST_CASE("a full config sets every field", "[config]") {
  const json doc = json::parse(R"({
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "communication_data_type": "fp32",
    "data_types": {"grad_accum_dtype": "fp16"},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
             "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5},
    "bf16": {"enabled": false},
    "zero_optimization": {
      "stage": 3, "reduce_bucket_size": 2e7, "overlap_comm": false,
      "stage3_prefetch_bucket_size": 1e6, "stage3_param_persistence_threshold": 1e4,
      "stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 2e8,
      "offload_optimizer": {"device": "cpu", "pin_memory": false},
      "offload_param": {"device": "cpu", "buffer_count": 6}
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": 1000, "warmup_num_steps": 100}},
    "model": {"type": "gpt2", "preset": "gpt2", "n_layer": 6, "seq_len": 512,
              "activation_checkpointing": true, "init_from": "gpt2.safetensors"},
    "data": {"train": "tok/train_*.bin", "val": "tok/val.bin", "shuffle": false, "seed": 7},
    "train": {"steps": 1000, "eval_interval": 100, "eval_batches": 4, "log_interval": 5,
              "sample_tokens": 64},
    "checkpoint": {"save_dir": "ckpt", "save_interval": 200, "keep_last": 2, "async": true,
                   "load": "latest", "tag_validation": "FAIL"},
    "device": {"type": "cpu", "memory_limit_gb": 1.5, "stream_delay_us": 20},
    "comm": {"timeout_s": 30, "reduce_scatter": "native", "max_chunk_mb": 8,
             "simulated_bandwidth_gb_per_s": 12.5, "simulated_latency_us": 5},
    "trace": {"path": "trace.json", "steps": [3, 4]},
    "seed": 99,
    "output_dir": "runs/full",
    "log_level": "debug"
  })");
  const Config c = parse_doc(doc, 4);
  CHECK(c.source == "test.json");
  CHECK(c.batch.train_batch_size == 32);
  CHECK(c.batch.micro_batch_size == 4);
  CHECK(c.batch.gradient_accumulation_steps == 2);
  CHECK(c.batch.world_size == 4);

  const EngineOptions& e = c.engine;
  CHECK(e.stage == 3);
  CHECK(e.compute_dtype == DType::kFloat16);
  CHECK(c.fp16());
  CHECK_FALSE(c.bf16());
  REQUIRE(e.communication_dtype.has_value());
  CHECK(*e.communication_dtype == DType::kFloat32);
  CHECK(e.grad_accum_dtype == DType::kFloat16);
  CHECK(e.gradient_accumulation_steps == 2);
  CHECK(e.gradient_clipping == 1.0);
  CHECK(e.reduce_bucket_size == 20000000);
  CHECK(e.stage3_prefetch_bucket_size == 1000000);
  CHECK(e.stage3_param_persistence_threshold == 10000);
  CHECK(e.stage3_max_live_parameters == 300000000);
  CHECK(e.stage3_max_reuse_distance == 200000000);
  CHECK_FALSE(e.overlap_comm);
  CHECK(e.loss_scale.loss_scale == 0.0);
  CHECK(e.loss_scale.initial_scale_power == 12);
  CHECK(e.loss_scale.loss_scale_window == 500);
  CHECK(e.loss_scale.hysteresis == 3);
  CHECK(e.loss_scale.consecutive_hysteresis);
  CHECK(e.loss_scale.min_loss_scale == 0.5);

  CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK_FALSE(c.offload_optimizer.pin_memory);
  CHECK(c.offload_optimizer.buffer_count == 4);
  CHECK(c.offload_param.enabled());
  CHECK(c.offload_param.pin_memory);
  CHECK(c.offload_param.buffer_count == 6);
  CHECK(e.offload_optimizer.enabled);
  CHECK_FALSE(e.offload_optimizer.pin_memory);
  CHECK(e.offload_param.enabled);
  CHECK(e.offload_param.pin_memory);

  CHECK(c.optimizer.type == "AdamW");
  CHECK(c.optimizer.adam.lr == 6e-4);
  CHECK(c.optimizer.adam.beta2 == 0.95);
  CHECK(c.optimizer.adam.weight_decay == 0.1);
  CHECK(c.scheduler.type == LrScheduleType::kWarmupCosineLR);
  CHECK(c.scheduler.total_num_steps == 1000);
  CHECK(c.scheduler.warmup_num_steps == 100);

  CHECK(c.model.type == "gpt2");
  CHECK(c.model.preset == "gpt2");
  CHECK(c.model.n_layer == 6);
  CHECK_FALSE(c.model.n_head.has_value());
  CHECK(c.model.spec() == "gpt2:n_layer=6,seq_len=512");
  CHECK(c.model.activation_checkpointing);
  CHECK(c.model.init_from == "gpt2.safetensors");

  CHECK(c.data.train == "tok/train_*.bin");
  CHECK(c.data.val == "tok/val.bin");
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.data.seed == 7);
  CHECK(c.train.steps == 1000);
  CHECK(c.train.eval_interval == 100);
  CHECK(c.train.eval_batches == 4);
  CHECK(c.train.log_interval == 5);
  CHECK(c.train.sample_tokens == 64);

  CHECK(c.checkpoint.save_dir == "ckpt");
  CHECK(c.checkpoint.save_interval == 200);
  CHECK(c.checkpoint.keep_last == 2);
  CHECK(c.checkpoint.async);
  CHECK(c.checkpoint.loads_latest());
  CHECK(c.checkpoint.tag_validation == TagValidation::kFail);

  CHECK(c.device.type == DeviceChoice::kCpu);
  CHECK(c.device.memory_limit_gb == 1.5);
  CHECK(c.device.stream_delay_us == 20);
  CHECK(c.comm.timeout_s == 30.0);
  CHECK(c.comm.reduce_scatter_algo == ReduceScatterAlgo::kNative);
  CHECK(c.comm.max_chunk_bytes == 8 << 20);
  CHECK(c.comm.simulated_bandwidth_bytes_per_s == 12.5e9);
  CHECK(c.comm.simulated_latency_s == Approx(5e-6));
  CHECK(c.trace.enabled());
  CHECK(c.trace.path == "trace.json");
  CHECK(c.trace.first_step == 3);
  CHECK(c.trace.last_step == 4);
  CHECK(c.seed == 99);
  CHECK(c.output_dir == "runs/full");
  CHECK(c.log_level == "debug");
  // tag_validation "FAIL" is DeepSpeed's; it has no effect in zrt and says so.
  CHECK(has_warning(c, "checkpoint.tag_validation: accepted, but has no effect"));
  CHECK(c.document == doc);
}

TEST_CASE("defaults follow DeepSpeed and the docs", "[config]") {
  const Config c = parse_doc(json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "model": {"preset": "gpt2-tiny"},
    "data": {"train": "t.bin"},
    "train": {"steps": 10}
  })"),
                             3);
  CHECK(c.batch.train_batch_size == 6);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.batch.world_size == 3);
  const EngineOptions& e = c.engine;
  CHECK(e.stage == 0);
  CHECK(e.compute_dtype == DType::kFloat32);
  CHECK_FALSE(e.communication_dtype.has_value());
  CHECK(e.grad_accum_dtype == DType::kFloat32);
  CHECK(e.gradient_clipping == 0.0);
  CHECK(e.reduce_bucket_size == 500000000);
  CHECK(e.stage3_prefetch_bucket_size == 50000000);
  CHECK(e.stage3_param_persistence_threshold == 100000);
  CHECK(e.stage3_max_live_parameters == 1000000000);
  CHECK(e.stage3_max_reuse_distance == 0);  // zrt's default (DeepSpeed's is 1e9)
  CHECK(e.overlap_comm);
  CHECK(e.loss_scale.loss_scale == 0.0);
  CHECK(e.loss_scale.initial_scale_power == 16);
  CHECK(e.loss_scale.loss_scale_window == 1000);
  CHECK(e.loss_scale.hysteresis == 2);
  CHECK_FALSE(e.loss_scale.consecutive_hysteresis);
  CHECK(e.loss_scale.min_loss_scale == 1.0);
  CHECK_FALSE(c.offload_optimizer.enabled());
  CHECK_FALSE(c.offload_param.enabled());
  CHECK_FALSE(e.offload_optimizer.enabled);
  CHECK_FALSE(e.offload_param.enabled);
  CHECK(c.offload_optimizer.pin_memory);
  CHECK(c.offload_optimizer.buffer_count == 4);
  CHECK(c.offload_param.buffer_count == 5);
  CHECK(c.offload_param.buffer_size == 100000000);
  CHECK(c.offload_param.max_in_cpu == 1000000000);
  CHECK(c.optimizer.type == "AdamW");
  CHECK(c.optimizer.adam.lr == 1e-3);
  CHECK(c.scheduler.type == LrScheduleType::kConstant);
  CHECK(c.model.type == "gpt2");
  CHECK(c.model.spec() == "gpt2-tiny");
  CHECK_FALSE(c.model.activation_checkpointing);
  CHECK(c.data.val.empty());
  CHECK(c.data.shuffle);
  CHECK(c.data.seed == 1234);  // the top-level seed
  CHECK(c.train.eval_interval == 0);
  CHECK(c.train.eval_batches == 10);
  CHECK(c.train.log_interval == 10);
  CHECK(c.train.sample_tokens == 0);
  CHECK(c.checkpoint.save_dir == "output/checkpoints");
  CHECK_FALSE(c.checkpoint.saves());
  CHECK(c.checkpoint.load == "auto");  // resume when save_dir has a checkpoint
  CHECK_FALSE(c.checkpoint.overwrite);
  CHECK(c.checkpoint.tag_validation == TagValidation::kWarn);
  CHECK_FALSE(c.tensorboard.enabled);
  CHECK_FALSE(c.csv_monitor.enabled);
  CHECK(c.device.type == DeviceChoice::kAuto);
  CHECK(c.device.memory_limit_gb == 0.0);
  CHECK(c.comm.timeout_s == 600.0);
  CHECK(c.comm.reduce_scatter_algo == ReduceScatterAlgo::kAlltoall);
  CHECK(c.comm.max_chunk_bytes == 32 << 20);
  CHECK(c.comm.simulated_bandwidth_bytes_per_s == 0.0);
  CHECK_FALSE(c.trace.enabled());
  CHECK(c.seed == 1234);
  CHECK(c.output_dir == "output");
  CHECK(c.log_level == "info");
  CHECK(c.warnings.empty());
}

TEST_CASE("the batch rule solves any two keys for the third", "[config][batch]") {
  struct Case {
    const char* given;  // the three batch keys, as JSON members
    int world;
    std::int64_t train, micro;
    int accum;
  };
  const Case cases[] = {
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)",
       2, 16, 4, 2},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4)", 2, 16, 4, 2},
      {R"("train_batch_size": 16, "gradient_accumulation_steps": 4)", 2, 16, 2, 4},
      {R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3)", 2, 24, 4, 3},
      {R"("train_batch_size": 16)", 4, 16, 4, 1},
      {R"("train_micro_batch_size_per_gpu": 5)", 3, 15, 5, 1},
      // Hugging Face's "auto" is an unknown the rule solves.
      {R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)",
       2, 16, 4, 2},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2)",
       2, 16, 4, 2},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto")",
       2, 16, 4, 2},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto")",
       4, 16, 4, 1},
      // Integral floats are integers.
      {R"("train_batch_size": 1.6e1, "train_micro_batch_size_per_gpu": 4.0)", 1, 16, 4, 4},
      // world size 0: taken from the three numbers.
      {R"("train_batch_size": 24, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3)",
       0, 24, 2, 3},
  };
  for (const Case& k : cases) {
    const std::string text = std::string("{") + k.given +
                             R"(, "model": {"preset": "gpt2-tiny"}, "data": {"train": "t"},)"
                             R"( "train": {"steps": 1}})";
    INFO(text << " at world " << k.world);
    const Config c = parse_config_text(text, k.world, "batch.json");
    CHECK(c.batch.train_batch_size == k.train);
    CHECK(c.batch.micro_batch_size == k.micro);
    CHECK(c.batch.gradient_accumulation_steps == k.accum);
    CHECK(c.engine.gradient_accumulation_steps == k.accum);
    CHECK(c.batch.world_size * c.batch.micro_batch_size * c.batch.gradient_accumulation_steps ==
          c.batch.train_batch_size);
  }
}

TEST_CASE("batch rule errors", "[config][batch]") {
  struct Case {
    const char* given;
    int world;
    const char* message;
  };
  const Case cases[] = {
      {R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)",
       2,
       "b.json: train_batch_size 32 is not micro 4 × accumulation 2 × world 2 = 16: set "
       "train_batch_size 16, or gradient_accumulation_steps 4, or train_micro_batch_size_per_gpu "
       "8, or leave one of the three out to have it derived"},
      {R"("train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2)",
       4,
       "b.json: train_batch_size 8 is not micro 2 × accumulation 2 × world 4 = 16: set "
       "train_batch_size 16, or gradient_accumulation_steps 1, or train_micro_batch_size_per_gpu "
       "1, or leave one of the three out to have it derived"},
      {R"("train_batch_size": 6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2)",
       2,
       "b.json: train_batch_size 6 is not micro 2 × accumulation 2 × world 2 = 8: set "
       "train_batch_size 8, or leave one of the three out to have it derived"},
      {R"("train_batch_size": 10, "train_micro_batch_size_per_gpu": 2)", 2,
       "b.json: train_batch_size 10 is not divisible by micro 2 × world 2 = 4; set "
       "train_batch_size to a multiple of 4 (8 or 12)"},
      {R"("train_batch_size": 12, "gradient_accumulation_steps": 5)", 2,
       "b.json: train_batch_size 12 is not divisible by accumulation 5 × world 2 = 10; set "
       "train_batch_size to a multiple of 10 (10 or 20)"},
      {R"("train_batch_size": 6)", 4,
       "b.json: train_batch_size 6 is not divisible by world 4; set train_batch_size to a "
       "multiple of 4 (4 or 8)"},
      {R"("gradient_accumulation_steps": 4)", 2,
       "b.json: no batch size: give train_batch_size or train_micro_batch_size_per_gpu as a "
       "number (\"auto\" counts as not given)"},
      {R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1)",
       2,
       "b.json: no batch size: give train_batch_size or train_micro_batch_size_per_gpu as a "
       "number (\"auto\" counts as not given)"},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4)", 0,
       "b.json: without a world size, train_batch_size, train_micro_batch_size_per_gpu and "
       "gradient_accumulation_steps must all be numbers (the world size is their quotient)"},
      {R"("train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1)",
       0, "b.json: train_batch_size 10 is not a multiple of micro 4 × accumulation 1 = 4"},
  };
  for (const Case& k : cases) {
    const std::string text = std::string("{") + k.given +
                             R"(, "model": {"preset": "gpt2-tiny"}, "data": {"train": "t"},)"
                             R"( "train": {"steps": 1}})";
    INFO(text << " at world " << k.world);
    std::string message = "(no error)";
    try {
      parse_config_text(text, k.world, "b.json");
    } catch (const InvalidArgument& e) {
      message = e.what();
    }
    CHECK(message == k.message);
  }
}

TEST_CASE("\"auto\" elsewhere: defaults where clear, an error otherwise", "[config][auto]") {
  const Config c = parse_doc(patched(R"({
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
      "stage3_max_live_parameters": "auto", "stage3_max_reuse_distance": "auto",
      "sub_group_size": "auto", "stage3_gather_16bit_weights_on_model_save": "auto",
      "overlap_comm": "auto"},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}
  })"));
  CHECK(c.engine.reduce_bucket_size == 500000000);
  CHECK(c.engine.stage3_prefetch_bucket_size == 50000000);
  CHECK(c.engine.stage3_param_persistence_threshold == 100000);
  CHECK(c.engine.stage3_max_live_parameters == 1000000000);
  CHECK(c.engine.stage3_max_reuse_distance == 0);  // "auto": zrt's default
  CHECK(c.engine.overlap_comm);
  CHECK(c.scheduler.total_num_steps == 100);  // train.steps
  CHECK(c.warnings.empty());
  CHECK(error_of(patched(R"({"gradient_clipping": "auto"})").dump()) ==
        "bad.json: gradient_clipping: \"auto\" is filled in by Hugging Face's Trainer and has no "
        "meaning in zrt here; expected a number >= 0");
  CHECK(error_of(patched(R"({"fp16": {"enabled": "auto"}})").dump()) ==
        "bad.json: fp16.enabled: \"auto\" is filled in by Hugging Face's Trainer and has no "
        "meaning in zrt here; expected true or false");
  // "auto" is an ordinary value of device.type.
  CHECK(parse_doc(patched(R"({"device": {"type": "auto"}})")).device.type == DeviceChoice::kAuto);
}

// One bad config: `text` is either a merge patch of base_config() (patch = true) or the whole
// file; `message` is the exact error.
struct BadConfig {
  const char* what;
  bool patch;
  std::string_view text;  // a view, so a text may hold a NUL byte
  const char* message;
};

const BadConfig kBadConfigs[] = {
    // JSON syntax, with line and column.
    {"syntax: missing value", false, "{\n  \"seed\": 1,\n  \"model\": }\n",
     "bad.json:3:12: JSON syntax error while parsing value - unexpected '}'; expected '[', '{', "
     "or a literal"},
    {"syntax: trailing comma", false, "{\"seed\": 1,}",
     "bad.json:1:12: JSON syntax error while parsing object key - unexpected '}'; expected "
     "string literal"},
    {"syntax: missing comma", false, "{\n  \"seed\": 1\n  \"output_dir\": \"x\"\n}",
     "bad.json:3:14: JSON syntax error while parsing object - unexpected string literal; "
     "expected '}'"},
    {"syntax: empty file", false, "",
     "bad.json:1:1: JSON syntax error while parsing value - unexpected end of input; expected "
     "'[', '{', or a literal"},
    {"not an object", false, "[1, 2]", "bad.json: the config must be a JSON object, not [1,2]"},
    // Found by fuzz_config: nlohmann's parser stops at a NUL byte and accepted what preceded it.
    {"NUL byte after a value", false, std::string_view("9\0\"\xeb\": 1", 8),
     "bad.json:1:2: JSON syntax error: a NUL byte (is this a binary file?)"},
    // Found by fuzz_config: nlohmann throws out_of_range, not parse_error, for this number.
    {"number beyond a double", false, "{\"seed\": 1e999}",
     "bad.json:1:10: JSON number out of range: 1e999"},
    // Duplicate keys, at any depth.
    {"duplicate top-level key", false, "{\n  \"seed\": 1,\n  \"seed\": 2\n}",
     "bad.json:3:3: duplicate key 'seed' (first on line 2)"},
    {"duplicate nested key", false,
     "{\"zero_optimization\": {\n    \"stage\": 1,\n    \"overlap_comm\": true,\n"
     "    \"stage\": 2}}",
     "bad.json:4:5: duplicate key 'zero_optimization.stage' (first on line 2)"},
    {"duplicate key in an array element", false, "{\"x\": [{\"a\": 1}, {\"b\": 1, \"b\": 2}]}",
     "bad.json:1:27: duplicate key 'x[1].b' (first on line 1)"},
    // Unknown keys, with the closest valid key, at several depths.
    {"unknown top-level key", true, R"({"zero_optimisation": {"stage": 1}})",
     "bad.json: zero_optimisation: unknown key; did you mean 'zero_optimization'?"},
    {"unknown key at depth 2", true, R"({"zero_optimization": {"stge": 2}})",
     "bad.json: zero_optimization.stge: unknown key; did you mean 'stage'?"},
    {"unknown key at depth 3", true,
     R"({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}})",
     "bad.json: zero_optimization.offload_optimizer.devise: unknown key; did you mean "
     "'device'?"},
    {"unknown optimizer param", true, R"({"optimizer": {"params": {"lrr": 0.1}}})",
     "bad.json: optimizer.params.lrr: unknown key; did you mean 'lr'?"},
    {"key in the wrong block", true, R"({"stage": 2})",
     "bad.json: stage: unknown key; did you mean 'zero_optimization.stage'?"},
    {"key of several blocks in the wrong one", true, R"({"zero_optimization": {"enabled": true}})",
     "bad.json: zero_optimization.enabled: unknown key (docs/config-keys.md lists the valid "
     "keys)"},
    // Another framework's name for a zrt setting: zrt's key, wherever it was written.
    {"DeepSpeed's ep_size in expert_parallel", true, R"({"expert_parallel": {"ep_size": 2}})",
     "bad.json: expert_parallel.ep_size: unknown key; did you mean "
     "'expert_parallel.autoep_size'? (ep_size is DeepSpeed's MoE layer argument)"},
    {"Megatron's context parallelism at the top level", true, R"({"context_parallel_size": 2})",
     "bad.json: context_parallel_size: unknown key; did you mean 'sequence_parallel_size'? "
     "(context_parallel_size is ring-attention context parallelism; zrt splits the sequence "
     "with DeepSpeed Ulysses (sequence_parallel_size must divide the head count))"},
    {"Hugging Face's max_grad_norm", true, R"({"max_grad_norm": 1.0})",
     "bad.json: max_grad_norm: unknown key; did you mean 'gradient_clipping'? (max_grad_norm is "
     "Hugging Face TrainingArguments')"},
    {"unknown key without a close one", true, R"({"model": {"dropout": 0.1}})",
     "bad.json: model.dropout: unknown key (docs/config-keys.md lists the valid keys)"},
    // Wrong types and values out of range, with the expected form.
    {"bool written as a string", true, R"({"bf16": {"enabled": "true"}})",
     "bad.json: bf16.enabled: expected true or false, got \"true\""},
    {"bool written as a number", true, R"({"zero_optimization": {"overlap_comm": 1}})",
     "bad.json: zero_optimization.overlap_comm: expected true or false or \"auto\", got 1"},
    {"fractional integer", true, R"({"train_micro_batch_size_per_gpu": 2.5})",
     "bad.json: train_micro_batch_size_per_gpu: expected an integer >= 1 or \"auto\", got 2.5"},
    {"integer too large for 64 bits", true,
     R"({"zero_optimization": {"reduce_bucket_size": 1e30}})",
     "bad.json: zero_optimization.reduce_bucket_size: expected an integer >= 1 or \"auto\", got "
     "1e+30"},
    {"stage outside 0-3", true, R"({"zero_optimization": {"stage": 4}})",
     "bad.json: zero_optimization.stage: 4 is out of range; expected an integer in [0, 3]"},
    {"negative clipping", true, R"({"gradient_clipping": -1})",
     "bad.json: gradient_clipping: -1 is out of range; expected a number >= 0"},
    {"enum value", true, R"({"device": {"type": "gpu"}})",
     "bad.json: device.type: expected one of \"cpu\", \"cuda\", \"auto\", got \"gpu\""},
    {"enum value in the wrong case", true,
     R"({"zero_optimization": {"offload_optimizer": {"device": "CPU"}}})",
     "bad.json: zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", "
     "\"nvme\", got \"CPU\"; did you mean \"cpu\"?"},
    {"string expected", true, R"({"data": {"train": 5}})",
     "bad.json: data.train: expected a string, got 5"},
    {"object expected", true, R"({"fp16": true})", "bad.json: fp16: expected an object, got true"},
    {"betas not a pair", true, R"({"optimizer": {"params": {"betas": [0.9]}}})",
     "bad.json: optimizer.params.betas: expected a list of two numbers in [0, 1], got [0.9]"},
    {"\"auto\" without a meaning", true, R"({"optimizer": {"params": {"lr": "auto"}}})",
     "bad.json: optimizer.params.lr: \"auto\" is filled in by Hugging Face's Trainer and has no "
     "meaning in zrt here; expected a number >= 0"},
    {"dtype name", true, R"({"communication_data_type": "float16"})",
     "bad.json: communication_data_type: expected one of \"fp32\", \"bf16\", \"fp16\", got "
     "\"float16\""},
    // Impossible combinations.
    {"fp16 and bf16", true, R"({"fp16": {"enabled": true}})",
     "bad.json: fp16.enabled and bf16.enabled are both true; choose one"},
    {"offload_param below stage 3", true,
     R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"},
                               "offload_param": {"device": "cpu"}}})",
     "bad.json: zero_optimization.offload_param: parameter offload needs ZeRO stage 3 (stage is "
     "2); set stage 3 or offload_param.device none"},
    {"mics_shard_size not dividing the world", true,
     R"({"zero_optimization": {"stage": 3, "mics_shard_size": 3}})",
     "bad.json: zero_optimization.mics_shard_size: 3 does not divide the world size 2: shard "
     "groups are equal blocks of consecutive ranks (e.g. the ranks of one node)"},
    {"model.frozen and model.trainable together", true,
     R"({"model": {"frozen": ["model.embed_tokens.weight"], "trainable": ["mlp"]}})",
     "bad.json: model.trainable: given with model.frozen: name the parameters to train "
     "(model.trainable) or those to freeze (model.frozen), not both"},
    {"model.trainable empty", true, R"({"model": {"trainable": []}})",
     "bad.json: model.trainable: [] trains nothing: name the parameters to train, or remove the "
     "key to train all"},
    {"model.frozen with an empty pattern", true, R"({"model": {"frozen": ["mlp", ""]}})",
     "bad.json: model.frozen[1]: an empty pattern matches no parameter"},
    {"model.frozen as a string", true, R"({"model": {"frozen": "mlp"}})",
     "bad.json: model.frozen: expected a list of strings, got \"mlp\""},
    {"mics_shard_size at stage 0", true,
     R"({"zero_optimization": {"stage": 0, "mics_shard_size": 1}})",
     "bad.json: zero_optimization.mics_shard_size: hierarchical sharding needs ZeRO stage 1, 2 "
     "or 3 (stage is 0); set a stage or mics_shard_size -1"},
    {"mics_shard_size 0", true, R"({"zero_optimization": {"stage": 3, "mics_shard_size": 0}})",
     "bad.json: zero_optimization.mics_shard_size: 0 is not a group size; give the ranks per "
     "shard group, or -1 to shard over every rank"},
    {"offload_optimizer at stage 0", true,
     R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
     "bad.json: zero_optimization.offload_optimizer: optimizer offload needs ZeRO stage 1, 2 or "
     "3 (stage is 0); set a stage or offload_optimizer.device none"},
    {"offload_param without offload_optimizer", true,
     R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})",
     "bad.json: zero_optimization.offload_param: parameter offload needs offload_optimizer too "
     "(zrt keeps offloaded parameter slices beside the optimizer state in host memory)"},
    {"partial offload below stage 3", true,
     R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
     "bad.json: zero_optimization.offload_optimizer.ratio: partial optimizer offload (ratio < 1) "
     "needs ZeRO stage 3 (stage is 2); set stage 3 or ratio 1"},
    {"partial offload with parameter offload", true,
     R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5},
                               "offload_param": {"device": "cpu"}}})",
     "bad.json: zero_optimization.offload_optimizer.ratio: partial optimizer offload (ratio < 1) "
     "with offload_param is not supported: parameter offload keeps every unit's state in host "
     "memory; set ratio 1"},
    {"offload ratio above 1", true,
     R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
     "bad.json: zero_optimization.offload_optimizer.ratio: 1.5 is out of range; expected a "
     "number in [0, 1]"},
    {"nvme without nvme_path", true,
     R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
     "bad.json: zero_optimization.offload_param.device: nvme offload is not implemented; use "
     "\"cpu\""},
    {"accumulation in another 16-bit type", true, R"({"data_types": {"grad_accum_dtype": "fp16"}})",
     "bad.json: data_types.grad_accum_dtype: fp16 accumulation with bf16 compute; accumulate in "
     "fp32 or the compute dtype"},
    {"evaluation without validation data", true, R"({"data": {"val": null}})",
     "bad.json: train.eval_interval: evaluation every 50 steps needs data.val"},
    {"bf16 under both names", true, R"({"bfloat16": {"enabled": true}})",
     "bad.json: bfloat16: give bf16 or its old name bfloat16, not both"},
    {"min_loss_scale above the initial scale", true,
     R"({"bf16": null, "fp16": {"enabled": true, "initial_scale_power": 2, "min_loss_scale": 8}})",
     "bad.json: fp16.min_loss_scale: 8 exceeds the initial scale 2^2 = 4"},
    {"trace steps reversed", true, R"({"trace": {"path": "t.json", "steps": [5, 3]}})",
     "bad.json: trace.steps: [5,3]: the first step is after the last"},
    {"stream delay on cuda", true, R"({"device": {"type": "cuda", "stream_delay_us": 10}})",
     "bad.json: device.stream_delay_us: stream delays exist on the CPU backend only (device.type "
     "is cuda)"},
    {"n_embd not a multiple of n_head", true, R"({"model": {"n_head": 5, "n_embd": 64}})",
     "bad.json: model.n_embd: 64 is not a multiple of n_head 5"},
    {"no preset and missing dimensions", true, R"({"model": {"preset": null, "n_layer": 2}})",
     "bad.json: model: without a preset, n_layer, n_head, n_embd, vocab_size and seq_len are "
     "required (missing: n_head, n_embd, vocab_size, seq_len)"},
    {"missing model", true, R"({"model": null})",
     "bad.json: model: required block is missing (e.g. \"model\": {\"preset\": \"gpt2-tiny\"})"},
    {"missing train.steps", true, R"({"train": {"steps": null}})",
     "bad.json: train.steps: required: the number of optimizer steps"},
    {"missing data.train", true, R"({"data": {"train": null}})",
     "bad.json: data.train: required: a token file path or glob"},
    // DeepSpeed features zrt does not implement: never silently ignored.
    {"nvme offload", true,
     R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}})",
     "bad.json: zero_optimization.offload_optimizer.device: nvme offload is not implemented; "
     "use \"cpu\""},
    {"pipeline parallelism", true, R"({"pipeline": {"stages": 2}})",
     "bad.json: pipeline: not implemented by zrt (Pipeline parallelism); remove the key"},
    {"mixture of experts", true, R"({"moe": {"num_experts": 8}})",
     "bad.json: moe: not implemented by zrt (Mixture of experts: not a DeepSpeed config key, "
     "reserved so MoE settings fail loudly); remove the key"},
    {"enabled DeepSpeed feature block", true, R"({"progressive_layer_drop": {"enabled": true}})",
     "bad.json: progressive_layer_drop: not implemented by zrt (Progressive layer dropping); "
     "remove the block or set \"enabled\": false"},
    {"amsgrad", true, R"({"optimizer": {"params": {"amsgrad": true}}})",
     "bad.json: optimizer.params.amsgrad: not implemented by zrt (The AMSGrad variant of Adam); "
     "remove the key or set it to false"},
    {"ZeRO++ hpZ below stage 3", true, R"({"zero_optimization": {"zero_hpz_partition_size": 2}})",
     "bad.json: zero_optimization.zero_hpz_partition_size: hpZ keeps secondary shards of stage "
     "3's gathered parameters (stage is 2); set stage 3 or zero_hpz_partition_size 1"},
    {"ZeRO++ hpZ not dividing the world", true,
     R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})",
     "bad.json: zero_optimization.zero_hpz_partition_size: 3 does not divide the world size 2: "
     "hpZ groups are equal blocks of consecutive ranks (the ranks of one node)"},
    {"ZeRO++ qwZ below stage 3", true, R"({"zero_optimization": {"zero_quantized_weights": true}})",
     "bad.json: zero_optimization.zero_quantized_weights: qwZ quantizes stage 3's parameter "
     "gathers (stage is 2); set stage 3 or zero_quantized_weights false"},
    {"fp16 auto_cast", true, R"({"fp16": {"auto_cast": true}})",
     "bad.json: fp16.auto_cast: not implemented by zrt (Cast module inputs to fp16 "
     "automatically); remove the key or set it to false"},
    {"gradient sum", true, R"({"gradient_allreduce_op": "sum"})",
     "bad.json: gradient_allreduce_op: not implemented by zrt (Average (mean) or sum gradients "
     "over ranks; zrt averages); remove the key or set it to \"mean\""},
    {"unsupported optimizer", true, R"({"optimizer": {"type": "Lamb"}})",
     "bad.json: optimizer type 'Lamb' is not supported by zrt; supported types: Adam, AdamW, Lion"},
    {"comm timeout under both names", true, R"({"comm_timeout_s": 30, "comm": {"timeout_s": 60}})",
     "bad.json: comm_timeout_s: give comm_timeout_s or comm.timeout_s, not both"},
    {"comm timeout of zero", true, R"({"comm_timeout_s": 0})",
     "bad.json: comm_timeout_s: 0 is out of range; expected a number >= 0.001"},
    {"comm timeout as a string", true, R"({"comm": {"timeout_s": "10m"}})",
     "bad.json: comm.timeout_s: expected a number >= 0.001, got \"10m\""},
    {"scheduler without total_num_steps", true,
     R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}}})",
     "bad.json: scheduler.params.total_num_steps is required for WarmupCosineLR"},
};

TEST_CASE("bad configs fail with a message naming the key", "[config][errors]") {
  STATIC_REQUIRE(sizeof(kBadConfigs) / sizeof(kBadConfigs[0]) >= 30);
  for (const BadConfig& bad : kBadConfigs) {
    const std::string text =
        bad.patch ? patched(std::string(bad.text).c_str()).dump(2) : std::string(bad.text);
    INFO(bad.what << "\n" << text);
    CHECK(error_of(text) == bad.message);
  }
}

// Every line of an error message.
std::vector<std::string> lines_of(const std::string& message) {
  std::vector<std::string> lines;
  std::istringstream in(message);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_CASE("a Hugging Face DeepSpeed config reports every problem in one throw, in order",
          "[config][errors][all]") {
  // Hugging Face's ds_config_zero2.json as the docs give it ("auto" everywhere the Trainer
  // fills in), with the blocks zrt needs added and a few mistakes a new user makes: NVMe
  // offload, a typo, a zero sequence length, evaluation without validation data.
  const std::string text = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2,
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
                                                "pin_memory": true},
                          "allgather_partitions": true, "allgather_bucket_size": 2e8,
                          "overlap_comm": true, "reduce_scatter": true,
                          "reduce_bucket_size": 2e8, "contiguous_gradients": true,
                          "round_robin_gradient": true},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 4,
    "wall_clock_breakdown": false,
    "model": {"preset": "gpt2", "seq_len": 0},
    "data": {"train": "data/train_*.bin"},
    "train": {"steps": 100, "eval_interval": 10}
  })";
  const std::string auto_error =
      ": \"auto\" is filled in by Hugging Face's Trainer and has no meaning in zrt here; "
      "expected ";
  const std::vector<std::string> expected = {
      // Unsupported features first (found late, while reading the offload block).
      "ds.json: zero_optimization.offload_optimizer.device: nvme offload is not implemented; "
      "use \"cpu\"",
      // Unknown keys.
      "ds.json: zero_optimization.round_robin_gradient: unknown key; did you mean "
      "'round_robin_gradients'?",
      // Wrong values, every "auto" that needs a value among them.
      "ds.json: fp16.enabled" + auto_error + "true or false",
      "ds.json: gradient_clipping" + auto_error + "a number >= 0",
      "ds.json: model.seq_len: 0 is out of range; expected an integer >= 1",
      "ds.json: optimizer.params.betas" + auto_error + "a list of two numbers in [0, 1]",
      "ds.json: optimizer.params.eps" + auto_error + "a number >= 0",
      "ds.json: optimizer.params.lr" + auto_error + "a number >= 0",
      "ds.json: optimizer.params.weight_decay" + auto_error + "a number >= 0",
      "ds.json: scheduler.params.warmup_max_lr" + auto_error + "a number >= 0",
      "ds.json: scheduler.params.warmup_min_lr" + auto_error + "a number >= 0",
      "ds.json: scheduler.params.warmup_num_steps" + auto_error + "an integer >= 0",
      // Combinations last.
      "ds.json: train.eval_interval: evaluation every 10 steps needs data.val",
  };
  std::string message = "(no error)";
  try {
    parse_config_text(text, 2, "ds.json");
  } catch (const InvalidArgument& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(lines_of(message) == expected);
}

TEST_CASE("an unsupported optimizer or schedule is reported, not its parameters",
          "[config][errors][all]") {
  // Lamb's own parameters are unknown keys to zrt; naming them first would send the user
  // fixing keys of an optimizer zrt does not have.
  CHECK(error_of(patched(R"({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3,
          "max_coeff": 10.0, "min_coeff": 0.01, "weight_decay": 0.01, "bias_correction": 1}}})")
                     .dump()) ==
        "bad.json: optimizer type 'Lamb' is not supported by zrt; supported types: Adam, AdamW, "
        "Lion");
  CHECK(error_of(patched(R"({"scheduler": {"type": "OneCycle", "params": {
          "cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "cycle_first_step_size": 1000}}})")
                     .dump()) ==
        "bad.json: scheduler type 'OneCycle' is not supported by zrt; supported types: "
        "WarmupLR, WarmupDecayLR, WarmupCosineLR");
  // Other problems of the file are still reported, after it.
  CHECK(lines_of(error_of(patched(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 10}},
                                      "zero_optimization": {"stge": 1}})")
                              .dump())) ==
        std::vector<std::string>{
            "bad.json: optimizer type 'Lamb' is not supported by zrt; supported types: Adam, "
            "AdamW, Lion",
            "bad.json: zero_optimization.stge: unknown key; did you mean 'stage'?"});
}

TEST_CASE("every \"auto\" without a meaning is listed", "[config][errors][all][auto]") {
  const std::vector<std::string> lines = lines_of(error_of(patched(R"({
    "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
    "optimizer": {"params": {"lr": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"reduce_bucket_size": "auto"}
  })")
                                                               .dump()));
  // The batch keys and reduce_bucket_size have a rule; the other four each need a value.
  const std::vector<std::string> keys = {"bf16.enabled", "gradient_clipping", "optimizer.params.lr",
                                         "optimizer.params.weight_decay"};
  REQUIRE(lines.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK_THAT(lines[i], Catch::StartsWith("bad.json: " + keys[i] + ": \"auto\" is filled in"));
  }
}

TEST_CASE("a rejected value is not reported again through what depends on it",
          "[config][errors][all]") {
  struct Case {
    const char* what;
    const char* patch;
    std::vector<std::string> lines;
  };
  const Case cases[] = {
      {"stage out of range: no offload-needs-stage error",
       R"({"zero_optimization": {"stage": 4, "offload_optimizer": {"device": "cpu"},
                                 "offload_param": {"device": "cpu"}}})",
       {"bad.json: zero_optimization.stage: 4 is out of range; expected an integer in [0, 3]"}},
      {"a typo of a batch key: no batch-rule error",
       R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": null,
           "train_micro_batch_size_per_gp": 2})",
       {"bad.json: train_micro_batch_size_per_gp: unknown key; did you mean "
        "'train_micro_batch_size_per_gpu'?"}},
      {"Megatron's batch names: zrt's keys, and no batch-rule error",
       R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": null,
           "gradient_accumulation_steps": null, "global_batch_size": 32, "micro_batch_size": 4})",
       {"bad.json: global_batch_size: unknown key; did you mean 'train_batch_size'? "
        "(global_batch_size is Megatron's --global-batch-size)",
        "bad.json: micro_batch_size: unknown key; did you mean "
        "'train_micro_batch_size_per_gpu'? (micro_batch_size is Megatron's --micro-batch-size)"}},
      {"a block of the wrong form: not also missing",
       R"({"model": "gpt2", "train": {"stpes": 10, "steps": null}})",
       {"bad.json: train.stpes: unknown key; did you mean 'steps'?",
        "bad.json: model: expected an object, got \"gpt2\""}},
      {"a bad fp16 switch: no accumulation-dtype conflict",
       R"({"bf16": null, "fp16": {"enabled": "yes"}, "data_types": {"grad_accum_dtype": "fp16"}})",
       {"bad.json: fp16.enabled: expected true or false, got \"yes\""}},
      {"zero heads: out of range only (n_embd % n_head once divided by zero)",
       R"({"model": {"preset": null, "n_layer": 2, "n_head": 0, "n_embd": 64, "vocab_size": 100,
                     "seq_len": 16}})",
       {"bad.json: model.n_head: 0 is out of range; expected an integer >= 1"}},
      {"two real combination problems are both reported",
       R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})",
       {"bad.json: zero_optimization.offload_param: parameter offload needs ZeRO stage 3 (stage "
        "is 2); set stage 3 or offload_param.device none",
        "bad.json: zero_optimization.offload_param: parameter offload needs offload_optimizer "
        "too (zrt keeps offloaded parameter slices beside the optimizer state in host memory)"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    CHECK(lines_of(error_of(patched(c.patch).dump())) == c.lines);
  }
}

TEST_CASE("command-line overrides set keys and are validated like the file",
          "[config][overrides]") {
  json doc = base_config();
  const std::vector<std::string> paths =
      apply_overrides(doc, {{"train.steps", "5"},
                            {"train.eval_interval", "0"},
                            {"zero_optimization.offload_optimizer", R"({"device": "cpu"})"},
                            {"optimizer.params.betas", "[0.8, 0.9]"},
                            {"checkpoint.load", "100"},  // a string key keeps its text: tag "100"
                            {"data.val", "null"},        // null: the default
                            {"trace.path", "runs/trace.json"},
                            {"fp16.enabled", "false"},
                            {"device.memory_limit_gb", "1.5"}});
  // The paths set, and the blocks base_config() lacks, created on the way.
  CHECK(paths == std::vector<std::string>{
                     "train.steps", "train.eval_interval", "zero_optimization.offload_optimizer",
                     "optimizer.params.betas", "checkpoint", "checkpoint.load", "data.val", "trace",
                     "trace.path", "fp16", "fp16.enabled", "device", "device.memory_limit_gb"});
  CHECK(doc["checkpoint"]["load"] == "100");  // created the block
  const Config c = parse_config(doc, 2, "run.json", paths);
  CHECK(c.train.steps == 5);
  CHECK(c.offload_optimizer.enabled());
  CHECK(c.optimizer.adam.beta1 == 0.8);
  CHECK(c.optimizer.adam.beta2 == 0.9);
  CHECK(c.checkpoint.load == "100");
  CHECK(c.data.val.empty());
  CHECK(c.trace.path == "runs/trace.json");
  CHECK(c.device.memory_limit_gb == 1.5);
  CHECK(c.document["train"]["steps"] == 5);  // the document as run

  // Later overrides win; a non-block on the way is replaced.
  json again = base_config();
  apply_overrides(again, {{"train.steps", "5"},
                          {"train.steps", "6"},
                          {"model", "null"},
                          {"model.preset", "gpt2-tiny"}});
  CHECK(again["train"]["steps"] == 6);
  CHECK(again["model"] == json::parse(R"({"preset": "gpt2-tiny"})"));

  // Problems with command-line values name the option; those of the file, the file.
  const auto error_with = [](const ConfigOverrides& overrides, const char* patch = "{}") {
    json d = patched(patch);
    try {
      const std::vector<std::string> set = apply_overrides(d, overrides);
      parse_config(d, 2, "run.json", set);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error_with({{"train.stpes", "5"}}) == "--train.stpes: unknown key; did you mean 'steps'?");
  CHECK(error_with({{"zero_optimization.stage", "three"}}) ==
        "--zero_optimization.stage: expected an integer in [0, 3], got \"three\"");
  CHECK(error_with({{"zero_optimization", R"({"stage": 9})"}}) ==
        "--zero_optimization.stage: 9 is out of range; expected an integer in [0, 3]");
  CHECK(error_with({{"optimizer.type", "Lamb"}}) ==
        "--optimizer.type: optimizer type 'Lamb' is not supported by zrt; supported types: "
        "Adam, AdamW, Lion");
  // Within a kind, problems come in key order, wherever each value came from.
  CHECK(lines_of(error_with({{"train.stpes", "5"}}, R"({"zero_optimization": {"stge": 1}})")) ==
        std::vector<std::string>{
            "--train.stpes: unknown key; did you mean 'steps'?",
            "run.json: zero_optimization.stge: unknown key; did you mean 'stage'?"});
  // A top-level key put in a block: the key it is.
  CHECK(error_with({{"zero_optimization.sequence_parallel_size", "2"}}) ==
        "--zero_optimization.sequence_parallel_size: unknown key; did you mean "
        "'sequence_parallel_size'?");
  // A misspelt block is the command line's too, not the file's.
  CHECK_THAT(error_with({{"expert_paralel.autoep_size", "2"}}),
             Catch::StartsWith("--expert_paralel: unknown key"));
  CHECK_THAT(error_with({{"trian.steps", "5"}}), Catch::StartsWith("--trian: unknown key"));
  CHECK_THAT(error_with({{"train..steps", "5"}}),
             Catch::StartsWith("--train..steps: not a config key path"));
  CHECK_THAT(error_with({{"", "5"}}), Catch::StartsWith("--: not a config key path"));
}

TEST_CASE("the resolved document is a config that gives the same run", "[config][resolved]") {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(std::string(ZRT_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  REQUIRE_FALSE(files.empty());
  for (const fs::path& file : files) {
    INFO(file.string());
    const Config c = load_config(file.string(), 0);
    const json resolved = resolved_document(c);
    // Defaults filled in and the batch rule solved.
    CHECK(resolved["train_batch_size"] == c.batch.train_batch_size);
    CHECK(resolved["gradient_accumulation_steps"] == c.batch.gradient_accumulation_steps);
    CHECK(resolved["comm"]["timeout_s"] == c.comm.timeout_s);
    CHECK(resolved["optimizer"]["params"]["eps"] == c.optimizer.adam.eps);
    const Config again = parse_config(resolved, c.batch.world_size, "resolved.json");
    CHECK(again.warnings.empty());
    CHECK(resolved_document(again) == resolved);
  }
}

// The expert-parallel groups are cut from the data-parallel ranks, world / sp of them: the
// config check counts those (it once counted the world, let ep 8 pass at 8 ranks with sp 2 and
// named the world "the data-parallel degree"), and the resolved document keeps sp and ep (it
// once dropped sequence_parallel_size, so rerunning it trained at sp 1).
TEST_CASE("expert parallelism under sequence parallelism: the data-parallel degree, resolved",
          "[config][expert_parallel][resolved]") {
  json doc = patched(R"({"train_batch_size": 16,
      "sequence_parallel_size": 2,
      "expert_parallel": {"enabled": true, "autoep_size": 8},
      "model": {"type": "qwen3_moe", "preset": "qwen3-moe-tiny"}})");
  CHECK_THAT(error_of(doc.dump(), 8),
             Catch::Contains("bad.json: expert_parallel.autoep_size: 8 does not divide the "
                             "data-parallel degree 4 (world 8 / sequence_parallel_size 2)"));
  doc["train_batch_size"] = 12;
  doc["expert_parallel"]["autoep_size"] = 2;
  CHECK_THAT(error_of(doc.dump(), 6),
             Catch::Contains("autoep_size: 2 does not divide the data-parallel degree 3 (world 6 / "
                             "sequence_parallel_size 2)"));
  doc["train_batch_size"] = 16;
  const Config c = parse_doc(doc, 8);
  CHECK(c.engine.sequence_parallel_size == 2);
  CHECK(c.engine.expert_parallel_size == 2);
  const json resolved = resolved_document(c);
  CHECK(resolved["sequence_parallel_size"] == 2);
  const Config again = parse_config(resolved, 8, "resolved.json");
  CHECK(again.engine.sequence_parallel_size == 2);
  CHECK(again.engine.expert_parallel_size == 2);
  CHECK(again.batch.train_batch_size == 16);
  CHECK(resolved_document(again) == resolved);
}

TEST_CASE("harmless DeepSpeed keys are accepted with a warning; off values silently",
          "[config][warnings]") {
  const Config quiet = parse_doc(patched(R"({
    "wall_clock_breakdown": false, "steps_per_print": 10, "tensorboard": {"enabled": false},
    "fp16": {"enabled": false, "auto_cast": false}, "amp": {"enabled": false},
    "zero_optimization": {"contiguous_gradients": true, "reduce_scatter": true,
                          "allgather_bucket_size": 5e8, "round_robin_gradients": false},
    "checkpoint": {"tag_validation": "warn"}, "pipeline": {}, "aio": {}
  })"));
  CHECK(quiet.warnings.empty());

  const Config loud = parse_doc(patched(R"({
    "wall_clock_breakdown": true, "steps_per_print": 100, "wandb": {"enabled": true},
    "zero_optimization": {"contiguous_gradients": false, "allgather_bucket_size": 2e8,
                          "stage3_prefetch_bucket_size": 1e6},
    "activation_checkpointing": {"partition_activations": true, "profile": false}
  })"));
  const char* expected[] = {
      "wall_clock_breakdown: accepted, but has no effect in zrt",
      "steps_per_print: accepted, but has no effect in zrt",
      "wandb: accepted, but has no effect in zrt",
      "zero_optimization.contiguous_gradients: accepted, but has no effect in zrt",
      "zero_optimization.allgather_bucket_size: accepted, but has no effect in zrt",
      "zero_optimization.stage3_prefetch_bucket_size: only used at stage 3 (stage is 2)",
      "activation_checkpointing.partition_activations: accepted, but has no effect in zrt",
  };
  for (const char* w : expected) {
    INFO(w);
    CHECK(has_warning(loud, w));
  }
  CHECK(loud.warnings.size() == sizeof(expected) / sizeof(expected[0]));
  const std::string full =
      "wall_clock_breakdown: accepted, but has no effect in zrt (DeepSpeed timers; use trace "
      "for timings)";
  CHECK(std::count(loud.warnings.begin(), loud.warnings.end(), full) == 1);
}

// The optimizer and scheduler blocks' warnings reach Config::warnings (and --check's list) like
// every other key's; they went to the log alone, which --check silences.
TEST_CASE("optimizer and scheduler warnings are the config's warnings", "[config][warnings]") {
  const Config c = parse_doc(patched(R"({
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50,
                                                      "warmup_num_steps": 100}}
  })"));
  std::string all;
  for (const std::string& w : c.warnings) all += w + "\n";
  INFO(all);
  CHECK_THAT(all, Catch::Contains("optimizer.params.adam_w_mode: false is ignored by optimizer "
                                  "type AdamW"));
  CHECK_THAT(all, Catch::Contains("scheduler.params.total_num_steps: 50 is less than "
                                  "warmup_num_steps 100"));
  CHECK(c.optimizer.adam.adam_w_mode);
}

TEST_CASE("comm_timeout_s at the top level is comm.timeout_s; 5e8 is an integer", "[config]") {
  CHECK(parse_doc(patched(R"({"comm_timeout_s": 7.5})")).comm.timeout_s == 7.5);
  CHECK(parse_doc(patched(R"({"comm": {"timeout_s": 9}})")).comm.timeout_s == 9.0);
  CHECK(parse_doc(patched(R"({"zero_optimization": {"reduce_bucket_size": 5e8}})"))
            .engine.reduce_bucket_size == 500000000);
}

TEST_CASE("null means the default; bfloat16 is bf16", "[config]") {
  const Config c = parse_doc(patched(R"({"bf16": null, "bfloat16": {"enabled": true},
    "gradient_clipping": null, "optimizer": {"params": {"eps": null}}})"));
  CHECK(c.bf16());
  CHECK(c.engine.gradient_clipping == 0.0);
  CHECK(c.optimizer.adam.eps == 1e-8);
}

TEST_CASE("json_reader: positions, duplicates, files", "[config][json]") {
  using config::position_of;
  CHECK(position_of("ab\ncd", 0).line == 1);
  CHECK(position_of("ab\ncd", 0).column == 1);
  CHECK(position_of("ab\ncd", 4).line == 2);
  CHECK(position_of("ab\ncd", 4).column == 2);
  // Equal keys in different objects are fine; escaped spellings of one key are duplicates.
  CHECK_NOTHROW(config::parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "k": 3})", "x"));
  CHECK_NOTHROW(config::parse_json_text(R"({"a": "{\"k\": 1, \"k\": 2}"})", "x"));
  CHECK_THROWS_WITH(config::parse_json_text(R"({"k": 1, "\u006b": 2})", "x"),
                    "x:1:10: duplicate key 'k' (first on line 1)");
  CHECK_THROWS_WITH(load_config("/nonexistent/zrt.json", 1),
                    "/nonexistent/zrt.json: cannot open the config file");
}

TEST_CASE("device options resolve auto and the memory limit", "[config]") {
  DeviceConfig d;
  d.memory_limit_gb = 0.5;
  d.stream_delay_us = 7;
  DeviceOptions cpu = d.options(0, 3, 11);
  CHECK(cpu.type == DeviceType::kCpu);
  CHECK(cpu.index == 0);
  CHECK(cpu.memory_limit_bytes == (std::int64_t{1} << 29));
  CHECK(cpu.stream_delay_max_us == 7);
  CHECK(cpu.stream_delay_seed == 11);
  DeviceOptions gpu = d.options(8, 3, 11);
  CHECK(gpu.type == DeviceType::kCuda);
  CHECK(gpu.index == 3);
  CHECK(gpu.stream_delay_max_us == 0);
  // More local ranks than GPUs: they share them round-robin.
  CHECK(d.options(1, 3, 11).index == 0);
  CHECK(d.options(2, 3, 11).index == 1);
  d.type = DeviceChoice::kCuda;
  CHECK_THROWS_AS(d.options(0, 0, 1), InvalidArgument);
  d.type = DeviceChoice::kCpu;
  CHECK(d.options(1, 1, 1).type == DeviceType::kCpu);
}

TEST_CASE("the key table is consistent", "[config][keys]") {
  std::set<std::string> seen;
  for (const config::KeyInfo& key : config::key_table()) {
    const std::string path = key.path;
    INFO(path);
    CHECK(seen.insert(path).second);
    const std::size_t dot = path.rfind('.');
    if (dot != std::string::npos) {
      // Parents come first and are blocks whose keys are checked.
      const std::string parent = path.substr(0, dot);
      REQUIRE(seen.count(parent) == 1);
      CHECK(config::find_key(parent)->kind == config::KeyKind::kObject);
    }
    if (key.off_value[0] != '\0') CHECK_NOTHROW(json::parse(key.off_value));
    if (key.status == config::KeyStatus::kImplemented) CHECK(key.off_value[0] == '\0');
    CHECK(std::string(key.meaning).find('|') == std::string::npos);
    CHECK(std::string(key.default_text).find('|') == std::string::npos);
  }
  CHECK(config::find_key("zero_optimization.stage") != nullptr);
  CHECK(config::find_key("zero_optimization.nope") == nullptr);
  CHECK(config::child_keys("fp16").size() == 10);
}

TEST_CASE("mics_shard_size: hierarchical sharding where it divides the world", "[config]") {
  const Config c = parse_doc(
      patched(
          R"({"train_batch_size": 16, "zero_optimization": {"stage": 3, "mics_shard_size": 2}})"),
      4);
  CHECK(c.engine.mics_shard_size == 2);
  // A shard group of the whole world is plain sharding.
  CHECK(
      parse_doc(
          patched(
              R"({"train_batch_size": 16, "zero_optimization": {"stage": 3, "mics_shard_size": 4}})"),
          4)
          .engine.mics_shard_size == 0);
  CHECK(
      parse_doc(
          patched(
              R"({"train_batch_size": 16, "zero_optimization": {"stage": 2, "mics_shard_size": -1}})"),
          4)
          .engine.mics_shard_size == 0);
}

TEST_CASE("offload_optimizer.ratio: partial offload at stage 3, in the resolved document",
          "[config]") {
  const Config c = parse_doc(patched(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "ratio": 0.25}}})"));
  CHECK(c.offload_optimizer.ratio == 0.25);
  CHECK(c.engine.offload_optimizer.ratio == 0.25);
  const json resolved = resolved_document(c);
  CHECK(resolved["zero_optimization"]["offload_optimizer"]["ratio"] == 0.25);
  CHECK(parse_config(resolved, c.batch.world_size, "resolved.json").offload_optimizer.ratio ==
        0.25);
  // Without offload the ratio has nothing to split: a warning, no error.
  const Config off = parse_doc(patched(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "none", "ratio": 0.5}}})"));
  REQUIRE(off.warnings.size() == 1);
  CHECK(off.warnings[0].find("offload_optimizer.ratio: ignored") != std::string::npos);
}

TEST_CASE("offload_optimizer.split_step: auto, on or off, in the resolved document", "[config]") {
  const Config automatic = parse_doc(patched(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}}})"));
  CHECK(automatic.engine.offload_split_step == OffloadSplitStep::kAuto);
  CHECK_FALSE(resolved_document(automatic)["zero_optimization"]["offload_optimizer"].contains(
      "split_step"));
  for (const auto& [value, expected] :
       {std::pair{"on", OffloadSplitStep::kOn}, std::pair{"off", OffloadSplitStep::kOff}}) {
    const std::string doc = std::string(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "split_step": ")") +
                            value + R"("}}})";
    const Config c = parse_doc(patched(doc.c_str()));
    CHECK(c.engine.offload_split_step == expected);
    const json resolved = resolved_document(c);
    CHECK(resolved["zero_optimization"]["offload_optimizer"]["split_step"] == value);
    CHECK(parse_config(resolved, c.batch.world_size, "resolved.json").engine.offload_split_step ==
          expected);
  }
  try {
    parse_doc(patched(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "split_step": true}}})"));
    FAIL("split_step true was accepted");
  } catch (const std::exception& e) {
    CHECK_THAT(e.what(), Catch::Contains("zero_optimization.offload_optimizer.split_step"));
  }
}

TEST_CASE("zero_hpz_partition_size: hpZ groups at stage 3, not with MiCS", "[config]") {
  const Config c = parse_doc(
      patched(
          R"({"train_batch_size": 16, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})"),
      4);
  CHECK(c.engine.hpz_partition_size == 2);
  CHECK(resolved_document(c)["zero_optimization"]["zero_hpz_partition_size"] == 2);
  // 1 is DeepSpeed's "off"; a group of the whole world would gather over every rank anyway.
  for (int size : {1, 4}) {
    const std::string patch =
        R"({"train_batch_size": 16, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": )" +
        std::to_string(size) + "}}";
    CHECK(parse_doc(patched(patch.c_str()), 4).engine.hpz_partition_size == 0);
  }
  CHECK_THROWS_WITH(
      parse_doc(patched(R"({"train_batch_size": 16, "zero_optimization": {"stage": 3, )"
                        R"("mics_shard_size": 2, "zero_hpz_partition_size": 2}})"),
                4),
      Catch::Contains("zero_optimization.zero_hpz_partition_size: hpZ with mics_shard_size is "
                      "not supported: MiCS already keeps every parameter gather inside its shard "
                      "group; use one of them"));
  // Groups of consecutive ranks that would leave a node.
  CHECK_THROWS_WITH(
      parse_doc(patched(R"({"train_batch_size": 16, "comm": {"ranks_per_node": 1}, )"
                        R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})"),
                4),
      Catch::Contains("zero_optimization.zero_hpz_partition_size: 2 does not divide "
                      "comm.ranks_per_node 1: hpZ groups of 2 consecutive ranks would span nodes"));
  CHECK(parse_doc(patched(R"({"train_batch_size": 16, "comm": {"ranks_per_node": 2}, )"
                          R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})"),
                  4)
            .engine.hpz_partition_size == 2);
}

// Every engine key's documented default is EngineOptions{}'s value: a config that gives the key
// its documented default (or "auto" there) runs with the engine's own default. A new
// zero_optimization key fails here until it is listed as an engine option or as none.
TEST_CASE("the key table's defaults are EngineOptions{}'s", "[config][docs]") {
  using Field = std::function<std::string(const EngineOptions&)>;
  const auto number = [](auto member) {
    return Field([member](const EngineOptions& e) { return fmt::format("{}", e.*member); });
  };
  const std::map<std::string, Field> engine_keys = {
      {"zero_optimization.stage", number(&EngineOptions::stage)},
      {"zero_optimization.reduce_bucket_size", number(&EngineOptions::reduce_bucket_size)},
      {"zero_optimization.overlap_comm", number(&EngineOptions::overlap_comm)},
      {"zero_optimization.stage3_prefetch_bucket_size",
       number(&EngineOptions::stage3_prefetch_bucket_size)},
      {"zero_optimization.stage3_param_persistence_threshold",
       number(&EngineOptions::stage3_param_persistence_threshold)},
      {"zero_optimization.stage3_max_live_parameters",
       number(&EngineOptions::stage3_max_live_parameters)},
      {"zero_optimization.stage3_max_reuse_distance",
       number(&EngineOptions::stage3_max_reuse_distance)},
      {"zero_optimization.zero_hpz_partition_size", number(&EngineOptions::hpz_partition_size)},
      {"zero_optimization.zero_quantized_weights", number(&EngineOptions::quantized_weights)},
      {"zero_optimization.zero_quantized_gradients", number(&EngineOptions::quantized_gradients)},
      {"zero_optimization.mics_shard_size", number(&EngineOptions::mics_shard_size)},
      {"zero_optimization.offload_optimizer.device",
       [](const EngineOptions& e) { return fmt::format("{}", e.offload_optimizer.enabled); }},
      {"zero_optimization.offload_optimizer.pin_memory",
       [](const EngineOptions& e) { return fmt::format("{}", e.offload_optimizer.pin_memory); }},
      {"zero_optimization.offload_optimizer.ratio",
       [](const EngineOptions& e) { return fmt::format("{}", e.offload_optimizer.ratio); }},
      {"zero_optimization.offload_optimizer.split_step",
       [](const EngineOptions& e) {
         return fmt::format("{}", static_cast<int>(e.offload_split_step));
       }},
      {"zero_optimization.offload_param.device",
       [](const EngineOptions& e) { return fmt::format("{}", e.offload_param.enabled); }},
      {"zero_optimization.offload_param.pin_memory",
       [](const EngineOptions& e) { return fmt::format("{}", e.offload_param.pin_memory); }},
      {"gradient_clipping", number(&EngineOptions::gradient_clipping)},
      {"data_types.grad_accum_dtype",
       [](const EngineOptions& e) { return std::string(dtype_name(e.grad_accum_dtype)); }},
      {"fp16.loss_scale",
       [](const EngineOptions& e) { return fmt::format("{}", e.loss_scale.loss_scale); }},
      {"fp16.initial_scale_power",
       [](const EngineOptions& e) { return fmt::format("{}", e.loss_scale.initial_scale_power); }},
      {"fp16.loss_scale_window",
       [](const EngineOptions& e) { return fmt::format("{}", e.loss_scale.loss_scale_window); }},
      {"fp16.hysteresis",
       [](const EngineOptions& e) { return fmt::format("{}", e.loss_scale.hysteresis); }},
      {"fp16.consecutive_hysteresis",
       [](const EngineOptions& e) {
         return fmt::format("{}", e.loss_scale.consecutive_hysteresis);
       }},
      {"fp16.min_loss_scale",
       [](const EngineOptions& e) { return fmt::format("{}", e.loss_scale.min_loss_scale); }},
  };
  // zero_optimization keys zrt implements that are not engine options (the offload blocks'
  // NVMe and buffer settings, which zrt reads but the engine does not take).
  const std::set<std::string> not_engine = {
      "zero_optimization",
      "zero_optimization.offload_optimizer",
      "zero_optimization.offload_optimizer.nvme_path",
      "zero_optimization.offload_optimizer.buffer_count",
      "zero_optimization.offload_param",
      "zero_optimization.offload_param.nvme_path",
      "zero_optimization.offload_param.buffer_count",
      "zero_optimization.offload_param.buffer_size",
      "zero_optimization.offload_param.max_in_cpu",
  };
  const EngineOptions defaults;
  for (const config::KeyInfo& key : config::key_table()) {
    const std::string path = key.path;
    if (path.rfind("zero_optimization", 0) == 0 && key.status == config::KeyStatus::kImplemented) {
      INFO(path);
      CHECK((engine_keys.count(path) == 1 || not_engine.count(path) == 1));
    }
  }
  for (const auto& [path, field] : engine_keys) {
    const config::KeyInfo* key = config::find_key(path);
    REQUIRE(key != nullptr);
    INFO(path << " documented as " << key->default_text);
    // The documented text as a JSON value ("5e8", "true"), or as a string ("none", "fp32").
    json value;
    try {
      value = json::parse(key->default_text);
    } catch (const json::parse_error&) {
      value = key->default_text;
    }
    // The key set alone on a stage-3 base (where every stage-3 key applies), everything else
    // removed, so the key's value is what the engine gets.
    json doc = patched(R"({"bf16": null, "zero_optimization": null})");
    doc["zero_optimization"]["stage"] = 3;
    json* at = &doc;
    std::istringstream parts(path);
    for (std::string part; std::getline(parts, part, '.');) at = &(*at)[part];
    *at = value;
    CHECK(field(parse_doc(doc).engine) == field(defaults));
  }
}

TEST_CASE("docs/config-keys.md matches the key table", "[config][docs]") {
  const std::string path = std::string(ZRT_SOURCE_DIR) + "/docs/config-keys.md";
  const std::string generated = config::generate_key_table_markdown();
  if (std::getenv("ZRT_UPDATE_DOCS") != nullptr) {
    std::ofstream(path) << generated;
  }
  const std::string committed = read_text(path);
  CHECK(committed == generated);  // ZRT_UPDATE_DOCS=1 build/tests/test_config rewrites it
}

TEST_CASE("every example in configs/ validates", "[config][examples]") {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(std::string(ZRT_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 10);
  for (const fs::path& file : files) {
    INFO(file.string());
    // World size 0: taken from the file's batch numbers.
    Config c;
    REQUIRE_NOTHROW(c = load_config(file.string(), 0));
    CHECK(c.batch.world_size >= 1);
    CHECK(c.warnings.empty());
    CHECK(c.train.steps >= 1);
  }
  const Config demo = load_config(std::string(ZRT_SOURCE_DIR) + "/configs/demo.json", 0);
  CHECK(demo.batch.world_size == 4);
  CHECK(demo.engine.stage == 3);
}

TEST_CASE("monitors: DeepSpeed's tensorboard and csv_monitor blocks", "[config][monitors]") {
  const Config c = parse_doc(patched(R"({
    "tensorboard": {"enabled": true, "output_path": "tb", "job_name": "run1"},
    "csv_monitor": {"enabled": true},
    "output_dir": "runs/a"
  })"));
  CHECK(c.warnings.empty());  // implemented, so no "has no effect" warning
  CHECK(c.tensorboard.enabled);
  CHECK(c.tensorboard.log_dir() == "tb/run1");
  CHECK(c.csv_monitor.enabled);
  // DeepSpeed's default output_path is the launch directory; zrt keeps a run in output_dir.
  CHECK(c.csv_monitor.log_dir() == "runs/a/DeepSpeedJobName");
  CHECK(error_of(patched(R"({"csv_monitor": {"enabled": true, "job_nme": "x"}})").dump()) ==
        "bad.json: csv_monitor.job_nme: unknown key; did you mean 'job_name'?");
  const Config wandb = parse_doc(patched(R"({"wandb": {"enabled": true, "project": "p"}})"));
  REQUIRE(wandb.warnings.size() == 1);
  CHECK_THAT(wandb.warnings[0], Catch::Contains("wandb: accepted, but has no effect in zrt"));
}

TEST_CASE("checkpoint.load: auto, none, latest, a tag; overwrite", "[config][checkpoint]") {
  CHECK(parse_doc(patched(R"({"checkpoint": {"load": "none"}})")).checkpoint.loads_nothing());
  CHECK(parse_doc(patched(R"({"checkpoint": {"load": ""}})")).checkpoint.loads_nothing());
  CHECK(parse_doc(patched(R"({"checkpoint": {"load": "latest"}})")).checkpoint.loads_latest());
  CHECK(parse_doc(patched(R"({"checkpoint": {"load": "auto"}})")).checkpoint.loads_latest());
  CHECK(parse_doc(patched(R"({"checkpoint": {"load": "global_step5"}})")).checkpoint.load ==
        "global_step5");
  const Config fresh = parse_doc(patched(R"({"checkpoint": {"load": "none", "overwrite": true}})"));
  CHECK(fresh.checkpoint.overwrite);
  CHECK(fresh.warnings.empty());
  const Config pointless = parse_doc(patched(R"({"checkpoint": {"overwrite": true}})"));
  REQUIRE(pointless.warnings.size() == 1);
  CHECK_THAT(pointless.warnings[0],
             Catch::Contains("checkpoint.overwrite: no effect: checkpoint.load is \"auto\""));
}

TEST_CASE("long sequences: cpu_checkpointing and model.tiling", "[config]") {
  const Config off = parse_doc(base_config());
  CHECK_FALSE(off.model.cpu_checkpointing);
  CHECK(off.model.head_tile_rows == 0);  // automatic
  CHECK(off.model.mlp_tile_rows == 0);
  const Config on = parse_doc(patched(R"({
    "model": {"activation_checkpointing": true,
              "tiling": {"head_rows": 512, "mlp_rows": -1}},
    "activation_checkpointing": {"cpu_checkpointing": true}})"));
  CHECK(on.model.cpu_checkpointing);
  CHECK(on.model.head_tile_rows == 512);
  CHECK(on.model.mlp_tile_rows == -1);
  CHECK_FALSE(has_warning(on, "activation_checkpointing.cpu_checkpointing"));
  // The resolved document (what a checkpoint saves) carries them back.
  const json resolved = resolved_document(on);
  CHECK(resolved["model"]["tiling"]["head_rows"] == 512);
  CHECK(resolved["activation_checkpointing"]["cpu_checkpointing"] == true);
  CHECK(parse_doc(resolved).model.head_tile_rows == 512);
  // "auto" is the default; without checkpointing there is nothing to keep on the host.
  const Config automatic = parse_doc(patched(R"({"model": {"tiling": {"head_rows": "auto"}},
    "activation_checkpointing": {"cpu_checkpointing": true}})"));
  CHECK(automatic.model.head_tile_rows == 0);
  CHECK(has_warning(automatic, "activation_checkpointing.cpu_checkpointing"));
  CHECK_THAT(error_of(patched(R"({"model": {"tiling": {"mlp_rows": -2}}})").dump()),
             Catch::Contains("model.tiling.mlp_rows"));
}

TEST_CASE("model.expert_rows_reserve: the rows expert parallelism reserves at first", "[config]") {
  CHECK(parse_doc(base_config()).model.expert_rows_reserve == kDefaultExpertRowsReserve);
  // Without expert parallelism it has nothing to reserve: taken, with a warning naming it.
  const Config dense = parse_doc(patched(R"({"model": {"expert_rows_reserve": 2.5}})"));
  CHECK(dense.model.expert_rows_reserve == 2.5);
  CHECK(has_warning(dense, "model.expert_rows_reserve"));
  // The resolved document (what a checkpoint saves) carries it back; the default is left out.
  const json resolved = resolved_document(dense);
  CHECK(resolved["model"]["expert_rows_reserve"] == 2.5);
  CHECK(parse_doc(resolved).model.expert_rows_reserve == 2.5);
  CHECK_FALSE(resolved_document(parse_doc(base_config()))["model"].contains("expert_rows_reserve"));
  // Below the balanced share: refused by name.
  CHECK_THAT(error_of(patched(R"({"model": {"expert_rows_reserve": 0.5}})").dump()),
             Catch::Contains("model.expert_rows_reserve"));
}

}  // namespace
}  // namespace zrt

namespace zrt {
namespace {

TEST_CASE("expert_parallel: DeepSpeed's AutoEP section, each key implemented or refused by name",
          "[config][expert_parallel]") {
  // Off (DeepSpeed's default) is accepted as it is; the layout key is implemented.
  Config off = parse_doc(patched(R"({"expert_parallel": {"enabled": false, "autoep_size": 2},
                                     "use_data_before_expert_parallelism": true})"));
  CHECK(off.engine.expert_parallel_size == 1);
  CHECK(off.engine.data_before_expert_parallel);
  CHECK(std::any_of(off.warnings.begin(), off.warnings.end(), [](const std::string& w) {
    return w.find("expert_parallel.autoep_size: ignored") != std::string::npos;
  }));
  // Enabled without autoep_size: 1, which splits nothing; said so.
  const Config alone = parse_doc(patched(R"({"expert_parallel": {"enabled": true},
      "model": {"type": "qwen3_moe", "preset": "qwen3-moe-tiny"}})"));
  CHECK(alone.engine.expert_parallel_size == 1);
  CHECK(has_warning(alone,
                    "expert_parallel.autoep_size: not given: 1, so every rank holds every "
                    "expert"));
  // A dense model has nothing to split.
  CHECK_THAT(
      error_of(patched(R"({"expert_parallel": {"enabled": true, "autoep_size": 2}})").dump()),
      Catch::Contains("expert_parallel.enabled: model.type gpt2 has no mixture-of-experts "
                      "layers"));
  // What AutoEP reads to find or change a model, zrt's models declare: refused with the reason.
  const std::string refused = error_of(patched(R"({"expert_parallel": {
      "enabled": true, "preset_model": "deepseek_v3", "score_func": "sigmoid",
      "score_apply": "pre", "moe_layer_pattern": "model\\.layers\\.\\d+\\.mlp",
      "load_balance_coeff": 0.001, "top_k": 4, "route_scale": 2.5}})")
                                           .dump());
  for (const char* part :
       {"expert_parallel.preset_model: zrt has no deepseek_v3 model",
        "expert_parallel.score_func: sigmoid scoring is DeepSeek-V3's",
        "expert_parallel.score_apply: transformers' Mixtral and Qwen MoE weight the experts' "
        "outputs",
        "expert_parallel.moe_layer_pattern: not implemented by zrt (MoE layer detection",
        "expert_parallel.load_balance_coeff: not implemented by zrt (Expert-bias",
        "expert_parallel.top_k: not implemented by zrt",
        "expert_parallel.route_scale: not implemented by zrt"}) {
    CHECK_THAT(refused, Catch::Contains(part));
  }
  // The values that leave those features off pass.
  CHECK_THAT(error_of(patched(R"({"expert_parallel": {"enabled": true, "top_k": "auto",
      "route_scale": 1.0, "score_func": "softmax", "score_apply": "post",
      "use_grouped_mm": true, "preset_model": "auto"}})")
                          .dump()),
             !Catch::Contains("top_k") && !Catch::Contains("route_scale") &&
                 !Catch::Contains("score_func") && !Catch::Contains("score_apply") &&
                 !Catch::Contains("preset_model"));
}

// Where the layout puts the experts' groups is checked when the config is read, at the keys, with
// the other problems (not only when every rank builds its groups): 6 ranks in MiCS shard groups of
// 3 at autoep_size 2 hold 2 ranks of one expert set and 1 of the other; hpZ blocks of 3 the same;
// ZeRO++ over 2 nodes of 3 ranks puts 2 of an expert set on one node and 1 on the other.
TEST_CASE("the experts' groups placed in MiCS and hpZ blocks and ZeRO++'s nodes, at their keys",
          "[config][expert_parallel]") {
  json doc = patched(R"({"train_batch_size": 24,
      "zero_optimization": {"stage": 3, "mics_shard_size": 3},
      "expert_parallel": {"enabled": true, "autoep_size": 2},
      "model": {"type": "qwen3_moe", "preset": "qwen3-moe-tiny"}})");
  CHECK_THAT(error_of(doc.dump(), 6),
             Catch::Contains("bad.json: zero_optimization.mics_shard_size: 3 with "
                             "expert_parallel.autoep_size 2: the shard groups hold unequal numbers "
                             "of ranks of an expert-data-parallel group (2 and 1)") &&
                 Catch::Contains("make mics_shard_size a multiple of autoep_size x "
                                 "sequence_parallel_size (2)"));
  doc["zero_optimization"] = {{"stage", 3}, {"zero_hpz_partition_size", 3}};
  CHECK_THAT(error_of(doc.dump(), 6),
             Catch::Contains("bad.json: zero_optimization.zero_hpz_partition_size: 3 with "
                             "expert_parallel.autoep_size 2: the hpZ blocks hold unequal numbers"));
  doc["zero_optimization"] = {{"stage", 3}, {"zero_quantized_gradients", true}};
  doc["comm"] = {{"ranks_per_node", 3}};
  CHECK_THAT(error_of(doc.dump(), 6),
             Catch::Contains("bad.json: expert_parallel.autoep_size: 2 with zero_quantized_weights "
                             "/ zero_quantized_gradients: rank 0's experts are sliced over a group "
                             "with unequal numbers of ranks on its nodes"));
  // Placed evenly: valid. Shard groups of 2, 6 ranks, autoep_size 2.
  doc.erase("comm");
  doc["zero_optimization"] = {{"stage", 3}, {"mics_shard_size", 2}};
  CHECK(error_of(doc.dump(), 6) == "(no error)");
}

TEST_CASE("expert_parallel.autoep_size against the world and the stage (engine options)",
          "[config][expert_parallel]") {
  EngineOptions o;
  o.stage = 2;
  o.expert_parallel_size = 4;
  CHECK(validate(o, 8).empty());
  const auto text = [](const std::vector<OptionProblem>& problems) {
    std::string all;
    for (const OptionProblem& p : problems) all += p.text() + "\n";
    return all;
  };
  o.expert_parallel_size = 3;
  CHECK_THAT(text(validate(o, 8)),
             Catch::Contains("expert_parallel.autoep_size: 3 does not divide the data-parallel "
                             "degree 8"));
  o.expert_parallel_size = 2;
  o.stage = 0;
  CHECK(validate(o, 8).empty());  // each group all-reduces its whole units
  o.stage = 3;
  o.hpz_partition_size = 2;
  CHECK(validate(o, 8).empty());  // hpZ over the experts' group too
  o.hpz_partition_size = 0;
  o.mics_shard_size = 4;
  CHECK(validate(o, 8).empty());  // MiCS over the experts' group too (ParallelDims places it)
  o.mics_shard_size = 0;
  // ZeRO++'s quantized collectives run over the experts' group too.
  o.quantized_weights = o.quantized_gradients = true;
  CHECK(validate(o, 8).empty());
  o.quantized_weights = o.quantized_gradients = false;
  o.expert_parallel_size = 0;
  CHECK_THAT(text(validate(o, 8)), Catch::Contains("must be >= 1"));
}

// model.tiling.mlp_rows tiles the Llama family's and the mixtures of experts' MLP: on GPT-2 it
// does nothing, and says so.
TEST_CASE("model.tiling.mlp_rows on GPT-2 is warned of", "[config]") {
  const Config gpt = parse_doc(patched(R"({"model": {"preset": "gpt2-tiny",
      "tiling": {"mlp_rows": 64}}})"));
  CHECK(has_warning(gpt, "model.tiling.mlp_rows: no effect on GPT-2"));
  const Config llama = parse_doc(patched(R"({"model": {"type": "llama", "preset": "llama-tiny",
      "tiling": {"mlp_rows": 64}}})"));
  CHECK_FALSE(has_warning(llama, "model.tiling.mlp_rows"));
}

// DeepSpeed's name for the sequence-parallel all-to-alls' dtype (its constants.py), one of its
// three values; zrt moves the compute dtype, so another value than fp32 is warned of.
TEST_CASE("seq_parallel_communication_data_type: DeepSpeed's key and values", "[config]") {
  const Config fp32 = parse_doc(patched(R"({"seq_parallel_communication_data_type": "fp32"})"));
  CHECK(fp32.warnings.empty());
  const Config bf16 = parse_doc(patched(R"({"seq_parallel_communication_data_type": "bf16"})"));
  CHECK(has_warning(bf16, "seq_parallel_communication_data_type"));
  CHECK_THAT(error_of(patched(R"({"seq_parallel_communication_data_type": "fp8"})").dump()),
             Catch::Contains("seq_parallel_communication_data_type"));
  CHECK_THAT(error_of(patched(R"({"seq_parallel_comm_data_type": "fp32"})").dump()),
             Catch::Contains("did you mean 'seq_parallel_communication_data_type'"));
}

}  // namespace
}  // namespace zrt
