// What checkpoint.load means for the save_dir as it is on disk, decided once at start-up (before
// the model is built), so a run never overwrites the checkpoints of another one silently:
//   "auto" / "latest"  resume from the checkpoint <save_dir>/latest names; start fresh if none;
//   "none"             start fresh;
//   a tag              resume from <save_dir>/<tag>.
// A fresh start that will save (save_interval > 0) into a save_dir already holding checkpoints
// is refused (InvalidArgument naming the directory and the fixes) unless checkpoint.overwrite
// is true; then remove_checkpoints() clears the directory first.
//
// Thread-safety: plain functions of the file system's state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint_options.h"

namespace zrt::checkpoint {

struct LoadPlan {
  std::optional<std::string> dir;  // the checkpoint to resume from; none: start fresh
  std::string note;                // what was decided and why, for rank 0's log
  bool clear_save_dir = false;     // a fresh start with overwrite over existing checkpoints
};

// Decides as described above. Throws InvalidArgument if a named tag (or the tag in `latest`) is
// not a complete checkpoint, or if a fresh start would save over existing checkpoints.
LoadPlan plan_load(const CheckpointConfig& config);

// "global_step12" -> 12; -1 if the name is not a step tag (Checkpointer::tag_for_step's form).
std::int64_t step_of_tag(const std::string& name);

// The complete checkpoints in `save_dir` (step-tag directories, oldest first); empty if the
// directory does not exist.
std::vector<std::string> list_checkpoints(const std::string& save_dir);

// Removes every checkpoint of `save_dir`: the step-tag directories, abandoned *.tmp ones and
// `latest`. Other files are left alone. Returns the tags removed.
std::vector<std::string> remove_checkpoints(const std::string& save_dir);

}  // namespace zrt::checkpoint
