// The "optimizer" and "scheduler" blocks of a DeepSpeed-style config, parsed into validated
// option structs. Keys, types, defaults and meaning follow DeepSpeed; every error names the
// offending key and what would be valid (the closest known key for a typo, the supported types
// for an unsupported "type").
//
//   "optimizer": {
//     "type": "AdamW",                       // or "Adam", "Lion" (case-insensitive, as DeepSpeed)
//     "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
//     "no_weight_decay": ["bias", "ln*", "*norm*"]   // zrt extension, see below
//   },
//   "scheduler": {
//     "type": "WarmupCosineLR",
//     "params": {"total_num_steps": 10000, "warmup_num_steps": 500}
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace zrt {

// Adam hyper-parameters (DeepSpeed's FusedAdam / DeepSpeedCPUAdam "params" keys and defaults).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  // true: decoupled weight decay, p *= 1 - lr*wd before the update (AdamW, torch.optim.AdamW);
  // false: L2 regularisation, g += wd*p before the moments (torch.optim.Adam).
  bool adam_w_mode = true;
};

// Lion hyper-parameters (DeepSpeed's FusedLion / DeepSpeedCPULion "params" keys; betas default
// to the paper's (0.9, 0.99)). Weight decay is always decoupled: p *= 1 - lr*wd.
struct LionOptions {
  double lr = 1e-3;
  double beta1 = 0.9;   // interpolation between momentum and gradient for the update direction
  double beta2 = 0.99;  // decay of the momentum itself
  double weight_decay = 0.0;
};

struct OptimizerConfig {
  // Canonical name: "Adam", "AdamW" (both run Adam; they differ only in adam_w_mode) or "Lion".
  std::string type = "AdamW";
  AdamOptions adam;  // used by Adam and AdamW
  LionOptions lion;  // used by Lion
  bool is_lion() const { return type == "Lion"; }
  // The learning rate of the configured optimizer (the schedules scale it).
  double lr() const { return is_lion() ? lion.lr : adam.lr; }
  // Parameters whose name matches one of these patterns get no weight decay, by the rule of
  // runtime/common/name_pattern.h: a pattern with a '.' is a glob over the whole name
  // ("h.*.attn.c_attn.bias"); one without is matched against each component, so the defaults
  // exempt biases ("...c_attn.bias") and norm weights ("ln_1.weight", "ln_f.weight", "ln1w",
  // "input_layernorm.weight", "LayerNorm.weight"). Matching ignores case. Config key
  // "no_weight_decay" (a zrt extension DeepSpeed ignores); [] applies decay to every parameter.
  std::vector<std::string> no_weight_decay = default_no_weight_decay();

  // Returns true iff weight decay applies to the parameter called `param_name`.
  bool applies_weight_decay(const std::string& param_name) const;

  static std::vector<std::string> default_no_weight_decay() { return {"bias", "ln*", "*norm*"}; }
};

// What kind of problem a block has, so that a caller reporting every problem at once (the
// config parser) can put the most fundamental first.
enum class ProblemKind {
  kUnsupported,  // a type zrt does not implement
  kUnknownKey,   // a key that is not valid here
  kBadValue,     // a value of the wrong type or out of range
  kMissing,      // a required key is absent
  kConflict,     // values that are fine alone but not together
  kWarning,      // not a problem: worth telling (a key that has no effect, an odd schedule)
};

struct ConfigProblem {
  ProblemKind kind;
  std::string message;  // "optimizer.params.eps must be > 0, got 0"
};

// Parses the "optimizer" block. A null or missing block gives the defaults (AdamW, lr 1e-3).
// Throws InvalidArgument for an unsupported type (listing Adam, AdamW and Lion), an unknown key
// (suggesting the closest valid one), a wrongly typed or out-of-range value; the message holds
// every problem, one per line.
OptimizerConfig parse_optimizer_config(const nlohmann::json& block);

// As above, but appends every problem to `problems` instead of throwing, going on with the
// default in place of each bad value. An unsupported type is reported alone: the parameters of
// an optimizer zrt does not have are not looked at.
OptimizerConfig parse_optimizer_config(const nlohmann::json& block,
                                       std::vector<ConfigProblem>& problems);

// "" if `type` names an optimizer zrt implements (any case, as DeepSpeed); otherwise the
// message saying why not, with the supported types.
std::string unsupported_optimizer_type(const std::string& type);

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

const char* lr_schedule_name(LrScheduleType t);  // "constant", "WarmupLR", ...

// DeepSpeed's lr_schedules parameters and defaults. kConstant (no "scheduler" block) keeps the
// optimizer's lr.
struct SchedulerConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // All warmup schedules. DeepSpeed uses max(2, warmup_num_steps).
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR (required there).
  std::int64_t total_num_steps = 0;
  // WarmupCosineLR: ratios of the optimizer's lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
};

// Parses the "scheduler" block; a null or missing block gives kConstant. Throws InvalidArgument
// for an unsupported type (listing the supported ones), an unknown key (suggesting the closest),
// a missing total_num_steps, or out-of-range values; the message holds every problem, one per
// line.
SchedulerConfig parse_scheduler_config(const nlohmann::json& block);

// As above, appending every problem to `problems` (an unsupported type alone, as for the
// optimizer).
SchedulerConfig parse_scheduler_config(const nlohmann::json& block,
                                       std::vector<ConfigProblem>& problems);

// "" if `type` names a schedule zrt implements; otherwise the message saying why not.
std::string unsupported_scheduler_type(const std::string& type);

namespace detail {
// The candidate closest to `word` by edit distance (case-insensitive; swapping two adjacent
// letters is one edit), or "" if none is close enough to be a plausible typo.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
}  // namespace detail

}  // namespace zrt
