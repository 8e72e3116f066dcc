// Lion through the optimizer seam: the engine with Lion at every ZeRO stage (and with optimizer
// and parameter offload), at the world size mpirun gives (1, 2, 4), against a single-process
// Lion loop written out in float64 here; offload bit-identical to the device path; checkpoints
// of Lion state (master + exp_avg) resumed bit-exactly and resharded across stages exactly; a
// Lion checkpoint loaded by an Adam engine is an error naming both optimizers.
//
// Tolerance. The engine sums the per-rank gradients in another order than the reference, and
// its fp32 Lion rounds where the reference does not, so the update direction c = b1*m + (1-b1)*g
// differs from the reference's c64 by a rounding-level amount. sign() turns that into an
// lr-sized difference exactly where |c64| is that small, and nowhere else. So, per step and
// element:
//  - the rounding level of c: kGradRounding * u * G, where u = 2^-24 and G the largest |g| the
//    element has seen (a gradient is a sum of world x accumulation x kRows row terms of kH
//    products, rounded in fp32 in either order: its error is a modest multiple of u times the
//    magnitudes involved; kGradRounding = 4096 is generous, which only widens the band in which
//    a flip is excused), plus the momentum's own rounding (as in test_cpu_lion.cc);
//  - |c64| within that band is a "near tie": there the engine may step the other way;
//  - everywhere else the engine's parameter must equal the reference's to within the rounding
//    of the parameter update, 4u(|p| + lr) per step, summed.
// The comparison runs after every step. A flip at a near tie makes the two trajectories differ
// by 2*lr in that element, which changes every later gradient by more than rounding, so a run is
// compared only up to its first flip (the test says so, and counts near ties and flips).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "optimizers/device_lion.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/common/error.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;
namespace fs = std::filesystem;

namespace {

constexpr double kU = 0x1p-24;
constexpr double kGradRounding = 4096;
constexpr double kBeta1 = 0.9, kBeta2 = 0.99;  // LionOptions' defaults

int world_size() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

EngineOptions lion_options(int stage, int accumulation, bool offload = false,
                           bool offload_param = false) {
  EngineOptions o;
  o.stage = stage;
  o.gradient_accumulation_steps = accumulation;
  o.gradient_clipping = 0.05;
  o.reduce_bucket_size = 600;
  o.stage3_param_persistence_threshold = 30;
  o.stage3_prefetch_bucket_size = 700;
  o.stage3_max_live_parameters = 2000;
  o.offload_optimizer.enabled = offload;
  o.offload_param.enabled = offload_param;
  return o;
}

// The float64 Lion reference, element by element, with what the tolerance needs.
struct ReferenceLion {
  std::vector<std::vector<double>> p, m;
  std::vector<std::vector<double>> gmax;    // largest |g| (or |m|) seen
  std::vector<std::vector<double>> e_p;     // accumulated rounding allowance of p
  std::vector<std::vector<int>> near_ties;  // steps whose |c64| was within the band
  std::int64_t total_near_ties = 0;

  void step(const std::vector<ParamSpec>& specs, const std::vector<std::vector<double>>& total,
            double coef, int t, const TrainSpec& spec) {
    const double grad_band = kGradRounding * kU;
    const double m_steps = std::min<double>(t, 1.0 / (1.0 - kBeta2));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const bool decay = !specs[i].no_weight_decay;
      for (std::size_t k = 0; k < p[i].size(); ++k) {
        const double g = total[i][k] * coef;
        gmax[i][k] = std::max({gmax[i][k], std::fabs(g), std::fabs(m[i][k])});
        const double c = kBeta1 * m[i][k] + (1 - kBeta1) * g;
        const double band = gmax[i][k] * (grad_band + 4 * kU * (m_steps + 1));
        if (std::fabs(c) <= band) {
          ++near_ties[i][k];
          ++total_near_ties;
        }
        if (decay) p[i][k] *= 1.0 - spec.lr * spec.weight_decay;
        p[i][k] -= spec.lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
        m[i][k] = kBeta2 * m[i][k] + (1 - kBeta2) * g;
        e_p[i][k] += 4 * kU * (std::fabs(p[i][k]) + spec.lr);
      }
    }
  }
};

// The reference's parameters after each step (index: step - 1), and its near-tie records.
struct ReferenceRun {
  std::vector<std::vector<std::vector<double>>> p_after;
  std::vector<std::vector<std::vector<double>>> e_p_after;
  std::vector<std::vector<std::vector<int>>> ties_after;
  std::int64_t near_ties = 0;
};

ReferenceRun reference_lion(const TrainSpec& spec, int world) {
  const auto specs = TiedMlp(kD, kH).parameters();
  ReferenceLion ref;
  for (const auto& s : specs) {
    const auto n = static_cast<std::size_t>(s.numel());
    ref.m.emplace_back(n, 0.0);
    ref.gmax.emplace_back(n, 0.0);
    ref.e_p.emplace_back(n, 0.0);
    ref.near_ties.emplace_back(n, 0);
  }
  std::vector<std::vector<float>> p;  // the fp32 parameters the reference model runs with
  ReferenceRun run;
  reference_loop(spec, world, p, nullptr,
                 [&](const std::vector<std::vector<double>>& total, double coef, int t) {
                   if (ref.p.empty()) {
                     for (const auto& v : p) ref.p.emplace_back(v.begin(), v.end());
                   }
                   ref.step(specs, total, coef, t, spec);
                   for (std::size_t i = 0; i < p.size(); ++i) {
                     for (std::size_t k = 0; k < p[i].size(); ++k) {
                       p[i][k] = static_cast<float>(ref.p[i][k]);
                     }
                   }
                   run.p_after.push_back(ref.p);
                   run.e_p_after.push_back(ref.e_p);
                   run.ties_after.push_back(ref.near_ties);
                 });
  run.near_ties = ref.total_near_ties;
  return run;
}

struct Comparison {
  int steps_compared = 0;
  std::int64_t flips = 0;        // elements beyond rounding, all at near ties
  std::int64_t unexplained = 0;  // beyond rounding without a near tie: a defect
  double worst_ratio = 0.0;      // max |p - p64| / allowance over the elements within it
};

// Steps the engine one step at a time and compares with the reference after each.
Comparison compare_with_reference(EngineRun& run, const TrainSpec& spec, const ReferenceRun& ref) {
  Comparison result;
  for (int step = 0; step < spec.steps; ++step) {
    train_one_step(run, spec, step);
    const auto& p64 = ref.p_after[static_cast<std::size_t>(step)];
    const auto& e_p = ref.e_p_after[static_cast<std::size_t>(step)];
    const auto& ties = ref.ties_after[static_cast<std::size_t>(step)];
    std::int64_t flips = 0;
    for (int i = 0; i < static_cast<int>(p64.size()); ++i) {
      const std::vector<float> got = run.engine->full_parameter(i);
      for (std::size_t k = 0; k < got.size(); ++k) {
        const double diff = std::fabs(got[k] - p64[static_cast<std::size_t>(i)][k]);
        const double allowance = e_p[static_cast<std::size_t>(i)][k];
        if (diff <= allowance) {
          result.worst_ratio = std::max(result.worst_ratio, diff / allowance);
        } else if (ties[static_cast<std::size_t>(i)][k] > 0) {
          ++flips;
        } else {
          ++result.unexplained;
        }
      }
    }
    result.steps_compared = step + 1;
    result.flips += flips;
    if (flips > 0) break;  // the trajectories legitimately part here
  }
  return result;
}

}  // namespace

TEST_CASE("Lion at every stage and with offload matches a float64 Lion loop", "[lion]") {
  const int world = world_size();
  for (int accumulation : {1, 2}) {
    TrainSpec spec;
    spec.lion = true;
    spec.steps = 6;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    spec.lr = 1e-3;
    spec.weight_decay = 0.5;
    const ReferenceRun ref = reference_lion(spec, world);
    struct Setting {
      int stage;
      bool offload, offload_param;
    };
    const Setting settings[] = {{0, false, false}, {1, false, false}, {2, false, false},
                                {3, false, false}, {1, true, false},  {2, true, false},
                                {3, true, false},  {3, true, true}};
    for (const Setting& s : settings) {
      auto run = make_engine(lion_options(s.stage, accumulation, s.offload, s.offload_param), spec);
      const Comparison c = compare_with_reference(*run, spec, ref);
      if (world_rank() == 0) {
        std::printf(
            "lion parity: world %d, stage %d%s%s, accumulation %d: %d/%d steps compared, "
            "reference near ties %lld, sign flips %lld, unexplained %lld, worst |p - p64| / "
            "allowance %.3g\n",
            world, s.stage, s.offload ? " + optimizer offload" : "",
            s.offload_param ? " + parameter offload" : "", accumulation, c.steps_compared,
            spec.steps, static_cast<long long>(ref.near_ties), static_cast<long long>(c.flips),
            static_cast<long long>(c.unexplained), c.worst_ratio);
      }
      INFO("stage " << s.stage << " offload " << s.offload << " param offload " << s.offload_param
                    << " accumulation " << accumulation << " world " << world);
      CHECK(c.unexplained == 0);
      CHECK(c.steps_compared >= 1);
      for (const StepResult& r : run->results) CHECK_FALSE(r.skipped);
    }
  }
}

TEST_CASE("Lion: offload is bit-identical to the device path", "[lion]") {
  TrainSpec spec;
  spec.lion = true;
  spec.steps = 4;
  spec.accumulation = 2;
  spec.clip = 0.05;
  for (int stage = 1; stage <= 3; ++stage) {
    auto plain = make_engine(lion_options(stage, 2), spec);
    const auto expected = train_engine(*plain, spec);
    auto offloaded = make_engine(lion_options(stage, 2, true, stage == 3), spec);
    const auto got = train_engine(*offloaded, spec);
    for (std::size_t p = 0; p < got.size(); ++p) {
      INFO("stage " << stage << " parameter " << p);
      REQUIRE(got[p] == expected[p]);
    }
    CHECK(plain->engine->optimizer_spec().family == "Lion");
    CHECK(plain->engine->state_array_count() == 2);
  }
}

namespace {

// Saves `engine`'s state as a checkpoint in `dir` (every rank its file, rank 0 the index).
void save(ZeroEngine& engine, const fs::path& dir) {
  if (world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  checkpoint::CheckpointIndex index;
  index.config_json = "{}";
  checkpoint::describe_engine(engine, index);
  if (world_rank() == 0) checkpoint::write_index((dir / "index.h5").string(), index);
  if (world_rank() < index.world) {
    checkpoint::RankSnapshot snapshot;
    snapshot.rank = world_rank();
    snapshot.datasets = index.state_datasets();
    snapshot.assign(index.slice_elements());
    checkpoint::snapshot_engine(engine, snapshot.pointers());
    checkpoint::write_rank_file((dir / checkpoint::rank_file_name(world_rank())).string(), snapshot,
                                index.world, 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Every parameter's master weight and momentum, whole, read back from a checkpoint.
std::vector<std::vector<float>> read_whole_state(const fs::path& dir,
                                                 const std::vector<ParamSpec>& params) {
  const checkpoint::CheckpointIndex index =
      checkpoint::read_index((dir / "index.h5").string(), &params);
  REQUIRE(index.optimizer == "Lion");
  REQUIRE(index.state_datasets() == std::vector<std::string>{"/master", "/exp_avg"});
  PartitionOptions whole;
  whole.world = 1;
  whole.num_modules = TiedMlp(kD, kH).modules();
  const PartitionPlan plan(params, whole);
  checkpoint::ShardedReader reader(dir.string(), index);
  std::vector<std::vector<float>> out;
  for (int u = 0; u < static_cast<int>(plan.units().size()); ++u) {
    std::vector<float> master(static_cast<std::size_t>(plan.unit(u).shard));
    std::vector<float> momentum(master.size());
    reader.fill(plan, 0, u, {master.data(), momentum.data()});
    out.push_back(master);
    out.push_back(momentum);
  }
  return out;
}

}  // namespace

TEST_CASE("Lion checkpoints: bit-exact resume, exact resharding, and no Adam mix-up", "[lion]") {
  TrainSpec spec;
  spec.lion = true;
  spec.steps = 3;
  spec.accumulation = 2;
  spec.clip = 0.05;
  // One directory per world size: ctest runs the np1/np2/np4 variants side by side.
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const fs::path root =
      fs::temp_directory_path() / ("zrt_test_engine_lion_np" + std::to_string(world));
  for (int stage : {0, 1, 2, 3}) {
    for (bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      INFO("stage " << stage << " offload " << offload);
      const EngineOptions options = lion_options(stage, 2, offload);
      // 2K steps in one run against K, save, load into a new engine, K more.
      TrainSpec twice = spec;
      twice.steps = 2 * spec.steps;
      auto whole = make_engine(options, twice);
      const auto expected = train_engine(*whole, twice);
      auto first = make_engine(options, spec);
      train_engine(*first, spec);
      const fs::path dir = root / ("s" + std::to_string(stage) + (offload ? "o" : ""));
      save(*first->engine, dir);
      auto second = make_engine(options, spec);
      checkpoint::load_engine(dir.string(), *second->engine);
      // The second half sees the second half's data: train on steps K..2K-1.
      for (int step = spec.steps; step < 2 * spec.steps; ++step) {
        const int rank = second->group->rank();
        const int world = second->group->size();
        std::vector<std::vector<float>> keep;
        float loss = 0.f;
        for (int g = 0; g < spec.accumulation; ++g) {
          const std::int64_t first_row = (static_cast<std::int64_t>(g) * world + rank) * kRows;
          keep.push_back(batch(step, first_row, kRows, 0));
          keep.push_back(batch(step, first_row, kRows, 1));
          second->model.forward_backward(*second->engine, *second->compute,
                                         keep[keep.size() - 2].data(), keep.back().data(), kRows,
                                         1.0, &loss);
        }
        second->engine->step(spec.lr);
        second->compute->synchronize();
      }
      for (int p = 0; p < static_cast<int>(expected.size()); ++p) {
        INFO("parameter " << p);
        REQUIRE(second->engine->full_parameter(p) == expected[static_cast<std::size_t>(p)]);
      }
      // Resharding: the checkpoint loaded at every other stage holds the same master weights and
      // momentum, element for element (saved again from there and read back whole).
      const auto saved = read_whole_state(dir, first->model.parameters());
      for (int other : {0, 1, 2, 3}) {
        if (other == stage) continue;
        auto resharded = make_engine(lion_options(other, 2), spec);
        checkpoint::load_engine(dir.string(), *resharded->engine);
        const fs::path again = root / ("again_s" + std::to_string(other));
        save(*resharded->engine, again);
        INFO("resharded to stage " << other);
        REQUIRE(read_whole_state(again, first->model.parameters()) == saved);
      }
      // A Lion checkpoint is not Adam state.
      TrainSpec adam = spec;
      adam.lion = false;
      auto adam_run = make_engine(options, adam);
      CHECK_THROWS_WITH(checkpoint::load_engine(dir.string(), *adam_run->engine),
                        Catch::Contains("optimizer Lion (state exp_avg)") &&
                            Catch::Contains("this run uses optimizer Adam (state exp_avg "
                                            "exp_avg_sq)"));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}
