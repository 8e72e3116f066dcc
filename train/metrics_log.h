// metrics.jsonl: one JSON object per line, per logged step and per evaluation, each with its
// "step", "time" (unix seconds) and "elapsed_s" (seconds since this run started training). The
// file is the history of the whole training: a run appends to it, never truncates it, and a run
// resumed from a checkpoint at step S first drops the rows after S (written by a run that went
// past its last checkpoint), so the file holds one timeline. A fresh start (S = 0) therefore
// begins an empty history. Rank 0 only.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "train/history_file.h"

namespace zrt::train {

class MetricsLog {
 public:
  // Keeps the rows of steps <= resumed_step (an unparsable line, such as one cut short by a
  // killed run, goes too) and opens the file for appending, creating it if needed.
  MetricsLog(const std::string& path, std::int64_t resumed_step);

  // Writes `row` as one line and flushes it, so a killed run loses at most the line it writes.
  void append(const nlohmann::json& row);

  const HistoryTrim& trimmed() const { return trimmed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  HistoryTrim trimmed_;
  std::ofstream out_;
};

}  // namespace zrt::train
