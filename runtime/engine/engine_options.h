// EngineOptions: everything the engine is configured with (DeepSpeed's zero_optimization
// block, the precision keys, gradient accumulation and clipping, offload), each default written
// once here, and the one validate() that the config layer, the engine and zrt-mem all call, so
// a rule (e.g. parameter offload needs stage 3) is stated, worded and tested in one place.
//
// Who reads what: the config layer (config/config.cc) fills EngineOptions from a DeepSpeed
// config and its key table (config/key_table.cc) documents these defaults; ZeroEngine runs
// them; zrt-mem (tools/mem/) replays them. Where a unit's buffers live for these options is
// unit_placement.h's.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/engine/loss_scaler.h"
#include "runtime/engine/unit_schedule.h"

namespace zrt {

// DeepSpeed's offload_optimizer / offload_param with device "cpu".
struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = true;  // false: pageable host memory (hosts with a low `ulimit -l`)
  // offload_optimizer only (stage 3): the share of the optimizer state in host memory, the
  // rest stays on the device and the device steps it (UnitSchedule::offloaded_units).
  double ratio = 1.0;
};

enum class OffloadSplitStep { kAuto, kOn, kOff };

struct EngineOptions {
  int stage = 0;
  DType compute_dtype = DType::kFloat32;
  std::optional<DType> communication_dtype;  // default: compute_dtype
  DType grad_accum_dtype = DType::kFloat32;  // data_types.grad_accum_dtype
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  std::int64_t reduce_bucket_size = 500000000;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_max_live_parameters = 1000000000;
  std::int64_t stage3_max_reuse_distance = 0;  // ScheduleOptions (unit_schedule.h)
  std::int64_t stage3_param_persistence_threshold = 100000;
  bool overlap_comm = true;  // false: the compute stream waits for each collective at once
  std::int64_t alignment = 64;
  LossScaleOptions loss_scale;  // used with fp16 compute
  // Optimizer offload (stages 1-3): fp32 master weights and optimizer state live in host memory
  // and the CPU steps them; parameter offload (stage 3, with optimizer offload): parameter
  // slices and gradient accumulation live in host memory too.
  OffloadOptions offload_optimizer;
  OffloadOptions offload_param;
  int offload_staging_buffers = 4;  // pinned buffers carrying updated parameters to the device
  // Optimizer offload without parameter offload: a final gradient slice comes down in pieces of
  // at most this many elements, and the CPU optimizer steps each piece once it has landed, so
  // the last unit of the backward (the embedding, which the next forward needs first) is not
  // stepped only after the whole of it is on the host.
  std::int64_t offload_transfer_piece = std::int64_t{1} << 22;
  // Optimizer offload: the CPU step in two passes. The first writes only the updated
  // compute-dtype parameters, what the next forward waits for (for AdamW 16 of the 28 bytes a
  // parameter moves); the second writes the fp32 parameters and states while that forward and
  // the backward run (the same arithmetic again, so the same bits). More host memory traffic in
  // all, less of it on the step's critical path: on when the model computes on a GPU (kAuto),
  // off on the CPU backend, whose compute needs the cores the second pass would take.
  OffloadSplitStep offload_split_step = OffloadSplitStep::kAuto;
  // Hierarchical sharding (MiCS's mics_shard_size, HSDP): the state is sliced over groups of
  // this many ranks and replicated across them (the engine's group is then the shard group and
  // it is given the replica group); 0: sliced over every rank.
  int mics_shard_size = 0;
  // ZeRO++ (stage 3 / stages 2-3, without parameter offload): the parameter gathers carry int8
  // codes with a scale per block (qwZ, zero_quantized_weights) and the gradient
  // reduce-scatters are quantized and summed in fp32, within the node first (qgZ,
  // zero_quantized_gradients), through the QuantizedCollectives the engine is given. The
  // master weights and the optimizer never see quantized values.
  bool quantized_weights = false;
  bool quantized_gradients = false;
  // ZeRO++ hpZ (stage 3, zero_hpz_partition_size): each unit's first gather of a training
  // micro-batch runs over every rank as usual; right after it each rank keeps a secondary
  // shard, its 1/S of the gathered compute-dtype parameters (its place in the engine's group
  // of S ranks, normally one node), and the unit's later gathers in the micro-batch (the
  // backward's) all-gather those over the S ranks only. The secondary shards are rebuilt every
  // micro-batch and freed after the unit's last backward gather; the master weights, the
  // optimizer and the gradient reduce-scatters are untouched. 0 or 1: off.
  int hpz_partition_size = 0;
  // Expert parallelism (expert_parallel.autoep_size, DeepSpeed's AutoEP): the experts of each
  // mixture-of-experts layer are split over groups of this many data-parallel ranks (the
  // expert-parallel group; tokens reach them by all-to-all, models/moe/expert_dispatch.h), and
  // an expert's state is sliced over the data-parallel degree / ep ranks holding the same
  // experts (the expert-data-parallel group, the engine's shard group 1), its gradients averaged
  // there and multiplied by 1 / ep. 1: every expert on every rank, in group 0 like any unit.
  int expert_parallel_size = 1;
  // use_data_before_expert_parallelism (DeepSpeed's name): the expert-parallel groups are
  // strided over the data-parallel ranks and the expert-data-parallel groups consecutive,
  // instead of the reverse (parallel_dims.h).
  bool data_before_expert_parallel = false;
  // Ulysses sequence parallelism (sequence_parallel_size): each sequence is cut into this many
  // chunks over a block of as many consecutive ranks of a node, which attend over the whole
  // sequence through all-to-alls (the model's part). The engine is unchanged by it: ZeRO
  // shards and reduces over the whole world, sp blocks included; the data-parallel degree the
  // batch rule counts is world / sequence_parallel_size. 1: off.
  int sequence_parallel_size = 1;
  // Whether the model's backward ends at ParamAccess::first_backward_module()
  // (Model::stops_backward_early(); set by whoever builds the engine for a model, not a config
  // key): the engine's schedule then ends each micro-batch's backward at the lowest module with
  // a trained parameter (UnitSchedule::lowest_trained_module), which is that module.
  bool model_stops_backward_early = false;
  // Whether the model never asks for a frozen parameter's gradient
  // (Model::skips_frozen_gradients(); set as model_stops_backward_early): a frozen unit then
  // gets no gradient bucket, and ParamAccess::grad of a frozen parameter is an error.
  bool model_skips_frozen_gradients = false;
};

// The schedule the engine runs for these options (zrt-mem replays the same one).
ScheduleOptions schedule_options(const EngineOptions& options);

// Sets what the engine takes from the model it serves rather than from a config key
// (model_stops_backward_early, model_skips_frozen_gradients): whoever builds an engine for a
// model calls it, so every builder runs the schedule zrt-train runs.
void take_model_capabilities(EngineOptions& options, const Model& model);

// Optimizer offload at one micro-batch per step (stages 2-3, the reduce-scatter in the compute
// dtype and not quantized): an offloaded unit's reduced gradient slice is already its final
// gradient (grad_accum_dtype would only hold 0 + that slice, the same values), so it goes to host
// memory straight from the reduction's bucket, in the compute dtype, and is the CPU optimizer's
// input as it is. Without parameter offload the device keeps no gradient slice for such a unit;
// with it the host neither stages nor accumulates the slice. With fp32 accumulation the copy
// down and the CPU optimizer's read move 2 bytes per parameter instead of 4. Results are
// unchanged bit for bit. Otherwise (gradient accumulation, an fp32 or quantized reduction) the
// final slice is accumulated in grad_accum_dtype, on the device (on the host with parameter
// offload), and goes to the CPU optimizer from there.
bool offload_takes_reduced_slices(const EngineOptions& options);

// Whether the model writes each micro-batch's gradients into a bucket per unit, which the engine
// reduces into the rank's gradient slice (stages 2-3), rather than accumulating them over the
// micro-batches in full gradients that are reduced once (stages 0-1). `reduces_nothing`: no
// other rank shares this rank's gradients (a run of one rank: every shard group of one rank,
// no replicas, no expert scaling). Stages 2-3 then have nothing to reduce a bucket with, and
// where the slices would be on the device (no parameter offload, not
// offload_takes_reduced_slices, no qgZ) the slice is the whole unit: the model accumulates into
// full gradients as stages 0-1 do, with no bucket, zero fill or accumulation pass a micro-batch
// (16 GB of bf16 buckets filled, written and added a micro-batch at 8B parameters), in the
// accumulation dtype, as one rank at stages 0-1 forms them to the bit.
bool per_micro_batch_grads(const EngineOptions& options, bool reduces_nothing);

// Whether ZeroEngine::enqueue_step takes the step's decision on the device (then the engine
// keeps the decision there, 8 bytes, and a pinned float for the norm read back): without
// optimizer offload (the CPU optimizer needs the norm on the host anyway) and without fp16 (the
// loss scaler's next scale is taken on the host before the next forward).
bool decides_step_on_device(const EngineOptions& options);

// One problem with a set of options, named after the DeepSpeed config key at fault.
struct OptionProblem {
  std::string key;      // "zero_optimization.offload_param" (an EngineOptions member where the
                        // option has no config key: "offload_staging_buffers")
  std::string message;  // what is wrong and the fix: "parameter offload needs ZeRO stage 3 ..."
  // Every other key the rule read ("zero_optimization.stage"): the config layer drops a problem
  // when one of these was itself reported (a bad stage is reported once, not again through
  // every rule that reads it).
  std::vector<std::string> also;
  std::string text() const { return key + ": " + message; }  // "<key>: <message>"
};

// Every problem with `options` at once, in a fixed order (precision, then the ZeRO keys as the
// config documents them, then offload). Where a key's rules form a chain (hpZ: the stage, then
// MiCS, then the world) only the first it breaks is reported. `world`: the ranks the run has (the
// checks that need it, such as mics_shard_size or zero_hpz_partition_size dividing it, are skipped
// at 0). Empty: valid. The engine's own arguments (its groups, the offload factory) are checked by
// the engine.
std::vector<OptionProblem> validate(const EngineOptions& options, int world = 0);

// Throws InvalidArgument listing every problem validate() finds, one per line; returns when
// there is none.
void check_options(const EngineOptions& options, int world = 0);

}  // namespace zrt
