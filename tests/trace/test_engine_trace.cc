// The engine's timeline trace on the CPU backend, at the world size mpirun gives: a run of four
// steps traced in steps 2-3 writes a Chrome trace whose every track is named, whose events lie
// inside the two step markers (counted: exactly two steps' worth), never overlap on a track and
// follow the engine's order (a unit's reduction before its optimizer step, the step before the
// unit's copy up and all-gather). With offload, the copy and CPU-optimizer tracks have every unit.
// Tracing does not change a single bit of the result.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include <unistd.h>

#include "tests/engine/engine_test_util.h"
#include "tests/trace/trace_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr int kSteps = 4;
constexpr int kFirstTraced = 2;
constexpr int kLastTraced = 3;
constexpr int kTracedSteps = kLastTraced - kFirstTraced + 1;

EngineOptions options(int stage, bool offload, bool offload_params = false) {
  EngineOptions o;
  o.stage = stage;
  o.gradient_clipping = 0.05;
  o.reduce_bucket_size = 600;
  o.stage3_param_persistence_threshold = 30;
  o.stage3_prefetch_bucket_size = 700;
  o.stage3_max_live_parameters = 2000;
  o.offload_staging_buffers = 2;
  o.offload_transfer_piece = 100;  // several pieces a unit
  o.offload_optimizer.enabled = offload;
  o.offload_param.enabled = offload_params;
  return o;
}

struct TracedRun {
  std::vector<std::vector<float>> params;
  ParsedTrace trace;
  int units = 0;
  int modules = 0;
  int world = 1;
  std::vector<bool> persistent;  // per unit
  std::vector<bool> on_host;     // per unit: its optimizer state is offloaded
};

// Trains kSteps steps (1-based), tracing kFirstTraced..kLastTraced as zrt-train does, or none.
TracedRun run(const EngineOptions& o, const std::string& name, bool traced) {
  TrainSpec spec;
  spec.steps = kSteps;
  spec.clip = 0.05;
  auto r = make_engine(o, spec);
  const int rank = r->group->rank();
  const int world = r->group->size();
  TraceRecorder recorder(rank);
  for (int step = 1; step <= kSteps; ++step) {
    const bool in_range = traced && step >= kFirstTraced && step <= kLastTraced;
    const double start = recorder.now_us();
    r->engine->set_trace(in_range ? &recorder : nullptr);
    auto x = batch(step, rank * kRows, kRows, 0);
    auto t = batch(step, rank * kRows, kRows, 1);
    float loss = 0.f;
    r->model.forward_backward(*r->engine, *r->compute, x.data(), t.data(), kRows, 1.0, &loss);
    r->results.push_back(r->engine->step(spec.lr));
    r->compute->synchronize();
    if (in_range) {
      if (step == kLastTraced) r->engine->synchronize();
      recorder.add_step(step, start, recorder.now_us());
    }
  }
  r->engine->set_trace(nullptr);
  TracedRun out;
  for (int p = 0; p < static_cast<int>(r->model.parameters().size()); ++p)
    out.params.push_back(r->engine->full_parameter(p));
  out.units = static_cast<int>(r->engine->plan().units().size());
  out.modules = r->model.modules();
  out.world = world;
  for (const Unit& u : r->engine->plan().units()) out.persistent.push_back(u.persistent);
  for (int u = 0; u < out.units; ++u) out.on_host.push_back(r->engine->state_on_host(u));
  if (traced) {
    const std::string path = trace_path_for_rank(
        (std::filesystem::temp_directory_path() /
         ("zrt_engine_trace_" + std::to_string(::getpid()) + "_" + name + ".json"))
            .string(),
        rank, world);
    r->engine->synchronize();
    recorder.write(path);
    out.trace = parse_trace(path);
    std::filesystem::remove(path);
  }
  return out;
}

std::string unit_event(const char* what, int u) {
  return std::string(what) + " unit " + std::to_string(u);
}

// The checks every engine trace passes, whatever the stage.
void check_common(const TracedRun& r) {
  const ParsedTrace& trace = r.trace;
  for (const char* name : {"steps", "compute", "comm", "copy", "CPU optimizer"}) {
    bool named = false;
    for (const auto& [tid, n] : trace.track_names) named = named || n == name;
    INFO("track " << name);
    CHECK(named);
  }
  check_tracks_serial(trace);
  const auto& steps = trace.track("steps");
  REQUIRE(steps.size() == kTracedSteps);
  CHECK(steps[0].name == "step " + std::to_string(kFirstTraced));
  CHECK(steps[1].name == "step " + std::to_string(kLastTraced));
  const double first = steps.front().ts;
  const double last = steps.back().end();
  for (const auto& [track, list] : trace.by_track) {
    for (const auto& e : list) {
      INFO(track << ": " << e.name << " at " << e.ts << " + " << e.dur << " outside [" << first
                 << ", " << last << "]");
      CHECK(e.ts >= first);
      CHECK(e.end() <= last);
    }
  }
  // Exactly the traced steps' work: every module's forward and backward once per step.
  for (int m = 0; m < r.modules; ++m) {
    INFO("module " << m);
    CHECK(trace.named("compute", "forward module " + std::to_string(m)).size() == kTracedSteps);
    CHECK(trace.named("compute", "backward module " + std::to_string(m)).size() == kTracedSteps);
  }
}

void check_same_parameters(const TracedRun& a, const TracedRun& b) {
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t p = 0; p < a.params.size(); ++p) {
    INFO("parameter " << p);
    CHECK(a.params[p] == b.params[p]);
  }
}

}  // namespace

TEST_CASE("engine trace without offload: reductions, then the optimizer, then all-gathers") {
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    const TracedRun traced = run(options(stage, false), "plain" + std::to_string(stage), true);
    check_same_parameters(traced, run(options(stage, false), "", false));
    check_common(traced);
    const ParsedTrace& t = traced.trace;
    CHECK(t.track("copy").empty());
    CHECK(t.track("CPU optimizer").empty());
    const auto adam = t.named("compute", "adam (all units)");
    REQUIRE(adam.size() == kTracedSteps);
    for (int u = 0; u < traced.units; ++u) {
      INFO("unit " << u);
      const auto reduced = t.named("comm", unit_event("reduce_scatter", u));
      const auto gathered = t.named("comm", unit_event("all_gather", u));
      // One rank has nothing to reduce (the full gradient is the rank's) unless it buckets the
      // gradients (per_micro_batch_grads).
      const bool reduces =
          traced.world > 1 || per_micro_batch_grads(options(stage, false), traced.world == 1);
      REQUIRE(reduced.size() == (reduces ? kTracedSteps : 0));
      REQUIRE(gathered.size() == kTracedSteps);
      for (int k = 0; k < kTracedSteps; ++k) {
        if (reduces) CHECK(reduced[k].end() <= adam[k].ts);
        CHECK(adam[k].end() <= gathered[k].ts);
      }
    }
  }
}

TEST_CASE("engine trace with optimizer offload: every unit on the copy and CPU-optimizer tracks") {
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const TracedRun traced = run(options(stage, true), "offload" + std::to_string(stage), true);
    check_same_parameters(traced, run(options(stage, true), "", false));
    check_common(traced);
    const ParsedTrace& t = traced.trace;
    for (int u = 0; u < traced.units; ++u) {
      INFO("unit " << u);
      const auto reduced = t.named("comm", unit_event("reduce_scatter", u));
      const auto norm = t.named("comm", unit_event("grad norm", u));
      const auto down = t.named("copy", unit_event("d2h", u));
      const auto adam = t.named("CPU optimizer", unit_event("adam", u));
      const auto up = t.named("copy", unit_event("h2d", u));
      const bool reduces =
          traced.world > 1 || per_micro_batch_grads(options(stage, true), traced.world == 1);
      REQUIRE(reduced.size() == (reduces ? kTracedSteps : 0));
      REQUIRE(norm.size() == kTracedSteps);
      REQUIRE(down.size() == kTracedSteps);
      REQUIRE(adam.size() == kTracedSteps);
      REQUIRE(up.size() == kTracedSteps);
      for (int k = 0; k < kTracedSteps; ++k) {
        // reduce -> copy down -> (global decision) -> CPU step -> copy up. The CPU steps a
        // slice piece by piece as it lands (offload_transfer_piece): it starts after the copy
        // down starts and ends after it ends.
        // The unit's sum of squares is taken where the reduction left the slice, before the
        // slice goes down (on the copy stream it would queue behind the previous unit's slice).
        if (reduces) CHECK(reduced[k].end() <= norm[k].ts);
        CHECK(norm[k].end() <= down[k].ts);
        if (reduces) CHECK(reduced[k].end() <= down[k].ts);
        CHECK(down[k].ts <= adam[k].ts);
        CHECK(down[k].end() <= adam[k].end());
        CHECK(adam[k].end() <= up[k].ts);
      }
      if (stage < 3 || traced.persistent[static_cast<std::size_t>(u)]) {
        // Stages 1-2 (and stage 3's persistent unit) all-gather the unit once it is up.
        const auto gathered = t.named("comm", unit_event("all_gather", u));
        REQUIRE(gathered.size() == kTracedSteps);
        for (int k = 0; k < kTracedSteps; ++k) CHECK(up[k].end() <= gathered[k].ts);
      }
    }
  }
}

TEST_CASE("engine trace with partial offload: the CPU steps the last units, the device the rest") {
  EngineOptions o = options(3, true);
  o.offload_optimizer.ratio = 0.5;
  const TracedRun traced = run(o, "partial", true);
  check_same_parameters(traced, run(options(3, false), "", false));  // plain stage 3
  check_common(traced);
  const ParsedTrace& t = traced.trace;
  int on_host = 0;
  for (int u = 0; u < traced.units; ++u) {
    INFO("unit " << u << (traced.on_host[static_cast<std::size_t>(u)] ? " (host)" : " (device)"));
    const bool host = traced.on_host[static_cast<std::size_t>(u)];
    on_host += host;
    const std::size_t expected = host ? kTracedSteps : 0;
    CHECK(t.named("copy", unit_event("d2h", u)).size() == expected);
    CHECK(t.named("CPU optimizer", unit_event("adam", u)).size() == expected);
    CHECK(t.named("copy", unit_event("h2d", u)).size() == expected);
    // Every unit's sum of squares is taken on the comm stream, whichever side steps it.
    CHECK(t.named("comm", unit_event("grad norm", u)).size() == kTracedSteps);
    CHECK(t.named("copy", unit_event("grad norm", u)).empty());
  }
  CHECK(on_host > 0);
  CHECK(on_host < traced.units);
  CHECK(t.named("compute", "adam (units on the device)").size() == kTracedSteps);
}

TEST_CASE("engine trace with parameter offload: slices come up on the comm stream") {
  const TracedRun traced = run(options(3, true, true), "params", true);
  check_same_parameters(traced, run(options(3, true, true), "", false));
  check_common(traced);
  const ParsedTrace& t = traced.trace;
  for (int u = 0; u < traced.units; ++u) {
    INFO("unit " << u);
    const auto adam = t.named("CPU optimizer", unit_event("adam", u));
    REQUIRE(adam.size() == kTracedSteps);
    CHECK(t.named("copy", unit_event("d2h", u)).size() == kTracedSteps);
    if (traced.persistent[static_cast<std::size_t>(u)]) continue;
    // The CPU writes the host slice; the next gather brings it up first.
    const auto up = t.named("comm", unit_event("h2d", u));
    REQUIRE(up.size() >= kTracedSteps);
    CHECK(adam[0].end() <= up.back().ts);
  }
}
