// Whether a CUDA build's kernels run on a given GPU, decided before the first launch: a build for
// CMAKE_CUDA_ARCHITECTURES "90" on an A100 (8.0), or any build on a V100 (7.0), otherwise fails
// at its first kernel with CUDA's "no kernel image is available", far from the fix.
//
// Host code without CUDA, so every build compiles it and its test runs without a GPU.
#pragma once

#include <optional>
#include <string>

namespace zrt {

// The oldest compute capability zrt's CUDA kernels are written for (bf16 mma.sync m16n8k16,
// cp.async, ldmatrix): 8.0.
constexpr int kMinCudaComputeCapability = 80;

// The problem, said with its fix, when a device of compute capability major.minor cannot run a
// build for `architectures` (CMAKE_CUDA_ARCHITECTURES with ',' or ';' between the entries: "80,90",
// "90-real", "86-virtual", "90a"), or is older than kMinCudaComputeCapability; nothing when it
// can. An entry compiles machine code (no suffix or -real: runs on the same major version at the
// same or a later minor one) and PTX (no suffix or -virtual: compiled by the driver for the same
// or any later GPU); an "a" entry (90a) runs on exactly that version. A list it cannot read
// (CMake's all, all-major, native; family entries such as 100f) is taken as fitting: the first
// launch still checks.
std::optional<std::string> cuda_architecture_problem(int major, int minor,
                                                     const std::string& architectures);

}  // namespace zrt
