// The cores this process may run on (its CPU affinity) against the node's, and the warning a
// rank gets when a launcher confined it to fewer than its share: mpirun binds each rank to one
// core by default (for up to 2 ranks; to a socket above), so a rank whose CPU optimizer
// (optimizer offload) or CPU kernels would use a dozen OpenMP threads runs them all on one core,
// several times slower, with nothing in the output saying why.
//
// Thread-safety: plain functions; cpu_affinity() reads the calling thread's affinity mask.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zrt {

struct CpuAffinity {
  int usable = 0;    // cores in this thread's affinity mask
  int online = 0;    // the node's online cores
  std::string list;  // the usable cores as "0-3,8"
};

// The calling thread's affinity (the main thread's is what the process started with).
CpuAffinity cpu_affinity();

// "0-3,8": the cores set in `cores` (index = core number), as ranges (taskset's form).
std::string cpu_list(const std::vector<bool>& cores);

// A warning when a rank runs CPU-heavy work (the CPU backend's kernels, a CPU optimizer) with
// fewer cores than it could have: its affinity holds less than its share of the node
// (online / ranks_on_node, at least 1) while the node has more, it starts more OpenMP threads
// than it may use, or more than its share (unbound ranks whose threads together oversubscribe
// the node). Empty when none holds.
std::optional<std::string> cpu_binding_warning(const CpuAffinity& affinity, int ranks_on_node,
                                               int omp_threads);

}  // namespace zrt
