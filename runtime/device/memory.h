// Where memory lives and what it is for. Every allocation carries both, so the tracker can
// report model-state bytes the way the ZeRO paper counts them.
#pragma once

#include <array>
#include <cstddef>

namespace zrt {

enum class MemorySpace { kDevice, kPinnedHost, kPageableHost };
constexpr std::size_t kNumMemorySpaces = 3;

enum class MemCategory {
  kParams,       // compute-dtype parameters (full, gathered or sliced)
  kGrads,        // gradients and gradient buckets
  kMaster,       // fp32 master weights
  kOptimizer,    // optimizer moments
  kActivations,  // saved activations
  kComm,         // communication scratch
  kWorkspace,    // kernel workspaces, staging
  kOther,
};
constexpr std::size_t kNumMemCategories = 8;

const char* memory_space_name(MemorySpace s);  // "device", "host_pinned", "host_pageable"
const char* mem_category_name(MemCategory c);  // "params", "grads", ...

}  // namespace zrt
