#include "train/evaluation.h"

#include <algorithm>
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
  if (val_data_ == nullptr) return;
  // A micro-batch index covers dp x B sequences over the data-parallel ranks (an sp group reads
  // the same rows).
  const std::int64_t S = val_data_->num_samples();
  const std::int64_t per_batch =
      std::int64_t{feeder.share().dp_size} * config.batch.micro_batch_size;
  const std::int64_t covering = (S + per_batch - 1) / per_batch;
  const int asked = config.train.eval_batches;
  std::int64_t batches = asked == 0 ? covering : std::min<std::int64_t>(asked, covering);
  bool padded = batches * per_batch > S;
  if (padded && !model.supports_packed_documents()) {
    // This model cannot leave padding rows out of its loss: whole micro-batches only.
    batches = S / per_batch;
    padded = false;
    if (batches == 0) {
      ZRT_THROW(InvalidArgument,
                "data.val {}: {} sequence(s), fewer than one evaluation micro-batch over the "
                "data-parallel ranks ({} x micro-batch {}), and this model cannot leave padding "
                "rows out of its loss: give more validation data, or evaluate with fewer ranks "
                "or a smaller micro-batch",
                val_data_->pattern(), S, feeder.share().dp_size, config.batch.micro_batch_size);
    }
  }
  batches_ = static_cast<int>(batches);
  sequences_ = std::min(S, batches * per_batch);
  weighted_ = val_data_->documents() || padded;
  if (ranks_.rank == 0) {
    spdlog::info(
        "evaluation: {} micro-batch(es) per rank, {} of the {} validation sequence(s), "
        "each once{}",
        batches_, sequences_, S,
        asked > 0 && covering > asked
            ? fmt::format(" (train.eval_batches {}; 0 evaluates all)", asked)
            : std::string());
  }
}

double Evaluator::evaluate() {
  ZRT_CHECK(val_data_ != nullptr, "an evaluation without validation data");
  const int rank = ranks_.rank;
  const int world = ranks_.world;
  const int B = static_cast<int>(config_.batch.micro_batch_size);
  DataStreamOptions once;
  once.one_pass = true;
  DataStream val_stream(*val_data_, once);
  device_.fill_zero(loss_sum_.device<std::byte>(), 4, compute_);
  // The same rule as training: the sum over every evaluated loss token over their count.
  std::vector<HostBatch> rows(static_cast<std::size_t>(batches_));
  std::int64_t local_tokens = 0;
  const DataShare& share = feeder_.share();
  for (HostBatch& r : rows) {
    val_stream.next_micro_batch(share.dp_rank, share.dp_size, B, r);
    local_tokens += chunk_loss_tokens(r, share);
  }
  const std::int64_t global_tokens = weighted_ ? control_.sum(local_tokens) : 0;
  if (weighted_ && global_tokens == 0) {
    if (rank == 0) spdlog::warn("evaluation: no loss token in {} batch(es); skipped", batches_);
    return std::numeric_limits<double>::quiet_NaN();
  }
  const float divisor = loss_divisor(weighted_, global_tokens, batches_, world);
  for (const HostBatch& r : rows) {
    TokenBatch batch = feeder_.next(r, divisor);
    model_.forward(engine_, batch);
    engine_kernels::accumulate(device_, compute_, model_.loss().as<const std::byte>(),
                               DType::kFloat32, loss_sum_.device<std::byte>(), DType::kFloat32, 1);
  }
  const double local = read_float(device_, compute_, loss_sum_.device<float>()) / batches_;
  return control_.mean(local);
}

}  // namespace zrt::train
