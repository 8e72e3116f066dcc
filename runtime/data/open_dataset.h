// Opening a data.train / data.val value as a SampleSource: llm.c token shards (TokenDataset) or
// zrt SFT shards (SftDataset), told apart by each file's magic.
//
// The value is a directory (its sft_*.bin, sorted bytewise: prepare-sft's OUT/train or OUT/val)
// or a POSIX glob (sorted bytewise). All its files must be of one kind; a mix is a DataError
// naming a file of each kind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/sample_source.h"

namespace zrt {

enum class DataFileKind {
  kTokenShard,  // an llm.c token shard (uint16 or uint32 tokens)
  kSftShard,    // a zrt SFT shard
};

// The kind of the data file at `path`, by its magic (the file is validated only when opened).
// Throws DataError naming the file when it is missing, unreadable or neither kind.
DataFileKind data_file_kind(const std::string& path);

// The files of a data value: a directory's sft_*.bin, or a glob's matches (expand_glob), sorted
// bytewise. Throws DataError when there are none (for a directory without sft_*.bin that has a
// train/ or val/ holding some, the message says so).
std::vector<std::string> expand_data_path(const std::string& path);

struct DatasetOptions {
  // llm.c windows only: taken from a shard in groups of this many (token_dataset.h). SFT
  // sequences are read one at a time: any other value is an InvalidArgument for SFT data.
  std::int64_t group = 1;
  // The model's vocabulary size: every token must be below it (0: no check beyond the data's own).
  int vocab_size = 0;
  // llm.c windows only: document masking (data.document_mask) with this separator id
  // (data.document_separator; kAutoDocumentSeparator, token_dataset.h, picks it by the shards'
  // token width). SFT data always has its documents and ignores both.
  bool document_mask = false;
  std::int64_t document_separator = -1;  // kAutoDocumentSeparator
};

// Opens the data value `path` for rows of `seq_len` tokens (the model's T): its files, their kind
// and every file's validation as TokenDataset or SftDataset does. Throws DataError naming the
// file (a mix of kinds names two), InvalidArgument for options that do not fit the kind.
std::unique_ptr<SampleSource> open_dataset(const std::string& path, int seq_len,
                                           const DatasetOptions& options = {});

}  // namespace zrt
