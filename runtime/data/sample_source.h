// What the trainer reads data through: a SampleSource numbers its samples 0 .. num_samples()-1
// and turns sample i into one row of T positions as the model takes it (inputs, targets, and for
// data with document boundaries the positions and document starts attention needs); a HostBatch
// holds B such rows. The llm.c windows of token_dataset.h and the packed SFT sequences of
// sft_dataset.h are the two sources; data_stream.h decides which sample goes to which row of
// which rank, the same way for both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zrt {

// One micro-batch as the model takes it (B rows of T).
struct HostBatch {
  int batch = 0, seq_len = 0;
  std::vector<std::int32_t> inputs, targets;  // B*T; a target < 0 is not in the loss
  bool documents = false;                     // positions/doc_start are filled
  std::vector<std::int32_t> positions;        // B*T: t - doc_start[t]
  std::vector<std::int32_t> doc_start;        // B*T: index in its row of its document's first token
  std::int64_t loss_tokens = 0;               // targets >= 0
};

// Where SampleSource::read_row writes one row: T int32 each. positions and doc_start may be null
// (not wanted); they are written only by a source whose documents() is true.
struct SampleRow {
  std::int32_t* inputs = nullptr;
  std::int32_t* targets = nullptr;  // the id position t is trained to predict, or -1
  std::int32_t* positions = nullptr;
  std::int32_t* doc_start = nullptr;
};

// A dataset of fixed-length samples. The rules every source keeps in its rows: a token never
// attends to a token of another document (a position t attends to doc_start[t] .. t only), a
// target never crosses a document boundary (the last token of a document does not predict the
// first of the next), positions restart at 0 with every document, and a target of -1 is not in
// the loss. Read-only once built, apart from set_vocab_size; read_row() is thread-safe.
class SampleSource {
 public:
  virtual ~SampleSource() = default;

  // What was opened (the data.train / data.val value), for messages.
  virtual const std::string& pattern() const = 0;
  // T: the positions of a row.
  virtual int seq_len() const = 0;
  // Samples are taken from a file in whole groups of this many (data_stream.h); part of the
  // stream's definition.
  virtual std::int64_t group() const = 0;
  // Samples per epoch (S).
  virtual std::int64_t num_samples() const = 0;
  // True iff rows carry document boundaries: read_row fills positions and doc_start, and some
  // targets may be -1. False: every row is one document (positions t, doc_start 0) and every
  // target is a token.
  virtual bool documents() const = 0;
  // One line for the log: how many samples of what, from how many files.
  virtual std::string describe() const = 0;
  // The files it reads, in order (data_fingerprint.h fingerprints them for a resume's check).
  virtual std::vector<std::string> paths() const = 0;
  // Makes reads throw DataError for a token >= vocab_size (0: only the source's own limits).
  virtual void set_vocab_size(int vocab_size) = 0;
  // Writes the row of sample `index` in [0, num_samples()). Throws DataError (naming the file)
  // for a token at or above the vocabulary size or data that changed since it was opened.
  virtual void read_row(std::int64_t index, const SampleRow& row) const = 0;
};

}  // namespace zrt
