#include "runtime/engine/partition.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt {

namespace {
std::int64_t round_up(std::int64_t n, std::int64_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

PartitionPlan::PartitionPlan(const std::vector<ParamSpec>& params, const PartitionOptions& options)
    : placement_(params.size()), world_(options.world) {
  ZRT_CHECK(options.stage >= 0 && options.stage <= 3, "ZeRO stage {} outside 0-3", options.stage);
  ZRT_CHECK(options.world >= 1, "world size {}", options.world);
  ZRT_CHECK(options.alignment >= 1, "alignment {}", options.alignment);
  ZRT_CHECK(options.num_modules >= 1, "a model needs at least one module");
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
    content_numel_ += p.numel();
  }
  auto is_shared = [&](int i) { return params[static_cast<std::size_t>(i)].modules.size() > 1; };

  if (options.stage == 3) {
    Unit persistent;
    persistent.persistent = true;
    for (int m = 0; m < options.num_modules; ++m) {
      Unit unit;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const ParamSpec& p = params[i];
        if (p.modules.front() != m) continue;  // placed at its first use
        if (p.numel() < options.persistence_threshold) {
          persistent.params.push_back(static_cast<int>(i));
        } else if (is_shared(static_cast<int>(i))) {
          Unit own;
          own.shared = true;
          own.params.push_back(static_cast<int>(i));
          add_unit(std::move(own), params, options.alignment);
        } else {
          unit.params.push_back(static_cast<int>(i));
        }
      }
      if (!unit.params.empty()) add_unit(std::move(unit), params, options.alignment);
    }
    if (!persistent.params.empty()) add_unit(std::move(persistent), params, options.alignment);
  } else {
    // Buckets in backward order: modules from last to first, whole modules per bucket.
    Unit bucket;
    std::int64_t bucket_size = 0;
    for (int m = options.num_modules - 1; m >= 0; --m) {
      std::vector<int> own;
      std::int64_t module_size = 0;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const ParamSpec& p = params[i];
        if (is_shared(static_cast<int>(i))) {
          if (p.modules.front() == m) {  // completes here
            Unit unit;
            unit.shared = true;
            unit.params.push_back(static_cast<int>(i));
            add_unit(std::move(unit), params, options.alignment);
          }
          continue;
        }
        if (p.modules.front() != m) continue;
        own.push_back(static_cast<int>(i));
        module_size += p.numel();
      }
      if (own.empty()) continue;
      if (!bucket.params.empty() && bucket_size + module_size > options.bucket_elements) {
        add_unit(std::move(bucket), params, options.alignment);
        bucket = Unit{};
        bucket_size = 0;
      }
      bucket.params.insert(bucket.params.end(), own.begin(), own.end());
      bucket_size += module_size;
    }
    if (!bucket.params.empty()) add_unit(std::move(bucket), params, options.alignment);
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (int m : units_[u].modules)
      module_units_[static_cast<std::size_t>(m)].push_back(static_cast<int>(u));
  }
}

void PartitionPlan::add_unit(Unit unit, const std::vector<ParamSpec>& params,
                             std::int64_t alignment) {
  const int index = static_cast<int>(units_.size());
  std::int64_t cursor = 0;
  unit.last_backward_module = 1 << 30;
  for (int p : unit.params) {
    const ParamSpec& spec = params[static_cast<std::size_t>(p)];
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
  unit.numel = round_up(std::max<std::int64_t>(cursor, 1), alignment * world_);
  unit.shard = unit.numel / world_;
  unit.offset = total_numel_;
  total_numel_ += unit.numel;
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
                                content_numel_, total_numel_, world_);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    out +=
        fmt::format(" [{}: {} params, {} el{}{}]", u, units_[u].params.size(), units_[u].numel,
                    units_[u].shared ? ", shared" : "", units_[u].persistent ? ", persistent" : "");
  }
  return out;
}

}  // namespace zrt
