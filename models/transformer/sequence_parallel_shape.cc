#include "models/transformer/sequence_parallel_shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/common/error.h"

namespace zrt::transformer {

namespace {

// "1, 2, 3, 6": the divisors of n, for a fix that names the values that work.
std::string divisors_of(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return fmt::format("{}", fmt::join(d, ", "));
}

}  // namespace

// Every problem at once (the heads, the key/value heads, the length), each with the values
// that would fit: a user who fixes one should not meet the next on the following run.
std::vector<std::string> sequence_parallel_problems(const SequenceParallelShape& shape, int sp) {
  std::vector<std::string> problems;
  if (sp <= 1) return problems;
  const int NH = shape.query_heads, NKV = shape.key_value_heads;
  if (NH % sp != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} does not divide the model's {} {}: each rank of a "
        "sequence-parallel group attends with an equal share of them; set "
        "sequence_parallel_size to a divisor of {} ({}), or give the model a multiple of {} "
        "heads",
        sp, NH, shape.query_heads_name, NH, divisors_of(NH), sp));
  }
  if (NKV > 0 && NKV % sp != 0 && sp % NKV != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} and the model's {} key/value heads (num_key_value_heads): "
        "they must split over the ranks or divide them (fewer are copied to the ranks that use "
        "them); set sequence_parallel_size to a divisor or a multiple of {}",
        sp, NKV, NKV));
  }
  if (shape.seq_len % sp != 0) {
    const int below = shape.seq_len - shape.seq_len % sp;
    problems.push_back(fmt::format(
        "sequence_parallel_size {} does not divide the sequence length {}: each rank holds an "
        "equal chunk of every sequence; set model.seq_len to a multiple of {} ({}{}), or "
        "sequence_parallel_size to a divisor of {}",
        sp, shape.seq_len, sp, below > 0 ? fmt::format("{} or ", below) : std::string(), below + sp,
        shape.seq_len));
  }
  return problems;
}

void throw_sequence_parallel_problems(const std::string& model,
                                      const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::vector<std::string> lines;
  for (const std::string& p : problems) lines.push_back(model + ": " + p);
  throw InvalidArgument(fmt::format("{}", fmt::join(lines, "\n")));
}

void require_sequence_parallel_fits(const std::string& model, const SequenceParallelShape& shape,
                                    int sp) {
  throw_sequence_parallel_problems(model, sequence_parallel_problems(shape, sp));
}

}  // namespace zrt::transformer
