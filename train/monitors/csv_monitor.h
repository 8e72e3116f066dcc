// DeepSpeed's CSV monitor layout: one file per scalar in the job's directory, named after the
// scalar with '/' and ' ' turned into '_' ("Train/Samples/train_loss" ->
// Train_Samples_train_loss.csv), a "step,<last part of the name>" header ("step,train_loss")
// and one "step,value" row per event. Files are appended to across runs; a run resumed at
// step S first drops the rows after S (history_file.h), so each file holds one timeline.
//
// Thread-safety: one thread per monitor.
#pragma once

#include <cstdint>
#include <set>
#include <string>

namespace zrt::train {

class CsvMonitor {
 public:
  // `dir` is created on the first write. Rows with a step above `resumed_step` are dropped from
  // a file the first time this run writes to it.
  CsvMonitor(std::string dir, std::int64_t resumed_step);

  // Appends "step,value" to the scalar's file (with the header if the file is new or empty).
  // Throws zrt::Error naming the file and the reason.
  void write(const std::string& name, std::int64_t step, double value);

  // "Train/Samples/train_loss" -> "Train_Samples_train_loss.csv".
  static std::string file_name(const std::string& name);
  // "Train/Samples/train_loss" -> "step,train_loss".
  static std::string header(const std::string& name);

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::int64_t resumed_step_;
  std::set<std::string> prepared_;  // file names this run has trimmed (or created)
};

}  // namespace zrt::train
