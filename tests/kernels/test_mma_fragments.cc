// The pipelined fused-attention kernels read their mma operands with ldmatrix where the staged
// ones (proven on GPUs) read them element by element: kernels/cuda/mma_fragments.h's lane maps,
// run through a simulation of ldmatrix as the PTX ISA defines it, must hand every lane exactly
// the values the element-wise reads give it, with no shared-memory bank read twice by one
// matrix's rows, and the asynchronous tile copy must cover each 16-byte piece of a tile once.
// A wrong lane map here is a wrong gradient on the GPU, which this machine cannot run.
#include <array>
#include <set>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/cuda/mma_fragments.h"

namespace zrt::kernels::cuda {
namespace {

// A value of the staged tile, named by its place (row, column).
using Value = std::pair<int, int>;
// One lane's 32-bit register: two 16-bit values, the low half first.
using Register = std::pair<Value, Value>;
// The four registers ldmatrix .x4 gives each of the 32 lanes.
using Fragments = std::array<std::array<Register, 4>, 32>;

// ldmatrix.sync.aligned.m8n8.x4(.trans).b16, per the PTX ISA: lane L gives the address of row L % 8
// of matrix L / 8 (here a place of the tile: that row is the 8 values from it along the row);
// lane 4r + w receives in register m the values (r, 2w), (r, 2w + 1) of matrix m, or with .trans
// (2w, r), (2w + 1, r).
Fragments ldmatrix_x4(const std::array<StagedPlace, 32>& lane_place, bool trans) {
  Fragments out{};
  for (int lane = 0; lane < 32; ++lane) {
    const int r = lane / 4, w = lane % 4;
    for (int m = 0; m < 4; ++m) {
      auto value = [&](int row, int col) {
        const StagedPlace start = lane_place[8 * m + row];  // the matrix's row `row`
        return Value{start.row, start.col + col};
      };
      out[lane][m] = trans ? Register{value(2 * w, r), value(2 * w + 1, r)}
                           : Register{value(r, 2 * w), value(r, 2 * w + 1)};
    }
  }
  return out;
}

std::array<StagedPlace, 32> places(StagedPlace origin, StagedPlace (*lane_map)(int)) {
  std::array<StagedPlace, 32> at{};
  for (int lane = 0; lane < 32; ++lane) {
    const StagedPlace p = lane_map(lane);
    at[lane] = {origin.row + p.row, origin.col + p.col};
  }
  return at;
}

// The B operand (16 x 8, column-major: b0 holds k = 2t, 2t+1 of column n = g, b1 k = 2t+8, 2t+9)
// of lane 4g + t, as the staged kernels read it: B(k, n) = tile(n0 + n, k0 + k) for rows . tile^T
// (word(p), word(p + 8) at p = row n0 + g, column k0 + 2t), tile(k0 + k, n0 + n) for A . tile
// (pair(q, q + ld), pair(q + 8 ld, q + 9 ld) at q = row k0 + 2t, column n0 + g).
std::array<Register, 2> b_operand(bool transposed_tile, int k0, int n0, int lane) {
  const int g = lane / 4, t = lane % 4;
  auto at = [&](int k, int n) {
    return transposed_tile ? Value{n0 + n, k0 + k} : Value{k0 + k, n0 + n};
  };
  return {Register{at(2 * t, g), at(2 * t + 1, g)}, Register{at(2 * t + 8, g), at(2 * t + 9, g)}};
}

// Whether the 8 rows of each of the four matrices fall in 8 disjoint groups of 4 banks (one
// shared-memory wavefront each), with the tile's row stride `ld` (16-bit values); and whether
// every row address is 16-byte aligned.
bool conflict_free_and_aligned(const std::array<StagedPlace, 32>& at, int ld, int base_col) {
  for (int m = 0; m < 4; ++m) {
    std::set<int> banks;
    for (int r = 0; r < 8; ++r) {
      const int element = at[8 * m + r].row * ld + at[8 * m + r].col + base_col;
      if (element % 8 != 0) return false;  // 16 bytes = 8 values
      for (int word = 0; word < 4; ++word) banks.insert((element / 2 + word) % 32);
    }
    if (banks.size() != 32) return false;
  }
  return true;
}

TEST_CASE("ldmatrix's lanes read the staged kernels' B operands of rows . tile^T",
          "[kernels][mma]") {
  // Two k-steps (k0, k0 + 16) of the 8 staged rows from n0, for every place the kernels use at
  // head size 64 and 128 (n0 = 8j, k0 a multiple of 32).
  for (const int hs : {64, 128}) {
    for (int n0 = 0; n0 < 64; n0 += 8) {
      for (int k0 = 0; k0 < hs; k0 += 32) {
        INFO("head size " << hs << ", rows from " << n0 << ", head dims from " << k0);
        const auto at = places({n0, k0}, rows_dot_tile_place);
        const Fragments got = ldmatrix_x4(at, false);
        for (int lane = 0; lane < 32; ++lane) {
          INFO("lane " << lane);
          const auto first = b_operand(true, k0, n0, lane);
          const auto second = b_operand(true, k0 + 16, n0, lane);
          CHECK(got[lane][0] == first[0]);
          CHECK(got[lane][1] == first[1]);
          CHECK(got[lane][2] == second[0]);
          CHECK(got[lane][3] == second[1]);
        }
        CHECK(conflict_free_and_aligned(at, staged_row_stride(hs), 0));
      }
    }
  }
}

TEST_CASE("ldmatrix .trans's lanes read the staged kernels' B operands of A . tile",
          "[kernels][mma]") {
  // Two column groups (n0, n0 + 8) of the 16 staged rows from k0 (k-step kk: k0 = 16 kk), for
  // tiles of 64 and 128 columns read from column col0 (dK/dV's second block: 64).
  for (const int cols : {64, 128}) {
    for (const int col0 : {0, 64}) {
      if (col0 >= cols) continue;
      for (int k0 = 0; k0 < 64; k0 += 16) {
        for (int n0 = col0; n0 < cols; n0 += 16) {
          INFO(cols << " columns, rows from " << k0 << ", columns from " << n0);
          const auto at = places({k0, n0}, rows_times_tile_place);
          const Fragments got = ldmatrix_x4(at, true);
          for (int lane = 0; lane < 32; ++lane) {
            INFO("lane " << lane);
            const auto first = b_operand(false, k0, n0, lane);
            const auto second = b_operand(false, k0, n0 + 8, lane);
            CHECK(got[lane][0] == first[0]);
            CHECK(got[lane][1] == first[1]);
            CHECK(got[lane][2] == second[0]);
            CHECK(got[lane][3] == second[1]);
          }
          CHECK(conflict_free_and_aligned(at, staged_row_stride(cols), 0));
        }
      }
    }
  }
}

// The simulation and the reference are not the same arithmetic twice: a lane map that swaps the
// matrices' order, or reads rows where .trans wants columns, fails.
TEST_CASE("a wrong lane map is caught", "[kernels][mma]") {
  const auto right = places({0, 0}, rows_dot_tile_place);
  auto swapped = right;
  for (int lane = 8; lane < 16; ++lane) std::swap(swapped[lane], swapped[lane + 8]);
  const auto reference = b_operand(true, 0, 0, 5);
  CHECK(ldmatrix_x4(right, false)[5][1] == reference[1]);
  CHECK(ldmatrix_x4(swapped, false)[5][1] != reference[1]);
  CHECK(ldmatrix_x4(right, true)[5][0] != reference[0]);  // .trans where the kernel needs rows
  // A row stride of a power of two puts all 8 rows in the same banks.
  CHECK_FALSE(conflict_free_and_aligned(right, 64, 0));
  CHECK_FALSE(conflict_free_and_aligned(right, staged_row_stride(64), 4));  // not 16-byte aligned
}

TEST_CASE("the asynchronous tile copy covers each 16-byte piece once", "[kernels][mma]") {
  for (const int cols : {64, 128}) {
    const int threads = 128, rows = 64;
    const int steps = tile_copy_steps(rows, cols, threads);
    CHECK(steps * threads * 8 == rows * cols);
    std::vector<int> copies(static_cast<std::size_t>(rows) * (cols / 8), 0);
    for (int thread = 0; thread < threads; ++thread) {
      for (int step = 0; step < steps; ++step) {
        const StagedPlace p = tile_copy_place(thread, step, cols, threads);
        REQUIRE(p.row >= 0);
        REQUIRE(p.row < rows);
        REQUIRE(p.col % 8 == 0);
        REQUIRE(p.col < cols);
        ++copies[static_cast<std::size_t>(p.row) * (cols / 8) + p.col / 8];
      }
    }
    INFO(cols << " columns");
    CHECK(std::set<int>(copies.begin(), copies.end()) == std::set<int>{1});
  }
}

}  // namespace
}  // namespace zrt::kernels::cuda
