// Catch2 entry point for MPI tests: every rank runs the same test cases in the same order (the
// collectives inside them must match). Rank 0 reports in full, the others compactly; the exit
// code is non-zero on every rank if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/log.h"

int main(int argc, char** argv) {
  zrt::MpiRuntime mpi(&argc, &argv);
  zrt::init_logging(mpi.rank());
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (mpi.rank() != 0) session.configData().reporterName = "compact";
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed != 0 && failed == 0) {
    std::fprintf(stderr, "[rank %d] another rank failed\n", mpi.rank());
  }
  return any_failed != 0 ? 1 : 0;
}
