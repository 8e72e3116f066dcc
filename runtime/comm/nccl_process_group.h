// The CUDA backend's collectives: NCCL communicators (the ncclUniqueId broadcast over MPI),
// created non-blocking so a stuck operation can be detected (ncclCommGetAsyncError) and
// aborted (ncclCommAbort) after CommOptions::timeout_s. Built only when ZRT_HAVE_CUDA.
#pragma once

#include <memory>
#include <string>

#include <nccl.h>

#include "runtime/comm/process_group.h"

namespace zrt {

// Checks an NCCL return code (ncclInProgress counts as success: non-blocking communicators
// return it while an operation is still being enqueued); throws with ncclGetErrorString.
void check_nccl(ncclResult_t code, const char* call, const char* file, int line);

// Collective over parent. The device must be a CUDA device and `stream` one of its streams.
std::unique_ptr<ProcessGroup> make_nccl_process_group(Device& device, MPI_Comm parent,
                                                      Stream& stream, const std::string& name,
                                                      const CommOptions& options);

}  // namespace zrt

#define ZRT_NCCL_CHECK(call) ::zrt::check_nccl((call), #call, __FILE__, __LINE__)
