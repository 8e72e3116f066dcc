#include "runtime/common/cpu_affinity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

namespace zrt {

std::string cpu_list(const std::vector<bool>& cores) {
  const int count = static_cast<int>(cores.size());
  std::string out;
  for (int i = 0; i < count;) {
    if (!cores[static_cast<std::size_t>(i)]) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < count && cores[static_cast<std::size_t>(j + 1)]) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(i) : fmt::format("{}-{}", i, j);
    i = j + 1;
  }
  return out;
}

CpuAffinity cpu_affinity() {
  CpuAffinity a;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  a.online = online > 0 ? static_cast<int>(online)
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {  // unknown: assume the whole node
    a.usable = a.online;
    a.list = cpu_list(std::vector<bool>(static_cast<std::size_t>(a.online), true));
    return a;
  }
  a.usable = CPU_COUNT(&set);
  std::vector<bool> cores;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (!CPU_ISSET(i, &set)) continue;
    cores.resize(static_cast<std::size_t>(i) + 1, false);
    cores[static_cast<std::size_t>(i)] = true;
  }
  a.list = cpu_list(cores);
  return a;
}

std::optional<std::string> cpu_binding_warning(const CpuAffinity& affinity, int ranks_on_node,
                                               int omp_threads) {
  const int share = std::max(1, affinity.online / std::max(1, ranks_on_node));
  if (affinity.usable < share) {
    return fmt::format(
        "this rank may run on {} of the node's {} cores (CPU affinity {}) while its share is {} "
        "({} rank(s) on the node): its CPU work (the CPU optimizer with optimizer offload, the "
        "CPU backend's kernels) gets {} core(s) where it could have {}. mpirun binds ranks by "
        "default (each to a core at 2 ranks or fewer): launch with "
        "`mpirun --bind-to none -x OMP_NUM_THREADS={}` (tools/zrt-run does both), or under "
        "srun with --cpus-per-task={}",
        affinity.usable, affinity.online, affinity.list, share, ranks_on_node, affinity.usable,
        share, share, share);
  }
  if (omp_threads > affinity.usable) {
    return fmt::format(
        "{} OpenMP threads on the {} core(s) this rank may use (CPU affinity {}): they take "
        "turns on the cores, and the CPU optimizer's and CPU kernels' parallel loops wait for "
        "the slowest; set OMP_NUM_THREADS to at most {}",
        omp_threads, affinity.usable, affinity.list, affinity.usable);
  }
  // Unbound ranks (mpirun --bind-to none) each start one thread per core of the node: the
  // ranks' threads then share the cores, and OpenMP's waiting threads spin, so a parallel loop
  // can take many times longer (100x measured, 2 ranks on 2 cores).
  if (omp_threads > share) {
    return fmt::format(
        "{} OpenMP threads per rank and {} rank(s) on the node's {} cores: {} threads take "
        "turns on them and OpenMP's waiting threads spin, so the CPU work (the CPU optimizer "
        "with optimizer offload, the CPU backend's kernels) can run many times slower; set "
        "OMP_NUM_THREADS={} (tools/zrt-run does)",
        omp_threads, ranks_on_node, affinity.online, omp_threads * ranks_on_node, share);
  }
  return std::nullopt;
}

}  // namespace zrt
