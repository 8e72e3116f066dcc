// The "checkpoint" block of a run's config as the checkpoint library takes it (the config
// library, above the runtime, parses the JSON into this struct; docs/config.md).
#pragma once

#include <cstdint>
#include <string>

namespace zrt {

enum class TagValidation { kIgnore, kWarn, kFail };

struct CheckpointConfig {
  std::string save_dir;            // default: <output_dir>/checkpoints
  std::int64_t save_interval = 0;  // 0: never save; N: every N steps and after the last
  int keep_last = 0;               // 0: keep all
  bool async = false;
  // "auto": resume from <save_dir>/latest when it exists, else start fresh; "none": start
  // fresh; "latest": as auto (kept for configs written before auto); otherwise a tag.
  std::string load = "auto";
  // A fresh start may save into a save_dir that already holds checkpoints (they are removed
  // first); without it such a start is refused before anything is built.
  bool overwrite = false;
  TagValidation tag_validation = TagValidation::kWarn;  // DeepSpeed key, informational
  bool saves() const { return save_interval > 0; }
  bool loads_latest() const { return load == "latest" || load == "auto"; }
  bool loads_nothing() const { return load == "none"; }
};

}  // namespace zrt
