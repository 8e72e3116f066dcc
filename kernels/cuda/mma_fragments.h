// Where the fused attention's pipelined kernels (flash_attention_mma.cu) point each lane of a
// warp when they read a tile staged in shared memory with ldmatrix, as host-and-device
// arithmetic so that the CPU tests (test_mma_fragments) can check it against the mma.m16n8k16
// fragment layout the staged kernels read element by element and the GPU has proven.
//
// ldmatrix.sync.aligned.m8n8.x4.b16 (PTX ISA) loads four 8x8 matrices of 16-bit values: lane L
// gives the address of row L % 8 of matrix L / 8 (each row 8 consecutive values, 16 bytes,
// 16-byte aligned); afterwards lane 4r + w holds in register m the values (r, 2w) and (r, 2w+1)
// of matrix m, the lower column in the low half; with .trans, (2w, r) and (2w+1, r). One
// instruction thus delivers four registers of B operands, where reading them element by element
// takes four 32-bit or eight 16-bit shared loads (and the packing of 16-bit pairs).
#pragma once

#include "runtime/common/host_device.h"

namespace zrt::kernels::cuda {

// A place in a tile staged in shared memory: its row and column, in elements.
struct StagedPlace {
  int row;
  int col;
};

// Row stride (elements) of a staged tile `cols` wide: cols/2 + 4 words, 4 modulo the 32 banks
// for cols = 64 and 128, so that the 8 rows of any fragment read (one ldmatrix matrix, or one
// element-wise read of 8 rows) fall in 8 disjoint groups of 4 banks.
ZRT_HOST_DEVICE constexpr int staged_row_stride(int cols) {
  return cols + 8;
}

// rows . tile^T: the B operand (k = 16 head dims, n = 8 staged rows) of two consecutive k-steps
// of the staged rows n0..n0+7, from head dim k0 (a multiple of 32). The address lane `lane` gives
// ldmatrix .x4 (not transposed), relative to (n0, k0): matrix m is the rows' head dims k0 + 8m
// .. +7, so the registers are {b0, b1} of the k-step at k0, then {b0, b1} of the one at k0 + 16.
ZRT_HOST_DEVICE constexpr StagedPlace rows_dot_tile_place(int lane) {
  return {lane % 8, 8 * (lane / 8)};
}

// A . tile: the B operand (k = 16 staged rows, n = 8 columns) of two neighbouring column groups
// n0..n0+7 and n0+8..n0+15 of the staged rows k0..k0+15. The address lane `lane` gives ldmatrix
// .x4.trans, relative to (k0, n0): matrix m is the staged rows k0 + 8 (m % 2) .. +7 at columns
// n0 + 8 (m / 2) .. +7, so the registers are {b0, b1} of the group at n0, then of the one at
// n0 + 8.
ZRT_HOST_DEVICE constexpr StagedPlace rows_times_tile_place(int lane) {
  return {lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16)};
}

// The pipelined kernels' asynchronous copy of a tile of `rows` x `cols` 16-bit values in 16-byte
// pieces (8 values) by `threads` threads: at step `step` (of tile_copy_steps) thread `thread`
// copies the piece at this place, the same piece of a row `threads / (cols / 8)` rows further on
// each step, so that the offsets are constants and the loop unrolls. Every piece exactly once
// when cols / 8 divides threads and threads / (cols / 8) divides rows.
ZRT_HOST_DEVICE constexpr StagedPlace tile_copy_place(int thread, int step, int cols, int threads) {
  return {thread / (cols / 8) + step * (threads / (cols / 8)), 8 * (thread % (cols / 8))};
}
ZRT_HOST_DEVICE constexpr int tile_copy_steps(int rows, int cols, int threads) {
  return rows / (threads / (cols / 8));
}

}  // namespace zrt::kernels::cuda
