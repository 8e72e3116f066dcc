#include "runtime/checkpoint/engine_state.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/comm/mpi_runtime.h"
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

namespace {

// Whether this rank writes its slice of unit u: each unit is written by one shard group, the
// first of its replicas (hierarchical sharding of a group), and at stage 0, where every rank of
// the group holds the unit whole, by the group's first rank (one group's stage 0 and MiCS keep
// their rank < world rule in the checkpointer).
bool writes_unit(const ZeroEngine& engine, int u) {
  const ShardGroup& g = engine.groups()[static_cast<std::size_t>(engine.plan().unit(u).group)];
  if (engine.options().stage == 0) return g.shard->rank() == 0;
  return g.replicas == nullptr || g.replicas->size() <= 1 || g.replicas->rank() == 0;
}

// Several groups: the slices this rank writes, group 0's units first (the same place in every
// rank's file), then the others', each with its table rows.
RankShare describe_share(const ZeroEngine& engine, const std::vector<std::int64_t>& steps) {
  const PartitionPlan& plan = engine.plan();
  const std::vector<ParamSpec>& params = engine.params();
  RankShare share;
  share.gather = true;
  share.held = plan.total_shard();
  std::vector<std::int64_t> first;  // each unit's first element in the rank's whole state
  std::int64_t at = 0;
  for (const Unit& unit : plan.units()) {
    first.push_back(at);
    at += unit.shard;
  }
  std::int64_t file = 0;
  for (const bool dense : {true, false}) {
    for (int u = 0; u < static_cast<int>(plan.units().size()); ++u) {
      const Unit& unit = plan.unit(u);
      if ((unit.group == 0) != dense || !writes_unit(engine, u)) continue;
      WrittenSlice slice;
      slice.unit_key = params[static_cast<std::size_t>(unit.params.front())].name;
      slice.local_unit = u;
      slice.group = unit.group;
      slice.numel = unit.numel;
      slice.shard = unit.shard;
      slice.slices = plan.group_world(unit.group);
      slice.slice = engine.slice_rank(u);
      slice.offset = file;
      if (slice.slice == 0) {
        for (int p : unit.params) {
          const ParamSpec& spec = params[static_cast<std::size_t>(p)];
          slice.params.push_back(ParamEntry{spec.name, spec.shape, spec.numel(), 0,
                                            plan.placement(p).offset,
                                            steps[static_cast<std::size_t>(p)]});
        }
      }
      share.written.push_back(StateRange{first[static_cast<std::size_t>(u)], unit.shard});
      share.slices.push_back(std::move(slice));
      file += unit.shard;
    }
  }
  return share;
}

}  // namespace

void describe_engine(const ZeroEngine& engine, CheckpointIndex& index) {
  const EngineCounters c = engine.counters();
  if (engine.plan().group_count() == 1) {
    fill_tables(index, engine.params(), engine.plan());
    for (std::size_t p = 0; p < index.params.size(); ++p) {
      index.params[p].steps = c.parameter_steps[p];
    }
  } else {
    // The tables are rank 0's to assemble; the world is the checkpointer's.
    index.world = 0;
    index.params.clear();
    index.units.clear();
    index.rank_elements.clear();
    index.share = describe_share(engine, c.parameter_steps);
  }
  index.stage = engine.options().stage;
  index.compute_dtype = dtype_name(engine.options().compute_dtype);
  index.master_dtype = "float32";
  index.optimizer = engine.optimizer_spec().family;
  index.optimizer_states = engine.optimizer_spec().state_names;
  index.optimizer_steps = c.optimizer_steps;
  index.skipped_steps = c.skipped_steps;
  index.loss_scale = c.loss_scale;
}

CheckpointIndex load_engine(const std::string& dir, ZeroEngine& engine, MPI_Comm ranks,
                            double timeout_s) {
  const std::string index_path = (std::filesystem::path(dir) / "index.h5").string();
  // By name: with expert parallelism a rank holds only its experts, whatever experts the ranks
  // that saved held, stacked or one parameter each (param_match.h).
  CheckpointIndex index;
  ParamSources sources;
  std::exception_ptr mismatch;  // this rank cannot read the index, or its parameters do not fit
  try {
    index = read_index(index_path);
    sources = find_params(index, engine.params(), index_path);
  } catch (const Error&) {
    mismatch = std::current_exception();
  }
  // Every parameter of the checkpoint must be held by some rank; with one group each rank holds
  // the whole model, with several the ranks' parts are put together, and a rank whose experts
  // do not fit stops every rank (the others would wait in the load's collectives).
  std::vector<unsigned char> held(index.params.size() + 1, 0);
  for (const std::vector<ParamSource>& runs : sources) {
    for (const ParamSource& run : runs) held[static_cast<std::size_t>(run.row)] = 1;
  }
  held.back() = mismatch ? 1 : 0;
  if (engine.plan().group_count() > 1) {
    // Nonblocking and polled: a rank that died or hangs ends the others with a Timeout.
    std::vector<unsigned char> all(held.size());
    MPI_Request request;
    ZRT_MPI_CHECK(MPI_Iallreduce(held.data(), all.data(), static_cast<int>(held.size()),
                                 MPI_UNSIGNED_CHAR, MPI_MAX, ranks, &request));
    wait_mpi_request(request, {timeout_s, PollPace::kBackoff, nullptr}, [&] {
      return fmt::format(
          "{}: the ranks did not agree on what they load within {} s (a rank "
          "died or hangs)",
          index_path, timeout_s);
    });
    held = std::move(all);
  }
  if (mismatch) std::rethrow_exception(mismatch);
  if (held.back() != 0) {
    ZRT_THROW(InvalidArgument,
              "{}: the checkpoint does not hold the parameters of another rank of this run (that "
              "rank's error names them)",
              index_path);
  }
  held.pop_back();
  const auto missing = std::count(held.begin(), held.end(), 0);
  if (missing > 0) {
    const auto q = static_cast<std::size_t>(std::find(held.begin(), held.end(), 0) - held.begin());
    ZRT_THROW(InvalidArgument,
              "{}: the checkpoint's parameter '{}' is held by no rank of this run ({} of its {} "
              "parameters are not: another model, or experts this run does not have?)",
              index_path, index.params[q].name, missing, index.params.size());
  }
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
  // Each parameter's own step count, from its first row (an expert stacked in one row or a row
  // per expert: the same count); an index without the counts: the run's count for every one.
  EngineCounters counters{index.optimizer_steps, index.skipped_steps, index.loss_scale, {}};
  for (const std::vector<ParamSource>& runs : sources) {
    const std::int64_t steps =
        runs.empty() ? -1 : index.params[static_cast<std::size_t>(runs.front().row)].steps;
    counters.parameter_steps.push_back(steps < 0 ? index.optimizer_steps : steps);
  }
  ShardedReader reader(dir, index, std::move(sources));
  const PartitionPlan& plan = engine.plan();
  engine.load_state(counters, [&](int u, const ZeroEngine::StateArrays& arrays) {
    reader.fill(plan, engine.slice_rank(u), u, arrays);
  });
  spdlog::debug("loaded {} (world {}, stage {}) as rank {} of world {}, stage {}: {} bytes read",
                dir, index.world, index.stage, engine.state_rank(), plan.world(),
                engine.options().stage, reader.bytes_read());
  return index;
}

}  // namespace zrt::checkpoint
