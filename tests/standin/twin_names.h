// What the kernel twins of the model kernels share: the namespace their kernels' demangled names
// start with, the kernels' launch constants, fp32 loads and rounding stores of the storage
// types, and the demangled spelling of those types in signatures.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "runtime/common/dtype.h"

namespace zrt::standin::twin_names {

inline const std::string kNs = "zrt::kernels::cuda::(anonymous namespace)::";
constexpr int kRowsPerBlock = 8;    // 256 threads, one warp per row
constexpr int kColumnSumRows = 64;  // kernels/cuda/layernorm.cuh
constexpr int kMaxColumnChunkBlocks = 65535;  // kernels/cuda/layernorm.cuh

template <typename S>
float ld(S v) {
  return load_as_float(v);
}
template <typename S>
S st(float v) {
  return store_from_float<S>(v);
}

// Demangled spelling of the storage types.
template <typename S>
const char* cuda_name();
template <>
inline const char* cuda_name<float>() {
  return "float";
}
template <>
inline const char* cuda_name<bf16>() {
  return "__nv_bfloat16";
}
template <>
inline const char* cuda_name<fp16>() {
  return "__half";
}

// kernels/cuda/row_pieces.cuh: the widths NV of the row-in-registers kernels (8-element pieces,
// 32 lanes); a kernel of width NV serves 16-bit rows with C % 8 == 0 and C in
// (256 * the previous width, 256 * NV].
constexpr int kRowPieceWidths[] = {1, 2, 3, 4, 6, 8, 12, 16};

// Replaces $S and $G in a signature.
inline std::string sig(std::string text, const char* s, const char* g = "") {
  for (auto [key, value] : {std::pair<const char*, const char*>{"$S", s}, {"$G", g}}) {
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key)) {
      text.replace(at, 2, value);
    }
  }
  return text;
}

}  // namespace zrt::standin::twin_names
