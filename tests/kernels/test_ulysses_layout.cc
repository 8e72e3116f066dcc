// Ulysses sequence parallelism's layout ops on the CPU backend (ulysses_layout_checks.h), the
// head split's validation, and the adjoint relation the backward relies on.
#include "tests/kernels/ulysses_layout_checks.h"

namespace zrt::kernels {
namespace {

TEST_CASE("ulysses layout: chunks become head shares of whole sequences and back (CPU)",
          "[ulysses]") {
  ulysses_checks::check_all(DeviceType::kCpu, 0);
}

TEST_CASE("ulysses layout: head splits that cannot work are refused with both numbers",
          "[ulysses]") {
  CHECK_THROWS_WITH(ulysses_query_heads(12, 8),
                    Catch::Contains("12 query heads do not split over 8 ranks"));
  CHECK_THROWS_WITH(
      ulysses_kv_heads(24, 6, 4),
      Catch::Contains("6 key/value heads neither split over 4 ranks nor divide them"));
  const UlyssesHeads kv = ulysses_kv_heads(64, 8, 16);  // Llama-3-70B at sp 16
  CHECK(kv.block_heads == 1);
  CHECK(kv.heads_per_rank == 4);
  CHECK(kv.group == 8);
}

}  // namespace
}  // namespace zrt::kernels
