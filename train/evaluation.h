// Evaluator: the validation loss of the model as it is now. Every rank evaluates its share of
// the first train.eval_batches micro-batches per data-parallel rank of the validation data (the
// same ones at every evaluation; eval_batches 0: as many as cover the split), never more than
// one pass over it: each validation sequence counts once, and the rows a last micro-batch has
// past the split's end are padding with no loss token. The loss follows the training rule: the
// sum over every evaluated loss token over their count. Collective (forwards at stage 3 gather;
// the control group averages). One per rank; not thread-safe.
#pragma once

#include "config/config.h"
#include "runtime/data/sample_source.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/model_interface.h"
#include "train/batch_feeder.h"
#include "train/control.h"
#include "train/trainer.h"

namespace zrt::train {

class Evaluator {
 public:
  // `val_data` may be null (no data.val): evaluate() is then not to be called. The accumulator
  // is allocated either way, so the memory figures do not depend on data.val.
  Evaluator(const Config& config, const RankInfo& ranks, Device& device, Stream& compute,
            Control& control, BatchFeeder& feeder, Model& model, ZeroEngine& engine,
            const SampleSource* val_data);

  // The mean validation loss over the ranks; NaN (and a warning) when the evaluated batches hold
  // no loss token.
  double evaluate();

  // What an evaluation reads: micro-batches per rank, and the validation sequences (or windows)
  // they cover, each once (0 and 0 without data.val).
  int micro_batches() const { return batches_; }
  std::int64_t sequences() const { return sequences_; }

 private:
  const Config& config_;
  const RankInfo ranks_;
  Device& device_;
  Stream& compute_;
  Control& control_;
  BatchFeeder& feeder_;
  Model& model_;
  ZeroEngine& engine_;
  const SampleSource* val_data_;
  Buffer loss_sum_;
  int batches_ = 0;
  std::int64_t sequences_ = 0;
  // The loss is weighted by loss tokens (loss_divisor): packed or masked data, or padding rows.
  bool weighted_ = false;
};

// The loss divisor of each micro-batch of a step or an evaluation (TokenBatch::loss_divisor):
// the global batch's loss tokens shared out over the micro-batches and ranks the engine averages
// over, so that the step's loss and gradient are the sum over every loss token divided by their
// count, however the global batch is split. 0 (the mean over every token, bit for bit as
// before) for data where every target counts.
float loss_divisor(bool masked, std::int64_t global_loss_tokens, int micro_batches, int world);

}  // namespace zrt::train
