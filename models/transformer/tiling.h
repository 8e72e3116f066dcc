// Tiled compute for long sequences: how many rows of the sequence (of the B*T a pass has) the
// head and the MLP take at a time. A tiled op holds its wide tensors (the head's logits (rows,V),
// the SwiGLU MLP's gate, up and h (rows,I) and their gradients) for one tile only and recomputes
// them in the backward, so they stop growing with T (ALST's TiledMLP; the head as Liger's fused
// linear cross-entropy). The rules are pure functions of the shapes, shared by the models'
// layouts and zrt-mem, so the estimate equals what a model allocates.
//
// A setting (TransformerOptions::head_tile_rows / mlp_tile_rows, config model.tiling.*) is
// kTileAuto, kTileOff, or a row count. Automatic: whole while the untiled tensors stay within
// kAutoTileFactor tiles' budget, else tiles of about the budget, in multiples of kTileRowMultiple
// rows (GEMM-friendly shapes).
#pragma once

#include <cstdint>

namespace zrt::transformer {

constexpr int kTileAuto = 0;
constexpr int kTileOff = -1;
// A head tile's logits (64 MiB: whole up to 256 MiB), and an MLP tile's six (rows, I) tensors
// (1 GiB: whole up to 4 GiB, Llama-3.1-8B's at 8192 tokens are 1.3 GiB), in the automatic rule.
// The MLP's tiles are larger: each costs one more pass over the MLP's weights in the backward.
constexpr std::int64_t kHeadTileBudgetBytes = std::int64_t{64} << 20;
constexpr std::int64_t kMlpTileBudgetBytes = std::int64_t{1} << 30;
constexpr std::int64_t kAutoTileFactor = 4;
constexpr int kTileRowMultiple = 64;

// Rows per tile for `rows` rows of `row_bytes` each under `setting` (see above), with `budget`
// bytes a tile in the automatic rule: `rows` itself means one tile (untiled). Throws
// InvalidArgument for a setting below kTileOff.
int tile_rows(int setting, std::int64_t rows, std::int64_t row_bytes, std::int64_t budget);

// The number of tiles of `tile` rows that cover `rows`.
inline std::int64_t tile_count(std::int64_t rows, int tile) {
  return (rows + tile - 1) / tile;
}

}  // namespace zrt::transformer
