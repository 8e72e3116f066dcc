// LR schedules against hand-computed values (DeepSpeed's formulas and indexing), including the
// warmup edges.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "optimizers/lr_schedule.h"
#include "runtime/common/error.h"

namespace zrt {
namespace {

using json = nlohmann::json;

LrSchedule make(const char* text, double optimizer_lr = 1e-3) {
  return LrSchedule(parse_scheduler_config(json::parse(text)), optimizer_lr);
}

TEST_CASE("no scheduler keeps the optimizer's lr", "[lr_schedule]") {
  const LrSchedule s(parse_scheduler_config(json()), 3e-4);
  CHECK(s.lr_at(-1) == 3e-4);
  CHECK(s.lr_at(0) == 3e-4);
  CHECK(s.lr_for_step(1) == 3e-4);
  CHECK(s.lr_at(1000000) == 3e-4);
}

TEST_CASE("WarmupLR with DeepSpeed's defaults: log warmup 0 -> 1e-3 over 1000", "[lr_schedule]") {
  const LrSchedule s = make(R"({"type": "WarmupLR"})");
  CHECK(s.config().warmup_max_lr == 1e-3);
  CHECK(s.config().warmup_num_steps == 1000);
  CHECK(s.lr_at(-1) == 0.0);  // before the first scheduler step: warmup_min_lr
  CHECK(s.lr_at(0) == 0.0);   // ln(1) = 0
  // 1e-3 * ln(2) / ln(1000) = 1e-3 * 0.693147 / 6.907755
  CHECK(s.lr_at(1) == Approx(1.0034333e-4).epsilon(1e-7));
  // 1e-3 * ln(500) / ln(1000) = 1e-3 * 6.214608 / 6.907755
  CHECK(s.lr_at(499) == Approx(8.9965667e-4).epsilon(1e-7));
  CHECK(s.lr_at(999) == Approx(1e-3).epsilon(1e-12));  // ln(1000)/ln(1000)
  CHECK(s.lr_at(1000) == 1e-3);                        // warmup over: exactly max
  CHECK(s.lr_at(123456) == 1e-3);
  // Optimizer step k uses iteration k-2 (the engine steps the scheduler after each step).
  CHECK(s.lr_for_step(1) == 0.0);
  CHECK(s.lr_for_step(2) == 0.0);
  CHECK(s.lr_for_step(3) == s.lr_at(1));
}

TEST_CASE("WarmupLR linear warmup", "[lr_schedule]") {
  const LrSchedule s = make(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5,
      "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}})");
  CHECK(s.lr_at(-1) == 1e-5);
  CHECK(s.lr_at(0) == Approx(1e-5).epsilon(1e-12));
  CHECK(s.lr_at(5) == Approx(5.05e-4).epsilon(1e-12));  // 1e-5 + 0.99e-3 * 5/10
  CHECK(s.lr_at(9) == Approx(9.01e-4).epsilon(1e-12));  // 1e-5 + 0.99e-3 * 9/10
  CHECK(s.lr_at(10) == Approx(1e-3).epsilon(1e-12));
  CHECK(s.lr_at(11) == Approx(1e-3).epsilon(1e-12));
}

TEST_CASE("warmup_num_steps below 2 counts as 2, as in DeepSpeed", "[lr_schedule]") {
  for (const char* steps : {"0", "1", "2"}) {
    INFO("warmup_num_steps " << steps);
    const LrSchedule s = make((std::string(R"({"type": "WarmupLR", "params": {"warmup_min_lr":
        0.1, "warmup_max_lr": 0.5, "warmup_num_steps": )") +
                               steps + "}}")
                                  .c_str());
    CHECK(s.lr_at(0) == Approx(0.1));  // ln(1)/ln(2) = 0
    CHECK(s.lr_at(1) == Approx(0.5));  // ln(2)/ln(2) = 1
    CHECK(s.lr_at(2) == Approx(0.5));
  }
}

TEST_CASE("WarmupDecayLR: warmup, then linear decay to 0 at total_num_steps", "[lr_schedule]") {
  const LrSchedule s = make(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 110,
      "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}})");
  CHECK(s.lr_at(-1) == 0.0);
  CHECK(s.lr_at(0) == 0.0);
  CHECK(s.lr_at(4) == Approx(4e-4).epsilon(1e-12));   // 1e-3 * 4/10
  CHECK(s.lr_at(9) == Approx(9e-4).epsilon(1e-12));   // last warmup iteration
  CHECK(s.lr_at(10) == Approx(1e-3).epsilon(1e-12));  // 1e-3 * (110-10)/(110-10)
  CHECK(s.lr_at(60) == Approx(5e-4).epsilon(1e-12));  // 1e-3 * 50/100
  CHECK(s.lr_at(109) == Approx(1e-5).epsilon(1e-9));  // 1e-3 * 1/100
  CHECK(s.lr_at(110) == 0.0);
  CHECK(s.lr_at(500) == 0.0);  // max(0, ...)

  const LrSchedule with_min = make(R"({"type": "WarmupDecayLR", "params": {"total_num_steps":
      110, "warmup_min_lr": 1e-5, "warmup_num_steps": 10}})");
  // Decay runs from max to min: 1e-5 + (1e-3 - 1e-5) * 50/100
  CHECK(with_min.lr_at(60) == Approx(5.05e-4).epsilon(1e-12));
  // log warmup: 1e-5 + 0.99e-3 * ln(2)/ln(10)
  CHECK(with_min.lr_at(1) == Approx(1e-5 + 0.99e-3 * 0.30102999566).epsilon(1e-9));
}

TEST_CASE("WarmupCosineLR: ratio warmup, then cosine to cos_min_ratio", "[lr_schedule]") {
  const LrSchedule s = make(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 110,
      "warmup_num_steps": 10, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01,
      "warmup_type": "linear"}})",
                            1e-3);
  CHECK(s.lr_at(-1) == 0.0);                           // DeepSpeed sets 0 before starting
  CHECK(s.lr_at(0) == Approx(1e-4).epsilon(1e-12));    // 1e-3 * 0.1
  CHECK(s.lr_at(5) == Approx(5.5e-4).epsilon(1e-12));  // 1e-3 * (0.1 + 0.9 * 5/10)
  CHECK(s.lr_at(9) == Approx(9.1e-4).epsilon(1e-12));  // 1e-3 * (0.1 + 0.9 * 9/10)
  // First cosine iteration: position 1 of 100: 0.01 + 0.99 * (1 + cos(0.01 pi)) / 2
  CHECK(s.lr_at(10) == Approx(9.9975575e-4).epsilon(1e-7));
  CHECK(s.lr_at(59) == Approx(5.05e-4).epsilon(1e-9));  // position 50: cos(pi/2) = 0
  CHECK(s.lr_at(109) == Approx(1e-5).epsilon(1e-9));    // position 100: cos(pi) = -1
  CHECK(s.lr_at(110) == Approx(1e-5).epsilon(1e-9));    // held at the end (no rise)
  CHECK(s.lr_at(10000) == Approx(1e-5).epsilon(1e-9));

  const LrSchedule defaults = make(R"({"type": "WarmupCosineLR", "params": {"total_num_steps":
      20, "warmup_num_steps": 10}})",
                                   2e-3);
  CHECK(defaults.config().cos_min_ratio == 0.0001);
  CHECK(defaults.config().warmup_min_ratio == 0.0);
  CHECK(defaults.lr_at(0) == 0.0);
  CHECK(defaults.lr_at(1) == Approx(2e-3 * 0.30102999566).epsilon(1e-9));  // ln2/ln10
  CHECK(defaults.lr_at(19) == Approx(2e-7).epsilon(1e-9));                 // 2e-3 * 1e-4
}

TEST_CASE("scheduler config errors are clear", "[lr_schedule][config]") {
  auto parse = [](const char* text) { return parse_scheduler_config(json::parse(text)); };
  CHECK_THROWS_WITH(parse(R"({"type": "OneCycle"})"),
                    Catch::Contains("not supported") &&
                        Catch::Contains("WarmupLR, WarmupDecayLR, WarmupCosineLR"));
  CHECK_THROWS_WITH(parse(R"({"type": "LRRangeTest"})"), Catch::Contains("not supported"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupCosinLR"})"),
                    Catch::Contains("did you mean 'WarmupCosineLR'"));
  CHECK_THROWS_WITH(parse(R"({"type": "CosineAnnealing"})"),
                    Catch::Contains("unknown") && Catch::Contains("WarmupLR"));
  CHECK_THROWS_WITH(parse(R"({"params": {}})"), Catch::Contains("scheduler.type is missing"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupDecayLR", "params": {}})"),
                    Catch::Contains("total_num_steps is required"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupCosineLR", "params": {}})"),
                    Catch::Contains("total_num_steps is required"));
  CHECK_THROWS_WITH(
      parse(R"({"type": "WarmupLR", "params": {"warmup_max_rl": 1}})"),
      Catch::Contains("'warmup_max_rl'") && Catch::Contains("did you mean 'warmup_max_lr'"));
  // WarmupCosineLR has ratios, not absolute lrs.
  CHECK_THROWS_WITH(
      parse(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1}})"),
      Catch::Contains("unknown key 'warmup_max_lr'"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupLR", "params": {"warmup_type": "exp"}})"),
                    Catch::Contains("'log' or 'linear'"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 2.5}})"),
                    Catch::Contains("must be an integer"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupLR", "params": {"warmup_max_lr": "1e-3"}})"),
                    Catch::Contains("must be a number"));
  CHECK_THROWS_WITH(parse(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10,
          "warmup_num_steps": 10}})"),
                    Catch::Contains("must exceed warmup_num_steps"));
  CHECK_THROWS_AS(parse(R"({"type": "WarmupLR", "bogus": 1})"), InvalidArgument);
  CHECK_NOTHROW(parse(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1e3}})"));
}

}  // namespace
}  // namespace zrt
