// The x86-64 instruction sets zrt's CPU kernels are compiled for, which of them this machine
// runs, and which one zrt uses. Every CPU hot loop (the CPU Adam, the collectives' local
// reductions, the engine's conversions, the model kernels' vector math) picks its path from
// active_cpu_isa(), so one variable forces all of them onto a narrower path:
//
//   ZRT_CPU_ISA=avx2 tools/test      # the AVX2 kernels on an AVX-512 machine
//   ZRT_CPU_ISA=scalar ...           # baseline x86-64 (SSE2) everywhere
//
// This is how CI proves the numerics on AVX2-only machines from an AVX-512 one (and the reverse
// is impossible: a path the CPU lacks is an error, not a silent fallback).
//
// Thread-safety: every function may be called from any thread; the environment is read once.
#pragma once

#include <vector>

namespace zrt {

// kAuto: "the widest this process may use" (active_cpu_isa()); the others name one path.
// kScalar is portable baseline x86-64 code (which the compiler may still vectorize with SSE2).
enum class CpuIsa { kAuto, kScalar, kAvx2, kAvx512 };

const char* cpu_isa_name(CpuIsa isa);  // "auto", "scalar", "avx2", "avx512"

// Returns true iff this machine (and OS) can run `isa`; kAuto and kScalar always can. AVX2 here
// means AVX2 with F16C (every AVX2 CPU has it; the fp16 paths need it).
bool cpu_isa_supported(CpuIsa isa);

// The widest ISA this machine runs.
CpuIsa hardware_cpu_isa();

// Every explicit ISA this machine runs (kScalar first, then wider), for tests and tools that
// compare the paths.
std::vector<CpuIsa> supported_cpu_isas();

// The widest ISA zrt's kernels use: hardware_cpu_isa(), lowered by the environment variable
// ZRT_CPU_ISA ("auto", "avx512", "avx2" or "scalar"). Throws InvalidArgument, naming the
// variable, for any other value or for an ISA this CPU cannot run. Never kAuto.
CpuIsa active_cpu_isa();

// What active_cpu_isa() is made of: the ISA a ZRT_CPU_ISA value `requested` (nullptr or "" when
// unset) selects on a machine whose widest is `hardware`. Throws InvalidArgument as above.
CpuIsa resolve_cpu_isa(const char* requested, CpuIsa hardware);

// The same as active_cpu_isa(): what CpuIsa::kAuto resolves to.
inline CpuIsa best_cpu_isa() {
  return active_cpu_isa();
}

}  // namespace zrt
