// The stream of samples every rank reads from a SampleSource (llm.c windows or packed SFT
// sequences alike), addressed by a global sample index.
//
// The stream. Global sample index i (counting from 0 over the whole run) is sample i mod S of
// epoch i / S, S = num_samples(); with shuffling, sample perm(seed, epoch)(i mod S), where perm
// is a keyed bijection of [0, S) (a Feistel network with cycle walking): a pure function of
// (seed, epoch, index) with no state and no dependence on the world size. Micro-batch k of rank
// r among N ranks with micro-batch size B reads global samples (k*N + r)*B ... (k*N + r)*B+B-1:
// for llm.c windows, rank r of N takes the window at r*B*T and every rank advances by N*B*T
// tokens, as in llm.c; for SFT data, one sample is one packed sequence.
//
// Resuming at another world size. The stream is a function of the global sample index, T, the
// source's group G, its samples and the shuffle options; the position a run keeps (and
// checkpoints) is the global index where the next micro-batch starts, k*N*B. A run resumed from
// it at any N and B reads the samples an uninterrupted run at its own N and B would have read
// from that index on. For that G must not change on resume: it is part of the stream's
// definition (DataStreamState). See token_dataset.h for what G means for llm.c windows; SFT
// sequences are always read with G = 1.
//
// Validation: a source over the `val` data, read sequentially from global sample 0 at each
// evaluation, once (DataStreamOptions::one_pass: past the last sample, rows of padding with no
// loss token instead of a second epoch, so no sample is counted twice).
#pragma once

#include <cstdint>

#include "runtime/data/sample_source.h"

namespace zrt {

// What defines a stream and where it is: the state to checkpoint. Restoring it at another world
// size or micro-batch size continues the same stream.
struct DataStreamState {
  std::int64_t position = 0;  // global sample index of the next micro-batch
  bool shuffle = false;
  std::uint64_t seed = 0;
  // The dataset it ran over, checked on restore: the stream is defined only with these equal.
  int seq_len = 0;
  std::int64_t group = 1;
  std::int64_t num_samples = 0;
  // The files it ran over (data_fingerprint.h), compared with a warning at resume (a mismatch
  // is at times deliberate, and the sample indices still address the data as it is); empty in
  // checkpoints saved before it was recorded. Set by the checkpoint's writer, not by state().
  std::string fingerprint;
};

struct DataStreamOptions {
  bool shuffle = false;  // a fresh permutation of the samples every epoch
  std::uint64_t seed = 0;
  // One epoch only: a global sample index past the last sample fills a padding row (input 0,
  // every target -1, one document) instead of wrapping into the next epoch.
  bool one_pass = false;
};

// The sample stream over a source (see the top of this file). Holds a position; not
// thread-safe. The source must outlive it.
class DataStream {
 public:
  explicit DataStream(const SampleSource& dataset, DataStreamOptions options = {});

  const SampleSource& dataset() const { return *dataset_; }
  // The dataset sample (window or sequence) of global sample index `global_index` (>= 0).
  std::int64_t window(std::int64_t global_index) const;
  // The epoch of global sample index `global_index`.
  std::int64_t epoch_of(std::int64_t global_index) const;

  // Fills `batch` with the rows of global samples first .. first+B-1 (row b from sample
  // first+b): B, T, inputs and targets, and positions and doc_start when the source has
  // documents (else they are emptied); loss_tokens counts the targets >= 0. Reuses the batch's
  // vectors. Does not move the position. With one_pass, samples past the last are padding.
  void fill(std::int64_t first, int B, HostBatch& batch) const;
  // Rank `rank` of `world`: fills from global samples position() + rank*B ... and advances the
  // position by world*B (every rank calls it once per micro-batch).
  void next_micro_batch(int rank, int world, int B, HostBatch& batch);

  // The same into inputs[b*T + t] and targets[b*T + t] (t < T), for a source without documents
  // only (InvalidArgument otherwise: positions and the attention's document starts would be
  // lost): inputs are a window's tokens 0..T-1, targets its tokens 1..T.
  void fill(std::int64_t first, int B, std::int32_t* inputs, std::int32_t* targets) const;
  void next_micro_batch(int rank, int world, int B, std::int32_t* inputs, std::int32_t* targets);

  // Global sample index of the next micro-batch.
  std::int64_t position() const { return position_; }
  void set_position(std::int64_t position);
  // Epoch of the next micro-batch.
  std::int64_t epoch() const { return epoch_of(position_); }

  // The state to checkpoint, and its restore: throws DataError if it describes a stream over a
  // different dataset (T, group or number of samples), since the indices would mean other data.
  // The state leaves `fingerprint` empty: the caller that writes it sets it (fingerprint()).
  DataStreamState state() const;
  void restore(const DataStreamState& state);
  // data_fingerprint(dataset().paths()), computed on first use and kept. Call from one thread.
  const std::string& fingerprint() const;

 private:
  const SampleSource* dataset_;
  DataStreamOptions options_;
  std::int64_t position_ = 0;
  mutable std::string fingerprint_;
  mutable bool fingerprinted_ = false;
};

// The keyed permutation behind shuffling: a bijection of [0, n), a pure function of
// (seed, epoch, index). Exposed for tests.
std::int64_t shuffle_index(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                           std::int64_t index);

}  // namespace zrt
