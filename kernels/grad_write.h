// How a backward op writes an input gradient. The ops accumulate by default (kernels/ops.h), so
// that gradients from several consumers of one tensor sum in place; a model whose buffer has a
// single producer overwrites it instead, and skips both zeroing it first and reading the zeros
// back (on a GPU that is two passes over the buffer per use).
#pragma once

namespace zrt::kernels {

enum class GradWrite {
  kAccumulate,  // dinp += gradient
  kOverwrite,   // dinp = gradient
  // dinp holds zeros on entry (its caller zeroed it), so accumulating and overwriting agree and
  // the op may do whichever is cheaper: the ops that take it say so (ops.h's attention backward:
  // cuDNN's writes straight into dinp). The CPU backend checks the promise. (The attention
  // backwards take kOverwrite too: cuDNN's writes in place, kernels that accumulate zero first.)
  kIntoZeros,
};

}  // namespace zrt::kernels
