// runtime/device/cuda_architecture.h: which GPUs a build's kernels run on, before any launch.
// The rules are CUDA's (machine code for sm_XY runs on X.Y and later minor versions of major X;
// PTX for compute_XY on X.Y and every later GPU; "a" targets on exactly X.Y), checked against the
// GPUs users bring: a build for "80;90" (the default) on an A100, an A10 or L4 (8.6, 8.9), an
// H100 and a B200 (10.0, through compute_90's PTX); a build for "90" only on an A100; a V100.
#include <catch2/catch.hpp>

#include "runtime/device/cuda_architecture.h"

namespace zrt {
namespace {

using Catch::Contains;

TEST_CASE("the default build (80;90) runs on every GPU from 8.0 on", "[device][cuda]") {
  for (const auto& [major, minor] : {std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9},
                                     std::pair{9, 0}, std::pair{10, 0}, std::pair{12, 0}}) {
    INFO(major << "." << minor);
    CHECK_FALSE(cuda_architecture_problem(major, minor, "80,90"));
    CHECK_FALSE(cuda_architecture_problem(major, minor, "80;90"));  // CMake's own separator
  }
}

TEST_CASE("a GPU older than 8.0 is refused, whatever the build", "[device][cuda]") {
  for (const char* built : {"80,90", "70", "all"}) {
    const auto problem = cuda_architecture_problem(7, 0, built);
    REQUIRE(problem);
    CHECK_THAT(*problem, Contains("compute capability 7.0") && Contains("8.0 or newer") &&
                             Contains("device.type cpu"));
  }
  CHECK(cuda_architecture_problem(7, 5, "80,90"));
}

TEST_CASE("a build without code for the GPU says how to rebuild", "[device][cuda]") {
  // sm_90 machine code and compute_90 PTX: not an A100's.
  const auto problem = cuda_architecture_problem(8, 0, "90");
  REQUIRE(problem);
  CHECK_THAT(*problem, Contains("compute capability 8.0") && Contains("architectures 90") &&
                           Contains("CUDAARCHS=80") && Contains("add 80 to the list"));
  // Machine code alone runs on later minor versions of its major version only.
  CHECK_FALSE(cuda_architecture_problem(8, 6, "80-real"));
  CHECK(cuda_architecture_problem(9, 0, "80-real"));
  CHECK(cuda_architecture_problem(8, 0, "86-real"));
  // PTX alone runs on its version and every later one.
  CHECK_FALSE(cuda_architecture_problem(9, 0, "80-virtual"));
  CHECK_FALSE(cuda_architecture_problem(10, 0, "90"));
  CHECK(cuda_architecture_problem(10, 0, "90-real"));
  // "a" targets: that version only.
  CHECK_FALSE(cuda_architecture_problem(9, 0, "90a"));
  CHECK(cuda_architecture_problem(10, 0, "90a"));
  CHECK_FALSE(cuda_architecture_problem(10, 0, "90a,100"));
}

TEST_CASE("a list it cannot read is left to the first launch", "[device][cuda]") {
  for (const char* built : {"all", "all-major", "native", "100f", "", "80,native"}) {
    INFO(built);
    CHECK_FALSE(cuda_architecture_problem(8, 0, built));
  }
}

}  // namespace
}  // namespace zrt
