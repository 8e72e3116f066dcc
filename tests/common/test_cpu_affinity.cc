// The cores a rank may use (its CPU affinity) and the warning when a launcher confined it to
// fewer than its share of the node (mpirun binds each rank to a core by default at 2 ranks or
// fewer), or its OpenMP threads oversubscribe the node.
#include <catch2/catch.hpp>

#include <sched.h>

#include <thread>

#include "runtime/common/cpu_affinity.h"

using namespace zrt;

TEST_CASE("cpu_list writes the cores as taskset's ranges") {
  CHECK(cpu_list({}).empty());
  CHECK(cpu_list({true}) == "0");
  CHECK(cpu_list({true, true, true, true}) == "0-3");
  CHECK(cpu_list({false, true}) == "1");
  CHECK(cpu_list({true, false, true, true, false, false, false, false, true}) == "0,2-3,8");
}

TEST_CASE("a rank confined below its share of the node is warned, with the fix") {
  // One rank bound to core 3 of 16 (mpirun's default for one or two ranks).
  const auto bound = cpu_binding_warning(CpuAffinity{1, 16, "3"}, 1, 1);
  REQUIRE(bound.has_value());
  CHECK_THAT(*bound, Catch::Contains("1 of the node's 16 cores (CPU affinity 3)"));
  CHECK_THAT(*bound, Catch::Contains("its share is 16"));
  CHECK_THAT(*bound, Catch::Contains("--bind-to none -x OMP_NUM_THREADS=16"));
  // Two ranks on 16 cores given 4 each: their share is 8.
  const auto quarter = cpu_binding_warning(CpuAffinity{4, 16, "0-3"}, 2, 4);
  REQUIRE(quarter.has_value());
  CHECK_THAT(*quarter, Catch::Contains("its share is 8 (2 rank(s) on the node)"));
  // Their share or more: nothing to say.
  CHECK_FALSE(cpu_binding_warning(CpuAffinity{16, 16, "0-15"}, 1, 16).has_value());
  CHECK_FALSE(cpu_binding_warning(CpuAffinity{8, 16, "8-15"}, 2, 8).has_value());
  CHECK_FALSE(cpu_binding_warning(CpuAffinity{1, 16, "5"}, 16, 1).has_value());
  CHECK_FALSE(cpu_binding_warning(CpuAffinity{2, 2, "0-1"}, 4, 1).has_value());  // oversubscribed
  // More OpenMP threads than usable cores.
  const auto threads = cpu_binding_warning(CpuAffinity{16, 16, "0-15"}, 1, 32);
  REQUIRE(threads.has_value());
  CHECK_THAT(*threads, Catch::Contains("32 OpenMP threads on the 16 core(s)"));
  CHECK_THAT(*threads, Catch::Contains("set OMP_NUM_THREADS to at most 16"));
  // Unbound ranks (mpirun --bind-to none without OMP_NUM_THREADS) each with a thread per core of
  // the node: together they oversubscribe it.
  const auto unbound = cpu_binding_warning(CpuAffinity{2, 2, "0-1"}, 2, 2);
  REQUIRE(unbound.has_value());
  CHECK_THAT(*unbound, Catch::Contains("2 OpenMP threads per rank and 2 rank(s) on the node's 2 "
                                       "cores: 4 threads take turns"));
  CHECK_THAT(*unbound, Catch::Contains("set OMP_NUM_THREADS=1"));
  CHECK_FALSE(cpu_binding_warning(CpuAffinity{16, 16, "0-15"}, 2, 8).has_value());
}

TEST_CASE("cpu_affinity reads the calling thread's mask") {
  const CpuAffinity mine = cpu_affinity();
  REQUIRE(mine.usable >= 1);
  CHECK(mine.usable <= mine.online);
  CHECK_FALSE(mine.list.empty());
  // A thread bound to one of those cores sees exactly that one.
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &set)) ++first;
  CpuAffinity bound;
  std::thread worker([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) bound = cpu_affinity();
  });
  worker.join();
  CHECK(bound.usable == 1);
  CHECK(bound.list == std::to_string(first));
  CHECK(bound.online == mine.online);
  // The warning a rank bound like that gets on this machine (when it has more than one core).
  if (mine.online > 1) CHECK(cpu_binding_warning(bound, 1, 1).has_value());
}
