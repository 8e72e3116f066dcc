// Support for GPU tests, shared by the two GPU test mains (gpu_test_main.cc for one process,
// gpu_mpi_test_main.cc under mpirun). Without a usable GPU a GPU test binary still lists its
// tests (Catch2 discovery, ctest) but exits with kSkipExitCode before running any, which ctest
// reports as skipped (SKIP_RETURN_CODE; Catch2 v2 has no SKIP).
#pragma once

#include <string>

namespace zrt::test {

constexpr int kSkipExitCode = 77;

// The CUDA device this test process uses: its local rank under MPI, else 0.
int gpu_index();
void set_gpu_index(int index);

// Empty if this process can use a CUDA device, else why not, e.g.
// "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version, error 35".
std::string no_gpu_reason();

}  // namespace zrt::test
