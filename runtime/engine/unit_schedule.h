// The engine's schedule as a pure function: which units to gather, prefetch, release, which
// gradient buckets to open and free and which reductions to issue, for each module use of a
// micro-batch (model_interface.h's acquire / release call order). No device, no memory, no
// timing: the same calls give the same operations, on every rank (docs/architecture.md,
// "Units": the sequence of collectives is a pure function of the config and the model).
//
// ZeroEngine executes the operations on its streams; zrt-mem replays them to find the peaks of
// gathered parameters and gradient buckets (schedule_peaks below), so the two cannot drift
// apart; test_unit_schedule checks the sequences themselves.
//
// Thread-safety: a UnitSchedule is a plain value driven by one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "runtime/engine/partition.h"
#include "runtime/model_interface.h"

namespace zrt {

struct ScheduleOptions {
  int stage = 0;
  int gradient_accumulation_steps = 1;
  std::int64_t stage3_prefetch_bucket_size = 50000000;   // elements
  std::int64_t stage3_max_live_parameters = 1000000000;  // elements
  // A training forward keeps a unit gathered into its backward, instead of releasing it and
  // gathering it again, when the elements of the module uses in between (the later modules'
  // forward and backward) are at most this many and the live-parameter bound holds: the last
  // modules of the forward skip their backward gathers (DeepSpeed's stage3_max_reuse_distance).
  // 0: release after every use (the last module, used again at once, is kept regardless).
  std::int64_t stage3_max_reuse_distance = 0;  // elements
  // The compute stream waits, unit by unit, for the full parameters published after the last
  // step (stages 1-2, and stage 3's persistent unit) before a module uses them; without it the
  // step waits for the publication as a whole.
  bool await_published_per_unit = false;
  // Stages 2-3: how many buckets of contiguous modules may be live at once. With 1, opening the
  // next unit's bucket first waits for the previous one's reduction, so the reductions do not
  // overlap the backward; with 2 (the engine's overlap_comm, as DeepSpeed's double buffers),
  // the reduction of one unit runs while the next unit's backward fills its own bucket. Buckets
  // still in use are never freed to keep the count: a module whose parameters are in several
  // units (trained and frozen ones) has all of them open.
  int rotating_buckets = 1;
  // ZeRO++ hpZ (stage 3; zero_hpz_partition_size): after a unit's first training gather of a
  // micro-batch (over every rank) each rank keeps a secondary shard, 1/S of the gathered
  // parameters; the unit's later gathers in the micro-batch (its backward, a recompute, a tied
  // unit's second forward use) read the secondary shards over its S-rank group, and the
  // secondary shard is freed once the unit's last backward has its parameters. A unit no
  // backward uses (below first_backward_module) keeps none: a tied one's second forward use
  // there gathers over every rank. 0 or 1: off.
  int hpz_partition_size = 0;
  // Per shard group (Unit::group), the ranks its secondary shards are kept over: the dense
  // group's S and, under expert parallelism, the experts' ranks in an hpZ block
  // (engine_groups.h's schedule options); 0: the group's units keep none (they are read in
  // place: unit_placement.h's hpz_secondary_ranks), every gather of them goes to the slice.
  // Empty: hpz_partition_size for every group.
  std::vector<int> hpz_group_sizes;
  // The lowest module whose backward a micro-batch runs (ParamAccess::first_backward_module):
  // the model's backward ends with this module's release, so it ends the micro-batch, and no
  // module below it is gathered, kept or prefetched for a backward or a recompute. Every module
  // below it must hold frozen units only (checked): nothing there has a gradient to reduce.
  // 0: the whole backward (UnitSchedule::lowest_trained_module gives the highest it may be).
  int first_backward_module = 0;
  // Whether a frozen unit gets a gradient bucket for its modules' backward: the model may write
  // a frozen parameter's gradient, which the engine then drops unread. false for a model that
  // never asks for one (Model::skips_frozen_gradients): a frozen unit has no gradient memory.
  bool frozen_buckets = true;
  // Stages 2-3: whether a trained unit's gradient goes to a bucket every micro-batch and is
  // reduced every micro-batch (per_micro_batch_grads in engine_options.h). false at a run of one
  // rank whose slices are on the device: the trained units' gradients accumulate in the full
  // gradients and are reduced once, in the last micro-batch, as at stages 0-1.
  bool gradient_buckets = true;
};

enum class UnitOpKind {
  kIssueGather,    // stage 3: allocate the unit's full parameters and all-gather them (comm)
  kAwaitGather,    // the compute stream waits for the unit's gather
  kAwaitPublish,   // the compute stream waits for the unit's post-step all-gather
  kReleaseGather,  // stage 3: free the unit's full parameters (after the kernels that read them)
  // Stages 2-3, and a frozen unit's at every stage (stages 0-1 keep trained units' gradients
  // whole, accumulated over the micro-batches, in the engine's full gradients):
  kFreeBucket,   // wait for the bucket's reduction (a frozen unit's has none), then free it
  kOpenBucket,   // allocate and zero the unit's gradient bucket
  kIssueReduce,  // the unit's gradient is complete: reduce it (comm)
  // hpZ (ScheduleOptions::hpz_partition_size):
  kKeepSecondary,         // keep this rank's 1/S of the unit's just-gathered parameters (comm)
  kIssueSecondaryGather,  // allocate the full parameters, all-gather them from the secondary
                          // shards over the S-rank group (comm)
  kFreeSecondary,         // free the secondary shard (after the compute stream waited for its last
                          // gather)
};
const char* unit_op_name(UnitOpKind kind);

struct UnitOp {
  UnitOpKind kind;
  int unit;
  // kIssueReduce: the unit's last reduction of the step (the last micro-batch's), after which
  // its gradient is final.
  bool final = false;
  bool operator==(const UnitOp& o) const {
    return kind == o.kind && unit == o.unit && final == o.final;
  }
};

class UnitSchedule {
 public:
  UnitSchedule(const PartitionPlan& plan, int num_modules, const ScheduleOptions& options);

  // The operations before module `module` runs `phase`, in the order to execute them.
  std::vector<UnitOp> acquire(int module, Phase phase);
  // The operations after it ran. The backward of the first backward module
  // (ScheduleOptions::first_backward_module, 0 by default) ends the micro-batch.
  std::vector<UnitOp> release(int module, Phase phase);
  // The accumulation boundary: the next backward is the first of a new step. Throws while an
  // hpZ secondary shard is alive (a training forward without its backward): it would hold the
  // parameters of before the step.
  void step();

  int micro_batch() const { return micro_batch_; }  // micro-batches done since the last step
  bool last_micro_batch() const { return micro_batch_ == options_.gradient_accumulation_steps - 1; }
  bool gathered(int unit) const { return gathered_[static_cast<std::size_t>(unit)]; }
  bool bucket_open(int unit) const { return bucket_open_[static_cast<std::size_t>(unit)]; }
  std::int64_t live_gathered_elements() const { return live_gathered_; }
  std::int64_t live_bucket_elements() const { return live_buckets_; }
  // hpZ: whether unit u holds a secondary shard now, and the elements of all of them.
  bool secondary(int unit) const { return secondary_[static_cast<std::size_t>(unit)]; }
  std::int64_t live_secondary_elements() const { return live_secondary_; }
  // hpZ on: the elements of unit u's secondary shard (numel / S); 0 when off or when its group
  // keeps none (ScheduleOptions::hpz_group_sizes).
  std::int64_t secondary_numel(int unit) const;
  const ScheduleOptions& options() const { return options_; }

  // The units in the order the next forward needs them (of their first module), which is the
  // order an offloaded step updates them in.
  static std::vector<int> forward_order(const PartitionPlan& plan);
  // Partial optimizer offload (offload_optimizer.ratio, DeepSpeed's ZeRO-Offload++): which
  // units' fp32 state goes to host memory. They are the last units of forward_order(), the
  // fewest whose slices hold at least `ratio` of the rank's elements, so the device never keeps
  // more than 1 - ratio of the state. The next forward starts on the units the device updated
  // at once while the CPU steps the rest, and in the backward their gradients are the first to
  // go down. Counted in slice elements, which every rank has alike: the split is the same on
  // every rank. ratio 1: every unit; 0: none. Frozen units (Unit::frozen: a master slice, never
  // stepped) are offloaded whenever the ratio is above 0, and the ratio splits the trained
  // units' elements.
  static std::vector<bool> offloaded_units(const PartitionPlan& plan, double ratio);
  // The lowest module a unit with a gradient to reduce uses (the lowest module holding a trained
  // parameter): a backward may stop there (ScheduleOptions::first_backward_module), as autograd
  // stops below the lowest parameter that requires a gradient. With every unit frozen, the last
  // module (whose backward computes the loss of a transformer here).
  static int lowest_trained_module(const PartitionPlan& plan, int num_modules);

  // Whether trained units' gradients go to a bucket and are reduced every micro-batch (stages
  // 2-3 unless ScheduleOptions::gradient_buckets is false) or accumulate in full gradients.
  bool per_micro_batch_grads() const { return options_.stage >= 2 && options_.gradient_buckets; }

 private:
  bool sharded() const { return options_.stage == 3; }
  bool hpz() const { return sharded() && options_.hpz_partition_size > 1; }
  // The ranks unit u's group keeps its secondary shards over (0: none; hpZ off: 0).
  int hpz_ranks(int unit) const;
  int first_backward() const { return options_.first_backward_module; }
  // The module whose backward is unit u's last use in a micro-batch: the lowest of its modules
  // at or above the first backward module; -1 when it has none (no backward uses it).
  int last_backward_use(int u) const;
  void gather(int u, Phase phase, std::vector<UnitOp>& ops);
  void prefetch_after(int module, Phase phase, std::vector<UnitOp>& ops);
  // At `module`'s backward.
  void open_bucket(int u, int module, std::vector<UnitOp>& ops);
  void free_bucket(int u, std::vector<UnitOp>& ops);

  const PartitionPlan& plan_;
  int num_modules_;
  ScheduleOptions options_;
  int micro_batch_ = 0;
  std::vector<bool> gathered_;
  std::vector<bool> bucket_open_;
  std::vector<bool> secondary_;
  // reuse_distance_[m]: elements of the module uses between module m's forward and its
  // backward (the forward and backward of every later module; a unit counts once per use).
  std::vector<std::int64_t> reuse_distance_;
  std::deque<int> rotating_buckets_;  // live buckets of contiguous modules, oldest first
  std::deque<int> pinned_buckets_;    // live shared / persistent buckets
  std::int64_t live_gathered_ = 0;
  std::int64_t live_buckets_ = 0;
  std::int64_t live_secondary_ = 0;
};

// The peaks of the transient model-state buffers over one step of `gradient_accumulation_steps`
// training micro-batches followed by one eval pass, replaying the schedule: what the engine's
// MemoryTracker records for them (zrt-mem; test_zrt_mem_crosscheck compares the two).
struct SchedulePeaks {
  std::int64_t gathered_elements = 0;   // gathered (non-persistent) units
  std::int64_t secondary_elements = 0;  // hpZ secondary shards
  std::int64_t params_elements = 0;     // gathered units and secondary shards at once
  std::int64_t bucket_elements = 0;     // live gradient buckets
  std::int64_t sum_elements = 0;        // all three at once
  // All three at once in bytes, each kind at its element size (ElementBytes): the parameters in
  // the compute dtype and, at stages 0-1 (and 2-3 without gradient_buckets), a frozen unit's
  // bucket in the accumulation dtype, so the peak of the sum is not sum_elements times one size.
  std::int64_t sum_bytes = 0;
};
// The bytes of an element of the gathered parameters and secondary shards, and of a bucket.
struct ElementBytes {
  int params = 1;
  int buckets = 1;
};
// `recomputed[m]`: module m runs again under activation checkpointing before its backward;
// `gathered_in_place[u]` (empty: none): unit u's gathers allocate nothing
// (UnitPlacement::gathered_in_place).
SchedulePeaks schedule_peaks(const PartitionPlan& plan, int num_modules,
                             const ScheduleOptions& options, const std::vector<bool>& recomputed,
                             const std::vector<bool>& gathered_in_place = {},
                             ElementBytes element_bytes = {});

}  // namespace zrt
