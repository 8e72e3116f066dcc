#include "config/key_table.h"

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "runtime/engine/engine_options.h"

namespace zrt::config {

namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

// Builder for one table row: K(path, status, kind, default, meaning) plus optional modifiers.
struct K {
  KeyInfo info;
  K(const char* path, KeyStatus status, KeyKind kind, std::string default_text, const char* meaning)
      : info{path, status,          kind,    "",  kNone, kNone, std::move(default_text),
             "",   AutoRule::kNone, meaning, true} {}
  K& range(double lo, double hi = kNone) {
    info.min = lo;
    info.max = hi;
    return *this;
  }
  K& choices(const char* c) {
    info.choices = c;
    return *this;
  }
  K& off(const char* value) {
    info.off_value = value;
    return *this;
  }
  K& on_auto(AutoRule rule) {
    info.auto_rule = rule;
    return *this;
  }
  K& zrt() {
    info.deepspeed = false;
    return *this;
  }
};

// An engine option's default as the table documents it, from EngineOptions{} itself: large
// round counts as DeepSpeed writes them ("5e8"), others as they are ("1000", "0", "true").
std::string documented(std::int64_t value) {
  if (value >= 100000) {
    int exponent = 0;
    std::int64_t mantissa = value;
    while (mantissa % 10 == 0) {
      mantissa /= 10;
      ++exponent;
    }
    if (mantissa < 10) return fmt::format("{}e{}", mantissa, exponent);
  }
  return std::to_string(value);
}
std::string documented(int value) {
  return documented(static_cast<std::int64_t>(value));
}
std::string documented(double value) {
  return fmt::format("{}", value);
}
std::string documented(bool value) {
  return value ? "true" : "false";
}
std::string documented(DType value) {
  return dtype_name(value);
}

constexpr KeyStatus I = KeyStatus::kImplemented;
constexpr KeyStatus W = KeyStatus::kAcceptedWithWarning;
constexpr KeyStatus E = KeyStatus::kUnsupportedError;
constexpr KeyKind kObject = KeyKind::kObject;
constexpr KeyKind kOpaque = KeyKind::kOpaque;
constexpr KeyKind kBool = KeyKind::kBool;
constexpr KeyKind kInt = KeyKind::kInt;
constexpr KeyKind kNumber = KeyKind::kNumber;
constexpr KeyKind kString = KeyKind::kString;
constexpr KeyKind kEnum = KeyKind::kEnum;
constexpr KeyKind kEnumNoCase = KeyKind::kEnumNoCase;
constexpr KeyKind kNumberPair = KeyKind::kNumberPair;
constexpr KeyKind kIntPair = KeyKind::kIntPair;
constexpr KeyKind kStringList = KeyKind::kStringList;
constexpr KeyKind kIntList = KeyKind::kIntList;
constexpr AutoRule kBatch = AutoRule::kBatch;
constexpr AutoRule kDefault = AutoRule::kDefault;

std::vector<KeyInfo> build_table() {
  const EngineOptions engine;  // the engine's defaults, documented below
  const LossScaleOptions& scaling = engine.loss_scale;
  const K rows[] = {
      // ---- Batch size (DeepSpeed) ----
      K("train_batch_size", I, kInt, "derived",
        "Samples per optimizer step over all ranks: micro batch x accumulation x world size")
          .range(1)
          .on_auto(kBatch),
      K("train_micro_batch_size_per_gpu", I, kInt, "derived",
        "Samples per rank in one forward/backward pass")
          .range(1)
          .on_auto(kBatch),
      K("gradient_accumulation_steps", I, kInt, "derived (1 if only one batch key is given)",
        "Micro-batches accumulated before each optimizer step")
          .range(1)
          .on_auto(kBatch),
      K("managed_gradient_accumulation", W, kBool, "true",
        "Who calls step() at accumulation boundaries; zrt's trainer always steps there")
          .off("true"),

      // ---- Optimizer and schedule (DeepSpeed; parsed by optimizers/optimizer_config) ----
      K("optimizer", I, kObject, "AdamW, lr 1e-3", "Optimizer type and hyper-parameters"),
      K("optimizer.type", I, kString, "AdamW",
        "Adam, AdamW or Lion (case-insensitive); DeepSpeed's other optimizers are errors"),
      K("optimizer.params", I, kObject, "{}", "Optimizer hyper-parameters"),
      K("optimizer.params.lr", I, kNumber, "1e-3", "Learning rate (the schedule's base)").range(0),
      K("optimizer.params.betas", I, kNumberPair, "[0.9, 0.999]",
        "Adam's beta1, beta2; Lion's (default [0.9, 0.99])")
          .range(0, 1),
      K("optimizer.params.eps", I, kNumber, "1e-8", "Adam's epsilon (not a Lion key)").range(0),
      K("optimizer.params.weight_decay", I, kNumber, "0",
        "Weight decay coefficient (Lion: always decoupled)")
          .range(0),
      K("optimizer.params.bias_correction", I, kBool, "true", "Adam bias correction"),
      K("optimizer.params.adam_w_mode", I, kBool, "true",
        "Type Adam only: decoupled decay (AdamW) if true, L2 regularisation if false"),
      K("optimizer.params.amsgrad", E, kBool, "false", "The AMSGrad variant of Adam").off("false"),
      K("optimizer.params.torch_adam", W, kBool, "false",
        "Use torch's Adam rather than DeepSpeed's fused one; zrt has one implementation")
          .off("false"),
      K("optimizer.no_weight_decay", I, kStringList, "[\"bias\", \"ln*\", \"*norm*\"]",
        "Name patterns of parameters without weight decay (model.frozen's rule: '*', '?', "
        "'[0-9]'; with a '.' the whole name, without one any component)")
          .zrt(),
      K("scheduler", I, kObject, "none (constant lr)", "Learning-rate schedule"),
      K("scheduler.type", I, kString, "required in the block",
        "WarmupLR, WarmupDecayLR or WarmupCosineLR; OneCycle and LRRangeTest are errors"),
      K("scheduler.params", I, kObject, "{}", "Schedule parameters (which apply depends on type)"),
      K("scheduler.params.warmup_min_lr", I, kNumber, "0",
        "WarmupLR, WarmupDecayLR: lr at the start of warmup")
          .range(0),
      K("scheduler.params.warmup_max_lr", I, kNumber, "1e-3",
        "WarmupLR, WarmupDecayLR: lr at the end of warmup")
          .range(0),
      K("scheduler.params.warmup_num_steps", I, kInt, "1000", "Warmup length in optimizer steps")
          .range(0),
      K("scheduler.params.warmup_type", I, kEnum, "log", "Warmup curve").choices("log|linear"),
      K("scheduler.params.total_num_steps", I, kInt, "required (WarmupDecayLR, WarmupCosineLR)",
        "Length of the whole schedule; \"auto\" takes train.steps")
          .range(1)
          .on_auto(AutoRule::kTrainSteps),
      K("scheduler.params.warmup_min_ratio", I, kNumber, "0",
        "WarmupCosineLR: start of warmup as a fraction of the optimizer's lr")
          .range(0),
      K("scheduler.params.cos_min_ratio", I, kNumber, "1e-4",
        "WarmupCosineLR: end of the cosine as a fraction of the optimizer's lr")
          .range(0),
      K("scheduler.params.last_batch_iteration", E, kInt, "-1",
        "Start the schedule mid-way; a resumed zrt run takes its position from the checkpoint")
          .off("-1"),

      // ---- Communication and precision (DeepSpeed) ----
      K("communication_data_type", I, kEnum, "compute dtype", "Data type gradients are reduced in")
          .choices("fp32|bf16|fp16"),
      K("gradient_allreduce_op", E, kEnum, "mean",
        "Average (mean) or sum gradients over ranks; zrt averages")
          .choices("mean|sum")
          .off("\"mean\""),
      K("prescale_gradients", E, kBool, "false", "Scale gradients before the reduction")
          .off("false"),
      K("gradient_predivide_factor", E, kNumber, "1.0",
        "Divide gradients by this factor before the reduction")
          .off("1"),
      K("seq_parallel_communication_data_type", W, kEnum, "fp32",
        "Sequence-parallel communication dtype; zrt's all-to-alls move the compute dtype")
          .choices("fp32|bf16|fp16")
          .off("\"fp32\""),
      K("sequence_parallel_size", I, kInt, documented(engine.sequence_parallel_size),
        "Ulysses sequence parallelism: each sequence in this many chunks over as many consecutive "
        "ranks of a node; train_batch_size counts world / this")
          .range(1),
      K("disable_allgather", W, kBool, "false", "Legacy all-gather switch").off("false"),
      K("fp16", I, kObject, "disabled", "fp16 mixed precision with dynamic loss scaling"),
      K("fp16.enabled", I, kBool, "false", "Compute in fp16 (fp32 master weights)"),
      K("fp16.auto_cast", E, kBool, "false", "Cast module inputs to fp16 automatically")
          .off("false"),
      K("fp16.loss_scale", I, kNumber, documented(scaling.loss_scale),
        "0: dynamic loss scaling; > 0: this static scale")
          .range(0),
      K("fp16.initial_scale_power", I, kInt, documented(scaling.initial_scale_power),
        "The dynamic scale starts at 2^this")
          .range(0, 63),
      K("fp16.loss_scale_window", I, kInt, documented(scaling.loss_scale_window),
        "Overflow-free steps before the dynamic scale doubles")
          .range(1),
      K("fp16.hysteresis", I, kInt, documented(scaling.hysteresis),
        "Overflows absorbed before the scale halves")
          .range(1),
      K("fp16.consecutive_hysteresis", I, kBool, documented(scaling.consecutive_hysteresis),
        "Refill the hysteresis after every overflow-free step"),
      K("fp16.min_loss_scale", I, kNumber, documented(scaling.min_loss_scale),
        "Lowest dynamic scale; an overflow there fails")
          .range(0),
      K("fp16.fp16_master_weights_and_grads", E, kBool, "false",
        "Keep master weights and gradients in fp16")
          .off("false"),
      K("fp16.fused_mode", W, kBool, "true", "DeepSpeed's fused fp16 optimizer wrapper")
          .off("true"),
      K("bf16", I, kObject, "disabled", "bf16 mixed precision"),
      K("bf16.enabled", I, kBool, "false", "Compute in bf16 (fp32 master weights)"),
      K("bf16.immediate_grad_update", W, kBool, "true",
        "DeepSpeed's bf16 optimizer gradient hook detail")
          .off("true"),
      K("bf16.bf16_master_weights_and_grads", E, kBool, "false",
        "Keep master weights and gradients in bf16")
          .off("false"),
      K("bf16.bf16_optimizer_states", E, kBool, "false", "Keep Adam moments in bf16").off("false"),
      K("bfloat16", I, kOpaque, "disabled", "Old name of bf16, read as bf16 (not both)"),
      K("amp", E, kOpaque, "disabled", "NVIDIA Apex AMP").off("{\"enabled\": false}"),
      K("torch_autocast", E, kOpaque, "disabled", "torch.autocast mixed precision")
          .off("{\"enabled\": false}"),
      K("data_types", I, kObject, "{}", "Data types of internal buffers"),
      K("data_types.grad_accum_dtype", I, kEnum, documented(engine.grad_accum_dtype),
        "Gradient accumulation dtype across micro-batches: fp32 or the compute dtype")
          .choices("fp32|bf16|fp16"),
      K("gradient_clipping", I, kNumber, documented(engine.gradient_clipping),
        "Clip the global gradient L2 norm to this; 0: off")
          .range(0),

      // ---- ZeRO (DeepSpeed) ----
      K("zero_optimization", I, kObject, "stage 0", "ZeRO partitioning"),
      K("zero_optimization.stage", I, kInt, documented(engine.stage),
        "0: replicated; 1: optimizer state; 2: + gradients; 3: + parameters partitioned")
          .range(0, 3),
      K("zero_optimization.reduce_bucket_size", I, kInt, documented(engine.reduce_bucket_size),
        "Elements per gradient bucket (stages 0-2: one unit of reduction)")
          .range(1)
          .on_auto(kDefault),
      K("zero_optimization.allgather_bucket_size", W, kInt, "5e8",
        "zrt all-gathers per unit (reduce_bucket_size); no separate all-gather bucket")
          .range(0)
          .off("5e8")
          .on_auto(kDefault),
      K("zero_optimization.overlap_comm", I, kBool, documented(engine.overlap_comm),
        "Overlap reductions (and stage-3 gathers) with compute; results are identical")
          .on_auto(kDefault),
      K("zero_optimization.contiguous_gradients", W, kBool, "true",
        "zrt's gradients always live in contiguous unit buffers")
          .off("true"),
      K("zero_optimization.reduce_scatter", W, kBool, "true",
        "zrt always reduce-scatters at stages 1-3")
          .off("true"),
      K("zero_optimization.allgather_partitions", W, kBool, "true",
        "zrt always all-gathers updated slices")
          .off("true"),
      K("zero_optimization.round_robin_gradients", W, kBool, "false",
        "Offload copy ordering at stages 1-2; no effect on results")
          .off("false"),
      K("zero_optimization.load_from_fp32_weights", E, kBool, "true",
        "Restore fp32 master weights from the checkpoint (false: from 16-bit weights)")
          .off("true"),
      K("zero_optimization.elastic_checkpoint", W, kBool, "false",
        "Deprecated; zrt checkpoints reshard to any world size")
          .off("false"),
      K("zero_optimization.offload_optimizer", I, kObject, "none",
        "Optimizer state and step in host memory (stages 1-3)"),
      K("zero_optimization.offload_optimizer.device", I, kEnum, "none",
        "none, cpu (pinned host memory) or nvme (not implemented)")
          .choices("none|cpu|nvme"),
      K("zero_optimization.offload_optimizer.nvme_path", I, kString, "none",
        "Directory for nvme offload"),
      K("zero_optimization.offload_optimizer.pin_memory", I, kBool,
        documented(engine.offload_optimizer.pin_memory),
        "Page-locked host buffers (needed for overlapped copies)"),
      K("zero_optimization.offload_optimizer.buffer_count", I, kInt, "4", "nvme buffer count")
          .range(0),
      K("zero_optimization.offload_optimizer.ratio", I, kNumber,
        documented(engine.offload_optimizer.ratio),
        "Share of the optimizer state offloaded (stage 3; the rest steps on the device)")
          .range(0, 1),
      K("zero_optimization.offload_optimizer.split_step", I, kEnum, "auto",
        "The CPU step in two passes: the updated compute-dtype parameters first, the optimizer "
        "state behind the next forward (auto: on with a GPU, off on the CPU backend)")
          .choices("auto|on|off")
          .zrt(),
      K("zero_optimization.offload_optimizer.fast_init", W, kBool, "false",
        "nvme initialisation shortcut")
          .off("false"),
      K("zero_optimization.offload_optimizer.pipeline_read", W, kBool, "false",
        "nvme read pipelining")
          .off("false"),
      K("zero_optimization.offload_optimizer.pipeline_write", W, kBool, "false",
        "nvme write pipelining")
          .off("false"),
      K("zero_optimization.offload_optimizer.super_offload", E, kBool, "false",
        "Superchip offload mode")
          .off("false"),
      K("zero_optimization.offload_optimizer.convert_grad_on_cpu", W, kBool, "true",
        "Where DeepSpeed converts offloaded gradients")
          .off("true"),
      K("zero_optimization.offload_optimizer.cpuadam_cores_perc", W, kNumber, "0.8",
        "Share of cores for DeepSpeed's CPU Adam (super_offload)")
          .range(0, 1)
          .off("0.8"),
      K("zero_optimization.offload_param", I, kObject, "none",
        "Parameter slices in host memory (stage 3, with offload_optimizer)"),
      K("zero_optimization.offload_param.device", I, kEnum, "none",
        "none, cpu (pinned host memory) or nvme (not implemented)")
          .choices("none|cpu|nvme"),
      K("zero_optimization.offload_param.nvme_path", I, kString, "none",
        "Directory for nvme offload"),
      K("zero_optimization.offload_param.pin_memory", I, kBool,
        documented(engine.offload_param.pin_memory),
        "Page-locked host buffers (needed for overlapped copies)"),
      K("zero_optimization.offload_param.buffer_count", I, kInt, "5", "nvme buffer count").range(0),
      K("zero_optimization.offload_param.buffer_size", I, kInt, "1e8",
        "nvme buffer size (elements)")
          .range(0),
      K("zero_optimization.offload_param.max_in_cpu", I, kInt, "1e9",
        "nvme: parameter elements kept in host memory")
          .range(0),
      K("zero_optimization.sub_group_size", W, kInt, "1e9",
        "Optimizer-step tiling; zrt steps one unit at a time")
          .range(0)
          .off("1e9")
          .on_auto(kDefault),
      K("zero_optimization.stage3_prefetch_bucket_size", I, kInt,
        documented(engine.stage3_prefetch_bucket_size), "Stage 3: elements gathered ahead of use")
          .range(0)
          .on_auto(kDefault),
      K("zero_optimization.stage3_param_persistence_threshold", I, kInt,
        documented(engine.stage3_param_persistence_threshold),
        "Stage 3: parameters smaller than this (elements) stay whole on every rank")
          .range(0)
          .on_auto(kDefault),
      K("zero_optimization.stage3_model_persistence_threshold", W, kInt, "unbounded",
        "Stage 3: cap on persistent elements; zrt does not cap them")
          .range(0)
          .off("9223372036854775807")
          .on_auto(kDefault),
      K("zero_optimization.stage3_max_live_parameters", I, kInt,
        documented(engine.stage3_max_live_parameters),
        "Stage 3: most gathered elements resident before release")
          .range(0)
          .on_auto(kDefault),
      K("zero_optimization.stage3_max_reuse_distance", I, kInt,
        documented(engine.stage3_max_reuse_distance),
        "Stage 3: keep a unit gathered from its forward into its backward when at most this many "
        "elements are used in between (DeepSpeed's default, 1e9, keeps them all below 1e9 "
        "elements; zrt's 0 releases after each use)")
          .range(0)
          .on_auto(kDefault),
      K("zero_optimization.stage3_gather_16bit_weights_on_model_save", W, kBool, "false",
        "save_16bit_model() consolidation; zrt exports from its checkpoints")
          .off("false")
          .on_auto(kDefault),
      K("zero_optimization.stage3_gather_fp16_weights_on_model_save", W, kBool, "false",
        "Deprecated name of stage3_gather_16bit_weights_on_model_save")
          .off("false"),
      K("zero_optimization.stage3_module_granularity_threshold", W, kInt, "0",
        "Stage 3 hook fusion; zrt's units are modules")
          .off("0"),
      K("zero_optimization.stage3_use_all_reduce_for_fetch_params", W, kBool, "false",
        "Stage 3 gather implementation detail")
          .off("false"),
      K("zero_optimization.stage3_allgather_sequential", W, kBool, "false",
        "Stage 3 gather implementation detail")
          .off("false"),
      K("zero_optimization.ignore_unused_parameters", W, kBool, "true",
        "Tolerate parameters without gradients")
          .off("true"),
      K("zero_optimization.legacy_stage1", E, kBool, "false", "Old stage-1 implementation")
          .off("false"),
      K("zero_optimization.use_multi_rank_bucket_allreduce", W, kBool, "true",
        "Reduction implementation detail")
          .off("true"),
      K("zero_optimization.compute_grad_norm", W, kBool, "true",
        "zrt always computes the norm (clipping, logging)")
          .off("true"),
      K("zero_optimization.parameter_alignment", W, kBool, "false",
        "zrt always aligns every parameter in its unit")
          .off("false"),
      K("zero_optimization.zero_hpz_partition_size", I, kInt, "1",
        "ZeRO++ hpZ (stage 3): after each unit's forward gather every rank keeps 1/S of it, and "
        "the backward gathers it from those over groups of S consecutive ranks (the ranks per "
        "node, or a divisor); 1: off")
          .range(1),
      K("zero_optimization.zero_quantized_weights", I, kBool, documented(engine.quantized_weights),
        "ZeRO++ qwZ (stage 3): parameter gathers carry int8 codes with a scale per block of "
        "2048; master weights stay fp32; refused with `offload_param`"),
      K("zero_optimization.zero_quantized_nontrainable_weights", E, kBool, "false",
        "ZeRO++ quantized frozen weights")
          .off("false"),
      K("zero_optimization.zero_quantized_gradients", I, kBool,
        documented(engine.quantized_gradients),
        "ZeRO++ qgZ (stages 2-3): gradient reduce-scatters quantized to int8 blocks, summed in "
        "fp32 within the node, then across nodes"),
      K("zero_optimization.zeropp_loco_param", E, kOpaque, "none", "LoCo-ZeRO++ error feedback")
          .off("{}"),
      K("zero_optimization.mics_shard_size", I, kInt, "-1",
        "MiCS / HSDP (stages 1-3): slice the state over groups of this many consecutive ranks "
        "(a node) and replicate it across the groups; -1: over every rank")
          .range(-1),
      K("zero_optimization.mics_hierarchical_params_gather", W, kBool, "false",
        "MiCS hierarchical gather: zrt gathers within the shard group in one step")
          .off("false"),
      K("zero_optimization.memory_efficient_linear", W, kBool, "true",
        "Stage 3 torch Linear replacement")
          .off("true"),
      K("zero_optimization.override_module_apply", W, kBool, "true",
        "Stage 3 torch module hook detail")
          .off("true"),
      K("zero_optimization.log_trace_cache_warnings", W, kBool, "false",
        "Stage 3 trace cache logging")
          .off("false"),
      K("zero_optimization.enable_sanity_checks", W, kBool, "false", "DeepSpeed debug checks")
          .off("false"),
      K("zero_optimization.pipeline_loading_checkpoint", W, kBool, "false",
        "Stage 3 checkpoint loading mode")
          .off("false"),
      K("zero_optimization.save_muon_momentum_buffer_in_memory", W, kBool, "false",
        "Muon with nvme offload")
          .off("false"),
      K("zero_optimization.cpu_offload", E, kBool, "false",
        "Deprecated; use offload_optimizer {\"device\": \"cpu\"}")
          .off("false"),
      K("zero_optimization.cpu_offload_param", E, kBool, "false",
        "Deprecated; use offload_param {\"device\": \"cpu\"}")
          .off("false"),
      K("zero_optimization.cpu_offload_use_pin_memory", W, kBool, "false",
        "Deprecated; use pin_memory in the offload blocks")
          .off("false"),
      K("zero_optimization.zenflow", E, kOpaque, "none", "ZenFlow asynchronous updates").off("{}"),
      K("zero_optimization.leaf_module", W, kOpaque, "{}", "Stage 3 leaf modules for hooks")
          .off("{}"),
      K("zero_allow_untested_optimizer", W, kBool, "false",
        "Allow client optimizers with ZeRO; zrt runs its own Adam")
          .off("false"),
      K("zero_force_ds_cpu_optimizer", W, kBool, "true", "Force DeepSpeed's CPU Adam on offload")
          .off("true"),
      K("aio", W, kOpaque, "{}", "Async I/O for nvme offload").off("{}"),

      // ---- Other DeepSpeed features ----
      K("activation_checkpointing", W, kObject, "{}",
        "DeepSpeed's checkpointing API options; zrt's switch is model.activation_checkpointing"),
      K("activation_checkpointing.partition_activations", W, kBool, "false",
        "Partition checkpoints over model-parallel ranks")
          .off("false"),
      K("activation_checkpointing.cpu_checkpointing", I, kBool, "false",
        "With model.activation_checkpointing: the kept block inputs in pinned host memory, "
        "copied out in the forward and back one block ahead in the backward (same bits)"),
      K("activation_checkpointing.contiguous_memory_optimization", W, kBool, "false",
        "Copy checkpoints into one buffer")
          .off("false"),
      K("activation_checkpointing.number_checkpoints", W, kInt, "none",
        "Checkpoint count for the contiguous buffer"),
      K("activation_checkpointing.synchronize_checkpoint_boundary", W, kBool, "false",
        "Synchronise at each checkpoint")
          .off("false"),
      K("activation_checkpointing.profile", W, kBool, "false", "Time checkpoint functions")
          .off("false"),
      K("sparse_gradients", E, kBool, "false", "CSR sparse embedding gradients").off("false"),
      K("sparse_attention", E, kOpaque, "none", "Block-sparse attention").off("{}"),
      K("pipeline", E, kOpaque, "none", "Pipeline parallelism").off("{}"),
      K("tensor_parallel", E, kOpaque, "none", "AutoTP tensor parallelism").off("{}"),
      // DeepSpeed's AutoEP section, as deepspeed/module_inject/auto_ep_config.py reads it. zrt's
      // mixture-of-experts models declare their experts, router and scoring in code (as
      // transformers defines them), so the keys that tell AutoEP how to find or change those
      // are refused by name, each with its reason; the layout keys are implemented.
      K("expert_parallel", I, kObject, "{}",
        "AutoEP expert parallelism: each MoE layer's experts split over autoep_size ranks"),
      K("expert_parallel.enabled", I, kBool, "false", "Expert parallelism on"),
      K("expert_parallel.autoep_size", I, kInt, "1",
        "Ranks an MoE layer's experts are split over (must divide world / sequence_parallel_size "
        "and every layer's expert count); 1: every expert local")
          .range(1),
      K("expert_parallel.preset_model", I, kEnum, "auto",
        "The model family; auto: the model's own; else it must be the model's own (mixtral, "
        "or qwen3_moe for Qwen2/3-MoE); zrt has no deepseek_v2/v3, llama4 or qwen3_5_moe model")
          .choices("auto|mixtral|qwen3_moe|qwen3_5_moe|deepseek_v2|deepseek_v3|llama4"),
      K("expert_parallel.score_func", I, kEnum, "auto",
        "Router scoring: the model's softmax (auto, softmax); sigmoid is refused")
          .choices("auto|softmax|sigmoid"),
      K("expert_parallel.score_apply", I, kEnum, "auto",
        "Where routing weights apply: after the experts, as transformers does (auto, post); pre "
        "is refused")
          .choices("auto|pre|post"),
      K("expert_parallel.use_grouped_mm", W, kBool, "true",
        "Grouped expert GEMM; zrt's experts always run as one grouped product, same math")
          .off("true"),
      K("expert_parallel.grouped_mm_backend", W, kEnum, "auto",
        "Grouped GEMM backend; zrt picks its own (cuBLAS / BLAS per expert)")
          .choices("auto|torch|cutlass|sequential")
          .off("\"auto\""),
      K("expert_parallel.top_k", E, kInt, "auto",
        "Experts per token: zrt reads the model's num_experts_per_tok")
          .on_auto(AutoRule::kDefault),
      K("expert_parallel.route_norm", E, kBool, "auto",
        "Top-k renormalisation: zrt follows the model (Mixtral always, Qwen by norm_topk_prob)"),
      K("expert_parallel.route_scale", E, kNumber, "1.0",
        "Routing-weight scale: not in Mixtral or Qwen2/3-MoE")
          .off("1.0"),
      K("expert_parallel.routed_scaling_factor", E, kNumber, "auto",
        "DeepSeek's routed scaling: not in Mixtral or Qwen2/3-MoE")
          .on_auto(AutoRule::kDefault)
          .off("1.0"),
      K("expert_parallel.num_expert_groups", E, kInt, "none",
        "DeepSeek's group-limited routing: not in Mixtral or Qwen2/3-MoE"),
      K("expert_parallel.num_limited_groups", E, kInt, "none",
        "DeepSeek's group-limited routing: not in Mixtral or Qwen2/3-MoE"),
      K("expert_parallel.load_balance_coeff", E, kNumber, "none",
        "Expert-bias (auxiliary-loss-free) balancing: zrt trains with transformers' "
        "load-balancing loss, model.router_aux_loss_coef"),
      K("expert_parallel.moe_layer_pattern", E, kString, "none",
        "MoE layer detection: zrt's models declare their MoE layers"),
      K("expert_parallel.router_pattern", E, kString, "none",
        "Router detection: zrt's models declare their routers"),
      K("expert_parallel.expert_pattern", E, kString, "none",
        "Expert detection: zrt's models declare their experts"),
      K("expert_parallel.expert_w1", E, kString, "none",
        "Expert weight names: zrt's models name theirs as the Hub does"),
      K("expert_parallel.expert_w2", E, kString, "none",
        "Expert weight names: zrt's models name theirs as the Hub does"),
      K("expert_parallel.expert_w3", E, kString, "none",
        "Expert weight names: zrt's models name theirs as the Hub does"),
      K("expert_parallel.num_experts_attr", E, kString, "none",
        "Config attribute of the expert count: zrt reads the model's config"),
      K("expert_parallel.top_k_attr", E, kString, "none",
        "Config attribute of top-k: zrt reads the model's config"),
      K("expert_parallel.has_shared_experts", E, kBool, "none",
        "Shared-expert detection: zrt's models declare theirs (Qwen2-MoE)"),
      K("expert_parallel.shared_experts_pattern", E, kString, "none",
        "Shared-expert detection: zrt's models declare theirs (Qwen2-MoE)"),
      K("moe", E, kOpaque, "none",
        "Mixture of experts: not a DeepSpeed config key, reserved so MoE settings fail loudly")
          .zrt()
          .off("{}"),
      K("hybrid_engine", E, kOpaque, "none", "RLHF hybrid train/inference engine")
          .off("{\"enabled\": false}"),
      K("elasticity", E, kOpaque, "none", "Elastic batch sizes over changing world sizes")
          .off("{\"enabled\": false}"),
      K("progressive_layer_drop", E, kOpaque, "none", "Progressive layer dropping")
          .off("{\"enabled\": false}"),
      K("curriculum_learning", E, kOpaque, "none", "Legacy curriculum learning")
          .off("{\"enabled\": false}"),
      K("data_efficiency", E, kOpaque, "none", "Curriculum sampling and random-LTD")
          .off("{\"enabled\": false}"),
      K("eigenvalue", E, kOpaque, "none", "Eigenvalue-based adaptive quantization")
          .off("{\"enabled\": false}"),
      K("compression_training", E, kOpaque, "none", "Compression-aware training").off("{}"),
      K("quantize_training", E, kOpaque, "none", "MoQ quantization-aware training")
          .off("{\"enabled\": false}"),
      K("weight_quantization", E, kOpaque, "none", "Weight quantization").off("{}"),
      K("compile", E, kOpaque, "none", "torch.compile and DeepCompile")
          .off("{\"deepcompile\": false}"),
      K("nebula", E, kOpaque, "none", "Nebula asynchronous checkpoint service")
          .off("{\"enabled\": false}"),
      K("steps_per_print", W, kInt, "10", "DeepSpeed's progress report; use train.log_interval")
          .range(1)
          .off("10"),
      K("wall_clock_breakdown", W, kBool, "false", "DeepSpeed timers; use trace for timings")
          .off("false"),
      K("memory_breakdown", W, kBool, "false", "DeepSpeed memory report").off("false"),
      K("dump_state", W, kBool, "false", "Print DeepSpeed's state after start-up").off("false"),
      K("disable_python_gc", W, kBool, "false", "Python garbage-collection control").off("false"),
      K("graph_harvesting", W, kBool, "false", "CUDA graph capture of short kernels").off("false"),
      K("dataloader_drop_last", W, kBool, "false", "DeepSpeed's data loader option").off("false"),
      K("use_data_before_expert_parallelism", I, kBool, "false",
        "Expert-parallel groups strided and expert-data-parallel groups consecutive (D + E), "
        "instead of the reverse"),
      K("vocabulary_size", W, kInt, "none", "DeepSpeed hint; zrt uses model.vocab_size"),
      K("timers", W, kOpaque, "{}", "DeepSpeed timer options").off("{}"),
      K("autotuning", W, kOpaque, "disabled", "DeepSpeed autotuner").off("{\"enabled\": false}"),
      K("flops_profiler", W, kOpaque, "disabled", "DeepSpeed FLOPs profiler")
          .off("{\"enabled\": false}"),
      K("tensorboard", I, kObject, "disabled",
        "TensorBoard event file of the training scalars, written by rank 0"),
      K("tensorboard.enabled", I, kBool, "false", "Write the event file"),
      K("tensorboard.output_path", I, kString, "output_dir",
        "Parent directory of the job's directory (DeepSpeed: the launch directory)"),
      K("tensorboard.job_name", I, kString, "DeepSpeedJobName",
        "The job's directory under output_path, holding events.out.tfevents.*"),
      K("wandb", W, kOpaque, "disabled",
        "Weights & Biases monitor; zrt has no network logger: use tensorboard, csv_monitor or "
        "metrics.jsonl")
          .off("{\"enabled\": false}"),
      K("csv_monitor", I, kObject, "disabled",
        "One CSV file per training scalar, written by rank 0"),
      K("csv_monitor.enabled", I, kBool, "false", "Write the CSV files"),
      K("csv_monitor.output_path", I, kString, "output_dir",
        "Parent directory of the job's directory (DeepSpeed: the launch directory)"),
      K("csv_monitor.job_name", I, kString, "DeepSpeedJobName",
        "The job's directory under output_path, holding the CSV files"),
      K("comet", W, kOpaque, "disabled", "Comet monitor").off("{\"enabled\": false}"),
      K("comms_logger", W, kOpaque, "disabled", "Communication logger; zrt counts bytes always")
          .off("{\"enabled\": false}"),

      // ---- Checkpoints (DeepSpeed's block plus zrt's keys) ----
      K("checkpoint", I, kObject, "no checkpoints", "Saving and resuming"),
      K("checkpoint.tag_validation", W, kEnumNoCase, "Warn",
        "Cross-rank tag check; zrt tags are the step number, equal on every rank")
          .choices("Ignore|Warn|Fail")
          .off("\"Warn\""),
      K("checkpoint.load_universal", W, kBool, "false",
        "Universal checkpoints; every zrt checkpoint loads at any world size")
          .off("false"),
      K("checkpoint.use_node_local_storage", E, kBool, "false",
        "Per-node checkpoint files without a shared file system")
          .off("false"),
      K("checkpoint.parallel_write", W, kOpaque, "{}", "Pipeline-stage parallel writes").off("{}"),
      K("checkpoint.save_dir", I, kString, "output_dir/checkpoints",
        "Directory holding one sub-directory per tag")
          .zrt(),
      K("checkpoint.save_interval", I, kInt, "0",
        "Save every N optimizer steps and after the last; 0: never save")
          .range(0)
          .zrt(),
      K("checkpoint.save_interval_minutes", I, kNumber, "0",
        "Also save when this many minutes of wall-clock time have passed since the last save "
        "(rank 0's clock decides); 0: off")
          .range(0)
          .zrt(),
      K("checkpoint.preempt_grace_s", I, kNumber, "0",
        "After SIGTERM, SIGINT or SIGUSR1, zrt-train saves and exits 75; if that takes longer "
        "than this, it exits 76 at once with the previous checkpoint intact; 0: no limit of its "
        "own (the cluster's SIGKILL)")
          .range(0)
          .zrt(),
      K("checkpoint.on_save_error", I, kEnum, "stop",
        "A failed save (full disk, I/O error, no permission): \"stop\" ends the run with the "
        "error; \"continue\" logs it and trains on (the previous checkpoint stays latest; "
        "status 1 at the end if the last step's save failed)")
          .choices("stop|continue")
          .zrt(),
      K("checkpoint.keep_last", I, kInt, "0", "Keep the newest N checkpoints; 0: keep all")
          .range(0)
          .zrt(),
      K("checkpoint.direct_io", I, kBool, "true",
        "Write the tensor data past the page cache (O_DIRECT; file systems that refuse it get "
        "ordinary writes); false: through the page cache")
          .zrt(),
      K("checkpoint.async", I, kBool, "false",
        "Write checkpoints on a background thread while training goes on")
          .zrt(),
      K("checkpoint.load", I, kString, "auto",
        "\"auto\" or \"latest\": resume from save_dir's latest checkpoint, a fresh start if "
        "there is none; \"none\": a fresh start; otherwise the tag to resume from")
          .zrt(),
      K("checkpoint.overwrite", I, kBool, "false",
        "Let a fresh start (load \"none\") save into a save_dir that holds checkpoints, "
        "removing them; otherwise that start is refused")
          .zrt(),

      // ---- zrt's own blocks ----
      K("model", I, kObject, "required", "The model to train").zrt(),
      K("model.type", I, kEnum, "gpt2",
        "Architecture: GPT-2, the Llama family (Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3, Mistral), or "
        "a mixture of experts (Mixtral, Qwen2-MoE / Qwen1.5-MoE, Qwen3-MoE)")
          .choices("gpt2|llama|qwen2|qwen3|mistral|mixtral|qwen2_moe|qwen3_moe")
          .zrt(),
      K("model.preset", I, kEnum, "none",
        "Dimensions to start from (of model.type's architecture); without one a gpt2 needs all "
        "five dimensions, a Llama-family model hidden_size, intermediate_size, "
        "num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings (unless "
        "init_from is a Hugging Face model directory, whose config.json gives them)")
          .choices(
              "gpt2-tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|llama-tiny|llama-3.2-1b|"
              "llama-3.2-3b|llama-3.1-8b|llama-3.1-70b|qwen2.5-0.5b|qwen2.5-7b|qwen3-0.6b|qwen3-8b|"
              "smollm2-135m|"
              "mixtral-8x7b|qwen2-moe-a2.7b|qwen3-30b-a3b|mixtral-tiny|qwen2-moe-tiny|"
              "qwen3-moe-tiny")
          .zrt(),
      K("model.n_layer", I, kInt, "preset", "gpt2: transformer blocks").range(1).zrt(),
      K("model.n_head", I, kInt, "preset", "gpt2: attention heads (divides n_embd)").range(1).zrt(),
      K("model.n_embd", I, kInt, "preset", "gpt2: embedding width").range(1).zrt(),
      K("model.vocab_size", I, kInt, "preset", "Vocabulary size").range(1).zrt(),
      K("model.seq_len", I, kInt, "preset",
        "Sequence length trained at (context); Llama presets: min(max_position_embeddings, "
        "8192)")
          .range(1)
          .zrt(),
      K("model.hidden_size", I, kInt, "preset", "Llama family: residual width").range(1).zrt(),
      K("model.intermediate_size", I, kInt, "preset", "Llama family: SwiGLU MLP width")
          .range(1)
          .zrt(),
      K("model.num_hidden_layers", I, kInt, "preset", "Llama family: decoder blocks")
          .range(1)
          .zrt(),
      K("model.num_attention_heads", I, kInt, "preset", "Llama family: query heads").range(1).zrt(),
      K("model.num_key_value_heads", I, kInt, "num_attention_heads",
        "Llama family: key/value heads (divides num_attention_heads; fewer: grouped-query)")
          .range(1)
          .zrt(),
      K("model.head_dim", I, kInt, "hidden_size / num_attention_heads",
        "Llama family: width of one head (even)")
          .range(2)
          .zrt(),
      K("model.max_position_embeddings", I, kInt, "preset",
        "Llama family: the positions the model was built for (seq_len may not exceed it, but with "
        "yarn rotary scaling up to original_max_position_embeddings x factor)")
          .range(1)
          .zrt(),
      K("model.tiling", I, kObject, "{}",
        "Tiled compute for long sequences: the head and the MLP in tiles of rows of the "
        "sequence (docs/config.md)")
          .zrt(),
      K("model.tiling.head_rows", I, kInt, "auto",
        "Rows per tile of the head's logits, loss and backward; auto (0): whole up to 1 GiB of "
        "logits, tiles of about 1 GiB beyond; -1: never tiled")
          .range(-1)
          .on_auto(AutoRule::kDefault)
          .zrt(),
      K("model.tiling.mlp_rows", I, kInt, "auto",
        "Llama family and mixtures of experts: rows per tile of the SwiGLU MLP and of the MoE "
        "layers (gate, up and h, and a MoE layer's routing and experts, recomputed per tile in "
        "the backward); auto (0): tiles of about 1 GiB once the whole would pass 4 GiB; -1: never")
          .range(-1)
          .on_auto(AutoRule::kDefault)
          .zrt(),
      K("model.rms_norm_eps", I, kNumber, "1e-5", "Llama family: RMSNorm epsilon").range(0).zrt(),
      K("model.rope_theta", I, kNumber, "10000", "Llama family: rotary base frequency")
          .range(0)
          .zrt(),
      K("model.rope_scaling", I, kObject, "none",
        "Llama family and mixtures of experts: rotary frequency scaling, as config.json's "
        "rope_scaling (docs/config.md, \"Rotary scaling\")")
          .zrt(),
      K("model.rope_scaling.rope_type", I, kEnum, "default",
        "\"llama3\": Llama 3.1/3.2's scaling of the low frequencies; \"yarn\": YaRN (Qwen2.5 / "
        "Qwen3 past their pretrained context); \"linear\": position interpolation; "
        "\"default\": none")
          .choices("default|linear|llama3|yarn")
          .zrt(),
      K("model.rope_scaling.factor", I, kNumber, "1",
        "llama3: the low frequencies' divisor; yarn: the context's growth (interpolated "
        "frequencies divided by it); linear: every frequency's divisor")
          .range(1)
          .zrt(),
      K("model.rope_scaling.low_freq_factor", I, kNumber, "1", "llama3: low-frequency band edge")
          .range(0)
          .zrt(),
      K("model.rope_scaling.high_freq_factor", I, kNumber, "4", "llama3: high-frequency band edge")
          .range(0)
          .zrt(),
      K("model.rope_scaling.original_max_position_embeddings", I, kInt, "8192 (yarn: required)",
        "llama3, yarn: the context the model was pretrained at")
          .range(1)
          .zrt(),
      K("model.rope_scaling.attention_factor", I, kNumber, "0.1 ln(factor) + 1",
        "yarn: the factor on the rotation's cosine and sine (default: from factor, or from "
        "mscale / mscale_all_dim when both are given)")
          .range(0)
          .zrt(),
      K("model.rope_scaling.beta_fast", I, kNumber, "32",
        "yarn: rotations over the original context above which a dimension is kept")
          .range(0)
          .zrt(),
      K("model.rope_scaling.beta_slow", I, kNumber, "1",
        "yarn: rotations below which a dimension is interpolated")
          .range(0)
          .zrt(),
      K("model.rope_scaling.mscale", I, kNumber, "none",
        "yarn (DeepSeek's form): with mscale_all_dim, attention_factor = (0.1 mscale ln(factor) + "
        "1) / (0.1 mscale_all_dim ln(factor) + 1)")
          .range(0)
          .zrt(),
      K("model.rope_scaling.mscale_all_dim", I, kNumber, "none", "yarn: see mscale").range(0).zrt(),
      K("model.rope_scaling.truncate", I, kBool, "true",
        "yarn: round the ramp's correction range to whole dimensions")
          .zrt(),
      K("model.tie_word_embeddings", I, kBool, "false (qwen2.5-0.5b, qwen3-0.6b, llama-3.2: true)",
        "Llama family: the head is the token embedding (no lm_head.weight)")
          .zrt(),
      K("model.attention_bias", I, kBool, "false (qwen2: true)",
        "Llama family: q/k/v projections have biases (Qwen2 always)")
          .zrt(),
      K("model.sliding_window", I, kInt, "none",
        "Sliding-window attention: query t sees keys after t - sliding_window (Mistral, Mixtral, "
        "Qwen2's, Qwen3's and Qwen3-MoE's use_sliding_window); none at or above seq_len")
          .range(1)
          .zrt(),
      K("model.max_window_layers", I, kInt, "0",
        "qwen2, qwen3: the first layer the sliding window applies to (the layers before attend "
        "over the whole sequence)")
          .range(0)
          .zrt(),
      K("model.num_experts", I, kInt, "preset",
        "Mixture of experts: routed experts per layer (Mixtral's config.json: num_local_experts)")
          .range(1)
          .zrt(),
      K("model.num_experts_per_tok", I, kInt, "preset",
        "Mixture of experts: experts each token is routed to (top-k)")
          .range(1)
          .zrt(),
      K("model.moe_intermediate_size", I, kInt, "preset (mixtral: intermediate_size)",
        "Mixture of experts: one expert's SwiGLU width")
          .range(1)
          .zrt(),
      K("model.shared_expert_intermediate_size", I, kInt, "preset (0: none)",
        "qwen2_moe: the shared expert's width (behind its sigmoid gate)")
          .range(0)
          .zrt(),
      K("model.norm_topk_prob", I, kBool, "preset (mixtral: true)",
        "Mixture of experts: renormalise each token's top-k routing weights to sum to 1")
          .zrt(),
      K("model.decoder_sparse_step", I, kInt, "1",
        "qwen2_moe / qwen3_moe: layer l routes through experts iff (l+1) % step == 0")
          .range(1)
          .zrt(),
      K("model.mlp_only_layers", I, kIntList, "[]",
        "qwen2_moe / qwen3_moe: layers with a dense SwiGLU MLP instead of experts")
          .range(0)
          .zrt(),
      K("model.router_aux_loss_coef", I, kNumber, "preset (config.json's)",
        "Mixture of experts: weight of transformers' load-balancing term in the training loss, "
        "computed per forward over its tokens and MoE layers")
          .range(0)
          .zrt(),
      K("model.router_z_loss_coef", I, kNumber, "0",
        "Mixture of experts: weight of the router z-loss (ST-MoE: the mean over the MoE layers' "
        "tokens of logsumexp(router logits)^2); 0: none")
          .range(0)
          .zrt(),
      K("model.capacity_factor", I, kNumber, "0 (dropless)",
        "Mixture of experts: an expert takes at most ceil(factor x tokens x k / experts) pairs "
        "per forward, the rest dropped in token order (counted in metrics.jsonl); 0: dropless")
          .range(0)
          .zrt(),
      K("model.expert_rows_reserve", I, kNumber, "1.25",
        "Mixture of experts under expert parallelism: the rows this rank's experts' buffers hold "
        "at first, as a multiple of the balanced share (tokens x num_experts_per_tok); a step "
        "whose routing sends more grows them (logged; metrics.jsonl expert_rows_load / "
        "expert_rows_capacity); autoep_size x min(k, experts/autoep_size) / k reserves the "
        "dropless worst case up front")
          .range(1)
          .zrt(),
      K("model.activation_checkpointing", I, kBool, "false",
        "Keep block inputs only; recompute each block in backward")
          .zrt(),
      K("model.frozen", I, kStringList, "[]",
        "Parameters not trained, by name (Hugging Face's; a pattern with a '.' is a glob over the "
        "whole name with '*', '?' and '[0-9]', one without matches any component: \"mlp\"): "
        "their gradients are dropped, the optimizer leaves them as they are")
          .zrt(),
      K("model.trainable", I, kStringList, "all",
        "The only parameters trained, by the same patterns; every other one frozen. Not with "
        "model.frozen")
          .zrt(),
      K("model.init_from", I, kString, "none",
        "Hugging Face weights to start from: a model directory (config.json, whose architecture "
        "and dimensions the model keys must agree with, and model.safetensors or a sharded "
        "index) or a .safetensors file; else a random init from seed")
          .zrt(),
      K("data", I, kObject, "required", "Token data").zrt(),
      K("data.train", I, kString, "required",
        "Training data: a path or glob of llm.c token shards or packed SFT shards, or the folder "
        "prepare-sft wrote")
          .zrt(),
      K("data.val", I, kString, "none", "Validation data, as data.train").zrt(),
      K("data.shuffle", I, kBool, "true", "Sample training windows in a seeded random order").zrt(),
      K("data.seed", I, kInt, "seed", "Seed of the data order").range(0).zrt(),
      K("data.document_mask", I, kBool, "false",
        "llm.c shards: attention stops at each document separator, positions restart")
          .zrt(),
      K("data.document_separator", I, kInt, "50256 (16-bit shards), 128000 (32-bit)",
        "The token that starts each document, for data.document_mask")
          .range(0)
          .zrt(),
      K("train", I, kObject, "required", "The training loop").zrt(),
      K("train.steps", I, kInt, "required", "Optimizer steps to run").range(1).zrt(),
      K("train.eval_interval", I, kInt, "0", "Evaluate every N steps and at the end; 0: never")
          .range(0)
          .zrt(),
      K("train.eval_batches", I, kInt, "10",
        "Micro-batches per evaluation and data-parallel rank, at most one pass over data.val "
        "(each sequence once); 0: all of data.val")
          .range(0)
          .zrt(),
      K("train.log_interval", I, kInt, "10", "Log loss, lr, norm and throughput every N steps")
          .range(1)
          .zrt(),
      K("train.sample_tokens", I, kInt, "0",
        "After the last step, generate this many bytes from the prompt \"And God said\" "
        "(byte-level models: a vocabulary of 256); 0: none")
          .range(0)
          .zrt(),
      K("device", I, kObject, "auto", "Where each rank computes").zrt(),
      K("device.type", I, kEnum, "auto",
        "cpu, cuda (GPU = local rank) or auto (cuda when a GPU is usable)")
          .choices("cpu|cuda|auto")
          .zrt(),
      K("device.memory_limit_gb", I, kNumber, "0",
        "Device memory cap in GiB (a CPU rank then fails like a GPU of that size); 0: none")
          .range(0)
          .zrt(),
      K("device.stream_delay_us", I, kInt, "0",
        "CPU debug: random delay up to this before each stream operation")
          .range(0)
          .zrt(),
      K("comm_timeout_s", I, kNumber, "600",
        "Same as comm.timeout_s: a collective or wait longer than this ends the run (give one)")
          .range(0.001)
          .zrt(),
      K("comm", I, kObject, "{}", "Collectives").zrt(),
      K("comm.timeout_s", I, kNumber, "600", "Fail a collective that takes longer than this")
          .range(0.001)
          .zrt(),
      K("comm.reduce_scatter", I, kEnum, "alltoall",
        "MPI reduce-scatter: alltoall + local sum, or native MPI_Reduce_scatter_block")
          .choices("alltoall|native")
          .zrt(),
      K("comm.max_chunk_mb", I, kInt, "32", "Largest piece one MPI call moves (MiB)")
          .range(1, 1024)
          .zrt(),
      K("comm.host_staged_collectives", I, kBool, "false (true when ranks share a GPU)",
        "Collectives over MPI through pinned host memory instead of NCCL")
          .zrt(),
      K("comm.check_collective_sequence", I, kBool, "false",
        "Debug: agree on every collective across ranks first; the first that differs stops "
        "the run naming it (instead of a hang)")
          .zrt(),
      K("comm.ranks_per_node", I, kInt, "0",
        "Ranks per node for the node topology; 0: as MPI reports (smaller: simulate nodes)")
          .range(0)
          .zrt(),
      K("comm.simulated_bandwidth_gb_per_s", I, kNumber, "0",
        "CPU backend: model a link of this many GB/s (10^9 bytes/s); 0: off")
          .range(0)
          .zrt(),
      K("comm.simulated_latency_us", I, kNumber, "0",
        "CPU backend: add this latency to every collective")
          .range(0)
          .zrt(),
      K("trace", I, kObject, "off", "Chrome trace of streams and collectives").zrt(),
      K("trace.path", I, kString, "none",
        "Chrome trace file; each rank writes its own, with its rank before the extension")
          .zrt(),
      K("trace.steps", I, kIntPair, "[2, 3]", "First and last optimizer step traced")
          .range(1)
          .zrt(),
      K("seed", I, kInt, "1234", "Seed of initialisation and data order").range(0).zrt(),
      K("output_dir", I, kString, "output", "Logs, traces and default checkpoint directory").zrt(),
      K("log_level", I, kEnum, "info", "Logging threshold (ZRT_LOG_LEVEL overrides)")
          .choices("trace|debug|info|warn|error|off")
          .zrt(),
  };
  std::vector<KeyInfo> table;
  for (const K& row : rows) table.push_back(row.info);
  return table;
}

std::string parent_of(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string number(double x) {
  return fmt::format("{}", x);
}

std::string quoted_choices(const char* choices) {
  std::string out;
  std::string item;
  std::istringstream in(choices);
  bool first = true;
  while (std::getline(in, item, '|')) {
    out += (first ? "\"" : ", \"") + item + "\"";
    first = false;
  }
  return out;
}

std::string range_text(const KeyInfo& key) {
  const bool lo = !std::isnan(key.min);
  const bool hi = !std::isnan(key.max);
  if (lo && hi) return fmt::format(" in [{}, {}]", number(key.min), number(key.max));
  if (lo) return fmt::format(" >= {}", number(key.min));
  if (hi) return fmt::format(" <= {}", number(key.max));
  return "";
}

// Table-cell text with Markdown's emphasis character escaped ("*norm*" stays literal).
std::string markdown_text(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '*') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

const std::vector<KeyInfo>& key_table() {
  static const std::vector<KeyInfo> table = build_table();
  return table;
}

const KeyInfo* find_key(const std::string& path) {
  static const std::map<std::string, const KeyInfo*> index = [] {
    std::map<std::string, const KeyInfo*> m;
    for (const KeyInfo& key : key_table()) m.emplace(key.path, &key);
    return m;
  }();
  const auto it = index.find(path);
  return it == index.end() ? nullptr : it->second;
}

const std::vector<ForeignKey>& foreign_keys() {
  // Context parallelism elsewhere (Megatron, torchtitan, Accelerate) is ring attention: it
  // splits the sequence too, so zrt's sequence parallelism (DeepSpeed Ulysses: all-to-all
  // over heads) is the setting such a user is looking for, with the head-count rule it brings.
  static const char* const kRing =
      "is ring-attention context parallelism; zrt splits the sequence with DeepSpeed Ulysses "
      "(sequence_parallel_size must divide the head count)";
  static const std::vector<ForeignKey> table = {
      {"ep_size", "expert_parallel.autoep_size", "is DeepSpeed's MoE layer argument"},
      {"expert_model_parallel_size", "expert_parallel.autoep_size",
       "is Megatron's --expert-model-parallel-size"},
      {"expert_parallel_degree", "expert_parallel.autoep_size",
       "is torchtitan's parallelism.expert_parallel_degree"},
      {"expert_parallel_size", "expert_parallel.autoep_size", "is the expert-parallel degree"},
      {"ulysses_sequence_parallel_size", "sequence_parallel_size", "is veRL's Ulysses degree"},
      {"sp_size", "sequence_parallel_size", "is the sequence-parallel degree"},
      {"sequence_parallel_degree", "sequence_parallel_size", "is the sequence-parallel degree"},
      {"context_parallel_size", "sequence_parallel_size", kRing},
      {"context_parallel_degree", "sequence_parallel_size", kRing},
      {"cp_size", "sequence_parallel_size", kRing},
      {"micro_batch_size", "train_micro_batch_size_per_gpu", "is Megatron's --micro-batch-size"},
      {"per_device_train_batch_size", "train_micro_batch_size_per_gpu",
       "is Hugging Face TrainingArguments'"},
      {"global_batch_size", "train_batch_size", "is Megatron's --global-batch-size"},
      {"max_grad_norm", "gradient_clipping", "is Hugging Face TrainingArguments'"},
      {"clip_grad", "gradient_clipping", "is Megatron's --clip-grad"},
  };
  return table;
}

const ForeignKey* find_foreign_key(const std::string& name) {
  for (const ForeignKey& key : foreign_keys()) {
    if (name == key.name) return &key;
  }
  return nullptr;
}

std::vector<std::string> child_keys(const std::string& parent) {
  std::vector<std::string> out;
  for (const KeyInfo& key : key_table()) {
    const std::string path = key.path;
    if (parent_of(path) != parent) continue;
    out.push_back(parent.empty() ? path : path.substr(parent.size() + 1));
  }
  return out;
}

std::string expected_form(const KeyInfo& key) {
  std::string form;
  switch (key.kind) {
    case KeyKind::kObject:
    case KeyKind::kOpaque:
      form = "an object";
      break;
    case KeyKind::kBool:
      form = "true or false";
      break;
    case KeyKind::kInt:
      form = "an integer" + range_text(key);
      break;
    case KeyKind::kNumber:
      form = "a number" + range_text(key);
      break;
    case KeyKind::kString:
      form = "a string";
      break;
    case KeyKind::kEnum:
      form = "one of " + quoted_choices(key.choices);
      break;
    case KeyKind::kEnumNoCase:
      form = "one of " + quoted_choices(key.choices) + " (any case)";
      break;
    case KeyKind::kNumberPair:
      form = "a list of two numbers" + range_text(key);
      break;
    case KeyKind::kIntPair:
      form = "a list of two integers" + range_text(key);
      break;
    case KeyKind::kStringList:
      form = "a list of strings";
      break;
    case KeyKind::kIntList:
      form = "a list of integers" + range_text(key);
      break;
  }
  if (key.auto_rule != AutoRule::kNone) form += " or \"auto\"";
  return form;
}

const char* status_name(KeyStatus status) {
  switch (status) {
    case KeyStatus::kImplemented:
      return "implemented";
    case KeyStatus::kAcceptedWithWarning:
      return "warning";
    case KeyStatus::kUnsupportedError:
      return "error";
  }
  return "?";
}

std::string generate_key_table_markdown() {
  std::string out =
      "# zrt config keys\n"
      "\n"
      "<!-- Generated from config/key_table.cc by the test \"docs/config-keys.md\n"
      "     matches the key table\" (tests/config/test_config.cc); do not edit by hand. Run\n"
      "     ZRT_UPDATE_DOCS=1 build/tests/test_config to rewrite it. -->\n"
      "\n"
      "Every key a zrt config may hold, DeepSpeed's and zrt's own (see config.md for the\n"
      "guide). Any other key is an error that names its path and the closest valid key.\n"
      "\n"
      "- **implemented**: read and honoured.\n"
      "- **warning**: accepted and logged as having no effect in zrt (logging, tuning or\n"
      "  memory-layout options that do not change what is trained). *warning unless X*: X,\n"
      "  DeepSpeed's default, is accepted silently.\n"
      "- **error**: changes training and is not implemented, so it is never ignored. *error\n"
      "  unless X*: X leaves the feature off and is accepted. For a block, `{}` means an empty\n"
      "  block; `{\"enabled\": false}` means a block whose `enabled` is false (or an empty one).\n"
      "\n"
      "`null` anywhere means the default. Integers may be written as `5e8` when integral. The\n"
      "Hugging Face value `\"auto\"` is accepted where the form says so: batch keys are solved\n"
      "by the batch rule, `scheduler.params.total_num_steps` takes `train.steps`, and the\n"
      "others take the default shown.\n"
      "\n"
      "| key | zrt | form | default | meaning | from |\n"
      "|---|---|---|---|---|---|\n";
  for (const KeyInfo& key : key_table()) {
    std::string status = status_name(key.status);
    if (key.status != KeyStatus::kImplemented && key.off_value[0] != '\0') {
      status += fmt::format(" unless `{}`", key.off_value);
    }
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", key.path, status,
                       markdown_text(expected_form(key)), markdown_text(key.default_text),
                       markdown_text(key.meaning), key.deepspeed ? "DeepSpeed" : "zrt");
  }
  out +=
      "\n"
      "## Names from other frameworks\n"
      "\n"
      "An unknown key whose last part is one of these, in any block, is answered with zrt's\n"
      "key (still an error: nothing is renamed silently).\n"
      "\n"
      "| name | zrt's key | note |\n"
      "|---|---|---|\n";
  for (const ForeignKey& key : foreign_keys()) {
    out += fmt::format("| `{}` | `{}` | `{}` {} |\n", key.name, key.path, key.name,
                       markdown_text(key.origin));
  }
  return out;
}

}  // namespace zrt::config
