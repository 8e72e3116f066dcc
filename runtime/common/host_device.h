// Marks for code compiled for both the host and the CUDA device (element updates, per-step
// decisions shared by a CPU twin and its kernel). Header-only, no dependencies: .cu files
// include it directly.
#pragma once

#if defined(__CUDACC__)
#define ZRT_HOST_DEVICE __host__ __device__
// Before a host-device template that calls what it is given (a device lambda in a kernel, a host
// one on the CPU): nvcc checks such calls only where the instantiation runs.
#define ZRT_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define ZRT_HOST_DEVICE
#define ZRT_EXEC_CHECK_DISABLE
#endif
