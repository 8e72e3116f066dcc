// model.frozen / model.trainable: which parameters a run trains. The patterns
// (runtime/common/name_pattern.h) are matched against the model's parameter names (Hugging
// Face's; an expert's slice under expert parallelism by its fused tensor's name,
// ParamSpec::pattern_name, so a config means the same at every autoep_size) and mark
// ParamSpec::frozen, which the engine honours (runtime/model_interface.h).
// A pattern that matches no parameter on any rank is an error, not a silent "train
// everything": so is freezing every parameter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "runtime/model_interface.h"

namespace zrt::train {

// What the patterns did to one rank's parameters.
struct FrozenMarks {
  // Per pattern (model.frozen's or model.trainable's, in order): the parameters it matched.
  std::vector<std::int64_t> matches;
  std::int64_t frozen_params = 0, frozen_elements = 0;
  std::int64_t total_params = 0, total_elements = 0;
};

// Sets ParamSpec::frozen on `params` from the model block's patterns (all false without them).
FrozenMarks mark_frozen_parameters(const ModelConfig& model, std::vector<ParamSpec>& params);

// Throws InvalidArgument listing every problem at once: a pattern matching nothing over the
// ranks (`matches_anywhere`: the per-pattern counts summed over them) and a model left with
// nothing to train (`trained_anywhere`: trainable parameters summed over them). `params` (a
// rank's) gives the names the message shows.
void check_frozen_patterns(const ModelConfig& model,
                           const std::vector<std::int64_t>& matches_anywhere,
                           std::int64_t trained_anywhere, const std::vector<ParamSpec>& params,
                           const std::string& model_description);

// "frozen by model.frozen: 2 of 14 parameters, 1.1M of 4.2M elements (25.0%)", "" when none
// is.
std::string describe_frozen(const ModelConfig& model, const FrozenMarks& marks);

// "backward ends at module 17 of 34 (model.layers.16.self_attn.q_proj.weight is the lowest
// trained parameter): the 17 modules below hold frozen parameters only and run no backward";
// "" when the backward reaches module 0.
std::string describe_backward_stop(const std::vector<ParamSpec>& params, int first_backward_module,
                                   int num_modules);

}  // namespace zrt::train
