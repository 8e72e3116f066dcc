#include "kernels/cuda/encoder.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTokenTile = 2048;

// positions (may be null: t): the row of wpe each token reads.
template <typename S>
__global__ void encoder_forward_kernel(S* out, const std::int32_t* tokens, const S* wte,
                                       const S* wpe, std::int64_t rows, int T, int C,
                                       const std::int32_t* positions) {
  const std::int64_t n = rows * C;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / C;
    const int c = static_cast<int>(i % C);
    const int t = positions != nullptr ? positions[r] : static_cast<int>(r % T);
    const float pos = wpe != nullptr ? ld(wpe[static_cast<std::int64_t>(t) * C + c]) : 0.0f;
    out[i] = st<S>(ld(wte[static_cast<std::int64_t>(tokens[r]) * C + c]) + pos);
  }
}

// For every row r: first[r] = 1 iff no earlier row has its token; next[r] = the next row with
// the same token, or -1. Tokens are staged through shared memory in tiles.
__global__ void token_links_kernel(const std::int32_t* tokens, int rows, int* next, int* first) {
  __shared__ std::int32_t tile[kTokenTile];
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  const std::int32_t mine = r < rows ? tokens[r] : -1;
  int nxt = -1;
  int is_first = 1;
  for (int base = 0; base < rows; base += kTokenTile) {
    const int count = min(kTokenTile, rows - base);
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) tile[i] = tokens[base + i];
    __syncthreads();
    if (r < rows) {
      for (int i = 0; i < count; ++i) {
        const int q = base + i;
        if (tile[i] != mine) continue;
        if (q < r) is_first = 0;
        if (q > r && nxt < 0) nxt = q;
      }
    }
  }
  if (r < rows) {
    next[r] = nxt;
    first[r] = is_first;
  }
}

// One block per row; rows that are their token's first occurrence sum the token's chain. With
// positions for tokens (and dwpe for dwte) the same sums give the position rows' gradient.
template <typename S, typename G>
__global__ void wte_backward_kernel(G* dwte, const S* dout, const std::int32_t* tokens,
                                    const int* next, const int* first, int C) {
  const int r = blockIdx.x;
  if (!first[r]) return;
  G* dw = dwte + static_cast<std::int64_t>(tokens[r]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.0f;
    for (int q = r; q >= 0; q = next[q]) sum += ld(dout[static_cast<std::int64_t>(q) * C + c]);
    dw[c] = st<G>(ld(dw[c]) + sum);
  }
}

template <typename S, typename G>
__global__ void wpe_backward_kernel(G* dwpe, const S* dout, int B, int T, int C) {
  const std::int64_t n = static_cast<std::int64_t>(T) * C;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += ld(dout[static_cast<std::int64_t>(b) * n + i]);
    dwpe[i] = st<G>(ld(dwpe[i]) + sum);
  }
}

}  // namespace

void encoder_forward(const Launch& l, DType dtype, void* out, const std::int32_t* tokens,
                     const void* wte, const void* wpe, int B, int T, int C, int /*V*/,
                     const std::int32_t* positions) {
  const std::int64_t rows = static_cast<std::int64_t>(B) * T;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    encoder_forward_kernel<S><<<blocks_for(rows * C, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), tokens, static_cast<const S*>(wte), static_cast<const S*>(wpe), rows,
        T, C, positions);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

std::int64_t encoder_backward_workspace(int B, int T, bool by_position) {
  return (by_position ? 4 : 2) * static_cast<std::int64_t>(B) * T *
         static_cast<std::int64_t>(sizeof(int));
}

void encoder_backward(const Launch& l, DType dtype, DType grad_dtype, void* dwte, void* dwpe,
                      const void* dout, const std::int32_t* tokens, int B, int T, int C, int /*V*/,
                      const std::int32_t* positions) {
  const int rows = B * T;
  const unsigned link_blocks = static_cast<unsigned>((rows + kThreads - 1) / kThreads);
  int* next = static_cast<int*>(l.ws);
  int* first = next + rows;
  if (dwte != nullptr) {  // null: a frozen token embedding
    token_links_kernel<<<link_blocks, kThreads, 0, l.stream>>>(tokens, rows, next, first);
    ZRT_CUDA_LAUNCH_CHECK();
  }
  // Packed documents: the rows of each position linked in (b,t) order, as the tokens'.
  const bool by_position = positions != nullptr && dwpe != nullptr;
  int* pos_next = first + rows;
  int* pos_first = pos_next + rows;
  if (by_position) {
    token_links_kernel<<<link_blocks, kThreads, 0, l.stream>>>(positions, rows, pos_next,
                                                               pos_first);
    ZRT_CUDA_LAUNCH_CHECK();
  }
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    if (dwte != nullptr) {
      wte_backward_kernel<S, G><<<rows, kThreads, 0, l.stream>>>(
          static_cast<G*>(dwte), static_cast<const S*>(dout), tokens, next, first, C);
      ZRT_CUDA_LAUNCH_CHECK();
    }
    if (dwpe == nullptr) return;  // no position embedding (Llama), or a frozen one
    if (by_position) {
      wte_backward_kernel<S, G><<<rows, kThreads, 0, l.stream>>>(
          static_cast<G*>(dwpe), static_cast<const S*>(dout), positions, pos_next, pos_first, C);
      ZRT_CUDA_LAUNCH_CHECK();
      return;
    }
    wpe_backward_kernel<S, G>
        <<<blocks_for(static_cast<std::int64_t>(T) * C, kThreads), kThreads, 0, l.stream>>>(
            static_cast<G*>(dwpe), static_cast<const S*>(dout), B, T, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
