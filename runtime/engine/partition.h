// The flat layout of parameters in units: which unit each parameter lives in, at which offset,
// and which slice of each unit every rank owns.
//
// Units (docs/architecture.md, "Units"): at stages 0-2 a unit is a gradient bucket of whole
// modules, in backward order, of about `bucket_elements` (a module larger than that is a bucket by
// itself: a hand-written backward finishes a module's gradients together, so cutting inside a
// module would not release anything earlier); at stage 3 a unit is one module's parameters. At
// every stage a parameter used by several modules (a tied embedding) is a unit of its own, because
// its gradient completes only at its last use. At stage 3 parameters with fewer than
// `persistence_threshold` elements form one persistent unit that stays gathered.
//
// Every parameter starts at a multiple of `alignment` elements inside its unit; a unit is
// padded to a multiple of world x alignment and split evenly: rank r owns slice r. Padding is
// zero in parameters, gradients and optimizer state.
//
// Unit groups: each parameter names the shard group it lives over (ParamSpec::group, an index
// into the engine's table of groups), a unit holds parameters of one group only, and `world` is
// that group's size (the plan's group_worlds). Units are formed per group as above (at
// stages 0-2 each group fills its own buckets, in backward order); with every parameter in group
// 0 the plan is the one-group plan, unit for unit.
//
// Frozen parameters (ParamSpec::frozen) are kept apart the same way: a module's frozen
// parameters form units of their own (stage 3: a second unit of the module; stages 0-2: buckets
// of frozen parameters), so a unit is wholly trained or wholly frozen (Unit::frozen). With
// nothing frozen the plan is what it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model_interface.h"

namespace zrt {

struct PartitionOptions {
  int stage = 0;
  int world = 1;                             // ranks the units are sliced over (1 at stage 0)
  std::int64_t bucket_elements = 500000000;  // reduce_bucket_size (stages 0-2)
  std::int64_t persistence_threshold = 0;    // stage3_param_persistence_threshold
  std::int64_t alignment = 64;               // elements
  int num_modules = 0;
};

struct ParamPlacement {
  int unit = -1;
  std::int64_t offset = 0;  // element offset inside the unit
  std::int64_t numel = 0;
};

struct Unit {
  int group = 0;             // the shard group it is sliced over (ParamSpec::group)
  std::vector<int> params;   // in layout order
  std::vector<int> modules;  // modules that use any of its parameters, ascending
  std::int64_t numel = 0;    // padded size (multiple of its group's world x alignment)
  std::int64_t shard = 0;    // numel / its group's world
  std::int64_t offset = 0;   // element offset of the unit in a flat buffer of all units
  std::int64_t content = 0;  // sum of its parameters' sizes (no padding)
  bool persistent = false;   // stage 3: never released
  bool shared = false;       // holds one parameter used by several modules
  // Its parameters are frozen (ParamSpec::frozen; a unit never mixes frozen and trained
  // ones): it has no optimizer state and no gradient slice, its gradient is never reduced and
  // the optimizer never steps it (docs/architecture.md, "Frozen units").
  bool frozen = false;
  // The module whose kBackward completes this unit's gradient in a micro-batch (the lowest
  // module index using it, since backward runs from the last module down). A backward that ends
  // early (ScheduleOptions::first_backward_module) never goes below a trained unit's; a frozen
  // unit's last use is then UnitSchedule's last_backward_use.
  int last_backward_module = 0;
};

class PartitionPlan {
 public:
  // `group_worlds`: the ranks each unit group is sliced over (group g: group_worlds[g]; all 1
  // at stage 0); empty: one group of options.world ranks.
  PartitionPlan(const std::vector<ParamSpec>& params, const PartitionOptions& options,
                std::vector<int> group_worlds = {});

  const std::vector<Unit>& units() const { return units_; }
  const Unit& unit(int u) const { return units_[static_cast<std::size_t>(u)]; }
  const ParamPlacement& placement(int param) const {
    return placement_[static_cast<std::size_t>(param)];
  }
  // Group 0's world (the only one in a one-group plan).
  int world() const { return group_worlds_.front(); }
  int group_count() const { return static_cast<int>(group_worlds_.size()); }
  int group_world(int group) const { return group_worlds_[static_cast<std::size_t>(group)]; }
  std::int64_t total_numel() const { return total_numel_; }      // all units, padded
  std::int64_t total_shard() const { return total_shard_; }      // every unit's slice
  std::int64_t content_numel() const { return content_numel_; }  // Ψ
  // Units a module uses, in layout order.
  const std::vector<int>& module_units(int module) const {
    return module_units_[static_cast<std::size_t>(module)];
  }
  // The part of parameter `param` inside rank `rank`'s slice of its unit (`rank` in the unit's
  // group):
  // [first, first + count) in parameter elements, at element `slice_offset` of the slice.
  struct OwnedRange {
    std::int64_t first = 0;
    std::int64_t count = 0;
    std::int64_t slice_offset = 0;
  };
  OwnedRange owned_range(int param, int rank) const;
  std::string describe() const;

 private:
  void add_unit(Unit unit, const std::vector<ParamSpec>& params, std::int64_t alignment);
  std::vector<Unit> units_;
  std::vector<ParamPlacement> placement_;
  std::vector<std::vector<int>> module_units_;
  std::vector<int> group_worlds_;
  std::int64_t total_numel_ = 0;
  std::int64_t total_shard_ = 0;
  std::int64_t content_numel_ = 0;
};

}  // namespace zrt
