#include "runtime/comm/reduce_kernels.h"

#include <algorithm>

#include "runtime/common/error.h"
#include "runtime/common/simd.h"

namespace zrt {

// Defined here rather than in process_group.cc so the reductions build on their own (the CUDA
// stand-in compiles this file alone).
const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {

constexpr std::int64_t kTile = 2048;  // fp32 accumulator tile kept in L1

// Widen a tile to fp32. Separate functions so each loop vectorizes on its own.

ZRT_SIMD_BODY void widen_bf16_body(const std::uint16_t* in, float* acc, std::int64_t n, bool add) {
  if (add) {
    for (std::int64_t i = 0; i < n; ++i) acc[i] += bits_float(std::uint32_t{in[i]} << 16);
  } else {
    for (std::int64_t i = 0; i < n; ++i) acc[i] = bits_float(std::uint32_t{in[i]} << 16);
  }
}
ZRT_SIMD_DISPATCH(void, widen_bf16, (const std::uint16_t* in, float* acc, std::int64_t n, bool add),
                  (in, acc, n, add), widen_bf16_body)

ZRT_SIMD_BODY void add_f32_body(const float* in, float* acc, std::int64_t n, bool add) {
  if (add) {
    for (std::int64_t i = 0; i < n; ++i) acc[i] += in[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) acc[i] = in[i];
  }
}
ZRT_SIMD_DISPATCH(void, add_f32, (const float* in, float* acc, std::int64_t n, bool add),
                  (in, acc, n, add), add_f32_body)

ZRT_SIMD_BODY void scale_f32_body(float* acc, std::int64_t n, float divisor) {
  for (std::int64_t i = 0; i < n; ++i) acc[i] = acc[i] / divisor;
}
ZRT_SIMD_DISPATCH(void, scale_f32, (float* acc, std::int64_t n, float divisor), (acc, n, divisor),
                  scale_f32_body)

ZRT_SIMD_BODY void narrow_bf16_body(const float* acc, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(acc[i]).bits;
}
ZRT_SIMD_DISPATCH(void, narrow_bf16, (const float* acc, std::uint16_t* out, std::int64_t n),
                  (acc, out, n), narrow_bf16_body)

void widen_fp16(const std::uint16_t* in, float* acc, std::int64_t n, bool add) {
  if (add) {
    for (std::int64_t i = 0; i < n; ++i) acc[i] += to_float(fp16{in[i]});
  } else {
    for (std::int64_t i = 0; i < n; ++i) acc[i] = to_float(fp16{in[i]});
  }
}

void narrow_fp16(const float* acc, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_fp16(acc[i]).bits;
}

template <typename Int>
void reduce_int(const Int* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                ReduceOp op, Int* out) {
  for (std::int64_t i = 0; i < count; ++i) {
    Int acc = blocks[i];
    for (int r = 1; r < nblocks; ++r) {
      const Int v = blocks[r * stride + i];
      acc = op == ReduceOp::kMax ? std::max(acc, v) : static_cast<Int>(acc + v);
    }
    out[i] = acc;
  }
}

}  // namespace

void reduce_blocks(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                   DType dtype, ReduceOp op, void* out) {
  ZRT_CHECK(nblocks >= 1, "reduce over {} blocks", nblocks);
  if (dtype == DType::kInt32 || dtype == DType::kInt64) {
    ZRT_CHECK(op != ReduceOp::kAvg, "avg is not defined on {}", dtype_name(dtype));
    if (dtype == DType::kInt32) {
      reduce_int(static_cast<const std::int32_t*>(blocks), stride, nblocks, count, op,
                 static_cast<std::int32_t*>(out));
    } else {
      reduce_int(static_cast<const std::int64_t*>(blocks), stride, nblocks, count, op,
                 static_cast<std::int64_t*>(out));
    }
    return;
  }
  ZRT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, "{} is not supported on {}",
            reduce_op_name(op), dtype_name(dtype));
  alignas(64) float acc[kTile];
  for (std::int64_t start = 0; start < count; start += kTile) {
    const std::int64_t n = std::min(kTile, count - start);
    for (int r = 0; r < nblocks; ++r) {
      const std::int64_t offset = r * stride + start;
      switch (dtype) {
        case DType::kFloat32:
          add_f32(static_cast<const float*>(blocks) + offset, acc, n, r > 0);
          break;
        case DType::kBFloat16:
          widen_bf16(static_cast<const std::uint16_t*>(blocks) + offset, acc, n, r > 0);
          break;
        default:
          widen_fp16(static_cast<const std::uint16_t*>(blocks) + offset, acc, n, r > 0);
          break;
      }
    }
    if (op == ReduceOp::kAvg) scale_f32(acc, n, static_cast<float>(nblocks));
    switch (dtype) {
      case DType::kFloat32:
        std::copy(acc, acc + n, static_cast<float*>(out) + start);
        break;
      case DType::kBFloat16:
        narrow_bf16(acc, static_cast<std::uint16_t*>(out) + start, n);
        break;
      default:
        narrow_fp16(acc, static_cast<std::uint16_t*>(out) + start, n);
        break;
    }
  }
}

}  // namespace zrt
