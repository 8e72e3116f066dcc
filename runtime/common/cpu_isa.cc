#include "runtime/common/cpu_isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "runtime/common/error.h"

namespace zrt {

namespace {

// F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

int rank_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return 2;
    case CpuIsa::kAvx2:
      return 1;
    default:
      return 0;
  }
}

}  // namespace

CpuIsa resolve_cpu_isa(const char* requested, CpuIsa hardware) {
  if (requested == nullptr || *requested == '\0' || std::string(requested) == "auto") {
    return hardware;
  }
  const std::string wanted = requested;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (wanted != cpu_isa_name(isa)) continue;
    if (rank_of(isa) > rank_of(hardware)) {
      ZRT_THROW(InvalidArgument,
                "ZRT_CPU_ISA={}, but this CPU runs at most {}; unset it or choose {} or narrower",
                wanted, cpu_isa_name(hardware), cpu_isa_name(hardware));
    }
    return isa;
  }
  ZRT_THROW(InvalidArgument, "ZRT_CPU_ISA='{}': expected auto, avx512, avx2 or scalar", wanted);
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && has_f16c();
    default:
      return true;
  }
}

CpuIsa hardware_cpu_isa() {
  if (cpu_isa_supported(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_isa_supported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

CpuIsa active_cpu_isa() {
  // Resolved once: the kernels ask on every call. A throwing first call leaves it unresolved,
  // so every later call reports the same error.
  static const CpuIsa active = resolve_cpu_isa(std::getenv("ZRT_CPU_ISA"), hardware_cpu_isa());
  return active;
}

}  // namespace zrt
