#include "train/monitors/monitors.h"

#include "runtime/common/error.h"
#include "train/monitors/csv_monitor.h"
#include "train/monitors/event_file_writer.h"

namespace zrt::train {

Monitors::Monitors(const Config& config, int rank, std::int64_t resumed_samples) {
  if (rank != 0) return;
  if (config.tensorboard.enabled) {
    tensorboard_ = std::make_unique<EventFileWriter>(config.tensorboard.log_dir());
    // Earlier files' points after the resumed step belong to a run this one replaces.
    tensorboard_->add_session_start(resumed_samples + 1, unix_seconds());
  }
  if (config.csv_monitor.enabled) {
    csv_ = std::make_unique<CsvMonitor>(config.csv_monitor.log_dir(), resumed_samples);
  }
}

Monitors::~Monitors() = default;

std::vector<std::string> Monitors::destinations() const {
  std::vector<std::string> out;
  if (tensorboard_) out.push_back("tensorboard: " + tensorboard_->path());
  if (csv_) out.push_back("csv_monitor: " + csv_->dir() + "/*.csv");
  return out;
}

void Monitors::write(const std::vector<ScalarEvent>& events, double wall_time) {
  if (events.empty()) return;
  if (tensorboard_) {
    std::vector<TaggedScalar> scalars;
    for (const ScalarEvent& e : events) {
      ZRT_CHECK(e.step == events.front().step, "{} at step {}, not {}", e.name, e.step,
                events.front().step);
      scalars.push_back({e.name, static_cast<float>(e.value)});
    }
    tensorboard_->add_scalars(events.front().step, scalars, wall_time);
    tensorboard_->flush();
  }
  if (csv_) {
    for (const ScalarEvent& e : events) csv_->write(e.name, e.step, e.value);
  }
}

}  // namespace zrt::train
