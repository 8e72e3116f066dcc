// Whole-model views of a checkpoint, for zrt-ckpt and tests: every parameter's full fp32 value
// rebuilt from the rank files (a re-slice, as a world size of one would load it), or written as
// one HDF5 dataset per parameter. Export to an architecture's own format (Hugging Face
// safetensors) is the model registry's (models/model_registry.h): zrt-ckpt hands it these
// values, so this library knows no model.
#pragma once

#include <string>
#include <vector>

#include "runtime/checkpoint/layout.h"

namespace zrt::checkpoint {

// The index of the checkpoint in `dir` (dir/index.h5), validated.
CheckpointIndex open_index(const std::string& dir);

// Full fp32 master values of every parameter (index order), read and verified; or, with
// `dataset` one of index.state_datasets(), that optimizer state tensor's ("/exp_avg", ...).
std::vector<std::vector<float>> read_full_params(const std::string& dir,
                                                 const CheckpointIndex& index,
                                                 const std::string& dataset = kMasterDataset);

// Verifies every checksum of the index and the rank files; returns the bytes verified. Throws
// on the first problem, naming the file and the dataset.
std::int64_t verify_checkpoint(const std::string& dir);

// Writes <out>: one float32 dataset per parameter at /params/<name> with the parameter's shape
// (and checksums), plus the step as an attribute.
void write_consolidated(const std::string& dir, const std::string& out);

}  // namespace zrt::checkpoint
