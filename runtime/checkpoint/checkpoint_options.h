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
  // Wall-clock saves beside the step interval: when this many minutes have passed since the
  // last save (or the start) on rank 0's clock; 0: off.
  double save_interval_minutes = 0.0;
  // The time a preempted run (SIGTERM, SIGINT, SIGUSR1) has from the first signal to save and
  // exit; past it zrt-train exits at once with the previous checkpoint. 0: no limit of its own.
  double preempt_grace_s = 0.0;
  // A failed save: end the run (true, "stop") or log it and train on ("continue").
  bool stop_on_save_error = true;
  int keep_last = 0;  // 0: keep all
  bool async = false;
  // Tensor data written past the page cache (O_DIRECT) where the file system takes it.
  bool direct_io = true;
  // "auto": resume from <save_dir>/latest when it exists, else start fresh; "none": start
  // fresh; "latest": as auto (kept for configs written before auto); otherwise a tag.
  std::string load = "auto";
  // A fresh start may save into a save_dir that already holds checkpoints (they are removed
  // first); without it such a start is refused before anything is built.
  bool overwrite = false;
  TagValidation tag_validation = TagValidation::kWarn;  // DeepSpeed key, informational
  bool saves() const { return save_interval > 0 || save_interval_minutes > 0.0; }
  bool loads_latest() const { return load == "latest" || load == "auto"; }
  bool loads_nothing() const { return load == "none"; }
};

}  // namespace zrt
