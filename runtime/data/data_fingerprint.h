// What a resumed run checks of the data it continues: a fingerprint of the files a SampleSource
// reads, saved with each checkpoint's data position. The position is a sample index, so it means
// the same samples only over the same files: the stream's restore compares the sample count,
// T and group (data_stream.h), which other files of the same count pass; the fingerprint tells
// them apart.
//
// One entry per file, in the source's order: "<file name> <bytes> <hash>", the hash FNV-1a (64-bit)
// of the file's first and last 64 KiB (the whole file when shorter), so computing it reads at most
// 128 KiB a file whatever its size (a data set of 1000 shards: 128 MB once per run). A file
// rewritten with other tokens of the same size differs in its hash unless the change lies wholly
// in the middle of a file longer than 128 KiB: a cheap check for the common mistakes (a shard
// re-generated with another tokenizer or seed, another split renamed into place), not a proof.
#pragma once

#include <string>
#include <vector>

namespace zrt {

// The fingerprint of `paths`, one line per file joined by '\n'. Throws DataError naming a file
// that cannot be read.
std::string data_fingerprint(const std::vector<std::string>& paths);

// The first difference between two fingerprints as a phrase for a warning ("" when they are
// equal): a file whose size or contents changed, one added or gone, or the order changed.
std::string describe_fingerprint_change(const std::string& saved, const std::string& now);

}  // namespace zrt
