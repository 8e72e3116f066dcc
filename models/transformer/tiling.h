// Tiled compute for long sequences: how many rows of the sequence (of the B*T a pass has) the
// head and the MLP take at a time. A tiled op holds its wide tensors (the head's logits (rows,V),
// the SwiGLU MLP's gate, up and h (rows,I) and their gradients) for one tile only and recomputes
// them in the backward, so they stop growing with T (ALST's TiledMLP; the head as Liger's fused
// linear cross-entropy). The rules are pure functions of the shapes, shared by the models'
// layouts and zrt-mem, so the estimate equals what a model allocates.
//
// A setting (TransformerOptions::head_tile_rows / mlp_tile_rows, config model.tiling.*) is
// kTileAuto, kTileOff, or a row count. Automatic: whole while the untiled tensors stay within a
// number of tiles' budget, else tiles of about the budget, in multiples of kTileRowMultiple rows
// (GEMM-friendly shapes). The MLP stays whole up to kAutoTileFactor budgets (its tiles recompute
// their forward in the backward: a slightly-over-budget MLP is not worth it), so its footprint
// drops where tiling starts; the head's tiles recompute nothing, and it stays whole only while
// the rows fit one tile, so its footprint never falls as the rows grow.
#pragma once

#include <cstdint>

namespace zrt::transformer {

constexpr int kTileAuto = 0;
constexpr int kTileOff = -1;
// A head tile's logits (1 GiB: whole up to 1 GiB), and an MLP tile's six (rows, I) tensors
// (1 GiB: whole up to 4 GiB, Llama-3.1-8B's at 8192 tokens are 1.3 GiB), in the automatic rule.
// Each head tile costs a pass over the head's weights: it reads the (V, C) weight twice and
// reads and writes its gradient (GPT-2: 2 x 77 MB and 2 x 154 MB of fp32, 0.46 GB; Llama-3.1-8B:
// 4 x 1.05 GB at bf16 gradients), while a tile's logits move about six times their bytes
// (written, read twice by the cross-entropy, the gradient written and read by two GEMMs): 0.4 GB
// at 64 MiB, GPT-2's weight pass and a tenth of the 8B's. At 1 GiB (6.4 GB) the passes add 7% to
// GPT-2's head traffic and 65% to the 8B's; steps of a few thousand tokens keep their logits
// whole (GPT-2 at 8 x 1024 tokens: 824 MB; the 8B at 2048 tokens: 525 MB, at 8192 two tiles),
// and a long sequence's head holds 1 GiB of logits where it would hold gigabytes. An MLP tile
// costs one more pass over the MLP's weights in the backward, and its forward again.
constexpr std::int64_t kHeadTileBudgetBytes = std::int64_t{1} << 30;
constexpr std::int64_t kMlpTileBudgetBytes = std::int64_t{1} << 30;
constexpr std::int64_t kAutoTileFactor = 4;
constexpr int kTileRowMultiple = 64;

// Rows per tile for `rows` rows of `row_bytes` each under `setting` (see above), with `budget`
// bytes a tile in the automatic rule, whole up to `whole_budgets` of them: `rows` itself means
// one tile (untiled). Throws InvalidArgument for a setting below kTileOff.
int tile_rows(int setting, std::int64_t rows, std::int64_t row_bytes, std::int64_t budget,
              std::int64_t whole_budgets = kAutoTileFactor);

// The head's rows per tile: `rows` of logits of `row_bytes` each (the padded vocabulary's row).
inline int head_tile_rows(int setting, std::int64_t rows, std::int64_t row_bytes) {
  return tile_rows(setting, rows, row_bytes, kHeadTileBudgetBytes, 1);
}

// The number of tiles of `tile` rows that cover `rows`.
inline std::int64_t tile_count(std::int64_t rows, int tile) {
  return (rows + tile - 1) / tile;
}

}  // namespace zrt::transformer
