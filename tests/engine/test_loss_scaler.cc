// DeepSpeed's dynamic loss scaler, against sequences worked out by hand from its rules.
#include <catch2/catch.hpp>

#include <vector>

#include "runtime/common/error.h"
#include "runtime/engine/loss_scaler.h"

using namespace zrt;

namespace {
std::vector<double> run(LossScaler& s, const std::vector<int>& overflows) {
  std::vector<double> scales;
  for (int o : overflows) {
    s.update(o != 0);
    scales.push_back(s.scale());
  }
  return scales;
}
}  // namespace

TEST_CASE("dynamic scaling: window growth, hysteresis, halving") {
  LossScaleOptions o;
  o.initial_scale_power = 4;  // 16
  o.loss_scale_window = 3;
  o.hysteresis = 2;
  LossScaler s(o);
  CHECK(s.scale() == 16);
  // iteration:           0   1   2   3   4   5  6  7   8   9  10 11
  const std::vector<int> flags{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1};
  // 2: (2+1) % 3 == 0 doubles; 3: first overflow absorbed by hysteresis; 4, 5: halve;
  // 8: (8-5) % 3 == 0 doubles and restores hysteresis; 9 absorbed; 11 halves (no reset at 10).
  CHECK(run(s, flags) == std::vector<double>{16, 16, 32, 32, 16, 8, 8, 8, 16, 16, 16, 8});
  CHECK(s.state().iteration == 12);
  CHECK(s.state().last_overflow_iteration == 11);
}

TEST_CASE("consecutive_hysteresis restores hysteresis after any clean step") {
  LossScaleOptions o;
  o.initial_scale_power = 4;
  o.loss_scale_window = 3;
  o.hysteresis = 2;
  o.consecutive_hysteresis = true;
  LossScaler s(o);
  const std::vector<int> flags{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1};
  // Same as above until 10, whose clean step restores hysteresis, so 11 is absorbed.
  CHECK(run(s, flags) == std::vector<double>{16, 16, 32, 32, 16, 8, 8, 8, 16, 16, 16, 16});
}

TEST_CASE("DeepSpeed defaults: 2^16, window 1000, hysteresis 2") {
  LossScaler s(LossScaleOptions{});
  CHECK(s.scale() == 65536);
  s.update(true);
  CHECK(s.scale() == 65536);  // absorbed
  s.update(true);
  CHECK(s.scale() == 32768);
  for (int i = 0; i < 999; ++i) s.update(false);
  CHECK(s.scale() == 32768);
  s.update(false);  // iteration 1001: (1001 - 1) % 1000 == 0
  CHECK(s.scale() == 65536);
}

TEST_CASE("overflow at the minimum scale is an error; static scales never move") {
  LossScaleOptions o;
  o.initial_scale_power = 1;
  o.hysteresis = 1;
  LossScaler s(o);
  s.update(true);
  CHECK(s.scale() == 1);
  CHECK_THROWS_WITH(s.update(true), Catch::Contains("already at min_loss_scale"));

  LossScaleOptions fixed;
  fixed.loss_scale = 128;
  LossScaler f(fixed);
  CHECK_FALSE(f.dynamic());
  for (int o2 : {1, 0, 1, 1}) {
    f.update(o2 != 0);
    CHECK(f.scale() == 128);
  }
}

// A resume restores the saved scaler state, but a static scale is the resuming config's: a run
// saved with dynamic scaling at 65536 and resumed with loss_scale 128 scales by 128 (it used to
// keep 65536 for the rest of the run, silently); a dynamic scaler continues from the saved scale.
TEST_CASE("a restored state keeps a static scale; a dynamic scaler continues from it") {
  LossScaleState saved;
  saved.scale = 65536;
  saved.iteration = 7;
  saved.last_overflow_iteration = 3;
  saved.hysteresis_left = 1;
  LossScaleOptions fixed;
  fixed.loss_scale = 128;
  LossScaler f(fixed);
  f.restore(saved);
  CHECK(f.scale() == 128);
  CHECK(f.state().iteration == 7);
  f.update(true);
  CHECK(f.scale() == 128);

  LossScaler d{LossScaleOptions{}};
  d.restore(saved);
  CHECK(d.scale() == 65536);
  CHECK(d.state().iteration == 7);
}
