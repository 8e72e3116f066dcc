// Catch2 entry point for GPU tests under mpirun: as mpi_catch_main.cc, plus one GPU per rank
// (the rank's local rank selects it). Listing works on any machine. If any rank lacks a GPU of
// its own (no device, or fewer devices than ranks on its node: NCCL cannot put two ranks of a
// communicator on one GPU), every rank prints why and exits with kSkipExitCode, which mpirun
// passes on to ctest.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/log.h"
#include "runtime/device/device.h"
#include "tests/support/gpu_test_support.h"

namespace {
bool only_lists(const Catch::ConfigData& c) {
  return c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
}
}  // namespace

int main(int argc, char** argv) {
  zrt::MpiRuntime mpi(&argc, &argv);
  zrt::init_logging(mpi.rank());
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (!only_lists(session.configData())) {
    std::string why = zrt::test::no_gpu_reason();
    if (why.empty() && zrt::cuda_device_count() < mpi.local_size()) {
      why = fmt::format("{} ranks on this node but only {} CUDA device(s)", mpi.local_size(),
                        zrt::cuda_device_count());
    }
    const int usable = why.empty() ? 1 : 0;
    int all_usable = 0;
    ZRT_MPI_CHECK(MPI_Allreduce(&usable, &all_usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (all_usable == 0) {
      if (why.empty()) why = "another rank has none";
      std::printf("[rank %d] SKIPPED: no CUDA device (%s)\n", mpi.rank(), why.c_str());
      return zrt::test::kSkipExitCode;
    }
    zrt::test::set_gpu_index(mpi.local_rank());
  }
  if (mpi.rank() != 0) session.configData().reporterName = "compact";
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed != 0 && failed == 0) {
    std::fprintf(stderr, "[rank %d] another rank failed\n", mpi.rank());
  }
  return any_failed != 0 ? 1 : 0;
}
