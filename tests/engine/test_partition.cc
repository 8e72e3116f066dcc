// Units, padding and slices: every element owned by exactly one rank, parameters aligned and
// rebuilt exactly from the slices, units formed as docs/architecture.md ("Units") says for each
// stage.
#include <catch2/catch.hpp>

#include <map>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/engine/partition.h"

using namespace zrt;

namespace {
// Five modules; the tied parameter is used by modules 0 and 4.
std::vector<ParamSpec> specs() {
  return {
      {"wte", {50, 7}, {0, 4}, false}, {"wpe", {9, 7}, {0}, false},   {"h0.w", {7, 21}, {1}, false},
      {"h0.b", {21}, {1}, true},       {"h1.w", {21, 7}, {2}, false}, {"h1.b", {7}, {2}, true},
      {"h2.w", {7, 7}, {3}, false},    {"ln_f", {7}, {4}, true},
  };
}
}  // namespace

TEST_CASE("every element of every parameter is owned by exactly one rank") {
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 3, 4, 7}) {
      PartitionOptions o;
      o.stage = stage;
      o.world = stage == 0 ? 1 : world;
      o.bucket_elements = 200;
      o.persistence_threshold = stage == 3 ? 10 : 0;
      o.alignment = 4;
      o.num_modules = 5;
      const auto params = specs();
      PartitionPlan plan(params, o);
      for (int p = 0; p < static_cast<int>(params.size()); ++p) {
        std::vector<int> owners(static_cast<std::size_t>(params[p].numel()), 0);
        const ParamPlacement& pl = plan.placement(p);
        CHECK(pl.offset % o.alignment == 0);
        const Unit& u = plan.unit(pl.unit);
        CHECK(pl.offset + pl.numel <= u.numel);
        for (int r = 0; r < o.world; ++r) {
          const auto range = plan.owned_range(p, r);
          for (std::int64_t i = 0; i < range.count; ++i) ++owners[range.first + i];
          if (range.count > 0) {
            // Where it sits in the slice matches where it sits in the unit.
            CHECK(r * u.shard + range.slice_offset == pl.offset + range.first);
            CHECK(range.slice_offset + range.count <= u.shard);
          }
        }
        for (int c : owners) REQUIRE(c == 1);
      }
      std::int64_t total = 0;
      for (const Unit& u : plan.units()) {
        CHECK(u.numel % (o.world * o.alignment) == 0);
        CHECK(u.shard * o.world == u.numel);
        CHECK(u.offset == total);
        total += u.numel;
      }
      CHECK(plan.total_numel() == total);
      CHECK(plan.content_numel() == 350 + 63 + 147 + 21 + 147 + 7 + 49 + 7);
    }
  }
}

TEST_CASE("stage 3 units: one per module, the tied parameter alone, small ones persistent") {
  PartitionOptions o;
  o.stage = 3;
  o.world = 2;
  o.persistence_threshold = 10;
  o.alignment = 4;
  o.num_modules = 5;
  PartitionPlan plan(specs(), o);
  // wte (shared), module 0 {wpe}, module 1 {h0.w, h0.b}, module 2 {h1.w}, module 3 {h2.w},
  // persistent {h1.b, ln_f}.
  REQUIRE(plan.units().size() == 6);
  CHECK(plan.unit(0).shared);
  CHECK(plan.unit(0).params == std::vector<int>{0});
  CHECK(plan.unit(0).modules == std::vector<int>{0, 4});
  CHECK(plan.unit(0).last_backward_module == 0);
  CHECK(plan.unit(1).params == std::vector<int>{1});
  CHECK(plan.unit(2).params == std::vector<int>{2, 3});
  CHECK(plan.unit(5).persistent);
  CHECK(plan.unit(5).params == std::vector<int>{5, 7});
  CHECK(plan.module_units(4) == std::vector<int>{0, 5});
}

TEST_CASE("stage 0-2 units: whole modules in backward order, cut near the bucket size") {
  PartitionOptions o;
  o.stage = 2;
  o.world = 3;
  o.bucket_elements = 200;
  o.alignment = 1;
  o.num_modules = 5;
  PartitionPlan plan(specs(), o);
  // Backward: module 4 {ln_f} 7, module 3 {h2.w} 49, module 2 {h1.w, h1.b} 154 -> cut before
  // (7 + 49 + 154 > 200); module 1 {h0.w, h0.b} 168 -> cut; wte completes at module 0 and is a
  // unit of its own as soon as it is met; module 0 {wpe} 63 -> cut.
  std::vector<std::vector<int>> got;
  for (const Unit& u : plan.units()) got.push_back(u.params);
  CHECK(got == std::vector<std::vector<int>>{{7, 6}, {4, 5}, {0}, {2, 3}, {1}});
  CHECK(plan.unit(2).shared);
  CHECK(plan.unit(0).last_backward_module == 3);
  CHECK(plan.unit(4).last_backward_module == 0);
}

// model.frozen's units: a unit is wholly frozen or wholly trained, so a frozen one can go without
// optimizer state and reduction (Unit::frozen). wte (tied), h0.w and h1.b frozen.
TEST_CASE("frozen parameters form units of their own, trained ones stay as they were") {
  auto frozen_specs = [] {
    std::vector<ParamSpec> params = specs();
    for (int p : {0, 2, 5}) params[static_cast<std::size_t>(p)].frozen = true;
    return params;
  };
  const auto units_of = [](const PartitionPlan& plan) {
    std::vector<std::pair<std::vector<int>, bool>> got;
    for (const Unit& u : plan.units()) got.emplace_back(u.params, u.frozen);
    return got;
  };
  using Units = std::vector<std::pair<std::vector<int>, bool>>;
  SECTION("stages 0-2: buckets of each kind in backward order") {
    PartitionOptions o;
    o.stage = 2;
    o.world = 3;
    o.bucket_elements = 200;
    o.alignment = 1;
    o.num_modules = 5;
    // Trained: ln_f 7 + h2.w 49, cut before h1.w (+147 > 200); h1.w + h0.b 168, cut before wpe.
    // Frozen: h1.b 7 + h0.w 147 in one bucket; wte alone (tied) as soon as it completes.
    CHECK(units_of(PartitionPlan(frozen_specs(), o)) ==
          Units{{{7, 6}, false}, {{0}, true}, {{4, 3}, false}, {{1}, false}, {{5, 2}, true}});
  }
  SECTION("stage 3: a module's frozen parameters in a second unit, persistent ones too") {
    PartitionOptions o;
    o.stage = 3;
    o.world = 2;
    o.persistence_threshold = 10;
    o.alignment = 4;
    o.num_modules = 5;
    const PartitionPlan plan(frozen_specs(), o);
    CHECK(units_of(plan) == Units{{{0}, true},
                                  {{1}, false},
                                  {{3}, false},
                                  {{2}, true},
                                  {{4}, false},
                                  {{6}, false},
                                  {{7}, false},
                                  {{5}, true}});
    CHECK(plan.unit(0).shared);
    CHECK(plan.unit(6).persistent);
    CHECK(plan.unit(7).persistent);
    // Module 1 uses both of its units; the layout's other invariants hold.
    CHECK(plan.module_units(1) == std::vector<int>{2, 3});
    CHECK(plan.content_numel() == 350 + 63 + 147 + 21 + 147 + 7 + 49 + 7);
  }
  SECTION("everything frozen: the layout of nothing frozen, every unit frozen") {
    for (int stage : {0, 2, 3}) {
      PartitionOptions o;
      o.stage = stage;
      o.world = stage == 0 ? 1 : 2;
      o.bucket_elements = 200;
      o.persistence_threshold = stage == 3 ? 10 : 0;
      o.alignment = 4;
      o.num_modules = 5;
      std::vector<ParamSpec> all = specs();
      for (ParamSpec& p : all) p.frozen = true;
      const PartitionPlan trained(specs(), o), frozen(all, o);
      REQUIRE(frozen.units().size() == trained.units().size());
      for (std::size_t u = 0; u < trained.units().size(); ++u) {
        CHECK(frozen.units()[u].frozen);
        CHECK_FALSE(trained.units()[u].frozen);
        CHECK(frozen.units()[u].params == trained.units()[u].params);
        CHECK(frozen.units()[u].numel == trained.units()[u].numel);
      }
    }
  }
}

TEST_CASE("bad parameter declarations are rejected with the parameter named") {
  PartitionOptions o;
  o.num_modules = 2;
  CHECK_THROWS_WITH(PartitionPlan({{"a", {3}, {}, false}}, o),
                    Catch::Contains("'a' is used by no module"));
  CHECK_THROWS_WITH(PartitionPlan({{"b", {3}, {2}, false}}, o),
                    Catch::Contains("'b' names module 2 of 2"));
  CHECK_THROWS_WITH(PartitionPlan({{"c", {0}, {1}, false}}, o),
                    Catch::Contains("'c' has no elements"));
  CHECK_THROWS_WITH(PartitionPlan({{"d", {3}, {1, 0}, false}}, o), Catch::Contains("ascending"));
}
