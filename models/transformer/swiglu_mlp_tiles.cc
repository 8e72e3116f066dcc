#include "models/transformer/swiglu_mlp_tiles.h"

#include <algorithm>

#include "kernels/ops.h"
#include "models/transformer/tiling.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

namespace {

using Bytes = DevicePtr<std::byte>;
using I64 = std::int64_t;

// gate, up and h of rows [r0, r0 + n) of x into the tile.
void tile_values(kernels::KernelContext& ctx, DType dt, const SwigluWeights& w, const SwigluTile& t,
                 Bytes x, int r0, int n, int C, int I) {
  const Bytes rows = x + I64{r0} * C * static_cast<I64>(dtype_size(dt));
  k::linear_forward(ctx, dt, t.gate, rows, w.gate, Bytes(), n, C, I);
  k::linear_forward(ctx, dt, t.up, rows, w.up, Bytes(), n, C, I);
  k::swiglu_forward(ctx, dt, t.h, t.gate, t.up, I64{n} * I);
}

}  // namespace

int swiglu_tile_rows(int I, int setting, std::int64_t N, std::int64_t S) {
  return tile_rows(setting, N, 6 * I64{I} * S, kMlpTileBudgetBytes);
}

void swiglu_mlp_tiled_forward(kernels::KernelContext& ctx, DType dt, const SwigluWeights& w,
                              const SwigluTile& t, Bytes x, Bytes out, int N, int C, int I) {
  ZRT_CHECK(t.rows >= 1, "swiglu_mlp_tiled_forward: tiles of {} rows", t.rows);
  const I64 row = I64{C} * static_cast<I64>(dtype_size(dt));
  for (int r0 = 0; r0 < N; r0 += t.rows) {
    const int n = std::min(t.rows, N - r0);
    tile_values(ctx, dt, w, t, x, r0, n, C, I);
    k::linear_forward(ctx, dt, out + r0 * row, t.h, w.down, Bytes(), n, I, C);
  }
}

void swiglu_mlp_tiled_backward(kernels::KernelContext& ctx, DType dt, DType gt,
                               const SwigluWeights& w, const SwigluWeights& g, const SwigluTile& t,
                               Bytes x, Bytes dout, Bytes dx, int N, int C, int I) {
  ZRT_CHECK(t.rows >= 1, "swiglu_mlp_tiled_backward: tiles of {} rows", t.rows);
  const I64 row = I64{C} * static_cast<I64>(dtype_size(dt));
  const k::GradWrite first = k::GradWrite::kOverwrite;
  for (int r0 = 0; r0 < N; r0 += t.rows) {
    const int n = std::min(t.rows, N - r0);
    tile_values(ctx, dt, w, t, x, r0, n, C, I);
    const Bytes dout_rows = dout + r0 * row, dx_rows = dx + r0 * row, x_rows = x + r0 * row;
    k::linear_backward(ctx, dt, gt, t.dh, g.down, Bytes(), dout_rows, t.h, w.down, n, I, C, first);
    const auto tile_bytes = static_cast<std::size_t>(I64{n} * I * static_cast<I64>(dtype_size(dt)));
    ctx.device().fill_zero(t.dgate, tile_bytes, ctx.stream());
    ctx.device().fill_zero(t.dup, tile_bytes, ctx.stream());
    k::swiglu_backward(ctx, dt, t.dgate, t.dup, t.dh, t.gate, t.up, I64{n} * I);
    k::linear_backward(ctx, dt, gt, dx_rows, g.gate, Bytes(), t.dgate, x_rows, w.gate, n, C, I,
                       first);
    k::linear_backward(ctx, dt, gt, dx_rows, g.up, Bytes(), t.dup, x_rows, w.up, n, C, I);
  }
}

}  // namespace zrt::transformer
