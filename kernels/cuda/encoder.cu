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
// its key's first row, else 0. order[] comes from a least-significant-digit radix sort of the
// row indices by their keys, kRadixBits a pass over the bits the keys' bound needs (two passes
// for GPT-2's vocabulary, three for Llama-3's): each pass is stable, so rows of one key stay in
// row order, and every count is an integer, so order[] does not depend on the launch. A pass
// is linear in the rows, where counting every row's predecessors was quadratic (65 536 rows:
// 2^32 comparisons a call).
constexpr int kRadixBits = 8;
constexpr int kDigits = 1 << kRadixBits;
constexpr int kSortTile = 1024;  // rows a block of a pass: one a thread, 32 warps
constexpr int kScanThreads = 1024;

__device__ int digit_of(const std::int32_t* keys, int row, int shift) {
  return (keys[row] >> shift) & (kDigits - 1);
}

// counts[d * tiles + tile] = the tile's rows whose digit is d (digit-major, so an exclusive scan
// of counts gives every (digit, tile)'s first place in the pass's output). in: the previous
// pass's order, null on the first pass (the rows in order).
__global__ void __launch_bounds__(kSortTile)
    digit_counts_kernel(const std::int32_t* keys, const int* in, int rows, int shift, int* counts) {
  __shared__ int tile_counts[kDigits];
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) tile_counts[d] = 0;
  __syncthreads();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  const bool valid = i < rows;
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (valid) {
    const int row = in != nullptr ? in[i] : static_cast<int>(i);
    const int d = digit_of(keys, row, shift);
    // A warp's rows of one digit in one add (a frequent token would otherwise queue up to 1024
    // adds on one shared word); integers: any order gives the same counts.
    const unsigned peers = __match_any_sync(active, d);
    if ((peers & ((1u << (threadIdx.x % 32)) - 1u)) == 0) atomicAdd(&tile_counts[d], __popc(peers));
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x)
    counts[static_cast<std::int64_t>(d) * gridDim.x + blockIdx.x] = tile_counts[d];
}

// values[0, n) replaced by their exclusive prefix sums, in one block: each thread sums a
// contiguous span, the block scans the spans' sums, and each thread rewrites its span. n is
// kDigits x tiles: spans of 2 ints at 8 192 rows, of 256 at a million.
__global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(int* values, int n) {
  __shared__ int warp_sums[kScanThreads / 32];
  const int span = (n + kScanThreads - 1) / kScanThreads;
  const std::int64_t begin = static_cast<std::int64_t>(threadIdx.x) * span;
  const std::int64_t end = min(begin + span, static_cast<std::int64_t>(n));
  int own = 0;
  for (std::int64_t j = begin; j < end; ++j) own += values[j];
  // The threads' sums scanned: inclusive within each warp, then the warps' totals.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = own;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int total = warp_sums[lane];  // kScanThreads / 32 == 32 warps
    int warp_inclusive = total;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, warp_inclusive, offset);
      if (lane >= offset) warp_inclusive += other;
    }
    warp_sums[lane] = warp_inclusive - total;  // exclusive: the warps before
  }
  __syncthreads();
  int run = warp_sums[warp] + inclusive - own;
  for (std::int64_t j = begin; j < end; ++j) {
    const int v = values[j];
    values[j] = run;
    run += v;
  }
}

// One pass's stable scatter: a row goes to its (digit, tile)'s first place plus the number of
// the tile's earlier rows with its digit: the rows of its warp before it with that digit
// (__match_any_sync), and those of the warps before its own (their counts, scanned per digit).
__global__ void __launch_bounds__(kSortTile)
    digit_scatter_kernel(const std::int32_t* keys, const int* in, int rows, int shift,
                         const int* offsets, int* out) {
  constexpr int kWarps = kSortTile / 32;
  __shared__ int warp_counts[kWarps][kDigits];  // 32 KB: then each warp's first place
  for (int j = threadIdx.x; j < kWarps * kDigits; j += blockDim.x) (&warp_counts[0][0])[j] = 0;
  __syncthreads();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool valid = i < rows;
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  int row = 0, d = 0, rank = 0;
  if (valid) {
    row = in != nullptr ? in[i] : static_cast<int>(i);
    d = digit_of(keys, row, shift);
    const unsigned peers = __match_any_sync(active, d);
    rank = __popc(peers & ((1u << lane) - 1u));
    if (rank == 0) warp_counts[warp][d] = __popc(peers);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kDigits; e += blockDim.x) {
    int place = offsets[static_cast<std::int64_t>(e) * gridDim.x + blockIdx.x];
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_counts[w][e];
      warp_counts[w][e] = place;
      place += c;
    }
  }
  __syncthreads();
  if (valid) out[warp_counts[warp][d] + rank] = row;
}

// From the sorted order: start[r] = r's place; count[r] = its group's size when r comes first
// in it (the end found by binary search: the keys along order[] ascend), else 0.
__global__ void group_bounds_kernel(const std::int32_t* keys, const int* order, int rows,
                                    int* start, int* count) {
  for (std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; p < rows;
       p += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int r = order[p];
    const std::int32_t key = keys[r];
    start[r] = static_cast<int>(p);
    if (p > 0 && keys[order[p - 1]] == key) {
      count[r] = 0;
      continue;
    }
    int lo = static_cast<int>(p) + 1, hi = rows;  // keys[order[lo - 1]] == key
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (keys[order[mid]] == key) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    count[r] = lo - static_cast<int>(p);
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
__global__ void __launch_bounds__(1024)
    table_backward_kernel(G* dtable, const S* dout, const std::int32_t* keys, const int* order,
                          const int* start, const int* count, int C) {
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

namespace {
int sort_tiles(int rows) {
  return (rows + kSortTile - 1) / kSortTile;
}

// The radix passes the keys in [0, bound) need (at least one: order[] is written by a pass).
int radix_passes(int bound) {
  int bits = 0;
  while (bits < 31 && (std::int64_t{1} << bits) < bound) ++bits;
  return std::max(1, (bits + kRadixBits - 1) / kRadixBits);
}
}  // namespace

// Three ints a row for the tokens' groups (order, start, count), three more for the positions',
// and the sort's scratch, shared by both: a row's place between passes and the (digit, tile)
// counts.
std::int64_t encoder_backward_workspace(int B, int T, bool by_position) {
  const int rows = B * T;
  const std::int64_t ints =
      (by_position ? 6 : 3) * std::int64_t{rows} + rows + std::int64_t{kDigits} * sort_tiles(rows);
  return ints * static_cast<std::int64_t>(sizeof(int));
}

namespace {
struct KeyGroups {
  int* order;
  int* start;
  int* count;
};

// keys in [0, bound). groups: 3 x rows ints; scratch: rows + kDigits x tiles ints.
KeyGroups key_groups(const Launch& l, const std::int32_t* keys, int bound, int rows, int* groups,
                     int* scratch) {
  const KeyGroups g{groups, groups + rows, groups + 2 * static_cast<std::int64_t>(rows)};
  const int tiles = sort_tiles(rows);
  int* between = scratch;  // a pass's output when the next pass reads it
  int* counts = scratch + rows;
  const int passes = radix_passes(bound);
  const int* in = nullptr;  // the rows in order
  for (int pass = 0; pass < passes; ++pass) {
    // Alternate so that the last pass writes order[].
    int* out = (passes - 1 - pass) % 2 == 0 ? g.order : between;
    const int shift = pass * kRadixBits;
    digit_counts_kernel<<<tiles, kSortTile, 0, l.stream>>>(keys, in, rows, shift, counts);
    ZRT_CUDA_LAUNCH_CHECK();
    exclusive_scan_kernel<<<1, kScanThreads, 0, l.stream>>>(counts, kDigits * tiles);
    ZRT_CUDA_LAUNCH_CHECK();
    digit_scatter_kernel<<<tiles, kSortTile, 0, l.stream>>>(keys, in, rows, shift, counts, out);
    ZRT_CUDA_LAUNCH_CHECK();
    in = out;
  }
  group_bounds_kernel<<<blocks_for(rows, kThreads), kThreads, 0, l.stream>>>(keys, g.order, rows,
                                                                             g.start, g.count);
  ZRT_CUDA_LAUNCH_CHECK();
  return g;
}
}  // namespace

void encoder_backward(const Launch& l, DType dtype, DType grad_dtype, void* dwte, void* dwpe,
                      const void* dout, const std::int32_t* tokens, int B, int T, int C, int V,
                      const std::int32_t* positions, int position_rows) {
  const int rows = B * T;
  if (rows == 0) return;  // nothing to add (and no grid of zero blocks)
  int* ws = static_cast<int*>(l.ws);
  // Packed documents: the rows of each position grouped in (b,t) order, as the tokens'.
  const bool by_position = positions != nullptr && dwpe != nullptr;
  int* scratch = ws + (by_position ? 6 : 3) * std::int64_t{rows};
  KeyGroups token_groups{};
  if (dwte != nullptr) token_groups = key_groups(l, tokens, V, rows, ws, scratch);  // null: frozen
  KeyGroups position_groups{};
  if (by_position) {
    // Positions index wpe's rows: position_rows of them, or T (ops.h's encoder_backward).
    const int bound = position_rows > 0 ? position_rows : T;
    position_groups = key_groups(l, positions, bound, rows, ws + 3 * std::int64_t{rows}, scratch);
  }
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
