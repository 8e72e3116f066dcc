// Shared set-up for engine tests: an engine over TiedMlp on the CPU backend, deterministic
// data, and a plain single-process reference trainer (full fp32 parameters, gradients of the
// global batch computed rank by rank with the same model code, AdamW written out in double).
#pragma once

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "offload/cpu_optimizer_offload.h"
#include "optimizers/device_adam.h"
#include "optimizers/device_lion.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/topology.h"
#include "runtime/engine/zero_engine.h"
#include "tests/engine/tied_mlp.h"

namespace zrt::test {

constexpr int kD = 13;
constexpr int kH = 24;
constexpr int kRows = 3;  // rows per rank per micro-batch

inline float data_value(int step, std::int64_t row, int col, int which) {
  std::uint64_t x = (static_cast<std::uint64_t>(step) << 40) ^
                    (static_cast<std::uint64_t>(row) << 16) ^ static_cast<std::uint64_t>(col) ^
                    (static_cast<std::uint64_t>(which) << 60);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
}

// Rows [first, first + rows) of step `step`'s global batch: inputs (which 0) or targets (1).
inline std::vector<float> batch(int step, std::int64_t first, int rows, int which, int d = kD) {
  std::vector<float> out(static_cast<std::size_t>(rows * d));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) out[r * d + c] = data_value(step, first + r, c, which);
  return out;
}

// The engine settings the engine tests share: clipping active (the test gradients' norm is
// larger than 0.05), several buckets, the biases resident at stage 3, prefetch of a unit or two.
inline EngineOptions test_engine_options(int stage, int accumulation) {
  EngineOptions o;
  o.stage = stage;
  o.gradient_accumulation_steps = accumulation;
  o.gradient_clipping = 0.05;
  o.reduce_bucket_size = 600;
  o.stage3_param_persistence_threshold = 30;
  o.stage3_prefetch_bucket_size = 700;
  o.stage3_max_live_parameters = 2000;
  return o;
}

struct TrainSpec {
  int steps = 10;
  int accumulation = 1;
  double lr = 1e-2;
  double weight_decay = 0.1;
  double clip = 0.0;
  bool lion = false;  // Lion (betas 0.9, 0.99) instead of AdamW, with the same lr and decay
  // Hierarchical sharding (MiCS / HSDP): state sliced over shard groups of this many
  // consecutive ranks and replicated across them; 0: over every rank.
  int shard_size = 0;
  // ZeRO++ (options.quantized_weights / quantized_gradients): nodes of this many ranks for the
  // quantized collectives' hierarchy (0: one node), and their block size.
  int ranks_per_node = 0;
  std::int64_t quantization_block = 64;
  // ZeRO++ hpZ (options.hpz_partition_size > 1): the engine gets this rank's group of that many
  // consecutive ranks; with ranks_per_node > 0 the world's node map is set first, so the byte
  // counters split the traffic by node.
  bool recompute = false;   // TiedMlp's activation checkpointing (Phase::kRecompute)
  std::vector<int> frozen;  // parameters marked ParamSpec::frozen (model.frozen), by index
};

// Across real hosts (tests/multinode/run_across_hosts.sh sets ZRT_EXPECT_NODES) the engine
// tests take the node layout from MPI (NodeTopology::detect, no override): the layout they
// simulate on one machine is then what the hosts really are, and the byte counters split by it.
inline bool nodes_from_mpi() {
  return std::getenv("ZRT_EXPECT_NODES") != nullptr;
}

// The world's node layout: detected across hosts (and checked against ZRT_EXPECT_NODES),
// otherwise nodes of `simulated_ranks_per_node` consecutive ranks. Collective.
inline NodeTopology test_topology(int simulated_ranks_per_node) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (!nodes_from_mpi()) return NodeTopology(world, simulated_ranks_per_node);
  NodeTopology topo = NodeTopology::detect(MPI_COMM_WORLD);
  const int expected = std::atoi(std::getenv("ZRT_EXPECT_NODES"));
  ZRT_CHECK(topo.node_count() == expected,
            "ZRT_EXPECT_NODES={} but MPI reports {} (every rank on one host?)", expected,
            topo.describe());
  return topo;
}

struct EngineRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> compute;
  std::unique_ptr<Stream> comm;
  std::unique_ptr<ProcessGroup> group;         // every rank: the data-parallel world
  std::unique_ptr<ProcessGroup> shards;        // shard_size > 0: this rank's shard group
  std::unique_ptr<ProcessGroup> replicas;      // shard_size > 0: the same slice's other holders
  std::unique_ptr<ProcessGroup> intra, inter;  // ZeRO++ with ranks_per_node > 0
  std::unique_ptr<ProcessGroup> secondary;     // hpZ: this rank's secondary-shard group
  std::unique_ptr<QuantizedCollectives> quantized;  // ZeRO++
  std::unique_ptr<DeviceOptimizer> optimizer;
  std::unique_ptr<ZeroEngine> engine;
  TiedMlp model{kD, kH};
  std::vector<StepResult> results;
};

inline std::unique_ptr<EngineRun> make_engine(const EngineOptions& options, const TrainSpec& spec,
                                              DeviceOptions device_options = {},
                                              CommOptions comm_options = {},
                                              TiedMlp model = TiedMlp(kD, kH)) {
  auto run = std::make_unique<EngineRun>();
  run->model = model;
  run->device = make_device(device_options);
  run->compute = run->device->create_stream("compute");
  run->comm = run->device->create_stream("comm");
  run->group = make_process_group(*run->device, MPI_COMM_WORLD, *run->comm, "engine", comm_options);
  ProcessGroup* sharding = run->group.get();
  if (nodes_from_mpi()) run->group->set_node_map(test_topology(0).node_map());
  if (spec.shard_size > 0) {
    const int world = run->group->size(), rank = run->group->rank();
    // A shard group per node, as MiCS lays them out: its gathers and reductions stay inside
    // the node, and the byte counters say so (across hosts: the real nodes).
    if (!nodes_from_mpi()) {
      run->group->set_node_map(NodeTopology(world, spec.shard_size).node_map());
    }
    run->shards = make_subgroup(*run->group, shard_plan(world, spec.shard_size, rank), *run->comm,
                                "engine-shards");
    run->replicas = make_subgroup(*run->group, replica_plan(world, spec.shard_size, rank),
                                  *run->comm, "engine-replicas");
    sharding = run->shards.get();
  }
  if (spec.ranks_per_node > 0 && spec.shard_size == 0) {
    run->group->set_node_map(NodeTopology(run->group->size(), spec.ranks_per_node).node_map());
  }
  if (options.hpz_partition_size > 1) {
    run->secondary = make_subgroup(
        *run->group, shard_plan(run->group->size(), options.hpz_partition_size, run->group->rank()),
        *run->comm, "engine-hpz");
  }
  run->model.set_recompute(spec.recompute);
  if (spec.lion) {
    LionOptions lion;
    lion.lr = spec.lr;
    lion.weight_decay = spec.weight_decay;
    run->optimizer = make_device_lion(*run->device, lion);
  } else {
    AdamOptions adam;
    adam.lr = spec.lr;
    adam.weight_decay = spec.weight_decay;
    run->optimizer = make_device_adam(*run->device, adam);
  }
  if (options.quantized_weights || options.quantized_gradients) {
    if (spec.ranks_per_node > 0 || nodes_from_mpi()) {
      const int n = sharding->size(), r = sharding->rank();
      if (!nodes_from_mpi()) {
        sharding->set_node_map(NodeTopology(n, spec.ranks_per_node).node_map());
      }
      run->intra = make_subgroup(*sharding, intra_node_plan(sharding->node_map(), r), *run->comm,
                                 "engine-intra");
      run->inter = make_subgroup(*sharding, inter_node_plan(sharding->node_map(), r), *run->comm,
                                 "engine-inter");
    }
    run->quantized = std::make_unique<QuantizedCollectives>(
        *run->device, *sharding, run->intra.get(), run->inter.get(), spec.quantization_block);
  }
  std::vector<ParamSpec> params = run->model.parameters();
  for (int p : spec.frozen) params.at(static_cast<std::size_t>(p)).frozen = true;
  run->engine = std::make_unique<ZeroEngine>(*run->device, *run->compute, *sharding, params,
                                             run->model.modules(), options, *run->optimizer,
                                             make_cpu_optimizer_offload, run->replicas.get(),
                                             run->quantized.get(), run->secondary.get());
  run->engine->initialize([](int p, std::int64_t first, std::int64_t count, float* out) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = TiedMlp::init_value(p, first + i);
  });
  return run;
}

// One optimizer step of `spec.accumulation` micro-batches of this rank's rows; the result is
// appended to run.results. `before_step`, if set, runs after the last micro-batch's backward is
// enqueued and before step() (an eval pass there).
inline void train_one_step(EngineRun& run, const TrainSpec& spec, int step,
                           const std::function<void()>& before_step = {}) {
  const int rank = run.group->rank();
  const int world = run.group->size();
  std::vector<std::vector<float>> keep;  // inputs live until the stream has used them
  float loss = 0.f;
  for (int g = 0; g < spec.accumulation; ++g) {
    const std::int64_t first = (static_cast<std::int64_t>(g) * world + rank) * kRows;
    keep.push_back(batch(step, first, kRows, 0, run.model.d()));
    keep.push_back(batch(step, first, kRows, 1, run.model.d()));
    run.model.forward_backward(*run.engine, *run.compute, keep[keep.size() - 2].data(),
                               keep.back().data(), kRows, run.engine->loss_scale(), &loss);
  }
  if (before_step) before_step();
  run.results.push_back(run.engine->step(spec.lr));
  run.compute->synchronize();
}

// Trains `spec.steps` steps; returns every parameter's final fp32 value. `after_step`, if set,
// runs after each step (the byte counters' per-step readings).
inline std::vector<std::vector<float>> train_engine(EngineRun& run, const TrainSpec& spec,
                                                    const std::function<void()>& after_step = {}) {
  for (int step = 0; step < spec.steps; ++step) {
    train_one_step(run, spec, step);
    if (after_step) after_step();
  }
  std::vector<std::vector<float>> out;
  for (int p = 0; p < static_cast<int>(run.model.parameters().size()); ++p) {
    out.push_back(run.engine->full_parameter(p));
  }
  return out;
}

// AdamW (torch.optim.AdamW's formula, betas 0.9/0.999, eps 1e-8) in double on fp32 state:
// the reference loops' optimizer. grads are scaled by coef first; `step` counts from 1.
template <typename Grad>
void reference_adamw(std::vector<std::vector<float>>& p, std::vector<std::vector<float>>& m,
                     std::vector<std::vector<float>>& v,
                     const std::vector<std::vector<Grad>>& grads, double coef, int step, double lr,
                     double weight_decay, const std::vector<ParamSpec>& specs) {
  const double bc1 = 1.0 - std::pow(0.9, step);
  const double bc2 = 1.0 - std::pow(0.999, step);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].frozen) continue;  // not trained: neither stepped nor decayed
    const bool decay = !specs[i].no_weight_decay;
    for (std::size_t k = 0; k < p[i].size(); ++k) {
      const double g = static_cast<double>(grads[i][k]) * coef;
      double param = p[i][k];
      if (decay) param *= 1.0 - lr * weight_decay;
      const double mk = 0.9 * m[i][k] + 0.1 * g;
      const double vk = 0.999 * v[i][k] + 0.001 * g * g;
      param -= lr / bc1 * mk / (std::sqrt(vk) / std::sqrt(bc2) + 1e-8);
      m[i][k] = static_cast<float>(mk);
      v[i][k] = static_cast<float>(vk);
      p[i][k] = static_cast<float>(param);
    }
  }
}

// The reference's gradient loop: one process, full fp32 parameters `p` (initialised here),
// world ranks simulated one after the other. Each step, `update(total, coef, step)` (step from
// 1) applies the optimizer to p given the averaged gradient and the clipping coefficient.
// `norms`, if given, receives each step's gradient norm before clipping; `losses` each step's
// loss, the mean over its micro-batches and ranks.
template <typename Update>
void reference_loop(const TrainSpec& spec, int world, std::vector<std::vector<float>>& p,
                    std::vector<double>* norms, Update update,
                    std::vector<double>* losses = nullptr) {
  TiedMlp model(kD, kH);
  const auto specs = model.parameters();
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("reference");
  FlatParams flat(*device, specs, DType::kFloat32, DType::kFloat32);
  p.clear();
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    std::vector<float> init(static_cast<std::size_t>(specs[i].numel()));
    for (std::size_t k = 0; k < init.size(); ++k)
      init[k] = TiedMlp::init_value(i, static_cast<std::int64_t>(k));
    p.push_back(init);
  }
  for (int step = 0; step < spec.steps; ++step) {
    std::vector<std::vector<double>> total;
    for (const auto& s : specs) total.emplace_back(static_cast<std::size_t>(s.numel()), 0.0);
    double step_loss = 0.0;
    for (int g = 0; g < spec.accumulation; ++g) {
      for (int r = 0; r < world; ++r) {
        for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
          device->copy_to_device(flat.param(i), p[i].data(), p[i].size() * 4, *stream);
          device->fill_zero(flat.grad(i), p[i].size() * 4, *stream);
        }
        const std::int64_t first = (static_cast<std::int64_t>(g) * world + r) * kRows;
        auto x = batch(step, first, kRows, 0);
        auto t = batch(step, first, kRows, 1);
        float loss = 0.f;
        model.forward_backward(flat, *stream, x.data(), t.data(), kRows, 1.0, &loss);
        for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
          std::vector<float> grad(p[i].size());
          device->copy_to_host(grad.data(), flat.grad(i), grad.size() * 4, *stream);
          stream->synchronize();
          for (std::size_t k = 0; k < grad.size(); ++k) total[i][k] += grad[k];
        }
        step_loss += loss;  // the stream was synchronised above
      }
    }
    if (losses != nullptr)
      losses->push_back(step_loss / (static_cast<double>(world) * spec.accumulation));
    double norm_sq = 0.0;
    for (auto& t : total)
      for (double& x : t) {
        x /= static_cast<double>(world) * spec.accumulation;
        norm_sq += x * x;
      }
    if (norms != nullptr) norms->push_back(std::sqrt(norm_sq));
    double coef = 1.0;
    if (spec.clip > 0.0) {
      const double c = spec.clip / (std::sqrt(norm_sq) + 1e-6);
      if (c < 1.0) coef = c;
    }
    update(total, coef, step + 1);
  }
}

// The AdamW reference (reference_loop with reference_adamw).
inline std::vector<std::vector<float>> train_reference(const TrainSpec& spec, int world,
                                                       std::vector<double>* norms = nullptr,
                                                       std::vector<double>* losses = nullptr) {
  const auto specs = TiedMlp(kD, kH).parameters();
  std::vector<std::vector<float>> p, m, v;
  for (const auto& s : specs) {
    m.emplace_back(static_cast<std::size_t>(s.numel()), 0.f);
    v.emplace_back(static_cast<std::size_t>(s.numel()), 0.f);
  }
  reference_loop(
      spec, world, p, norms,
      [&](const std::vector<std::vector<double>>& total, double coef, int step) {
        reference_adamw(p, m, v, total, coef, step, spec.lr, spec.weight_decay, specs);
      },
      losses);
  return p;
}

// Gathers over the sharding group of each unit in one training micro-batch of TiedMlp (the
// recompute of its middle modules when `recompute`), replaying the schedule `options` gives
// (one micro-batch: accumulation does not change a micro-batch's gathers).
inline std::map<int, int> gathers_per_micro_batch(const PartitionPlan& plan, int modules,
                                                  bool recompute, ScheduleOptions options) {
  options.gradient_accumulation_steps = 1;
  UnitSchedule schedule(plan, modules, options);
  std::map<int, int> count;
  auto use = [&](int m, Phase phase) {
    for (const auto& ops : {schedule.acquire(m, phase), schedule.release(m, phase)}) {
      for (const UnitOp& op : ops) {
        if (op.kind == UnitOpKind::kIssueGather) ++count[op.unit];
      }
    }
  };
  for (int m = 0; m < modules; ++m) use(m, Phase::kForward);
  for (int m = modules - 1; m >= 0; --m) {
    if (recompute && m >= 1 && m + 1 < modules) use(m, Phase::kRecompute);
    use(m, Phase::kBackward);
  }
  return count;
}

inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace zrt::test
