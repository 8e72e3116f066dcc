#include "tools/mem/schedule_replay.h"

#include <algorithm>
#include <deque>

#include "runtime/common/error.h"

namespace zrt::mem {

namespace {

// The engine's bookkeeping of gathered units and gradient buckets, without the memory.
class Replay {
 public:
  Replay(const PartitionPlan& plan, const EngineOptions& options, int num_modules)
      : plan_(plan),
        options_(options),
        num_modules_(num_modules),
        gathered_(plan.units().size(), false),
        bucket_open_(plan.units().size(), false) {}

  void acquire(int module, Phase phase) {
    const auto& units = plan_.module_units(module);
    if (sharded()) {
      for (int u : units) {
        if (!plan_.unit(u).persistent) gather(u);
      }
      prefetch_after(module, phase);
    }
    if (phase == Phase::kBackward && options_.stage >= 2) {
      for (int u : units) open_bucket(u);
    }
  }

  void release(int module, Phase phase) {
    if (sharded()) {
      // ZeroEngine::release: keep what the very next module use needs.
      int next = -1;
      if (phase == Phase::kForward) next = module + 1 < num_modules_ ? module + 1 : module;
      if (phase == Phase::kEval) next = module + 1 < num_modules_ ? module + 1 : -1;
      if (phase == Phase::kRecompute) next = module;
      if (phase == Phase::kBackward) next = module - 1;
      for (int u : plan_.module_units(module)) {
        const Unit& unit = plan_.unit(u);
        if (unit.persistent) continue;
        const bool needed_next = next >= 0 && std::find(unit.modules.begin(), unit.modules.end(),
                                                        next) != unit.modules.end();
        if (!needed_next) release_gathered(u);
      }
    }
    if (phase == Phase::kBackward && module == 0) close_buckets();
  }

  const ReplayPeaks& peaks() const { return peaks_; }

 private:
  bool sharded() const { return options_.stage == 3; }

  void note() {
    peaks_.gathered_elements = std::max(peaks_.gathered_elements, live_gathered_);
    peaks_.bucket_elements = std::max(peaks_.bucket_elements, live_buckets_);
    const auto element = static_cast<std::int64_t>(dtype_size(options_.compute_dtype));
    peaks_.sum_bytes = std::max(peaks_.sum_bytes, (live_gathered_ + live_buckets_) * element);
  }

  void gather(int u) {
    if (gathered_[static_cast<std::size_t>(u)]) return;
    gathered_[static_cast<std::size_t>(u)] = true;
    live_gathered_ += plan_.unit(u).numel;
    note();
  }

  void release_gathered(int u) {
    if (!gathered_[static_cast<std::size_t>(u)]) return;
    gathered_[static_cast<std::size_t>(u)] = false;
    live_gathered_ -= plan_.unit(u).numel;
  }

  // ZeroEngine::prefetch_after: the module uses that follow in the static schedule, within the
  // prefetch budget and the live-parameter bound, stopping at the first unit that does not fit.
  void prefetch_after(int module, Phase phase) {
    std::int64_t budget = options_.stage3_prefetch_bucket_size;
    std::vector<int> next;
    if (phase == Phase::kForward || phase == Phase::kEval) {
      for (int m = module + 1; m < num_modules_; ++m) next.push_back(m);
      if (phase == Phase::kForward) {
        for (int m = num_modules_ - 1; m >= 0; --m) next.push_back(m);
      }
    } else {
      for (int m = module - 1; m >= 0; --m) next.push_back(m);
    }
    for (int m : next) {
      for (int u : plan_.module_units(m)) {
        const Unit& unit = plan_.unit(u);
        if (unit.persistent || gathered_[static_cast<std::size_t>(u)]) continue;
        if (unit.numel > budget) return;
        if (live_gathered_ + unit.numel > options_.stage3_max_live_parameters) return;
        gather(u);
        budget -= unit.numel;
      }
    }
  }

  // ZeroEngine::open_grad_bucket: buckets of units whose modules are contiguous rotate (the
  // previous ones are freed before the next is allocated); shared and persistent ones stay open
  // until the end of the micro-batch's backward.
  void open_bucket(int u) {
    if (bucket_open_[static_cast<std::size_t>(u)]) return;
    const Unit& unit = plan_.unit(u);
    if (!unit.shared && !unit.persistent) {
      for (int old : rotating_) free_bucket(old);
      rotating_.clear();
      rotating_.push_back(u);
    } else {
      pinned_.push_back(u);
    }
    bucket_open_[static_cast<std::size_t>(u)] = true;
    live_buckets_ += unit.numel;
    note();
  }

  void free_bucket(int u) {
    bucket_open_[static_cast<std::size_t>(u)] = false;
    live_buckets_ -= plan_.unit(u).numel;
  }

  void close_buckets() {
    for (auto* list : {&rotating_, &pinned_}) {
      for (int u : *list) free_bucket(u);
      list->clear();
    }
  }

  const PartitionPlan& plan_;
  const EngineOptions& options_;
  int num_modules_;
  std::vector<bool> gathered_;
  std::vector<bool> bucket_open_;
  std::deque<int> rotating_, pinned_;
  std::int64_t live_gathered_ = 0;
  std::int64_t live_buckets_ = 0;
  ReplayPeaks peaks_;
};

}  // namespace

ReplayPeaks replay_schedule(const PartitionPlan& plan, const EngineOptions& options,
                            int num_modules, const std::vector<bool>& recomputed) {
  ZRT_CHECK(static_cast<int>(recomputed.size()) == num_modules,
            "replay_schedule: {} recompute flags for {} modules", recomputed.size(), num_modules);
  Replay r(plan, options, num_modules);
  for (int micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
    for (int m = 0; m < num_modules; ++m) {
      r.acquire(m, Phase::kForward);
      r.release(m, Phase::kForward);
    }
    for (int m = num_modules - 1; m >= 0; --m) {
      if (recomputed[static_cast<std::size_t>(m)]) {
        r.acquire(m, Phase::kRecompute);
        r.release(m, Phase::kRecompute);
      }
      r.acquire(m, Phase::kBackward);
      r.release(m, Phase::kBackward);
    }
  }
  for (int m = 0; m < num_modules; ++m) {
    r.acquire(m, Phase::kEval);
    r.release(m, Phase::kEval);
  }
  return r.peaks();
}

}  // namespace zrt::mem
