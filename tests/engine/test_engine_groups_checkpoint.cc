// Checkpoints of an engine over several shard groups, resumed at another world size and
// expert-parallel degree. The model is TiedMlp (group 0, every rank) plus a bank of kExperts
// "experts" laid out as expert parallelism lays them out: under ep, the rank at position p of its
// block of ep consecutive ranks registers only experts p*E/ep .. (p+1)*E/ep-1, named by their
// GLOBAL index ("experts.3.w"), in group 1: sliced over the expert-data-parallel group (the ranks
// at position p of every block), norm summed over the expert-parallel group, gradients scaled by
// 1 / ep (ParallelLayout::engine_groups). At ep 1 every expert is local and in group 0, as the
// runtime has it.
//
// The experts are an extra module after the dense model's forward with a loss term of their own:
// each row of the global batch is routed to one expert (a hash of the step and row), and the
// rank holding that expert computes its term over the rows of its ep block routed to it (what
// the all-to-all would bring it). Summed over the expert-data-parallel group and scaled by 1 / ep
// each expert's gradient is then the mean over the whole global batch, as at any other ep and
// world size (the global batch fixed: 4 ranks x 1 micro-batch = 2 x 2 = 1 x 4), so a run at
// one layout continues another's. A second layout, "replicas", keeps every expert on every rank
// in group 1 sliced over blocks of 2 ranks and replicated across them (hierarchical sharding of
// one group): each unit is then written by the first replica only. A third keeps the experts
// stacked at ep 1 ("experts.w" [E, D, out]), as the MoE models do without expert parallelism:
// the checkpoint layer reads expert e's own parameter from row e of the stacked one and back.
//
// Each case trains 3 steps at one layout, saves through the Checkpointer (synchronous from the
// engine's memory, or async with the engine's state copy), resumes at another and trains 3 more;
// its losses and parameters equal the uninterrupted 6 steps at the second layout: bit for bit at
// the same layout, otherwise within the reduction-order bound of test_engine_groups (each run is
// within 1e-6 relative L2 of the single-process reference there, so two runs within 2e-6; losses
// within 1e-5). Stages 1-3, with optimizer offload in some. Every slice is written once: the
// rank files hold exactly the units' elements. A checkpoint that lacks a parameter the run needs
// (its experts), or holds one no rank of the run has (more experts than the run's), fails the
// load on every rank naming it; zrt-ckpt lists such a checkpoint and consolidates it (every
// expert, from whichever rank wrote it). Runs at 4 ranks; smaller layouts run on the first
// ranks (a communicator of their own) while the others wait.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/comm/parallel_dims.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;
namespace fs = std::filesystem;

namespace {

constexpr int kExperts = 4;
constexpr int kOut = 5;           // an expert's output width
constexpr int kGlobalMb = 4;      // ranks x micro-batches per step, at every layout
constexpr int kDenseModules = 4;  // TiedMlp(kD, kH): modules 0..3; the experts are module 4

struct Layout {
  int world = 4;
  int ep = 1;
  int replica_shard = 0;   // > 0: the "replicas" layout, group 1 over blocks of this many ranks
  int experts = kExperts;  // 0: the dense model alone
  // ep 1 only: the experts' parameters stacked ("experts.w" [E, D, out]), as the MoE models keep
  // them without expert parallelism, instead of one per expert.
  bool stacked = false;
  std::string name() const {
    return replica_shard > 0
               ? fmt::format("{} ranks, experts replicated over blocks of {}", world, replica_shard)
               : fmt::format("{} ranks, ep {}", world, ep);
  }
};

struct Variant {
  int stage = 2;
  bool offload = false;
  bool async = false;
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Which experts a rank holds and over which group: every expert at ep 1 and with replicas.
std::vector<int> local_experts(const Layout& layout, int rank) {
  std::vector<int> out;
  const int ep = layout.replica_shard > 0 ? 1 : layout.ep;
  const int position = rank % ep;
  const int n = layout.experts;
  for (int e = position * n / ep; e < (position + 1) * n / ep; ++e) out.push_back(e);
  return out;
}

bool experts_grouped(const Layout& layout) {
  return layout.ep > 1 || layout.replica_shard > 0;
}

std::vector<ParamSpec> layout_params(const Layout& layout, int rank) {
  std::vector<ParamSpec> params = TiedMlp(kD, kH).parameters();
  const int group = experts_grouped(layout) ? 1 : 0;
  if (layout.stacked) {
    const std::int64_t n = layout.experts;
    params.push_back(ParamSpec{"experts.w", {n, kD, kOut}, {kDenseModules}, false, 0});
    params.push_back(ParamSpec{"experts.b", {n, kOut}, {kDenseModules}, true, 0});
    return params;
  }
  for (int e : local_experts(layout, rank)) {
    const std::string prefix = "experts." + std::to_string(e);
    params.push_back(ParamSpec{prefix + ".w", {kD, kOut}, {kDenseModules}, false, group});
    params.push_back(ParamSpec{prefix + ".b", {kOut}, {kDenseModules}, true, group});
  }
  return params;
}

// The initial value of element i of parameter `name`: keyed on the name, so each expert starts
// the same wherever it lives.
float initial_value(const std::vector<ParamSpec>& params, int p, std::int64_t i) {
  const std::string& name = params[static_cast<std::size_t>(p)].name;
  if (name.rfind("experts.", 0) != 0) return TiedMlp::init_value(p, i);
  const int which = name.back() == 'w' ? 0 : 1;
  if (name == "experts.w" || name == "experts.b") {  // stacked: expert i / (its size)
    const std::int64_t n = which == 0 ? kD * kOut : kOut;
    return TiedMlp::init_value(1000 + 2 * static_cast<int>(i / n) + which, i % n);
  }
  const int e = std::stoi(name.substr(8));
  return TiedMlp::init_value(1000 + 2 * e + which, i);
}

int route(int step, std::int64_t row) {
  const float v = data_value(step, row, 0, 4);  // in [-1, 1)
  return std::min(kExperts - 1, static_cast<int>((v + 1.0f) * 0.5f * kExperts));
}

// One rank's engine at a layout, on a communicator of the layout's ranks.
struct LayoutRun {
  Layout layout;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> compute, comm_stream;
  std::unique_ptr<ProcessGroup> world, shards, replicas;
  std::unique_ptr<DeviceOptimizer> optimizer;
  std::vector<ParamSpec> params;
  std::unique_ptr<ZeroEngine> engine;
  TiedMlp model{kD, kH};
  ~LayoutRun() {
    engine.reset();
    shards.reset();
    replicas.reset();
    world.reset();
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

// The layout's engine on this rank, or null on a rank outside it. Collective over the world.
std::unique_ptr<LayoutRun> make_layout_run(const Layout& layout, const Variant& variant) {
  MPI_Comm comm = MPI_COMM_NULL;
  const int me = world_rank();
  MPI_Comm_split(MPI_COMM_WORLD, me < layout.world ? 0 : MPI_UNDEFINED, me, &comm);
  if (comm == MPI_COMM_NULL) return nullptr;
  auto run = std::make_unique<LayoutRun>();
  run->layout = layout;
  run->comm = comm;
  run->rank = me;
  run->device = make_device(DeviceOptions{});
  run->compute = run->device->create_stream("compute");
  run->comm_stream = run->device->create_stream("comm");
  run->world = make_process_group(*run->device, comm, *run->comm_stream, "engine", {});
  std::vector<ShardGroup> groups{ShardGroup{run->world.get()}};
  if (layout.replica_shard > 0) {
    const int s = layout.replica_shard;
    run->shards = make_subgroup(*run->world, shard_plan(layout.world, s, me), *run->comm_stream,
                                "experts-shards");
    run->replicas = make_subgroup(*run->world, replica_plan(layout.world, s, me), *run->comm_stream,
                                  "experts-replicas");
    groups.push_back(ShardGroup{run->shards.get(), run->replicas.get()});
  } else if (experts_grouped(layout)) {
    ParallelDims dims;
    dims.world = layout.world;
    dims.stage = variant.stage;
    dims.expert_parallel_size = layout.ep;
    // shards: the expert-data-parallel group; replicas holds the expert-parallel group here.
    run->shards = make_subgroup(*run->world, dims.expert_data_parallel_plan(me), *run->comm_stream,
                                "expert-data-parallel");
    run->replicas = make_subgroup(*run->world, dims.expert_parallel_plan(me), *run->comm_stream,
                                  "expert-parallel");
    ShardGroup experts{run->shards.get()};
    experts.norm_peers = run->replicas.get();
    experts.gradient_scale = 1.0f / static_cast<float>(layout.ep);
    groups.push_back(experts);
  }
  AdamOptions adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.1;
  run->optimizer = make_device_adam(*run->device, adam);
  EngineOptions options = test_engine_options(variant.stage, kGlobalMb / layout.world);
  options.offload_optimizer.enabled = variant.offload;
  run->params = layout_params(layout, me);
  const int modules = kDenseModules + (layout.experts > 0 ? 1 : 0);
  run->engine =
      std::make_unique<ZeroEngine>(*run->device, *run->compute, std::move(groups), run->params,
                                   modules, options, *run->optimizer, make_cpu_optimizer_offload);
  const std::vector<ParamSpec> params = run->params;
  run->engine->initialize([params](int p, std::int64_t first, std::int64_t count, float* out) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = initial_value(params, p, first + i);
  });
  return run;
}

// The engine as TiedMlp sees it, with the experts' module run after the dense forward (its
// forward and backward at once: nothing downstream depends on it).
class WithExperts final : public ParamAccess {
 public:
  // `rows`: the (row, local expert slot) pairs this rank computes in this micro-batch.
  WithExperts(LayoutRun& run, int step, std::vector<std::pair<std::int64_t, int>> rows, float* loss)
      : run_(run), step_(step), rows_(std::move(rows)), loss_(loss) {}
  void acquire(int module, Phase phase) override { run_.engine->acquire(module, phase); }
  void release(int module, Phase phase) override {
    run_.engine->release(module, phase);
    if (module == kDenseModules - 1 && phase == Phase::kForward && run_.layout.experts > 0) {
      run_experts();
    }
  }
  DevicePtr<std::byte> param(int index) override { return run_.engine->param(index); }
  DevicePtr<std::byte> grad(int index) override { return run_.engine->grad(index); }
  DType compute_dtype() const override { return run_.engine->compute_dtype(); }
  DType grad_dtype() const override { return run_.engine->grad_dtype(); }

 private:
  void run_experts() {
    ZeroEngine& engine = *run_.engine;
    CpuStream& s = as_cpu_stream(*run_.compute, "experts");
    const int first_param = static_cast<int>(TiedMlp(kD, kH).parameters().size());
    const int slots = static_cast<int>(local_experts(run_.layout, run_.rank).size());
    auto rows = std::make_shared<std::vector<std::pair<std::int64_t, int>>>(rows_);
    auto x = std::make_shared<std::vector<float>>();
    auto t = std::make_shared<std::vector<float>>();
    for (const auto& [row, slot] : *rows) {
      const auto xi = batch(step_, row, 1, 2, kD);
      const auto ti = batch(step_, row, 1, 3, kOut);
      x->insert(x->end(), xi.begin(), xi.end());
      t->insert(t->end(), ti.begin(), ti.end());
    }
    // Normalised like the dense loss's mean over a rank's rows: a constant at every layout.
    const float scale = 1.0f / static_cast<float>(kRows * kOut);
    engine.acquire(kDenseModules, Phase::kForward);
    // Expert slot j's weight and bias: its own parameters, or its rows of the stacked ones.
    const bool stacked = run_.layout.stacked;
    auto slot_param = [&](int j, int which) {
      const int p = stacked ? first_param + which : first_param + 2 * j + which;
      const int row = stacked ? j * (which == 0 ? kD * kOut : kOut) : 0;
      return std::pair<int, int>{p, row};
    };
    std::vector<const float*> w, b;
    for (int j = 0; j < slots; ++j) {
      const auto [pw, rw] = slot_param(j, 0);
      const auto [pb, rb] = slot_param(j, 1);
      w.push_back(reinterpret_cast<const float*>(raw(engine.param(pw))) + rw);
      b.push_back(reinterpret_cast<const float*>(raw(engine.param(pb))) + rb);
    }
    float* loss = loss_;
    s.enqueue([=] {
      double sum = 0.0;
      for (std::size_t i = 0; i < rows->size(); ++i) {
        const int j = (*rows)[i].second;
        for (int k = 0; k < kOut; ++k) {
          float a = b[j][k];
          for (int d = 0; d < kD; ++d) a += (*x)[i * kD + d] * w[j][d * kOut + k];
          const double e = std::tanh(a) - (*t)[i * kOut + k];
          sum += e * e;
        }
      }
      *loss = static_cast<float>(sum * scale);
    });
    engine.release(kDenseModules, Phase::kForward);
    engine.acquire(kDenseModules, Phase::kBackward);
    std::vector<float*> gw, gb;
    for (int j = 0; j < slots; ++j) {
      const auto [pw, rw] = slot_param(j, 0);
      const auto [pb, rb] = slot_param(j, 1);
      gw.push_back(reinterpret_cast<float*>(raw(engine.grad(pw))) + rw);
      gb.push_back(reinterpret_cast<float*>(raw(engine.grad(pb))) + rb);
    }
    const float seed = static_cast<float>(engine.loss_scale()) * 2.0f * scale;
    s.enqueue([=] {
      for (std::size_t i = 0; i < rows->size(); ++i) {
        const int j = (*rows)[i].second;
        for (int k = 0; k < kOut; ++k) {
          float a = b[j][k];
          for (int d = 0; d < kD; ++d) a += (*x)[i * kD + d] * w[j][d * kOut + k];
          const float y = std::tanh(a);
          const float da = seed * (y - (*t)[i * kOut + k]) * (1.0f - y * y);
          gb[j][k] += da;
          for (int d = 0; d < kD; ++d) gw[j][d * kOut + k] += (*x)[i * kD + d] * da;
        }
      }
    });
    engine.release(kDenseModules, Phase::kBackward);
  }
  template <typename T>
  static T* raw(DevicePtr<T> p) {
    return device_access::raw(p);
  }

  LayoutRun& run_;
  int step_;
  std::vector<std::pair<std::int64_t, int>> rows_;
  float* loss_;
};

// The rows of micro-batch g that this rank's experts see: those of its ep block routed to them
// (with replicas: its own rows, every expert local).
std::vector<std::pair<std::int64_t, int>> expert_rows(const LayoutRun& run, int step, int g) {
  const Layout& l = run.layout;
  const int ep = l.replica_shard > 0 ? 1 : l.ep;
  const int block = run.rank / ep;
  const std::vector<int> mine = local_experts(l, run.rank);
  std::vector<std::pair<std::int64_t, int>> out;
  for (int r = block * ep; r < (block + 1) * ep; ++r) {
    const std::int64_t first = (static_cast<std::int64_t>(g) * l.world + r) * kRows;
    for (std::int64_t row = first; row < first + kRows; ++row) {
      const int e = route(step, row);
      for (std::size_t j = 0; j < mine.size(); ++j) {
        if (mine[j] == e) out.emplace_back(row, static_cast<int>(j));
      }
    }
  }
  return out;
}

// One optimizer step; returns the step's loss (the mean over the global batch's micro-batches).
double train_step(LayoutRun& run, int step) {
  const int world = run.layout.world;
  const int accumulation = kGlobalMb / world;
  std::vector<std::vector<float>> keep;
  std::vector<float> dense(static_cast<std::size_t>(accumulation)),
      experts(static_cast<std::size_t>(accumulation));
  std::vector<std::unique_ptr<WithExperts>> access;
  for (int g = 0; g < accumulation; ++g) {
    const std::int64_t first = (static_cast<std::int64_t>(g) * world + run.rank) * kRows;
    keep.push_back(batch(step, first, kRows, 0, kD));
    keep.push_back(batch(step, first, kRows, 1, kD));
    access.push_back(std::make_unique<WithExperts>(run, step, expert_rows(run, step, g),
                                                   &experts[static_cast<std::size_t>(g)]));
    run.model.forward_backward(*access.back(), *run.compute, keep[keep.size() - 2].data(),
                               keep.back().data(), kRows, run.engine->loss_scale(),
                               &dense[static_cast<std::size_t>(g)]);
  }
  run.engine->step(1e-2);
  run.compute->synchronize();
  double local = 0.0;
  for (int g = 0; g < accumulation; ++g) local += dense[g] + experts[g];
  double sum = 0.0;
  MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, run.comm);
  return sum / kGlobalMb;
}

struct Trained {
  std::vector<double> losses;                        // per step trained here
  std::map<std::string, std::vector<float>> params;  // this rank's parameters, by name
  std::map<std::string, std::vector<std::int64_t>> shapes;
};

Trained train(LayoutRun& run, int from_step, int to_step) {
  Trained out;
  for (int step = from_step; step < to_step; ++step) out.losses.push_back(train_step(run, step));
  for (std::size_t p = 0; p < run.params.size(); ++p) {
    out.params[run.params[p].name] = run.engine->full_parameter(static_cast<int>(p));
    out.shapes[run.params[p].name] = run.params[p].shape;
  }
  return out;
}

// Saves the engine at `step` into save_dir through the Checkpointer, as the trainer does.
void save(LayoutRun& run, const Variant& variant, const std::string& save_dir, int step) {
  CheckpointConfig config;
  config.save_dir = save_dir;
  config.async = variant.async;
  checkpoint::Checkpointer checkpointer(config, 120.0, {}, run.comm);
  checkpoint::SaveRequest request;
  request.tag = checkpoint::Checkpointer::tag_for_step(step);
  request.index.step = step;
  request.index.config_json = "{}";
  checkpoint::describe_engine(*run.engine, request.index);
  ZeroEngine& engine = *run.engine;
  checkpointer.save(
      std::move(request),
      [&](const std::vector<float*>& arrays) { checkpoint::snapshot_engine(engine, arrays); },
      [&](const std::vector<float*>& arrays) {
        return checkpoint::snapshot_engine_async(engine, arrays);
      },
      [&] { return checkpoint::engine_state_view(engine); });
  checkpointer.wait();
}

// Every unit's slices written once: the rank files hold exactly the units' elements, and every
// rank file's slices are distinct (read_index checks that they tile the file).
void check_written_once(const std::string& dir) {
  const auto index = checkpoint::read_index(dir + "/index.h5");
  std::int64_t units = 0, files = 0;
  for (const auto& u : index.units) units += u.numel;
  for (std::int64_t n : index.rank_elements) files += n;
  CHECK(files == units);
  CHECK(checkpoint::verify_checkpoint(dir) > 0);
}

void resume_case(const Layout& from, const Layout& to, const Variant& variant) {
  const std::string label =
      from.name() + " -> " + to.name() +
      fmt::format(", stage {}{}{}", variant.stage, variant.offload ? ", offload" : "",
                  variant.async ? ", async save" : "");
  INFO(label);
  const fs::path save_dir = fs::temp_directory_path() / "zrt_test_engine_groups_ckpt";
  if (world_rank() == 0) fs::remove_all(save_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  if (auto first = make_layout_run(from, variant)) {
    train(*first, 0, 3);
    save(*first, variant, save_dir.string(), 3);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string dir = (save_dir / "global_step3").string();
  if (world_rank() == 0) check_written_once(dir);
  Trained resumed, whole;
  if (auto second = make_layout_run(to, variant)) {
    const auto index = checkpoint::load_engine(dir, *second->engine, second->comm);
    CHECK(index.step == 3);
    resumed = train(*second, 3, 6);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (auto uninterrupted = make_layout_run(to, variant)) whole = train(*uninterrupted, 0, 6);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() >= to.world) return;
  const bool exact =
      from.world == to.world && from.ep == to.ep && from.replica_shard == to.replica_shard;
  REQUIRE(resumed.losses.size() == 3);
  for (int s = 0; s < 3; ++s) {
    INFO("step " << s + 4 << ": resumed " << resumed.losses[s] << ", uninterrupted "
                 << whole.losses[s + 3]);
    if (exact) {
      CHECK(resumed.losses[s] == whole.losses[s + 3]);
    } else {
      CHECK(resumed.losses[s] == Approx(whole.losses[s + 3]).epsilon(1e-5));
    }
  }
  double worst = 0.0;
  std::string worst_name;
  // Both runs are at the `to` layout: the same names.
  for (const auto& [name, values] : whole.params) {
    REQUIRE(resumed.params.count(name) == 1);
    const double err = relative_l2(resumed.params[name], values);
    if (exact) {
      INFO(name);
      CHECK(resumed.params[name] == values);
    }
    if (err >= worst) {
      worst = err;
      worst_name = name;
    }
  }
  INFO("worst relative L2 difference " << worst << " (" << worst_name << ")");
  CHECK(worst <= 2e-6);
}

std::string shell(const std::string& cmd, int* status) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  const int rc = pclose(pipe);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("several groups: saved at one world size and ep, resumed at another", "[groups]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) {
    WARN("the resume cases need 4 ranks; world " << world);
    return;
  }
  const Layout ep4{4, 4}, ep2{4, 2}, two{2, 2}, one{1, 1}, replicas{4, 1, 2};
  resume_case(ep4, ep4, Variant{2, false, false});  // the same layout: bit for bit
  resume_case(ep4, two, Variant{2, false, false});
  resume_case(ep4, one, Variant{3, false, true});
  resume_case(one, ep4, Variant{1, true, false});
  resume_case(ep2, two, Variant{3, true, true});
  resume_case(ep2, ep4, Variant{2, false, true});
  resume_case(two, ep2, Variant{1, false, false});
  resume_case(replicas, two, Variant{2, false, false});
  resume_case(ep4, replicas, Variant{3, true, false});
  // The experts stacked at ep 1 (the MoE models' form) and one parameter each under ep.
  Layout stacked{1, 1};
  stacked.stacked = true;
  resume_case(ep4, stacked, Variant{2, false, false});
  resume_case(stacked, ep2, Variant{3, true, true});
}

TEST_CASE("several groups: missing and foreign experts fail the load; zrt-ckpt reads them",
          "[groups]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) return;
  const fs::path root = fs::temp_directory_path() / "zrt_test_engine_groups_ckpt_tool";
  const fs::path dense_dir = root / "dense", experts_dir = root / "experts";
  if (world_rank() == 0) fs::remove_all(root);
  MPI_Barrier(MPI_COMM_WORLD);
  const Variant variant{2, false, false};
  Trained saved;
  if (auto run = make_layout_run(Layout{4, 4}, variant)) {
    saved = train(*run, 0, 2);
    save(*run, variant, experts_dir.string(), 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (auto run = make_layout_run(Layout{4, 1, 0, 0}, variant)) {
    train(*run, 0, 1);
    save(*run, variant, dense_dir.string(), 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The experts' checkpoint into a run without experts (every rank holds the whole model), and
  // into one with half of them (each rank part of it: the check goes over every rank).
  for (const Layout& layout : {Layout{2, 1, 0, 0}, Layout{4, 2, 0, 2}}) {
    if (auto run = make_layout_run(layout, variant)) {
      CHECK_THAT(message_of([&] {
                   checkpoint::load_engine((experts_dir / "global_step2").string(), *run->engine,
                                           run->comm);
                 }),
                 Catch::Contains("the checkpoint's parameter 'experts.") &&
                     Catch::Contains("is held by no rank of this run"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // A checkpoint of 2 experts into a run of 4 at ep 2: the ranks at position 1 lack theirs (named
  // there), and the others stop too rather than wait for them.
  const fs::path two_dir = root / "two_experts";
  if (auto run = make_layout_run(Layout{4, 2, 0, 2}, variant)) {
    train(*run, 0, 1);
    save(*run, variant, two_dir.string(), 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (auto run = make_layout_run(Layout{4, 2}, variant)) {
    const std::string m = message_of([&] {
      checkpoint::load_engine((two_dir / "global_step1").string(), *run->engine, run->comm);
    });
    if (world_rank() % 2 == 1) {
      CHECK_THAT(m, Catch::Contains("the model's parameter 'experts.2.w' [13, 5] is not in the "
                                    "checkpoint"));
    } else {
      CHECK_THAT(m, Catch::Contains("the checkpoint does not hold the parameters of another rank"));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The dense checkpoint into a run with experts: the first expert parameter is named.
  if (auto run = make_layout_run(Layout{4, 2}, variant)) {
    const std::string first_expert = world_rank() % 2 == 0 ? "experts.0.w" : "experts.2.w";
    CHECK_THAT(message_of([&] {
                 checkpoint::load_engine((dense_dir / "global_step1").string(), *run->engine,
                                         run->comm);
               }),
               Catch::Contains("the model's parameter '" + first_expert +
                               "' [13, 5] is not in the checkpoint"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // zrt-ckpt: the table lists every expert and the groups; consolidate gathers the experts that
  // four ranks wrote, each equal to what its rank held.
  const fs::path consolidated = root / "consolidated.h5";
  if (world_rank() == 0) {
    int status = 0;
    const std::string listing =
        shell(std::string(ZRT_CKPT) + " inspect " + experts_dir.string(), &status);
    INFO(listing);
    CHECK(status == 0);
    CHECK_THAT(listing, Catch::Contains("experts.3.w") && Catch::Contains("experts.0.b") &&
                            Catch::Contains("group 1"));
    const std::string verified =
        shell(std::string(ZRT_CKPT) + " verify " + experts_dir.string(), &status);
    INFO(verified);
    CHECK(status == 0);
    shell(std::string(ZRT_CKPT) + " consolidate " + experts_dir.string() + " --out " +
              consolidated.string(),
          &status);
    CHECK(status == 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  checkpoint::H5File file = checkpoint::H5File::open_read(consolidated.string());
  REQUIRE(saved.params.size() == TiedMlp(kD, kH).parameters().size() + 2);
  for (const auto& [name, values] : saved.params) {
    INFO(name);
    std::vector<float> read(values.size());
    checkpoint::H5Dataset(file, "/params/" + name, checkpoint::H5Elem::kFloat32, saved.shapes[name])
        .read_all(read.data());
    CHECK(read == values);
  }
}
