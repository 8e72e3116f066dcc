// ZRT_CPU_ISA: which kernel path each value selects, the errors for the others, and that the
// process-wide choice follows the variable (CI runs the numerics tests under avx2 and scalar).
#include <catch2/catch.hpp>

#include <cstdlib>

#include "runtime/common/cpu_isa.h"
#include "runtime/common/error.h"

using namespace zrt;

TEST_CASE("ZRT_CPU_ISA selects a path no wider than the hardware's") {
  for (CpuIsa hw : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    INFO("hardware " << cpu_isa_name(hw));
    CHECK(resolve_cpu_isa(nullptr, hw) == hw);
    CHECK(resolve_cpu_isa("", hw) == hw);
    CHECK(resolve_cpu_isa("auto", hw) == hw);
    CHECK(resolve_cpu_isa("scalar", hw) == CpuIsa::kScalar);
  }
  CHECK(resolve_cpu_isa("avx2", CpuIsa::kAvx512) == CpuIsa::kAvx2);
  CHECK(resolve_cpu_isa("avx2", CpuIsa::kAvx2) == CpuIsa::kAvx2);
  CHECK(resolve_cpu_isa("avx512", CpuIsa::kAvx512) == CpuIsa::kAvx512);
}

TEST_CASE("ZRT_CPU_ISA: a path the CPU lacks or an unknown name is an error") {
  CHECK_THROWS_WITH(resolve_cpu_isa("avx512", CpuIsa::kAvx2),
                    Catch::Contains("ZRT_CPU_ISA=avx512, but this CPU runs at most avx2"));
  CHECK_THROWS_WITH(resolve_cpu_isa("avx2", CpuIsa::kScalar),
                    Catch::Contains("this CPU runs at most scalar"));
  CHECK_THROWS_AS(resolve_cpu_isa("AVX2", CpuIsa::kAvx512), InvalidArgument);
  CHECK_THROWS_WITH(resolve_cpu_isa("sse", CpuIsa::kAvx512),
                    Catch::Contains("ZRT_CPU_ISA='sse': expected auto, avx512, avx2 or scalar"));
}

TEST_CASE("the active path is the hardware's, lowered by ZRT_CPU_ISA") {
  const CpuIsa hardware = hardware_cpu_isa();
  CHECK(cpu_isa_supported(hardware));
  CHECK(active_cpu_isa() == resolve_cpu_isa(std::getenv("ZRT_CPU_ISA"), hardware));
  CHECK(best_cpu_isa() == active_cpu_isa());
  WARN("hardware " << cpu_isa_name(hardware) << ", active " << cpu_isa_name(active_cpu_isa()));
}
