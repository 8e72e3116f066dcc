// EngineOptions' derived decisions and the one validation of them (engine_options.h).
#include "runtime/engine/engine_options.h"

#include <spdlog/fmt/fmt.h>

#include "runtime/common/error.h"

namespace zrt {

ScheduleOptions schedule_options(const EngineOptions& options) {
  ScheduleOptions s;
  s.stage = options.stage;
  s.gradient_accumulation_steps = options.gradient_accumulation_steps;
  s.stage3_prefetch_bucket_size = options.stage3_prefetch_bucket_size;
  s.stage3_max_live_parameters = options.stage3_max_live_parameters;
  s.stage3_max_reuse_distance = options.stage3_max_reuse_distance;
  // After a step the next forward waits for each unit's publication as it arrives (acquire),
  // so it runs on the units already gathered (with offload: already updated by the CPU) while
  // the later ones are still on their way.
  s.await_published_per_unit = options.stage >= 1;
  // overlap_comm: a unit's reduction overlaps the next unit's backward (double buffers); without
  // it every collective is waited for at once, so one bucket is enough.
  s.rotating_buckets = options.overlap_comm ? 2 : 1;
  s.hpz_partition_size = options.stage == 3 ? options.hpz_partition_size : 0;
  s.frozen_buckets = !options.model_skips_frozen_gradients;
  return s;
}

void take_model_capabilities(EngineOptions& options, const Model& model) {
  options.model_stops_backward_early = model.stops_backward_early();
  options.model_skips_frozen_gradients = model.skips_frozen_gradients();
}

bool offload_takes_reduced_slices(const EngineOptions& options) {
  if (options.stage < 2 || !options.offload_optimizer.enabled ||
      options.gradient_accumulation_steps != 1) {
    return false;
  }
  return options.communication_dtype.value_or(options.compute_dtype) == options.compute_dtype &&
         !options.quantized_gradients;
}

bool per_micro_batch_grads(const EngineOptions& options, bool reduces_nothing) {
  if (options.stage < 2) return false;
  return !reduces_nothing || options.offload_param.enabled ||
         offload_takes_reduced_slices(options) || options.quantized_gradients;
}

bool decides_step_on_device(const EngineOptions& options) {
  return !options.offload_optimizer.enabled && options.compute_dtype != DType::kFloat16;
}

namespace {

constexpr const char* kStage = "zero_optimization.stage";
constexpr const char* kOffloadOptimizer = "zero_optimization.offload_optimizer";
constexpr const char* kOffloadOptimizerDevice = "zero_optimization.offload_optimizer.device";
constexpr const char* kOffloadParam = "zero_optimization.offload_param";
constexpr const char* kOffloadParamDevice = "zero_optimization.offload_param.device";

// Collects the problems, in the order the rules are written.
class Problems {
 public:
  void add(std::string key, std::string message, std::vector<std::string> also = {}) {
    list_.push_back({std::move(key), std::move(message), std::move(also)});
  }
  std::vector<OptionProblem> take() { return std::move(list_); }

 private:
  std::vector<OptionProblem> list_;
};

void check_precision(const EngineOptions& o, Problems& p) {
  const std::pair<const char*, DType> dtypes[] = {
      {"bf16.enabled", o.compute_dtype},
      {"communication_data_type", o.communication_dtype.value_or(o.compute_dtype)},
      {"data_types.grad_accum_dtype", o.grad_accum_dtype}};
  for (const auto& [key, type] : dtypes) {
    if (!is_floating(type)) {
      p.add(key, fmt::format("{} is not a floating-point type; use fp32, bf16 or fp16",
                             dtype_name(type)));
    }
  }
  if (is_floating(o.grad_accum_dtype) && o.grad_accum_dtype != DType::kFloat32 &&
      o.grad_accum_dtype != o.compute_dtype) {
    p.add("data_types.grad_accum_dtype",
          fmt::format("{} accumulation with {} compute; accumulate in fp32 or the compute dtype",
                      dtype_name(o.grad_accum_dtype), dtype_name(o.compute_dtype)),
          {"fp16.enabled", "bf16.enabled"});
  }
  if (o.gradient_accumulation_steps < 1) {
    p.add("gradient_accumulation_steps",
          fmt::format("must be >= 1, not {}", o.gradient_accumulation_steps));
  }
  if (!(o.gradient_clipping >= 0.0)) {
    p.add("gradient_clipping",
          fmt::format("{} is not a norm; give one > 0, or 0 for no clipping", o.gradient_clipping));
  }
}

void check_zero_keys(const EngineOptions& o, int world, Problems& p) {
  const std::string z = "zero_optimization.";
  if (o.stage < 0 || o.stage > 3) {
    p.add(kStage, fmt::format("{} is not a ZeRO stage; use 0, 1, 2 or 3", o.stage));
  }
  if (o.reduce_bucket_size < 1) {
    p.add(z + "reduce_bucket_size",
          fmt::format("must be >= 1 element, not {}", o.reduce_bucket_size));
  }
  const std::pair<const char*, std::int64_t> stage3_limits[] = {
      {"stage3_prefetch_bucket_size", o.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", o.stage3_param_persistence_threshold},
      {"stage3_max_live_parameters", o.stage3_max_live_parameters},
      {"stage3_max_reuse_distance", o.stage3_max_reuse_distance}};
  for (const auto& [key, value] : stage3_limits) {
    if (value < 0) p.add(z + key, fmt::format("must be >= 0 elements, not {}", value));
  }
  if (o.quantized_weights && o.stage != 3) {
    p.add(z + "zero_quantized_weights",
          fmt::format("qwZ quantizes stage 3's parameter gathers (stage is {}); set stage 3 or "
                      "zero_quantized_weights false",
                      o.stage),
          {kStage});
  }
  if (o.quantized_gradients && o.stage < 2) {
    p.add(z + "zero_quantized_gradients",
          fmt::format("qgZ quantizes the reduce-scatters of stages 2-3 (stage is {}); set stage 2 "
                      "or 3, or zero_quantized_gradients false",
                      o.stage),
          {kStage});
  }
  const int shards = o.mics_shard_size;
  if (shards > 0 && o.stage == 0) {
    p.add(z + "mics_shard_size",
          "hierarchical sharding needs ZeRO stage 1, 2 or 3 (stage is 0); set a stage or "
          "mics_shard_size -1",
          {kStage});
  } else if (shards > 0 && world > 0 && (shards > world || world % shards != 0)) {
    p.add(z + "mics_shard_size",
          fmt::format("{} does not divide the world size {}: shard groups are equal blocks of "
                      "consecutive ranks (e.g. the ranks of one node)",
                      shards, world));
  }
  const int sp = o.sequence_parallel_size;
  if (sp < 1) {
    p.add("sequence_parallel_size", fmt::format("must be >= 1 (1: off), not {}", sp));
  } else if (world > 0 && world % sp != 0) {
    p.add("sequence_parallel_size",
          fmt::format("{} does not divide the world size {}: sequence-parallel groups are equal "
                      "blocks of consecutive ranks; give a divisor of it",
                      sp, world));
  }
  const int S = o.hpz_partition_size;
  const std::string hpz = z + "zero_hpz_partition_size";
  if (S < 0) {
    p.add(hpz, fmt::format("must be >= 1 (1: off), not {}", S));
  } else if (S > 1 && o.stage != 3) {
    p.add(hpz,
          fmt::format("hpZ keeps secondary shards of stage 3's gathered parameters (stage is {}); "
                      "set stage 3 or zero_hpz_partition_size 1",
                      o.stage),
          {kStage});
  } else if (S > 1 && shards > 0) {
    p.add(hpz,
          "hpZ with mics_shard_size is not supported: MiCS already keeps every parameter gather "
          "inside its shard group; use one of them",
          {z + "mics_shard_size"});
  } else if (S > 1 && world > 0 && (S > world || world % S != 0)) {
    p.add(hpz, fmt::format("{} does not divide the world size {}: hpZ groups are equal blocks of "
                           "consecutive ranks (the ranks of one node)",
                           S, world));
  }
}

void check_offload(const EngineOptions& o, Problems& p) {
  const bool optimizer = o.offload_optimizer.enabled;
  const bool param = o.offload_param.enabled;
  if (param && (o.quantized_weights || o.quantized_gradients)) {
    p.add(
        kOffloadParam,
        "zero_quantized_weights / zero_quantized_gradients with parameter offload are not "
        "supported; turn one off",
        {"zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients"});
  }
  if (param && o.stage < 3) {
    p.add(kOffloadParam,
          fmt::format("parameter offload needs ZeRO stage 3 (stage is {}); set stage 3 or "
                      "offload_param.device none",
                      o.stage),
          {kStage});
  }
  if (optimizer && o.stage == 0) {
    p.add(kOffloadOptimizer,
          "optimizer offload needs ZeRO stage 1, 2 or 3 (stage is 0); set a stage or "
          "offload_optimizer.device none",
          {kStage});
  }
  // Partial offload (DeepSpeed's ZeRO-Offload++): DeepSpeed allows it at stage 3 only.
  const double ratio = o.offload_optimizer.ratio;
  const std::string ratio_key = std::string(kOffloadOptimizer) + ".ratio";
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    p.add(ratio_key, fmt::format("{} is out of range: the share of the optimizer state "
                                 "offloaded, 0..1",
                                 ratio));
  } else if (optimizer && ratio < 1.0 && o.stage != 3) {
    p.add(ratio_key,
          fmt::format("partial optimizer offload (ratio < 1) needs ZeRO stage 3 (stage is {}); "
                      "set stage 3 or ratio 1",
                      o.stage),
          {kStage, kOffloadOptimizerDevice});
  } else if (optimizer && ratio < 1.0 && param) {
    p.add(ratio_key,
          "partial optimizer offload (ratio < 1) with offload_param is not supported: parameter "
          "offload keeps every unit's state in host memory; set ratio 1",
          {kOffloadOptimizerDevice, kOffloadParamDevice});
  }
  if (param && !optimizer) {
    p.add(kOffloadParam,
          "parameter offload needs offload_optimizer too (zrt keeps offloaded parameter slices "
          "beside the optimizer state in host memory)",
          {kOffloadOptimizerDevice});
  }
  if (o.offload_staging_buffers < 1 || (optimizer && o.offload_staging_buffers > 64)) {
    p.add("offload_staging_buffers",
          fmt::format("must be 1..64, not {}", o.offload_staging_buffers));
  }
  if (o.offload_transfer_piece < 1) {
    p.add("offload_transfer_piece",
          fmt::format("must be >= 1 element, not {}", o.offload_transfer_piece));
  }
}

}  // namespace

// expert_parallel.autoep_size: against the world and the features that run over one group.
void check_expert_parallel(const EngineOptions& o, int world, Problems& p) {
  const int ep = o.expert_parallel_size;
  const std::string key = "expert_parallel.autoep_size";
  if (ep < 1) {
    p.add(key, fmt::format("must be >= 1 (1: every expert on every rank), not {}", ep));
    return;
  }
  if (ep == 1) return;
  // The expert-parallel groups are cut from the data-parallel ranks: world / sp of them (an sp
  // that does not divide the world is reported at its own key).
  const int sp = o.sequence_parallel_size;
  if (world <= 0 || sp < 1 || world % sp != 0) return;
  const int dp = world / sp;
  if (dp % ep != 0) {
    p.add(key,
          fmt::format("{} does not divide the data-parallel degree {}{}: each "
                      "expert-parallel group is {} data-parallel ranks holding a share of "
                      "the experts; give a divisor of it",
                      ep, dp,
                      sp > 1 ? fmt::format(" (world {} / sequence_parallel_size {})", world, sp)
                             : std::string(),
                      ep));
  }
  // Every stage: at stage 0 each group all-reduces its whole units over its own ranks (the
  // experts' over their expert-data-parallel group); MiCS, ZeRO++ (qwZ, qgZ, hpZ) run over each
  // shard group, the experts' too (ParallelDims places them).
}

std::vector<OptionProblem> validate(const EngineOptions& options, int world) {
  Problems problems;
  check_precision(options, problems);
  check_zero_keys(options, world, problems);
  check_expert_parallel(options, world, problems);
  check_offload(options, problems);
  return problems.take();
}

void check_options(const EngineOptions& options, int world) {
  const std::vector<OptionProblem> problems = validate(options, world);
  if (problems.empty()) return;
  if (problems.size() == 1) ZRT_THROW(InvalidArgument, "{}", problems.front().text());
  std::string lines;
  for (const OptionProblem& problem : problems) lines += "\n" + problem.text();
  ZRT_THROW(InvalidArgument, "{} problems with the engine options:{}", problems.size(), lines);
}

}  // namespace zrt
