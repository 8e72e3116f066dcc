// Ulysses sequence parallelism's layout ops on the CUDA backend, checked exactly as on the CPU
// (ulysses_layout_checks.h). Skipped (exit 77) without a GPU; the stand-ins run them on the CPU.
#include "tests/kernels/ulysses_layout_checks.h"
#include "tests/support/gpu_test_support.h"

namespace zrt::kernels {
namespace {

TEST_CASE("ulysses layout: chunks become head shares of whole sequences and back (CUDA)",
          "[cuda][ulysses]") {
  ulysses_checks::check_all(DeviceType::kCuda, test::gpu_index());
}

}  // namespace
}  // namespace zrt::kernels
