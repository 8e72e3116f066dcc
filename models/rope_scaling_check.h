// A run's model.rope_scaling keys against a Hugging Face config.json's, for the architectures'
// resolve hooks (kept apart from rope_scaling.h, which the configs include, because it needs the
// run config's ModelConfig).
#pragma once

#include <string>

#include "config/config.h"
#include "models/rope_scaling.h"

namespace zrt {

// Each key the run gives (`run`) must equal the file's (`file`, read from `path`), else
// InvalidArgument naming both. `preset` (may be null): the run's preset's values, which must
// agree too, named `preset_name`.
void check_run_rope_scaling(const RopeScaling& file, const ModelConfig::RopeScaling& run,
                            const RopeScaling* preset, const std::string& preset_name,
                            const std::string& path);

}  // namespace zrt
