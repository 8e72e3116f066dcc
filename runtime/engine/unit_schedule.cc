#include "runtime/engine/unit_schedule.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt {

const char* unit_op_name(UnitOpKind kind) {
  switch (kind) {
    case UnitOpKind::kIssueGather:
      return "issue_gather";
    case UnitOpKind::kAwaitGather:
      return "await_gather";
    case UnitOpKind::kAwaitPublish:
      return "await_publish";
    case UnitOpKind::kReleaseGather:
      return "release_gather";
    case UnitOpKind::kFreeBucket:
      return "free_bucket";
    case UnitOpKind::kOpenBucket:
      return "open_bucket";
    case UnitOpKind::kIssueReduce:
      return "issue_reduce";
    case UnitOpKind::kKeepSecondary:
      return "keep_secondary";
    case UnitOpKind::kIssueSecondaryGather:
      return "issue_secondary_gather";
    case UnitOpKind::kFreeSecondary:
      return "free_secondary";
  }
  return "?";
}

UnitSchedule::UnitSchedule(const PartitionPlan& plan, int num_modules,
                           const ScheduleOptions& options)
    : plan_(plan),
      num_modules_(num_modules),
      options_(options),
      gathered_(plan.units().size(), false),
      bucket_open_(plan.units().size(), false),
      secondary_(plan.units().size(), false) {
  // The options users set were validated with the rest of the engine's (engine_options.h's
  // validate(), which the config, the engine and zrt-mem call); what is left to check here is
  // the schedule's own setting and what holds the loops below together.
  ZRT_CHECK(options.rotating_buckets >= 1, "rotating_buckets must be >= 1 (is {})",
            options.rotating_buckets);
  ZRT_CHECK(options.gradient_accumulation_steps >= 1 &&
                (options.hpz_partition_size <= 1 || plan.world() % options.hpz_partition_size == 0),
            "schedule options outside what engine_options.h's validate() accepts (run it first)");
  ZRT_CHECK(options.first_backward_module >= 0 &&
                options.first_backward_module <= std::max(num_modules - 1, 0),
            "first_backward_module {} outside the modules 0..{}", options.first_backward_module,
            num_modules - 1);
  ZRT_CHECK(options.first_backward_module <= lowest_trained_module(plan, num_modules),
            "first_backward_module {}: the backward must reach module {}, the lowest with a "
            "trained parameter (UnitSchedule::lowest_trained_module)",
            options.first_backward_module, lowest_trained_module(plan, num_modules));
  reuse_distance_.assign(static_cast<std::size_t>(std::max(num_modules, 0)), 0);
  std::int64_t later = 0;  // elements of the non-persistent units of modules after m
  for (int m = num_modules - 1; m >= 0; --m) {
    reuse_distance_[static_cast<std::size_t>(m)] = 2 * later;
    for (int u : plan.module_units(m)) {
      if (!plan.unit(u).persistent) later += plan.unit(u).numel;
    }
  }
}

int UnitSchedule::lowest_trained_module(const PartitionPlan& plan, int num_modules) {
  int lowest = std::max(num_modules - 1, 0);
  for (const Unit& unit : plan.units()) {
    if (!unit.frozen) lowest = std::min(lowest, unit.last_backward_module);
  }
  return lowest;
}

int UnitSchedule::last_backward_use(int u) const {
  // Modules are ascending: the first at or above the first backward module.
  for (int m : plan_.unit(u).modules) {
    if (m >= first_backward()) return m;
  }
  return -1;
}

int UnitSchedule::hpz_ranks(int unit) const {
  if (!hpz()) return 0;
  const auto g = static_cast<std::size_t>(plan_.unit(unit).group);
  return g < options_.hpz_group_sizes.size() ? options_.hpz_group_sizes[g]
                                             : options_.hpz_partition_size;
}

std::int64_t UnitSchedule::secondary_numel(int unit) const {
  const int S = hpz_ranks(unit);
  if (S == 0) return 0;
  const Unit& u = plan_.unit(unit);
  ZRT_CHECK(S >= 1 && u.numel % S == 0, "unit {}: {} elements in hpZ shards over {} ranks", unit,
            u.numel, S);
  return u.numel / S;
}

void UnitSchedule::step() {
  ZRT_CHECK(live_secondary_ == 0,
            "step() while hpZ secondary shards are alive: a training forward ran without its "
            "backward (run the backward, or use Phase::kEval for a forward alone)");
  micro_batch_ = 0;
}

std::vector<UnitOp> UnitSchedule::acquire(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < num_modules_, "module {} outside 0..{}", module,
            num_modules_ - 1);
  ZRT_CHECK((phase != Phase::kBackward && phase != Phase::kRecompute) || module >= first_backward(),
            "{} of module {}: the backward ends at module {} (every module below it is frozen: "
            "ParamAccess::first_backward_module)",
            phase_name(phase), module, first_backward());
  ZRT_CHECK(phase != Phase::kBackward || micro_batch_ < options_.gradient_accumulation_steps,
            "backward of micro-batch {} but gradient_accumulation_steps is {}: call step() at the "
            "accumulation boundary",
            micro_batch_ + 1, options_.gradient_accumulation_steps);
  std::vector<UnitOp> ops;
  const auto& units = plan_.module_units(module);
  if (sharded()) {
    for (int u : units) {
      if (plan_.unit(u).persistent) continue;
      gather(u, phase, ops);
      ops.push_back({UnitOpKind::kAwaitGather, u});
    }
    if (phase == Phase::kBackward) {
      // hpZ: this is the last module of the micro-batch to use these units (backward runs from
      // the last module down), and the compute stream has waited for their gathers, the last
      // reads of their secondary shards.
      for (int u : units) {
        if (secondary(u) && last_backward_use(u) == module) {
          secondary_[static_cast<std::size_t>(u)] = false;
          live_secondary_ -= secondary_numel(u);
          ops.push_back({UnitOpKind::kFreeSecondary, u});
        }
      }
    }
    prefetch_after(module, phase, ops);
  }
  if (options_.await_published_per_unit) {
    // The next forward starts on the units already published while later ones are still being
    // updated (offload) or gathered. Before the first step there is nothing to wait for.
    for (int u : units) {
      if (sharded() && !plan_.unit(u).persistent) continue;
      ops.push_back({UnitOpKind::kAwaitPublish, u});
    }
  }
  if (phase == Phase::kBackward) {
    // Stages 0-1 (and 2-3 without gradient_buckets) accumulate a trained unit's gradient in the
    // engine's full gradients; a frozen
    // unit's, which nobody reads, goes to a bucket for its modules' backward at every stage
    // where the model may write it (ScheduleOptions::frozen_buckets), and nowhere otherwise.
    for (int u : units) {
      const bool frozen = plan_.unit(u).frozen;
      if (frozen ? options_.frozen_buckets : per_micro_batch_grads()) open_bucket(u, module, ops);
    }
  }
  return ops;
}

std::vector<UnitOp> UnitSchedule::release(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < num_modules_, "module {} outside 0..{}", module,
            num_modules_ - 1);
  std::vector<UnitOp> ops;
  const auto& units = plan_.module_units(module);
  std::vector<UnitOp> reduces;
  if (phase == Phase::kBackward) {
    // Stages 2-3 reduce every micro-batch's gradient; stages 0-1 (and 2-3 without
    // gradient_buckets) accumulate the full gradient and reduce it once, in the last micro-batch.
    for (int u : units) {
      if (plan_.unit(u).last_backward_module != module) continue;
      if (per_micro_batch_grads() || last_micro_batch()) {
        reduces.push_back({UnitOpKind::kIssueReduce, u, last_micro_batch()});
      }
    }
  }
  if (sharded()) {
    // Keep what the very next module use needs (the last forward module is used again at once
    // by its backward; a recompute is followed by the same module's backward).
    int next = -1;
    if (phase == Phase::kForward) next = module + 1 < num_modules_ ? module + 1 : module;
    if (phase == Phase::kEval) next = module + 1 < num_modules_ ? module + 1 : -1;
    if (phase == Phase::kRecompute) next = module;
    if (phase == Phase::kBackward) next = module > first_backward() ? module - 1 : -1;
    for (int u : units) {
      const Unit& unit = plan_.unit(u);
      if (unit.persistent || !gathered(u)) continue;
      const bool needed_next = next >= 0 && std::find(unit.modules.begin(), unit.modules.end(),
                                                      next) != unit.modules.end();
      if (needed_next) continue;
      // Reused soon enough (its backward, or the recompute before it, comes within the reuse
      // distance) and within the live bound, which already counts it: keep it for the backward.
      const bool reused_soon =
          phase == Phase::kForward && module >= first_backward() &&
          reuse_distance_[static_cast<std::size_t>(module)] <= options_.stage3_max_reuse_distance &&
          live_gathered_ <= options_.stage3_max_live_parameters;
      if (reused_soon) continue;
      gathered_[static_cast<std::size_t>(u)] = false;
      live_gathered_ -= unit.numel;
      ops.push_back({UnitOpKind::kReleaseGather, u});
    }
    // In the backward the next module's gathers go on the comm stream ahead of this module's
    // reductions: the next module waits for its parameters, nothing waits for the reductions
    // until the bucket is reused. Issued at the next acquire() instead, a gather the prefetch
    // window did not take (a unit larger than stage3_prefetch_bucket_size: every block of a
    // 7B model at the default 50M) queued behind the reduction of the module just finished, and
    // each backward module waited for both (Llama-3.1-8B on an H100: 1.7 ms + 0.3 ms before
    // each of 32 modules x 8 micro-batches, 0.54 s of a 3.9 s step; BENCHMARKS.md). The units
    // are gathered after this module's are released, as acquire() would, so the live
    // parameters, and the peaks, are the same.
    if (phase == Phase::kBackward && module > first_backward()) {
      for (int u : plan_.module_units(module - 1)) {
        if (!plan_.unit(u).persistent) gather(u, phase, ops);
      }
    }
  }
  ops.insert(ops.end(), reduces.begin(), reduces.end());
  if (phase == Phase::kBackward) {
    // A frozen unit's bucket is never reduced: it goes once its last module's backward is done.
    for (int u : units) {
      const Unit& unit = plan_.unit(u);
      if (unit.frozen && last_backward_use(u) == module && bucket_open(u)) {
        free_bucket(u, ops);
      }
    }
  }
  if (phase == Phase::kBackward && module == first_backward()) {
    ++micro_batch_;
    // Every bucket of this micro-batch has been reduced: free them all.
    for (auto* list : {&rotating_buckets_, &pinned_buckets_}) {
      for (int u : *list) free_bucket(u, ops);
      list->clear();
    }
  }
  return ops;
}

void UnitSchedule::gather(int u, Phase phase, std::vector<UnitOp>& ops) {
  if (gathered(u)) return;
  gathered_[static_cast<std::size_t>(u)] = true;
  live_gathered_ += plan_.unit(u).numel;
  // hpZ applies to training micro-batches; an eval pass gathers over every rank as without it.
  const bool training = phase != Phase::kEval;
  if (hpz() && training && secondary(u)) {
    ops.push_back({UnitOpKind::kIssueSecondaryGather, u});
    return;
  }
  ops.push_back({UnitOpKind::kIssueGather, u});
  // A unit no backward uses (below the first backward module) keeps no secondary shard: it would
  // live until a backward that does not come (a tied unit's second forward use below it then
  // gathers over every rank). Nor does a unit read in place (hpz_ranks 0: it is whole here).
  if (hpz_ranks(u) > 0 && training && last_backward_use(u) >= 0) {
    secondary_[static_cast<std::size_t>(u)] = true;
    live_secondary_ += secondary_numel(u);
    ops.push_back({UnitOpKind::kKeepSecondary, u});
  }
}

void UnitSchedule::prefetch_after(int module, Phase phase, std::vector<UnitOp>& ops) {
  std::int64_t budget = options_.stage3_prefetch_bucket_size;
  // The module uses that follow this one in the static schedule.
  std::vector<int> next;
  if (phase == Phase::kForward || phase == Phase::kEval) {
    for (int m = module + 1; m < num_modules_; ++m) next.push_back(m);
    if (phase == Phase::kForward) {
      for (int m = num_modules_ - 1; m >= first_backward(); --m) next.push_back(m);
    }
  } else {
    for (int m = module - 1; m >= first_backward(); --m) next.push_back(m);
  }
  // A window of `budget` elements over the next uses: the units already gathered for them
  // take their place in it, and the first unit that does not fit, or would break the
  // live-parameter bound, ends it (so the order of gathers never depends on what happens to be
  // free). Without charging the gathered ones the window grew by a budget at every module, and
  // a forward gathered backward units long before the ones the backward needs first, in front
  // of them on the communication stream.
  std::vector<bool> counted(plan_.units().size(), false);
  for (int m : next) {
    for (int u : plan_.module_units(m)) {
      const Unit& unit = plan_.unit(u);
      if (unit.persistent || counted[static_cast<std::size_t>(u)]) continue;
      counted[static_cast<std::size_t>(u)] = true;
      if (unit.numel > budget) return;
      budget -= unit.numel;
      if (gathered(u)) continue;
      if (live_gathered_ + unit.numel > options_.stage3_max_live_parameters) return;
      gather(u, phase, ops);
    }
  }
}

void UnitSchedule::open_bucket(int u, int module, std::vector<UnitOp>& ops) {
  if (bucket_open(u)) return;
  const Unit& unit = plan_.unit(u);
  // Units whose modules are contiguous in backward order finish before the next one opens, so
  // their buffers rotate: at most `rotating_buckets` live, this one and the ones still being
  // reduced (the oldest is freed, after its reduction, to make room). Only a finished bucket
  // is freed (its last module's backward released: above `module`): where a module's
  // parameters are in several units at once (trained and frozen ones, or two groups' buckets
  // whose modules overlap), the ones still in use stay open beyond the count. A shared or
  // persistent unit stays open until its last use (the first backward module's backward at the
  // latest). A frozen
  // unit's bucket, never reduced, takes no place in the rotation (it would make a module's
  // backward wait for the previous module's reduction) and goes after its last module's
  // backward (release()).
  if (unit.frozen) {
    // Neither list.
  } else if (!unit.shared && !unit.persistent) {
    while (static_cast<int>(rotating_buckets_.size()) >= options_.rotating_buckets) {
      const auto finished =
          std::find_if(rotating_buckets_.begin(), rotating_buckets_.end(),
                       [&](int b) { return plan_.unit(b).last_backward_module > module; });
      if (finished == rotating_buckets_.end()) break;
      free_bucket(*finished, ops);
      rotating_buckets_.erase(finished);
    }
    rotating_buckets_.push_back(u);
  } else {
    pinned_buckets_.push_back(u);
  }
  bucket_open_[static_cast<std::size_t>(u)] = true;
  live_buckets_ += unit.numel;
  ops.push_back({UnitOpKind::kOpenBucket, u});
}

void UnitSchedule::free_bucket(int u, std::vector<UnitOp>& ops) {
  bucket_open_[static_cast<std::size_t>(u)] = false;
  live_buckets_ -= plan_.unit(u).numel;
  ops.push_back({UnitOpKind::kFreeBucket, u});
}

std::vector<int> UnitSchedule::forward_order(const PartitionPlan& plan) {
  std::vector<int> order;
  for (std::size_t u = 0; u < plan.units().size(); ++u) order.push_back(static_cast<int>(u));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return plan.unit(a).modules.front() < plan.unit(b).modules.front();
  });
  return order;
}

std::vector<bool> UnitSchedule::offloaded_units(const PartitionPlan& plan, double ratio) {
  ZRT_CHECK(ratio >= 0.0 && ratio <= 1.0, "offload ratio {} outside [0, 1]", ratio);
  std::vector<bool> offloaded(plan.units().size(), false);
  const std::vector<int> order = forward_order(plan);
  // Frozen units hold only their master weights, which nothing steps or sends up: in host memory
  // whenever anything is offloaded, and the ratio splits the trained units' slices.
  std::int64_t trained = 0;
  for (std::size_t u = 0; u < offloaded.size(); ++u) {
    const Unit& unit = plan.unit(static_cast<int>(u));
    if (unit.frozen) {
      offloaded[u] = ratio > 0.0;
    } else {
      trained += unit.shard;
    }
  }
  const double wanted = ratio * static_cast<double>(trained);
  std::int64_t taken = 0;
  for (auto it = order.rbegin(); it != order.rend() && static_cast<double>(taken) < wanted; ++it) {
    if (plan.unit(*it).frozen) continue;
    offloaded[static_cast<std::size_t>(*it)] = true;
    taken += plan.unit(*it).shard;
  }
  return offloaded;
}

SchedulePeaks schedule_peaks(const PartitionPlan& plan, int num_modules,
                             const ScheduleOptions& options, const std::vector<bool>& recomputed,
                             const std::vector<bool>& gathered_in_place,
                             ElementBytes element_bytes) {
  ZRT_CHECK(static_cast<int>(recomputed.size()) == num_modules,
            "schedule_peaks: {} recompute flags for {} modules", recomputed.size(), num_modules);
  ZRT_CHECK(gathered_in_place.empty() || gathered_in_place.size() == plan.units().size(),
            "schedule_peaks: {} in-place flags for {} units", gathered_in_place.size(),
            plan.units().size());
  UnitSchedule schedule(plan, num_modules, options);
  SchedulePeaks peaks;
  // The elements a gather of unit u allocates: none where the model reads the slice itself.
  const auto gathered_numel = [&](int u) -> std::int64_t {
    const bool in_place =
        !gathered_in_place.empty() && gathered_in_place[static_cast<std::size_t>(u)];
    return in_place ? 0 : plan.unit(u).numel;
  };
  auto note = [&](const std::vector<UnitOp>& ops) {
    std::int64_t gathered = 0;
    for (int u = 0; u < static_cast<int>(plan.units().size()); ++u) {
      if (schedule.gathered(u)) gathered += gathered_numel(u);
    }
    std::int64_t secondary = schedule.live_secondary_elements();
    std::int64_t buckets = schedule.live_bucket_elements();
    // The counters are at the end of the ops; walk back to see each intermediate state.
    struct State {
      std::int64_t gathered, secondary, buckets;
    };
    std::vector<State> states{{gathered, secondary, buckets}};
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      const std::int64_t n = plan.unit(it->unit).numel;
      switch (it->kind) {
        case UnitOpKind::kIssueGather:
        case UnitOpKind::kIssueSecondaryGather:
          gathered -= gathered_numel(it->unit);
          break;
        case UnitOpKind::kKeepSecondary:
          secondary -= schedule.secondary_numel(it->unit);
          break;
        case UnitOpKind::kFreeSecondary:
          secondary += schedule.secondary_numel(it->unit);
          break;
        case UnitOpKind::kReleaseGather:
          gathered += gathered_numel(it->unit);
          break;
        case UnitOpKind::kOpenBucket:
          buckets -= n;
          break;
        case UnitOpKind::kFreeBucket:
          buckets += n;
          break;
        default:
          break;
      }
      states.push_back({gathered, secondary, buckets});
    }
    for (const State& s : states) {
      peaks.gathered_elements = std::max(peaks.gathered_elements, s.gathered);
      peaks.secondary_elements = std::max(peaks.secondary_elements, s.secondary);
      peaks.params_elements = std::max(peaks.params_elements, s.gathered + s.secondary);
      peaks.bucket_elements = std::max(peaks.bucket_elements, s.buckets);
      peaks.sum_elements = std::max(peaks.sum_elements, s.gathered + s.secondary + s.buckets);
      peaks.sum_bytes =
          std::max(peaks.sum_bytes, (s.gathered + s.secondary) * element_bytes.params +
                                        s.buckets * element_bytes.buckets);
    }
  };
  auto use = [&](int m, Phase phase) {
    note(schedule.acquire(m, phase));
    note(schedule.release(m, phase));
  };
  for (int micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
    for (int m = 0; m < num_modules; ++m) use(m, Phase::kForward);
    for (int m = num_modules - 1; m >= options.first_backward_module; --m) {
      if (recomputed[static_cast<std::size_t>(m)]) use(m, Phase::kRecompute);
      use(m, Phase::kBackward);
    }
  }
  schedule.step();
  for (int m = 0; m < num_modules; ++m) use(m, Phase::kEval);
  return peaks;
}

}  // namespace zrt
