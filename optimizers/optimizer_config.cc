#include "optimizers/optimizer_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "runtime/common/error.h"
#include "runtime/common/name_pattern.h"

namespace zrt {

namespace {

using json = nlohmann::json;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

const json* find(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Reads the keys of one block, recording each problem and going on with the fallback value,
// so that one pass finds every problem of the block.
class BlockReader {
 public:
  explicit BlockReader(std::vector<ConfigProblem>& problems) : problems_(problems) {}

  template <typename... Args>
  void problem(ProblemKind kind, fmt::format_string<Args...> format, Args&&... args) {
    problems_.push_back({kind, fmt::format(format, std::forward<Args>(args)...)});
  }

  // Records every key of `object` not in `known`, suggesting the closest known key.
  void check_keys(const json& object, const std::vector<std::string>& known,
                  const std::string& where) {
    for (const auto& item : object.items()) {
      if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
      const std::string guess = detail::closest_match(item.key(), known);
      problem(ProblemKind::kUnknownKey, "unknown key '{}' in {}{}; valid keys: {}", item.key(),
              where, guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), join(known));
    }
  }

  double get_number(const json& object, const char* key, double fallback,
                    const std::string& where) {
    const json* v = find(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) {
      problem(ProblemKind::kBadValue, "{}.{} must be a number, not {}", where, key, v->dump());
      return fallback;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x)) {
      problem(ProblemKind::kBadValue, "{}.{} must be finite", where, key);
      return fallback;
    }
    return x;
  }

  std::int64_t get_int(const json& object, const char* key, std::int64_t fallback,
                       const std::string& where) {
    const json* v = find(object, key);
    if (v == nullptr) return fallback;
    // DeepSpeed configs sometimes carry integral floats (1e4); accept them, reject fractions.
    if (v->is_number_integer()) return v->get<std::int64_t>();
    if (v->is_number_float()) {
      const double x = v->get<double>();
      if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e18) {
        return static_cast<std::int64_t>(x);
      }
    }
    problem(ProblemKind::kBadValue, "{}.{} must be an integer, not {}", where, key, v->dump());
    return fallback;
  }

  bool get_bool(const json& object, const char* key, bool fallback, const std::string& where) {
    const json* v = find(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      problem(ProblemKind::kBadValue, "{}.{} must be true or false, not {}", where, key, v->dump());
      return fallback;
    }
    return v->get<bool>();
  }

  std::string get_string(const json& object, const char* key, const std::string& fallback,
                         const std::string& where) {
    const json* v = find(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) {
      problem(ProblemKind::kBadValue, "{}.{} must be a string, not {}", where, key, v->dump());
      return fallback;
    }
    return v->get<std::string>();
  }

  // False (with the problem recorded) unless `v` is an object.
  bool require_object(const json& v, const std::string& where) {
    if (v.is_object()) return true;
    problem(ProblemKind::kBadValue, "{} must be an object, not {}", where, v.dump());
    return false;
  }

 private:
  std::vector<ConfigProblem>& problems_;
};

// The throwing form of the parsers: every problem, one per line.
void throw_problems(const std::vector<ConfigProblem>& problems) {
  std::string message;
  for (const ConfigProblem& p : problems) {
    if (p.kind == ProblemKind::kWarning) {
      spdlog::warn("{}", p.message);
    } else {
      message += (message.empty() ? "" : "\n") + p.message;
    }
  }
  if (!message.empty()) throw InvalidArgument(message);
}

// Optimizer types DeepSpeed knows; the Adam family and Lion are implemented here.
const std::vector<std::string> kSupportedOptimizers = {"Adam", "AdamW", "Lion"};
const std::vector<std::string> kKnownOptimizers = {
    "Adam", "AdamW",  "Adagrad", "Lamb",  "OneBitAdam", "ZeroOneAdam", "OneBitLamb",
    "Lion", "MuAdam", "MuAdamW", "MuSGD", "SGD",        "Muon"};

// Lion's "params" block (DeepSpeed's FusedLion / DeepSpeedCPULion keys), checked as Adam's.
void parse_lion_params(BlockReader& r, const json& params, const std::string& where,
                       LionOptions& lion) {
  r.check_keys(params, {"lr", "betas", "weight_decay"}, where);
  const LionOptions defaults;
  lion.lr = r.get_number(params, "lr", lion.lr, where);
  if (const json* betas = find(params, "betas")) {
    if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
        !(*betas)[1].is_number()) {
      r.problem(ProblemKind::kBadValue, "{}.betas must be a list of two numbers, not {}", where,
                betas->dump());
    } else {
      lion.beta1 = (*betas)[0].get<double>();
      lion.beta2 = (*betas)[1].get<double>();
    }
  }
  lion.weight_decay = r.get_number(params, "weight_decay", lion.weight_decay, where);
  if (lion.lr < 0) {
    r.problem(ProblemKind::kBadValue, "{}.lr must be >= 0, got {}", where, lion.lr);
    lion.lr = defaults.lr;
  }
  if (!(lion.beta1 >= 0 && lion.beta1 < 1) || !(lion.beta2 >= 0 && lion.beta2 < 1)) {
    r.problem(ProblemKind::kBadValue, "{}.betas must lie in [0, 1), got [{}, {}]", where,
              lion.beta1, lion.beta2);
    lion.beta1 = defaults.beta1;
    lion.beta2 = defaults.beta2;
  }
  if (lion.weight_decay < 0) {
    r.problem(ProblemKind::kBadValue, "{}.weight_decay must be >= 0, got {}", where,
              lion.weight_decay);
    lion.weight_decay = defaults.weight_decay;
  }
}

}  // namespace

namespace detail {

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::string best;
  std::size_t best_distance = std::string::npos;
  for (const auto& candidate : candidates) {
    const std::string c = lower(candidate);
    // Edit distance counting an adjacent transposition as one edit ("stpes" is one edit from
    // "steps"), as typos usually are: three rows (optimal string alignment).
    std::vector<std::size_t> before(c.size() + 1), prev(c.size() + 1), cur(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= w.size(); ++i) {
      cur[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j) {
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (w[i - 1] != c[j - 1])});
        if (i > 1 && j > 1 && w[i - 1] == c[j - 2] && w[i - 2] == c[j - 1]) {
          cur[j] = std::min(cur[j], before[j - 2] + 1);
        }
      }
      std::swap(before, prev);
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_distance) {
      best_distance = prev[c.size()];
      best = candidate;
    }
  }
  // A plausible typo changes at most a third of the word (and at least allows one edit).
  const std::size_t limit = std::max<std::size_t>(1, std::max(w.size(), best.size()) / 3);
  return best_distance <= limit ? best : std::string();
}

}  // namespace detail

bool OptimizerConfig::applies_weight_decay(const std::string& name) const {
  return std::none_of(
      no_weight_decay.begin(), no_weight_decay.end(),
      [&](const std::string& pattern) { return name_matches_pattern(pattern, name); });
}

std::string unsupported_optimizer_type(const std::string& type) {
  const auto same = [&](const std::string& s) { return lower(s) == lower(type); };
  if (std::any_of(kSupportedOptimizers.begin(), kSupportedOptimizers.end(), same)) return "";
  const bool known = std::any_of(kKnownOptimizers.begin(), kKnownOptimizers.end(), same);
  const std::string guess = known ? "" : detail::closest_match(type, kSupportedOptimizers);
  return fmt::format("optimizer type '{}' is {}; supported types: {}{}", type,
                     known ? "not supported by zrt" : "unknown", join(kSupportedOptimizers),
                     guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
}

OptimizerConfig parse_optimizer_config(const json& block) {
  std::vector<ConfigProblem> problems;
  OptimizerConfig config = parse_optimizer_config(block, problems);
  throw_problems(problems);
  return config;
}

OptimizerConfig parse_optimizer_config(const json& block, std::vector<ConfigProblem>& problems) {
  OptimizerConfig config;
  if (block.is_null()) return config;
  BlockReader r(problems);
  if (!r.require_object(block, "optimizer")) return config;

  const std::string type = r.get_string(block, "type", "AdamW", "optimizer");
  if (block.contains("type") && !block["type"].is_string()) return config;
  if (const std::string why = unsupported_optimizer_type(type); !why.empty()) {
    // Another optimizer's parameters (Lamb's max_coeff, ...) would only add noise.
    r.problem(ProblemKind::kUnsupported, "{}", why);
    return config;
  }
  config.type = *std::find_if(kSupportedOptimizers.begin(), kSupportedOptimizers.end(),
                              [&](const std::string& s) { return lower(s) == lower(type); });
  r.check_keys(block, {"type", "params", "no_weight_decay"}, "optimizer");

  const json empty = json::object();
  const json& params = block.contains("params") ? block["params"] : empty;
  const std::string where = "optimizer.params";
  if (config.is_lion()) {
    if (r.require_object(params, where)) parse_lion_params(r, params, where, config.lion);
  } else if (r.require_object(params, where)) {
    // torch_adam selects DeepSpeed's implementation, not the math: accepted and ignored.
    r.check_keys(params,
                 {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad",
                  "torch_adam"},
                 where);
    AdamOptions& adam = config.adam;
    const AdamOptions defaults;
    adam.lr = r.get_number(params, "lr", adam.lr, where);
    if (const json* betas = find(params, "betas")) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
          !(*betas)[1].is_number()) {
        r.problem(ProblemKind::kBadValue, "{}.betas must be a list of two numbers, not {}", where,
                  betas->dump());
      } else {
        adam.beta1 = (*betas)[0].get<double>();
        adam.beta2 = (*betas)[1].get<double>();
      }
    }
    adam.eps = r.get_number(params, "eps", adam.eps, where);
    adam.weight_decay = r.get_number(params, "weight_decay", adam.weight_decay, where);
    adam.bias_correction = r.get_bool(params, "bias_correction", adam.bias_correction, where);
    if (r.get_bool(params, "amsgrad", false, where)) {
      r.problem(ProblemKind::kUnsupported,
                "{}.amsgrad: AMSGrad is not supported (DeepSpeed's fused Adam "
                "does not support it either); remove the key or set it to false",
                where);
    }
    r.get_bool(params, "torch_adam", false, where);
    // DeepSpeed: "AdamW" is always decoupled; "Adam" is decoupled unless adam_w_mode is false.
    const bool adam_w_mode = r.get_bool(params, "adam_w_mode", true, where);
    if (config.type == "AdamW") {
      if (!adam_w_mode) {
        r.problem(ProblemKind::kWarning,
                  "{}.adam_w_mode: false is ignored by optimizer type AdamW (as DeepSpeed "
                  "does); use type Adam for L2 weight decay",
                  where);
      }
      adam.adam_w_mode = true;
    } else {
      adam.adam_w_mode = adam_w_mode;
    }

    if (adam.lr < 0) {
      r.problem(ProblemKind::kBadValue, "{}.lr must be >= 0, got {}", where, adam.lr);
      adam.lr = defaults.lr;
    }
    if (!(adam.beta1 >= 0 && adam.beta1 < 1) || !(adam.beta2 >= 0 && adam.beta2 < 1)) {
      r.problem(ProblemKind::kBadValue, "{}.betas must lie in [0, 1), got [{}, {}]", where,
                adam.beta1, adam.beta2);
      adam.beta1 = defaults.beta1;
      adam.beta2 = defaults.beta2;
    }
    if (!(adam.eps > 0)) {
      r.problem(ProblemKind::kBadValue, "{}.eps must be > 0, got {}", where, adam.eps);
      adam.eps = defaults.eps;
    }
    if (adam.weight_decay < 0) {
      r.problem(ProblemKind::kBadValue, "{}.weight_decay must be >= 0, got {}", where,
                adam.weight_decay);
      adam.weight_decay = defaults.weight_decay;
    }
  }

  if (const json* patterns = find(block, "no_weight_decay")) {
    if (!patterns->is_array()) {
      r.problem(ProblemKind::kBadValue,
                "optimizer.no_weight_decay must be a list of name patterns, not {}",
                patterns->dump());
    } else {
      config.no_weight_decay.clear();
      for (const auto& p : *patterns) {
        if (!p.is_string() || p.get<std::string>().empty()) {
          r.problem(ProblemKind::kBadValue,
                    "optimizer.no_weight_decay entries must be non-empty strings, not {}",
                    p.dump());
          continue;
        }
        config.no_weight_decay.push_back(p.get<std::string>());
      }
    }
  }
  return config;
}

const char* lr_schedule_name(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::kConstant:
      return "constant";
    case LrScheduleType::kWarmupLR:
      return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

namespace {
const std::vector<std::string> kSupportedSchedules = {"WarmupLR", "WarmupDecayLR",
                                                      "WarmupCosineLR"};
}  // namespace

std::string unsupported_scheduler_type(const std::string& type) {
  if (std::find(kSupportedSchedules.begin(), kSupportedSchedules.end(), type) !=
      kSupportedSchedules.end()) {
    return "";
  }
  const bool known = type == "LRRangeTest" || type == "OneCycle";
  const std::string guess = known ? "" : detail::closest_match(type, kSupportedSchedules);
  return fmt::format("scheduler type '{}' is {}; supported types: {}{}", type,
                     known ? "not supported by zrt" : "unknown", join(kSupportedSchedules),
                     guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
}

SchedulerConfig parse_scheduler_config(const json& block) {
  std::vector<ConfigProblem> problems;
  SchedulerConfig config = parse_scheduler_config(block, problems);
  throw_problems(problems);
  return config;
}

SchedulerConfig parse_scheduler_config(const json& block, std::vector<ConfigProblem>& problems) {
  SchedulerConfig config;
  if (block.is_null()) return config;
  BlockReader r(problems);
  if (!r.require_object(block, "scheduler")) return config;
  if (!block.contains("type")) {
    r.problem(ProblemKind::kMissing, "scheduler.type is missing; supported types: {}",
              join(kSupportedSchedules));
    return config;
  }
  const std::string type = r.get_string(block, "type", "", "scheduler");
  if (!block["type"].is_string()) return config;
  if (const std::string why = unsupported_scheduler_type(type); !why.empty()) {
    // Another schedule's parameters (OneCycle's cycle_min_lr, ...) would only add noise.
    r.problem(ProblemKind::kUnsupported, "{}", why);
    return config;
  }
  config.type = type == "WarmupLR"        ? LrScheduleType::kWarmupLR
                : type == "WarmupDecayLR" ? LrScheduleType::kWarmupDecayLR
                                          : LrScheduleType::kWarmupCosineLR;
  r.check_keys(block, {"type", "params"}, "scheduler");

  const json empty = json::object();
  const json& params = block.contains("params") ? block["params"] : empty;
  const std::string where = "scheduler.params";
  if (!r.require_object(params, where)) return config;
  std::vector<std::string> keys;
  if (config.type == LrScheduleType::kWarmupCosineLR) {
    keys = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
            "cos_min_ratio",   "warmup_type",      "last_batch_iteration"};
  } else {
    keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
            "last_batch_iteration"};
    if (config.type == LrScheduleType::kWarmupDecayLR) keys.push_back("total_num_steps");
  }
  r.check_keys(params, keys, fmt::format("{} ({})", where, type));
  if (r.get_int(params, "last_batch_iteration", -1, where) != -1) {
    r.problem(ProblemKind::kUnsupported,
              "{}.last_batch_iteration: only -1 (start from the beginning) is "
              "supported; a resumed run takes its iteration from the checkpoint",
              where);
  }

  const SchedulerConfig defaults;
  config.warmup_num_steps = r.get_int(params, "warmup_num_steps", config.warmup_num_steps, where);
  if (config.warmup_num_steps < 0) {
    r.problem(ProblemKind::kBadValue, "{}.warmup_num_steps must be >= 0, got {}", where,
              config.warmup_num_steps);
    config.warmup_num_steps = defaults.warmup_num_steps;
  }
  const std::string warmup_type = r.get_string(params, "warmup_type", "log", where);
  if (warmup_type == "log") {
    config.warmup_type = WarmupType::kLog;
  } else if (warmup_type == "linear") {
    config.warmup_type = WarmupType::kLinear;
  } else {
    r.problem(ProblemKind::kBadValue, "{}.warmup_type must be 'log' or 'linear', not '{}'", where,
              warmup_type);
  }

  if (config.type == LrScheduleType::kWarmupCosineLR) {
    config.warmup_min_ratio =
        r.get_number(params, "warmup_min_ratio", config.warmup_min_ratio, where);
    config.cos_min_ratio = r.get_number(params, "cos_min_ratio", config.cos_min_ratio, where);
    if (config.warmup_min_ratio < 0 || config.cos_min_ratio < 0) {
      r.problem(ProblemKind::kBadValue, "{}: warmup_min_ratio and cos_min_ratio must be >= 0",
                where);
    }
  } else {
    config.warmup_min_lr = r.get_number(params, "warmup_min_lr", config.warmup_min_lr, where);
    config.warmup_max_lr = r.get_number(params, "warmup_max_lr", config.warmup_max_lr, where);
    if (config.warmup_min_lr < 0 || config.warmup_max_lr < 0) {
      r.problem(ProblemKind::kBadValue, "{}: warmup_min_lr and warmup_max_lr must be >= 0", where);
    }
  }

  if (config.type != LrScheduleType::kWarmupLR) {
    if (!params.contains("total_num_steps")) {
      r.problem(ProblemKind::kMissing, "{}.total_num_steps is required for {}", where, type);
      return config;
    }
    const std::size_t before = problems.size();
    config.total_num_steps = r.get_int(params, "total_num_steps", 0, where);
    if (problems.size() != before) return config;  // not an integer: nothing to compare
    const std::int64_t warmup = std::max<std::int64_t>(2, config.warmup_num_steps);
    if (config.total_num_steps <= 0) {
      r.problem(ProblemKind::kBadValue, "{}.total_num_steps must be > 0, got {}", where,
                config.total_num_steps);
    } else if (config.type == LrScheduleType::kWarmupCosineLR && config.total_num_steps <= warmup) {
      r.problem(ProblemKind::kConflict,
                "{}.total_num_steps ({}) must exceed warmup_num_steps ({}, at "
                "least 2) for WarmupCosineLR",
                where, config.total_num_steps, warmup);
    } else if (config.total_num_steps < warmup) {
      r.problem(ProblemKind::kWarning,
                "{}.total_num_steps: {} is less than warmup_num_steps {} (the decay never starts)",
                where, config.total_num_steps, warmup);
    }
  }
  return config;
}

}  // namespace zrt
