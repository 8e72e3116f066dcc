#include "runtime/comm/mpi_runtime.h"

#include <string>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt {

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(file, line, fmt::format("{} failed: {}", call, std::string(text, length)));
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  ZRT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    ZRT_THROW(Error,
              "the MPI library provides thread level {} but zrt needs MPI_THREAD_MULTIPLE ({}): "
              "streams issue collectives from their own threads. Use an MPI built with thread "
              "support (Debian's OpenMPI is).",
              provided, MPI_THREAD_MULTIPLE);
  }
  // Return codes instead of aborting, so every failure becomes an exception with context.
  ZRT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ZRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ZRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  ZRT_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  ZRT_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  ZRT_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  ZRT_MPI_CHECK(MPI_Comm_free(&node));
}

MpiRuntime::~MpiRuntime() {
  const int code = MPI_Finalize();
  if (code != MPI_SUCCESS) spdlog::error("MPI_Finalize failed with code {}", code);
}

}  // namespace zrt
