#include "models/transformer/tiling.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt::transformer {

int tile_rows(int setting, std::int64_t rows, std::int64_t row_bytes, std::int64_t budget,
              std::int64_t whole_budgets) {
  ZRT_CHECK(rows >= 1 && row_bytes >= 1 && whole_budgets >= 1,
            "tile_rows: {} rows of {} bytes, whole up to {} budgets", rows, row_bytes,
            whole_budgets);
  if (setting < kTileOff) {
    ZRT_THROW(InvalidArgument,
              "model.tiling: {} rows per tile (need a positive count, 0 for automatic or -1 for "
              "no tiling)",
              setting);
  }
  if (setting == kTileOff) return static_cast<int>(rows);
  if (setting > 0) return static_cast<int>(std::min<std::int64_t>(setting, rows));
  // Automatic: tile only where the whole tensors would take more than whole_budgets tiles.
  if (rows * row_bytes <= whole_budgets * budget) return static_cast<int>(rows);
  const std::int64_t fit = budget / row_bytes / kTileRowMultiple * kTileRowMultiple;
  return static_cast<int>(std::min(rows, std::max<std::int64_t>(kTileRowMultiple, fit)));
}

}  // namespace zrt::transformer
