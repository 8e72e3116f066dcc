// MpiRuntime: RAII MPI_Init_thread / MPI_Finalize for executables and tests. Refuses to start
// unless the library provides MPI_THREAD_MULTIPLE (streams issue collectives from their own
// threads).
#pragma once

#include <mpi.h>

#include <utility>

#include "runtime/comm/polled_wait.h"

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

namespace zrt {

// Tests a nonblocking MPI operation's `request` until it completes, through polled_wait: gives
// up after options.timeout_s with a Timeout carrying timeout_message() (OpenMPI advances a
// request only inside MPI_Test; a blocking wait could never time out).
template <typename TimeoutMessage>
void wait_mpi_request(MPI_Request& request, const PollOptions& options,
                      TimeoutMessage&& timeout_message) {
  polled_wait(
      options,
      [&] {
        int done = 0;
        ZRT_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      std::forward<TimeoutMessage>(timeout_message));
}

}  // namespace zrt
