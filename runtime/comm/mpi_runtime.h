// MpiRuntime: RAII MPI_Init_thread / MPI_Finalize for executables and tests. Refuses to start
// unless the library provides MPI_THREAD_MULTIPLE (streams issue collectives from their own
// threads).
#pragma once

#include <mpi.h>

namespace zrt {

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes on this node (selects the GPU).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

// Checks an MPI return code; throws zrt::Error with the MPI error string and file:line.
void check_mpi(int code, const char* call, const char* file, int line);

}  // namespace zrt

#define ZRT_MPI_CHECK(call) ::zrt::check_mpi((call), #call, __FILE__, __LINE__)
