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
  // Automatic: tiles of about the budget, in multiples of kTileRowMultiple rows, where the whole
  // would take more than whole_budgets of them. At one budget, whole exactly while the rows fit
  // one tile: then the rows a pass holds never fall as the rows grow.
  const std::int64_t tile = std::max<std::int64_t>(
      kTileRowMultiple, budget / row_bytes / kTileRowMultiple * kTileRowMultiple);
  if (whole_budgets == 1) return static_cast<int>(std::min(rows, tile));
  if (rows * row_bytes <= whole_budgets * budget) return static_cast<int>(rows);
  return static_cast<int>(std::min(rows, tile));
}

}  // namespace zrt::transformer
