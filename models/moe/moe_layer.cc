#include "models/moe/moe_layer.h"

#include <cmath>

#include "kernels/ops.h"
#include "models/moe/expert_rows.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

namespace zrt::moe {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

k::Ints ints(Bytes p) {
  return p.as<std::int32_t>();
}

// A tile's share of the forward's rows: the z-loss is a mean over the forward's rows.
float tile_share(const MoeTile* tile, int N) {
  return tile != nullptr
             ? static_cast<float>(static_cast<double>(N) / static_cast<double>(tile->forward_rows))
             : 1.0f;
}

}  // namespace

void MoeLayer::choose_experts(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                              MoeKept& kept, Bytes x, int N) const {
  const auto& s = shape_;
  k::linear_forward(ctx, dt, kept.logits, x, p.router, Bytes(), N, s.C, s.E);
  k::moe_router_forward(ctx, dt, kept.probs, kept.weights, ints(kept.experts), kept.logits, N, s.E,
                        s.k, s.renormalize);
}

void MoeLayer::route(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
                     MoeScratch& scratch, Bytes x, int N, const MoeTile* tile) const {
  const auto& s = shape_;
  choose_experts(ctx, dt, p, kept, x, N);
  kept.dropped = 0;
  // Dropless, the router's choices are dispatched as they are.
  if (s.capacity_factor > 0) apply_capacity(ctx, kept, N, tile);
  const Bytes routed = s.capacity_factor > 0 ? kept.routed : kept.experts;
  k::moe_dispatch_plan(ctx, ints(scratch.counts), ints(scratch.offsets), ints(kept.row_of),
                       ints(scratch.source), ints(routed), N, s.k, s.E);
  // The one host synchronisation of the layer: the grouped GEMMs take the offsets on the host.
  kept.offsets.assign(static_cast<std::size_t>(s.E) + 1, 0);
  ctx.device().copy_to_host(kept.offsets.data(), scratch.offsets, kept.offsets.size() * 4,
                            ctx.stream());
  ctx.stream().synchronize();
}

void MoeLayer::apply_capacity(kernels::KernelContext& ctx, MoeKept& kept, int N,
                              const MoeTile* tile) const {
  const auto& s = shape_;
  const I64 pairs = I64{N} * s.k;
  // Without a plan the call's rows are the whole forward, in order.
  MoeCapacity whole{pairs, N, std::vector<I64>(static_cast<std::size_t>(s.E), 0),
                    std::vector<I64>(static_cast<std::size_t>(s.E), 0)};
  MoeCapacity& plan = tile != nullptr && tile->capacity != nullptr ? *tile->capacity : whole;
  const I64 first_row = tile != nullptr ? tile->first_row : 0;
  const I64 capacity = static_cast<I64>(
      std::ceil(s.capacity_factor * static_cast<double>(plan.forward_pairs) / s.E));
  ZRT_CHECK(plan.rows_per_run > 0 && plan.ahead.size() == plan.taken.size() &&
                plan.ahead.size() % static_cast<std::size_t>(s.E) == 0,
            "a capacity plan of {} values ahead and {} taken for {} experts, runs of {} rows",
            plan.ahead.size(), plan.taken.size(), s.E, plan.rows_per_run);
  const I64 runs = static_cast<I64>(plan.ahead.size()) / s.E;
  ZRT_CHECK((first_row + N - 1) / plan.rows_per_run < runs,
            "rows {}..{} past the capacity plan's {} runs of {}", first_row, first_row + N - 1,
            runs, plan.rows_per_run);
  std::vector<std::int32_t> experts(static_cast<std::size_t>(pairs));
  ctx.device().copy_to_host(experts.data(), kept.experts, experts.size() * 4, ctx.stream());
  ctx.stream().synchronize();
  for (I64 pair = 0; pair < pairs; ++pair) {
    std::int32_t& e = experts[static_cast<std::size_t>(pair)];
    const I64 run = (first_row + pair / s.k) / plan.rows_per_run;
    const auto at = static_cast<std::size_t>(run * s.E + e);
    if (plan.ahead[at] + plan.taken[at]++ >= capacity) {
      e = -1;
      ++kept.dropped;
    }
  }
  ctx.device().copy_to_device(kept.routed, experts.data(), experts.size() * 4, ctx.stream());
  ctx.stream().synchronize();  // `experts` is a host local
}

void MoeLayer::count_choices(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                             MoeKept& kept, Bytes x, int N, std::int64_t first_row,
                             std::int64_t rows_per_run, std::vector<std::int64_t>& counts) const {
  const auto& s = shape_;
  choose_experts(ctx, dt, p, kept, x, N);
  std::vector<std::int32_t> experts(static_cast<std::size_t>(I64{N} * s.k));
  ctx.device().copy_to_host(experts.data(), kept.experts, experts.size() * 4, ctx.stream());
  ctx.stream().synchronize();
  for (std::size_t pair = 0; pair < experts.size(); ++pair) {
    const I64 run = (first_row + static_cast<I64>(pair) / s.k) / rows_per_run;
    const auto at = static_cast<std::size_t>(run * s.E + experts[pair]);
    ZRT_CHECK(at < counts.size(), "row {} of a capacity pre-pass past its {} counts",
              first_row + static_cast<I64>(pair) / s.k, counts.size());
    ++counts[at];
  }
}

void MoeLayer::swiglu_experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                                      Bytes x, Bytes gate, Bytes up, Bytes h, Bytes y,
                                      const std::vector<std::int32_t>& offsets, int experts) const {
  const auto& s = shape_;
  const I64 stride = p.gate_up_stride > 0 ? p.gate_up_stride : 2 * I64{s.I} * s.C;
  const I64 rows = offsets.back();
  const Bytes up_weight = p.gate_up + I64{s.I} * s.C * static_cast<I64>(dtype_size(dt));
  k::grouped_linear_forward(ctx, dt, gate, x, p.gate_up, offsets, experts, s.C, s.I, stride);
  k::grouped_linear_forward(ctx, dt, up, x, up_weight, offsets, experts, s.C, s.I, stride);
  k::swiglu_forward(ctx, dt, h, gate, up, rows * s.I);
  k::grouped_linear_forward(ctx, dt, y, h, p.down, offsets, experts, s.I, s.C, p.down_stride);
}

void MoeLayer::experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                               const MoeKept& kept) const {
  swiglu_experts_forward(ctx, dt, p, kept.xe, kept.gate, kept.up, kept.h, kept.y, kept.offsets,
                         shape_.E);
}

void MoeLayer::remote_experts_forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p,
                                      MoeKept& kept, MoeScratch& scratch, int N) const {
  const auto& s = shape_;
  std::vector<I64> counts(static_cast<std::size_t>(s.E));
  for (int e = 0; e < s.E; ++e) {
    counts[static_cast<std::size_t>(e)] =
        kept.offsets[static_cast<std::size_t>(e) + 1] - kept.offsets[static_cast<std::size_t>(e)];
  }
  // Every rank of the group runs these three collectives whatever its counts (docs/reliability.md).
  kept.plan = dispatch_->plan(counts);
  // The plan says how many rows land here: the local experts' buffers are made to hold them.
  rows_->fit(kept, scratch, kept.plan.local_rows, N, dt, kept.layer);
  const int L = kept.plan.experts.local();
  kept.local_offsets.assign(static_cast<std::size_t>(L) + 1, 0);
  for (int l = 0; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    kept.local_offsets[i + 1] =
        kept.local_offsets[i] + static_cast<std::int32_t>(kept.plan.local_counts[i]);
  }
  dispatch_->dispatch(kept.plan, kept.xe, kept.xl, s.C, dt, scratch.staging);
  swiglu_experts_forward(ctx, dt, p, kept.xl, kept.gate, kept.up, kept.h, scratch.yl,
                         kept.local_offsets, L);
  dispatch_->combine(kept.plan, scratch.yl, kept.y, s.C, dt, scratch.staging);
}

void MoeLayer::forward(kernels::KernelContext& ctx, DType dt, const MoeParams& p, MoeKept& kept,
                       MoeScratch& scratch, Bytes x, Bytes out, int N, MoeRouterLoss* loss,
                       bool with_z_loss, const MoeTile* tile) const {
  const auto& s = shape_;
  route(ctx, dt, p, kept, scratch, x, N, tile);
  if (loss != nullptr) {
    k::moe_aux_stats_accumulate(ctx, loss->stats_counts, loss->stats_probsum, kept.probs,
                                ints(kept.experts), N, s.E, s.k);
    if (with_z_loss) {
      k::moe_router_z_loss_forward(ctx, dt, loss->z_scratch, kept.logits, N, s.E);
      k::moe_add_loss_term(ctx, loss->z_sum, loss->z_scratch,
                           loss->z_layer_weight * tile_share(tile, N));
    }
  }
  k::moe_gather(ctx, dt, kept.xe, x, ints(kept.row_of), N, s.k, s.C);
  if (dispatch_ != nullptr) {
    remote_experts_forward(ctx, dt, p, kept, scratch, N);
  } else {
    experts_forward(ctx, dt, p, kept);
  }
  if (out) k::moe_combine(ctx, dt, out, kept.y, kept.weights, ints(kept.row_of), N, s.k, s.C);
  if (s.Is > 0) {
    k::linear_forward(ctx, dt, kept.sgate, x, p.shared_gate_proj, Bytes(), N, s.C, s.Is);
    k::linear_forward(ctx, dt, kept.sup, x, p.shared_up_proj, Bytes(), N, s.C, s.Is);
    k::swiglu_forward(ctx, dt, kept.sh, kept.sgate, kept.sup, I64{N} * s.Is);
    k::linear_forward(ctx, dt, kept.sout, kept.sh, p.shared_down_proj, Bytes(), N, s.Is, s.C);
    k::linear_forward(ctx, dt, kept.slogit, x, p.shared_expert_gate, Bytes(), N, s.C, 1);
    if (out) k::moe_shared_gate_forward(ctx, dt, out, kept.sout, kept.slogit, N, s.C);
  }
}

void MoeLayer::swiglu_experts_backward(kernels::KernelContext& ctx, DType dt, DType gt,
                                       const MoeParams& p, const MoeParams& g, Bytes x, Bytes gate,
                                       Bytes up, Bytes h, Bytes dy, Bytes dx, MoeScratch& scratch,
                                       const std::vector<std::int32_t>& offsets,
                                       int experts) const {
  const auto& s = shape_;
  const I64 stride = p.gate_up_stride > 0 ? p.gate_up_stride : 2 * I64{s.I} * s.C;
  const I64 rows = offsets.back();
  const Bytes up_weight = p.gate_up + I64{s.I} * s.C * static_cast<I64>(dtype_size(dt));
  // (Null gradients: frozen experts, their weight-gradient GEMMs skipped.)
  const Bytes up_grad =
      g.gate_up ? g.gate_up + I64{s.I} * s.C * static_cast<I64>(dtype_size(gt)) : Bytes();
  k::grouped_linear_backward(ctx, dt, gt, scratch.dh, g.down, dy, h, p.down, offsets, experts, s.I,
                             s.C, k::GradWrite::kOverwrite, p.down_stride);
  k::swiglu_backward(ctx, dt, scratch.dgate, scratch.dup, scratch.dh, gate, up, rows * s.I);
  k::grouped_linear_backward(ctx, dt, gt, dx, g.gate_up, scratch.dgate, x, p.gate_up, offsets,
                             experts, s.C, s.I, k::GradWrite::kOverwrite, stride);
  k::grouped_linear_backward(ctx, dt, gt, dx, up_grad, scratch.dup, x, up_weight, offsets, experts,
                             s.C, s.I, k::GradWrite::kAccumulate, stride);
}

void MoeLayer::experts_backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                                const MoeParams& g, const MoeKept& kept,
                                MoeScratch& scratch) const {
  swiglu_experts_backward(ctx, dt, gt, p, g, kept.xe, kept.gate, kept.up, kept.h, scratch.dy,
                          scratch.dxe, scratch, kept.offsets, shape_.E);
}

void MoeLayer::remote_experts_backward(kernels::KernelContext& ctx, DType dt, DType gt,
                                       const MoeParams& p, const MoeParams& g, const MoeKept& kept,
                                       MoeScratch& scratch) const {
  const auto& s = shape_;
  // The forward's plan: the same rows travel, the gradients in place of the values.
  dispatch_->dispatch(kept.plan, scratch.dy, scratch.dyl, s.C, dt, scratch.staging);
  // swiglu_backward adds into dgate and dup, which are not in the driver's zeroed region here.
  const std::size_t gradient_bytes =
      static_cast<std::size_t>(kept.plan.local_rows * s.I) * dtype_size(dt);
  ctx.device().fill_zero(scratch.dgate, gradient_bytes, ctx.stream());
  ctx.device().fill_zero(scratch.dup, gradient_bytes, ctx.stream());
  swiglu_experts_backward(ctx, dt, gt, p, g, kept.xl, kept.gate, kept.up, kept.h, scratch.dyl,
                          scratch.dxl, scratch, kept.local_offsets, kept.plan.experts.local());
  dispatch_->combine(kept.plan, scratch.dxl, scratch.dxe, s.C, dt, scratch.staging);
}

void MoeLayer::backward(kernels::KernelContext& ctx, DType dt, DType gt, const MoeParams& p,
                        const MoeParams& g, const MoeKept& kept, MoeScratch& scratch, Bytes x,
                        Bytes dout, Bytes dx, int N, const MoeRouterLoss& loss, bool with_z_loss,
                        const MoeTile* tile) const {
  const auto& s = shape_;
  // combine: the rows' gradients and the routing weights'.
  k::moe_combine_backward(ctx, dt, scratch.dy, scratch.dweights, dout, kept.y, kept.weights,
                          ints(kept.row_of), N, s.k, s.C);
  if (dispatch_ != nullptr) {
    remote_experts_backward(ctx, dt, gt, p, g, kept, scratch);
  } else {
    experts_backward(ctx, dt, gt, p, g, kept, scratch);
  }
  // route: the softmax's gradient from the weights and the load-balancing loss (and z-loss),
  // then the router's linear, whose input gradient is the first write of dx.
  k::moe_router_backward(ctx, dt, scratch.dlogits, scratch.dweights, kept.probs, ints(kept.experts),
                         loss.dprobs_shared, N, s.E, s.k, s.renormalize, k::GradWrite::kOverwrite);
  if (with_z_loss) {
    k::moe_router_z_loss_backward(ctx, dt, scratch.dlogits, kept.logits,
                                  loss.z_grad * loss.z_layer_weight * tile_share(tile, N), N, s.E);
  }
  k::linear_backward(ctx, dt, gt, dx, g.router, Bytes(), scratch.dlogits, x, p.router, N, s.C, s.E,
                     k::GradWrite::kOverwrite);
  // permute: each token's rows back onto it.
  k::moe_gather_backward(ctx, dt, dx, scratch.dxe, ints(kept.row_of), N, s.k, s.C);
  if (s.Is > 0) {
    k::moe_shared_gate_backward(ctx, dt, scratch.ds, scratch.dslogit, dout, kept.sout, kept.slogit,
                                N, s.C);
    k::linear_backward(ctx, dt, gt, dx, g.shared_expert_gate, Bytes(), scratch.dslogit, x,
                       p.shared_expert_gate, N, s.C, 1);
    k::linear_backward(ctx, dt, gt, scratch.dsh, g.shared_down_proj, Bytes(), scratch.ds, kept.sh,
                       p.shared_down_proj, N, s.Is, s.C, k::GradWrite::kOverwrite);
    k::swiglu_backward(ctx, dt, scratch.dsgate, scratch.dsup, scratch.dsh, kept.sgate, kept.sup,
                       I64{N} * s.Is);
    k::linear_backward(ctx, dt, gt, dx, g.shared_gate_proj, Bytes(), scratch.dsgate, x,
                       p.shared_gate_proj, N, s.C, s.Is);
    k::linear_backward(ctx, dt, gt, dx, g.shared_up_proj, Bytes(), scratch.dsup, x,
                       p.shared_up_proj, N, s.C, s.Is);
  }
}

}  // namespace zrt::moe
