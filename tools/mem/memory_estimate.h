// The memory estimate behind zrt-mem: what one rank holds on its device and what one node
// holds in host memory, by tracker category, for a ZeRO setting, computed without running.
//
// Two ways in:
//  - a model (any model.type of the registry, models/model_registry.h): exact figures. The
//    parameters go through the engine's own PartitionPlan (units, alignment, padding to a
//    multiple of N x alignment), and the stage-3 gathers and the gradient buckets are found by
//    replaying the schedule the engine itself runs (runtime/engine/unit_schedule.h), so the
//    numbers are the ones the MemoryTracker reports in a real run.
//    Under expert parallelism (engine.expert_parallel_size ep) the rank's parameters are the
//    model's table at that degree (ModelDef::parameters_for: its E/ep experts of every MoE layer
//    as units of their own, sliced over world / ep ranks; the dense ones over the world), and
//    the model's activations hold the dispatch's dropless buffers.
//  - a parameter count Ψ: the ZeRO paper's formulas (no padding), with buffers bounded by the
//    bucket knobs; no activations.
//
// Categories follow MemCategory. "Steady" figures are what stays allocated through a step;
// "buffers" are the transient gradient buckets, gathered parameters (stage 3) and scratch.
//
// Thread-safety: plain functions of their arguments.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "models/model_registry.h"
#include "optimizers/optimizer.h"
#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"
#include "runtime/device/memory.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/model_interface.h"

namespace zrt::mem {

// One row of the planner: a ZeRO stage with or without offload.
struct Setting {
  int stage = 0;
  bool offload_optimizer = false;
  bool offload_param = false;
  std::string name() const;  // "stage 2", "stage 3 + optimizer offload", ...
  bool operator==(const Setting& o) const {
    return stage == o.stage && offload_optimizer == o.offload_optimizer &&
           offload_param == o.offload_param;
  }
};

// The order in which the verdict tries settings: stage 0, 1, 2, 2 + optimizer offload, 3,
// 3 + optimizer offload, 3 + optimizer and parameter offload (least communication and host
// traffic first).
const std::vector<Setting>& verdict_order();
// Every setting the engine accepts, for the table: the verdict order plus stage 1 + optimizer
// offload, in stage order.
const std::vector<Setting>& table_order();

// A model for exact figures: its parameters as the engine sees them, and, for activations and
// the modules recomputed under checkpointing, the model's own hooks.
struct ModelSpec {
  std::vector<ParamSpec> params;
  int num_modules = 0;
  std::shared_ptr<const ModelDef> def;  // null: a parameter table alone (no activations)
  std::string description;
  // model.frozen / model.trainable (train/frozen_parameters.h): the parameters not trained,
  // whose units hold no optimizer state and no gradient slice.
  std::vector<std::string> frozen, trainable;
};

struct Inputs {
  std::optional<ModelSpec> model;  // exact path
  double params = 0.0;             // Ψ, when no model is given
  int world = 1;
  int nodes = 1;  // the ranks are spread evenly; host figures are per node
  // Stage, dtypes, bucket and stage-3 knobs, offload, staging buffers, accumulation steps.
  // The stage and offload flags are overridden per Setting; these are the chosen ones.
  EngineOptions engine;
  int micro_batch = 1;  // B
  // T (the model's seq_len: zrt-train trains at full length). At sequence parallelism
  // (engine.sequence_parallel_size, sp) each rank holds T / sp tokens of every sequence.
  int seq_len = 0;
  bool activation_checkpointing = false;
  // The model's build options beyond checkpointing (ModelOptions): the checkpointed block inputs
  // in pinned host memory (activation_checkpointing.cpu_checkpointing), and the head's and the
  // MLP's tile rows (model.tiling; 0 automatic, -1 never).
  bool cpu_checkpointing = false;
  int head_tile_rows = 0;
  int mlp_tile_rows = 0;
  // The batches carry packed documents (data.document_mask): attention on a GPU then runs on
  // zrt's kernels, not cuDNN's (whose workspace is counted otherwise: an upper bound for packed
  // SFT shards, which carry documents without the key).
  bool documents = false;
  // Expert parallelism: the local experts' rows counted where model.expert_rows_reserve starts
  // them, or at expert_rows rows when set (a run's metrics.jsonl expert_rows_capacity);
  // models/moe/expert_rows.h.
  double expert_rows_reserve = kDefaultExpertRowsReserve;
  std::int64_t expert_rows = 0;
  // The model options these inputs build the model with (`checkpointing` for the switch).
  ModelOptions model_options(bool checkpointing) const;
  // zrt-train's own buffers: two (inputs, targets) token batches on the device (activations)
  // and two pinned host staging copies (workspace).
  bool trainer_buffers = true;
  double device_gib = 80.0;  // capacity per rank, GiB (as device.memory_limit_gb)
  // The backend: on CUDA, NCCL keeps its buffers outside the tracker; on the CPU backend the
  // MPI process groups allocate collective scratch (comm category), sized by `comm`.
  DeviceType device_type = DeviceType::kCuda;
  CommOptions comm;
  // What the optimizer keeps per owned parameter besides the fp32 master weight: Adam two fp32
  // moments (8 bytes, 12 with the master), Lion one (4 bytes, 8 with the master).
  OptimizerSpec optimizer = optimizer_spec(OptimizerKind::kAdam);

  Setting setting() const;  // the chosen one, from engine
  int ranks_per_node() const;
  void validate() const;  // InvalidArgument naming the flag or key
  // The hpZ group size in effect for a setting (engine.hpz_partition_size at stage 3), or 0.
  int hpz(const Setting& setting) const;
  // The setting's name, with the optimizer offload's ratio where it splits the state
  // ("stage 3 + optimizer offload (ratio 0.3)").
  std::string name(const Setting& setting) const;
};

using CategoryBytes = std::array<std::int64_t, kNumMemCategories>;
inline std::int64_t& at(CategoryBytes& b, MemCategory c) {
  return b[static_cast<std::size_t>(c)];
}
inline std::int64_t at(const CategoryBytes& b, MemCategory c) {
  return b[static_cast<std::size_t>(c)];
}

struct Estimate {
  Setting setting;
  std::int64_t padded_params = 0;   // P: all units with padding (Ψ without a model)
  std::int64_t content_params = 0;  // Ψ
  // model.frozen / model.trainable: the rank's frozen parameters (elements, no padding), which
  // hold no optimizer state and no gradient slice.
  std::int64_t frozen_params = 0;
  // Where the backward ends: the engine's first backward module for these parameters (0 unless
  // the model stops early below frozen lower modules; UnitSchedule::lowest_trained_module).
  int first_backward_module = 0;
  // Per rank, device, steady: params (full / slices / persistent), grads (full / slices),
  // master, optimizer. Their sum is the ZeRO paper's model state.
  std::int64_t params = 0, grads = 0, master = 0, optimizer = 0;
  std::int64_t model_state() const { return params + grads + master + optimizer; }
  // Optimizer offload at one micro-batch per step (offload_takes_reduced_slices): the offloaded
  // units' reduced slices go to the host as they are, so `grads` holds only the device-stepped
  // units' slices.
  bool grads_offloaded_as_reduced = false;
  // Transient model-state buffers: stage-3 gathered parameters and gradient buckets, each at
  // its own peak, and the peak of their sum (they overlap in backward).
  std::int64_t gathered_peak = 0, buckets_peak = 0, transient_peak = 0;
  // Stage 3 reads (some) units' slices in place, ungathered: their group has one rank
  // (UnitPlacement::gathered_in_place).
  bool gathered_in_place = false;
  // Trained units' gradients go to a bucket every micro-batch (stages 2-3); false: full
  // gradients (stages 0-1, and 2-3 at one rank: per_micro_batch_grads).
  bool gradient_buckets = false;
  // ZeRO++ hpZ (stage 3, zero_hpz_partition_size S): the secondary shards (1/S of each unit,
  // kept from its forward gather to its last backward gather) at their peak, and the peak of
  // the gathered parameters and secondary shards together (both in the params category).
  std::int64_t secondary_peak = 0, params_buffers_peak = 0;
  std::int64_t model_state_peak() const { return model_state() + transient_peak; }
  // Communication scratch (gradient conversion for communication_data_type; on the CPU backend
  // also the MPI groups' collective scratch) and the engine's workspace (the gradient norm).
  std::int64_t comm = 0, workspace = 0;
  // The kernels' workspace (ModelDef::kernel_workspace_bytes: the attention's requests, as
  // KernelContext grows its buffer; on a GPU also the cuBLASLt workspace), in the workspace
  // category; 0 without a model.
  std::int64_t kernel_workspace = 0;
  // Of comm: ZeRO++'s (zero_quantized_weights / zero_quantized_gradients) scratch of the
  // quantized collectives and qgZ's output slice.
  std::int64_t quantized_comm = 0;
  // Activations at (B, T) with and without activation checkpointing (model + loss + token
  // batches); absent without a model's hooks.
  std::optional<std::int64_t> activations_full, activations_checkpointed;
  // Of the checkpointed ones, with cpu_checkpointing: the block inputs in pinned host memory
  // (in host_per_rank's activations when checkpointing counts).
  std::int64_t activations_host_checkpointed = 0;
  bool checkpointing = false;  // which of the two counts in the total
  std::int64_t activations() const;
  std::int64_t buffers() const { return transient_peak + comm + workspace + kernel_workspace; }
  // Per-rank device peak as the tracker reports it: model_state_peak + activations + comm +
  // workspace + kernel_workspace (the allocator's own overhead is not included).
  std::int64_t device_total() const;
  // Peaks per category as MemoryTracker::usage(kDevice).peak would show them.
  CategoryBytes device_peaks() const;
  // Host bytes per rank by category (pinned or pageable, as the offload blocks say), and per node.
  CategoryBytes host_per_rank{};
  int ranks_per_node = 1;
  std::int64_t host_rank_total() const;
  std::int64_t host_node_total() const { return host_rank_total() * ranks_per_node; }
  bool exact = false;  // from a model (partition + schedule) rather than the formulas
  // Expert parallelism (engine.expert_parallel_size ep > 1; 0 otherwise): of padded_params, the
  // experts' elements (E/ep of every MoE layer, their own units sliced over the world / ep ranks
  // of the expert-data-parallel group) and the slices of them this rank owns; the rest are the
  // dense units, sliced over the world.
  std::int64_t expert_padded_params = 0, expert_shard_params = 0;
  // Expert parallelism's device buffers: in the activations, what the rows this rank's experts
  // receive (their inputs, SwiGLU values, the exchange's staging and scratch: ExpertRows, at
  // Inputs::expert_rows or expert_rows_reserve x the balanced share) add over ep 1's (for the
  // activations in the total); in comm, the dispatch's count vectors. dispatch_worst_extra: what
  // the dropless worst case (every rank of the group routing its tokens here) would add to the
  // activations beyond that, if a step's routing grew the buffers that far.
  std::int64_t dispatch_activations = 0, dispatch_comm = 0, dispatch_worst_extra = 0;
};

Estimate estimate(const Inputs& in, const Setting& setting);

// The verdict: the first setting in verdict_order() whose device_total fits `capacity_bytes`,
// or nothing.
std::optional<Setting> first_fit(const std::vector<Estimate>& estimates,
                                 std::int64_t capacity_bytes);

// Partial offload between stage 3 and stage 3 + optimizer offload: the smallest
// offload_optimizer.ratio, in hundredths, at which stage 3 + optimizer offload fits
// `capacity_bytes` (the most optimizer state the device can keep, the least the CPU steps),
// when full optimizer offload fits and stage 3 without offload does not; nullopt otherwise.
std::optional<double> smallest_fitting_ratio(const Inputs& in, std::int64_t capacity_bytes);

// Everything zrt-train would run with, from a validated config: its model (at its seq_len),
// world size, micro-batch, engine options with the offload blocks, activation checkpointing and
// device.memory_limit_gb (when set).
Inputs inputs_from_config(const Config& config);

// The parameters the engine sees for a model (names, shapes, modules), from its registry hooks.
ModelSpec model_spec(std::shared_ptr<const ModelDef> def);

}  // namespace zrt::mem
