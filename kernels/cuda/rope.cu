#include "kernels/cuda/rope.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// Pair (row, h, i) of x (B*T rows, NH heads, hs = 2P): rotated by sign * pos * inv_freq[i] and
// scaled by the table's attention_scaling, pos = positions[row] (null: t). Each thread reads its
// pair before writing it, so out may equal inp.
template <typename S>
__global__ void rope_kernel(S* out, const S* inp, RopeTable table, std::int64_t pairs, int T,
                            int NH, float sign, const std::int32_t* positions) {
  const int P = table.pairs;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < pairs;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(k % P);
    const std::int64_t head = k / P;  // row * NH + h
    const std::int64_t row = head / NH;
    const int t = positions != nullptr ? positions[row] : static_cast<int>(row % T);
    double sn, cs;
    sincos(static_cast<double>(t) * static_cast<double>(table.inv_freq[i]), &sn, &cs);
    // yarn's attention factor scales both (1 otherwise), as the CPU twin does in double.
    const double scale = table.attention_scaling;
    const float c = static_cast<float>(scale * cs);
    const float s = static_cast<float>(sign * scale * sn);
    const std::int64_t off = head * 2 * P;
    const float x1 = ld(inp[off + i]);
    const float x2 = ld(inp[off + i + P]);
    out[off + i] = st<S>(x1 * c - x2 * s);
    out[off + i + P] = st<S>(x2 * c + x1 * s);
  }
}

void rotate(const Launch& l, DType dtype, void* out, const void* inp, const RopeTable& table, int B,
            int T, int NH, float sign, const std::int32_t* positions) {
  const std::int64_t pairs = static_cast<std::int64_t>(B) * T * NH * table.pairs;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    rope_kernel<S><<<blocks_for(pairs, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(inp), table, pairs, T, NH, sign, positions);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void rope_forward(const Launch& l, DType dtype, void* out, const void* inp, const RopeTable& table,
                  int B, int T, int NH, int /*hs*/, const std::int32_t* positions) {
  rotate(l, dtype, out, inp, table, B, T, NH, 1.0f, positions);
}

void rope_backward(const Launch& l, DType dtype, void* dinp, const void* dout,
                   const RopeTable& table, int B, int T, int NH, int /*hs*/,
                   const std::int32_t* positions) {
  rotate(l, dtype, dinp, dout, table, B, T, NH, -1.0f, positions);
}

}  // namespace zrt::kernels::cuda
