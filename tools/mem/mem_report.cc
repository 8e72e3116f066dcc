#include "tools/mem/mem_report.h"

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/common/dtype.h"
#include "runtime/engine/engine_parallel_dims.h"

namespace zrt::mem {

namespace {

std::int64_t capacity_bytes(const Inputs& in) {
  return static_cast<std::int64_t>(std::llround(in.device_gib * 1073741824.0));
}

std::string opt_gb(const std::optional<std::int64_t>& bytes) {
  return bytes ? gb(*bytes) : "-";
}

std::vector<Estimate> with_checkpointing(std::vector<Estimate> estimates, bool on) {
  for (Estimate& e : estimates) e.checkpointing = on;
  return estimates;
}

const Estimate* find(const std::vector<Estimate>& estimates, const Setting& s) {
  for (const Estimate& e : estimates) {
    if (e.setting == s) return &e;
  }
  return nullptr;
}

}  // namespace

std::string gb(std::int64_t bytes) {
  return fmt::format("{:.1f}", static_cast<double>(bytes) / 1e9);
}

std::string format_verdict(const Inputs& in, const std::vector<Estimate>& estimates) {
  const std::int64_t capacity = capacity_bytes(in);
  const std::string device = fmt::format("{:g} GiB ({} GB)", in.device_gib, gb(capacity));
  const bool ckpt = in.activation_checkpointing;
  const bool has_acts = !estimates.empty() && estimates.front().activations_full.has_value();
  if (const auto fit = first_fit(estimates, capacity)) {
    const Estimate* e = find(estimates, *fit);
    std::string line = fmt::format(
        "verdict: {} fits a {} device: {} GB per rank{}", in.name(*fit), device,
        gb(e->device_total()),
        has_acts ? (ckpt ? ", with activation checkpointing" : ", without activation checkpointing")
                 : " (model state and buffers; no activations without a model)");
    // Between stage 3 and its full optimizer offload: the most state the device can keep.
    if (const auto ratio = smallest_fitting_ratio(in, capacity); ratio && *ratio < 1.0) {
      Inputs partial = in;
      partial.engine.offload_optimizer.ratio = *ratio;
      line += fmt::format(
          "; at stage 3, partial optimizer offload fits from offload_optimizer.ratio {:g} ({} GB "
          "per rank): the device steps the rest of the state",
          *ratio, gb(estimate(partial, Setting{3, true, false}).device_total()));
    }
    return line;
  }
  std::string line = fmt::format("verdict: no setting fits a {} device", device);
  if (has_acts && !ckpt) {
    const auto alt = with_checkpointing(estimates, true);
    if (const auto fit = first_fit(alt, capacity)) {
      line += fmt::format("; with activation checkpointing {} fits ({} GB per rank)", in.name(*fit),
                          gb(find(alt, *fit)->device_total()));
      return line;
    }
  }
  return line + "; use more ranks, a smaller micro-batch or sequence, or a bigger device";
}

std::string format_report(const Inputs& in, const Estimate& chosen,
                          const std::vector<Estimate>& estimates) {
  const EngineOptions& o = in.engine;
  // The layout of the setting printed in detail (the shares its rows name).
  ParallelDims chosen_dims = parallel_dims(o, in.world, in.ranks_per_node());
  chosen_dims.stage = chosen.setting.stage;
  std::string out;
  const std::string what =
      in.model ? in.model->description
               : fmt::format("{:.4g}B parameters (ZeRO formulas: no padding, no activations)",
                             in.params / 1e9);
  out += fmt::format("zrt-mem: {}\n", what);
  out += fmt::format(
      "  {} ranks on {} node(s) ({} per node); {} compute, {} gradient accumulation, {} "
      "communication\n",
      in.world, in.nodes, in.ranks_per_node(), dtype_name(o.compute_dtype),
      dtype_name(o.grad_accum_dtype), dtype_name(o.communication_dtype.value_or(o.compute_dtype)));
  out += fmt::format("  optimizer {}: {} bytes of fp32 state per parameter (master weight + {})\n",
                     in.optimizer.family, in.optimizer.state_bytes_per_parameter(),
                     in.optimizer.state_description);
  if (in.model && in.model->def) {
    const int sp = in.engine.sequence_parallel_size;
    out += fmt::format(
        "  micro-batch {} x {} tokens{}; activation checkpointing {}\n", in.micro_batch, in.seq_len,
        sp > 1 ? fmt::format(" in {} chunks of {} (sequence_parallel_size)", sp, in.seq_len / sp)
               : "",
        in.activation_checkpointing
            ? (in.cpu_checkpointing ? "on, block inputs in host memory" : "on")
            : "off");
    // The tiled operations (model.tiling): how many rows a tile takes and how many tiles a
    // forward runs; each is computed again in the backward.
    const int rows = in.micro_batch * (in.seq_len / sp);
    const ModelDef::TileRows tiles =
        in.model->def->tile_rows(in.micro_batch, in.seq_len / sp, o.compute_dtype,
                                 in.model_options(in.activation_checkpointing));
    std::vector<std::string> parts;
    const auto part = [&](const char* what, int tile) {
      if (tile <= 0) return;
      parts.push_back(tile >= rows ? fmt::format("{} whole", what)
                                   : fmt::format("{} {} rows ({} tiles)", what, tile,
                                                 (rows + tile - 1) / tile));
    };
    part("head", tiles.head);
    part("MLP", tiles.mlp);
    part("MoE layers", tiles.moe);
    if (!parts.empty()) {
      out += fmt::format("  tiles of the {} rows a pass (model.tiling): {}\n", rows,
                         fmt::join(parts, ", "));
    }
  }
  const int ep = o.expert_parallel_size;
  if (ep > 1 && in.model && in.model->def) {
    // A rank's engine holds the dense parameters and its 1/ep of the experts (their own units).
    const std::int64_t dense = chosen.padded_params - chosen.expert_padded_params;
    const ParallelDims& dims = chosen_dims;
    const std::string expert_slices =
        dims.uses_mics()
            ? fmt::format(
                  "{} rank(s) of its expert-data-parallel group of {} (MiCS: the group's "
                  "ranks in a shard group)",
                  dims.expert_shard_world(), dims.expert_data_parallel_size())
            : fmt::format("its expert-data-parallel group of {} rank(s)",
                          dims.expert_data_parallel_size());
    out += fmt::format(
        "  Ψ = {} parameters; a rank holds {} of them ({} with padding): the dense ones ({} "
        "padded, sliced over {} ranks) and 1/{} of every MoE layer's experts ({} padded, sliced "
        "over {}); GB = 10^9 bytes\n",
        in.model->def->num_parameters(), chosen.content_params, chosen.padded_params, dense,
        dims.shard_world(), ep, chosen.expert_padded_params, expert_slices);
    out += fmt::format(
        "  expert parallelism (expert_parallel.autoep_size {}): the rows this rank's experts "
        "receive, counted at {} x the balanced share (tokens x k{}): {} bytes in the activations "
        "over autoep_size 1's, and {} bytes of count vectors (comm). The buffers grow when a "
        "step's routing sends more (metrics.jsonl expert_rows_load); the dropless worst case "
        "(every "
        "rank of the group routing each token's pairs here: {} x tokens x min(k, E/{}) rows) would "
        "add {} bytes\n",
        ep, in.expert_rows > 0 ? "a given capacity" : fmt::format("{:g}", in.expert_rows_reserve),
        in.expert_rows > 0 ? fmt::format("; {} rows", in.expert_rows)
                           : std::string("; model.expert_rows_reserve"),
        chosen.dispatch_activations, chosen.dispatch_comm, ep, ep, chosen.dispatch_worst_extra);
  } else {
    out += fmt::format("  Ψ = {} parameters ({} with padding); GB = 10^9 bytes\n",
                       chosen.content_params, chosen.padded_params);
  }
  if (chosen.frozen_params > 0) {
    out += fmt::format(
        "  frozen ({}): {} of them ({:.1f}%), without optimizer state, gradient slices or full "
        "gradients\n",
        in.model->trainable.empty() ? "model.frozen" : "model.trainable", chosen.frozen_params,
        100.0 * static_cast<double>(chosen.frozen_params) /
            static_cast<double>(chosen.content_params));
  }
  if (in.model && in.model->def &&
      in.model->def->num_active_parameters() != in.model->def->num_parameters()) {
    // A mixture of experts: the engine holds every expert's state; a token computes with fewer.
    out += fmt::format(
        "  {} active per token (the experts a token is routed to; MFU counts these), {} held "
        "in the model state above\n",
        in.model->def->num_active_parameters(),
        ep > 1 ? fmt::format("this rank's {}", chosen.content_params)
               : fmt::format("all {}", chosen.content_params));
  }
  out += "\n";

  out += fmt::format("{} — per-rank device memory\n", in.name(chosen.setting));
  auto row = [&](const std::string& name, const std::string& value, const std::string& note) {
    out += fmt::format("  {:<34} {:>9} GB  {}\n", name, value, note);
  };
  const int n = chosen_dims.shard_world();
  row("params (compute dtype)", gb(chosen.params),
      chosen.setting.stage < 3 ? "full" : (chosen.setting.offload_param ? "offloaded" : "1/N"));
  // One micro-batch per step with optimizer offload: the offloaded units' reduced slices go
  // to the host as they are (offload_takes_reduced_slices).
  const bool full_grads = !chosen.gradient_buckets;
  const char* grads_note = full_grads && chosen.frozen_params > 0
                               ? "full (trained units), accumulation dtype"
                           : full_grads && chosen.setting.stage >= 2
                               ? "full, accumulation dtype (one rank: nothing to reduce)"
                           : full_grads                         ? "full, accumulation dtype"
                           : chosen.setting.offload_param       ? "offloaded"
                           : !chosen.grads_offloaded_as_reduced ? "1/N"
                           : chosen.grads == 0 ? "offloaded as reduced (one micro-batch per step)"
                                               : "1/N, the units not offloaded";
  row("grads", gb(chosen.grads), grads_note);
  // Optimizer offload: all of the fp32 state in host memory, or the device's share of it
  // (partial offload, offload_optimizer.ratio).
  // Under expert parallelism the experts' slices are 1/(world/ep) of theirs (under MiCS 1/(their
  // ranks in a shard group)).
  const std::string share =
      ep > 1 ? fmt::format("1/{} dense, 1/{} experts", n, chosen_dims.expert_shard_world())
             : fmt::format("1/{}", n);
  const std::string state_note = !chosen.setting.offload_optimizer ? share
                                 : chosen.master == 0              ? std::string("offloaded")
                                                      : share + ", the part not offloaded";
  row("master weights (fp32)", gb(chosen.master), state_note);
  const std::string optimizer_row =
      fmt::format("optimizer ({}, fp32)", in.optimizer.state_description);
  row(optimizer_row, gb(chosen.optimizer), state_note);
  row("model state", gb(chosen.model_state()), "the ZeRO paper's figure");
  row("buffers: gradient buckets", gb(chosen.buckets_peak),
      chosen.gradient_buckets || chosen.setting.stage < 2 ? "peak"
      : chosen.buckets_peak == 0
          ? "none: one rank accumulates full gradients"
          : "peak (frozen units' only: one rank accumulates full gradients)");
  row("buffers: gathered parameters", gb(chosen.gathered_peak),
      !chosen.gathered_in_place ? "peak (stage 3)"
      : chosen.gathered_peak == 0
          ? "none: a group of one rank reads its slices in place"
          : "peak (stage 3; a group of one rank reads its slices in place)");
  if (const int hpz = in.hpz(chosen.setting); hpz > 0) {
    row("buffers: hpZ secondary shards", gb(chosen.secondary_peak),
        fmt::format("peak, 1/{} of each gathered unit (forward to backward)", hpz));
  }
  row("buffers: comm scratch + workspace", gb(chosen.comm + chosen.workspace), "");
  if (ep > 1) {
    row("  of which dispatch counts", gb(chosen.dispatch_comm),
        fmt::format("{} bytes", chosen.dispatch_comm));
  }
  if (chosen.kernel_workspace > 0) {
    row("buffers: kernel workspace", gb(chosen.kernel_workspace),
        in.device_type == DeviceType::kCpu ? "the attention's (CPU kernels)"
                                           : "the attention's, cuBLASLt's");
  }
  if (in.engine.quantized_weights || in.engine.quantized_gradients) {
    row("  of which ZeRO++ (qwZ / qgZ)", gb(chosen.quantized_comm),
        fmt::format("{} bytes: quantized collectives' scratch, qgZ's output slice",
                    chosen.quantized_comm));
  }
  const bool has_acts = chosen.activations_full.has_value();
  row("activations, no checkpointing", opt_gb(chosen.activations_full),
      !has_acts ? "needs a model" : (in.activation_checkpointing ? "" : "<- in the total"));
  row("activations, checkpointing", opt_gb(chosen.activations_checkpointed),
      !has_acts ? "" : (in.activation_checkpointing ? "<- in the total" : ""));
  if (ep > 1 && has_acts) {
    row("  of which expert dispatch", gb(chosen.dispatch_activations),
        fmt::format("{} bytes over autoep_size 1's, in the total's", chosen.dispatch_activations));
  }
  row("device total (peak)", gb(chosen.device_total()),
      fmt::format("of {:g} GiB ({} GB); {} bytes", in.device_gib,
                  gb(static_cast<std::int64_t>(std::llround(in.device_gib * 1073741824.0))),
                  chosen.device_total()));
  out += fmt::format("per-node host memory ({} ranks)\n", in.ranks_per_node());
  const int per_node = chosen.ranks_per_node;
  const CategoryBytes& h = chosen.host_per_rank;
  row("params (offloaded slices)", gb(at(h, MemCategory::kParams) * per_node), "");
  row("grads (offloaded slices)", gb(at(h, MemCategory::kGrads) * per_node), "");
  row("master weights (fp32)", gb(at(h, MemCategory::kMaster) * per_node), "");
  row(optimizer_row, gb(at(h, MemCategory::kOptimizer) * per_node), "");
  row("staging buffers", gb(at(h, MemCategory::kWorkspace) * per_node),
      "offload staging, token staging");
  if (at(h, MemCategory::kActivations) > 0) {
    row("activations (checkpointed block inputs)", gb(at(h, MemCategory::kActivations) * per_node),
        "cpu_checkpointing, pinned");
  }
  row("host total", gb(chosen.host_node_total()), "");

  out += "\nevery setting, GB per rank (host: per node)\n";
  out += fmt::format("  {:<42} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8}  {}\n",
                     "setting", "params", "grads", "master", "optim", "model", "buffers", "act",
                     "act ckpt", "device", "host", "fits");
  for (const Estimate& e : estimates) {
    out +=
        fmt::format("  {:<42} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8}  {}\n",
                    in.name(e.setting), gb(e.params), gb(e.grads), gb(e.master), gb(e.optimizer),
                    gb(e.model_state()), gb(e.buffers()), opt_gb(e.activations_full),
                    opt_gb(e.activations_checkpointed), gb(e.device_total()),
                    gb(e.host_node_total()), e.device_total() <= capacity_bytes(in) ? "yes" : "no");
  }
  out +=
      "  (model = params + grads + master + optim; device = model + buffers + the activations "
      "in use)\n\n";
  out += format_verdict(in, estimates) + "\n";
  return out;
}

}  // namespace zrt::mem
