#include "tools/mem/memory_estimate.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "kernels/kernel_context.h"
#include "models/transformer/sequence_parallel_shape.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "runtime/engine/engine_parallel_dims.h"
#include "runtime/engine/partition.h"
#include "runtime/engine/unit_placement.h"
#include "runtime/engine/unit_schedule.h"
#include "tools/mem/mpi_scratch.h"
#include "train/frozen_parameters.h"

namespace zrt::mem {

namespace {

using I64 = std::int64_t;

I64 size_of(DType t) {
  return static_cast<I64>(dtype_size(t));
}

// zrt-train's token batches (train/batch_feeder.cc): two device buffers (activations) and two
// pinned host staging copies (workspace) of int32 arrays: inputs and targets of B x T tokens, at
// sequence parallelism inputs, targets and positions of the chunk's B x T/sp.
I64 token_batch_bytes(int B, int T, int sp) {
  const I64 elements = sp > 1 ? 3 * I64{B} * (T / sp) : 2 * I64{B} * T;
  return 2 * (elements * 4);
}

EngineOptions options_for(const Inputs& in, const Setting& s) {
  EngineOptions o = in.engine;
  o.stage = s.stage;
  // As zrt-train builds the engine for the model: its backward ends at the lowest trained module.
  o.model_stops_backward_early = in.model && in.model->def && in.model->def->stops_backward_early();
  o.model_skips_frozen_gradients =
      in.model && in.model->def && in.model->def->skips_frozen_gradients();
  o.offload_optimizer.enabled = s.offload_optimizer;
  o.offload_param.enabled = s.offload_param;
  // Partial offload (offload_optimizer.ratio) exists only at stage 3 without parameter offload;
  // the table's other offload rows are full offload.
  if (!(s.stage == 3 && s.offload_optimizer && !s.offload_param)) o.offload_optimizer.ratio = 1.0;
  // The stage-specific knobs apply only to the rows that have them (the table spans every
  // stage), as the engine would be configured for that row.
  if (s.stage != 3) o.hpz_partition_size = 0;
  if (s.stage != 3 || s.offload_param) o.quantized_weights = false;
  if (s.stage < 2 || s.offload_param) o.quantized_gradients = false;
  if (s.stage == 0) o.mics_shard_size = 0;
  return o;
}

// What the estimate needs to know about the units: exact from a PartitionPlan, or a stand-in
// from the bucket size when only Ψ is known.
struct UnitFigures {
  I64 padded = 0;          // P
  I64 trained_padded = 0;  // the trained units' elements: stages 0-1's full gradients
  I64 content = 0;         // Ψ
  I64 shard_total = 0;     // elements a rank owns (P / N)
  I64 sharded_slices = 0;  // stage 3: elements of non-persistent slices a rank owns
  I64 persistent = 0;      // stage 3: elements of the persistent unit (full on every rank)
  // The largest unit and slice reduced (a frozen unit never is): the reductions' buffers.
  I64 max_unit = 0;            // elements
  I64 max_shard = 0;           // elements
  I64 max_gathered_shard = 0;  // stage 3: largest slice of a non-persistent unit (gathered)
  I64 host_shard_total = 0;    // optimizer offload: elements of the offloaded units' slices
  I64 host_max_shard = 0;      // optimizer offload: the largest offloaded trained slice
  // Frozen units' slices (no optimizer state, no gradient slice): all, and those whose master
  // weights are in the offload's host memory.
  I64 frozen_shard_total = 0;
  I64 host_frozen_shard = 0;
  I64 frozen_content = 0;       // the frozen parameters' elements
  I64 device_param_slices = 0;  // stage 3: elements of non-persistent slices on the device
  I64 device_grad_slices = 0;   // stages 2-3: elements of the gradient slices on the device
  I64 gathered_peak = 0;        // elements
  bool read_in_place = false;   // stage 3 reads some units' slices in place (a group of one)
  // Trained units' gradients go to a bucket every micro-batch (per_micro_batch_grads: stages
  // 2-3, unless one rank keeps full gradients).
  bool buckets = false;
  I64 secondary_peak = 0;   // elements (hpZ)
  I64 params_peak = 0;      // elements: gathered + secondary at once
  I64 bucket_peak = 0;      // elements
  I64 transient_bytes = 0;  // peak of gathered + buckets, bytes
  // Where the backward ends (UnitSchedule::lowest_trained_module for a model that stops early):
  // the blocks below keep no activations for it.
  int first_backward_module = 0;
  std::vector<UnitSize> units;  // every unit
  int groups = 1;               // the engine's shard groups (2 under expert parallelism)
  // Per shard group: its largest slice reduced, and stage 3's largest slice of a non-persistent
  // unit (ZeRO++'s collectives over each group size their scratch by them).
  std::vector<I64> group_max_shard, group_max_gathered_shard;
  // Under expert parallelism, of the rank's elements: the experts' (group 1) parameters, padded,
  // and their slices.
  I64 expert_padded = 0, expert_shard = 0;
};

// ZeRO++'s device buffers (kComm): per shard group, its QuantizedCollectives' four scratch
// slots, each grown to its largest request (at least 256 bytes; a slot is freed before it grows,
// so the peak is the sum of the final sizes), and the engine's one qgZ output slice
// (unit_state.cc). n ranks in the group, L of them per node, M = n / L nodes; W(s) 32-bit words
// per quantized slice; s the group's largest slices (UnitFigures' per-group figures).
//   qwZ all_gather(s):      slot 0: 4 W(s), slot 1: 4 n W(s)   (stage 3's non-persistent units)
//   qgZ reduce_scatter(s):  slots 0, 1: 4 n W(s), slot 2: 4 M s, slot 3: 4 s   (every unit)
//   qgZ output slice:       the largest slice of any group in the communication dtype
I64 quantized_scratch_bytes(I64 max_gathered_shard, I64 max_shard, const EngineOptions& o, int n,
                            int L) {
  const bool weights = o.quantized_weights && o.stage == 3;
  const bool gradients = o.quantized_gradients && o.stage >= 2;
  const I64 M = n / L;
  const I64 block = QuantizedCollectives::kDefaultBlock;
  I64 slot[4] = {0, 0, 0, 0};
  const auto grow = [&](int which, I64 bytes) { slot[which] = std::max(slot[which], bytes); };
  if (weights && max_gathered_shard > 0) {
    const I64 w = 4 * quantized_slice_words(max_gathered_shard, block);
    grow(0, w);
    grow(1, n * w);
  }
  if (gradients && n > 1 && max_shard > 0) {
    const I64 w = 4 * quantized_slice_words(max_shard, block);
    grow(0, n * w);
    grow(1, n * w);
    grow(2, M * max_shard * 4);
    grow(3, max_shard * 4);
  }
  I64 total = 0;
  for (I64 b : slot) total += b > 0 ? std::max<I64>(b, 256) : 0;
  return total;
}

// `groups`: each shard group's ranks and ranks per node.
I64 quantized_comm_bytes(const UnitFigures& f, const EngineOptions& o,
                         const std::vector<std::pair<int, int>>& groups) {
  const bool weights = o.quantized_weights && o.stage == 3;
  const bool gradients = o.quantized_gradients && o.stage >= 2;
  if (!weights && !gradients) return 0;
  I64 total =
      gradients ? f.max_shard * size_of(o.communication_dtype.value_or(o.compute_dtype)) : 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto [n, L] = groups[g];
    total += quantized_scratch_bytes(f.group_max_gathered_shard[g], f.group_max_shard[g], o, n, L);
  }
  return total;
}

// The parameters one rank's engine holds: the model's table, or under expert parallelism the
// table of a rank's model at that degree (its E/ep experts of each layer as group-1 parameters;
// every rank's shapes are alike). A model without experts cannot split them, as zrt-train
// refuses it.
std::vector<ParamSpec> expert_rank_parameters(const ModelSpec& model, const EngineOptions& o) {
  const int ep = o.expert_parallel_size;
  if (ep <= 1) return model.params;
  if (!model.def) {
    ZRT_THROW(InvalidArgument,
              "expert_parallel.autoep_size {} needs the model's definition (--model or --config): "
              "a parameter table alone does not say which experts a rank holds",
              ep);
  }
  ModelOptions options;
  options.planned_expert_parallel_size = ep;
  std::vector<ParamSpec> params = model.def->parameters_for(options);
  if (std::none_of(params.begin(), params.end(), [](const ParamSpec& p) { return p.group == 1; })) {
    ZRT_THROW(InvalidArgument,
              "expert_parallel.autoep_size {}: {} has no experts (no mixture-of-experts layer "
              "declares expert parameters); use --ep 1",
              ep, model.description);
  }
  return params;
}

// The same with model.frozen / model.trainable marked, as zrt-train marks them (the same
// refusals too).
std::vector<ParamSpec> rank_parameters(const ModelSpec& model, const EngineOptions& o) {
  std::vector<ParamSpec> params = expert_rank_parameters(model, o);
  if (!model.frozen.empty() || !model.trainable.empty()) {
    ModelConfig patterns;
    patterns.frozen = model.frozen;
    patterns.trainable = model.trainable;
    const train::FrozenMarks marks = train::mark_frozen_parameters(patterns, params);
    // Every rank's table has the same names (experts by their fused names): one rank's counts
    // are every rank's.
    train::check_frozen_patterns(patterns, marks.matches,
                                 marks.total_elements - marks.frozen_elements, params,
                                 model.description);
  }
  return params;
}

UnitFigures exact_units(const ModelSpec& model, const EngineOptions& o, int world,
                        bool checkpointing) {
  // Hierarchical sharding (mics_shard_size) slices the state over the shard group only.
  const ParallelDims dims = parallel_dims(o, world, 0);
  const int partition_world = dims.shard_world();
  // Expert parallelism: the experts' units (group 1) over the expert-data-parallel group (under
  // MiCS its share of a shard block), as the layout gives the engine its groups (engine_groups.h's
  // group_worlds).
  std::vector<int> group_worlds{partition_world};
  if (o.expert_parallel_size > 1) {
    group_worlds.push_back(o.stage == 0 ? 1 : dims.expert_shard_world());
  }
  const std::vector<ParamSpec> params = rank_parameters(model, o);
  const PartitionPlan plan(params,
                           PartitionOptions{o.stage, partition_world, o.reduce_bucket_size,
                                            o.stage == 3 ? o.stage3_param_persistence_threshold : 0,
                                            o.alignment, model.num_modules},
                           group_worlds);
  UnitFigures f;
  f.padded = plan.total_numel();
  for (const Unit& u : plan.units()) f.trained_padded += u.frozen ? 0 : u.numel;
  f.content = plan.content_numel();
  f.shard_total = plan.total_shard();
  for (const ParamSpec& p : params) f.frozen_content += p.frozen ? p.numel() : 0;
  f.groups = plan.group_count();
  f.group_max_shard.assign(static_cast<std::size_t>(f.groups), 0);
  f.group_max_gathered_shard.assign(static_cast<std::size_t>(f.groups), 0);
  for (const Unit& u : plan.units()) {
    f.units.push_back(UnitSize{u.numel, u.shard, u.group, u.frozen});
    const auto g = static_cast<std::size_t>(u.group);
    if (!u.frozen) f.group_max_shard[g] = std::max(f.group_max_shard[g], u.shard);
    if (!u.persistent)
      f.group_max_gathered_shard[g] = std::max(f.group_max_gathered_shard[g], u.shard);
    if (u.group == 1) {
      f.expert_padded += u.numel;
      f.expert_shard += u.shard;
    }
    if (!u.frozen) {
      f.max_unit = std::max(f.max_unit, u.numel);
      f.max_shard = std::max(f.max_shard, u.shard);
    }
    if (u.persistent) {
      f.persistent += u.numel;
    } else {
      f.sharded_slices += u.shard;
      f.max_gathered_shard = std::max(f.max_gathered_shard, u.shard);
    }
  }
  // Where each unit's state lives: the engine's own placement (unit_placement.h).
  const std::vector<UnitPlacement> placement = unit_placements(o, plan);
  for (std::size_t u = 0; u < placement.size(); ++u) {
    const Unit& unit = plan.unit(static_cast<int>(u));
    if (!unit.persistent && placement[u].param_slice == Residence::kDevice) {
      f.device_param_slices += unit.shard;
    }
    if (placement[u].grad_slice == Residence::kDevice) f.device_grad_slices += unit.shard;
    if (unit.frozen) f.frozen_shard_total += unit.shard;
    if (!placement[u].stepped_on_host()) continue;
    f.host_shard_total += unit.shard;
    if (unit.frozen) {
      f.host_frozen_shard += unit.shard;
    } else {  // the offload stages and steps trained units only
      f.host_max_shard = std::max(f.host_max_shard, unit.shard);
    }
  }
  // The modules the model reruns under activation checkpointing (a GPT: its blocks).
  std::vector<bool> recomputed(static_cast<std::size_t>(model.num_modules), false);
  if (checkpointing && model.def) {
    for (int m : model.def->recomputed_modules()) recomputed[static_cast<std::size_t>(m)] = true;
  }
  // The engine's own schedule, replayed: the gathers and buckets it will allocate.
  // hpZ: each group's secondary shards over its ranks of an hpZ block (the layout's groups).
  ScheduleOptions schedule = schedule_options(o);
  // A run of one rank reduces nothing: stages 2-3 then keep full gradients, with no buckets.
  f.buckets = per_micro_batch_grads(o, world == 1);
  schedule.gradient_buckets = f.buckets;
  if (o.model_stops_backward_early) {
    schedule.first_backward_module = UnitSchedule::lowest_trained_module(plan, model.num_modules);
  }
  f.first_backward_module = schedule.first_backward_module;
  // (None kept for a group read in place: hpz_secondary_ranks, as the engine asks it.)
  if (dims.hpz() > 1) {
    schedule.hpz_group_sizes = {hpz_secondary_ranks(o, plan.group_world(0), dims.hpz())};
    if (o.expert_parallel_size > 1) {
      schedule.hpz_group_sizes.push_back(hpz_secondary_ranks(
          o, plan.group_world(1), static_cast<int>(dims.expert_hpz_group_plan(0).members.size())));
    }
  }
  std::vector<bool> in_place;
  for (const UnitPlacement& p : placement) {
    in_place.push_back(p.gathered_in_place);
    f.read_in_place = f.read_in_place || p.gathered_in_place;
  }
  // Stages 2-3 bucket in the compute dtype; at stages 0-1 (and 2-3 at a run of one rank) only a
  // frozen unit of a model that may write its gradients has a bucket, in the accumulation dtype
  // the model writes gradients in there. Gathered parameters are in the compute dtype.
  const ElementBytes element_bytes{
      static_cast<int>(size_of(o.compute_dtype)),
      static_cast<int>(size_of(f.buckets ? o.compute_dtype : o.grad_accum_dtype))};
  const SchedulePeaks peaks =
      schedule_peaks(plan, model.num_modules, schedule, recomputed, in_place, element_bytes);
  f.gathered_peak = peaks.gathered_elements;
  f.secondary_peak = peaks.secondary_elements;
  f.params_peak = peaks.params_elements;
  f.bucket_peak = peaks.bucket_elements;
  f.transient_bytes = peaks.sum_bytes;
  return f;
}

// The ZeRO paper's accounting: no padding, no persistent parameters; a unit stands in as one
// reduce bucket (stages 0-2) and the gathered working set as stage3_max_live_parameters.
UnitFigures formula_units(double psi, const EngineOptions& o, int world) {
  const int n = parallel_dims(o, world, 0).shard_world();
  UnitFigures f;
  f.padded = f.content = f.trained_padded = static_cast<I64>(std::llround(psi));
  f.shard_total = static_cast<I64>(std::llround(psi / n));
  f.sharded_slices = o.stage == 3 ? f.shard_total : 0;
  f.max_unit = std::min(f.padded, o.reduce_bucket_size);
  f.max_shard = static_cast<I64>(std::llround(static_cast<double>(f.max_unit) / n));
  f.units.push_back(UnitSize{f.max_unit, f.max_shard, 0});
  f.max_gathered_shard = f.max_shard;
  f.group_max_shard = {f.max_shard};
  f.group_max_gathered_shard = {f.max_gathered_shard};
  if (o.offload_optimizer.enabled) {  // whole units cannot be told apart here: the share itself
    f.host_shard_total = static_cast<I64>(
        std::llround(o.offload_optimizer.ratio * static_cast<double>(f.shard_total)));
    f.host_max_shard = f.host_shard_total > 0 ? f.max_shard : 0;
  }
  // The placement rule for the share whose state is on the host and the rest (no units here).
  const UnitPlacement host_side = placement_of(o, true, false, false, n);
  const UnitPlacement device_side = placement_of(o, false, false, false, n);
  const I64 device_shard = f.shard_total - f.host_shard_total;
  if (o.stage == 3 && device_side.param_slice == Residence::kDevice) {
    f.device_param_slices = f.sharded_slices;
  }
  f.device_grad_slices = (device_side.grad_slice == Residence::kDevice ? device_shard : 0) +
                         (host_side.grad_slice == Residence::kDevice ? f.host_shard_total : 0);
  f.buckets = per_micro_batch_grads(o, world == 1);
  if (f.buckets) f.bucket_peak = f.max_unit;
  // (At one rank the model reads the slices in place: nothing is gathered.)
  f.read_in_place = device_side.gathered_in_place;
  if (o.stage == 3 && !f.read_in_place) {
    f.gathered_peak = std::min(f.padded, o.stage3_max_live_parameters);
  }
  // hpZ: every unit's secondary shard is alive between the forward and the backward.
  if (o.stage == 3 && o.hpz_partition_size > 1) f.secondary_peak = f.padded / o.hpz_partition_size;
  f.params_peak = f.gathered_peak + f.secondary_peak;
  f.transient_bytes = (f.bucket_peak + f.params_peak) * size_of(o.compute_dtype);
  return f;
}

}  // namespace

std::string Setting::name() const {
  std::string s = "stage " + std::to_string(stage);
  if (offload_optimizer && offload_param) return s + " + optimizer and parameter offload";
  if (offload_optimizer) return s + " + optimizer offload";
  if (offload_param) return s + " + parameter offload";
  return s;
}

const std::vector<Setting>& verdict_order() {
  static const std::vector<Setting> order{{0, false, false}, {1, false, false}, {2, false, false},
                                          {2, true, false},  {3, false, false}, {3, true, false},
                                          {3, true, true}};
  return order;
}

const std::vector<Setting>& table_order() {
  static const std::vector<Setting> order{{0, false, false}, {1, false, false}, {1, true, false},
                                          {2, false, false}, {2, true, false},  {3, false, false},
                                          {3, true, false},  {3, true, true}};
  return order;
}

int Inputs::hpz(const Setting& setting) const {
  return setting.stage == 3 && engine.hpz_partition_size > 1 ? engine.hpz_partition_size : 0;
}

std::string Inputs::name(const Setting& setting) const {
  const double ratio = options_for(*this, setting).offload_optimizer.ratio;
  if (!setting.offload_optimizer || ratio >= 1.0) return setting.name();
  return fmt::format("{} (ratio {:g})", setting.name(), ratio);
}

Setting Inputs::setting() const {
  return Setting{engine.stage, engine.offload_optimizer.enabled, engine.offload_param.enabled};
}

int Inputs::ranks_per_node() const {
  return world / nodes;
}

void Inputs::validate() const {
  if (world < 1) ZRT_THROW(InvalidArgument, "--world must be >= 1, not {}", world);
  if (nodes < 1) ZRT_THROW(InvalidArgument, "--nodes must be >= 1, not {}", nodes);
  if (world % nodes != 0) {
    ZRT_THROW(InvalidArgument, "--world {} is not a multiple of --nodes {} (ranks per node)", world,
              nodes);
  }
  if (!model && !(params > 0.0)) {
    ZRT_THROW(InvalidArgument,
              "give a model (--model or --config) or a parameter count (--params)");
  }
  if (micro_batch < 1)
    ZRT_THROW(InvalidArgument, "--micro-batch must be >= 1, not {}", micro_batch);
  if (engine.gradient_accumulation_steps < 1) {
    ZRT_THROW(InvalidArgument, "--gas (gradient_accumulation_steps) must be >= 1, not {}",
              engine.gradient_accumulation_steps);
  }
  if (model && model->def && (seq_len < 1 || seq_len > model->def->seq_len())) {
    ZRT_THROW(InvalidArgument, "--seq {} outside 1..{} (the model's seq_len)", seq_len,
              model->def->seq_len());
  }
  const int sp = engine.sequence_parallel_size;
  if (sp < 1) ZRT_THROW(InvalidArgument, "--sp (sequence_parallel_size) must be >= 1, not {}", sp);
  if (model && model->def) {
    // What the model's build would refuse (its heads split over the sp ranks, its length in
    // chunks), every problem at once, as the build says it.
    transformer::throw_sequence_parallel_problems(model->def->name(),
                                                  model->def->sequence_parallel_problems(sp));
  }
  if (!(device_gib > 0.0))
    ZRT_THROW(InvalidArgument, "--device-gb must be > 0, not {}", device_gib);
  const double ratio = engine.offload_optimizer.ratio;
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    ZRT_THROW(InvalidArgument, "--offload-ratio must be in [0, 1], not {}", ratio);
  }
  if (engine.stage < 0 || engine.stage > 3) {
    ZRT_THROW(InvalidArgument, "--stage must be 0, 1, 2 or 3, not {}", engine.stage);
  }
  // The layout's rank math (ParallelDims), with zrt-mem's own flags in the messages.
  const ParallelDims dims = parallel_dims(engine, world, ranks_per_node());
  if (dims.hpz_partition_size > 1) {
    const int S = dims.hpz_partition_size;
    if (!dims.blocks_within_nodes(S)) {
      ZRT_THROW(InvalidArgument,
                "--hpz {} (zero_hpz_partition_size) must divide the ranks per node ({} of {} "
                "ranks on {} node(s)): hpZ groups are blocks of consecutive ranks inside a node",
                S, ranks_per_node(), world, nodes);
    }
    if (dims.mics_shard_size > 0) {
      ZRT_THROW(InvalidArgument, "--hpz with mics_shard_size is not supported: use one of them");
    }
  }
  // The engine's own rules, as the config and the engine apply them, for the chosen setting,
  // then the layout's (where the experts' groups fall in MiCS or hpZ blocks, ZeRO++ by node).
  const EngineOptions chosen = options_for(*this, setting());
  check_options(chosen, world);
  parallel_dims(chosen, world, ranks_per_node()).check();
  // Expert parallelism: the experts a rank holds are the model's to say (rank_parameters).
  if (engine.expert_parallel_size > 1) {
    if (!model) {
      ZRT_THROW(InvalidArgument,
                "--ep {} (expert_parallel.autoep_size) needs a model (--model or --config): the "
                "share of the parameters that are experts is the model's",
                engine.expert_parallel_size);
    }
    rank_parameters(*model, engine);
  }
}

std::int64_t Estimate::activations() const {
  const auto& a = checkpointing ? activations_checkpointed : activations_full;
  return a.value_or(0);
}

std::int64_t Estimate::device_total() const {
  return model_state_peak() + activations() + comm + workspace + kernel_workspace;
}

CategoryBytes Estimate::device_peaks() const {
  CategoryBytes b{};
  at(b, MemCategory::kParams) = params + params_buffers_peak;
  at(b, MemCategory::kGrads) = grads + buckets_peak;
  at(b, MemCategory::kMaster) = master;
  at(b, MemCategory::kOptimizer) = optimizer;
  at(b, MemCategory::kActivations) = activations();
  at(b, MemCategory::kComm) = comm;
  at(b, MemCategory::kWorkspace) = workspace + kernel_workspace;
  return b;
}

std::int64_t Estimate::host_rank_total() const {
  I64 total = 0;
  for (I64 b : host_per_rank) total += b;
  return total;
}

Estimate estimate(const Inputs& in, const Setting& setting) {
  in.validate();
  const EngineOptions o = options_for(in, setting);
  const I64 cs = size_of(o.compute_dtype);
  const I64 as = size_of(o.grad_accum_dtype);
  const DType wire = o.communication_dtype.value_or(o.compute_dtype);
  const UnitFigures f = in.model ? exact_units(*in.model, o, in.world, in.activation_checkpointing)
                                 : formula_units(in.params, o, in.world);
  Estimate e;
  e.setting = setting;
  e.exact = in.model.has_value();
  e.padded_params = f.padded;
  e.content_params = f.content;
  e.frozen_params = f.frozen_content;
  e.first_backward_module = f.first_backward_module;
  e.expert_padded_params = f.expert_padded;
  e.expert_shard_params = f.expert_shard;
  e.ranks_per_node = in.ranks_per_node();
  // ZeroEngine::allocate_state, category by category.
  if (o.stage < 3) {
    e.params = f.padded * cs;  // full parameters
  } else {
    e.params = f.persistent * cs + f.device_param_slices * cs;
  }
  // The optimizer's fp32 state tensors per owned element (Adam 2, Lion 1).
  // With optimizer offload the offloaded units' state is in host memory and the rest (partial
  // offload, offload_optimizer.ratio < 1) on the device.
  const I64 host_shard = setting.offload_optimizer ? f.host_shard_total : 0;
  const I64 device_shard = f.shard_total - host_shard;
  // At one micro-batch per step the offloaded units' reduced slices go to host memory as they
  // are, in the compute dtype, and the device keeps no gradient slice for them.
  const bool reduced_to_host = offload_takes_reduced_slices(o);
  e.grads_offloaded_as_reduced = reduced_to_host;
  if (!f.buckets) {
    // The trained units' full gradients, accumulated across micro-batches (stages 0-1, and 2-3
    // at one rank).
    e.grads = f.trained_padded * as;
  } else {
    // The owned slices the placement keeps on the device (with parameter offload none: they
    // accumulate in host memory; at one micro-batch per step an offloaded unit's goes down).
    e.grads = f.device_grad_slices * as;
  }
  e.master = device_shard * 4;
  // A frozen unit keeps its master weights only.
  const I64 host_frozen = setting.offload_optimizer ? f.host_frozen_shard : 0;
  const I64 device_frozen = f.frozen_shard_total - host_frozen;
  e.optimizer = (device_shard - device_frozen) * 4 * in.optimizer.num_states();
  e.gathered_peak = f.gathered_peak * cs;
  e.gathered_in_place = f.read_in_place;
  e.secondary_peak = f.secondary_peak * cs;
  e.params_buffers_peak = f.params_peak * cs;
  e.gradient_buckets = f.buckets;
  e.buckets_peak = f.bucket_peak * (f.buckets ? cs : as);  // otherwise: frozen units'
  e.transient_peak = f.transient_bytes;
  const DType reduced = f.buckets ? o.compute_dtype : o.grad_accum_dtype;
  if (wire != reduced && (f.buckets || in.world > 1)) e.comm = f.max_unit * size_of(wire);
  if (in.device_type == DeviceType::kCpu) {
    const std::int64_t sequence_sum =
        in.model && in.model->def ? in.model->def->sequence_group_sum_floats() : 0;
    e.comm += mpi_scratch_bytes(f.units, o, in.world, in.comm, in.trainer_buffers, sequence_sum);
  }
  // ZeRO++ over the sharding group (all ranks, or a MiCS shard group of consecutive ranks):
  // L of its ranks share a node (comm.ranks_per_node simulates nodes as zrt-train does).
  if (!setting.offload_param) {
    const ParallelDims dims = parallel_dims(o, in.world, in.ranks_per_node());
    const int n = dims.shard_world();
    const int per_node = in.comm.ranks_per_node > 0 ? in.comm.ranks_per_node : in.ranks_per_node();
    std::vector<std::pair<int, int>> groups{{n, std::max(1, std::min(per_node, n))}};
    // Under expert parallelism the experts' units have QuantizedCollectives of their own, over
    // their shard group (the expert-data-parallel group, or under MiCS its share of a shard
    // block): rank 0's, whose members on rank 0's node are L.
    if (f.groups > 1) {
      const std::vector<int> members = dims.expert_shard_group_plan(0).members;
      const int edp = static_cast<int>(members.size());
      int L = 0;
      for (int r : members) L += per_node > 0 && r / per_node == 0 ? 1 : 0;
      groups.emplace_back(edp, std::max(1, std::min(L, edp)));
    }
    e.quantized_comm = quantized_comm_bytes(f, o, groups);
    e.comm += e.quantized_comm;
  }
  e.workspace = 4 * f.groups;  // the gradient norm, a float per shard group
  // The step decision taken on the device, and the norm read back later (pinned, below).
  const bool decided_on_device = decides_step_on_device(o);
  if (decided_on_device) e.workspace += static_cast<I64>(sizeof(StepDecision));
  // zrt-train's: the evaluation's loss accumulator (4 bytes), the steps' loss accumulators (62
  // floats, train/training_run.h kMaxUnreadLosses) and the control group's scratch (64 doubles,
  // train/control.h); test_zrt_mem_crosscheck checks them against zrt-train's own peaks.
  if (in.trainer_buffers) e.workspace += 4 + 4 * 62 + 64 * 8;
  // And with an auxiliary loss (a mixture of experts' load-balancing term) its accumulator.
  if (in.trainer_buffers && in.model && in.model->def && in.model->def->has_auxiliary_loss()) {
    e.workspace += 4;
  }
  // Optimizer offload without parameter offload takes each unit's gradient sum of squares on
  // the device and copies it down: one float per unit on each side.
  const I64 unit_norms_bytes = setting.offload_optimizer && !setting.offload_param
                                   ? 4 * static_cast<I64>(f.units.size())
                                   : 0;
  e.workspace += unit_norms_bytes;

  // Host memory (pinned or pageable, as the offload blocks say).
  CategoryBytes& h = e.host_per_rank;
  if (decided_on_device) at(h, MemCategory::kWorkspace) = 4;  // the norm read back (pinned)
  if (setting.offload_optimizer) {
    at(h, MemCategory::kMaster) = host_shard * 4;
    at(h, MemCategory::kOptimizer) = (host_shard - host_frozen) * 4 * in.optimizer.num_states();
    at(h, MemCategory::kGrads) = (host_shard - host_frozen) * (reduced_to_host ? cs : as);
    // Staging buffers carrying updated parameters up, one offloaded slice each.
    at(h, MemCategory::kWorkspace) += o.offload_staging_buffers * f.host_max_shard * cs;
    at(h, MemCategory::kWorkspace) += unit_norms_bytes;
  }
  if (setting.offload_param) {
    at(h, MemCategory::kParams) = f.sharded_slices * cs;
    // One reduced slice on its way down, to be accumulated (at one micro-batch per step each
    // goes straight into its unit's gradient).
    if (!reduced_to_host) at(h, MemCategory::kWorkspace) += f.max_shard * 4;
  }

  if (in.model && in.model->def) {
    const ModelDef& def = *in.model->def;
    // The model's options, with the blocks the backward does not reach (frozen lower layers).
    const auto model_options = [&](bool checkpointing) {
      ModelOptions m = in.model_options(checkpointing);
      m.planned_first_backward_module = f.first_backward_module;
      return m;
    };
    // At sequence parallelism every rank of a group trains on its chunk of each sequence.
    const int sp = o.sequence_parallel_size;
    const int chunk = in.seq_len / sp;
    const I64 tokens = in.trainer_buffers ? token_batch_bytes(in.micro_batch, in.seq_len, sp) : 0;
    const ActivationFootprint full =
        def.activation_footprint(in.micro_batch, chunk, o.compute_dtype, model_options(false));
    const ActivationFootprint checkpointed =
        def.activation_footprint(in.micro_batch, chunk, o.compute_dtype, model_options(true));
    const bool on_cpu = in.device_type == DeviceType::kCpu;
    e.kernel_workspace = def.kernel_workspace_bytes(
        in.micro_batch, chunk, o.compute_dtype, model_options(in.activation_checkpointing), on_cpu);
    // The CUDA kernels' cuBLASLt workspace, allocated with the model's KernelContext.
    if (!on_cpu) e.kernel_workspace += kernels::KernelOptions{}.cublaslt_workspace_bytes;
    e.activations_full = full.device + tokens;
    e.activations_checkpointed = checkpointed.device + tokens;
    // Expert parallelism's exchange: the count vectors (comm), what the rows the local experts
    // receive add to the activations over ep 1's (at the reserve or the given capacity), and
    // what the dropless worst case would add beyond them.
    const ActivationFootprint& counted = in.activation_checkpointing ? checkpointed : full;
    e.dispatch_comm = counted.device_comm;
    e.comm += e.dispatch_comm;
    if (o.expert_parallel_size > 1) {
      ModelOptions local = model_options(in.activation_checkpointing);
      local.planned_expert_parallel_size = 1;
      e.dispatch_activations =
          counted.device -
          def.activation_footprint(in.micro_batch, chunk, o.compute_dtype, local).device;
      ModelOptions worst = model_options(in.activation_checkpointing);
      worst.planned_expert_rows = -1;
      e.dispatch_worst_extra =
          def.activation_footprint(in.micro_batch, chunk, o.compute_dtype, worst).device -
          counted.device;
    }
    e.activations_host_checkpointed = checkpointed.pinned_host;
    if (in.trainer_buffers) at(h, MemCategory::kWorkspace) += tokens;  // pinned token staging
    if (in.activation_checkpointing) at(h, MemCategory::kActivations) += checkpointed.pinned_host;
  }
  e.checkpointing = in.activation_checkpointing;
  return e;
}

ModelOptions Inputs::model_options(bool checkpointing) const {
  ModelOptions m;
  m.activation_checkpointing = checkpointing;
  m.cpu_checkpointing = cpu_checkpointing;
  m.head_tile_rows = head_tile_rows;
  m.mlp_tile_rows = mlp_tile_rows;
  m.planned_documents = documents;
  m.expert_rows_reserve = expert_rows_reserve;
  m.planned_expert_rows = expert_rows;
  m.planned_sequence_parallel_size = engine.sequence_parallel_size;
  m.planned_expert_parallel_size = engine.expert_parallel_size;
  return m;
}

std::optional<Setting> first_fit(const std::vector<Estimate>& estimates,
                                 std::int64_t capacity_bytes) {
  for (const Setting& s : verdict_order()) {
    for (const Estimate& e : estimates) {
      if (e.setting == s && e.device_total() <= capacity_bytes) return s;
    }
  }
  return std::nullopt;
}

std::optional<double> smallest_fitting_ratio(const Inputs& in, std::int64_t capacity_bytes) {
  const Setting partial{3, true, false};
  const auto fits = [&](int hundredths) {
    Inputs at = in;
    at.engine.offload_optimizer.ratio = hundredths / 100.0;
    return estimate(at, partial).device_total() <= capacity_bytes;
  };
  if (estimate(in, Setting{3, false, false}).device_total() <= capacity_bytes || !fits(100)) {
    return std::nullopt;
  }
  // The device's share of the state falls as the ratio grows: bisect on hundredths.
  int lo = 0;    // does not fit (or is stage 3 itself)
  int hi = 100;  // fits
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  return hi / 100.0;
}

Inputs inputs_from_config(const Config& config) {
  Inputs in;
  in.world = config.batch.world_size;
  in.engine = config.engine;
  in.engine.offload_optimizer.enabled = config.offload_optimizer.enabled();
  in.engine.offload_optimizer.pin_memory = config.offload_optimizer.pin_memory;
  in.engine.offload_optimizer.ratio = config.offload_optimizer.ratio;
  in.engine.offload_param.enabled = config.offload_param.enabled();
  in.engine.offload_param.pin_memory = config.offload_param.pin_memory;
  in.micro_batch = static_cast<int>(config.batch.micro_batch_size);
  in.activation_checkpointing = config.model.activation_checkpointing;
  in.cpu_checkpointing = config.model.cpu_checkpointing;
  in.head_tile_rows = config.model.head_tile_rows;
  in.mlp_tile_rows = config.model.mlp_tile_rows;
  in.documents = config.data.document_mask;
  in.expert_rows_reserve = config.model.expert_rows_reserve;
  if (config.device.memory_limit_gb > 0.0) in.device_gib = config.device.memory_limit_gb;
  // "auto" plans for the GPU it would pick where one exists.
  in.device_type = config.device.type == DeviceChoice::kCpu ? DeviceType::kCpu : DeviceType::kCuda;
  in.comm = config.comm;
  // comm.ranks_per_node (simulated or real nodes): the host figures per node, and hpZ's groups.
  if (config.comm.ranks_per_node > 0 && in.world % config.comm.ranks_per_node == 0) {
    in.nodes = in.world / config.comm.ranks_per_node;
  }
  in.optimizer = optimizer_spec(config.optimizer);
  std::shared_ptr<const ModelDef> model = builtin_models().resolve(config.model);
  in.seq_len = model->seq_len();
  in.model = model_spec(std::move(model));
  in.model->frozen = config.model.frozen;
  in.model->trainable = config.model.trainable;
  return in;
}

ModelSpec model_spec(std::shared_ptr<const ModelDef> def) {
  ModelSpec spec;
  spec.params = def->parameters();
  spec.num_modules = def->num_modules();
  spec.description = def->describe();
  spec.def = std::move(def);
  return spec;
}

}  // namespace zrt::mem
