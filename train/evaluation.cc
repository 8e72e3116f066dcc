#include "train/evaluation.h"

#include <limits>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/data/data_stream.h"
#include "runtime/engine/engine_kernels.h"

namespace zrt::train {

float loss_divisor(bool masked, std::int64_t global_loss_tokens, int micro_batches, int world) {
  if (!masked) return 0.f;
  return static_cast<float>(static_cast<double>(global_loss_tokens) /
                            (static_cast<double>(micro_batches) * world));
}

Evaluator::Evaluator(const Config& config, const RankInfo& ranks, Device& device, Stream& compute,
                     Control& control, BatchFeeder& feeder, Model& model, ZeroEngine& engine,
                     const SampleSource* val_data)
    : config_(config),
      ranks_(ranks),
      device_(device),
      compute_(compute),
      control_(control),
      feeder_(feeder),
      model_(model),
      engine_(engine),
      val_data_(val_data) {
  loss_sum_ = device.allocate(4, MemCategory::kWorkspace, "eval loss accumulator");
}

double Evaluator::evaluate() {
  ZRT_CHECK(val_data_ != nullptr, "an evaluation without validation data");
  const int rank = ranks_.rank;
  const int world = ranks_.world;
  const int B = static_cast<int>(config_.batch.micro_batch_size);
  DataStream val_stream(*val_data_);
  device_.fill_zero(loss_sum_.device<std::byte>(), 4, compute_);
  // The same rule as training: the sum over every evaluated loss token over their count.
  std::vector<HostBatch> rows(static_cast<std::size_t>(config_.train.eval_batches));
  std::int64_t local_tokens = 0;
  const DataShare& share = feeder_.share();
  for (HostBatch& r : rows) {
    val_stream.next_micro_batch(share.dp_rank, share.dp_size, B, r);
    local_tokens += chunk_loss_tokens(r, share);
  }
  const bool weighted = val_data_->documents();
  const std::int64_t global_tokens = weighted ? control_.sum(local_tokens) : 0;
  if (weighted && global_tokens == 0) {
    if (rank == 0) {
      spdlog::warn("evaluation: no loss token in {} batch(es); skipped",
                   config_.train.eval_batches);
    }
    return std::numeric_limits<double>::quiet_NaN();
  }
  const float divisor = loss_divisor(weighted, global_tokens, config_.train.eval_batches, world);
  for (const HostBatch& r : rows) {
    TokenBatch batch = feeder_.next(r, divisor);
    model_.forward(engine_, batch);
    engine_kernels::accumulate(device_, compute_, model_.loss().as<const std::byte>(),
                               DType::kFloat32, loss_sum_.device<std::byte>(), DType::kFloat32, 1);
  }
  const double local =
      read_float(device_, compute_, loss_sum_.device<float>()) / config_.train.eval_batches;
  return control_.mean(local);
}

}  // namespace zrt::train
