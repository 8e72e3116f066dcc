// Where each unit's state lives (unit_placement.h), over the settings: no offload, optimizer
// offload (full and partial), parameter offload, and one micro-batch per step where an
// offloaded unit's reduced slice goes to the host as it is.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/engine/unit_placement.h"

using namespace zrt;

namespace {

constexpr Residence D = Residence::kDevice;
constexpr Residence H = Residence::kHost;

// Four modules of equal size, one unit each at stage 3 (no persistent unit).
std::vector<ParamSpec> specs() {
  return {{"a", {64}, {0}, false},
          {"b", {64}, {1}, false},
          {"c", {64}, {2}, false},
          {"d", {64}, {3}, false}};
}

PartitionPlan plan_for(const EngineOptions& o, int world = 2) {
  return PartitionPlan(
      specs(),
      PartitionOptions{o.stage, o.stage == 0 ? 1 : world, o.reduce_bucket_size,
                       o.stage == 3 ? o.stage3_param_persistence_threshold : 0, o.alignment, 4});
}

EngineOptions options(int stage, bool offload_optimizer, bool offload_param, int accumulation) {
  EngineOptions o;
  o.stage = stage;
  o.compute_dtype = DType::kBFloat16;
  o.gradient_accumulation_steps = accumulation;
  o.offload_optimizer.enabled = offload_optimizer;
  o.offload_param.enabled = offload_param;
  o.stage3_param_persistence_threshold = 0;
  o.reduce_bucket_size = 64;
  return o;
}

UnitPlacement make(Residence master, Residence params, Residence grads, bool reduced) {
  UnitPlacement p;
  p.master = p.optimizer_state = master;
  p.param_slice = params;
  p.grad_slice = grads;
  p.reduced_slice_to_host = reduced;
  return p;
}

}  // namespace

TEST_CASE("without offload everything lives on the device") {
  for (int stage : {0, 1, 2, 3}) {
    const EngineOptions o = options(stage, false, false, 1);
    for (const UnitPlacement& p : unit_placements(o, plan_for(o))) {
      CHECK(p == UnitPlacement{});
      CHECK_FALSE(p.stepped_on_host());
    }
  }
}

TEST_CASE("optimizer offload: the state on the host; the gradient slice by the reduction's rule") {
  struct Case {
    int stage, accumulation;
    UnitPlacement expected;
  };
  const Case cases[] = {
      // Stage 1 reduces the whole gradient once a step: the slice is formed on the device.
      {1, 1, make(H, D, D, false)},
      // Stages 2-3 at one micro-batch per step: the reduced slice goes down as it is.
      {2, 1, make(H, D, H, true)},
      {3, 1, make(H, D, H, true)},
      // With accumulation the final slice is accumulated on the device first.
      {2, 3, make(H, D, D, false)},
      {3, 3, make(H, D, D, false)},
  };
  for (const Case& c : cases) {
    INFO("stage " << c.stage << " G " << c.accumulation);
    const EngineOptions o = options(c.stage, true, false, c.accumulation);
    const PartitionPlan plan = plan_for(o);
    for (int u = 0; u < static_cast<int>(plan.units().size()); ++u) {
      CHECK(placement_of(o, plan, u) == c.expected);
    }
  }
  // An fp32 reduction of bf16 gradients is not the final slice as it is.
  EngineOptions fp32_wire = options(3, true, false, 1);
  fp32_wire.communication_dtype = DType::kFloat32;
  CHECK(placement_of(fp32_wire, true) == make(H, D, D, false));
}

TEST_CASE("parameter offload: slices and gradients in host memory, the persistent unit not") {
  for (int accumulation : {1, 2}) {
    const EngineOptions o = options(3, true, true, accumulation);
    const UnitPlacement p = placement_of(o, true);
    CHECK(p.master == H);
    CHECK(p.optimizer_state == H);
    CHECK(p.param_slice == H);
    CHECK(p.grad_slice == H);
    CHECK(p.reduction_bucket == D);
    CHECK(p.reduced_slice_to_host == (accumulation == 1));
    // The persistent unit stays whole on the device; its gradient still accumulates on the host.
    CHECK(placement_of(o, true, true).param_slice == D);
    CHECK(placement_of(o, true, true).grad_slice == H);
  }
}

TEST_CASE("partial offload: the last units of the forward, the fewest that hold the ratio") {
  for (double ratio : {0.0, 0.25, 0.5, 0.6, 1.0}) {
    EngineOptions o = options(3, true, false, 2);
    o.offload_optimizer.ratio = ratio;
    const std::vector<UnitPlacement> placements = unit_placements(o, plan_for(o));
    REQUIRE(placements.size() == 4);
    // Equal units: ceil(4 ratio) of them, from the end of the forward.
    const int expected = ratio == 0.0    ? 0
                         : ratio == 0.25 ? 1
                         : ratio == 0.5  ? 2
                         : ratio == 0.6  ? 3
                                         : 4;
    for (int u = 0; u < 4; ++u) {
      INFO("ratio " << ratio << " unit " << u);
      CHECK(placements[static_cast<std::size_t>(u)].stepped_on_host() == (u >= 4 - expected));
      CHECK(placements[static_cast<std::size_t>(u)].grad_slice == D);
    }
  }
}

TEST_CASE("the disk is reserved") {
  CHECK(std::string(residence_name(Residence::kDisk)) == "disk");
  CHECK(std::string(residence_name(Residence::kHost)) == "host");
}

TEST_CASE("stage 3 at a group of one rank computes with the slice itself") {
  // world 1: every non-persistent unit's gather would copy its slice unchanged.
  EngineOptions o = options(3, false, false, 1);
  for (const UnitPlacement& p : unit_placements(o, plan_for(o, 1))) CHECK(p.gathered_in_place);
  // Two ranks gather; so do a persistent unit (never gathered), parameter offload (the slice is
  // in host memory), qwZ (its int8 round trip changes the values) and the stages below 3.
  for (const UnitPlacement& p : unit_placements(o, plan_for(o, 2)))
    CHECK_FALSE(p.gathered_in_place);
  CHECK_FALSE(placement_of(o, false, true, false, 1).gathered_in_place);
  CHECK(placement_of(o, false, false, false, 1).gathered_in_place);
  CHECK_FALSE(placement_of(o, false, false, false, 0).gathered_in_place);
  EngineOptions offloaded = options(3, true, true, 1);
  CHECK_FALSE(placement_of(offloaded, true, false, false, 1).gathered_in_place);
  // Optimizer offload alone keeps the slice on the device: still in place.
  CHECK(placement_of(options(3, true, false, 1), true, false, false, 1).gathered_in_place);
  EngineOptions qwz = o;
  qwz.quantized_weights = true;
  CHECK_FALSE(placement_of(qwz, false, false, false, 1).gathered_in_place);
  for (int stage : {0, 1, 2}) {
    CHECK_FALSE(
        placement_of(options(stage, false, false, 1), false, false, false, 1).gathered_in_place);
  }
  // A frozen unit is read like any other.
  CHECK(placement_of(o, false, false, true, 1).gathered_in_place);
}
