#include "models/moe/expert_rows.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "models/activation_planner.h"
#include "runtime/common/error.h"

namespace zrt::moe {

namespace {

using I64 = std::int64_t;

I64 round_up_to(I64 n, I64 multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

I64 ExpertRowsShape::worst_rows(I64 N) const {
  return I64{ep} * N * std::min<I64>(k, E / ep);
}

I64 ExpertRowsShape::granule(I64 N) const {
  return std::max<I64>(1, (balanced_rows(N) + 15) / 16);
}

I64 ExpertRowsShape::initial_rows(I64 N, double reserve) const {
  const double wanted = std::ceil(reserve * static_cast<double>(balanced_rows(N)));
  if (wanted >= static_cast<double>(worst_rows(N))) return worst_rows(N);
  return std::min(worst_rows(N),
                  round_up_to(std::max<I64>(static_cast<I64>(wanted), 1), granule(N)));
}

I64 ExpertRowsShape::grown_rows(I64 rows, I64 N) const {
  // Rounded up, but not past the worst case (which a demand from N tokens cannot exceed).
  return std::max(rows, std::min(worst_rows(N), round_up_to(rows, granule(N))));
}

// Each tensor starts at the activations' alignment, as the planner lays them out.
I64 ExpertRowsShape::kept_bytes(I64 rows, I64 element) const {
  return round_up_activation(rows * C * element) + 3 * round_up_activation(rows * I * element);
}

I64 ExpertRowsShape::scratch_bytes(I64 rows, I64 element) const {
  return 2 * round_up_activation(rows * C * element) + 3 * round_up_activation(rows * I * element);
}

ExpertRows::ExpertRows(Device& device, Stream& compute, Stream& comm, ExpertRowsShape shape,
                       double reserve)
    : device_(device), compute_(compute), comm_(comm), shape_(shape), reserve_(reserve) {
  ZRT_CHECK(shape_.ep > 1 && shape_.E % shape_.ep == 0 && shape_.k >= 1,
            "ExpertRows: {} experts, top {}, over an expert-parallel group of {}", shape_.E,
            shape_.k, shape_.ep);
  ZRT_CHECK(reserve_ >= 1.0 && std::isfinite(reserve_),
            "model.expert_rows_reserve {} is below 1: the buffers hold at least the balanced "
            "share of the rows (tokens x top-k)",
            reserve_);
}

template <typename Label>
void ExpertRows::ensure(Buffer& buffer, I64 bytes, const Label& label) {
  if (!buffer.empty() && buffer.bytes() >= bytes) return;
  if (!buffer.empty()) {
    // The old rows may still be read or written by queued work on either stream.
    compute_.synchronize();
    comm_.synchronize();
    buffer.reset();
  }
  buffer = device_.allocate(std::max<I64>(bytes, 1), MemCategory::kActivations, label());
}

void ExpertRows::fit(MoeKept& kept, MoeScratch& scratch, I64 rows, I64 N, DType dtype, int layer) {
  const ExpertRowsShape& s = shape_;
  const I64 balanced = s.balanced_rows(N);
  peak_rows_ = std::max(peak_rows_, rows);
  balanced_ = std::max(balanced_, balanced);
  if (capacity_ == 0) capacity_ = s.initial_rows(N, reserve_);
  if (rows > capacity_) {
    const I64 grown = s.grown_rows(rows, N);
    spdlog::info(
        "expert parallelism: layer {}'s experts on this rank receive {} rows ({:.2f}x the "
        "balanced {}); their buffers grow from {} to {} rows (model.expert_rows_reserve, now "
        "{}, reserves rows up front)",
        layer, rows, static_cast<double>(rows) / static_cast<double>(balanced), balanced, capacity_,
        grown, reserve_);
    capacity_ = grown;
  }
  element_ = static_cast<I64>(dtype_size(dtype));
  const auto set = static_cast<std::size_t>(kept.rows_set);
  if (kept_.size() <= set) kept_.resize(set + 1);
  const auto why = [&](const char* what) {
    return [=] {
      return fmt::format(
          "expert rows {}: {} rows a layer's experts receive under expert parallelism (layer {} "
          "received {}, {:.2f}x the balanced {}; model.expert_rows_reserve {})",
          what, capacity_, layer, rows, static_cast<double>(rows) / static_cast<double>(balanced),
          balanced, reserve_);
    };
  };
  ensure(kept_[set], s.kept_bytes(capacity_, element_), why("kept"));
  ensure(scratch_, s.scratch_bytes(capacity_, element_), why("scratch"));

  // Bind the layout kept_bytes / scratch_bytes count, from each buffer's start: the rows fill
  // the capacity the buffer was last sized for, which may exceed this pass's.
  const I64 cap_c = round_up_activation(capacity_ * s.C * element_);
  const I64 cap_i = round_up_activation(capacity_ * s.I * element_);
  Bytes k = kept_[set].device<std::byte>();
  kept.xl = k;
  kept.gate = k + cap_c;
  kept.up = k + cap_c + cap_i;
  kept.h = k + cap_c + 2 * cap_i;
  Bytes r = scratch_.device<std::byte>();
  scratch.staging = r;
  scratch.yl = scratch.dyl = scratch.dxl = r + cap_c;
  scratch.dh = r + 2 * cap_c;
  scratch.dgate = r + 2 * cap_c + cap_i;
  scratch.dup = r + 2 * cap_c + 2 * cap_i;
}

void ExpertRows::settle() {
  if (capacity_ == 0) return;
  const auto label = [this](const char* what) {
    return [this, what] {
      return fmt::format(
          "expert rows {}: {} rows a layer's experts receive under expert parallelism (the "
          "busiest layer's so far; model.expert_rows_reserve {})",
          what, capacity_, reserve_);
    };
  };
  for (Buffer& b : kept_) ensure(b, shape_.kept_bytes(capacity_, element_), label("kept"));
  ensure(scratch_, shape_.scratch_bytes(capacity_, element_), label("scratch"));
}

ExpertRows::Peak ExpertRows::take_peak() {
  const Peak peak{peak_rows_, balanced_};
  peak_rows_ = 0;
  balanced_ = 0;
  return peak;
}

}  // namespace zrt::moe
