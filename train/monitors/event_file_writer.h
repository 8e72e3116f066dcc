// A TensorBoard event file (tfrecord.h has the format): what TensorBoard, tensorboardX and
// tf.summary readers load as scalars. Each run opens a new file, and TensorBoard reads every
// file of a directory as one timeline; a run starts its file with a SessionLog START one step
// past where it resumed, so readers drop the later points of the run it replaces (TensorBoard's
// "purge orphaned data"), as metrics.jsonl loses its later rows.
//
// Thread-safety: one thread per writer.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "train/monitors/tfrecord.h"

namespace zrt::train {

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and dir/events.out.tfevents.<unix seconds>.<host name> (with
  // the process id added if that name exists), holding its file_version event. Throws zrt::Error
  // naming the path and the reason.
  explicit EventFileWriter(const std::string& dir);

  // Marks a (re)start: readers forget every point of an earlier file at or after `step`.
  void add_session_start(std::int64_t step, double wall_time);
  // Appends `scalars` at `step`, as one event; `wall_time` in unix seconds. One event per step
  // keeps its tags together for readers.
  void add_scalars(std::int64_t step, const std::vector<TaggedScalar>& scalars, double wall_time);
  // Makes what was added visible to readers.
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

// Unix time in seconds, with sub-second precision (an event's wall_time).
double unix_seconds();

}  // namespace zrt::train
