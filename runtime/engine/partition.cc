#include "runtime/engine/partition.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt {

namespace {
std::int64_t round_up(std::int64_t n, std::int64_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

PartitionPlan::PartitionPlan(const std::vector<ParamSpec>& params, const PartitionOptions& options,
                             std::vector<int> group_worlds)
    : placement_(params.size()),
      group_worlds_(group_worlds.empty() ? std::vector<int>{options.world}
                                         : std::move(group_worlds)) {
  ZRT_CHECK(options.stage >= 0 && options.stage <= 3, "ZeRO stage {} outside 0-3", options.stage);
  for (int w : group_worlds_) ZRT_CHECK(w >= 1, "world size {}", w);
  ZRT_CHECK(options.alignment >= 1, "alignment {}", options.alignment);
  ZRT_CHECK(options.num_modules >= 1, "a model needs at least one module");
  const int groups = group_count();
  module_units_.resize(static_cast<std::size_t>(options.num_modules));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    ZRT_CHECK(!p.modules.empty(), "parameter '{}' is used by no module", p.name);
    ZRT_CHECK(std::is_sorted(p.modules.begin(), p.modules.end()),
              "parameter '{}': modules must be listed in ascending order", p.name);
    for (int m : p.modules) {
      ZRT_CHECK(m >= 0 && m < options.num_modules, "parameter '{}' names module {} of {}", p.name,
                m, options.num_modules);
    }
    ZRT_CHECK(p.numel() > 0, "parameter '{}' has no elements", p.name);
    ZRT_CHECK(
        p.group >= 0 && p.group < groups,
        "parameter '{}' names shard group {} but the engine has {} group(s) (ParamSpec::group "
        "indexes the engine's table of groups)",
        p.name, p.group, groups);
    content_numel_ += p.numel();
  }
  auto is_shared = [&](int i) { return params[static_cast<std::size_t>(i)].modules.size() > 1; };
  // A unit holds trained or frozen parameters, never both (Unit::frozen): the kinds are kept
  // apart like the groups, as slot 2 g + frozen of each per-kind vector below.
  const int kinds = 2 * groups;
  auto kind_of = [&](int i) {
    const ParamSpec& p = params[static_cast<std::size_t>(i)];
    return static_cast<std::size_t>(2 * p.group + (p.frozen ? 1 : 0));
  };
  auto unit_of_kind = [](int kind, bool persistent) {
    Unit unit;
    unit.group = kind / 2;
    unit.frozen = kind % 2 == 1;
    unit.persistent = persistent;
    return unit;
  };

  if (options.stage == 3) {
    std::vector<Unit> persistent;
    for (int k = 0; k < kinds; ++k) persistent.push_back(unit_of_kind(k, true));
    for (int m = 0; m < options.num_modules; ++m) {
      std::vector<Unit> unit;  // the module's unit of each kind
      for (int k = 0; k < kinds; ++k) unit.push_back(unit_of_kind(k, false));
      for (std::size_t i = 0; i < params.size(); ++i) {
        const ParamSpec& p = params[i];
        if (p.modules.front() != m) continue;  // placed at its first use
        const std::size_t k = kind_of(static_cast<int>(i));
        if (p.numel() < options.persistence_threshold) {
          persistent[k].params.push_back(static_cast<int>(i));
        } else if (is_shared(static_cast<int>(i))) {
          Unit own = unit_of_kind(static_cast<int>(k), false);
          own.shared = true;
          own.params.push_back(static_cast<int>(i));
          add_unit(std::move(own), params, options.alignment);
        } else {
          unit[k].params.push_back(static_cast<int>(i));
        }
      }
      for (Unit& u : unit) {
        if (!u.params.empty()) add_unit(std::move(u), params, options.alignment);
      }
    }
    for (Unit& u : persistent) {
      if (!u.params.empty()) add_unit(std::move(u), params, options.alignment);
    }
  } else {
    // Buckets in backward order: modules from last to first, whole modules per bucket (a
    // module's trained and frozen parameters in buckets of their kind), a bucket per kind.
    std::vector<Unit> bucket;
    for (int k = 0; k < kinds; ++k) bucket.push_back(unit_of_kind(k, false));
    std::vector<std::int64_t> bucket_size(static_cast<std::size_t>(kinds), 0);
    for (int m = options.num_modules - 1; m >= 0; --m) {
      std::vector<std::vector<int>> own(static_cast<std::size_t>(kinds));
      std::vector<std::int64_t> module_size(static_cast<std::size_t>(kinds), 0);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const ParamSpec& p = params[i];
        if (is_shared(static_cast<int>(i))) {
          if (p.modules.front() == m) {  // completes here
            Unit unit = unit_of_kind(static_cast<int>(kind_of(static_cast<int>(i))), false);
            unit.shared = true;
            unit.params.push_back(static_cast<int>(i));
            add_unit(std::move(unit), params, options.alignment);
          }
          continue;
        }
        if (p.modules.front() != m) continue;
        own[kind_of(static_cast<int>(i))].push_back(static_cast<int>(i));
        module_size[kind_of(static_cast<int>(i))] += p.numel();
      }
      for (std::size_t k = 0; k < own.size(); ++k) {
        if (own[k].empty()) continue;
        if (!bucket[k].params.empty() &&
            bucket_size[k] + module_size[k] > options.bucket_elements) {
          add_unit(std::move(bucket[k]), params, options.alignment);
          bucket[k] = unit_of_kind(static_cast<int>(k), false);
          bucket_size[k] = 0;
        }
        bucket[k].params.insert(bucket[k].params.end(), own[k].begin(), own[k].end());
        bucket_size[k] += module_size[k];
      }
    }
    for (Unit& u : bucket) {
      if (!u.params.empty()) add_unit(std::move(u), params, options.alignment);
    }
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (int m : units_[u].modules)
      module_units_[static_cast<std::size_t>(m)].push_back(static_cast<int>(u));
  }
}

void PartitionPlan::add_unit(Unit unit, const std::vector<ParamSpec>& params,
                             std::int64_t alignment) {
  const int index = static_cast<int>(units_.size());
  const int world = group_world(unit.group);
  std::int64_t cursor = 0;
  unit.last_backward_module = 1 << 30;
  for (int p : unit.params) {
    const ParamSpec& spec = params[static_cast<std::size_t>(p)];
    ZRT_CHECK(spec.frozen == unit.frozen, "parameter '{}' is {} in a {} unit", spec.name,
              spec.frozen ? "frozen" : "trained", unit.frozen ? "frozen" : "trained");
    cursor = round_up(cursor, alignment);
    placement_[static_cast<std::size_t>(p)] = ParamPlacement{index, cursor, spec.numel()};
    cursor += spec.numel();
    unit.content += spec.numel();
    for (int m : spec.modules) {
      if (std::find(unit.modules.begin(), unit.modules.end(), m) == unit.modules.end()) {
        unit.modules.push_back(m);
      }
    }
    unit.last_backward_module = std::min(unit.last_backward_module, spec.modules.front());
  }
  std::sort(unit.modules.begin(), unit.modules.end());
  unit.numel = round_up(std::max<std::int64_t>(cursor, 1), alignment * world);
  unit.shard = unit.numel / world;
  unit.offset = total_numel_;
  total_numel_ += unit.numel;
  total_shard_ += unit.shard;
  units_.push_back(std::move(unit));
}

PartitionPlan::OwnedRange PartitionPlan::owned_range(int param, int rank) const {
  const ParamPlacement& pl = placement(param);
  const Unit& u = unit(pl.unit);
  const std::int64_t slice_begin = rank * u.shard;
  const std::int64_t slice_end = slice_begin + u.shard;
  const std::int64_t begin = std::max(pl.offset, slice_begin);
  const std::int64_t end = std::min(pl.offset + pl.numel, slice_end);
  if (begin >= end) return OwnedRange{0, 0, 0};
  return OwnedRange{begin - pl.offset, end - begin, begin - slice_begin};
}

std::string PartitionPlan::describe() const {
  std::string out = fmt::format("{} units, {} elements ({} padded), world {}:", units_.size(),
                                content_numel_, total_numel_, fmt::join(group_worlds_, "/"));
  for (std::size_t u = 0; u < units_.size(); ++u) {
    out +=
        fmt::format(" [{}: {} params, {} el{}{}{}{}]", u, units_[u].params.size(), units_[u].numel,
                    units_[u].shared ? ", shared" : "", units_[u].persistent ? ", persistent" : "",
                    group_count() > 1 ? fmt::format(", group {}", units_[u].group) : "",
                    units_[u].frozen ? ", frozen" : "");
  }
  return out;
}

}  // namespace zrt
