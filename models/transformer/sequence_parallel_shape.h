// What Ulysses sequence parallelism asks of a transformer's shape, for every model family: the
// query heads split evenly over the sp ranks (each attends with its share over the whole
// sequence), the key/value heads either split too or divide sp (fewer are copied to the ranks
// whose query heads use them), and the sequence splits into equal chunks. One rule, so GPT-2 and
// the Llama family refuse the same shapes with the same words, naming their own config keys.
#pragma once

#include <string>
#include <vector>

namespace zrt::transformer {

struct SequenceParallelShape {
  int query_heads = 0;
  // How the family names them in its messages: "heads (n_head)", "query heads
  // (num_attention_heads)".
  std::string query_heads_name;
  // Grouped-query attention's key/value heads; 0: as many as the query heads (no separate rule).
  int key_value_heads = 0;
  int seq_len = 0;
};

// Every reason `sp` ranks cannot split `shape`, each naming both numbers and the fix; empty when
// sp <= 1 or the shape fits.
std::vector<std::string> sequence_parallel_problems(const SequenceParallelShape& shape, int sp);

// Throws InvalidArgument with a line "`model`: <problem>" per problem in `problems`, if any
// (zrt-train logs each line as its own; the source location is left out: the fix is the user's).
void throw_sequence_parallel_problems(const std::string& model,
                                      const std::vector<std::string>& problems);

// throw_sequence_parallel_problems of what sequence_parallel_problems finds.
void require_sequence_parallel_fits(const std::string& model, const SequenceParallelShape& shape,
                                    int sp);

}  // namespace zrt::transformer
