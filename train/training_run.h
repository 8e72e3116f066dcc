// TrainingRun: one rank's run of the training loop, the object behind run_training() (and the
// public zrt::Trainer). build() constructs everything a run needs from the validated Config,
// in order: the checkpoint load plan, the device, the streams and process groups, the model
// (the caller's ModelFactory), the ZeRO engine, the data streams, the checkpoint policy, the
// trace and the logs. train_step() is one optimizer step: the micro-batch loop, the engine's
// step and the step boundary's loss reduction (which carries the ranks' stop and wall-clock
// save votes). run() is the loop: logging, evaluation, the trace, checkpoints, stop requests,
// and the closing sample.
//
// Every method is collective over MPI_COMM_WORLD: every rank calls them in the same order. One
// object per rank, used once (build, then run); not thread-safe. Destroying it drains the
// device's streams before the buffers they use are freed, also after an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "optimizers/lr_schedule.h"
#include "runtime/checkpoint/load_plan.h"
#include "runtime/checkpoint/save_dir_lock.h"
#include "runtime/comm/parallel_layout.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/common/watchdog.h"
#include "runtime/data/data_stream.h"
#include "runtime/data/sample_source.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_recorder.h"
#include "train/batch_feeder.h"
#include "train/checkpoint_policy.h"
#include "train/control.h"
#include "train/device_peaks.h"
#include "train/evaluation.h"
#include "train/metrics_log.h"
#include "train/monitors/monitors.h"
#include "train/trainer.h"

namespace zrt::train {

// Losses the host has not read yet: one float per step on the device, read in one copy when
// the loop needs them. The two slots past the losses carry the step boundary's votes on the same
// all-reduce (Control::kMaxValues).
constexpr int kMaxUnreadLosses = 62;

// What the loop knew of a step when it ended, for the monitors' rows once its loss is read.
struct UnreadStep {
  std::int64_t step = 0;
  double wall_time = 0.0;
  double lr = 0.0;
  StepResult result;  // undecided until the engine's settle_step() (ZeroEngine::enqueue_step)
  std::int64_t loss_tokens = 0;  // the global batch's
};

// What train_step() did, for the loop (every field rank-identical).
struct StepOutcome {
  // False: the global batch held no loss token, and the step was skipped on every rank before
  // any collective of the engine (the schedule did not advance); lr and wall_time are unset,
  // result is the last trained step's (decided), log_now is false (its row is written
  // already), stop and timed_save are the boundary's votes as at any step.
  bool trained = false;
  double lr = 0.0;
  double wall_time = 0.0;        // when the update was enqueued (unix seconds)
  StepResult result;             // decided when the step is logged, the last or a stop
  std::int64_t loss_tokens = 0;  // the global batch's
  bool log_now = false;          // the step gets its log line and metrics row
  bool stop = false;             // a stop was requested on some rank: save and stop here
  bool timed_save = false;       // checkpoint.save_interval_minutes ran out (rank 0's clock)
};

class TrainingRun {
 public:
  // `make_factory` is called where the model is built (after the device and the process
  // groups), so a bad model block fails there. `config`, `hooks` and the factory's result must
  // outlive the run.
  TrainingRun(const Config& config, const RankInfo& ranks,
              std::function<ModelFactory()> make_factory, const TrainHooks& hooks);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // Builds everything, resumes from a checkpoint as checkpoint.load says, opens the logs.
  void build();
  // Trains step `step` (the steps run in order, from the resumed step + 1).
  StepOutcome train_step(std::int64_t step);
  // The loop up to train.steps or a stop request, then the sample. Call once, after build().
  RunSummary run();

 private:
  using Clock = std::chrono::steady_clock;

  // build(), in order.
  void build_device();
  void build_groups();
  void build_model();
  void build_engine();
  void build_data();
  void check_same_data_everywhere(const char* key, const SampleSource& data);
  void build_checkpoints();
  void build_step_buffers();
  void build_trace();
  void log_setup();
  void open_logs();
  // Runs one part of build() and keeps its wall time for the start-up line (log_setup).
  template <typename Part>
  void timed(const char* name, Part&& part);

  // The engine's traffic, over every group it uses.
  CommCounts engine_comm() const;

  // train_step(), in order.
  std::int64_t read_micro_batches();  // the global batch's loss tokens
  void log_empty_step(std::int64_t step);
  void run_micro_batches(std::int64_t step, float divisor, DevicePtr<std::byte> loss_slot);
  void settle_previous_step(DevicePtr<std::byte> loss_slot);
  void settle(StepResult& result);
  void agree_at_boundary(std::int64_t step, bool periodic, bool buffer_full, StepOutcome& out);

  // The losses of the steps not read yet.
  std::vector<float> local_unread_losses();
  void deliver_losses(const std::vector<float>& agreed);

  // run()'s logs and per-step work.
  nlohmann::json routing_metrics();
  void log_step(std::int64_t step, double lr, double wall_time, const StepResult& result,
                std::int64_t loss_tokens);
  void show_progress(std::int64_t step);
  void evaluate_and_log(std::int64_t step);
  void end_traced_step(std::int64_t step, double step_start_us, const CommCounts& at_start);
  void sample();

  // Destroyed first (declared last of the device-facing members): if anything throws, the
  // streams finish (or fail) what they were given before the buffers are released under them.
  struct DrainStreams {
    DrainStreams(ZeroEngine& e, Device& d) : engine(e), device(d) {}
    ~DrainStreams();
    DrainStreams(const DrainStreams&) = delete;
    DrainStreams& operator=(const DrainStreams&) = delete;
    ZeroEngine& engine;  // its CPU-optimizer thread is not a device stream
    Device& device;
  };

  const Config& config_;
  const RankInfo ranks_;
  const int rank_;
  const int world_;
  const std::function<ModelFactory()> make_factory_;
  const TrainHooks& hooks_;
  RunSummary summary_;

  // build()'s parts and their wall times in seconds, in order (the start-up line).
  std::vector<std::pair<const char*, double>> startup_seconds_;
  checkpoint::LoadPlan load_plan_;
  checkpoint::SaveDirLock save_dir_lock_;  // rank 0 of a job that saves: one job per save_dir
  CpuIsa cpu_isa_{};
  int gpu_count_ = 0;
  std::unique_ptr<Device> device_;

  // The streams and the process groups (build_groups).
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
  std::unique_ptr<Stream> control_stream_;
  std::unique_ptr<Stream> sequence_stream_;  // the sp group's all-to-alls (sp > 1)
  CommOptions comm_options_;
  Watchdog* watchdog_ = nullptr;
  EngineOptions engine_options_;
  std::optional<ParallelLayout> layout_;
  std::optional<Control> control_;

  // The model and the engine.
  std::optional<kernels::KernelContext> ctx_;
  ModelFactory model_source_;
  std::unique_ptr<Model> model_owner_;
  Model* model_ = nullptr;
  std::unique_ptr<DeviceOptimizer> optimizer_;
  std::optional<ZeroEngine> engine_;
  std::optional<LrSchedule> schedule_;

  // The data.
  int B_ = 0;  // micro-batch size
  int T_ = 0;  // sequence length
  int G_ = 0;  // micro-batches per step
  std::unique_ptr<SampleSource> train_data_;
  std::optional<DataStream> train_stream_;
  std::unique_ptr<SampleSource> val_data_;
  bool masked_ = false;  // loss masks or packed documents: the loss is weighted by loss tokens
  DataShare share_;      // which rows this rank reads and which chunk of them it trains on
  std::optional<BatchFeeder> feeder_;

  std::optional<CheckpointPolicy> checkpoints_;
  std::int64_t start_step_ = 0;
  std::optional<Evaluator> evaluator_;
  // Losses the host has not read yet: one float per step on the device (the step's micro-batch
  // losses summed there), read in one copy when the loop needs them.
  Buffer step_losses_;
  // A model with an auxiliary loss term (Model::aux_loss): its sum over the forwards since the
  // last metrics row, on the device, and their count.
  Buffer aux_loss_sum_;
  int aux_forwards_ = 0;
  // Declared before drain_, so it outlives the stream work that records into it.
  std::unique_ptr<TraceRecorder> trace_;
  std::int64_t last_traced_ = 0;
  std::optional<DrainStreams> drain_;

  // The logs.
  std::int64_t tokens_per_step_ = 0;
  double flops_per_token_ = 0.0;
  DevicePeak peak_;
  std::optional<MetricsLog> metrics_;  // rank 0
  std::int64_t samples_per_step_ = 0;  // the monitors' x axis is samples trained
  std::optional<Monitors> monitors_;
  bool tty_ = false;
  bool fused_paths_logged_ = false;  // the CUDA fused paths' line, after the first trained step

  // The loop's state.
  std::vector<UnreadStep> unread_;  // steps whose loss is still on the device, in order
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();  // the latest step's read
  CommCounts comm_before_;
  CommCounts sequence_comm_before_;  // the sp group's all-to-alls
  CommCounts expert_comm_before_;    // the expert-parallel group's (its all-to-alls)
  Clock::time_point run_start_;      // elapsed_s and the ETA count from here
  Clock::time_point interval_start_;
  std::int64_t interval_steps_ = 0;
  // The engine takes a step's decision on the device where it can (ZeroEngine::enqueue_step),
  // and the loop reads it only when it needs it: on a step it logs or reads the losses of (it
  // waits for the stream then anyway), else at the next step, after that step's micro-batches
  // are enqueued, when on a GPU the decision is long done. A skipped step learnt of then gets
  // its row then, one step late (its loss read with it). The step left undecided, 0 for none
  // (steps with no loss token may follow it before it is read).
  std::int64_t undecided_step_ = 0;
  std::vector<HostBatch> step_rows_;  // reused step after step
};

}  // namespace zrt::train
