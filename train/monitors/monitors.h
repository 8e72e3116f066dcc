// The training scalars for DeepSpeed's monitors (config blocks tensorboard and csv_monitor),
// on rank 0. Names and x axis follow DeepSpeed, so dashboards built for it read zrt's runs:
//   Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale (fp16 only), plus
//   zrt's Train/Samples/grad_norm every step and Eval/Samples/val_loss at each evaluation;
// the step of each is the number of samples trained so far (optimizer step x train_batch_size).
// wandb and comet are not implemented (no network); the config warns about them.
//
// Thread-safety: one thread (the training loop's) per object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace zrt::train {

class CsvMonitor;
class EventFileWriter;

struct ScalarEvent {
  std::string name;  // "Train/Samples/train_loss"
  double value = 0.0;
  std::int64_t step = 0;  // samples trained
};

class Monitors {
 public:
  // The monitors `config` enables; none on ranks other than 0. resumed_samples: the step of a
  // resumed run's checkpoint, in samples (history after it is dropped, see csv_monitor.h).
  Monitors(const Config& config, int rank, std::int64_t resumed_samples);
  ~Monitors();
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  bool enabled() const { return tensorboard_ != nullptr || csv_ != nullptr; }
  // Where each enabled monitor writes, for the start-up log ("tensorboard: <file>").
  std::vector<std::string> destinations() const;

  // Writes `events` (all of one step) to every enabled monitor and flushes them; `wall_time`
  // in unix seconds.
  void write(const std::vector<ScalarEvent>& events, double wall_time);

 private:
  std::unique_ptr<EventFileWriter> tensorboard_;
  std::unique_ptr<CsvMonitor> csv_;
};

}  // namespace zrt::train
