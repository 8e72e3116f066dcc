#include "optimizers/optimizer_slices.h"

#include <string>

#include "runtime/common/error.h"

namespace zrt::detail {

void validate_slice_fields(const char* family, std::size_t index, std::int64_t numel, bool any_null,
                           const char* const* state_names, std::size_t num_states, DType grad_dtype,
                           bool has_out, DType out_dtype) {
  if (numel < 0) ZRT_THROW(InvalidArgument, "{} slice {}: numel {} < 0", family, index, numel);
  if (numel == 0) return;
  if (any_null) {
    // "param, grad, exp_avg or exp_avg_sq": every pointer the slice must have.
    std::string names = "param";
    for (std::size_t k = 0; k <= num_states; ++k) {
      names += k == num_states ? " or " : ", ";
      names += k == 0 ? "grad" : state_names[k - 1];
    }
    ZRT_THROW(InvalidArgument, "{} slice {} ({} elements): null {}", family, index, numel, names);
  }
  if (!is_floating(grad_dtype)) {
    ZRT_THROW(InvalidArgument, "{} slice {}: gradient dtype {} is not fp32, bf16 or fp16", family,
              index, dtype_name(grad_dtype));
  }
  if (has_out && !is_floating(out_dtype)) {
    ZRT_THROW(InvalidArgument, "{} slice {}: output dtype {} is not fp32, bf16 or fp16", family,
              index, dtype_name(out_dtype));
  }
}

}  // namespace zrt::detail
