// Device-side helpers shared by the .cu kernels (nvcc only): storage types, fp32 loads and
// rounding stores, warp and block reductions, DType dispatch, launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/common/dtype.h"
#include "runtime/common/error.h"
#include "runtime/device/cuda_float16.cuh"

namespace zrt::kernels::cuda {

__device__ __forceinline__ float ld(float v) {
  return v;
}
__device__ __forceinline__ float ld(__nv_bfloat16 v) {
  return cuda_float16::to_float(v);
}
__device__ __forceinline__ float ld(__half v) {
  return cuda_float16::to_float(v);
}

// Round-to-nearest-even stores, as zrt::to_bf16 / zrt::to_fp16 on the host.
template <typename S>
__device__ __forceinline__ S st(float v);
template <>
__device__ __forceinline__ float st<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float v) {
  return cuda_float16::to_bf16_rn(v);
}
template <>
__device__ __forceinline__ __half st<__half>(float v) {
  return cuda_float16::to_fp16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronizes the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<S>{}) with S the device storage type of `dtype`.
template <typename Fn>
void with_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(Tag<float>{});
      return;
    case DType::kBFloat16:
      fn(Tag<__nv_bfloat16>{});
      return;
    case DType::kFloat16:
      fn(Tag<__half>{});
      return;
    default:
      break;
  }
  ZRT_THROW(InvalidArgument, "CUDA kernels: unsupported dtype {}", dtype_name(dtype));
}

// Calls fn(Tag<S>{}) for the 16-bit storage types only (tensor-core kernels); `what` names the
// caller in the error for any other dtype.
template <typename Fn>
void with_16bit_storage(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::kBFloat16:
      fn(Tag<__nv_bfloat16>{});
      return;
    case DType::kFloat16:
      fn(Tag<__half>{});
      return;
    default:
      break;
  }
  ZRT_THROW(InvalidArgument, "{}: {} storage is not supported (bf16 or fp16 only)", what,
            dtype_name(dtype));
}

// Calls fn(Tag<S>{}, Tag<G>{}) for the storage and gradient types (G is S or float).
template <typename Fn>
void with_storage_grad(DType dtype, DType grad_dtype, Fn&& fn) {
  with_storage(dtype, [&](auto s) {
    if (grad_dtype == DType::kFloat32) {
      fn(s, Tag<float>{});
    } else {
      fn(s, s);
    }
  });
}

// Whether a pointer allows the 16-byte (uint4) loads of the row-in-registers kernels.
inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

inline unsigned blocks_for(std::int64_t n, int threads) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// Packed documents and sliding windows in the fused attention kernels (flash_attention.cu,
// flash_attention_mma.cu): each is built twice, kDocs false for neither (one document per
// sequence, no window: every such term a compile-time constant, the unpacked kernel instruction
// for instruction) and kDocs true for either or both. A kernel takes doc_start (B,T) (null: one
// document per sequence) and window (0: none) and views one sequence through SequenceKeys.
struct SequenceKeys {
  const std::int32_t* doc_start;  // this sequence's T entries, or null
  int window;                     // 0: none
};
template <bool kDocs>
__device__ __forceinline__ SequenceKeys sequence_keys(const std::int32_t* doc_start, int window,
                                                      int b, int T) {
  if constexpr (kDocs) {
    return {doc_start != nullptr ? doc_start + static_cast<std::int64_t>(b) * T : nullptr, window};
  } else {
    (void)doc_start;
    (void)window;
    (void)b;
    (void)T;
    return {nullptr, 0};
  }
}
// The first key query q may see: its document's first token, or q - window + 1 when the window
// starts later (kernels/cpu/documents.h's first_visible_key). Both are non-decreasing in q, so the
// first query of a group of rows has the group's earliest first key.
template <bool kDocs>
__device__ __forceinline__ int first_key(const SequenceKeys& keys, int q) {
  if constexpr (kDocs) {
    const int doc = keys.doc_start != nullptr ? keys.doc_start[q] : 0;
    return keys.window > 0 ? max(doc, q - keys.window + 1) : doc;
  } else {
    (void)keys;
    (void)q;
    return 0;
  }
}

}  // namespace zrt::kernels::cuda
