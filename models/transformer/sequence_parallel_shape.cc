#include "models/transformer/sequence_parallel_shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/common/error.h"

namespace zrt::transformer {

std::vector<std::string> sequence_parallel_problems(const SequenceParallelShape& shape, int sp) {
  std::vector<std::string> problems;
  if (sp <= 1) return problems;
  const int NH = shape.query_heads, NKV = shape.key_value_heads;
  if (NH % sp != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} does not divide the model's {} {}: each rank of a "
        "sequence-parallel group attends with an equal share of them; give a divisor of {}",
        sp, NH, shape.query_heads_name, NH));
  } else if (NKV > 0 && NKV % sp != 0 && sp % NKV != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} and the model's {} key/value heads (num_key_value_heads): "
        "they must split over the ranks or divide them (fewer are copied to the ranks that use "
        "them); give a divisor or a multiple of {}",
        sp, NKV, NKV));
  }
  if (shape.seq_len % sp != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} does not divide the sequence length {}: each rank holds an "
        "equal chunk of every sequence; give a divisor of it",
        sp, shape.seq_len));
  }
  return problems;
}

void require_sequence_parallel_fits(const std::string& model, const SequenceParallelShape& shape,
                                    int sp) {
  const std::vector<std::string> problems = sequence_parallel_problems(shape, sp);
  if (!problems.empty()) {
    ZRT_THROW(InvalidArgument, "{}: {}", model, fmt::join(problems, "; "));
  }
}

}  // namespace zrt::transformer
