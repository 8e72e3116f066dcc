#include "runtime/checkpoint/engine_state.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt::checkpoint {

void snapshot_engine(ZeroEngine& engine, const std::vector<float*>& arrays) {
  const PartitionPlan& plan = engine.plan();
  std::int64_t at = 0;
  ZeroEngine::StateArrays unit_arrays(arrays.size());
  for (std::size_t u = 0; u < plan.units().size(); ++u) {
    for (std::size_t a = 0; a < arrays.size(); ++a) unit_arrays[a] = arrays[a] + at;
    engine.copy_state_out(static_cast<int>(u), unit_arrays);
    at += plan.unit(static_cast<int>(u)).shard;
  }
}

std::function<void()> snapshot_engine_async(ZeroEngine& engine, const std::vector<float*>& arrays,
                                            int delay_ms) {
  std::function<void()> before;
  if (delay_ms >= 0) {
    before = [delay_ms] { std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms)); };
  }
  engine.copy_state_out_async(arrays, std::move(before));
  return [&engine] { engine.wait_state_copy(); };
}

std::vector<std::vector<HostBytes>> engine_state_view(ZeroEngine& engine) {
  const std::vector<std::vector<const float*>> units = engine.host_state();
  if (units.empty()) return {};
  const PartitionPlan& plan = engine.plan();
  std::vector<std::vector<HostBytes>> arrays(static_cast<std::size_t>(engine.state_array_count()));
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::int64_t bytes = plan.unit(static_cast<int>(u)).shard * 4;
    for (std::size_t a = 0; a < arrays.size(); ++a) arrays[a].push_back({units[u][a], bytes});
  }
  return arrays;
}

HostAllocator snapshot_allocator(Device& device, const ZeroEngine& engine) {
  // Pinned for the device-resident state's DMA (none of it with full optimizer offload).
  const OffloadOptions& offload = engine.options().offload_optimizer;
  const bool pinned =
      device.type() == DeviceType::kCuda && (!offload.enabled || offload.ratio < 1.0);
  return [&device, pinned](std::int64_t bytes) {
    auto buffer = std::make_shared<Buffer>(
        device.allocate(bytes, MemCategory::kOther, "checkpoint snapshot",
                        pinned ? MemorySpace::kPinnedHost : MemorySpace::kPageableHost));
    // Shares ownership of the Buffer, points at its memory.
    return std::shared_ptr<void>(buffer, buffer->host<void>());
  };
}

void describe_engine(const ZeroEngine& engine, CheckpointIndex& index) {
  fill_tables(index, engine.params(), engine.plan());
  index.stage = engine.options().stage;
  index.compute_dtype = dtype_name(engine.options().compute_dtype);
  index.master_dtype = "float32";
  index.optimizer = engine.optimizer_spec().family;
  index.optimizer_states = engine.optimizer_spec().state_names;
  const EngineCounters c = engine.counters();
  index.optimizer_steps = c.optimizer_steps;
  index.skipped_steps = c.skipped_steps;
  index.loss_scale = c.loss_scale;
}

CheckpointIndex load_engine(const std::string& dir, ZeroEngine& engine) {
  refuse_several_groups(engine.plan(), "load");
  const std::string index_path = (std::filesystem::path(dir) / "index.h5").string();
  CheckpointIndex index = read_index(index_path, &engine.params());
  const std::string running = dtype_name(engine.options().compute_dtype);
  if (index.compute_dtype != running) {
    spdlog::warn(
        "{}: saved with compute dtype {}, resuming in {} (the fp32 master weights are "
        "exact; the first step's parameters are rounded to {})",
        index_path, index.compute_dtype, running, running);
  }
  const OptimizerSpec& running_optimizer = engine.optimizer_spec();
  if (index.optimizer != running_optimizer.family ||
      index.optimizer_states != running_optimizer.state_names) {
    const auto describe = [](const std::string& family, const std::vector<std::string>& states) {
      std::string s = family + " (state";
      for (const std::string& name : states) s += " " + name;
      return s + ")";
    };
    ZRT_THROW(InvalidArgument,
              "{}: the checkpoint holds the state of optimizer {}, but this run uses optimizer {}; "
              "resume with the optimizer it was saved with (optimizer.type), or start afresh",
              index_path, describe(index.optimizer, index.optimizer_states),
              describe(running_optimizer.family, running_optimizer.state_names));
  }
  ShardedReader reader(dir, index);
  const PartitionPlan& plan = engine.plan();
  const int rank = engine.state_rank();
  engine.load_state(
      EngineCounters{index.optimizer_steps, index.skipped_steps, index.loss_scale},
      [&](int u, const ZeroEngine::StateArrays& arrays) { reader.fill(plan, rank, u, arrays); });
  spdlog::debug("loaded {} (world {}, stage {}) as rank {} of world {}, stage {}: {} bytes read",
                dir, index.world, index.stage, rank, plan.world(), engine.options().stage,
                reader.bytes_read());
  return index;
}

}  // namespace zrt::checkpoint
