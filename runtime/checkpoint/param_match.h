// Where a rank's parameters are in a checkpoint, by name. A rank of an expert-parallel run holds
// only its experts, and the checkpoint may come from a run that laid them out otherwise, so each
// parameter is found by its name, in one of two forms:
//   - the same name and shape: the whole parameter;
//   - an expert's own parameter and the experts' stacked one: "A.<e>.B" of shape S is row e of
//     "A.B" of shape [E] + S, and "A.B" is the rows "A.0.B" .. "A.<E-1>.B" (the MoE models keep
//     the experts stacked without expert parallelism and one parameter per local expert with
//     it, named by the expert's global index).
// Either way a parameter reads as runs of its elements, each a range of one checkpoint
// parameter (ShardedReader reads them from whatever slices hold them).
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/checkpoint/layout.h"
#include "runtime/model_interface.h"

namespace zrt::checkpoint {

// A run of a parameter's elements and where it is in the checkpoint.
struct ParamSource {
  std::int64_t first = 0;  // the parameter's element
  std::int64_t count = 0;
  int row = 0;          // the index.params row holding them
  std::int64_t at = 0;  // from this element of that row
};
// Per parameter, its runs in element order, covering it.
using ParamSources = std::vector<std::vector<ParamSource>>;

// The sources of each of `params` (a rank's parameters, in its order) in `index`. A parameter
// the checkpoint lacks in either form, or of another shape, is InvalidArgument naming it and
// `path`.
ParamSources find_params(const CheckpointIndex& index, const std::vector<ParamSpec>& params,
                         const std::string& path);

// A parameter's values put together from every checkpoint parameter's full values (index
// order, read_full_params).
std::vector<float> assemble_param(const std::vector<ParamSource>& sources,
                                  const std::vector<std::vector<float>>& values);

}  // namespace zrt::checkpoint
