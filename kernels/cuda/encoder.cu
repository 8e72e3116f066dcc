#include "kernels/cuda/encoder.cuh"

#include <algorithm>

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

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

// The rows grouped by key (a token id, or a position): order[] lists the rows sorted by
// (key, row), start[r] is row r's place in it, and count[r] is the size of r's group when r is
// its key's first row, else 0. One warp per row counts, over all rows, the keys below its own
// and the rows before it with the same key (integer sums: the same in any order), so every row
// is placed at once, without a sort or a linked list to walk.
__global__ void key_groups_kernel(const std::int32_t* keys, int rows, int* order, int* start,
                                  int* count) {
  const int r =
      static_cast<int>((blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp
  const std::int32_t mine = keys[r];
  int below = 0, before = 0, same = 0;
  for (int q = lane; q < rows; q += 32) {
    const std::int32_t key = keys[q];
    below += key < mine ? 1 : 0;
    if (key == mine) {
      ++same;
      before += q < r ? 1 : 0;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    below += __shfl_xor_sync(0xffffffffu, below, offset);
    before += __shfl_xor_sync(0xffffffffu, before, offset);
    same += __shfl_xor_sync(0xffffffffu, same, offset);
  }
  if (lane == 0) {
    const int place = below + before;
    order[place] = r;
    start[r] = place;
    count[r] = before == 0 ? same : 0;
  }
}

// One block per row; the first row of each key sums its group's rows of dout in row order
// (the bits do not depend on the launch) and adds the sum to the key's row of the table. The
// group's row indices are consecutive in order[]: staged in shared memory a chunk at a time,
// they leave every load of dout independent of the others, so a thread keeps 16 in flight. A
// frequent token (a few percent of a batch: hundreds of rows) then costs a memory latency per
// 16 rows, where walking a linked list of them cost one per row and per channel block.
constexpr int kGroupChunk = 1024;
constexpr int kInFlight = 16;

template <typename S, typename G>
__global__ void table_backward_kernel(G* dtable, const S* dout, const std::int32_t* keys,
                                      const int* order, const int* start, const int* count, int C) {
  __shared__ int rows_of[kGroupChunk];
  const int r = blockIdx.x;
  const int n = count[r];
  if (n == 0) return;  // the whole block
  const int* group = order + start[r];
  G* dw = dtable + static_cast<std::int64_t>(keys[r]) * C;
  // Every thread runs every iteration of both loops (the syncs), with or without a channel.
  for (int c0 = 0; c0 < C; c0 += blockDim.x) {
    const int c = c0 + threadIdx.x;
    float sum = 0.0f;
    for (int j0 = 0; j0 < n; j0 += kGroupChunk) {
      const int m = min(kGroupChunk, n - j0);
      __syncthreads();  // the previous chunk is read
      for (int j = threadIdx.x; j < m; j += blockDim.x) rows_of[j] = group[j0 + j];
      __syncthreads();
      if (c >= C) continue;
      const auto at = [&](int j) { return dout[static_cast<std::int64_t>(rows_of[j]) * C + c]; };
      int j = 0;
      for (; j + kInFlight <= m; j += kInFlight) {
        S v[kInFlight];  // every load issued before the first add waits on one
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) v[u] = at(j + u);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) sum += ld(v[u]);
      }
      for (; j < m; ++j) sum += ld(at(j));
    }
    if (c < C) dw[c] = st<G>(ld(dw[c]) + sum);
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

// Three ints a row for the tokens' groups, three more for the positions'.
std::int64_t encoder_backward_workspace(int B, int T, bool by_position) {
  return (by_position ? 6 : 3) * static_cast<std::int64_t>(B) * T *
         static_cast<std::int64_t>(sizeof(int));
}

namespace {
struct KeyGroups {
  int* order;
  int* start;
  int* count;
};

KeyGroups key_groups(const Launch& l, const std::int32_t* keys, int rows, int* ws) {
  const KeyGroups g{ws, ws + rows, ws + 2 * static_cast<std::int64_t>(rows)};
  const std::int64_t threads = 32 * static_cast<std::int64_t>(rows);  // a warp a row
  key_groups_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0,
                      l.stream>>>(keys, rows, g.order, g.start, g.count);
  ZRT_CUDA_LAUNCH_CHECK();
  return g;
}
}  // namespace

void encoder_backward(const Launch& l, DType dtype, DType grad_dtype, void* dwte, void* dwpe,
                      const void* dout, const std::int32_t* tokens, int B, int T, int C, int /*V*/,
                      const std::int32_t* positions) {
  const int rows = B * T;
  int* ws = static_cast<int*>(l.ws);
  KeyGroups token_groups{};
  if (dwte != nullptr) token_groups = key_groups(l, tokens, rows, ws);  // null: a frozen table
  // Packed documents: the rows of each position grouped in (b,t) order, as the tokens'.
  const bool by_position = positions != nullptr && dwpe != nullptr;
  KeyGroups position_groups{};
  if (by_position) position_groups = key_groups(l, positions, rows, ws + 3 * std::int64_t{rows});
  // A channel a thread (C <= 1024; wider tables loop), so a group's rows are read once.
  const int threads = static_cast<int>(std::min<std::int64_t>(1024, (C + 31) / 32 * 32));
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    const auto table = [&](void* dtable, const std::int32_t* keys, const KeyGroups& groups) {
      table_backward_kernel<S, G>
          <<<rows, threads, 0, l.stream>>>(static_cast<G*>(dtable), static_cast<const S*>(dout),
                                           keys, groups.order, groups.start, groups.count, C);
      ZRT_CUDA_LAUNCH_CHECK();
    };
    if (dwte != nullptr) table(dwte, tokens, token_groups);
    if (dwpe == nullptr) return;  // no position embedding (Llama), or a frozen one
    if (by_position) {
      table(dwpe, positions, position_groups);
      return;
    }
    wpe_backward_kernel<S, G>
        <<<blocks_for(static_cast<std::int64_t>(T) * C, kThreads), kThreads, 0, l.stream>>>(
            static_cast<G*>(dwpe), static_cast<const S*>(dout), B, T, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
