#include "runtime/device/memory.h"

namespace zrt {

const char* memory_space_name(MemorySpace s) {
  switch (s) {
    case MemorySpace::kDevice:
      return "device";
    case MemorySpace::kPinnedHost:
      return "host_pinned";
    case MemorySpace::kPageableHost:
      return "host_pageable";
  }
  return "?";
}

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kParams:
      return "params";
    case MemCategory::kGrads:
      return "grads";
    case MemCategory::kMaster:
      return "master";
    case MemCategory::kOptimizer:
      return "optimizer";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kComm:
      return "comm";
    case MemCategory::kWorkspace:
      return "workspace";
    case MemCategory::kOther:
      return "other";
  }
  return "?";
}

}  // namespace zrt
