// TrainingRun's loop: train_step() (one optimizer step) and run() (the steps, their logs,
// evaluations, trace, checkpoints and stop requests, then the sample).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/common/error.h"
#include "runtime/common/fault.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/trace/trace_summary.h"
#include "train/monitors/event_file_writer.h"
#include "train/run_clock.h"
#include "train/sampling.h"
#include "train/training_run.h"

namespace zrt::train {

namespace {

std::string progress_bar(std::int64_t done, std::int64_t total, int width = 30) {
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  return "[" + std::string(static_cast<std::size_t>(filled), '=') +
         std::string(static_cast<std::size_t>(width - filled), ' ') + "]";
}

}  // namespace

// ---- one step ---------------------------------------------------------------------------------

StepOutcome TrainingRun::train_step(std::int64_t step) {
  ZeroEngine& engine = *engine_;
  watchdog_->set_step(step);
  // This step's loss slot: the micro-batch losses are summed into it on the compute stream.
  const std::size_t slot = unread_.size();
  const DevicePtr<std::byte> loss_slot = step_losses_.device<std::byte>() + 4 * slot;
  device_->fill_zero(loss_slot, 4, *compute_);
  StepOutcome out;
  // The step's micro-batches are read first: their loss tokens, summed over the ranks, weigh
  // every micro-batch's loss (loss_divisor).
  out.loss_tokens = read_micro_batches();
  if (out.loss_tokens == 0) {
    // Every rank sees the same count: the step is skipped on all of them alike, before any
    // collective of the engine, and the schedule does not advance. It is still a step of the
    // loop: the step before it is settled, and the boundary's reads and votes happen as after
    // a trained one, so that what is due at this step (the last losses, a save, an evaluation,
    // a stop) is not lost.
    log_empty_step(step);
    settle_previous_step(DevicePtr<std::byte>{});
    const EngineCounters counters = engine.counters();  // settled just above
    out.result.optimizer_steps = counters.optimizer_steps;
    out.result.skipped_steps = counters.skipped_steps;
    out.result.loss_scale = counters.loss_scale.scale;
    agree_at_boundary(step, /*periodic=*/false, /*buffer_full=*/false, out);
    return out;
  }
  out.trained = true;
  run_micro_batches(step, loss_divisor(masked_, out.loss_tokens, G_, world_), loss_slot);
  settle_previous_step(loss_slot);
  out.lr = schedule_->lr_for_step(engine.optimizer_steps() + 1);
  out.result = engine.enqueue_step(out.lr);
  ++interval_steps_;
  out.wall_time = unix_seconds();
  unread_.push_back({step, out.wall_time, out.lr, out.result, out.loss_tokens});
  const bool periodic =
      config_.train.log_interval > 0 &&
      (step % config_.train.log_interval == 0 || step == config_.train.steps || step == 1);
  const bool buffer_full = unread_.size() == static_cast<std::size_t>(kMaxUnreadLosses);
  if (periodic || step == config_.train.steps || buffer_full) settle(out.result);
  if (hooks_.after_step) hooks_.after_step(step, engine, out.result);
  agree_at_boundary(step, periodic, buffer_full, out);
  undecided_step_ = out.result.decided ? 0 : step;
  return out;
}

std::int64_t TrainingRun::read_micro_batches() {
  std::int64_t local_tokens = 0;
  // The rows of this rank's data-parallel rank (every rank of an sp group reads the same), and
  // the loss tokens of its chunk of them: summed over the world, each token counts once.
  for (HostBatch& r : step_rows_) {
    train_stream_->next_micro_batch(share_.dp_rank, share_.dp_size, B_, r);
    local_tokens += chunk_loss_tokens(r, share_);
  }
  return masked_ ? control_->sum(local_tokens) : std::int64_t{G_} * share_.dp_size * B_ * T_;
}

void TrainingRun::log_empty_step(std::int64_t step) {
  if (rank_ == 0) spdlog::warn("step {}: no loss token in the global batch; skipped", step);
  if (rank_ == 0 && metrics_) {
    nlohmann::json row;
    row["step"] = step;
    row["time"] = unix_seconds();
    row["loss_tokens"] = 0;
    row["skipped"] = true;
    row["skipped_reason"] = "no loss token";
    metrics_->append(row);
  }
}

void TrainingRun::run_micro_batches(std::int64_t step, float divisor,
                                    DevicePtr<std::byte> loss_slot) {
  for (int g = 0; g < G_; ++g) {
    TokenBatch batch = feeder_->next(step_rows_[static_cast<std::size_t>(g)], divisor);
    float scale = static_cast<float>(engine_->loss_scale());
    // Test hook (runtime/common/fault.h): "nan" poisons this rank's gradients through the
    // loss gradient's scale; signals freeze or kill the rank here, mid-step.
    if (g == G_ - 1 && fault_point("train.step", step) == FaultAction::kNan) {
      scale = std::numeric_limits<float>::quiet_NaN();
    }
    model_->forward_backward(*engine_, batch, scale);
    engine_kernels::accumulate(*device_, *compute_, model_->loss().as<const std::byte>(),
                               DType::kFloat32, loss_slot, DType::kFloat32, 1);
    if (!aux_loss_sum_.empty()) {
      engine_kernels::accumulate(*device_, *compute_, model_->aux_loss().as<const std::byte>(),
                                 DType::kFloat32, aux_loss_sum_.device<std::byte>(),
                                 DType::kFloat32, 1);
      ++aux_forwards_;
    }
  }
}

// The decision of the last trained step, if it was left on the device: read now that this
// step's micro-batches are enqueued. loss_slot holds this step's loss (null for a step with no
// loss token, which has none).
void TrainingRun::settle_previous_step(DevicePtr<std::byte> loss_slot) {
  if (undecided_step_ == 0) return;
  const std::int64_t previous_step = undecided_step_;
  undecided_step_ = 0;
  const StepResult previous = engine_->settle_step();
  // Still unread: a step whose losses were read was decided then. (Steps with no loss token
  // may lie between: they have no entry.)
  ZRT_CHECK(!unread_.empty() && unread_.back().step == previous_step,
            "step {}'s decision settled without its unread entry", previous_step);
  unread_.back().result = previous;
  if (previous.skipped && config_.train.log_interval > 0) {
    // A skipped step always gets its row: the losses so far are read now, and this step's
    // moves to the first slot, where the next read looks for it.
    const UnreadStep skipped = unread_.back();
    deliver_losses(control_->mean(local_unread_losses()));
    if (loss_slot) device_->copy(step_losses_.device<std::byte>(), loss_slot, 4, *compute_);
    log_step(skipped.step, skipped.lr, skipped.wall_time, previous, skipped.loss_tokens);
  }
}

// The current step's decision, read from the device (a host wait) unless already known.
void TrainingRun::settle(StepResult& result) {
  if (result.decided) return;
  result = engine_->settle_step();
  unread_.back().result = result;
}

// The losses are read only when the loop needs them: a logged step, a full buffer, the last
// step. A quiet step waits for the device nowhere: the step's decision stays on the device
// (read at the next step) and the host goes on enqueueing the next step while the optimizer
// runs. The read losses ride on the step boundary's all-reduce with its decisions (an average of
// 0/1 votes is non-zero when any rank voted): stop (a preemption signal reached some rank since
// the last boundary) and a wall-clock save (CheckpointPolicy::time_vote). Every input of the
// read decision is rank-identical.
void TrainingRun::agree_at_boundary(std::int64_t step, bool periodic, bool buffer_full,
                                    StepOutcome& out) {
  // A skipped step (the same decision on every rank) always gets its metrics row.
  out.log_now = periodic || (config_.train.log_interval > 0 && out.result.skipped);
  const bool read_losses = out.log_now || step == config_.train.steps || buffer_full;
  const bool stop_vote = hooks_.stop_requested && hooks_.stop_requested();
  const bool time_vote = checkpoints_->time_vote();
  std::vector<float> votes = read_losses ? local_unread_losses() : std::vector<float>{};
  const std::size_t n_losses = votes.size();
  votes.push_back(stop_vote ? 1.f : 0.f);
  votes.push_back(time_vote ? 1.f : 0.f);
  const std::vector<float> agreed = control_->mean(votes);
  out.stop = agreed[n_losses] > 0.f;
  out.timed_save = agreed[n_losses + 1] > 0.f;
  if (out.stop) settle(out.result);  // the summary's last rows
  if (read_losses) {
    deliver_losses({agreed.begin(), agreed.begin() + static_cast<std::ptrdiff_t>(n_losses)});
  } else if (out.stop) {
    deliver_losses(
        control_->mean(local_unread_losses()));  // the last steps' losses, for the summary
  }
  if (out.stop) {
    if (hooks_.on_stop) hooks_.on_stop(step);
    if (rank_ == 0) {
      spdlog::warn(
          "step {}: stop requested (a preemption signal reached {} rank(s)); saving a "
          "checkpoint of step {} and stopping",
          step, static_cast<int>(std::lround(agreed[n_losses] * world_)), step);
    }
  }
}

// This rank's losses of the unread steps (each the mean of its micro-batches), in one copy.
std::vector<float> TrainingRun::local_unread_losses() {
  std::vector<float> local =
      read_floats(*device_, *compute_, step_losses_.device<float>(), unread_.size());
  for (float& v : local) v = v / G_;
  return local;
}

// The unread steps' losses averaged over the ranks: the summary, the monitors' rows.
void TrainingRun::deliver_losses(const std::vector<float>& agreed) {
  ZRT_CHECK(agreed.size() == unread_.size(), "{} losses read for {} unread steps", agreed.size(),
            unread_.size());
  for (std::size_t i = 0; i < unread_.size(); ++i) {
    const UnreadStep& u = unread_[i];
    const double loss = agreed[i];
    summary_.losses.push_back(loss);
    if (monitors_->enabled()) {
      std::vector<ScalarEvent> events = {
          {"Train/Samples/train_loss", loss, u.step * samples_per_step_},
          {"Train/Samples/lr", u.lr, u.step * samples_per_step_},
          {"Train/Samples/grad_norm", u.result.grad_norm, u.step * samples_per_step_}};
      if (config_.fp16()) {
        events.push_back(
            {"Train/Samples/loss_scale", u.result.loss_scale, u.step * samples_per_step_});
      }
      monitors_->write(events, u.wall_time);
    }
    last_loss_ = loss;
  }
  unread_.clear();
}

// ---- the loop ---------------------------------------------------------------------------------

RunSummary TrainingRun::run() {
  ZRT_CHECK(drain_.has_value(), "TrainingRun::run() before build()");
  comm_before_ = engine_comm();
  sequence_comm_before_ = layout_->sequence_traffic();
  if (const ProcessGroup* experts = layout_->expert_parallel_group()) {
    expert_comm_before_ = experts->stats().snapshot();
  }
  run_start_ = Clock::now();
  interval_start_ = run_start_;
  interval_steps_ = 0;
  summary_.steps = start_step_;
  if (rank_ == 0 && start_step_ >= config_.train.steps) {
    spdlog::info("the checkpoint is at step {} and train.steps is {}: nothing left to train",
                 start_step_, config_.train.steps);
  }
  undecided_step_ = 0;
  step_rows_.assign(static_cast<std::size_t>(G_), HostBatch{});
  for (std::int64_t step = start_step_ + 1; step <= config_.train.steps; ++step) {
    const bool traced = trace_ && step >= config_.trace.first_step && step <= last_traced_;
    const double step_start_us = traced ? trace_->now_us() : 0.0;
    const CommCounts comm_at_step_start = traced ? engine_comm() : CommCounts{};
    if (traced) engine_->set_trace(trace_.get());
    const StepOutcome out = train_step(step);
    if (out.trained && !fused_paths_logged_ && rank_ == 0) {
      // Which fused paths the first step took (all of a step's GEMMs and attention calls have
      // been enqueued by now): a declined epilogue or attention shape says where time goes.
      fused_paths_logged_ = true;
      if (const std::string paths = kernels::describe_cuda_fused_paths(*ctx_); !paths.empty()) {
        spdlog::info("CUDA after step {}: {}", step, paths);
      }
    }
    // A step with no loss token has its row already (log_empty_step); the rest below is due
    // at it as at any step.
    if (out.trained && out.log_now) {
      log_step(step, out.lr, out.wall_time, out.result, out.loss_tokens);
    } else if (tty_) {
      show_progress(step);
    }
    if (val_data_ && config_.train.eval_interval > 0 && !out.stop &&
        (step % config_.train.eval_interval == 0 || step == config_.train.steps)) {
      evaluate_and_log(step);
    }
    summary_.steps = step;
    summary_.skipped = out.result.skipped_steps;  // the last step is decided (logged or stopped)
    if (traced) end_traced_step(step, step_start_us, comm_at_step_start);
    if (out.stop) {
      summary_.status = checkpoints_->save_for_stop(step);
      break;
    }
    if (checkpoints_->due(step, out.timed_save)) checkpoints_->save(step, /*wait=*/false);
  }
  // An async save finishes (or reports its error) before the run ends.
  checkpoints_->wait();
  summary_.saves_failed = checkpoints_->saves_failed();
  if (summary_.status == RunStatus::kCompleted && checkpoints_->ended_unsaved(summary_.steps)) {
    // "continue" kept training through failed saves, but the run's result would now be lost
    // silently: say so, and end in an error so scripts notice.
    summary_.status = RunStatus::kCompletedUnsaved;
    if (rank_ == 0) {
      const auto latest = checkpoint::read_latest(config_.checkpoint.save_dir);
      spdlog::error(
          "training reached step {}, but no checkpoint holds it: {} save(s) failed under "
          "checkpoint.on_save_error \"continue\", and latest is {}; fix the storage and run "
          "again to resume from there",
          summary_.steps, summary_.saves_failed, latest ? *latest : std::string("(none)"));
    }
  }
  sample();
  compute_->synchronize();
  return summary_;
}

// The step line and the metrics row of a decided step whose loss has been delivered (the
// latest read, last_loss_). Collective (the peaks are the ranks' maximum): every rank calls it
// for the same steps, since every input of that choice is rank-identical.
void TrainingRun::log_step(std::int64_t step, double lr, double wall_time, const StepResult& result,
                           std::int64_t loss_tokens) {
  const double loss = last_loss_;
  const double elapsed_s = std::chrono::duration<double>(Clock::now() - run_start_).count();
  const double seconds = std::chrono::duration<double>(Clock::now() - interval_start_).count();
  const double tokens_per_s = tokens_per_step_ * interval_steps_ / std::max(seconds, 1e-9);
  const double mfu =
      peak_.flops_per_s > 0.0 ? tokens_per_s / world_ * flops_per_token_ / peak_.flops_per_s : 0.0;
  const MemoryUsage usage = device_->tracker().usage(MemorySpace::kDevice);
  const CommCounts sequence_now = layout_->sequence_traffic();
  const CommCounts sequence_step = sequence_now - sequence_comm_before_;
  sequence_comm_before_ = sequence_now;
  // The ranks' maxima in one all-reduce: the memory peaks by category, the total, and with
  // sequence parallelism what a rank's all-to-alls sent across nodes (0 on every rank while the
  // sp groups sit within nodes, as the layout places them).
  std::vector<std::int64_t> peaks(usage.peak.begin(), usage.peak.end());
  peaks.push_back(usage.total_peak);
  if (share_.chunked()) peaks.push_back(sequence_step.total_inter_bytes());
  peaks = control_->max(peaks);
  const std::int64_t sequence_inter_node_max = share_.chunked() ? peaks.back() : 0;
  if (share_.chunked()) peaks.pop_back();
  const CommCounts comm_now = engine_comm();
  const std::int64_t comm_bytes = (comm_now - comm_before_).total_bytes();
  const std::int64_t comm_inter_node_bytes = (comm_now - comm_before_).total_inter_bytes();
  const std::int64_t comm_intra_node_bytes = (comm_now - comm_before_).total_intra_bytes();
  comm_before_ = comm_now;
  const nlohmann::json routing = routing_metrics();
  if (rank_ == 0) {
    if (tty_) std::fprintf(stderr, "\r%80s\r", "");
    spdlog::info(
        "step {:>6}/{} | loss {:.4f} | lr {:.3e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
        "mem {} | comm {}{} | elapsed {} | ETA {}{}",
        step, config_.train.steps, loss, lr, result.grad_norm, tokens_per_s, 100.0 * mfu,
        format_bytes(peaks.back()), format_bytes(comm_bytes),
        // Several nodes: what this rank sent to the others (comm_inter_node_bytes).
        comm_inter_node_bytes > 0
            ? fmt::format(" ({} across nodes)", format_bytes(comm_inter_node_bytes))
            : std::string(),
        format_duration(elapsed_s),
        format_duration(eta_seconds(elapsed_s, step - start_step_, config_.train.steps - step)),
        result.skipped ? fmt::format(" | SKIPPED (loss scale {})", result.loss_scale) : "");
    nlohmann::json row;
    row["step"] = step;
    row["time"] = wall_time;
    row["elapsed_s"] = elapsed_s;
    row["loss"] = loss;
    row["loss_tokens"] = loss_tokens;  // the global batch's (every token without masks)
    row["lr"] = lr;
    row["grad_norm"] = result.grad_norm;
    row["tokens_per_s"] = tokens_per_s;
    row["mfu"] = mfu;
    nlohmann::json mem;
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      mem[mem_category_name(static_cast<MemCategory>(c))] = peaks[c];
    }
    mem["total"] = peaks.back();
    row["mem_peak_bytes"] = mem;
    row["comm_bytes"] = comm_bytes;
    row["comm_intra_node_bytes"] = comm_intra_node_bytes;
    row["comm_inter_node_bytes"] = comm_inter_node_bytes;
    // Sequence parallelism's all-to-alls, their payload and what this rank sent
    // (docs/multi-node.md has the formula); not in comm_bytes, the engine's.
    if (share_.chunked()) {
      row["comm_sequence_parallel_bytes"] = sequence_step.total_bytes();
      row["comm_sequence_parallel_sent_bytes"] =
          sequence_step.total_intra_bytes() + sequence_step.total_inter_bytes();
      row["comm_sequence_parallel_inter_node_bytes"] = sequence_inter_node_max;
    }
    // Expert parallelism's token all-to-alls (counts and rows) since the previous row, this
    // rank's: their payload and what it sent to the other ranks of its group (docs/multi-node.md
    // has the formula). Part of comm_bytes (the group is the engine's too, for the experts' norm).
    if (const ProcessGroup* experts = layout_->expert_parallel_group()) {
      const CommCounts now = experts->stats().snapshot();
      const CommCounts step_counts = now - expert_comm_before_;
      expert_comm_before_ = now;
      const auto a2a = static_cast<std::size_t>(CollectiveOp::kAllToAll);
      row["comm_expert_parallel_bytes"] = step_counts.bytes[a2a];
      row["comm_expert_parallel_sent_bytes"] =
          step_counts.intra_bytes[a2a] + step_counts.inter_bytes[a2a];
    }
    row["loss_scale"] = result.loss_scale;
    row["skipped"] = result.skipped;
    row["skipped_total"] = result.skipped_steps;
    row.update(routing);
    metrics_->append(row);
  }
  interval_start_ = Clock::now();
  interval_steps_ = 0;
}

// A mixture of experts' routing since the previous row, over every rank (collective: every rank
// calls it at the same rows): the load-balancing term's mean over the forwards (before its
// coefficient), and the fewest and most (token, slot) pairs an expert of a layer received, summed
// over the ranks' forwards, with the pairs a capacity factor dropped. Empty for a dense model.
nlohmann::json TrainingRun::routing_metrics() {
  nlohmann::json out = nlohmann::json::object();
  if (!aux_loss_sum_.empty()) {
    const float sum = read_floats(*device_, *compute_, aux_loss_sum_.device<float>(), 1)[0];
    const double local = aux_forwards_ > 0 ? sum / aux_forwards_ : 0.0;
    out["router_aux_loss"] = control_->mean(local);
    device_->fill_zero(aux_loss_sum_.device<std::byte>(), 4, *compute_);
    aux_forwards_ = 0;
  }
  if (std::optional<ExpertLoad> load = model_->take_expert_load()) {
    std::vector<std::int64_t> counts = load->tokens;
    counts.push_back(load->dropped);
    counts = control_->sum(counts);
    const std::int64_t dropped = counts.back();
    counts.pop_back();
    if (!counts.empty()) {
      out["expert_tokens_min"] = *std::min_element(counts.begin(), counts.end());
      out["expert_tokens_max"] = *std::max_element(counts.begin(), counts.end());
    }
    out["dropped_tokens"] = dropped;
    // Expert parallelism: the busiest rank's rows (one layer's local experts, one pass) over
    // their balanced share, and the most rows a rank's buffers hold (models/moe/expert_rows.h;
    // what zrt-mem --expert-rows-reserve and a crosscheck at that capacity count).
    if (load->rows_balanced > 0) {
      const std::vector<std::int64_t> rows = control_->max({load->rows_max, load->rows_capacity});
      out["expert_rows_load"] =
          static_cast<double>(rows[0]) / static_cast<double>(load->rows_balanced);
      out["expert_rows_capacity"] = rows[1];
    }
  }
  return out;
}

// The progress line of a quiet step on a terminal. The loss shown is the latest read (a logged
// step's): reading it here would wait.
void TrainingRun::show_progress(std::int64_t step) {
  const double elapsed_s = std::chrono::duration<double>(Clock::now() - run_start_).count();
  const std::string shown =
      std::isnan(last_loss_) ? std::string() : fmt::format(" loss {:.4f}", last_loss_);
  std::fprintf(
      stderr, "\r%s step %lld/%lld%s ETA %s", progress_bar(step, config_.train.steps).c_str(),
      static_cast<long long>(step), static_cast<long long>(config_.train.steps), shown.c_str(),
      format_duration(eta_seconds(elapsed_s, step - start_step_, config_.train.steps - step))
          .c_str());
}

void TrainingRun::evaluate_and_log(std::int64_t step) {
  const double val = evaluator_->evaluate();
  summary_.eval_losses.push_back(val);
  if (rank_ == 0) {
    if (tty_) std::fprintf(stderr, "\r%80s\r", "");
    spdlog::info("eval after step {}: val loss {:.4f}", step, val);
    const double eval_time = unix_seconds();
    nlohmann::json row;
    row["step"] = step;
    row["time"] = eval_time;
    row["elapsed_s"] = std::chrono::duration<double>(Clock::now() - run_start_).count();
    row["val_loss"] = val;
    metrics_->append(row);
    monitors_->write({{"Eval/Samples/val_loss", val, step * samples_per_step_}}, eval_time);
  }
}

// A traced step's marker; after the last traced step, the trace is written and closed.
void TrainingRun::end_traced_step(std::int64_t step, double step_start_us,
                                  const CommCounts& at_start) {
  if (step == last_traced_) {
    // Everything the traced steps enqueued is done before the last marker ends.
    engine_->synchronize();
    device_->synchronize();
  }
  // The step's traffic, as the metrics count it (what this rank sent).
  const CommCounts sent = engine_comm() - at_start;
  trace_->add_step(step, step_start_us, trace_->now_us(),
                   {{"comm_bytes", sent.total_bytes()},
                    {"comm_intra_node_bytes", sent.total_intra_bytes()},
                    {"comm_inter_node_bytes", sent.total_inter_bytes()}});
  if (step != last_traced_) return;
  engine_->set_trace(nullptr);
  const std::string path = trace_path_for_rank(config_.trace.path, rank_, world_);
  trace_->write(path);
  if (rank_ == 0) {
    spdlog::info("trace of steps {}-{} written to {}", config_.trace.first_step, last_traced_,
                 world_ > 1
                     ? trace_path_for_rank(config_.trace.path, 0, world_) + " (one file per rank)"
                     : path);
    // What the device did per step (rank 0's streams); the last traced step also holds the
    // drain of everything it enqueued, so the earlier steps are the steady state.
    for (const TraceStepSummary& s : summarize_trace_steps(trace_->events())) {
      spdlog::info("trace {}", format_trace_step(s));
    }
  }
  trace_.reset();
}

// A short byte-level sample, for a run that trained every step (sampling.h); also when its
// last save failed: the model is whole in memory, only no checkpoint holds it.
void TrainingRun::sample() {
  const bool trained_all =
      summary_.status == RunStatus::kCompleted || summary_.status == RunStatus::kCompletedUnsaved;
  if (config_.train.sample_tokens <= 0 || model_source_.vocab_size != 256 || !trained_all) {
    return;
  }
  if (share_.chunked()) {
    // Sampling runs whole sequences of one rank; the model takes chunks of its group's.
    if (rank_ == 0) spdlog::info("sample: skipped under sequence parallelism");
    return;
  }
  summary_.sample =
      sample_text(config_, *device_, *compute_, *model_, *engine_, T_, model_source_.vocab_size);
  if (rank_ == 0) spdlog::info("sample: {}", printable_sample(summary_.sample));
}

}  // namespace zrt::train
